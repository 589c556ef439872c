//! The restart steps of `cargo xtask test` on the local cluster: the suites while a component
//! restarts under them. The restart cluster test (harness/tests/cluster/restart.rs) restarts a
//! node's kubelet under a running pod; then the kubelet suites run while kind-worker's kubelet
//! restarts, 50 s after the run's first spec started (a restart during the run's preflight or its
//! sweep would only make it refuse to start), and the control plane suites while the API server
//! is killed and restarted, 5 s in.
//!
//! A restart run passes when every spec passed, or when every spec that failed names the
//! restart (dra-e2e adds to a failed spec's message what disrupted the cluster while it ran: the
//! API server not answering, a kubelet starting again); a failure that does not name it fails
//! the step. And nothing may be left: no namespace of a run once it ended.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, api::ListParams};

use super::report::{self, failed_specs};
use crate::{e2e, local::LocalCluster};

/// What a failed spec's message says when a disruption overlapped it (spec-runner's
/// `with_disruptions`).
const NAMES_THE_DISRUPTION: &str = "the cluster was disrupted";

/// The label of every namespace a dra-e2e run creates (spec-runner's `MANAGED_BY_LABEL`; xtask
/// does not link the harness outside its tests).
const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "dra-e2e");

/// How long a run may take to start its first spec.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// One run of suites with a restart in the middle.
pub(crate) struct RestartRun {
    /// The step's name.
    pub name: &'static str,
    /// The component restarted (`cluster restart`'s name).
    pub component: &'static str,
    /// How long after the run's first spec started.
    pub after: Duration,
    /// How the component is stopped.
    pub stop: crate::local::Stop,
    /// dra-e2e's selection.
    pub selection: &'static [&'static str],
    /// The JSON report's and JUnit's file stem.
    pub report: &'static str,
}

/// The restart runs, in order.
pub(crate) fn restart_runs() -> Vec<RestartRun> {
    vec![
        RestartRun {
            name: "e2e: kubelet suites, kind-worker's kubelet restarted 50 s in",
            component: "kubelet-kind-worker",
            after: Duration::from_secs(50),
            stop: crate::local::Stop::Graceful,
            selection: &["--focus", "kubelet", "--skip", super::WORKLOAD_FOCUS],
            report: "restart-kubelet",
        },
        RestartRun {
            // The control plane specs take about 17 s on a quiet machine. Stopped with SIGTERM,
            // the API server serves on for up to its 15 s grace (its open watches), so the run
            // could end before it went away; killed 5 s in, as a crash does, it is gone at once
            // and answers again about 10 s later: the outage falls on specs in flight, whose
            // requests and clean-ups wait for it (the run's client sends again what did not
            // reach the API server).
            name: "e2e: control plane suites, the API server killed and restarted 5 s in",
            component: "kube-apiserver",
            after: Duration::from_secs(5),
            stop: crate::local::Stop::Kill,
            selection: &["--focus", "control plane", "--skip", "kubelet"],
            report: "restart-apiserver",
        },
    ]
}

/// The restart cluster test's cargo arguments, and the command it restarts a kubelet with:
/// `cargo xtask`, not this process's binary, which the workspace's tests may have rebuilt (the
/// running one is then a deleted file).
pub(crate) fn cluster_test() -> (Vec<&'static str>, String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let restart = format!("{cargo} xtask cluster restart kubelet-{{node}}");
    (vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "restart::"], restart)
}

