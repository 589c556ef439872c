//! Claims beyond one pod: a claim shared by two pods (prepared once, unprepared once after the
//! last pod; the second pod is created once the first runs, because the kubelet marks a claim
//! prepared only when its NodePrepareResources returned, so a pod that starts while that call is
//! in flight gets a second call for the same claim, which the driver must answer the same way),
//! and a claim not reserved for a pod (upstream's "must not run a pod if a claim is
//! not ready": the pod is bound to the node past the scheduler, so nobody allocates or reserves
//! its claim, and the kubelet must neither run it nor prepare the claim).

use std::{sync::Arc, time::Duration};

use harness::{
    builder::phase,
    framework::{Ctx, Skip, SpecResult, step},
    wait::{self, Attempt},
};
use kube::ResourceExt as _;

use super::{
    Target,
    checks::{claim_calls, expect_allocated_for, expect_cdi_visible, expect_not_unprepared, prepared},
    evidence::{Deletion, still_prepared_evidence},
    pods::unprepare_pod,
    session::{CONSISTENTLY, Session, allocated_devices, reserved_for},
};

/// How long after the first pod is gone the claim must stay prepared for the second.
const SETTLE: Duration = Duration::from_secs(10);

/// d: two pods share a claim: one prepare (the second pod starts on the prepared claim), and one
/// unprepare only after the second pod is gone. Without the interposer, whether the claim stayed
/// prepared after the first pod shows only in CDI devices written for the claim: without them
/// the spec skips, naming `--interpose`.
pub async fn shared(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let claim = s.create_claim().await?;
    let name = claim.name_any();
    let before = s.cdi.devices().await?;
    let first = s.create_pod(&name, false).await?;
    let first = s.wait_running(&first).await?;
    let second = s.create_pod(&name, false).await?;
    let second = s.wait_running(&second).await?;
    let claim = s.claim(&name).await?;
    expect_allocated_for(&s, &claim, &first)?;
    expect_allocated_for(&s, &claim, &second)?;
    let uid = claim.uid().unwrap_or_default();
    let now = s.cdi.devices().await?;
    let prepared = prepared(&s, &uid, &first, &before, &now)?;
    let stays = still_prepared_evidence(s.calls().is_some(), &prepared.per_claim).map_err(Skip::because)?;
    expect_cdi_visible(&s, &first, &prepared.ids, &now).await?;
    expect_cdi_visible(&s, &second, &prepared.ids, &now).await?;

    s.delete_pod(&first, None).await?;
    tokio::time::sleep(SETTLE).await;
    if let Some(calls) = s.calls() {
        expect_not_unprepared(&s, calls, &uid, "while its second pod still runs")?;
    }
    let now = s.cdi.devices().await?;
    expect_cdi_visible(&s, &second, &prepared.ids, &now).await?;
    step(format!("claim {name} stayed prepared after its first pod was gone, shown by: {stays}"));

    let evidence = unprepare_pod(&s, &second, &claim, &uid, &prepared, Deletion::Graceful).await?;
    step(format!("claim {name} was unprepared after its last pod, shown by: {}", evidence.join("; ")));
    Ok(())
}

/// f: a pod bound to the node whose claim is reserved for nobody never runs, and its claim is
/// never prepared.
pub async fn not_reserved(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let claim = s.create_claim().await?;
    let name = claim.name_any();
    let pod = s.create_pod(&name, true).await?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(ctx.client().clone(), ctx.namespace());
    let pod_name = pod.name_any();
    let what = format!("pod {pod_name} to leave Pending (it must not, for {CONSISTENTLY:?})");
    let left = wait::poll(what, CONSISTENTLY, Duration::from_secs(1), || async {
        match pods.get(&pod_name).await {
            Ok(p) if phase(&p) != "Pending" => Attempt::Done(phase(&p).to_owned()),
            Ok(_) => Attempt::Retry("Pending".to_owned()),
            Err(e) => Attempt::Retry(format!("reading the pod: {e}")),
        }
    })
    .await;
    if let Ok(phase) = left {
        fail!("pod {pod_name} went {phase} although its claim {name} is reserved for no pod{}", s.call_log());
    }
    let claim = s.claim(&name).await?;
    expect!(
        reserved_for(&claim).is_empty() && allocated_devices(&claim).is_empty(),
        "claim {name} got allocated or reserved ({:?}) although no scheduler saw its pod",
        claim.status
    );
    if let Some(history) = claim_calls(&s, &claim.uid().unwrap_or_default()) {
        expect!(
            history.calls.is_empty(),
            "the kubelet called the driver for claim {name}, which is reserved for no pod:\n{history}{}",
            s.call_log()
        );
    }
    Ok(())
}
