//! The spec tasks of one attempt: each spec runs in its own task, so a panic in it becomes that
//! spec's failure instead of taking the runner down.

use std::{collections::HashMap, future::Future, sync::Arc};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{report::outcome::SpecReport, run::spec_end::runner_failure, spec::registry::SpecDef};

/// The spec tasks of one attempt (each in its own task, so nothing in a spec can take the
/// runner down) and the reports of those that ended.
pub(crate) struct SpecTasks {
    attempt: u32,
    set: JoinSet<SpecReport>,
    specs: HashMap<tokio::task::Id, Arc<SpecDef>>,
    /// Per started spec, cancelled once it settled (body, cleanups, settling checks).
    settled: Vec<CancellationToken>,
    /// The reports of the specs that ended.
    pub(crate) reports: Vec<SpecReport>,
}

impl SpecTasks {
    /// No tasks yet, for `attempt` (of `--repeat`).
    pub(crate) fn new(attempt: u32) -> Self {
        Self { attempt, set: JoinSet::new(), specs: HashMap::new(), settled: Vec::new(), reports: Vec::new() }
    }

    /// Starts `run`, the life of `spec` in this attempt, which cancels `settled` once the spec
    /// settled (at the latest when it ends).
    pub(crate) fn spawn(
        &mut self,
        spec: &Arc<SpecDef>,
        settled: CancellationToken,
        run: impl Future<Output = SpecReport> + Send + 'static,
    ) {
        // Settled also when the task ends without saying so (a panic).
        let guard = settled.clone();
        let handle = self.set.spawn(async move {
            let _guard = guard.drop_guard();
            run.await
        });
        self.specs.insert(handle.id(), spec.clone());
        self.settled.push(settled);
    }

    /// Waits until every started spec has settled: its body, cleanups and settling deferred
    /// checks ended (its observations may still run).
    pub(crate) async fn settle(&mut self) {
        for settled in self.settled.drain(..) {
            settled.cancelled().await;
        }
    }

    /// Waits until every started spec has ended, its deferred checks included.
    pub(crate) async fn finish(&mut self) {
        while let Some(joined) = self.set.join_next_with_id().await {
            match joined {
                Ok((_, report)) => self.reports.push(report),
                Err(e) => {
                    if let Some(spec) = self.specs.get(&e.id()) {
                        self.reports.push(runner_failure(spec, self.attempt, &e));
                    }
                }
            }
        }
    }
}
