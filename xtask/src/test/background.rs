//! Builds that `cargo xtask test` needs later in the run, made in the background while the local
//! cluster's lanes run (they mostly wait on the cluster): the skew lane's old kubelet, the next
//! release's binaries, the kind node image. Each is `cargo xtask cluster build …` (a copy of the
//! running binary) under `SCHED_IDLE` in a cgroup of the least CPU weight ([`super::budget`]) and in
//! its own process group, one after another in the order given, its output in
//! `<target>/e2e/background-<key>.log`: it takes only the CPU the lanes beside it leave idle. The lane that needs one waits for it first
//! ([`Background::wait`]); if it failed, the failure is reported with its log's tail and the lane's
//! `cluster up` builds in the foreground. Dropped (the run ends or is interrupted), the running
//! build's process group is stopped and the builds after it never start.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use rustix::process::{Pid, Signal, kill_process_group};

/// How long a lane waits for its background build (the builds before it included): the kind node
/// image, last, cold on two cores beside the local lanes.
const WAIT_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// One `cargo xtask cluster build` to run in the background.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// What a lane waits for it by; also names its log.
    pub key: &'static str,
    /// What it builds, for the step name.
    pub what: String,
    /// `cluster build`'s arguments.
    pub args: Vec<String>,
}

/// The outcome of one build: how long it took, or why it failed.
type Finished = Result<Duration, String>;

/// What waiting for a build gives the step table.
#[derive(Debug)]
pub struct Waited {
    /// The step name: what was built, how long the build took.
    pub name: String,
    /// The build's outcome.
    pub result: Result<()>,
    /// How long the lane waited for it.
    pub waited: Duration,
}

/// Joins the cgroup.procs files given (their count first), then execs the rest of the arguments.
const JOIN_CGROUP_AND_EXEC: &str = r#"n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || { echo "could not join the cgroup of $1" >&2; exit 125; }; shift; n=$((n-1)); done; exec "$@""#;

/// The background builds of a run.
pub struct Background {
    /// Per build: its key, what it builds, and where its outcome arrives (taken by `wait`).
    pending: Vec<(&'static str, String, Option<mpsc::Receiver<Finished>>)>,
    /// The process group of the build that runs now.
    running: Arc<Mutex<Option<Pid>>>,
    /// Set on drop: no further build starts.
    stop: Arc<AtomicBool>,
    /// The builds' cgroup (removed on drop, after the running build was stopped); `None` where
    /// none can be made (then `SCHED_IDLE` alone).
    _cgroup: Option<super::budget::BackgroundCgroup>,
}

impl Background {
    /// Starts `builds`, one after another, on a thread of their own.
    pub fn start(repo: &Path, builds: Vec<Build>) -> Result<Background> {
        let out = crate::e2e::target_dir(repo).join("e2e");
        // A copy: `cargo test` rebuilds (replaces) target/debug/xtask while the builds run.
        let exe = out.join("xtask-background-build");
        crate::repo::copy_running_xtask(&exe)?;
        let cgroup = super::budget::BackgroundCgroup::create()
            .inspect_err(|e| {
                eprintln!("==> background builds without a cgroup of their own (SCHED_IDLE only): {e:#}")
            })
            .ok();
        Self::start_with(repo, exe, &out, builds, cgroup)
    }

    /// Runs `exe cluster build <args>` for each build, logs in `out`, in `cgroup` if given;
    /// removes `exe` afterwards.
    fn start_with(
        repo: &Path,
        exe: PathBuf,
        out: &Path,
        builds: Vec<Build>,
        cgroup: Option<super::budget::BackgroundCgroup>,
    ) -> Result<Background> {
        std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
        let out = out.to_path_buf();
        let running = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let mut pending = Vec::new();
        let mut queue = Vec::new();
        for build in builds {
            let (tx, rx) = mpsc::channel();
            pending.push((build.key, build.what.clone(), Some(rx)));
            queue.push((build, tx));
        }
        let (repo, thread_running, thread_stop) = (repo.to_path_buf(), running.clone(), stop.clone());
        let join: Vec<PathBuf> = cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default();
        std::thread::Builder::new()
            .name("background-builds".into())
            .spawn(move || {
                for (build, tx) in queue {
                    if thread_stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let log = out.join(format!("background-{}.log", build.key));
                    let _ = tx.send(run_one(&exe, &repo, &build, &log, &join, &thread_running));
                }
                let _ = std::fs::remove_file(&exe);
            })
            .context("start the background builds' thread")?;
        let how = if cgroup.is_some() { "SCHED_IDLE, least CPU weight" } else { "SCHED_IDLE" };
        for (_, what, _) in &pending {
            eprintln!("==> built in the background ({how}): {what}");
        }
        Ok(Background { pending, running, stop, _cgroup: cgroup })
    }

