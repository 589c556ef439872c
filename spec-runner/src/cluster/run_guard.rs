//! The start and end of a run on a real cluster: its Lease and identity
//! ([`crate::cluster::run_identity`]), the sweep of gone runs' leftovers ([`crate::cluster::leftovers`]) before
//! its specs, and `dra-e2e cleanup` ([`cleanup`]), the sweep on its own.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use kube::Client;

use crate::{
    cluster::backend::ClusterBackend as _,
    cluster::kube_backend::KubeBackend,
    cluster::leftovers::{self, Leftovers},
    cluster::run_identity::{
        LEASE_DURATION, LEASE_NAMESPACE, RENEW_EVERY, RUN_LABEL, RunLease, lease_name, new_run_id,
    },
    duration,
};

/// How long the sweep waits for gone runs' namespaces to be gone.
pub const SWEEP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long creating the run's Lease may take.
const LEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// `dra-e2e cleanup`: removes the objects of gone runs and exits.
#[derive(Debug, Clone, clap::Args)]
pub struct CleanupArgs {
    /// Only report the leftovers, remove nothing.
    #[arg(long)]
    pub keep_leftovers: bool,

    /// Kubeconfig of the cluster (default: KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// Creates the run's Lease and prints its identity; then sweeps gone runs' leftovers (only
/// reports them with `keep_leftovers`). `None` when the Lease cannot be created: then the run
/// stamps nothing (so no other run can take its objects for leftovers) and preflight says what
/// is wrong with the cluster.
pub(crate) async fn begin(backend: &KubeBackend, keep_leftovers: bool) -> Option<RunLease> {
    let client = backend.client();
    let run_id = new_run_id();
    let info = run_info();
    let acquired = tokio::time::timeout(LEASE_TIMEOUT, RunLease::acquire(client.clone(), &run_id, &info));
    let lease = match acquired.await {
        Ok(Ok(lease)) => lease,
        // An API server that cannot be reached, or refuses the kubeconfig's user, is preflight's
        // to report, in one sentence.
        Ok(Err(e)) if preflight_reports(&e) => {
            tracing::debug!("cannot create the run's Lease: {e}; this run's objects carry no run identity");
            return None;
        }
        Ok(Err(e)) => {
            tracing::warn!("cannot create the run's Lease: {e}; this run's objects carry no run identity");
            return None;
        }
        Err(_) => {
            tracing::debug!(
                "creating the run's Lease took over 10s; this run's objects carry no run identity"
            );
            return None;
        }
    };
    println!(
        "Run {RUN_LABEL}={run_id} (Lease {LEASE_NAMESPACE}/{}: {}s, renewed every {}s)",
        lease_name(&run_id),
        LEASE_DURATION.as_secs(),
        RENEW_EVERY.as_secs()
    );
    if let Err(e) = sweep(&client, Some(&run_id), keep_leftovers).await {
        eprintln!("warning: looking for leftovers of earlier runs failed: {e}");
    }
    Some(lease)
}

/// Whether preflight, which comes next, says what `error` means: no connection, 401, 403.
fn preflight_reports(error: &kube::Error) -> bool {
    match error {
        kube::Error::Service(_) | kube::Error::HyperError(_) => true,
        kube::Error::Api(status) => status.code == 401 || status.code == 403,
        _ => false,
    }
}

/// Finds gone runs' leftovers, prints them and removes them unless `keep`. `Ok(false)`: some
/// could not be removed (printed).
async fn sweep(client: &Client, own_run: Option<&str>, keep: bool) -> Result<bool, leftovers::LeftoverError> {
    let started = Instant::now();
    let found = leftovers::find(client, own_run).await?;
    if !found.live_runs.is_empty() {
        let live: Vec<&str> = found.live_runs.iter().map(String::as_str).collect();
        println!("Live runs on this cluster (not touched): {}", live.join(", "));
    }
    if found.is_empty() {
        if own_run.is_none() {
            println!("No leftovers of gone runs.");
        }
        return Ok(true);
    }
    print!("{}", heading(&found, keep));
    print!("{}", found.describe());
    if keep {
        return Ok(true);
    }
    let problems = leftovers::remove(client, &found, SWEEP_TIMEOUT).await;
    let took = duration::display(started.elapsed());
    if problems.is_empty() {
        println!("Removed the leftovers of {} in {took}.", runs(found.runs.len()));
        Ok(true)
    } else {
        println!("Could not remove every leftover ({took}):");
        for problem in &problems {
            println!("  {problem}");
        }
        Ok(false)
    }
}

fn heading(found: &Leftovers, keep: bool) -> String {
    let what = if keep { "keeping them (--keep-leftovers)" } else { "removing them" };
    format!("Leftovers of {} whose Lease expired or is gone, {what}:\n", runs(found.runs.len()))
}

fn runs(n: usize) -> String {
    if n == 1 { "1 run".to_owned() } else { format!("{n} runs") }
}

/// `pid P on host H, started T: ARGS`, for the Lease's annotation.
fn run_info() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let started = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
    let mut args: String = std::env::args().collect::<Vec<_>>().join(" ");
    if args.len() > 400 {
        let cut = (0..=400).rev().find(|i| args.is_char_boundary(*i)).unwrap_or(0);
        args.truncate(cut);
        args.push_str(" ...");
    }
    format!("pid {} on host {}, started {started}: {args}", std::process::id(), host.trim())
}

/// `dra-e2e cleanup`: reports the leftovers of gone runs and removes them (unless
/// `--keep-leftovers`). Exit codes: 0 done (or nothing found), 1 some could not be removed, 2
/// the cluster cannot be used.
pub async fn cleanup(args: CleanupArgs) -> ExitCode {
    crate::run::capture::init_tracing();
    let backend = match KubeBackend::connect(args.kubeconfig.as_deref()).await {
        Ok(backend) => backend,
        Err(e) => return usage_error(&e),
    };
    if let Err(e) = backend.preflight().await {
        return usage_error(&e);
    }
    match sweep(&backend.client(), None, args.keep_leftovers).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => usage_error(&e),
    }
}

fn usage_error(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}
