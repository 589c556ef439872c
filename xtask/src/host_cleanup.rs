//! What the providers remove from the host after a cluster, whatever made it: mounts below a
//! root, containers that outlived their runtime, cgroup trees, processes still running one of
//! the cluster's binaries and directory trees. Each step only touches what it is given.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use procfs::{
    ProcessCGroup,
    process::{MountInfo, Process},
};

/// Mount points below any of `roots`, deepest first (from /proc/self/mountinfo).
pub fn mounts_below(roots: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(mounts) = Process::myself().and_then(|me| me.mountinfo()) else { return Vec::new() };
    let mut found: Vec<PathBuf> = mounts
        .iter()
        .map(|mount| unescape_mount_path(&mount.mount_point.to_string_lossy()))
        .filter(|mount| roots.iter().any(|root| mount.starts_with(root)))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal (procfs keeps the escapes).
fn unescape_mount_path(raw: &str) -> PathBuf {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            if let Ok(n) = u8::from_str_radix(&code, 8) {
                out.push(n as char);
                continue;
            }
            out.push('\\');
            out.push_str(&code);
        } else {
            out.push(c);
        }
    }
    PathBuf::from(out)
}

/// Force-deletes every container left in a runc root (containers whose shim died with
/// containerd), so none of their processes survive.
pub fn delete_leftover_containers(runc_root: &Path, runc: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(namespaces) = fs::read_dir(runc_root) else { return problems };
    for ns in namespaces.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()) {
        let Ok(out) = Command::new(runc).arg("--root").arg(&ns).args(["list", "-q"]).output() else {
            problems.push(format!("cannot run {}; cannot delete leftover containers", runc.display()));
            return problems;
        };
        for id in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()) {
            let status =
                Command::new(runc).arg("--root").arg(&ns).args(["delete", "--force", id.trim()]).status();
            if !status.is_ok_and(|s| s.success()) {
                problems.push(format!("runc delete --force {id} failed"));
            }
        }
    }
    problems
}

/// Processes still running one of this cluster's own binaries (for example a containerd shim that
/// outlived containerd): matched by their executable path inside our build directory.
pub fn processes_running_from(dir: &Path) -> Vec<i32> {
    let Ok(processes) = procfs::process::all_processes() else { return Vec::new() };
    processes
        .flatten()
        .filter(|process| process.exe().is_ok_and(|exe| exe.starts_with(dir)))
        .map(|process| process.pid())
        .collect()
}

/// Removes a cgroup directory and every cgroup below it, leaf first (each must have no process).
pub fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    // A cgroup directory is removed with rmdir even though it lists control files.
    fs::remove_dir(dir)
}

/// The cgroup v1 controllers that sit in a hierarchy nothing in this mount namespace mounts
/// (from `/proc/self/cgroup` and `/proc/self/mountinfo`): a hierarchy unmounted while cgroups
/// were left in it lives on unseen, and keeps its controllers from the unified hierarchy.
pub fn unmounted_v1_controllers() -> Vec<String> {
    let Ok(me) = Process::myself() else { return Vec::new() };
    let (Ok(cgroups), Ok(mounts)) = (me.cgroups(), me.mountinfo()) else { return Vec::new() };
    unmounted_controllers(&cgroups.0, &mounts.0)
}

/// The controllers of the v1 hierarchies in `cgroups` (a process's cgroups) that no cgroup v1
/// mount in `mounts` names among its super options (`rw,hugetlb`, `rw,name=systemd`).
fn unmounted_controllers(cgroups: &[ProcessCGroup], mounts: &[MountInfo]) -> Vec<String> {
    let mounted: Vec<String> = mounts
        .iter()
        .filter(|mount| mount.fs_type == "cgroup")
        .flat_map(|mount| &mount.super_options)
        .map(|(name, value)| value.as_ref().map_or_else(|| name.clone(), |value| format!("{name}={value}")))
        .collect();
    cgroups
        .iter()
        .filter(|cgroup| cgroup.hierarchy != 0)
        .flat_map(|cgroup| &cgroup.controllers)
        .filter(|controller| !mounted.contains(controller))
        .cloned()
        .collect()
}

/// Removes a directory tree if it exists.
pub fn remove_dir(path: &Path) -> Option<String> {
    match fs::remove_dir_all(path) {
        Ok(()) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("remove {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use procfs::{FromBufRead, ProcessCGroups};

    use super::*;

    #[test]
    fn finds_controllers_whose_v1_hierarchy_is_not_mounted() {
        let cgroups = ProcessCGroups::from_buf_read(
            "12:hugetlb:/\n4:memory:/user\n1:name=systemd:/\n0::/\n".as_bytes(),
        )
        .unwrap()
        .0;
        let mount = |line: &str| MountInfo::from_line(line).unwrap();
        let mut mounts = vec![
            mount("30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory"),
            mount("31 25 0:27 / /sys/fs/cgroup/systemd rw shared:10 - cgroup cgroup rw,name=systemd"),
            mount("32 25 0:28 / /sys/fs/cgroup/unified rw shared:11 - cgroup2 cgroup2 rw"),
            // Only cgroup v1 mounts count, whatever their options say.
            mount("34 25 0:30 / /mnt rw - tmpfs tmpfs rw,hugetlb"),
        ];
        assert_eq!(unmounted_controllers(&cgroups, &mounts), ["hugetlb"]);
        mounts.push(mount("33 25 0:29 / /sys/fs/cgroup/hugetlb rw - cgroup cgroup rw,hugetlb"));
        assert!(unmounted_controllers(&cgroups, &mounts).is_empty());
        // A controller shares a hierarchy: both are mounted by one mount naming both.
        let shared = ProcessCGroups::from_buf_read("3:cpu,cpuacct:/\n".as_bytes()).unwrap().0;
        assert_eq!(unmounted_controllers(&shared, &mounts), ["cpu", "cpuacct"]);
        let cpu = mount("35 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct");
        assert!(unmounted_controllers(&shared, &[cpu]).is_empty());
    }

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_mount_path("/var/lib/kubelet/a\\040b"), PathBuf::from("/var/lib/kubelet/a b"));
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
    }

    #[test]
    fn finds_mounts_deepest_first() {
        // /proc and /sys are mounted on every Linux machine.
        let found = mounts_below(&[PathBuf::from("/proc"), PathBuf::from("/sys")]);
        assert!(found.contains(&PathBuf::from("/proc")));
        let depths: Vec<usize> = found.iter().map(|p| p.components().count()).collect();
        assert!(depths.windows(2).all(|w| w[0] >= w[1]), "{found:?}");
    }

    #[test]
    fn finds_processes_by_executable_directory() {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap();
        assert!(processes_running_from(dir).contains(&(std::process::id() as i32)));
        assert!(processes_running_from(Path::new("/nonexistent-dir")).is_empty());
    }
}