    /// Waits for the build `key` (and so for those queued before it) and returns what the step
    /// table shows of it: what was built and how long the build took, its outcome and how long
    /// this waited. `None` when no build of that key was queued or it was waited for already.
    pub async fn wait(&mut self, key: &str) -> Option<Waited> {
        let (_, what, rx) = self.pending.iter_mut().find(|(k, _, _)| *k == key)?;
        let rx = rx.take()?;
        let started = Instant::now();
        let what = what.clone();
        let finished = tokio::task::spawn_blocking(move || rx.recv_timeout(WAIT_TIMEOUT))
            .await
            .map_err(|e| anyhow!("wait for the background build of {what}: {e}"))
            .and_then(|received| {
                received.map_err(|e| match e {
                    mpsc::RecvTimeoutError::Timeout => {
                        anyhow!("the background build of {what} did not finish within {WAIT_TIMEOUT:?}")
                    }
                    mpsc::RecvTimeoutError::Disconnected => {
                        anyhow!("the background build of {what} never ran (the builds were stopped)")
                    }
                })
            });
        let waited = started.elapsed();
        let (name, result) = match finished {
            Ok(Ok(took)) => {
                (format!("{what} built in the background in {}", crate::progress::human(took)), Ok(()))
            }
            Ok(Err(failure)) => (format!("{what}, built in the background"), Err(anyhow!(failure))),
            Err(e) => (format!("{what}, built in the background"), Err(e)),
        };
        Some(Waited { name, result, waited })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(group) = *running {
            // sh execs chrt, which execs xtask, which leads the group; go, the compilers and
            // debootstrap are in it. The cgroup is removed after this, once they exited.
            let _ = kill_process_group(group, Signal::TERM);
        }
    }
}

/// Runs one build to its end, under `SCHED_IDLE` and in the cgroup whose `cgroup.procs` files are
/// `join` (if any); its process group is in `running` while it runs.
fn run_one(
    exe: &Path,
    repo: &Path,
    build: &Build,
    log: &PathBuf,
    join: &[PathBuf],
    running: &Mutex<Option<Pid>>,
) -> Finished {
    let started = Instant::now();
    let fail = |e: String| format!("the background build of {} failed: {e}", build.what);
    let out = std::fs::File::create(log).map_err(|e| fail(format!("create {}: {e}", log.display())))?;
    let err = out.try_clone().map_err(|e| fail(format!("{}: {e}", log.display())))?;
    let mut child = {
        let mut running = running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut command = Command::new("sh");
        command.args(["-c", JOIN_CGROUP_AND_EXEC, "sh"]).arg(join.len().to_string()).args(join);
        let child = command
            .args(["chrt", "--idle", "0"])
            .arg(exe)
            .args(["cluster", "build"])
            .args(&build.args)
            .current_dir(repo)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| fail(format!("start chrt --idle 0 {}: {e}", exe.display())))?;
        *running = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
        child
    };
    let status = child.wait();
    *running.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    let status = status.map_err(|e| fail(format!("wait: {e}")))?;
    if !status.success() {
        let tail = crate::common::process::tail(log, 15);
        return Err(fail(format!("{status}; {}:\n{tail}", log.display())));
    }
    Ok(started.elapsed())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A stand-in for xtask: says what it was asked, writes its pid, fails on `fail`, sleeps on
    /// `sleep`.
    fn program(dir: &Path) -> PathBuf {
        let exe = dir.join("fake-xtask");
        let script = format!(
            "#!/bin/sh\necho \"asked: $*\"\necho $$ > {d}/pid.\"$3\"\nchrt -p $$ > {d}/policy.\"$3\"\ncase \"$*\" in *fail*) echo 'it broke' >&2; exit 3;; *sleep*) sleep 300;; *spin*) i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done;; esac\n",
            d = dir.display()
        );
        std::fs::write(&exe, script).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    fn build(key: &'static str, arg: &str) -> Build {
        Build { key, what: format!("the {key} build"), args: vec![arg.into()] }
    }

    #[tokio::test]
    async fn builds_run_in_order_and_a_failure_comes_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let exe = program(dir.path());
        let builds = vec![build("first", "fail"), build("second", "ok")];
        let mut background =
            Background::start_with(dir.path(), exe.clone(), dir.path(), builds, None).unwrap();

        let second = background.wait("second").await.unwrap();
        assert!(second.name.starts_with("the second build built in the background in "), "{}", second.name);
        second.result.unwrap();
        let first = background.wait("first").await.unwrap();
        assert_eq!(first.name, "the first build, built in the background");
        let err = format!("{:#}", first.result.unwrap_err());
        assert!(err.contains("asked: cluster build fail") && err.contains("it broke"), "{err}");
        assert!(err.contains("background-first.log"), "{err}");
        assert!(background.wait("first").await.is_none(), "a build is waited for once");
        assert!(background.wait("third").await.is_none(), "no such build");
        // Both ran, the first first (its pid file is older or as old).
        let modified = |f: &str| std::fs::metadata(dir.path().join(f)).unwrap().modified().unwrap();
        assert!(modified("pid.fail") <= modified("pid.ok"));
        // Both under SCHED_IDLE: they take only CPU nothing else wants.
        for build in ["fail", "ok"] {
            let policy = std::fs::read_to_string(dir.path().join(format!("policy.{build}"))).unwrap();
            assert!(policy.contains("SCHED_IDLE"), "{build}: {policy}");
        }
        drop(background);
        for _ in 0..50 {
            if !exe.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the program's copy was not removed after the last build");
    }

    #[tokio::test]
    async fn dropped_it_stops_the_running_build_and_starts_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let exe = program(dir.path());
        let builds = vec![build("slow", "sleep"), build("after", "ok")];
        let background = Background::start_with(dir.path(), exe, dir.path(), builds, None).unwrap();
        let pid_file = dir.path().join("pid.sleep");
        let mut pid = None;
        for _ in 0..100 {
            pid = std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok());
            if pid.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid = pid.expect("the slow build started");
        drop(background);
        let alive =
            || procfs::process::Process::new(pid).and_then(|p| p.stat()).is_ok_and(|stat| stat.state != 'Z');
        for _ in 0..100 {
            if !alive() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!alive(), "the running build (pid {pid}) was not stopped");
        std::thread::sleep(Duration::from_millis(500));
        assert!(!dir.path().join("pid.ok").exists(), "a build started after the drop");
    }

    #[tokio::test]
    async fn builds_run_in_their_cgroup_and_its_cpu_time_is_counted() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: making a cgroup needs root (CI runs as root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let exe = program(dir.path());
        let name = format!("dra-e2e-background-test-{}", std::process::id());
        let cgroup = super::super::budget::BackgroundCgroup::create_named(&name).unwrap();
        let procs = cgroup.procs_files();
        let mut background =
            Background::start_with(dir.path(), exe, dir.path(), vec![build("spin", "spin")], Some(cgroup))
                .unwrap();
        let waited = background.wait("spin").await.unwrap();
        waited.result.unwrap();
        let usage = super::super::budget::cgroup_usage(&name).expect("the cgroup's CPU time");
        assert!(usage > Duration::ZERO, "the build's CPU time was not counted in its cgroup");
        drop(background);
        for procs in procs {
            assert!(!procs.parent().unwrap().exists(), "{} left after the builds", procs.display());
        }
    }
}
