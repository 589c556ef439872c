//! The cleanup stack of a spec: cleanups run in reverse order of registration, after the
//! "first" cleanups (what must stop before anything is torn down, such as injected faults),
//! which run in registration order.

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::{FutureExt as _, future::BoxFuture};
use tracing::Instrument as _;

use super::monitor::{Phase, SpecState};

/// One registered cleanup.
struct Cleanup {
    what: String,
    timeout: Duration,
    run: BoxFuture<'static, anyhow::Result<()>>,
}

/// A cleanup that failed, panicked or timed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupFailure {
    /// What the cleanup does, as registered (`delete DeviceClass x`).
    pub what: String,
    /// Why it failed.
    pub error: String,
}

impl std::fmt::Display for CleanupFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cleanup {:?} failed: {}", self.what, self.error)
    }
}

/// Cleanups of one spec.
#[derive(Default)]
pub(crate) struct CleanupStack {
    entries: Mutex<Vec<Cleanup>>,
    /// Run before `entries`, first registered first.
    first: Mutex<std::collections::VecDeque<Cleanup>>,
    /// Run after every cleanup, once the spec's worker slot is released.
    pub(crate) checks: super::deferred::DeferredChecks,
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

    /// Runs every cleanup, the "first" ones in registration order, then the
    /// others last registered first, each in its own task (so
    /// panics are caught) with its own timeout. Cleanups registered while
    /// this runs run too. Returns the failures; all cleanups run regardless.
    #[cfg(test)]
    pub(crate) async fn run_all(&self) -> Vec<CleanupFailure> {
        self.run_all_watched(None).await
    }

    /// [`CleanupStack::run_all`], telling `state` which cleanup runs (each in its scope).
    pub(crate) async fn run_all_watched(&self, state: Option<&Arc<SpecState>>) -> Vec<CleanupFailure> {
        let mut failures = Vec::new();
        loop {
            let Some(cleanup) = self.next() else { break };
            let Cleanup { what, timeout, run } = cleanup;
            let span = tracing::info_span!("cleanup", what = %what);
            span.in_scope(|| tracing::info!("running cleanup"));
            let mut task = match state {
                Some(state) => {
                    state.set_phase(Phase::Cleanup(what.clone()));
                    tokio::spawn(state.scope(run).instrument(span.clone()))
                }
                None => tokio::spawn(run.instrument(span.clone())),
            };
            let error = match tokio::time::timeout(timeout, &mut task).await {
                Ok(Ok(Ok(()))) => None,
                Ok(Ok(Err(e))) => Some(format!("{e:#}")),
                Ok(Err(join)) if join.is_panic() => {
                    Some(format!("panicked: {}", panic_message(join.into_panic())))
                }
                Ok(Err(join)) => Some(format!("its task was cancelled: {join}")),
                Err(_) => {
                    task.abort();
                    Some(format!("did not finish within {}", super::duration::display(timeout)))
                }
            };
            match error {
                None => span.in_scope(|| tracing::info!("cleanup done")),
                Some(error) => {
                    span.in_scope(|| tracing::error!(target: super::outcome::OUTCOME_TARGET, error = %error, "cleanup failed"));
                    failures.push(CleanupFailure { what, error });
                }
            }
        }
        failures
    }
}

/// The message of a panic payload (`&str` or `String`, as `panic!` makes them).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_owned(),
            Err(_) => "a panic with a non-string payload".to_owned(),
        },
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
}
