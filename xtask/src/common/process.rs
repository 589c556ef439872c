//! The processes of the local cluster: started detached (their own process group, logs to files),
//! recorded by PID and start time under the state directory, and stopped only by those records, so
//! `cluster down` never touches a process it did not start, even after a PID was reused.

use std::{
    fs::{self, File, OpenOptions},
    io::{Read, Seek, SeekFrom},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use procfs::process::Process;
use rustix::process::{Pid, Signal, WaitOptions, kill_process, waitpid};

/// How to start one component (kept beside its PID record, so that it can be restarted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessSpec {
    /// Short name: the key of its PID record and log file (`etcd`, `kubelet`, ...).
    pub name: String,
    /// The program to run.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

/// A process this cluster started: what its PID record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRecord {
    /// The process ID.
    pub pid: i32,
    /// Its start time in clock ticks since boot (field 22 of /proc/PID/stat), which tells a reused
    /// PID from ours.
    pub start_time: u64,
}

/// Starts, finds and stops the cluster's processes.
#[derive(Debug, Clone)]
pub struct Supervisor {
    pid_dir: PathBuf,
    log_dir: PathBuf,
}

impl Supervisor {
    /// A supervisor keeping PID records in `pid_dir` and logs in `log_dir`.
    pub fn new(pid_dir: PathBuf, log_dir: PathBuf) -> Self {
        Self { pid_dir, log_dir }
    }

    /// The log file of a component.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.log_dir.join(format!("{name}.log"))
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.pid_dir.join(format!("{name}.pid"))
    }

    fn spec_path(&self, name: &str) -> PathBuf {
        self.pid_dir.join(format!("{name}.spec.json"))
    }

    /// Starts a component detached from this process (own process group, stdin closed, output
    /// appended to its log) and records it.
    pub fn start(&self, spec: &ProcessSpec) -> Result<ProcessRecord> {
        fs::create_dir_all(&self.pid_dir)?;
        fs::create_dir_all(&self.log_dir)?;
        let log_path = self.log_path(&spec.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open log {}", log_path.display()))?;
        let child = Command::new(&spec.program)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("start {} ({})", spec.name, spec.program.display()))?;
        let pid = i32::try_from(child.id()).context("PID out of range")?;
        // The child keeps running after `child` is dropped; we track it by PID from now on.
        drop(child);
        let start_time = read_start_time(pid)
            .with_context(|| format!("{} exited at once; see {}", spec.name, log_path.display()))?;
        let record = ProcessRecord { pid, start_time };
        fs::write(self.spec_path(&spec.name), serde_json::to_vec_pretty(spec)?)?;
        fs::write(self.record_path(&spec.name), format!("{pid} {start_time}\n"))?;
        tracing::debug!(name = %spec.name, pid, "started");
        Ok(record)
    }

    /// How a component that runs was started; for one that has no record, says so and what runs.
    pub fn spec(&self, name: &str) -> Result<ProcessSpec> {
        let text = fs::read(self.spec_path(name)).map_err(|_| {
            anyhow::anyhow!(
                "the cluster started no component {name:?}; it runs: {}",
                self.recorded().join(", ")
            )
        })?;
        serde_json::from_slice(&text).with_context(|| format!("read how {name} was started"))
    }

    /// The record of a component, if it has one.
    pub fn record(&self, name: &str) -> Option<ProcessRecord> {
        let text = fs::read_to_string(self.record_path(name)).ok()?;
        let mut parts = text.split_whitespace();
        let pid = parts.next()?.parse().ok()?;
        let start_time = parts.next()?.parse().ok()?;
        Some(ProcessRecord { pid, start_time })
    }

    /// Whether the recorded process of a component still runs (and is still ours).
    pub fn is_running(&self, name: &str) -> bool {
        self.record(name).is_some_and(is_alive)
    }

    /// Names of all components that have a record.
    pub fn recorded(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(&self.pid_dir) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".pid").map(String::from))
            .collect();
        names.sort();
        names
    }

    /// Stops a component: SIGTERM, then SIGKILL after `grace`; removes its record. A record whose
    /// process is gone (or whose PID now belongs to another process) is only removed.
    pub fn stop(&self, name: &str, grace: Duration) -> Result<()> {
        if let Some(record) = self.record(name) {
            let started = Instant::now();
            stop_process(record, grace).with_context(|| format!("stop {name} (pid {})", record.pid))?;
            tracing::debug!(name, pid = record.pid, elapsed = ?started.elapsed(), "stopped");
        }
        for path in [self.record_path(name), self.spec_path(name)] {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The last `lines` lines of a component's log, for error messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        tail(&self.log_path(name), lines)
    }

    /// An error for a component that failed to become ready: what was expected, its last log lines
    /// and where the full log is.
    pub fn failure(&self, name: &str, what: &str) -> anyhow::Error {
        let state = if self.is_running(name) { "is running but" } else { "exited and" };
        anyhow::anyhow!(
            "{name} {state} {what}; last log lines:\n{}\nfull log: {}",
            self.log_tail(name, 25),
            self.log_path(name).display()
        )
    }
}

