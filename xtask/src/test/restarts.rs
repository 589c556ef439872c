//! The restart steps of `cargo xtask test` on the local cluster: the suites while a component
//! restarts under them. The restart cluster test (harness/tests/cluster/restart.rs) restarts a
//! node's kubelet under a running pod; then the kubelet suites run while kind-worker's kubelet
//! restarts, 50 s after the run's first spec started (a restart during the run's preflight or its
//! sweep would only make it refuse to start), and the control plane suites while the API server
//! is killed and restarted, 5 s in.
//!
//! A restart run is judged strictly: every spec of its selection ran ([`Ran::check_selection_ran`]),
//! none failed but where docs/restart-exceptions.md has a row for exactly that failure (the step,
//! the spec, the restarted node, the failure's message: [`restart_exceptions`]), and dra-e2e
//! exited 0, or 1 for those failures alone. That a failure names the restart (dra-e2e adds to a
//! failed spec's message what disrupted the cluster while it ran) excuses nothing by itself. And
//! nothing may be left: no namespace of a run once it ended.
//!
//! [`restart_exceptions`]: super::restart_exceptions

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, api::ListParams};

use super::partition::Unit;
use super::{
    cluster_tests::ClusterTest,
    host_skips::HostSkips,
    lane_run::{Ran, SuiteRun},
    report::{self, ReportedSpec},
    restart_exceptions::Exceptions,
};
use crate::{e2e, local::LocalCluster};

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
    /// The node it runs on.
    pub node: &'static str,
    /// How long after the run's first spec started.
    pub after: Duration,
    /// How the component is stopped.
    pub stop: crate::local::Stop,
    /// dra-e2e's selection.
    pub selection: &'static [&'static str],
    /// The JSON report's and JUnit's file stem.
    pub report: &'static str,
    /// The unit it is of a run split over machines.
    pub unit: Unit,
}

/// The restart runs, in order.
pub(crate) fn restart_runs() -> Vec<RestartRun> {
    vec![
        RestartRun {
            name: "e2e: kubelet suites, kind-worker's kubelet restarted 50 s in",
            component: "kubelet-kind-worker",
            node: "kind-worker",
            after: Duration::from_secs(50),
            stop: crate::local::Stop::Graceful,
            selection: &["--focus", "kubelet", "--skip", super::local_lanes::WORKLOAD_FOCUS],
            report: "restart-kubelet",
            unit: Unit::RestartKubelet,
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
            node: "kind-control-plane",
            after: Duration::from_secs(5),
            stop: crate::local::Stop::Kill,
            selection: &["--focus", "control plane", "--skip", "kubelet"],
            report: "restart-apiserver",
            unit: Unit::RestartApiserver,
        },
    ]
}

/// The restart cluster test, and the command it restarts a kubelet with: `cargo xtask`, not
/// this process's binary, which the workspace's tests may have rebuilt (the running one is then a
/// deleted file).
pub(crate) fn cluster_test() -> ClusterTest {
    let cargo = crate::repo::cargo_program();
    let restart = format!("{cargo} xtask cluster restart kubelet-{{node}}");
    ClusterTest {
        name: "restart cluster test: a kubelet restarted under a running pod (harness/tests/cluster/restart.rs)",
        short: "restart",
        cargo_args: vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "restart::"],
        any_provider: false,
        starts_runs: false,
        checks_sweeps: false,
        env: vec![("DRA_E2E_RESTART_KUBELET", restart)],
    }
}

