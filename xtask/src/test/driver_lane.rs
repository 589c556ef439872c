//! The driver lane of `cargo xtask test` (`--lane driver` runs it alone): dra-e2e's
//! driver-under-test specs against a real, out-of-process DRA driver, the example driver
//! (`kubelet-plugin/examples/node_driver.rs`) deployed as a DaemonSet by
//! `cargo xtask example-driver deploy`. In order:
//!
//! 1. the example driver deployed (image built here, loaded into the nodes);
//! 2. the specs as a vendor runs them (`--driver`): what the API and the nodes show;
//! 3. the specs with the harness interposed between the kubelet and the driver (`--interpose`):
//!    also the calls the contract demands and forbids;
//! 4. kind-worker's kubelet restarted, the driver's ResourceSlice back, and a pod's claim
//!    prepared through the driver again (interposed);
//! 5. the driver redeployed broken on purpose (`--break skip-unprepare`: it answers
//!    NodeUnprepareResources but leaves the claim's CDI spec behind), and the unprepare spec
//!    must fail, naming the call and showing the call log ([`CAUGHT`]);
//! 6. the driver removed, also when an earlier step failed;
//! 7. unless [`UPSTREAM_OPT_OUT`] is `0`: upstream's own test driver (`cargo xtask
//!    upstream-driver deploy`) deployed, the specs as a vendor runs them and interposed, and the
//!    driver removed, also when a step failed.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, bail};

use super::{
    LANE_PROCS, StepStart, host_skips::HostSkips, lane_run::SuiteRun, report::ReportedSpec, steps::Steps,
};
use crate::{e2e, example_driver, local::LocalCluster, upstream_driver};

/// The spec whose claim the kubelet prepares after its restart.
pub(crate) const PREPARE_SPEC: &str = "prepares the claim of a pod and its CDI devices reach the container";
/// The spec the broken driver must fail.
pub(crate) const UNPREPARE_SPEC: &str = "unprepares the claim once when its pod is deleted";
/// What the broken driver's failure must say: the call, the leftover CDI devices, and the call
/// log with the driver's answer.
pub(crate) const CAUGHT: [&str; 3] =
    ["answered NodeUnprepareResources", "are still defined on node", "/NodeUnprepareResources -> OK"];

/// The reports' stems of the lane's runs: as a vendor runs it, interposed, after the kubelet's
/// restart, and the broken driver's.
pub(crate) const STEMS: [&str; 4] = ["driver", "driver-interposed", "driver-after-restart", BROKEN_REPORT];
/// The JUnit and JSON reports' stem of the broken driver's run.
const BROKEN_REPORT: &str = "driver-broken";

/// The variable that leaves upstream's test driver out of the lane when it is `0`.
pub(crate) const UPSTREAM_OPT_OUT: &str = "DRA_E2E_UPSTREAM_DRIVER_LANE";
/// The reports' stems of the runs against upstream's driver: as a vendor runs it, interposed.
pub(crate) const UPSTREAM_STEMS: [&str; 2] = ["upstream-driver", "upstream-driver-interposed"];

/// The node whose kubelet the lane restarts.
const RESTARTED_NODE: &str = "kind-worker";
/// How long the driver may take to publish its slice again after the kubelet restart.
const REPUBLISH_TIMEOUT: Duration = Duration::from_secs(120);

/// The lane's steps after the deploy, in order.
const VENDOR_STEP: &str = "e2e: driver lane, the example driver as a vendor runs it (--driver)";
const INTERPOSED_STEP: &str = "e2e: driver lane, interposed (--driver --interpose)";
const RESTART_STEP: &str = "e2e: driver lane, after kind-worker's kubelet restarted";
const BROKEN_STEP: &str = "e2e: driver lane, a driver that skips unprepare is caught";

/// The example driver's runs after its deploy, in order.
const EXAMPLE_RUNS: [&str; 4] = [VENDOR_STEP, INTERPOSED_STEP, RESTART_STEP, BROKEN_STEP];

/// Runs the lane against `cluster`, each part a step of the table.
pub(crate) async fn run(repo: &Path, cluster: &LocalCluster, steps: &mut Steps) {
    let kubeconfig = cluster.kubeconfig();
    let deploy = "driver lane: the example driver deployed as a DaemonSet";
    if steps.skipped(deploy) {
        EXAMPLE_RUNS.iter().for_each(|name| steps.not_run(name));
    } else {
        let t = StepStart::now();
        let deployed = example_driver::deploy(&kubeconfig, None).await;
        let ok = deployed.is_ok();
        steps.record(deploy, deployed, t);
        if ok {
            let vendor = driver_run(repo, &["--device-class", example_driver::DEVICE_CLASS], STEMS[0]);
            steps.run(VENDOR_STEP, super::run_suite(repo, &kubeconfig, &vendor)).await;
            let interposed = driver_run(repo, &["--interpose"], STEMS[1]);
            steps.run(INTERPOSED_STEP, super::run_suite(repo, &kubeconfig, &interposed)).await;
            steps.run(RESTART_STEP, after_kubelet_restart(repo, cluster)).await;
            steps.run(BROKEN_STEP, broken_driver_caught(repo, &kubeconfig)).await;
        } else {
            EXAMPLE_RUNS.iter().for_each(|name| steps.not_run(name));
        }
        // Also after a failed deploy or an interrupt: what it created goes.
        let t = StepStart::now();
        steps.record("driver lane: the example driver removed", example_driver::remove(&kubeconfig).await, t);
    }
    // Its own steps say so when the run was stopped.
    if upstream_joins(std::env::var(UPSTREAM_OPT_OUT).ok().as_deref()) {
        run_upstream(repo, &kubeconfig, steps).await;
    }
}

