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
//! 6. the driver removed, also when an earlier step failed.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, bail};

use super::{StepStart, report, suite_args, suite_args_with};
use crate::{e2e, example_driver, local::LocalCluster};

/// The spec whose claim the kubelet prepares after its restart.
pub(crate) const PREPARE_SPEC: &str = "prepares the claim of a pod and its CDI devices reach the container";
/// The spec the broken driver must fail.
pub(crate) const UNPREPARE_SPEC: &str = "unprepares the claim once when its pod is deleted";
/// What the broken driver's failure must say: the call, the leftover CDI devices, and the call
/// log with the driver's answer.
pub(crate) const CAUGHT: [&str; 3] =
    ["answered NodeUnprepareResources", "are still defined on node", "/NodeUnprepareResources -> OK"];

/// The JUnit and JSON reports' stem of the broken driver's run.
const BROKEN_REPORT: &str = "driver-broken";

/// The node whose kubelet the lane restarts.
const RESTARTED_NODE: &str = "kind-worker";
/// How long the driver may take to publish its slice again after the kubelet restart.
const REPUBLISH_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the lane against `cluster`, each part a step of the table.
pub(crate) async fn run(
    repo: &Path,
    cluster: &LocalCluster,
    step: &mut impl FnMut(&str, Result<()>, StepStart),
) {
    let kubeconfig = cluster.kubeconfig();
    let t = StepStart::now();
    let deployed = example_driver::deploy(&kubeconfig, None).await;
    let ok = deployed.is_ok();
    step("driver lane: the example driver deployed as a DaemonSet", deployed, t);
    if ok {
        let t = StepStart::now();
        step(
            "e2e: driver lane, the example driver as a vendor runs it (--driver)",
            super::run_suite(
                repo,
                &kubeconfig,
                &driver_args(repo, &["--device-class", example_driver::DEVICE_CLASS], "driver"),
            )
            .await,
            t,
        );
        let t = StepStart::now();
        step(
            "e2e: driver lane, interposed (--driver --interpose)",
            super::run_suite(repo, &kubeconfig, &driver_args(repo, &["--interpose"], "driver-interposed"))
                .await,
            t,
        );
        let t = StepStart::now();
        step(
            "e2e: driver lane, after kind-worker's kubelet restarted",
            after_kubelet_restart(repo, cluster).await,
            t,
        );
        let t = StepStart::now();
        step(
            "e2e: driver lane, a driver that skips unprepare is caught",
            broken_driver_caught(repo, &kubeconfig).await,
            t,
        );
    }
    // Also after a failed deploy: what it created goes.
    let t = StepStart::now();
    step("driver lane: the example driver removed", example_driver::remove(&kubeconfig).await, t);
}

/// dra-e2e's arguments for a run against the example driver.
fn driver_args(repo: &Path, extra: &[&str], report: &str) -> Vec<String> {
    let mut selection = vec!["--driver", example_driver::DRIVER_NAME];
    selection.extend(extra);
    suite_args(repo, &selection, report)
}

/// Restarts kind-worker's kubelet, waits until the driver published its slice again, and runs
/// the prepare spec interposed on that node.
async fn after_kubelet_restart(repo: &Path, cluster: &LocalCluster) -> Result<()> {
    let kubeconfig = cluster.kubeconfig();
    let kubelet = format!("kubelet-{RESTARTED_NODE}");
    cluster.restart(&kubelet, crate::local::Stop::Graceful).await?;
    example_driver::wait_republished(&kubeconfig, RESTARTED_NODE, REPUBLISH_TIMEOUT)
        .await
        .with_context(|| format!("after {kubelet} restarted"))?;
    let args = driver_args(repo, &["--interpose", "--focus", PREPARE_SPEC], "driver-after-restart");
    super::run_suite(repo, &kubeconfig, &args).await
}

/// Redeploys the driver with `--break skip-unprepare`, runs the unprepare spec interposed, and
/// passes only when that spec failed saying every one of [`CAUGHT`]. The driver is redeployed
/// intact by nobody: the lane removes it next.
async fn broken_driver_caught(repo: &Path, kubeconfig: &Path) -> Result<()> {
    example_driver::deploy(kubeconfig, Some(example_driver::Break::SkipUnprepare))
        .await
        .context("redeploying the example driver with --break skip-unprepare")?;
    let args = suite_args_with(
        repo,
        &["--driver", example_driver::DRIVER_NAME, "--interpose", "--focus", UNPREPARE_SPEC],
        BROKEN_REPORT,
        "1",
    );
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let code = e2e::run_runner(&runner, kubeconfig, &args).await?;
    if code == 0 {
        bail!(
            "the broken driver passed \"{UNPREPARE_SPEC}\": the spec does not catch a driver that skips unprepare"
        );
    }
    let messages = failure_messages(&report::read(&report::path(repo, BROKEN_REPORT))?);
    judge_caught(&messages)
}

/// The failure messages of the failed specs in a dra-e2e JSON report.
fn failure_messages(reports: &serde_json::Value) -> Vec<String> {
    report::failed_specs(reports).into_iter().map(|spec| spec.message).collect()
}

/// Passes when exactly one spec failed and its message says every one of [`CAUGHT`].
fn judge_caught(messages: &[String]) -> Result<()> {
    let [message] = messages else {
        bail!("expected the unprepare spec alone to fail, {} spec(s) failed: {messages:?}", messages.len());
    };
    let missing: Vec<_> = CAUGHT.iter().filter(|c| !message.contains(**c)).collect();
    if !missing.is_empty() {
        bail!("the unprepare spec failed, but its message lacks {missing:?}: {message}");
    }
    eprintln!("    caught as it must be: {}", super::clip(message, 600));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_that_names_the_call_and_shows_the_log_counts() {
        let good = "the driver answered NodeUnprepareResources OK, but CDI devices [x] are still defined on node kind-worker\ncalls:\n  /v1.DRAPlugin/NodeUnprepareResources -> OK";
        judge_caught(&[good.to_owned()]).unwrap();
        assert!(judge_caught(&[]).is_err());
        assert!(judge_caught(&["timed out".to_owned()]).is_err());
        assert!(judge_caught(&[good.to_owned(), good.to_owned()]).is_err());
    }

    #[test]
    fn failed_specs_are_read_from_the_json_report() {
        let reports = serde_json::json!([{ "SpecReports": [
            { "State": "passed" },
            { "State": "failed", "Failure": { "Message": "m" } },
            { "State": "skipped" },
        ]}]);
        assert_eq!(failure_messages(&reports), ["m"]);
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
