//! The run's own Docker engine, for real: `cargo xtask docker up` starts dockerd (installing
//! Debian's docker.io first if there is no dockerd), a busybox image made here from
//! /bin/busybox is imported, a `--privileged` container runs and `docker exec` works in it, and
//! `cargo xtask docker down --purge` leaves no dockerd, containerd, shim or container process, no
//! mount, no cgroup and no socket.
//!
//! Where root lacks a capability a privileged container asks for (CAP_SYS_RESOURCE in some
//! sandboxes), the test first shows why the capability shim exists: with `--cap-shim off` the same
//! `docker run --privileged` fails with runc's "unable to apply caps".
//!
//! It needs root and a network for apt only if docker.io is missing, and nothing from a registry.
//! The engine runs in its own temporary directories (`DRA_E2E_DOCKER_STATE`/`_RUN` below
//! `target/tmp`), so an engine at the default paths is not touched. Run:
//!
//! ```sh
//! cargo test -p xtask --test docker_engine -- --ignored --nocapture
//! ```

use std::{
    path::{Path, PathBuf},
    process::Output,
    time::Duration,
};

/// Any single docker or xtask command of the test.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const IMAGE: &str = "dra-e2e-test/busybox:engine";
const CONTAINER: &str = "dra-e2e-engine-test";

/// The engine's directories, and `docker down --purge` when dropped (also after a failure).
struct TestEngine {
    dir: tempfile::TempDir,
}

impl TestEngine {
    fn new() -> Self {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(&base).expect("create target/tmp");
        let dir = tempfile::Builder::new().prefix("engine-").tempdir_in(base).expect("temporary directory");
        Self { dir }
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }
    fn docker_host(&self) -> String {
        format!("unix://{}", self.run_dir().join("docker.sock").display())
    }

    /// `cargo xtask ARGS` with this engine's directories.
    async fn xtask(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_xtask"));
        command
            .args(args)
            .env("DRA_E2E_DOCKER_STATE", self.state())
            .env("DRA_E2E_DOCKER_RUN", self.run_dir());
        run(command, &format!("xtask {}", args.join(" "))).await
    }

    /// `docker --host <engine> ARGS`.
    async fn docker(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new("docker");
        command.arg("--host").arg(self.docker_host()).args(args).env_remove("DOCKER_CONTEXT");
        run(command, &format!("docker {}", args.join(" "))).await
    }

