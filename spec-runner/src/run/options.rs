//! The settings of a run ([`RunOptions`]), as the command line gives them.

use std::{path::PathBuf, time::Duration};

use crate::{
    report::progress::{Output, Verbosity},
    run::monitor::Monitor,
};

/// The default clean-up bound of a spec (`--cleanup-bound`): 3 minutes. One cleanup may use
/// its whole default timeout (2 minutes; the harness's longest own waits, such as pods gone and
/// claims unprepared, are a minute each) and the rest still get a minute, far more than a
/// healthy teardown needs (seconds), while a spec whose teardown cannot succeed (a kubelet that
/// cannot unprepare, a node that is gone) gives up after 3 minutes instead of 2 minutes per
/// hanging step.
pub const DEFAULT_CLEANUP_BOUND: Duration = Duration::from_secs(180);

/// Settings of a run (the parsed command line, see [`RunnerArgs`](crate::RunnerArgs)).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Specs running at the same time (`-p`).
    pub procs: usize,
    /// Whether `procs` is the default (no `-p`); the run's first lines say so.
    pub procs_is_default: bool,
    /// Timeout of a spec body unless the spec sets its own (`--timeout`).
    pub default_timeout: Duration,
    /// How many times the selection runs (`--repeat`).
    pub repeat: u32,
    /// Root folder of failed specs' artifacts (`--artifacts`).
    pub artifacts: PathBuf,
    /// Where to write the JUnit report (`--junit`).
    pub junit: Option<PathBuf>,
    /// Timeout of each cleanup registered with [`Ctx::defer`](crate::Ctx::defer).
    pub cleanup_timeout: Duration,
    /// The clean-up bound (`--cleanup-bound`): how long all of a spec's cleanups together may
    /// take after its body ended. Each cleanup gets its own timeout or what remains of the
    /// bound, whichever is less; once the bound is spent, each cleanup still left is started
    /// with [`CLEANUP_ALLOWANCE`](crate::CLEANUP_ALLOWANCE) (so that its delete requests still
    /// go out), and every cleanup cut short fails the spec as given up on. So a spec's cleanup
    /// phase ends within the bound plus the allowance per cleanup left when it ran out. The
    /// deferred checks are bounded apart from this: they run at the same time, so they end
    /// within the longest one's timeout (see [`Ctx::defer_check`](crate::Ctx::defer_check)).
    pub cleanup_bound: Duration,
    /// How long deleting a spec's namespace may take until it is gone.
    pub namespace_timeout: Duration,
    /// How long preflight may take.
    pub preflight_timeout: Duration,
    /// After a timeout or Ctrl-C the spec's token is cancelled; the body gets
    /// this long to return before it is aborted.
    pub cancel_grace: Duration,
    /// How long collecting a failed spec's artifacts may take.
    pub artifact_timeout: Duration,
    /// Where progress lines and the summary go.
    pub output: Output,
    /// The order's seed (`--seed`); a new one each run when `None`. The run prints it.
    pub seed: Option<u64>,
    /// Shuffle every spec, not only the top-level containers (`--randomize-all`).
    pub randomize_all: bool,
    /// After the first failure, start no new spec (`--fail-fast`); running ones finish.
    pub fail_fast: bool,
    /// Runs of a failing spec in all (`--flake-attempts`); one that passes on a retry is flaky.
    pub flake_attempts: u32,
    /// Where to write the report in ginkgo's JSON schema (`--json-report`).
    pub json_report: Option<PathBuf>,
    /// A spec still running after this long prints a progress report, and again every
    /// `poll_progress_interval` (`--poll-progress-after`); `None`: never.
    pub poll_progress_after: Option<Duration>,
    /// How often a slow spec's progress report repeats (`--poll-progress-interval`).
    pub poll_progress_interval: Duration,
    /// How much the run prints (`--succinct`, `-v`).
    pub verbosity: Verbosity,
    /// The running specs, for progress reports on demand (SIGUSR1) and the Ctrl-C messages.
    pub monitor: Monitor,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            procs: 1,
            procs_is_default: false,
            default_timeout: Duration::from_secs(600),
            repeat: 1,
            artifacts: PathBuf::from("target/e2e/artifacts"),
            junit: None,
            cleanup_timeout: Duration::from_secs(120),
            cleanup_bound: DEFAULT_CLEANUP_BOUND,
            namespace_timeout: Duration::from_secs(300),
            preflight_timeout: Duration::from_secs(15),
            cancel_grace: Duration::from_secs(10),
            artifact_timeout: Duration::from_secs(120),
            output: Output::stdout(),
            seed: None,
            randomize_all: false,
            fail_fast: false,
            flake_attempts: 1,
            json_report: None,
            poll_progress_after: None,
            poll_progress_interval: Duration::from_secs(10),
            verbosity: Verbosity::Normal,
            monitor: Monitor::default(),
        }
    }
}
