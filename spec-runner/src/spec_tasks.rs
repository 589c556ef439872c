//! The spec tasks of one attempt: each spec runs in its own task, so a panic in it becomes that
//! spec's failure instead of taking the runner down.

use std::{collections::HashMap, future::Future, sync::Arc};

use tokio::task::JoinSet;

use super::{outcome::SpecReport, registry::SpecDef, spec_end::runner_failure};

/// The spec tasks of one attempt (each in its own task, so nothing in a spec can take the
/// runner down) and the reports of those that ended.
pub(crate) struct SpecTasks {
    attempt: u32,
    set: JoinSet<SpecReport>,
    specs: HashMap<tokio::task::Id, Arc<SpecDef>>,
    /// The reports of the specs that ended.
    pub(crate) reports: Vec<SpecReport>,
}

impl SpecTasks {
    /// No tasks yet, for `attempt` (of `--repeat`).
    pub(crate) fn new(attempt: u32) -> Self {
        Self { attempt, set: JoinSet::new(), specs: HashMap::new(), reports: Vec::new() }
    }

    /// Starts `run`, the life of `spec` in this attempt.
    pub(crate) fn spawn(
        &mut self,
        spec: &Arc<SpecDef>,
        run: impl Future<Output = SpecReport> + Send + 'static,
    ) {
        let handle = self.set.spawn(run);
        self.specs.insert(handle.id(), spec.clone());
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