/// Runs the suites of `run` against `cluster`, restarting its component `run.after` into the
/// run, and judges the outcome (see the module docs).
pub(crate) async fn run_with_restart(repo: &Path, cluster: &LocalCluster, run: &RestartRun) -> Result<()> {
    let json = report::path(repo, run.report);
    let args = super::suite_args(repo, run.selection, run.report);
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let kubeconfig = cluster.kubeconfig();
    let suites = async {
        let code = e2e::run_runner(&runner, &kubeconfig, &args).await;
        (code, Instant::now())
    };
    let client = cluster.admin_client().await?;
    let earlier = run_namespaces(&client).await?;
    let restart = async {
        // From the moment the first spec started (a restart during the run's preflight or its
        // sweep of earlier runs' leftovers would only make it refuse to start).
        if let Err(e) = wait_for_first_spec(&client, &earlier).await {
            return (Instant::now(), Err(e));
        }
        tokio::time::sleep(run.after).await;
        (Instant::now(), cluster.restart(run.component, run.stop).await)
    };
    let ((code, ended), (began, restarted)) = tokio::join!(suites, restart);
    let code = code?;
    restarted.with_context(|| format!("restart {} in the middle of the run", run.component))?;
    if ended <= began {
        bail!(
            "the run ended before {} restarted ({} in): it tried nothing; restart it earlier",
            run.component,
            crate::progress::human(run.after)
        );
    }
    let unexplained = if code == 0 { Vec::new() } else { failures_not_naming_a_disruption(&json)? };
    if !unexplained.is_empty() {
        bail!(
            "{} spec(s) failed without naming the restart of {} ({} after the start): {}",
            unexplained.len(),
            run.component,
            crate::progress::human(run.after),
            unexplained.join("; ")
        );
    }
    if code != 0 {
        eprintln!("    every spec that failed names the restart of {}", run.component);
    }
    no_namespace_left(cluster).await
}

/// The failed specs of a dra-e2e JSON report whose message does not name a disruption: `name:
/// message`.
fn failures_not_naming_a_disruption(json: &Path) -> Result<Vec<String>> {
    Ok(unexplained_failures(&report::read(json)?))
}

fn unexplained_failures(reports: &serde_json::Value) -> Vec<String> {
    failed_specs(reports)
        .into_iter()
        .filter(|spec| !spec.message.contains(NAMES_THE_DISRUPTION))
        .map(|spec| format!("{} ({}): {}", spec.name, spec.state, spec.message))
        .collect()
}

/// The namespaces of dra-e2e runs (labelled [`MANAGED_BY_LABEL`]).
async fn run_namespaces(client: &kube::Client) -> Result<Vec<String>> {
    let (key, value) = MANAGED_BY_LABEL;
    let api: Api<Namespace> = Api::all(client.clone());
    let list = api.list(&ListParams::default().labels(&format!("{key}={value}"))).await?;
    Ok(list.items.into_iter().filter_map(|n| n.metadata.name).collect())
}

/// Waits until a spec's namespace that is not in `earlier` exists: the run's specs started.
async fn wait_for_first_spec(client: &kube::Client, earlier: &[String]) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(now) = run_namespaces(client).await
            && now.iter().any(|name| !earlier.contains(name))
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("no spec of the run started within {}", crate::progress::human(START_TIMEOUT));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fails when a namespace of a dra-e2e run is left.
async fn no_namespace_left(cluster: &LocalCluster) -> Result<()> {
    let (key, value) = MANAGED_BY_LABEL;
    let api: Api<Namespace> = Api::all(cluster.admin_client().await?);
    let left = api.list(&ListParams::default().labels(&format!("{key}={value}"))).await?;
    let names: Vec<String> = left.items.into_iter().filter_map(|n| n.metadata.name).collect();
    if !names.is_empty() {
        bail!("the run left namespaces behind: {}", names.join(", "));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn the_label_is_the_runners() {
        assert_eq!(MANAGED_BY_LABEL, harness::framework::MANAGED_BY_LABEL);
    }

    #[test]
    fn only_failures_that_do_not_name_a_disruption_count() {
        let reports = serde_json::json!([{ "SpecReports": [
            { "State": "passed", "LeafNodeText": "a" },
            { "State": "failed", "LeafNodeText": "b", "Failure": { "Message": "timed out; while it ran, the cluster was disrupted: the kubelet of node kind-worker started again at 17:06:47 (3.0 s into the spec)" } },
            { "State": "failed", "LeafNodeText": "c", "Failure": { "Message": "expected 1 call, saw 2" } },
            { "State": "skipped", "LeafNodeText": "d" },
            { "State": "timedout", "LeafNodeText": "e", "Failure": { "Message": "timed out" } },
        ]}]);
        let left = unexplained_failures(&reports);
        assert_eq!(left, ["c (failed): expected 1 call, saw 2", "e (timedout): timed out"]);
    }
}
