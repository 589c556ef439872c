//! Deferred checks: what a spec waits for after its body and cleanups, once it no longer needs
//! its worker slot (namespaces and cluster-scoped objects going away, the kubelet wiping a
//! departed driver's ResourceSlices). They run after the slot is released, at the same time,
//! each bounded by its own timeout (so together by the longest one: the spec's clean-up bound
//! covers its cleanups, not these), and a failing one still fails its spec.
//!
//! Two kinds: a settling check waits for something a later spec could see (its namespace and
//! pods, cluster-scoped objects) and a `[Serial]` spec starts only once the settling checks of the
//! specs before it ended; an observation watches the cluster do something on its own (the kubelet
//! wiping a departed driver's slices after its 30 s grace) and holds nothing another spec needs,
//! so no spec waits for it.

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::{FutureExt as _, future::BoxFuture};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{
    duration,
    report::outcome::{CheckReport, OUTCOME_TARGET},
    run::monitor::{Phase, SpecState},
    run::panic::panic_message,
};

/// One registered deferred check.
struct Check {
    what: String,
    timeout: Duration,
    run: BoxFuture<'static, anyhow::Result<()>>,
    /// A settling check (a later serial spec waits for it), not an observation.
    settles: bool,
}

/// The deferred checks of one spec run.
#[derive(Default)]
pub(crate) struct DeferredChecks {
    checks: Mutex<Vec<Check>>,
}

impl DeferredChecks {
    /// Registers a settling check; it starts only once the spec's cleanups have run.
    pub(crate) fn push<F>(&self, what: String, timeout: Duration, check: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.push_kind(what, timeout, check, true);
    }

    /// Registers an observation: a check no later spec waits for.
    pub(crate) fn push_observation<F>(&self, what: String, timeout: Duration, check: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.push_kind(what, timeout, check, false);
    }

    fn push_kind<F>(&self, what: String, timeout: Duration, check: F, settles: bool)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        tracing::debug!(what = %what, settles, "registered deferred check");
        self.checks.lock().unwrap_or_else(PoisonError::into_inner).push(Check {
            what,
            timeout,
            run: check.boxed(),
            settles,
        });
    }

    /// Whether no check is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }

    /// Runs every registered check at the same time, each in its own task (so panics are
    /// caught) with its own timeout, and returns what each did, in registration order. A check
    /// registered while they run (by a task of the spec that outlived its body) runs after them.
    /// `settled` is cancelled once every settling check ended and none is left to run, while
    /// observations may still run (at the latest when this returns).
    pub(crate) async fn run_all(
        &self,
        state: Option<&Arc<SpecState>>,
        settled: Option<&CancellationToken>,
    ) -> Vec<CheckReport> {
        let mut reports = Vec::new();
        loop {
            let checks = std::mem::take(&mut *self.checks.lock().unwrap_or_else(PoisonError::into_inner));
            if checks.is_empty() {
                settled.inspect(|s| s.cancel());
                return reports;
            }
            if let Some(state) = state {
                let names: Vec<&str> = checks.iter().map(|c| c.what.as_str()).collect();
                state.set_phase(Phase::Deferred(names.join(", ")));
            }
            let mut settling = Vec::new();
            let mut observing = Vec::new();
            for (index, Check { what, timeout, run, settles }) in checks.into_iter().enumerate() {
                let span = tracing::info_span!("deferred", what = %what);
                let task = match state {
                    Some(state) => tokio::spawn(state.scope(run).instrument(span.clone())),
                    None => tokio::spawn(run.instrument(span.clone())),
                };
                let run = run_one(what, timeout, task, span)
                    .map(move |report| (index, CheckReport { settles, ..report }));
                if settles { settling.push(run) } else { observing.push(run) }
            }
            let settle = async {
                let done = futures::future::join_all(settling).await;
                // Settled unless a check registered a settling check meanwhile.
                let more =
                    self.checks.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|c| c.settles);
                if !more {
                    settled.inspect(|s| s.cancel());
                }
                done
            };
            let (mut done, observed) =
                futures::future::join(settle, futures::future::join_all(observing)).await;
            done.extend(observed);
            done.sort_by_key(|(index, _)| *index);
            reports.extend(done.into_iter().map(|(_, report)| report));
        }
    }
}

