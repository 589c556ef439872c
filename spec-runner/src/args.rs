//! The command line of a spec binary ([`RunnerArgs`]) and [`run`], its entry point.

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::{
    cluster::backend::ClusterBackend,
    cluster::kube_backend::KubeBackend,
    duration,
    report::progress::{Output, Verbosity},
    run::capture,
    run::monitor::Monitor,
    run::options::RunOptions,
    run::runner::run_with_backend,
    select::balance::Timings,
    select::partition::{Partition, PartitionError, PartitionFlag},
    select::rerun::Rerun,
    select::selection::{Selection, SelectionError},
    spec::gate::{GateTable, table_for_flag, table_for_server},
    spec::info::SpecInfo,
    spec::registry::Registry,
};

/// The runner's flags; flatten them into the binary's clap parser.
#[derive(Debug, Clone, clap::Args)]
pub struct RunnerArgs {
    /// Run only specs whose full text matches this regex (repeatable: any of them).
    #[arg(long, value_name = "REGEX")]
    pub focus: Vec<String>,

    /// Do not run specs whose full text matches this regex (repeatable: any of them).
    #[arg(long, value_name = "REGEX")]
    pub skip: Vec<String>,

    /// Run only specs whose labels satisfy this ginkgo label expression, e.g.
    /// 'DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Flaky'.
    #[arg(long, value_name = "EXPR")]
    pub label_filter: Option<String>,

    /// How many specs run at the same time (`Serial` specs always run alone); `-p 1` runs one
    /// at a time. Default: as ginkgo's `-p`, the CPUs (one less above 4), at least 2, since
    /// specs mostly wait on the cluster.
    #[arg(short = 'p', long = "procs", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub procs: Option<u32>,

    /// Default timeout of a spec (specs may set their own), e.g. 90s, 10m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub timeout: Duration,

    /// How long all of a spec's cleanups together may take after its body ended. Each cleanup
    /// gets its own timeout (2m) or what is left of this, whichever is less; once it is spent,
    /// each cleanup left still runs for 5s (its delete requests go out), and the spec fails
    /// naming every cleanup given up on. So a spec's cleanup ends within this plus 5s per
    /// cleanup left. Deferred checks (e.g. the namespace to be gone) run later, at the same
    /// time, each within its own timeout (the namespace's: 5m).
    #[arg(long, value_name = "DURATION", default_value = "3m", value_parser = duration::parse)]
    pub cleanup_bound: Duration,

    /// Print the full texts of the selected specs and exit; with -v also what each asserts,
    /// where the spec says so.
    #[arg(long)]
    pub list: bool,

    /// Write a report in the schema of ginkgo's JSON report (`[]types.Report`) to this file.
    #[arg(long, value_name = "FILE")]
    pub json_report: Option<PathBuf>,

    /// Write a JUnit XML report to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,

    /// Folder for failed specs' artifacts (one sub-folder per failed spec).
    #[arg(long, value_name = "DIR", default_value = "target/e2e/artifacts")]
    pub artifacts: PathBuf,

    /// Run the selection N times in total (to find flakes); reports name the attempt.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,

    /// Seed of the specs' order (ginkgo's `--seed`); printed by every run, so an order can be
    /// repeated. Default: a new seed each run.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Shuffle every spec, not only the top-level containers (ginkgo's `--randomize-all`).
    #[arg(long)]
    pub randomize_all: bool,

    /// After the first failure start no new spec; running specs finish and clean up.
    #[arg(long)]
    pub fail_fast: bool,

    /// Run a failing spec up to N times in all; one that passes on a retry is reported as flaky,
    /// with every earlier failure (ginkgo's `--flake-attempts`).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub flake_attempts: u32,

    /// Print a progress report of every spec still running after this long (its phase, step,
    /// last log line and what it waits for), then again every --poll-progress-interval
    /// (ginkgo's flag); off by default (0).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub poll_progress_after: Option<Duration>,

    /// How often a slow spec's progress report repeats (ginkgo's flag and default).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse)]
    pub poll_progress_interval: Duration,

    /// Verbose: also print each spec's start, phases (namespace, body, each cleanup) and steps as
    /// they happen.
    #[arg(short = 'v', long, conflicts_with = "succinct")]
    pub verbose: bool,

