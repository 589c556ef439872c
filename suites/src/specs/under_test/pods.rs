//! The life of one pod with one claim on the node under test: prepared once when it starts
//! (its CDI devices defined on the node and their env in the container), unprepared once when it
//! is deleted, also when force-deleted (their CDI devices gone from the node).

use std::sync::Arc;

use harness::framework::{Ctx, Skip, SpecResult, step};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::ResourceExt as _;

use super::{
    Target,
    cdi::CdiDevices,
    checks::{
        expect_allocated_for, expect_cdi_removed, expect_cdi_visible, expect_not_unprepared,
        expect_unprepared_once, prepared,
    },
    evidence::{Deletion, Prepared, skips, unprepare_evidence},
    session::Session,
};

/// A running pod with its claim, and the CDI devices prepared for it.
pub struct Running {
    /// The pod, running.
    pub pod: Pod,
    /// Its claim, allocated and reserved for it.
    pub claim: ResourceClaim,
    /// The claim's UID.
    pub uid: String,
    /// The CDI devices the driver prepared for the claim, as far as they can be known.
    pub prepared: Prepared,
}

/// Creates a claim and a pod using it, waits until the pod runs and checks the allocation, the
/// prepare (interposed: exactly one, OK, and no unprepare) and the CDI devices, when they can
/// be known.
pub async fn start_pod(s: &Session) -> anyhow::Result<Running> {
    let claim = s.create_claim().await?;
    run_with_claim(s, &claim).await
}

/// [`start_pod`] with a claim the caller created.
pub async fn run_with_claim(s: &Session, claim: &ResourceClaim) -> anyhow::Result<Running> {
    let before = s.cdi.devices().await?;
    let pod = s.create_pod(&claim.name_any(), false).await?;
    check_running(s, &claim.name_any(), &pod, &before).await
}

/// Waits until `pod` (created when the node's CDI devices were `before`) runs and checks its
/// claim `claim` as [`start_pod`] does.
pub async fn check_running(
    s: &Session,
    claim: &str,
    pod: &Pod,
    before: &CdiDevices,
) -> anyhow::Result<Running> {
    let pod = s.wait_running(pod).await?;
    let claim = s.claim(claim).await?;
    expect_allocated_for(s, &claim, &pod)?;
    let uid = claim.uid().unwrap_or_default();
    let now = s.cdi.devices().await?;
    let prepared = prepared(s, &uid, &pod, before, &now)?;
    if prepared.is_known() {
        expect_cdi_visible(s, &pod, &prepared.ids, &now).await?;
    }
    if let Some(calls) = s.calls() {
        expect_not_unprepared(s, calls, &uid, "while its pod runs")?;
    }
    Ok(Running { pod, claim, uid, prepared })
}

/// Skips, saying why, when the CDI devices prepared for a running claim cannot be known: a spec
/// that checked everything else still cannot say that the driver's devices reached the pods.
pub fn cdi_known(s: &Session, running: &[&Running]) -> SpecResult {
    for r in running {
        if let Some(why) = r.prepared.unknown_because(&s.target.driver, &r.claim.name_any(), &s.node) {
            return Err(Skip::because(why));
        }
    }
    Ok(())
}

/// b: a pod with a claim from the class runs with the driver's devices, prepared once
/// (interposed); skipped when the CDI devices prepared for it cannot be known.
pub async fn prepares(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let running = start_pod(&s).await?;
    cdi_known(&s, &[&running])
}

/// c: deleting the pod unprepares its claim (interposed: once) and removes its CDI devices.
pub async fn unprepares(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let running = start_pod(&s).await?;
    let evidence = unprepare(&s, &running, Deletion::Graceful).await?;
    s.wait_unreserved(&running.claim.name_any()).await?;
    step(format!("claim {} was unprepared, shown by: {}", running.claim.name_any(), evidence.join("; ")));
    Ok(())
}

/// e: force-deleting the pod (grace period 0) still unprepares its claim.
pub async fn force_deleted(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let running = start_pod(&s).await?;
    let evidence = unprepare(&s, &running, Deletion::Forced).await?;
    step(format!("claim {} was unprepared, shown by: {}", running.claim.name_any(), evidence.join("; ")));
    Ok(())
}

/// Deletes the running pod as `deletion` says and checks that its claim was unprepared, on the
/// evidence there is (decided before the pod is deleted; none is a skip naming `--interpose`).
/// Returns the evidence, one sentence each.
pub async fn unprepare(s: &Session, running: &Running, deletion: Deletion) -> SpecResult<Vec<String>> {
    unprepare_pod(s, &running.pod, &running.claim, &running.uid, &running.prepared, deletion).await
}

/// [`unprepare`] for `pod`, the last pod of `claim`.
pub async fn unprepare_pod(
    s: &Session,
    pod: &Pod,
    claim: &ResourceClaim,
    uid: &str,
    prepared: &Prepared,
    deletion: Deletion,
) -> SpecResult<Vec<String>> {
    let skips_unprepare = skips(claim, "NodeUnprepareResources");
    let evidence = unprepare_evidence(s.calls().is_some(), deletion, &prepared.per_claim, skips_unprepare)
        .map_err(Skip::because)?;
    let grace = match deletion {
        Deletion::Graceful => None,
        Deletion::Forced => Some(0),
    };
    s.delete_pod(pod, grace).await?;
    if let Some(calls) = s.calls() {
        expect_unprepared_once(s, calls, uid).await?;
    }
    expect_cdi_removed(s, &prepared.per_claim).await?;
    Ok(evidence)
}