async fn run_one(
    what: String,
    timeout: Duration,
    mut task: tokio::task::JoinHandle<anyhow::Result<()>>,
    span: tracing::Span,
) -> CheckReport {
    let started = Instant::now();
    span.in_scope(|| tracing::info!("running deferred check"));
    let error = match tokio::time::timeout(timeout, &mut task).await {
        Ok(Ok(Ok(()))) => None,
        Ok(Ok(Err(e))) => Some(format!("{e:#}")),
        Ok(Err(join)) if join.is_panic() => Some(format!("panicked: {}", panic_message(join.into_panic()))),
        Ok(Err(join)) => Some(format!("its task was cancelled: {join}")),
        Err(_) => {
            task.abort();
            Some(format!("did not hold within {}", duration::display(timeout)))
        }
    };
    let took = started.elapsed();
    match &error {
        None => span.in_scope(|| tracing::info!(took = %duration::display(took), "deferred check held")),
        Some(error) => span.in_scope(|| {
            tracing::error!(target: OUTCOME_TARGET, error = %error, took = %duration::display(took), "deferred check failed");
        }),
    }
    CheckReport { what, duration: took, error, settles: true }
}

/// A spec's worker slot: held while the spec needs it (body, cleanups), released before its
/// deferred checks, taken again for a retry (`--flake-attempts`). A `[Serial]` spec's slot is
/// every permit of the semaphore, so it runs alone.
pub(crate) struct Slot {
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    permits: u32,
}

impl Slot {
    /// A slot holding `permit`, `permits` permits of `semaphore`.
    pub(crate) fn held(semaphore: Arc<Semaphore>, permit: OwnedSemaphorePermit, permits: u32) -> Self {
        Self { semaphore, permit: Some(permit), permits }
    }

    /// Lets the next spec start.
    pub(crate) fn release(&mut self) {
        self.permit = None;
    }

    /// Takes the slot again (if it was released); `false` when the semaphore was closed. The
    /// semaphore is fair: a serial spec waiting for every permit goes before later requests.
    pub(crate) async fn acquire(&mut self) -> bool {
        if self.permit.is_some() {
            return true;
        }
        match self.semaphore.clone().acquire_many_owned(self.permits).await {
            Ok(permit) => {
                self.permit = Some(permit);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn checks_run_at_the_same_time_and_report_each_outcome() {
        let checks = DeferredChecks::default();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (b1, b2) = (barrier.clone(), barrier.clone());
        checks.push("a".into(), Duration::from_secs(5), async move {
            b1.wait().await;
            Ok(())
        });
        checks.push("b".into(), Duration::from_secs(5), async move {
            b2.wait().await;
            Err(anyhow::anyhow!("still there"))
        });
        checks.push("hangs".into(), Duration::from_millis(50), std::future::pending());
        checks.push("panics".into(), Duration::from_secs(5), async { panic!("boom") });
        let got = checks.run_all(None, None).await;
        let got: Vec<_> = got.iter().map(|c| (c.what.as_str(), c.error.as_deref())).collect();
        assert_eq!(
            got,
            [
                ("a", None),
                ("b", Some("still there")),
                ("hangs", Some("did not hold within 50ms")),
                ("panics", Some("panicked: boom")),
            ]
        );
        assert!(checks.is_empty(), "each check runs once");
    }

    #[tokio::test]
    async fn a_check_registered_while_checks_run_runs_too() {
        let checks = Arc::new(DeferredChecks::default());
        let late = checks.clone();
        checks.push("first".into(), Duration::from_secs(5), async move {
            late.push("late".into(), Duration::from_secs(5), async { Err(anyhow::anyhow!("still there")) });
            Ok(())
        });
        let got = checks.run_all(None, None).await;
        let got: Vec<_> = got.iter().map(|c| (c.what.as_str(), c.error.as_deref())).collect();
        assert_eq!(got, [("first", None), ("late", Some("still there"))]);
    }

    #[tokio::test(start_paused = true)]
    async fn hanging_checks_end_within_the_longest_timeout() {
        let checks = DeferredChecks::default();
        for secs in [30, 300, 60] {
            checks.push(format!("hangs {secs}s"), Duration::from_secs(secs), std::future::pending());
        }
        let started = Instant::now();
        let got = checks.run_all(None, None).await;
        assert_eq!(started.elapsed(), Duration::from_secs(300));
        let errors: Vec<_> = got.iter().map(|c| c.error.as_deref().unwrap_or_default()).collect();
        assert_eq!(errors, ["did not hold within 30s", "did not hold within 5m", "did not hold within 1m"]);
    }
}