/// Stops one process by its record: SIGTERM, wait up to `grace`, SIGKILL, wait again (a zero
/// `grace`: SIGKILL at once).
pub fn stop_process(record: ProcessRecord, grace: Duration) -> Result<()> {
    if !is_alive(record) {
        reap(record.pid);
        return Ok(());
    }
    let pid = Pid::from_raw(record.pid).context("invalid PID")?;
    if !grace.is_zero() {
        let _ = kill_process(pid, Signal::TERM);
        if wait_gone(record, grace) {
            return Ok(());
        }
        tracing::warn!(pid = record.pid, "still running {grace:?} after SIGTERM; sending SIGKILL");
    }
    let _ = kill_process(pid, Signal::KILL);
    if wait_gone(record, Duration::from_secs(10)) {
        return Ok(());
    }
    bail!("process {} did not exit after SIGKILL", record.pid)
}

fn wait_gone(record: ProcessRecord, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        reap(record.pid);
        if !is_alive(record) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Collects the exit status if the process is our own child (otherwise a no-op), so a stopped
/// child does not linger as a zombie while xtask keeps running.
fn reap(pid: i32) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = waitpid(Some(pid), WaitOptions::NOHANG);
    }
}

/// Whether the process of a record runs: it exists, is not a zombie and has the recorded start time.
///
/// A process whose main thread has exited (a zombie leader) is alive while any other of its
/// threads still runs: a killed multi-threaded process (the API server) closes its files, its
/// listening sockets among them, only when its last thread exits.
pub fn is_alive(record: ProcessRecord) -> bool {
    match read_stat(record.pid) {
        Some((_, start_time)) if start_time != record.start_time => false,
        Some((state, _)) if !is_dead(state) => true,
        Some(_) => other_thread_runs(record.pid),
        None => false,
    }
}

/// Whether a state letter of /proc/PID/stat is a dead or zombie task's.
fn is_dead(state: char) -> bool {
    state == 'Z' || state == 'X'
}

/// Whether a thread of process `pid` other than its exited main thread still runs.
fn other_thread_runs(pid: i32) -> bool {
    let Ok(tasks) = Process::new(pid).and_then(|process| process.tasks()) else { return false };
    tasks.flatten().any(|task| task.tid != pid && task.stat().is_ok_and(|stat| !is_dead(stat.state)))
}

/// The start time of a running process.
pub fn read_start_time(pid: i32) -> Result<u64> {
    read_stat(pid).map(|(_, start)| start).context("no such process")
}

/// Reads the state letter and start time (in clock ticks after boot) from /proc/PID/stat.
fn read_stat(pid: i32) -> Option<(char, u64)> {
    let stat = Process::new(pid).and_then(|process| process.stat()).ok()?;
    Some((stat.state, stat.starttime))
}

/// The last `lines` lines of a file (reads at most the last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if file.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zombie_and_dead_states_are_dead() {
        assert!(is_dead('Z') && is_dead('X'));
        assert!(!is_dead('S') && !is_dead('R') && !is_dead('D'));
    }

    #[test]
    fn reads_this_process_and_its_threads() {
        let me = std::process::id() as i32;
        let (state, start_time) = read_stat(me).expect("this process's stat");
        assert!(!is_dead(state) && start_time > 0);
        // Another thread that keeps running is found; the main thread itself is not counted.
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || stopped.recv());
        assert!(other_thread_runs(me));
        drop(stop);
        let _ = thread.join();
        assert!(read_stat(i32::MAX).is_none() && !other_thread_runs(i32::MAX));
    }

    #[test]
    fn starts_records_and_stops_a_process() {
        let dir = tempfile::tempdir().unwrap();
        let sup = Supervisor::new(dir.path().join("pids"), dir.path().join("logs"));
        let spec = ProcessSpec {
            name: "sleeper".into(),
            program: "sh".into(),
            args: vec!["-c".into(), "echo hello; exec sleep 600".into()],
            env: vec![],
        };
        let record = sup.start(&spec).unwrap();
        assert!(sup.is_running("sleeper"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sup.log_tail("sleeper", 5).contains("hello") {
            assert!(Instant::now() < deadline, "the sleeper's output never reached its log");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(sup.record("sleeper"), Some(record));
        assert_eq!(sup.recorded(), vec!["sleeper".to_string()]);

        // How it was started is kept, so that it can be started again the same way.
        assert_eq!(sup.spec("sleeper").unwrap(), spec);
        let unknown = sup.spec("waker").unwrap_err().to_string();
        assert!(
            unknown.contains("no component \"waker\"") && unknown.ends_with("it runs: sleeper"),
            "{unknown}"
        );

        sup.stop("sleeper", Duration::from_secs(5)).unwrap();
        assert!(!is_alive(record));
        assert!(sup.record("sleeper").is_none());
        assert!(sup.spec("sleeper").is_err(), "a stopped component keeps its start");
    }

    #[test]
    fn a_reused_pid_is_not_ours() {
        let me = std::process::id() as i32;
        let start_time = read_start_time(me).unwrap();
        assert!(is_alive(ProcessRecord { pid: me, start_time }));
        assert!(!is_alive(ProcessRecord { pid: me, start_time: start_time + 1 }));
    }

    #[test]
    fn tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        fs::write(&path, "a\nb\nc\nd\n").unwrap();
        assert_eq!(tail(&path, 2), "c\nd");
        assert!(tail(&dir.path().join("missing"), 2).contains("no log"));
    }
}
