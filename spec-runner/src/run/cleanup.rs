//! The cleanup stack of a spec: cleanups run in reverse order of registration, after the
//! "first" cleanups (what must stop before anything is torn down, such as injected faults),
//! which run in registration order. All of them together are bounded by the spec's clean-up
//! bound ([`RunOptions::cleanup_bound`](crate::RunOptions::cleanup_bound)).

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::{FutureExt as _, future::BoxFuture};
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::{
    duration,
    run::{
        monitor::{PendingCleanups, Phase, SpecState},
        panic::panic_message,
    },
};

/// How long each cleanup still left once a spec's clean-up bound is spent may run (its own
/// timeout if that is shorter): long enough for its requests to go out (a delete takes
/// milliseconds), so that nothing leaks, but not for waiting until things are gone.
pub const CLEANUP_ALLOWANCE: Duration = Duration::from_secs(5);

/// One registered cleanup.
struct Cleanup {
    what: String,
    timeout: Duration,
    run: BoxFuture<'static, anyhow::Result<()>>,
}

/// A cleanup that failed, panicked, timed out or was cut short by the clean-up bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupFailure {
    /// What the cleanup does, as registered (`delete DeviceClass x`).
    pub what: String,
    /// Why it failed.
    pub error: String,
    /// The spec's clean-up bound, when that (not the cleanup's own timeout) cut it short: the
    /// run gave up on it.
    pub gave_up_after: Option<Duration>,
}

impl std::fmt::Display for CleanupFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gave_up_after {
            Some(bound) => write!(
                f,
                "gave up on cleanup {:?} after the {} clean-up bound: {}",
                self.what,
                duration::display(bound),
                self.error
            ),
            None => write!(f, "cleanup {:?} failed: {}", self.what, self.error),
        }
    }
}

/// The failures of a spec's cleanups as the lines of its failure: each failed cleanup, then the
/// cleanups the clean-up bound made the run give up on, together in one line.
pub(crate) fn failure_lines(failures: &[CleanupFailure]) -> Vec<String> {
    let (gave_up, failed): (Vec<&CleanupFailure>, Vec<&CleanupFailure>) =
        failures.iter().partition(|f| f.gave_up_after.is_some());
    let mut lines: Vec<String> = failed.iter().map(ToString::to_string).collect();
    match gave_up.as_slice() {
        [] => {}
        [one] => lines.push(one.to_string()),
        many => {
            let bound = many.iter().find_map(|f| f.gave_up_after).unwrap_or_default();
            let why: Vec<String> = many.iter().map(|f| format!("{:?} {}", f.what, f.error)).collect();
            lines.push(format!(
                "gave up on {} cleanups after the {} clean-up bound: {}",
                many.len(),
                duration::display(bound),
                why.join("; ")
            ));
        }
    }
    lines
}

/// How long a cleanup with its own `timeout` may run when `left` of the clean-up bound remains,
/// and what to say when that limit, shorter than its timeout, ends it.
fn limit(timeout: Duration, left: Duration) -> (Duration, Option<String>) {
    let limit = timeout.min(left.max(CLEANUP_ALLOWANCE));
    if limit >= timeout {
        return (limit, None);
    }
    let why = if left > CLEANUP_ALLOWANCE {
        format!("did not finish within the {} left of the bound", duration::display(limit))
    } else {
        format!(
            "did not finish within the {} each cleanup gets once the bound is spent",
            duration::display(limit)
        )
    };
    (limit, Some(why))
}

/// Cleanups of one spec.
#[derive(Default)]
pub(crate) struct CleanupStack {
    entries: Mutex<Vec<Cleanup>>,
    /// Run before `entries`, first registered first.
    first: Mutex<std::collections::VecDeque<Cleanup>>,
    /// Run after every cleanup, once the spec's worker slot is released.
    pub(crate) checks: crate::run::deferred::DeferredChecks,
}

impl CleanupStack {
    pub(crate) fn push<F>(&self, what: String, timeout: Duration, cleanup: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        tracing::debug!(what = %what, "registered cleanup");
        self.lock().push(Cleanup { what, timeout, run: cleanup.boxed() });
    }