    /// Succinct: one character per passed (•) or skipped (S) spec, as ginkgo's succinct mode;
    /// failures still in full.
    #[arg(long)]
    pub succinct: bool,

    /// Kubeconfig of the cluster (default: KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The Kubernetes version whose spec texts to use, e.g. v1.38.0-beta.0 (upstream's texts
    /// change with the feature gates of each version). Default: with --list the oldest version
    /// known, in a run the cluster's version (`/version`), else the oldest.
    #[arg(long, value_name = "VERSION")]
    pub k8s_version: Option<String>,

    /// Only report the objects that runs which are gone (their Lease expired) left behind;
    /// by default a run removes them before its specs start.
    #[arg(long)]
    pub keep_leftovers: bool,

    /// Run shard M of N of the selection (after --focus, --skip, --label-filter), so that N
    /// machines together run every selected spec once; the other shards' specs are reported as
    /// skipped "in shard K of N". KIND: hash (by each spec's full text: a spec keeps its shard
    /// when others are added), slice (even sizes) or time (balanced by --timings for this -p).
    /// KIND:ci (or ci for slice:ci) takes M and N from CI_NODE_INDEX (counted from 1, as
    /// GitLab's) and CI_NODE_TOTAL.
    #[arg(long, value_name = "KIND:M/N", value_parser = clap::value_parser!(PartitionFlag))]
    pub partition: Option<PartitionFlag>,

    /// The JSON report of an earlier run (--json-report, or `report merge` of shards) whose spec
    /// durations --partition time balances the shards by.
    #[arg(long, value_name = "FILE")]
    pub timings: Option<PathBuf>,

    /// Run exactly the specs that failed (or timed out, or were interrupted) in this JSON report
    /// of an earlier run, by their full texts; when none did, say so and exit 0.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["focus", "skip", "label_filter"])]
    pub rerun_failed: Option<PathBuf>,
}

impl RunnerArgs {
    /// The run options these flags stand for (progress on stdout).
    pub fn options(&self) -> RunOptions {
        RunOptions {
            procs: self.procs(),
            procs_is_default: self.procs.is_none(),
            default_timeout: self.timeout,
            cleanup_bound: self.cleanup_bound,
            repeat: self.repeat,
            artifacts: self.artifacts.clone(),
            junit: self.junit.clone(),
            output: Output::stdout(),
            seed: self.seed,
            randomize_all: self.randomize_all,
            fail_fast: self.fail_fast,
            flake_attempts: self.flake_attempts,
            json_report: self.json_report.clone(),
            poll_progress_after: self.poll_progress_after.filter(|d| !d.is_zero()),
            poll_progress_interval: self.poll_progress_interval,
            verbosity: if self.verbose {
                Verbosity::Verbose
            } else if self.succinct {
                Verbosity::Succinct
            } else {
                Verbosity::Normal
            },
            ..RunOptions::default()
        }
    }

    /// `-p`, or its default.
    fn procs(&self) -> usize {
        self.procs.map_or_else(default_procs, |p| usize::try_from(p).unwrap_or(usize::MAX))
    }

    /// The selection these flags stand for: it reads the reports of `--rerun-failed` and
    /// `--timings`, and for `--partition ci` the CI's variables.
    pub fn selection(&self) -> Result<Selection, SelectionError> {
        let mut selection = Selection::new(&self.focus, &self.skip, self.label_filter.as_deref())?;
        if let Some(rerun) = self.rerun()? {
            selection = selection.with_names(rerun.failed);
        }
        let timings = self
            .timings
            .as_deref()
            .map(Timings::read)
            .transpose()
            .map_err(|source| SelectionError::Report { flag: "--timings", source })?;
        if let Some(flag) = self.partition {
            let env = |name: &str| std::env::var(name).ok();
            selection = selection.with_partition(Partition::resolve(flag, env, timings, self.procs())?);
        } else if timings.is_some() {
            return Err(PartitionError::TimingsWithoutTime.into());
        }
        Ok(selection)
    }

