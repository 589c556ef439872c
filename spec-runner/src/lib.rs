//! The spec runner of dra-e2e: a ginkgo-like registry of specs, selection by regex and
//! label expressions, a parallel runner with per-spec namespaces, timeouts,
//! cleanups, captured logs, artifacts of failed specs and a JUnit report.
//!
//! It knows Kubernetes (namespaces, pods, events, nodes) but no API group of its own: what a
//! suite needs from the cluster it declares ([`Registry::require_api`]), and what it wants in a
//! failed spec's artifacts it registers ([`Registry::before_each`], [`Ctx::artifact_source`]).
//! So it runs any kube-rs e2e suite; dra-e2e's DRA knowledge lives in `harness` and `suites`.
//!
//! # Writing specs
//!
//! Specs are registered explicitly. Containers nest like ginkgo's
//! `Describe`/`Context`; a spec's full text is the container texts, its name
//! and a `[label]` for each label, where it was declared:
//! `[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] registers plugin`.
//! `--focus`/`--skip` match that text; `--label-filter` matches the labels
//! (inherited from containers).
//!
//! ```
//! use std::time::Duration;
//! use spec_runner::{Ctx, Registry, Skip, SpecResult};
//!
//! pub fn register(reg: &mut Registry) {
//!     reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
//!         r.context("control plane", |r| {
//!             r.it("supports claim and class parameters", async |ctx: Ctx| {
//!                 ctx.cluster().require_nodes(1)?;
//!                 // ... create objects; `?` works on kube::Error, anyhow::Error, ...
//!                 Ok(())
//!             })
//!             .labels(["ConformanceCandidate"]);
//!         });
//!         r.it("needs two nodes", async |ctx| {
//!             if ctx.cluster().ready_nodes().count() < 2 {
//!                 return Err(Skip::because("needs 2 nodes, cluster has 1"));
//!             }
//!             Ok(())
//!         })
//!         .labels(["Slow"])
//!         .timeout(Duration::from_secs(300));
//!     });
//! }
//! # let mut reg = Registry::new();
//! # register(&mut reg);
//! # assert_eq!(reg.len(), 2);
//! ```
//!
//! Each spec gets a [`Ctx`]: an admin `kube::Client`, its own namespace
//! (privileged pod security), a unique suffix for cluster-scoped names, the
//! cluster facts from preflight ([`Ctx::cluster`]), a cancellation token
//! (timeout, Ctrl-C) and a cleanup stack. Whoever creates a cluster-scoped
//! object registers its deletion right after creating it:
//!
//! ```no_run
//! # async fn body(ctx: spec_runner::Ctx) -> spec_runner::SpecResult {
//! # let (api, class): (kube::Api<k8s_openapi::api::core::v1::Namespace>, k8s_openapi::api::core::v1::Namespace) = todo!();
//! let created = api.create(&Default::default(), &class).await?;
//! ctx.delete_at_cleanup(api.clone(), created.metadata.name.unwrap_or_default());
//! // or anything else, as a future:
//! ctx.defer("tell the driver to stop", async move { Ok(()) });
//! # Ok(()) }
//! ```
//!
//! Cleanups run after the body, last registered first, also when the body
//! fails, panics, times out or the run is interrupted; each has a timeout, all
//! of them together the clean-up bound (`--cleanup-bound`, default
//! [`DEFAULT_CLEANUP_BOUND`]; once it is spent, each cleanup left still gets
//! [`CLEANUP_ALLOWANCE`] so that its requests go out), and a failing cleanup, or one the
//! bound cut short, fails the spec. The namespace deletion is registered first, so it runs
//! last; the wait until the namespace is gone is a deferred check ([`Ctx::defer_check`]),
//! bounded by its own timeout.
//!
//! # The binary
//!
//! ```no_run
//! use clap::Parser;
//! use spec_runner::{Registry, RunnerArgs};
//!
//! /// End-to-end tests for Kubernetes Dynamic Resource Allocation.
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     runner: RunnerArgs,
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     let cli = Cli::parse();
//!     let mut registry = Registry::new();
//!     // suites::control_plane::register(&mut registry); ...
//!     spec_runner::run(registry, cli.runner).await
//! }
//! ```
//!
//! `run` installs the tracing subscriber itself ([`init_tracing`]: `RUST_LOG`
//! for the console, default `warn`; `DRA_E2E_SPEC_LOG` for what spec logs
//! capture). A binary that installs its own subscriber must add
//! [`capture_layer`] to it, or spec logs stay empty.
//!
//! Flags: `--focus REGEX`, `--skip REGEX` (repeatable), `--label-filter EXPR`,
//! `-p N`, `--timeout 10m`, `--cleanup-bound 3m`, `--list`, `--junit FILE`, `--artifacts DIR`,
//! `--repeat N`, `--kubeconfig PATH`, `--seed N`, `--randomize-all`, `--fail-fast`,
//! `--flake-attempts N`, `--json-report FILE`, `--poll-progress-after D`,
//! `--poll-progress-interval D`, `-v`, `--succinct`, `--keep-leftovers`, `--partition KIND:M/N`
//! with `--timings FILE` (a shard of the selection; [`Merged`] merges the shards' reports),
//! `--rerun-failed FILE`. SIGUSR1 prints a progress report of every
//! running spec (see [`waiting`] and [`step`] for what it names). Before any spec runs, preflight checks
//! within seconds that the cluster answers and serves `resource.k8s.io/v1`.
//! Specs labelled `Serial` run alone after the others. Exit codes: 0 nothing
//! failed, 1 a spec failed, 2 usage or configuration error, 130 interrupted.
//!
//! # Run identity and leftovers
//!
//! On a real cluster ([`run`]) every object a run creates carries the label
//! [`RUN_LABEL`]`=<run id>`, and the run holds a Lease `kube-system/dra-e2e-run-<run id>`
//! ([`LEASE_DURATION`] 30 s, renewed every [`RENEW_EVERY`] 10 s, deleted on a clean exit).
//! Before its specs, a run removes the objects of runs whose Lease expired or is gone (a
//! SIGKILLed run's), and says what it found; `--keep-leftovers` only reports them, and
//! [`cleanup`] (`dra-e2e cleanup`) does the same on its own. Objects of live runs and objects
//! without the label are never touched.
//!
//! On failure, `<artifacts>/<spec name>[-attempt-N]/` holds `failure.txt`,
//! `spec.log`, `events.yaml`, `pods.yaml`, `logs/<pod>/<container>.log` and a
//! folder per [`ArtifactSource`] the spec (or a suite hook) registered.

