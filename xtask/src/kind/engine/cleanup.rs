//! What an engine leaves behind, found and removed: after `docker down` stopped dockerd, and at
//! the next `docker up` after a run that was killed (a stale PID record, pidfile and socket).
//!
//! An engine's leftovers are: processes of Docker's programs whose command line names one of the
//! engine's directories (dockerd, its containerd, containerd shims, runc), every process in the
//! engine's cgroup (containers whose shim died), mounts below its directories (overlay rootfs,
//! network namespaces), its cgroups, the bridges of its networks (`br-<id>`: dockerd leaves them
//! in the host's namespace when it stops), and its run directory with the socket.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use procfs::ProcessCGroup;

use super::layout::EngineLayout;
use crate::{
    common::process::{ProcessRecord, read_start_time, stop_process},
    host_cleanup::{delete_leftover_containers, mounts_below, remove_cgroup_tree},
};

/// The programs of a Docker engine; a process running one of them with an engine directory on its
/// command line is that engine's.
const ENGINE_PROGRAMS: [&str; 6] =
    ["dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "docker-proxy", "runc"];

/// One leftover process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// Its PID.
    pub pid: i32,
    /// Its program's file name.
    pub program: String,
    /// Why it is the engine's.
    pub why: &'static str,
}

/// Whether a process belongs to the engine: `program` (its executable's file name), `args` (its
/// command line), `cgroups` (its cgroups, from /proc/PID/cgroup).
pub fn belongs_to_engine(
    program: &str,
    args: &[String],
    cgroups: &[ProcessCGroup],
    roots: &[PathBuf],
    cgroup_parent: &str,
) -> Option<&'static str> {
    let in_cgroup = cgroups.iter().any(|cgroup| {
        cgroup
            .pathname
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(cgroup_parent))
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    });
    if in_cgroup {
        return Some("in the engine's cgroup");
    }
    let names_a_root = args.iter().any(|arg| roots.iter().any(|root| arg.contains(&*root.to_string_lossy())));
    (ENGINE_PROGRAMS.contains(&program) && names_a_root).then_some("runs on the engine's directories")
}

/// The engine's processes that still run (never this process).
pub fn processes(layout: &EngineLayout) -> Vec<Leftover> {
    let roots = layout.roots();
    let parent = layout.cgroup_parent();
    let me = std::process::id() as i32;
    let Ok(processes) = procfs::process::all_processes() else { return Vec::new() };
    let mut found: Vec<Leftover> = processes
        .flatten()
        .filter(|process| process.pid() != me)
        .filter_map(|process| {
            let pid = process.pid();
            let exe = process.exe().ok()?;
            let program = exe.file_name()?.to_string_lossy().trim_end_matches(" (deleted)").to_string();
            // Read as bytes: procfs's `cmdline()` fails on an argument that is not UTF-8.
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let cgroups = process.cgroups().map(|cgroups| cgroups.0).unwrap_or_default();
            let why = belongs_to_engine(&program, &args, &cgroups, &roots, &parent)?;
            Some(Leftover { pid, program, why })
        })
        .collect();
    found.sort_by_key(|l| l.pid);
    found
}

/// The engine's cgroup in every hierarchy that has it (cgroup v1: one per controller; v2: one).
pub fn cgroup_dirs(layout: &EngineLayout) -> Vec<PathBuf> {
    let parent = layout.cgroup_parent();
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(&parent)];
    if let Ok(hierarchies) = fs::read_dir(root) {
        dirs.extend(hierarchies.filter_map(|e| e.ok()).map(|e| e.path().join(&parent)));
    }
    dirs.retain(|dir| dir.is_dir());
    dirs
}

/// The bridges of the engine's networks still in the host's namespace: `br-<first 12 hex digits
/// of the network ID>` links whose ID is in the engine's network store.
pub fn bridges(layout: &EngineLayout) -> Vec<String> {
    let Ok(store) = fs::read(layout.network_store()) else { return Vec::new() };
    let Ok(links) = fs::read_dir("/sys/class/net") else { return Vec::new() };
    let mut found: Vec<String> = links
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("bridge").is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| bridge_of_store(name, &store))
        .collect();
    found.sort();
    found
}

