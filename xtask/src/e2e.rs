//! `cargo xtask e2e`: builds the `dra-e2e` binary and runs the suites against a cluster with the
//! runner's flags as they were given (the command line, checked by clap in `cli::runner`, arrives
//! here as [`E2eOptions`]). Without `--kubeconfig` it brings a cluster up first (the embedded local
//! one by default) and takes it down afterwards unless `--keep-cluster` (or unless the cluster was
//! already running).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{SignalKind, signal};

use crate::{kind, local, overrides::Overrides, provider::Provider};

mod interrupts;

pub(crate) use interrupts::pass_on_sigterm;

/// What `cargo xtask e2e` runs: the cluster to use or bring up, and `dra-e2e`'s flags.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct E2eOptions {
    /// The cluster provider when no kubeconfig is given.
    pub provider: Provider,
    /// An existing cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Leave the cluster running after the run.
    pub keep_cluster: bool,
    /// The kind cluster name (`--name`).
    pub kind_name: Option<String>,
    /// The kind node image (`--image`).
    pub kind_image: Option<String>,
    /// The Kubernetes release of the cluster brought up (`--k8s-version`; it is in
    /// [`runner_args`](Self::runner_args) too: `dra-e2e`'s spec texts follow it).
    pub k8s_version: Option<String>,
    /// `dra-e2e`'s command line as given, without `--kubeconfig` (passed by [`run_runner`]); a
    /// leading `cleanup` is its subcommand.
    pub runner_args: Vec<String>,
}

/// How to build `dra-e2e`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// Only the binary (for users).
    Binary,
    /// With the features the workspace's tests unify to, so that `cargo xtask test` reuses the
    /// artifacts of `cargo test --workspace` instead of compiling the dependencies again.
    SameAsTests,
}

/// Builds `dra-e2e` and returns its path.
pub fn build_runner(repo: &Path, build: Build) -> Result<PathBuf> {
    let args: &[&str] = match build {
        Build::Binary => &["build", "--quiet", "--package", "suites", "--bin", "dra-e2e"],
        Build::SameAsTests => &["build", "--quiet", "--workspace", "--all-targets"],
    };
    let status =
        crate::repo::cargo_command(repo).args(args).status().context("run cargo build for dra-e2e")?;
    if !status.success() {
        bail!("building dra-e2e failed");
    }
    Ok(target_dir(repo).join("debug").join("dra-e2e"))
}

/// The cargo target directory of the workspace.
pub fn target_dir(repo: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo.join("target"))
}

/// Runs `dra-e2e` with `args` against `kubeconfig`; returns its exit code (128 + the signal's
/// number when a signal ended it). It runs in a process group of its own: every SIGINT this
/// process receives meanwhile (a terminal's Ctrl-C, `kill -INT`) is passed on to it once, and a
/// SIGTERM as [`pass_on_sigterm`] says ([`interrupts`]).
pub async fn run_runner(runner: &Path, kubeconfig: &Path, args: &[String]) -> Result<i32> {
    run_runner_in(&interrupts::RUNNERS, runner, kubeconfig, args).await
}

/// [`run_runner`], the process registered in `set`.
async fn run_runner_in(
    set: &interrupts::RunnerSet,
    runner: &Path,
    kubeconfig: &Path,
    args: &[String],
) -> Result<i32> {
    let (subcommand, args) = split_subcommand(args);
    // Listening before dra-e2e starts: no SIGINT in between is lost.
    let mut sigint = signal(SignalKind::interrupt()).context("listen for SIGINT")?;
    let mut command = tokio::process::Command::new(runner);
    command.args(subcommand).arg("--kubeconfig").arg(kubeconfig).args(args);
    let (mut child, _registered) =
        interrupts::spawn(&mut command, set).with_context(|| format!("start {}", runner.display()))?;
    loop {
        tokio::select! {
            status = child.wait() => return Ok(interrupts::exit_code(status?)),
            Some(()) = sigint.recv() => interrupts::pass_on(&child),
        }
    }
}

/// A leading `cleanup` (`cargo xtask e2e --kubeconfig K cleanup`) is `dra-e2e`'s subcommand: it
/// goes before `--kubeconfig`, the rest after it.
fn split_subcommand(args: &[String]) -> (&[String], &[String]) {
    match args.first() {
        Some(first) if first == "cleanup" => args.split_at(1),
        _ => (&[], args),
    }
}