mod args;
mod cluster;
mod duration;
mod names;
mod report;
mod run;
mod select;
mod spec;

pub use args::{RunnerArgs, run, run_on, run_versioned};
pub use cluster::artifact_files::write_list;
pub use cluster::backend::{ArtifactRequest, ClusterBackend, ClusterError, NamespaceRequest, SpecNamespace};
pub use cluster::kube_backend::{KubeBackend, PREFLIGHT_TIMEOUT, SPEC_ANNOTATION, nodelay_client};
pub use cluster::leftovers::{
    GoneRun, Leftover, LeftoverError, Leftovers, find as find_leftovers, remove as remove_leftovers,
};
pub use cluster::preflight::{
    ClusterInfo, KUBELET_MIN_VERSION, KubeVersion, NodeInfo, PreflightError, feature_gates_from_metrics,
    kubelet_min_version,
};
pub use cluster::run_guard::{CleanupArgs, SWEEP_TIMEOUT, cleanup};
pub use cluster::run_identity::{
    LEASE_DURATION, LEASE_NAMESPACE, LEASE_PREFIX, MANAGED_BY_LABEL, RENEW_EVERY, RUN_INFO_ANNOTATION,
    RUN_LABEL, RunLease, lease_name, new_run_id, stamp as stamp_run_identity,
};
pub use duration::{display as display_duration, parse as parse_duration};
pub use report::ginkgo_json::{ReadError, ReadSpec, ReportFile, read as read_json_report};
pub use report::json_report::{JsonConfig, SHARD_ENTRY, render as json_report, write as write_json_report};
pub use report::junit::{
    JunitError, SUITE_NAME, report as junit_report, write as write_junit, write_report as write_junit_report,
};
pub use report::merge::{MergeArgs, MergeError, Merged, merge_command};
pub use report::outcome::OUTCOME_TARGET;
pub use report::outcome::{CheckReport, FailureKind, Outcome, RunReport, SpecReport};
pub use report::progress::{Output, OutputBuffer, Verbosity};
pub use run::artifacts::ArtifactSource;
pub use run::capture::{
    CaptureLayer, DEFAULT_CONSOLE_LOG, DEFAULT_SPEC_LOG, SPEC_LOG_ENV, SPEC_SPAN_TARGET, capture_layer,
    init_tracing,
};
pub use run::cleanup::{CLEANUP_ALLOWANCE, CleanupFailure};
pub use run::monitor::{Monitor, WaitGuard, step, waiting};
pub use run::options::{DEFAULT_CLEANUP_BOUND, RunOptions};
pub use run::phases::Phases;
pub use run::runner::run_with_backend;
pub use select::balance::{Load, Timings};
pub use select::label_filter::{LabelFilter, LabelFilterError};
pub use select::partition::{
    CI_NODE_INDEX, CI_NODE_TOTAL, Partition, PartitionError, PartitionFlag, PartitionKind, Shard,
    elsewhere_reason, elsewhere_shard,
};
pub use select::rerun::Rerun;
pub use select::selection::{Selection, SelectionError};
pub use spec::ctx::{Ctx, current_cancellation};
pub use spec::error::{Skip, SpecError, SpecResult, skip};
pub use spec::gate::{
    Gate, GateTable, Stability, UnknownGate, VersionError, table_for_flag, table_for_server,
};
pub use spec::info::SpecInfo;
pub use spec::label::Label;
pub use spec::registry::{Registry, RegistryError, SpecHandle};
pub use spec::requirements::{ClusterAccess, Precheck};