/// Whether the link `name` is the bridge of a network whose ID appears in `store`.
fn bridge_of_store(name: &str, store: &[u8]) -> bool {
    let Some(id) = name.strip_prefix("br-") else { return false };
    id.len() == 12
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && store.windows(id.len()).any(|window| window == id.as_bytes())
}

/// Everything of the engine that is still there, one line each; empty when it is gone for good.
/// The state directory itself (data root, logs) is kept on purpose and not listed.
pub fn leftovers(layout: &EngineLayout) -> Vec<String> {
    let mut left: Vec<String> = processes(layout)
        .into_iter()
        .map(|p| format!("process {} ({}) {}", p.pid, p.program, p.why))
        .collect();
    left.extend(mounts_below(&layout.roots()).into_iter().map(|m| format!("mount {}", m.display())));
    left.extend(cgroup_dirs(layout).into_iter().map(|d| format!("cgroup {}", d.display())));
    left.extend(bridges(layout).into_iter().map(|b| format!("network bridge {b}")));
    if layout.run.exists() {
        left.push(format!("directory {}", layout.run.display()));
    }
    left
}

/// Removes every leftover of an engine whose dockerd no longer runs: force-deletes its containers
/// with `runc` (when known), stops its processes (SIGTERM, then SIGKILL), unmounts, removes its
/// cgroups, bridges and run directory. Returns what could not be removed.
pub async fn remove(layout: &EngineLayout, runc: Option<&Path>) -> Vec<String> {
    let mut problems = Vec::new();
    if let (Some(runc), Ok(entries)) = (runc, fs::read_dir(layout.exec_root())) {
        for root in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
            if root.file_name().is_some_and(|n| n.to_string_lossy().starts_with("runtime-")) {
                problems.extend(delete_leftover_containers(&root, runc));
            }
        }
    }
    for leftover in processes(layout) {
        let Ok(start_time) = read_start_time(leftover.pid) else { continue };
        let record = ProcessRecord { pid: leftover.pid, start_time };
        if let Err(err) = stop_process(record, Duration::from_secs(5)) {
            problems.push(format!("process {} ({}): {err:#}", leftover.pid, leftover.program));
        }
    }
    for mount in mounts_below(&layout.roots()) {
        if let Err(err) = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH) {
            problems.push(format!("unmount {}: {err}", mount.display()));
        }
    }
    // The kernel frees a cgroup a moment after its last process exits: retry for a few seconds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let failed: Vec<String> = cgroup_dirs(layout)
            .into_iter()
            .filter_map(|dir| {
                remove_cgroup_tree(&dir).err().map(|e| format!("remove cgroup {}: {e}", dir.display()))
            })
            .collect();
        if failed.is_empty() || tokio::time::Instant::now() >= deadline {
            problems.extend(failed);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for bridge in bridges(layout) {
        match Command::new("ip").args(["link", "delete", &bridge]).status() {
            Ok(status) if status.success() => {}
            _ => problems
                .push(format!("could not delete the network bridge {bridge} (ip link delete {bridge})")),
        }
    }
    if mounts_below(std::slice::from_ref(&layout.run)).is_empty() {
        match fs::remove_dir_all(&layout.run) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => problems.push(format!("remove {}: {err}", layout.run.display())),
        }
    }
    remove_empty_shim_socket_dir(Path::new(SHIM_SOCKET_DIR));
    problems
}

/// Where containerd's shims put their sockets, whatever the engine's paths.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";

/// Removes `dir` (the shims' socket directory) and then its parent, each only if it is empty: the
/// engine's shims create them on a host that had neither, and an empty `/run/containerd` left
/// behind is in the way of the local cluster, which mounts over that path and removes the mount
/// point it created. A directory another containerd uses is not empty, or is recreated on demand.
fn remove_empty_shim_socket_dir(dir: &Path) {
    for dir in [Some(dir), dir.parent()].into_iter().flatten() {
        // rmdir fails on a non-empty directory or a mount point: both stay.
        let _ = fs::remove_dir(dir);
    }
}