    /// The failed specs of `--rerun-failed`'s report.
    fn rerun(&self) -> Result<Option<Rerun>, SelectionError> {
        let read = self.rerun_failed.as_deref().map(Rerun::read).transpose();
        read.map_err(|source| SelectionError::Report { flag: "--rerun-failed", source })
    }
}

/// The default `-p`: as ginkgo's `-p`, the CPUs (one less above 4, for the runner itself), but
/// at least 2: a spec mostly waits on the cluster, so two share a CPU well.
pub fn default_procs() -> usize {
    procs_for_cpus(std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

fn procs_for_cpus(cpus: usize) -> usize {
    let procs = if cpus > 4 { cpus - 1 } else { cpus };
    procs.max(2)
}

/// How often the run says what it is cleaning up after the first interrupt.
const CLEANUP_STATUS_EVERY: Duration = Duration::from_secs(3);

/// Runs the selected specs against the cluster of `--kubeconfig` and
/// returns the process exit code: 0 when nothing failed, 1 when a spec
/// failed, 2 for usage or configuration errors (bad regex or label filter,
/// unusable kubeconfig, unreachable cluster, no `resource.k8s.io/v1`), 130
/// after an interrupt (Ctrl-C's SIGINT, or SIGTERM).
///
/// Installs the default tracing set-up ([`init_tracing`](crate::init_tracing))
/// unless a global subscriber exists, a panic hook that logs panics inside
/// specs into the spec's log, and the signal handlers: SIGUSR1 prints a progress report of
/// every running spec; the first interrupt, SIGINT (Ctrl-C) or SIGTERM, cancels running specs
/// (their cleanups run, and every few seconds the run says which cleanup each spec is in) and
/// writes the report; a second one, of either kind, lists the cleanup steps not done and exits
/// at once: 130 when the first was SIGINT, 143 when it was SIGTERM.
pub async fn run(registry: Registry, args: RunnerArgs) -> ExitCode {
    capture::init_tracing();
    if let Some(code) = before_the_cluster(&registry, &args, true) {
        return code;
    }
    let backend = match KubeBackend::connect(args.kubeconfig.as_deref()).await {
        Ok(backend) => backend,
        Err(e) => return usage_error(&e.to_string()),
    };
    run_connected(registry, args, backend).await
}

/// [`run`] for a suite whose spec texts depend on the Kubernetes version it targets: `register`
/// builds the registry for one of `tables` (the first is the default). `--k8s-version` picks
/// the table (an unknown version is a usage error, exit 2); without it `--list` uses the
/// default, and a run the table of the cluster's `/version` (same tag, else the same minor
/// version; the default when none matches, saying so).
pub async fn run_versioned(
    tables: &'static [GateTable],
    register: impl Fn(&'static GateTable) -> Registry,
    args: RunnerArgs,
) -> ExitCode {
    capture::init_tracing();
    let Some(default) = tables.first() else { return usage_error("the suite knows no Kubernetes version") };
    let flagged = match args.k8s_version.as_deref().map(|v| table_for_flag(tables, v)).transpose() {
        Ok(table) => table,
        Err(e) => return usage_error(&e.to_string()),
    };
    if let Some(table) = flagged.or(args.list.then_some(default)) {
        return run(register(table), args).await;
    }
    if let Some(code) = before_the_cluster(&register(default), &args, false) {
        return code;
    }
    let backend = match KubeBackend::connect(args.kubeconfig.as_deref()).await {
        Ok(backend) => backend,
        Err(e) => return usage_error(&e.to_string()),
    };
    // An unreachable cluster is preflight's to report, with its hints.
    let server = backend.client().apiserver_version().await.map(|v| v.git_version).ok();
    let table = match server.as_deref().map(|v| (v, table_for_server(tables, v))) {
        Some((version, Some(table))) => {
            println!("Spec texts of Kubernetes {table}, the cluster's version ({version}).");
            table
        }
        Some((version, None)) => {
            println!(
                "Spec texts of Kubernetes {default}: none for the cluster's version {version}; --k8s-version picks others."
            );
            default
        }
        None => default,
    };
    run_connected(register(table), args, backend).await
}

/// [`run`] once connected.
async fn run_connected(registry: Registry, args: RunnerArgs, backend: KubeBackend) -> ExitCode {
    // The run's Lease and identity, and the sweep of gone runs' leftovers (run_guard).
    let lease = crate::cluster::run_guard::begin(&backend, args.keep_leftovers).await;
    let backend = match &lease {
        Some(lease) => backend.with_run_identity(lease.run_id()),
        None => backend,
    };
    let code = run_on(registry, args, Arc::new(backend)).await;
    if let Some(lease) = lease {
        lease.release().await;
    }
    code
}

/// [`run`] against any backend (`--kubeconfig` is not used): for test binaries that run the
/// real command line and signal handling without a cluster.
pub async fn run_on(registry: Registry, args: RunnerArgs, backend: Arc<dyn ClusterBackend>) -> ExitCode {
    capture::init_tracing();
    if let Some(code) = before_the_cluster(&registry, &args, true) {
        return code;
    }
    let Ok(selection) = args.selection() else { return ExitCode::from(2) };
    install_panic_hook();
    let interrupt = CancellationToken::new();
    let options = args.options();
    let signals =
        tokio::spawn(handle_signals(interrupt.clone(), options.monitor.clone(), options.output.clone()));
    let report = run_with_backend(registry, &selection, options, backend, interrupt).await;
    signals.abort();
    if let Some(error) = &report.error {
        eprintln!("error: {error}");
    }
    ExitCode::from(report.exit_code())
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

/// What needs no cluster: a valid registry and selection, `--rerun-failed` with nothing to run
/// (exit 0), and `--list`. `Some` ends the run. `final_registry`: `registry` is the one the run
/// uses (not a stand-in until the cluster's version is known), so that `--rerun-failed`'s specs
/// must be in it.
fn before_the_cluster(registry: &Registry, args: &RunnerArgs, final_registry: bool) -> Option<ExitCode> {
    if let Err(e) = registry.validate() {
        return Some(usage_error(&e.to_string()));
    }
    let selection = match args.selection() {
        Ok(s) => s,
        Err(e) => return Some(usage_error(&e.to_string())),
    };
    if let Ok(Some(rerun)) = args.rerun() {
        if let Some(nothing) = rerun.nothing_to_run() {
            if args.list {
                eprintln!("{nothing}")
            } else {
                println!("{nothing}")
            }
            return Some(ExitCode::SUCCESS);
        }
        let version = registry.gate_table().map(|table| table.version);
        let known = |text: &str| registry.specs().any(|s| s.full_text() == text);
        if let Some(unknown) = rerun.unknown(known, version).filter(|_| final_registry) {
            return Some(usage_error(&unknown));
        }
    }
    if args.list {
        let selected: Vec<&SpecInfo> = registry.specs().filter(|s| selection.matches(s)).collect();
        for spec in selection.split(selected, |s| s).0 {
            println!("{}", spec.full_text());
            if let Some(description) = spec.description().filter(|_| args.verbose) {
                println!("    {description}");
            }
        }
        return Some(ExitCode::SUCCESS);
    }
    None
}

/// SIGUSR1, and the interrupts (SIGINT, SIGTERM), for as long as the run lasts.
async fn handle_signals(interrupt: CancellationToken, monitor: Monitor, output: Output) {
    let reports = async {
        match signal(SignalKind::user_defined1()) {
            Ok(mut usr1) => {
                while usr1.recv().await.is_some() {
                    output.block(&monitor.report("Progress report (SIGUSR1)"));
                }
            }
            Err(e) => tracing::warn!("cannot listen for SIGUSR1: {e}"),
        }
    };
    tokio::join!(reports, handle_interrupts(interrupt, &monitor));
}

/// A signal that interrupts the run: Ctrl-C's SIGINT, or the SIGTERM of a CI's timeout,
/// `timeout(1)` or `kill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    Int,
    Term,
}

impl Interrupt {
    fn name(self) -> &'static str {
        match self {
            Self::Int => "SIGINT",
            Self::Term => "SIGTERM",
        }
    }

    /// The exit code when a second interrupt ends the run at once after this first one: 128 +
    /// the signal's number, what the shell reports for a process the signal ended (130 after
    /// SIGINT, 143 after SIGTERM). A run that finished its cleanups exits 130 after either
    /// ([`RunReport::exit_code`](crate::RunReport::exit_code)): that is the runner's
    /// one code for "interrupted", which xtask's lanes and mutants read.
    fn exit_code(self) -> i32 {
        match self {
            Self::Int => 130,
            Self::Term => 143,
        }
    }
}

/// The interrupts' listeners; one that could not be installed never fires (that signal then
/// ends the process as by default).
struct Interrupts {
    sigint: Option<Signal>,
    sigterm: Option<Signal>,
}

impl Interrupts {
    fn listen() -> Self {
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| tracing::warn!("cannot listen for {name}: {e}")).ok()
        };
        Self {
            sigint: listen(SignalKind::interrupt(), "SIGINT (Ctrl-C)"),
            sigterm: listen(SignalKind::terminate(), "SIGTERM"),
        }
    }

    /// The next interrupt; `None` once neither can come any more. Cancel-safe.
    async fn next(&mut self) -> Option<Interrupt> {
        async fn recv(signal: &mut Option<Signal>) -> Option<()> {
            match signal {
                Some(signal) => signal.recv().await,
                None => None,
            }
        }
        tokio::select! {
            Some(()) = recv(&mut self.sigint) => Some(Interrupt::Int),
            Some(()) = recv(&mut self.sigterm) => Some(Interrupt::Term),
            else => None,
        }
    }
}