    /// Registers a cleanup that runs before every cleanup of [`CleanupStack::push`].
    pub(crate) fn push_first<F>(&self, what: String, timeout: Duration, cleanup: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        tracing::debug!(what = %what, "registered first cleanup");
        self.first.lock().unwrap_or_else(PoisonError::into_inner).push_back(Cleanup {
            what,
            timeout,
            run: cleanup.boxed(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Cleanup>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next cleanup to run: the oldest "first" one, else the newest of the stack.
    fn next(&self) -> Option<Cleanup> {
        let first = self.first.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
        first.or_else(|| self.lock().pop())
    }

    /// What is registered and has not run yet, in the order it will run.
    pub(crate) fn pending(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|c| c.what.clone())
            .collect();
        names.extend(self.lock().iter().rev().map(|c| c.what.clone()));
        names
    }

    /// [`CleanupStack::run_all_watched`] with a bound that no test reaches.
    #[cfg(test)]
    pub(crate) async fn run_all(&self) -> Vec<CleanupFailure> {
        self.run_all_watched(None, Duration::from_secs(3600)).await
    }

    /// Runs every cleanup, the "first" ones in registration order, then the others last
    /// registered first, each in its own task (so panics are caught, and `state` knows which
    /// cleanup runs). Each gets its own timeout or what is left of `bound`, whichever is less;
    /// once `bound` is spent each cleanup left still starts, with [`CLEANUP_ALLOWANCE`], so
    /// that its requests go out. Cleanups registered while this runs run too. Returns the
    /// failures, those cut short by `bound` marked as given up on; all cleanups run regardless.
    pub(crate) async fn run_all_watched(
        &self,
        state: Option<&Arc<SpecState>>,
        bound: Duration,
    ) -> Vec<CleanupFailure> {
        let mut failures = Vec::new();
        let deadline = Instant::now().checked_add(bound);
        let mut spent_said = false;
        loop {
            let Some(cleanup) = self.next() else { break };
            let Cleanup { what, timeout, run } = cleanup;
            let left = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
            let (timeout, cut_short) = limit(timeout, left);
            if left <= CLEANUP_ALLOWANCE && !spent_said {
                spent_said = true;
                tracing::warn!(
                    target: crate::report::outcome::OUTCOME_TARGET,
                    "the {} clean-up bound is spent: each cleanup left gets {}",
                    duration::display(bound),
                    duration::display(CLEANUP_ALLOWANCE)
                );
            }
            let span = tracing::info_span!("cleanup", what = %what);
            span.in_scope(|| tracing::info!(timeout = %duration::display(timeout), "running cleanup"));
            let mut task = match state {
                Some(state) => {
                    state.set_phase(Phase::Cleanup(what.clone()));
                    tokio::spawn(state.scope(run).instrument(span.clone()))
                }
                None => tokio::spawn(run.instrument(span.clone())),
            };
            let (error, gave_up_after) = match tokio::time::timeout(timeout, &mut task).await {
                Ok(Ok(Ok(()))) => (None, None),
                Ok(Ok(Err(e))) => (Some(format!("{e:#}")), None),
                Ok(Err(join)) if join.is_panic() => {
                    (Some(format!("panicked: {}", panic_message(join.into_panic()))), None)
                }
                Ok(Err(join)) => (Some(format!("its task was cancelled: {join}")), None),
                Err(_) => {
                    task.abort();
                    match cut_short {
                        Some(why) => (Some(why), Some(bound)),
                        None => (Some(format!("did not finish within {}", duration::display(timeout))), None),
                    }
                }
            };
            match error {
                None => span.in_scope(|| tracing::info!("cleanup done")),
                Some(error) => {
                    let failure = CleanupFailure { what, error, gave_up_after };
                    span.in_scope(
                        || tracing::error!(target: crate::report::outcome::OUTCOME_TARGET, "{failure}"),
                    );
                    failures.push(failure);
                }
            }
        }
        failures
    }
}

impl PendingCleanups for CleanupStack {
    fn pending(&self) -> Vec<String> {
        CleanupStack::pending(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    type Log = Arc<Mutex<Vec<&'static str>>>;

    /// A shared log, and a maker of cleanups that append their name to it.
    fn recorder() -> (Log, impl Fn(&'static str) -> BoxFuture<'static, anyhow::Result<()>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        (log, move |name| {
            let l = l.clone();
            async move {
                l.lock().unwrap().push(name);
                Ok(())
            }
            .boxed()
        })
    }

    const LONG: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn runs_in_reverse_order() {
        let (log, rec) = recorder();
        let stack = CleanupStack::default();
        stack.push("namespace".into(), LONG, rec("namespace"));
        stack.push("device class".into(), LONG, rec("device class"));
        stack.push("driver".into(), LONG, rec("driver"));
        assert!(stack.run_all().await.is_empty());
        assert_eq!(*log.lock().unwrap(), ["driver", "device class", "namespace"]);
        assert!(stack.run_all().await.is_empty(), "each cleanup runs once");
        assert_eq!(log.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn first_cleanups_run_before_the_stack_in_registration_order() {
        let (log, rec) = recorder();
        let stack = CleanupStack::default();
        stack.push("namespace".into(), LONG, rec("namespace"));
        stack.push_first("clear faults".into(), LONG, rec("clear faults"));
        stack.push("pod".into(), LONG, rec("pod"));
        stack.push_first("release blocks".into(), LONG, rec("release blocks"));
        assert!(stack.run_all().await.is_empty());
        assert_eq!(*log.lock().unwrap(), ["clear faults", "release blocks", "pod", "namespace"]);
    }

    #[tokio::test]
    async fn failures_panics_and_timeouts_are_reported_and_the_rest_still_runs() {
        let (log, rec) = recorder();
        let stack = CleanupStack::default();
        stack.push("first".into(), LONG, rec("first"));
        stack.push("hangs".into(), Duration::from_millis(50), std::future::pending());
        stack.push("panics".into(), LONG, async { panic!("cleanup exploded") });
        stack.push("fails".into(), LONG, async { Err(anyhow::anyhow!("api said no")) });
        stack.push("last".into(), LONG, rec("last"));
        let failures = stack.run_all().await;
        assert_eq!(*log.lock().unwrap(), ["last", "first"]);
        let got: Vec<_> = failures.iter().map(|f| (f.what.as_str(), f.error.as_str())).collect();
        assert_eq!(
            got,
            [
                ("fails", "api said no"),
                ("panics", "panicked: cleanup exploded"),
                ("hangs", "did not finish within 50ms"),
            ]
        );
    }

    #[test]
    fn pending_lists_the_first_cleanups_in_order_then_the_others_last_registered_first() {
        let stack = CleanupStack::default();
        stack.push("delete namespace ns".into(), Duration::from_secs(1), async { Ok(()) });
        stack.push_first("clear faults a".into(), Duration::from_secs(1), async { Ok(()) });
        stack.push("delete DeviceClass c".into(), Duration::from_secs(1), async { Ok(()) });
        stack.push_first("clear faults b".into(), Duration::from_secs(1), async { Ok(()) });
        assert_eq!(
            PendingCleanups::pending(&stack),
            ["clear faults a", "clear faults b", "delete DeviceClass c", "delete namespace ns"]
        );
    }

    #[tokio::test]
    async fn cleanups_registered_during_cleanup_run_too() {
        let (log, rec) = recorder();
        let stack = Arc::new(CleanupStack::default());
        let s = stack.clone();
        let late = rec("late");
        stack.push("registers another".into(), LONG, async move {
            s.push("late".into(), LONG, late);
            Ok(())
        });
        assert!(stack.run_all().await.is_empty());
        assert_eq!(*log.lock().unwrap(), ["late"]);
    }

    const TWO_MINUTES: Duration = Duration::from_secs(120);

    #[tokio::test(start_paused = true)]
    async fn hanging_cleanups_end_within_the_bound_and_the_later_ones_still_run() {
        let (log, rec) = recorder();
        let stack = CleanupStack::default();
        // Registered first, so it runs last, after the bound is spent.
        stack.push("delete namespace x".into(), TWO_MINUTES, rec("delete namespace x"));
        stack.push("hangs 3".into(), TWO_MINUTES, std::future::pending());
        stack.push("hangs 2".into(), TWO_MINUTES, std::future::pending());
        stack.push("quick".into(), TWO_MINUTES, rec("quick"));
        stack.push("hangs 1".into(), TWO_MINUTES, std::future::pending());
        let bound = Duration::from_secs(180);
        let started = Instant::now();
        let failures = stack.run_all_watched(None, bound).await;
        let took = started.elapsed();
        // 2m (its own timeout), 1m (what was left), then the 5s allowance; "quick" and the
        // namespace deletion still ran, the latter within its allowance.
        assert_eq!(took, Duration::from_secs(185), "{failures:?}");
        assert!(took <= bound + 2 * CLEANUP_ALLOWANCE);
        assert_eq!(*log.lock().unwrap(), ["quick", "delete namespace x"]);
        let got: Vec<_> =
            failures.iter().map(|f| (f.what.as_str(), f.error.as_str(), f.gave_up_after)).collect();
        assert_eq!(
            got,
            [
                ("hangs 1", "did not finish within 2m", None),
                ("hangs 2", "did not finish within the 1m left of the bound", Some(bound)),
                (
                    "hangs 3",
                    "did not finish within the 5s each cleanup gets once the bound is spent",
                    Some(bound)
                ),
            ]
        );
        assert_eq!(
            failure_lines(&failures),
            [
                "cleanup \"hangs 1\" failed: did not finish within 2m",
                "gave up on 2 cleanups after the 3m clean-up bound: \"hangs 2\" did \
                 not finish within the 1m left of the bound; \"hangs 3\" did not finish within the 5s each \
                 cleanup gets once the bound is spent",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cleanup_with_a_shorter_timeout_than_the_allowance_keeps_it() {
        let stack = CleanupStack::default();
        stack.push("short".into(), Duration::from_secs(1), std::future::pending());
        stack.push("hangs".into(), TWO_MINUTES, std::future::pending());
        let failures = stack.run_all_watched(None, Duration::from_secs(10)).await;
        let got: Vec<_> = failures.iter().map(|f| (f.what.as_str(), f.gave_up_after.is_some())).collect();
        assert_eq!(got, [("hangs", true), ("short", false)]);
        assert_eq!(failures[1].error, "did not finish within 1s");
        assert_eq!(
            failure_lines(&failures[..1]),
            [
                "gave up on cleanup \"hangs\" after the 10s clean-up bound: did not finish within the 10s left of the bound"
            ]
        );
    }
}
