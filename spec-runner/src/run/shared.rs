//! What a run's specs share: values made once per run on first use ([`Ctx::run_shared`]) and
//! the clean-ups that remove what they created when the run ends ([`Ctx::defer_to_run_end`]).
//!
//! A run-end clean-up runs once no spec can run a body or a clean-up any more (in the last
//! attempt, when every slot is free again and no spec can be retried; else at the very end),
//! also after an interrupt, last registered first, each bounded by its own timeout. One that
//! fails or times out fails the run, with what it was. A run that is killed before them leaves
//! its objects labelled with its run id, and the next run's sweep removes them.
//!
//! [`Ctx::run_shared`]: crate::Ctx::run_shared
//! [`Ctx::defer_to_run_end`]: crate::Ctx::defer_to_run_end

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::future::BoxFuture;

use crate::duration;

/// One run-end clean-up.
struct RunEnd {
    what: String,
    timeout: Duration,
    run: BoxFuture<'static, anyhow::Result<()>>,
}

/// The values and run-end clean-ups of one run.
#[derive(Default)]
pub(crate) struct RunShared {
    values: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    ends: Mutex<Vec<RunEnd>>,
    /// What the clean-ups that ran so far reported.
    problems: Mutex<Vec<String>>,
}

impl std::fmt::Debug for RunShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("RunShared").field("run_end_cleanups", &ends).finish_non_exhaustive()
    }
}

impl RunShared {
    /// The run's value of type `T`, made with `T::default()` on first use.
    pub(crate) fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        let value = values.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(value).downcast::<T>() {
            Ok(value) => value,
            // The map is keyed by the type's id, so the entry is always a `T`.
            Err(_) => unreachable!("run-shared value of another type under {}", std::any::type_name::<T>()),
        }
    }

    /// Registers a clean-up for the end of the run.
    pub(crate) fn push(&self, what: String, timeout: Duration, run: BoxFuture<'static, anyhow::Result<()>>) {
        tracing::debug!(what = %what, "registered run-end clean-up");
        self.ends.lock().unwrap_or_else(PoisonError::into_inner).push(RunEnd { what, timeout, run });
    }

    /// Runs the clean-ups registered so far, last registered first, each within its timeout,
    /// and keeps what they report for [`RunShared::finish`]. The runner calls it as soon as no
    /// spec can run a body or a clean-up any more (its last deferred checks may still run).
    pub(crate) async fn run_ends(&self) {
        let problems = self.run_registered().await;
        self.problems.lock().unwrap_or_else(PoisonError::into_inner).extend(problems);
    }

    /// Runs what is still registered (after an interrupt, say) and returns one line per
    /// clean-up that failed or timed out, of all of them.
    pub(crate) async fn finish(&self) -> Vec<String> {
        self.run_ends().await;
        std::mem::take(&mut *self.problems.lock().unwrap_or_else(PoisonError::into_inner))
    }

    async fn run_registered(&self) -> Vec<String> {
        let ends = std::mem::take(&mut *self.ends.lock().unwrap_or_else(PoisonError::into_inner));
        let mut problems = Vec::new();
        for RunEnd { what, timeout, run } in ends.into_iter().rev() {
            tracing::info!(what = %what, "run-end clean-up");
            match tokio::time::timeout(timeout, run).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("run-end clean-up \"{what}\" failed: {e:#}")),
                Err(_) => problems.push(format!(
                    "run-end clean-up \"{what}\" did not finish within {}",
                    duration::display(timeout)
                )),
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counter(AtomicUsize);

    #[test]
    fn a_value_is_made_once_per_run() {
        let shared = RunShared::default();
        shared.get::<Counter>().0.fetch_add(1, Ordering::SeqCst);
        shared.get::<Counter>().0.fetch_add(1, Ordering::SeqCst);
        assert_eq!(shared.get::<Counter>().0.load(Ordering::SeqCst), 2);
        assert_eq!(RunShared::default().get::<Counter>().0.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn run_ends_run_last_first_and_report_failures_and_timeouts() {
        let shared = RunShared::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        for name in ["first", "second"] {
            let order = order.clone();
            shared.push(
                name.to_owned(),
                Duration::from_secs(5),
                Box::pin(async move {
                    order.lock().unwrap().push(name);
                    Ok(())
                }),
            );
        }
        shared.push("broken".to_owned(), Duration::from_secs(5), Box::pin(async { anyhow::bail!("no") }));
        shared.push("stuck".to_owned(), Duration::from_millis(10), Box::pin(std::future::pending()));
        shared.run_ends().await;
        let problems = shared.finish().await;
        assert_eq!(*order.lock().unwrap(), ["second", "first"]);
        assert_eq!(
            problems,
            [
                "run-end clean-up \"stuck\" did not finish within 10ms".to_owned(),
                "run-end clean-up \"broken\" failed: no".to_owned(),
            ]
        );
        assert!(shared.finish().await.is_empty(), "each clean-up runs once");
    }
}