/// `cargo xtask e2e ...`: exits with dra-e2e's exit code.
pub async fn run(args: E2eOptions) -> Result<ExitCode> {
    let code = run_with_code(&args).await?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// `cargo xtask e2e ...`, returning dra-e2e's exit code.
async fn run_with_code(args: &E2eOptions) -> Result<i32> {
    // The release of a cluster to bring up, checked before anything is built.
    if let (None, Some(version)) = (&args.kubeconfig, &args.k8s_version) {
        local::parse_k8s_version(version)?;
    }
    let repo = crate::repo::repo_root();
    let runner = build_runner(&repo, Build::Binary)?;
    let (kubeconfig, teardown) = match (&args.kubeconfig, args.provider) {
        (Some(path), _) => (path.clone(), None),
        (None, Provider::Local) => {
            // A running cluster is used with whatever node count and settings it has, unless
            // it runs another release than --k8s-version asks for.
            let mut cluster = local::LocalCluster::new(None)?;
            if let Some(version) = &args.k8s_version {
                let version = local::parse_k8s_version(version)?;
                let overrides = Overrides { k8s_version: Some(version), ..cluster.overrides().clone() };
                cluster = cluster.with_overrides(Some(overrides));
            }
            let was_running = cluster.is_up().await;
            let path = cluster.up(false).await?;
            let teardown = (!args.keep_cluster && !was_running).then_some(Provider::Local);
            if was_running {
                eprintln!("note: the local cluster was already running; it stays up after the run");
            }
            (path, teardown)
        }
        (None, Provider::Kind) => {
            // --k8s-version: the node image is built here from that release.
            let overrides = match &args.k8s_version {
                Some(version) => {
                    let version = local::parse_k8s_version(version)?;
                    Some(Overrides { k8s_version: Some(version), ..Overrides::default() })
                }
                None => None,
            };
            let path = Provider::Kind.up(&kind_args(args), None, overrides, false, false).await?;
            (path, (!args.keep_cluster).then_some(Provider::Kind))
        }
    };
    let code = run_runner(&runner, &kubeconfig, &args.runner_args).await;
    if let Some(provider) = teardown {
        provider.down(&kind_args(args), false).await?;
    }
    code
}

/// The kind cluster of the run: `--name` and `--image`, else the `KIND_*` variables'.
fn kind_args(args: &E2eOptions) -> kind::KindOptions {
    kind::KindOptions {
        name: args
            .kind_name
            .clone()
            .or_else(|| std::env::var("KIND_CLUSTER_NAME").ok())
            .unwrap_or_else(|| "dra-e2e".into()),
        image: args.kind_image.clone().or_else(|| std::env::var("KIND_NODE_IMAGE").ok()),
        kind_version: std::env::var("KIND_VERSION").ok(),
        kind_from_path: false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use std::time::Duration;

    use rustix::process::{Pid, Signal, kill_process};

    use super::*;
    use crate::common::own_process::{Process, in_own_process};

    /// A stand-in dra-e2e, a real process, and the set it runs in: it writes `started` (its pid),
    /// appends each SIGINT (`INT`) and SIGTERM (`TERM`) it receives to `received`, exits 143
    /// after a SIGTERM and 0 once `stop` exists, or after a minute (a failed test leaves no
    /// process behind, nor one that holds the test's output open).
    struct StandIn {
        dir: tempfile::TempDir,
        runner: PathBuf,
        set: interrupts::RunnerSet,
    }

    impl StandIn {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let script = format!(
                "#!/bin/sh\nexec >/dev/null 2>&1\ncd {}\n\
                 trap 'echo INT >> received' INT\ntrap 'echo TERM >> received; exit 143' TERM\n\
                 echo $$ > started.tmp; mv started.tmp started\n\
                 i=0; while [ ! -f stop ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n",
                dir.path().display()
            );
            let runner = dir.path().join("dra-e2e");
            std::fs::write(&runner, script).unwrap();
            std::fs::set_permissions(&runner, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            Self { dir, runner, set: interrupts::RunnerSet::default() }
        }

        /// [`run_runner`] on the stand-in, in its set.
        async fn run(&self) -> Result<i32> {
            run_runner_in(&self.set, &self.runner, Path::new("/k.conf"), &[]).await
        }

        /// Its pid, once it runs and traps the signals.
        async fn started(&self) -> i32 {
            self.wait_for("started", |t| t.ends_with('\n')).await.trim().parse().unwrap()
        }

        /// Waits until its file `name` holds `wanted`; returns the text.
        async fn wait_for(&self, name: &str, wanted: impl Fn(&str) -> bool) -> String {
            let file = self.dir.path().join(name);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if wanted(&text) {
                    return text;
                }
                assert!(tokio::time::Instant::now() < deadline, "{}: {text:?}", file.display());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        /// The signals it received, in order.
        fn received(&self) -> String {
            std::fs::read_to_string(self.dir.path().join("received")).unwrap_or_default()
        }
    }

    /// Sends `signal` to this process alone, as `kill` or a CI runner does (not to its group).
    fn to_this_process(signal: Signal) {
        kill_process(rustix::process::getpid(), signal).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_sigint_to_xtask_alone_reaches_dra_e2e_once() {
        // The old run_runner left dra-e2e in xtask's group and passed nothing on: a SIGINT to
        // xtask alone never reached it.
        if let Process::Ran { stderr } =
            in_own_process(module_path!(), "each_sigint_to_xtask_alone_reaches_dra_e2e_once")
        {
            // Two SIGINTs, each passed on once (two sent at once would reach the stand-in as one).
            let passed_on = stderr.matches("interrupted (SIGINT): passed on to dra-e2e").count();
            assert_eq!(passed_on, 2, "{stderr}");
            return;
        }
        let stand_in = StandIn::new();
        let signals = async {
            let group = rustix::process::getpgid(Pid::from_raw(stand_in.started().await)).unwrap();
            assert_ne!(group, rustix::process::getpgrp(), "dra-e2e runs in a process group of its own");
            to_this_process(Signal::INT);
            stand_in.wait_for("received", |t| !t.is_empty()).await;
            to_this_process(Signal::INT);
            stand_in.wait_for("received", |t| t.lines().count() >= 2).await;
            std::fs::write(stand_in.dir.path().join("stop"), "").unwrap();
        };
        let (code, ()) = tokio::join!(stand_in.run(), signals);
        assert_eq!(code.unwrap(), 0);
        assert_eq!(stand_in.received(), "INT\nINT\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigterm_goes_on_to_dra_e2e_and_xtask_exits_143_once_it_ended() {
        let Process::Own =
            in_own_process(module_path!(), "sigterm_goes_on_to_dra_e2e_and_xtask_exits_143_once_it_ended")
        else {
            return;
        };
        let stand_in = StandIn::new();
        let sigterm = signal(SignalKind::terminate()).unwrap();
        let terminations = async {
            stand_in.started().await;
            to_this_process(Signal::TERM);
            interrupts::terminations(sigterm, &stand_in.set).await
        };
        let (code, exit) = tokio::join!(stand_in.run(), terminations);
        assert_eq!((code.unwrap(), exit), (143, interrupts::TERMINATED), "dra-e2e trapped SIGTERM, exit 143");
        assert_eq!(stand_in.received(), "TERM\n");
        // xtask is ending: no dra-e2e starts any more.
        let again = stand_in.run().await.unwrap_err();
        assert!(format!("{again:#}").contains("terminated (SIGTERM)"), "{again:#}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigterm_with_no_dra_e2e_running_ends_xtask_at_once_with_143() {
        let Process::Own =
            in_own_process(module_path!(), "sigterm_with_no_dra_e2e_running_ends_xtask_at_once_with_143")
        else {
            return;
        };
        let set = interrupts::RunnerSet::default();
        let sigterm = signal(SignalKind::terminate()).unwrap();
        to_this_process(Signal::TERM);
        assert_eq!(interrupts::terminations(sigterm, &set).await, interrupts::TERMINATED);
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_leading_cleanup_is_the_runners_subcommand() {
        let run = strings(&["--focus", "DRA", "-p", "4"]);
        assert_eq!(split_subcommand(&run), (&[][..], &run[..]));
        let cleanup = strings(&["cleanup", "--keep-leftovers"]);
        assert_eq!(split_subcommand(&cleanup), (&cleanup[..1], &cleanup[1..]));
    }
}
