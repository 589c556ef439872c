//! Results: what happened to each spec run, and to the whole run.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use crate::{duration, run::phases::Phases, spec::info::SpecInfo};

/// Target of the runner's per-spec outcome messages: in spec logs, but off
/// on the console by default (the progress lines already say it).
pub const OUTCOME_TARGET: &str = "dra_e2e::outcome";

/// How a spec failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The body returned an error.
    Error,
    /// The body panicked.
    Panic,
    /// The body did not finish within its timeout.
    Timeout,
    /// The run was interrupted (Ctrl-C) while the spec ran.
    Interrupted,
    /// The runner could not set the spec up (its namespace).
    Setup,
    /// The body passed (or skipped) but a cleanup or a deferred check failed.
    Cleanup,
}

impl FailureKind {
    /// `error`, `panic`, `timeout`, `interrupted`, `setup` or `cleanup` (the JUnit failure type).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Panic => "panic",
            Self::Timeout => "timeout",
            Self::Interrupted => "interrupted",
            Self::Setup => "setup",
            Self::Cleanup => "cleanup",
        }
    }
}

/// The outcome of one spec run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed, and every cleanup succeeded.
    Passed,
    /// Skipped, with the reason (requirements the cluster lacks, or not run).
    Skipped {
        /// Why.
        reason: String,
    },
    /// Failed.
    Failed {
        /// How.
        kind: FailureKind,
        /// One line: the error with its causes, and failed cleanups.
        message: String,
        /// Full text: the error with one line per cause, every failed cleanup.
        details: String,
    },
}

impl Outcome {
    /// Whether this counts as a failure.
    pub fn is_failed(&self) -> bool {
        matches!(self, Self::Failed { .. })
    }

    pub(crate) fn failed(kind: FailureKind, message: impl Into<String>) -> Self {
        let message = message.into();
        Self::Failed { kind, details: message.clone(), message }
    }
}

/// One run of one spec.
#[derive(Debug, Clone)]
pub struct SpecReport {
    /// The spec's full text.
    pub full_text: String,
    /// The spec's labels.
    pub labels: Vec<String>,
    /// Registration index.
    pub index: usize,
    /// 1-based attempt (`--repeat`).
    pub attempt: u32,
    /// What happened.
    pub outcome: Outcome,
    /// When it started (the Unix epoch for a spec that never started).
    pub started: SystemTime,
    /// From start to the end of the last cleanup (while it held its worker slot).
    pub duration: Duration,
    /// The captured log.
    pub log: String,
    /// The artifact folder, for failed specs.
    pub artifacts: Option<PathBuf>,
    /// How often it ran in this attempt (`--flake-attempts`); 0 when it never started.
    pub tries: u32,
    /// The failures of the tries before the last, one line each (with their artifact folder).
    pub earlier_failures: Vec<String>,
    /// Where the last try's time went (empty for a spec that never started or was skipped
    /// before its namespace existed).
    pub phases: Phases,
    /// What the last try waited for at least a second in all (the waits progress reports name,
    /// [`waiting`](crate::waiting)), longest first.
    pub waits: Vec<(String, Duration)>,
    /// The deferred checks of the last try (run after its worker slot was released; not part
    /// of `duration`), in registration order.
    pub deferred: Vec<CheckReport>,
}

/// What one deferred check (see [`Ctx::defer_check`](crate::Ctx::defer_check)) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// What it checks, as registered (`namespace x to be gone`).
    pub what: String,
    /// How long it ran.
    pub duration: Duration,
    /// Why it failed; `None` when it held.
    pub error: Option<String>,
    /// A settling check (a later `[Serial]` spec waited for it), not an observation.
    pub settles: bool,
}

impl CheckReport {
    /// `deferred check "what" failed after 1.2s: error`, or `None` when it held.
    pub fn failure(&self) -> Option<String> {
        self.error.as_ref().map(|e| {
            format!("deferred check {:?} failed after {}: {e}", self.what, duration::display(self.duration))
        })
    }
}

impl SpecReport {
    /// A spec that did not start in this attempt, reported as skipped for `reason` (the run
    /// was interrupted, `--fail-fast`, another shard's spec).
    pub(crate) fn never_started(info: &SpecInfo, attempt: u32, reason: &str) -> Self {
        Self {
            full_text: info.full_text().to_owned(),
            labels: info.labels().to_vec(),
            index: info.index(),
            attempt,
            outcome: Outcome::Skipped { reason: reason.to_owned() },
            started: SystemTime::UNIX_EPOCH,
            duration: Duration::ZERO,
            log: String::new(),
            artifacts: None,
            tries: 0,
            earlier_failures: Vec::new(),
            phases: Phases::default(),
            waits: Vec::new(),
            deferred: Vec::new(),
        }
    }

    /// Passed, but only on a retry.
    pub fn is_flaky(&self) -> bool {
        self.outcome == Outcome::Passed && self.tries > 1
    }
}

/// The whole run.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    /// Every spec run, ordered by attempt, then registration order.
    pub specs: Vec<SpecReport>,
    /// Whether the run was interrupted (Ctrl-C).
    pub interrupted: bool,
    /// Wall time of the whole run.
    pub wall_time: Duration,
    /// A usage, configuration or cluster problem that stopped the run (exit code 2).
    pub error: Option<String>,
    /// How many times the selection ran (`--repeat`).
    pub repeat: u32,
    /// The seed of the specs' order (`--seed`).
    pub seed: u64,
    /// When the run started.
    pub started: Option<SystemTime>,
    /// The wall time of each round (`--repeat`), in order, deferred checks included.
    pub round_times: Vec<Duration>,
}

impl RunReport {
    /// Spec runs that passed.
    pub fn passed(&self) -> usize {
        self.specs.iter().filter(|s| s.outcome == Outcome::Passed).count()
    }

    /// Spec runs that failed.
    pub fn failed(&self) -> usize {
        self.specs.iter().filter(|s| s.outcome.is_failed()).count()
    }

    /// Spec runs that passed on a retry (counted as passed too).
    pub fn flaky(&self) -> usize {
        self.specs.iter().filter(|s| s.is_flaky()).count()
    }

    /// Every spec run's phases added up.
    pub fn phase_sums(&self) -> Phases {
        let mut sum = Phases::default();
        for s in &self.specs {
            sum.add(&s.phases);
        }
        sum
    }

    /// Spec runs that were skipped.
    pub fn skipped(&self) -> usize {
        self.specs.iter().filter(|s| matches!(s.outcome, Outcome::Skipped { .. })).count()
    }

    /// `N passed, N failed, N skipped in 12.3s`.
    pub fn summary_line(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped in {}",
            self.passed(),
            self.failed(),
            self.skipped(),
            duration::display(self.wall_time)
        )
    }

    /// 0 when nothing failed, 1 when a spec failed, 2 for usage, configuration
    /// or cluster problems, 130 when interrupted (128 + SIGINT; after SIGTERM too: the one
    /// code for "interrupted", see the runner's `run`).
    pub fn exit_code(&self) -> u8 {
        if self.error.is_some() {
            2
        } else if self.interrupted {
            130
        } else if self.failed() > 0 {
            1
        } else {
            0
        }
    }
}