/// Whether upstream's driver joins the lane for this value of [`UPSTREAM_OPT_OUT`]: unless it
/// is `0`.
fn upstream_joins(value: Option<&str>) -> bool {
    value != Some("0")
}

/// The runs against upstream's driver: as a vendor runs it (its DeviceClass named) and
/// interposed; the selection of each.
fn upstream_selections() -> [Vec<&'static str>; 2] {
    // Churn: 3 rounds, as against the example driver.
    let driver = ["--driver", upstream_driver::DRIVER_NAME, "--churn-rounds", "3"];
    [
        [&driver[..], &["--device-class", upstream_driver::DEVICE_CLASS]].concat(),
        [&driver[..], &["--interpose"]].concat(),
    ]
}

/// Deploys upstream's test driver, runs the specs against it plain and interposed, and removes
/// it, also when a step failed.
async fn run_upstream(repo: &Path, kubeconfig: &Path, steps: &mut Steps) {
    let deploy = "driver lane: upstream's test driver deployed as a DaemonSet";
    let runs = [
        "e2e: driver lane, upstream's test driver as a vendor runs it (--driver)",
        "e2e: driver lane, upstream's test driver interposed (--driver --interpose)",
    ];
    if steps.skipped(deploy) {
        runs.iter().for_each(|name| steps.not_run(name));
        return;
    }
    let t = StepStart::now();
    let deployed = upstream_driver::deploy(kubeconfig).await;
    let ok = deployed.is_ok();
    steps.record(deploy, deployed, t);
    if ok {
        for ((name, selection), stem) in runs.iter().zip(upstream_selections()).zip(UPSTREAM_STEMS) {
            let run = SuiteRun::new(repo, &selection, stem, LANE_PROCS);
            steps.run(name, super::run_suite(repo, kubeconfig, &run)).await;
        }
    } else {
        runs.iter().for_each(|name| steps.not_run(name));
    }
    let t = StepStart::now();
    steps.record("driver lane: upstream's test driver removed", upstream_driver::remove(kubeconfig).await, t);
}

/// A run against the example driver.
fn driver_run(repo: &Path, extra: &[&str], stem: &str) -> SuiteRun {
    driver_run_with(repo, extra, stem, LANE_PROCS)
}

/// [`driver_run`] with `procs` specs at once.
fn driver_run_with(repo: &Path, extra: &[&str], stem: &str, procs: &str) -> SuiteRun {
    // Churn: 3 rounds, not 10 (about 28 s a run here); 3 still catch a driver that leaks.
    let mut selection = vec!["--driver", example_driver::DRIVER_NAME, "--churn-rounds", "3"];
    selection.extend(extra);
    SuiteRun::new(repo, &selection, stem, procs)
}

/// Restarts kind-worker's kubelet, waits until the driver published its slice again, and runs
/// the prepare spec interposed on that node.
async fn after_kubelet_restart(repo: &Path, cluster: &LocalCluster) -> Result<String> {
    let kubeconfig = cluster.kubeconfig();
    let kubelet = format!("kubelet-{RESTARTED_NODE}");
    cluster.restart(&kubelet, crate::local::Stop::Graceful).await?;
    example_driver::wait_republished(&kubeconfig, RESTARTED_NODE, REPUBLISH_TIMEOUT)
        .await
        .with_context(|| format!("after {kubelet} restarted"))?;
    let run = driver_run(repo, &["--interpose", "--focus", PREPARE_SPEC], STEMS[2]);
    super::run_suite(repo, &kubeconfig, &run).await
}

/// Redeploys the driver with `--break skip-unprepare`, runs the unprepare spec interposed, and
/// passes only when that spec, alone selected, failed an assertion saying every one of
/// [`CAUGHT`]. The driver is redeployed intact by nobody: the lane removes it next.
async fn broken_driver_caught(repo: &Path, kubeconfig: &Path) -> Result<()> {
    let skips = HostSkips::load(repo)?;
    example_driver::deploy(kubeconfig, Some(example_driver::Break::SkipUnprepare))
        .await
        .context("redeploying the example driver with --break skip-unprepare")?;
    let run = driver_run_with(repo, &["--interpose", "--focus", UNPREPARE_SPEC], BROKEN_REPORT, "1");
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let texts = super::lane_run::texts_version(repo, kubeconfig).await?;
    let ran = run.run(&runner, kubeconfig, &texts).await?;
    if ran.expected.len() != 1 {
        bail!(
            "--focus {UNPREPARE_SPEC:?} selects {} specs, not the one: {:?}",
            ran.expected.len(),
            ran.expected
        );
    }
    ran.check_selection_ran(&skips)?;
    if ran.code == 0 {
        bail!(
            "the broken driver passed \"{UNPREPARE_SPEC}\": the spec does not catch a driver that skips unprepare"
        );
    }
    judge_caught(&ran.failed())?;
    if ran.code != 1 {
        bail!(
            "dra-e2e exited with {}, not 1: the run itself failed beside the spec (see its output)",
            ran.code
        );
    }
    Ok(())
}