#[cfg(test)]
mod tests {
    use procfs::FromBufRead;

    use super::*;

    #[test]
    fn only_empty_shim_socket_dirs_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("containerd");
        let dir = parent.join("s");
        fs::create_dir_all(&dir).unwrap();
        remove_empty_shim_socket_dir(&dir);
        assert!(!parent.exists(), "both empty directories are removed");

        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("sock"), b"").unwrap();
        remove_empty_shim_socket_dir(&dir);
        assert!(dir.join("sock").exists(), "a socket of another containerd stays");
    }

    fn roots() -> Vec<PathBuf> {
        vec!["/var/lib/dra-e2e/docker".into(), "/run/dra-e2e-docker".into()]
    }

    fn cgroups(text: &str) -> Vec<ProcessCGroup> {
        procfs::ProcessCGroups::from_buf_read(text.as_bytes()).unwrap().0
    }

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    #[test]
    fn an_engine_process_names_its_directories_or_lives_in_its_cgroup() {
        let v1 = &cgroups("12:pids:/\n11:memory:/user.slice\n");
        let shim = args(
            "/usr/bin/containerd-shim-runc-v2 -namespace moby -id abc -address /run/dra-e2e-docker/exec/containerd/containerd.sock",
        );
        assert_eq!(
            belongs_to_engine("containerd-shim-runc-v2", &shim, v1, &roots(), "dra-e2e-docker"),
            Some("runs on the engine's directories")
        );
        let dockerd = args("/usr/sbin/dockerd --data-root=/var/lib/dra-e2e/docker/data");
        assert!(belongs_to_engine("dockerd", &dockerd, v1, &roots(), "dra-e2e-docker").is_some());
        // Another engine's processes, and other programs naming the directories, are not ours.
        let system =
            args("/usr/bin/containerd-shim-runc-v2 -namespace moby -address /run/containerd/containerd.sock");
        assert_eq!(
            belongs_to_engine("containerd-shim-runc-v2", &system, v1, &roots(), "dra-e2e-docker"),
            None
        );
        let client = args("docker --host unix:///run/dra-e2e-docker/docker.sock ps");
        assert_eq!(belongs_to_engine("docker", &client, v1, &roots(), "dra-e2e-docker"), None);
        // A container's process, by its cgroup (v1 and v2), whatever it runs.
        let container = &cgroups("12:pids:/dra-e2e-docker/4f2a\n0::/dra-e2e-docker/4f2a\n");
        assert_eq!(
            belongs_to_engine("sleep", &args("sleep 600"), container, &roots(), "dra-e2e-docker"),
            Some("in the engine's cgroup")
        );
        let other = &cgroups("12:pids:/dra-e2e-docker-1234abcd/4f2a\n");
        assert_eq!(belongs_to_engine("sleep", &args("sleep 600"), other, &roots(), "dra-e2e-docker"), None);
    }

    #[test]
    fn bridges_are_matched_by_network_id() {
        let store = b"\x00docker/network/v1.0/network/3f9a1c2b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8\x00";
        assert!(bridge_of_store("br-3f9a1c2b4d5e", store));
        assert!(!bridge_of_store("br-000000000000", store));
        assert!(!bridge_of_store("docker0", store));
        assert!(!bridge_of_store("br-3f9a", store));
    }

    #[tokio::test]
    async fn a_layout_that_never_ran_has_no_leftovers_and_removing_them_is_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let layout = EngineLayout { state: dir.path().join("state"), run: dir.path().join("run") };
        assert_eq!(leftovers(&layout), Vec::<String>::new());
        // A stale run directory (socket and pidfile of a dead engine) is removed.
        fs::create_dir_all(layout.exec_root()).unwrap();
        fs::write(layout.socket(), "").unwrap();
        fs::write(layout.pidfile(), "999999").unwrap();
        assert_eq!(leftovers(&layout), [format!("directory {}", layout.run.display())]);
        assert_eq!(remove(&layout, None).await, Vec::<String>::new());
        assert!(!layout.run.exists());
        assert_eq!(leftovers(&layout), Vec::<String>::new());
    }
}
