//! The end of a spec run: what its body's task ended with, stopping a body that was cancelled,
//! failed cleanups and deferred checks, the failure files of a failed spec, and the report of a
//! spec whose task failed.

use std::{path::Path, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    duration,
    report::outcome::{FailureKind, OUTCOME_TARGET, Outcome, SpecReport},
    run::artifacts,
    run::panic::panic_message,
    run::phases::Phases,
    spec::error::SpecError,
    spec::registry::SpecDef,
};

/// What running a spec produced, before its report is made.
pub(crate) struct Execution {
    pub(crate) outcome: Outcome,
    /// Problems while collecting artifacts.
    pub(crate) problems: Vec<String>,
    /// Whether the artifact folder was already emptied for this run.
    pub(crate) dir_ready: bool,
    /// Where the time went.
    pub(crate) phases: Phases,
}

/// The report of a spec whose runner task failed (it panicked outside the body's own task).
pub(crate) fn runner_failure(spec: &SpecDef, attempt: u32, error: &tokio::task::JoinError) -> SpecReport {
    SpecReport {
        full_text: spec.info.full_text().to_owned(),
        labels: spec.info.labels().to_vec(),
        index: spec.info.index(),
        attempt,
        outcome: Outcome::failed(
            FailureKind::Error,
            format!("the runner's task for this spec failed: {error}"),
        ),
        started: std::time::SystemTime::now(),
        duration: Duration::ZERO,
        log: String::new(),
        artifacts: None,
        tries: 1,
        earlier_failures: Vec::new(),
        phases: Default::default(),
        waits: Vec::new(),
        deferred: Vec::new(),
    }
}

/// `outcome` with failed cleanups or deferred checks added (a passed or skipped spec fails).
pub(crate) fn with_failures(outcome: Outcome, list: Vec<String>) -> Outcome {
    if list.is_empty() {
        return outcome;
    }
    match outcome {
        Outcome::Failed { kind, message, details } => Outcome::Failed {
            kind,
            message: format!("{message}; and {}", list.join("; ")),
            details: format!("{details}\n\n{}", list.join("\n")),
        },
        Outcome::Passed | Outcome::Skipped { .. } => Outcome::failed(FailureKind::Cleanup, list.join("; ")),
    }
}

/// A failed `outcome` with what disrupted the cluster while the spec ran (a restart, say: see
/// [`Disruptions`](crate::cluster::disruptions::Disruptions)); other outcomes stay.
pub(crate) fn with_disruptions(outcome: Outcome, during: Vec<String>) -> Outcome {
    match outcome {
        Outcome::Failed { kind, message, details } if !during.is_empty() => {
            let said = format!("while it ran, the cluster was disrupted: {}", during.join("; "));
            Outcome::Failed {
                kind,
                message: format!("{message}; {said}"),
                details: format!("{details}\n\n{said}"),
            }
        }
        other => other,
    }
}

/// What the body's task ended with.
pub(crate) fn body_outcome(joined: Result<Result<(), SpecError>, tokio::task::JoinError>) -> Outcome {
    match joined {
        Ok(Ok(())) => Outcome::Passed,
        Ok(Err(SpecError::Skipped(reason))) => {
            tracing::info!(target: OUTCOME_TARGET, "skipped: {reason}");
            Outcome::Skipped { reason }
        }
        Ok(Err(SpecError::Failed(e))) => {
            tracing::error!(target: OUTCOME_TARGET, "failed: {e:#}");
            Outcome::Failed { kind: FailureKind::Error, message: format!("{e:#}"), details: format!("{e:?}") }
        }
        Err(e) if e.is_panic() => {
            let message = format!("panicked: {}", panic_message(e.into_panic()));
            tracing::error!(target: OUTCOME_TARGET, "{message}");
            Outcome::failed(FailureKind::Panic, message)
        }
        Err(e) => Outcome::failed(FailureKind::Error, format!("the spec's task ended unexpectedly: {e}")),
    }
}

/// Cancels the spec's token, gives the body `grace` to return, then aborts it.
pub(crate) async fn stop_body(
    token: &CancellationToken,
    mut task: tokio::task::JoinHandle<Result<(), SpecError>>,
    grace: Duration,
) {
    token.cancel();
    if tokio::time::timeout(grace, &mut task).await.is_err() {
        tracing::warn!(
            "the spec body did not return within {} of being cancelled; aborting it",
            duration::display(grace)
        );
        task.abort();
        let _ = task.await;
    }
}

/// `failure.txt` and `spec.log` (written last, so they include the cleanups).
pub(crate) async fn write_failure_files(dir: &Path, run: &Execution, log: &str) {
    if !run.dir_ready
        && let Err(e) = artifacts::fresh_dir(dir).await
    {
        tracing::error!("cannot create the artifact folder {}: {e}", dir.display());
        return;
    }
    let mut failure = match &run.outcome {
        Outcome::Failed { kind, details, .. } => format!("{} failure:\n{details}\n", kind.as_str()),
        _ => String::new(),
    };
    if !run.problems.is_empty() {
        failure.push_str("\nproblems while collecting artifacts:\n");
        for p in &run.problems {
            failure.push_str(&format!("- {p}\n"));
        }
    }
    for (file, text) in [("failure.txt", failure.as_str()), ("spec.log", log)] {
        if let Err(e) = tokio::fs::write(dir.join(file), text).await {
            tracing::error!("cannot write {}: {e}", dir.join(file).display());
        }
    }
}