/// Passes when exactly one spec failed, an assertion of its body, and its message says every
/// one of [`CAUGHT`].
fn judge_caught(failed: &[&ReportedSpec]) -> Result<()> {
    let [spec] = failed else {
        let names: Vec<&str> = failed.iter().map(|s| s.name.as_str()).collect();
        bail!("expected the unprepare spec alone to fail, {} spec(s) failed: {names:?}", failed.len());
    };
    if !spec.failed_an_assertion() {
        bail!("the unprepare spec did not fail an assertion, it {}: {}", spec.how(), spec.first_line());
    }
    let missing: Vec<_> = CAUGHT.iter().filter(|c| !spec.message.contains(**c)).collect();
    if !missing.is_empty() {
        bail!("the unprepare spec failed, but its message lacks {missing:?}: {}", spec.message);
    }
    eprintln!("    caught as it must be: {}", super::clip(&spec.message, 600));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn upstream_s_driver_joins_the_lane_unless_left_out() {
        assert!(!upstream_joins(Some("0")));
        for value in [None, Some(""), Some("1"), Some("true")] {
            assert!(upstream_joins(value), "{value:?}");
        }
        let [vendor, interposed] = upstream_selections();
        assert_eq!(
            vendor,
            [
                "--driver",
                "test-driver.cdi.k8s.io",
                "--churn-rounds",
                "3",
                "--device-class",
                "test-driver.cdi.k8s.io"
            ]
        );
        assert_eq!(interposed, ["--driver", "test-driver.cdi.k8s.io", "--churn-rounds", "3", "--interpose"]);
        assert!(UPSTREAM_STEMS.iter().all(|stem| !STEMS.contains(stem)), "a report would be overwritten");
    }

    fn failed(state: &str, node: &str, message: &str) -> ReportedSpec {
        ReportedSpec {
            name: UNPREPARE_SPEC.into(),
            state: state.into(),
            message: message.into(),
            node: node.into(),
        }
    }

    #[test]
    fn only_an_assertion_that_names_the_call_and_shows_the_log_counts() {
        let good = "the driver answered NodeUnprepareResources OK, but CDI devices [x] are still defined on node kind-worker\ncalls:\n  /v1.DRAPlugin/NodeUnprepareResources -> OK";
        judge_caught(&[&failed("failed", "It", good)]).unwrap();
        assert!(judge_caught(&[]).is_err());
        assert!(judge_caught(&[&failed("failed", "It", "timed out")]).is_err());
        assert!(judge_caught(&[&failed("failed", "It", good), &failed("failed", "It", good)]).is_err());
        // The same words in a timeout or a clean-up are no catch.
        let err = judge_caught(&[&failed("timedout", "It", good)]).unwrap_err().to_string();
        assert!(err.contains("did not fail an assertion, it timedout in It"), "{err}");
        assert!(judge_caught(&[&failed("failed", "DeferCleanup (Each)", good)]).is_err());
    }

    #[tokio::test]
    async fn the_broken_driver_s_run_is_judged_on_its_own_report() {
        // The old step read target/e2e/driver-broken.json whatever run wrote it: a run that
        // exits before writing one was judged on the previous run's catch.
        let dir = tempfile::tempdir().unwrap();
        let good = "answered NodeUnprepareResources OK, but CDI devices [x] are still defined on node w\n/NodeUnprepareResources -> OK";
        let earlier = super::super::lane_run::tests::report_of(&[(UNPREPARE_SPEC, "failed", good)]);
        std::fs::write(dir.path().join("driver-broken.json"), earlier.to_string()).unwrap();
        let runner = super::super::lane_run::tests::fake_runner(dir.path(), &[UNPREPARE_SPEC], None, 2);
        let err = format!(
            "{:#}",
            super::super::lane_run::tests::run_in(dir.path(), &runner, BROKEN_REPORT).await.unwrap_err()
        );
        assert!(err.contains("dra-e2e exited with 2 and wrote no report"), "{err}");
    }

    #[test]
    fn the_focused_specs_exist_under_these_names() {
        // The lane's focus strings must select a spec: a renamed spec would make the restart
        // step run nothing and the broken driver pass unnoticed.
        let dir = crate::repo::repo_root().join("suites/src/specs/under_test");
        let sources: String = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
        for name in [PREPARE_SPEC, UNPREPARE_SPEC] {
            assert!(sources.contains(name), "no spec of {} is named \"{name}\"", dir.display());
        }
        for said in ["NodeUnprepareResources OK, but ", CAUGHT[1]] {
            assert!(sources.contains(said), "no spec of {} says \"{said}\"", dir.display());
        }
    }
}