    /// What of the engine is still there: processes naming its directories or in a cgroup of a
    /// test engine, mounts below its directories, cgroups of a test engine, its socket.
    fn leftovers(&self) -> Vec<String> {
        let root = self.dir.path().to_string_lossy().into_owned();
        let mut left = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("read /proc").filter_map(|e| e.ok()) {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
            if pid == std::process::id() {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            if cmdline.contains(&root) || cgroups.contains("/dra-e2e-docker-") {
                left.push(format!("process {pid}: {}", cmdline.trim()));
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
        for mount in mountinfo.lines().filter_map(|l| l.split_whitespace().nth(4)) {
            if mount.starts_with(&root) {
                left.push(format!("mount {mount}"));
            }
        }
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().filter_map(|e| e.ok()) {
            let dirs = std::fs::read_dir(hierarchy.path()).into_iter().flatten().filter_map(|e| e.ok());
            for dir in dirs.filter(|d| d.file_name().to_string_lossy().starts_with("dra-e2e-docker-")) {
                left.push(format!("cgroup {}", dir.path().display()));
            }
        }
        if self.run_dir().join("docker.sock").exists() {
            left.push("the engine's socket".into());
        }
        left
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["docker", "down", "--purge"])
            .env("DRA_E2E_DOCKER_STATE", self.state())
            .env("DRA_E2E_DOCKER_RUN", self.run_dir())
            .status();
    }
}

/// Runs `command` within [`COMMAND_TIMEOUT`] and prints what it did.
async fn run(mut command: tokio::process::Command, what: &str) -> Output {
    command.kill_on_drop(true).stdin(std::process::Stdio::null());
    let output = tokio::time::timeout(COMMAND_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("`{what}` did not finish within {COMMAND_TIMEOUT:?}"))
        .unwrap_or_else(|err| panic!("cannot run `{what}`: {err}"));
    println!(
        "$ {what}\n  -> {}\n{}{}",
        output.status,
        indent(&String::from_utf8_lossy(&output.stdout)),
        indent(&String::from_utf8_lossy(&output.stderr))
    );
    output
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("     {l}\n")).collect()
}

fn ok(output: &Output, what: &str) -> String {
    assert!(output.status.success(), "{what} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A rootfs tarball with /bin/busybox and the applets the test uses.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let busybox = Path::new("/bin/busybox");
    assert!(busybox.is_file(), "the test needs a static busybox at /bin/busybox (Debian: busybox-static)");
    let path = dir.join("busybox-rootfs.tar");
    let mut tar = tar::Builder::new(std::fs::File::create(&path).expect("create the rootfs tarball"));
    tar.append_path_with_name(busybox, "bin/busybox").expect("add busybox");
    for applet in ["sh", "sleep", "grep", "cat", "echo"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        tar.append_link(&mut header, format!("bin/{applet}"), "busybox").expect("add an applet link");
    }
    tar.finish().expect("write the rootfs tarball");
    path
}

/// Whether root here lacks CAP_SYS_RESOURCE (bit 24 of CapBnd), as the sandboxes the shim was
/// written for do.
fn root_lacks_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("a CapBnd line");
    bounding & (1 << 24) == 0
}

#[tokio::test]
#[ignore = "starts a real dockerd as root (installs docker.io if missing); run with --ignored"]
async fn own_docker_engine_runs_a_privileged_container_and_exec_then_stops_without_leftovers() {
    assert!(rustix::process::geteuid().is_root(), "the engine test needs root");
    let engine = TestEngine::new();
    let rootfs = busybox_rootfs(engine.dir.path());
    let rootfs = rootfs.to_str().expect("a UTF-8 path");

    if root_lacks_sys_resource() {
        // Without the shim, runc refuses the capability root lacks.
        ok(&engine.xtask(&["docker", "up", "--cap-shim", "off"]).await, "docker up --cap-shim off");
        ok(&engine.docker(&["import", rootfs, IMAGE]).await, "docker import");
        let run = engine.docker(&["run", "--rm", "--privileged", IMAGE, "/bin/echo", "unreachable"]).await;
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            !run.status.success(),
            "a privileged container ran without the shim on a host lacking CAP_SYS_RESOURCE"
        );
        assert!(stderr.contains("unable to apply caps"), "unexpected failure: {stderr}");
        ok(&engine.xtask(&["docker", "down"]).await, "docker down");
        assert_eq!(engine.leftovers(), Vec::<String>::new());
    } else {
        println!(
            "root holds CAP_SYS_RESOURCE here: the engine runs without the shim, nothing to show without it"
        );
    }

    let host = ok(&engine.xtask(&["docker", "up"]).await, "docker up");
    assert_eq!(host, engine.docker_host(), "docker up prints DOCKER_HOST");
    ok(&engine.docker(&["import", rootfs, IMAGE]).await, "docker import");
    let id = ok(
        &engine
            .docker(&["run", "--detach", "--privileged", "--name", CONTAINER, IMAGE, "/bin/sleep", "600"])
            .await,
        "docker run --privileged",
    );
    assert!(!id.is_empty());
    let exec = ok(
        &engine
            .docker(&["exec", CONTAINER, "/bin/sh", "-c", "grep CapBnd /proc/self/status; echo exec-ok"])
            .await,
        "docker exec",
    );
    assert!(exec.ends_with("exec-ok"), "{exec}");
    let status = ok(&engine.xtask(&["docker", "status"]).await, "docker status");
    assert!(status.contains(&format!("DOCKER_HOST={}", engine.docker_host())), "{status}");

    ok(&engine.xtask(&["docker", "down", "--purge"]).await, "docker down --purge");
    assert_eq!(engine.leftovers(), Vec::<String>::new(), "the stopped engine left these behind");
    assert!(!engine.state().exists(), "--purge removes the state directory");
}