/// The first interrupt (SIGINT or SIGTERM): cancel the run, then say every few seconds what is
/// being cleaned up. The second (either): list the cleanup steps not done and exit at once,
/// with the first one's [`Interrupt::exit_code`]. The same listeners serve both, so a second
/// interrupt that comes right after the first (before a new listener could exist) is not lost.
async fn handle_interrupts(interrupt: CancellationToken, monitor: &Monitor) {
    let mut interrupts = Interrupts::listen();
    let Some(first) = interrupts.next().await else { return };
    let interrupted = tokio::time::Instant::now();
    let again = match first {
        Interrupt::Int => "press Ctrl-C again to exit at once",
        Interrupt::Term => "a second SIGTERM or SIGINT exits at once",
    };
    eprintln!(
        "\nInterrupted ({}): cancelling running specs and running their cleanups; {again}.",
        first.name()
    );
    interrupt.cancel();
    let mut status = tokio::time::interval_at(interrupted + CLEANUP_STATUS_EVERY, CLEANUP_STATUS_EVERY);
    loop {
        tokio::select! {
            second = interrupts.next() => {
                if let Some(second) = second {
                    eprint!(
                        "\nInterrupted twice ({}, then {}): exiting without cleanup.\n{}",
                        first.name(),
                        second.name(),
                        monitor.left_behind()
                    );
                    std::process::exit(first.exit_code());
                }
                return;
            }
            _ = status.tick() => eprint!("{}", monitor.cleanup_status(interrupted.elapsed())),
        }
    }
}

