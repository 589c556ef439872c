//! The run: scheduling and one spec's life (the runner, its tasks and their end), the clean-ups and
//! deferred checks, what the specs of a run share, artifacts, captured logs, phases, the order of
//! specs, what each is doing now, and what a suite does after the run.

pub(crate) mod after_run;
pub(crate) mod artifacts;
pub(crate) mod capture;
pub(crate) mod cleanup;
pub(crate) mod deferred;
pub(crate) mod monitor;
pub(crate) mod options;
pub(crate) mod order;
pub(crate) mod panic;
pub(crate) mod phases;
pub(crate) mod runner;
pub(crate) mod shared;
pub(crate) mod spec_end;
pub(crate) mod spec_tasks;