/// Runs the suites of `run` against `cluster`, restarting its component `run.after` into the
/// run, and judges the outcome (see the module docs): what ran, counted, when it passed.
pub(crate) async fn run_with_restart(
    repo: &Path,
    cluster: &LocalCluster,
    run: &RestartRun,
) -> Result<String> {
    // The docs first: one that cannot be read fails the step before anything ran.
    let (skips, exceptions) = (HostSkips::load(repo)?, Exceptions::load(repo)?);
    let suite = SuiteRun::new(repo, run.selection, run.report, super::LANE_PROCS);
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let kubeconfig = cluster.kubeconfig();
    let texts = super::lane_run::texts_version(repo, &kubeconfig).await?;
    let suites = async {
        let ran = suite.run(&runner, &kubeconfig, &texts).await;
        (ran, Instant::now())
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
    let ((ran, ended), (began, restarted)) = tokio::join!(suites, restart);
    let ran = ran?;
    restarted.with_context(|| format!("restart {} in the middle of the run", run.component))?;
    if ended <= began {
        bail!(
            "the run ended before {} restarted ({} in): it tried nothing; restart it earlier",
            run.component,
            crate::progress::human(run.after)
        );
    }
    let counted = judge(&ran, run, &exceptions, &skips)?;
    no_namespace_left(cluster).await?;
    Ok(counted)
}

/// A restart run's verdict (see the module docs).
fn judge(ran: &Ran, run: &RestartRun, exceptions: &Exceptions, skips: &HostSkips) -> Result<String> {
    let failed = ran.failed();
    let (accepted, unexplained): (Vec<&ReportedSpec>, Vec<&ReportedSpec>) =
        failed.iter().partition(|spec| exceptions.accepting(run.report, run.node, spec).is_some());
    if !unexplained.is_empty() {
        bail!(
            "across the restart of {} ({} after the start), {} and no row of {} accepts them",
            run.component,
            crate::progress::human(run.after),
            report::summary(&unexplained),
            exceptions.source.display()
        );
    }
    ran.check_selection_ran(skips)?;
    match (ran.code, accepted.len()) {
        (0, 0) => Ok(ran.counts()),
        (1, n) if n > 0 => {
            eprintln!(
                "    {n} failure(s) accepted by {}: {}",
                exceptions.source.display(),
                report::summary(&accepted)
            );
            Ok(format!("{}; {n} failure(s) accepted as restart exceptions", ran.counts()))
        }
        (code, _) => bail!(
            "dra-e2e exited with {code} though no spec failed but as {} accepts: the run itself failed (a clean-up at its end, an interrupt: see its output)",
            exceptions.source.display()
        ),
    }
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
    use super::{
        super::lane_run::tests::{no_skips, run_in},
        *,
    };

    #[test]
    fn the_label_is_the_runners() {
        assert_eq!(MANAGED_BY_LABEL, harness::framework::MANAGED_BY_LABEL);
    }

    fn restart_kubelet() -> RestartRun {
        restart_runs().into_iter().find(|r| r.report == "restart-kubelet").unwrap()
    }

    fn ran(code: i32, specs: &[(&str, &str, &str)]) -> Ran {
        let specs = report::specs(&super::super::lane_run::tests::report_of(specs));
        Ran {
            stem: "restart-kubelet".into(),
            expected: specs.iter().map(|s| s.name.clone()).collect(),
            code,
            specs,
            slice: None,
        }
    }

    fn exceptions(rows: &str) -> Exceptions {
        let doc = format!(
            "## Exceptions\n| Step | Spec | Node | Kubernetes behaviour | Evidence | Failure accepted |\n|---|---|---|---|---|---|\n{rows}"
        );
        Exceptions::parse(&doc, "restart-exceptions.md".into()).unwrap()
    }

    const DISRUPTED: &str = "timed out; while it ran, the cluster was disrupted: the kubelet of node kind-worker started again at 17:06:47 (3.0 s into the spec)";

    #[test]
    fn a_failure_that_names_the_restart_is_not_excused_by_that() {
        // The old step accepted every failure whose message said "the cluster was disrupted".
        let ran = ran(1, &[("a", "passed", ""), ("b", "failed", DISRUPTED)]);
        let none = exceptions("");
        let err = format!("{:#}", judge(&ran, &restart_kubelet(), &none, &no_skips()).unwrap_err());
        assert!(err.contains("1 failed: b (failed in It): timed out; while it ran"), "{err}");
        assert!(err.contains("no row of restart-exceptions.md accepts them"), "{err}");
    }

    #[test]
    fn a_failure_is_accepted_only_as_a_row_says() {
        let row = "| `restart-kubelet` | `b` | `kind-worker` | the kubelet wipes the slices | kubelet.go:1 | `^timed out;` |\n";
        let ran = ran(1, &[("a", "passed", ""), ("b", "failed", DISRUPTED)]);
        let note = judge(&ran, &restart_kubelet(), &exceptions(row), &no_skips()).unwrap();
        assert_eq!(note, "1 passed of 2 selected; 1 failure(s) accepted as restart exceptions");
        // Not on the other restart step, whose node is another.
        let apiserver = restart_runs().into_iter().find(|r| r.report == "restart-apiserver").unwrap();
        assert!(judge(&ran, &apiserver, &exceptions(row), &no_skips()).is_err());
        let other_node = row.replace("`kind-worker`", "`kind-worker2`");
        assert!(judge(&ran, &restart_kubelet(), &exceptions(&other_node), &no_skips()).is_err());
    }

    #[test]
    fn a_run_that_exits_2_fails_the_step_though_no_spec_failed() {
        // A failed clean-up at the run's end: every spec passed, dra-e2e exits 2. The old step
        // found no unexplained failure and passed.
        let ran = ran(2, &[("a", "passed", "")]);
        let err = format!("{:#}", judge(&ran, &restart_kubelet(), &exceptions(""), &no_skips()).unwrap_err());
        assert!(err.contains("dra-e2e exited with 2 though no spec failed"), "{err}");
    }

    #[tokio::test]
    async fn a_restart_run_that_exits_2_with_no_report_fails_the_step() {
        // The old step read target/e2e/restart-kubelet.json whatever run wrote it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("restart-kubelet.json"),
            super::super::lane_run::tests::report_of(&[("a", "passed", "")]).to_string(),
        )
        .unwrap();
        let runner = super::super::lane_run::tests::fake_runner(dir.path(), &["a"], None, 2);
        let err = format!("{:#}", run_in(dir.path(), &runner, "restart-kubelet").await.unwrap_err());
        assert!(err.contains("dra-e2e exited with 2 and wrote no report"), "{err}");
    }

    #[test]
    fn the_committed_exceptions_parse_and_each_names_a_restart_step_and_its_node() {
        // Rows are added only with evidence that Kubernetes (not the harness) makes the spec
        // fail across the restart.
        let exceptions = Exceptions::load(&crate::repo::repo_root()).unwrap();
        let runs = restart_runs();
        for row in &exceptions.rows {
            let run = runs.iter().find(|r| r.report == row.step);
            let run = run.unwrap_or_else(|| {
                panic!("{}: no restart step is {}", exceptions.source.display(), row.step)
            });
            assert_eq!(
                row.node,
                run.node,
                "{}: {} restarts a component of {}",
                exceptions.source.display(),
                row.step,
                run.node
            );
        }
    }
}