/// Panics inside a spec go to the spec's log (with their location) instead
/// of stderr; other panics keep the default output.
fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if tracing::Span::current().is_none() {
            previous(info);
            return;
        }
        let location = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a non-string payload".to_owned());
        tracing::error!(target: crate::report::outcome::OUTCOME_TARGET, "panicked{location}: {message}");
    }));
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        runner: RunnerArgs,
    }

    #[test]
    fn the_default_procs_follow_the_cpus_and_are_at_least_two() {
        assert_eq!([1, 2, 3, 4, 5, 8].map(procs_for_cpus), [2, 2, 3, 4, 4, 7]);
        let default = Cli::parse_from(["dra-e2e"]).runner.options();
        assert_eq!((default.procs, default.procs_is_default), (default_procs(), true));
        let serial = Cli::parse_from(["dra-e2e", "-p", "1"]).runner.options();
        assert_eq!((serial.procs, serial.procs_is_default), (1, false));
    }

    #[test]
    fn the_cleanup_bound_defaults_to_the_documented_one() {
        let default = Cli::parse_from(["dra-e2e"]).runner.options();
        assert_eq!(default.cleanup_bound, crate::DEFAULT_CLEANUP_BOUND);
        let set = Cli::parse_from(["dra-e2e", "--cleanup-bound", "90s"]).runner.options();
        assert_eq!(set.cleanup_bound, Duration::from_secs(90));
    }
}
