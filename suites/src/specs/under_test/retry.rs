//! l: the driver's per-claim error keeps the pod from running, and the kubelet calls again.
//! Interposed only (without the interposer nothing can make the driver fail): the interposer's
//! per-claim fault ([`Calls::fail_claim_next`](harness::calls::Calls::fail_claim_next), the one
//! fault API) answers the claim's first NodePrepareResources with a per-claim `error` in place of
//! the driver, which never sees that call. The kubelet (v1.37.2) then records the event
//! `FailedPrepareDynamicResources` quoting the claim and the error (pkg/kubelet/cm/dra/
//! manager.go:435-436, kuberuntime/kuberuntime_manager.go:1720-1728), creates no sandbox, and
//! prepares again at the pod's next sync (`syncFrequency` plus up to 50 %, pod_workers.go:
//! 1529-1531): that call reaches the driver, and the pod runs with its claim's CDI devices.

use std::{sync::Arc, time::Duration};

use harness::{
    builder::{POD_START_TIMEOUT, phase},
    calls::Method,
    driver::INJECTED_CLAIM_ERROR,
    framework::{Ctx, Precheck, SpecError, SpecResult, step},
    wait::{self, Verdict},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt as _, runtime::watcher};

use super::{
    super::kubelet::checks::{started, wait_event},
    Target,
    checks::{expect_allocated_for, expect_cdi_visible},
    session::Session,
};

/// The kubelet's event reason when preparing a pod's claims fails.
const FAILED_PREPARE: &str = "FailedPrepareDynamicResources";
/// The longest the kubelet waits before it syncs a pod again after a failed prepare: the default
/// `syncFrequency` (1 min) plus 50 % jitter.
const PREPARE_RETRY: Duration = Duration::from_secs(90);

/// The spec's timeout: its waits for the event and for the retry (the kubelet's sync period
/// plus jitter) can take longer than the default ten minutes on a slow node.
pub const TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Skips unless the run interposes.
pub async fn require_interposer(_pre: Precheck, interpose: bool) -> SpecResult {
    if interpose {
        Ok(())
    } else {
        Err(SpecError::skip(
            "needs --interpose: only the interposer can make the driver's NodePrepareResources fail for a claim",
        ))
    }
}

/// l: see the module documentation.
pub async fn retried(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let Some(calls) = s.calls().cloned() else {
        return Err(SpecError::skip("needs --interpose: the run does not interpose"));
    };
    let claim = s.create_claim().await?;
    let (name, uid) = (claim.name_any(), claim.uid().unwrap_or_default());
    let prepare = Method::NodePrepareResources.for_claim_uid(&uid);
    let _fault = calls.fail_claim_next(prepare.clone(), 1, INJECTED_CLAIM_ERROR);
    let pod = s.create_pod(&name, false).await?;
    let pod_name = pod.name_any();

    let message = format!("NodePrepareResources failed for ResourceClaim {name}: {INJECTED_CLAIM_ERROR}");
    wait_event(&ctx, &pod_name, FAILED_PREPARE, &message, POD_START_TIMEOUT)
        .await
        .map_err(|e| anyhow::anyhow!("{e}{}", s.call_log()))?;
    step(format!("the kubelet reported {FAILED_PREPARE} for pod {pod_name}: {message}"));

    // No container starts before the claim is prepared: every state of the pod seen until it
    // runs is checked against the call log read after it.
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let watched = calls.clone();
    let watched_uid = uid.clone();
    wait::objects(
        &pods,
        watcher::Config::default().fields(&format!("metadata.name={pod_name}")),
        format!("pod {pod_name} to run, not before claim {name} is prepared"),
        POD_START_TIMEOUT + PREPARE_RETRY,
        |seen: &[Pod]| {
            let Some(p) = seen.first() else { return Verdict::Fail(format!("pod {pod_name} is gone")) };
            let history = watched.claim(&watched_uid);
            if started(p) && history.prepared() == 0 {
                return Verdict::Fail(format!(
                    "pod {pod_name} started although the prepare of its claim failed: {history}"
                ));
            }
            match phase(p) {
                "Running" => Verdict::Done,
                "Succeeded" | "Failed" => Verdict::Fail(format!("pod {pod_name} terminated: {}", phase(p))),
                _ => Verdict::Pending,
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}{}", s.call_log()))?;

    // Exactly: the injected failure first, then one successful prepare that reached the driver.
    let log = calls.log();
    log.expect_first(prepare.clone().injected())?;
    log.expect_count(prepare.clone().injected(), 1)?;
    log.expect_last(prepare.clone().succeeded())?;
    let history = log.claim(&uid);
    history.expect_prepared_once()?;
    let running = s.pod(&pod_name).await?;
    let claim = s.claim(&name).await?;
    expect_allocated_for(&s, &claim, &running)?;
    let returned: Vec<String> = history
        .first_prepared()
        .map(|c| c.devices.iter().flat_map(|(_, _, ids)| ids.clone()).collect())
        .unwrap_or_default();
    expect_cdi_visible(&s, &running, &returned, &s.cdi.devices().await?).await?;
    step(format!("claim {name}: prepare failed (injected) and succeeded on the kubelet's retry: {history}"));
    Ok(())
}
