//! The life of one pod with one claim on the node under test: prepared once when it starts
//! (its CDI devices defined on the node and their env in the container), unprepared once when it
//! is deleted, also when force-deleted (their CDI devices gone from the node).

use std::sync::Arc;

use harness::framework::{Ctx, SpecResult};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::ResourceExt as _;

use super::{
    Target,
    checks::{
        expect_allocated_for, expect_cdi_removed, expect_cdi_visible, expect_not_unprepared,
        expect_unprepared_once, prepared_ids,
    },
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
    /// The CDI device IDs the driver prepared for the claim.
    pub ids: Vec<String>,
}

/// Creates a claim and a pod using it, waits until the pod runs and checks the allocation, the
/// prepare (interposed: exactly one, OK, and no unprepare) and the CDI devices.
pub async fn start_pod(s: &Session) -> anyhow::Result<Running> {
    let claim = s.create_claim().await?;
    let before = s.cdi.devices().await?;
    let pod = s.create_pod(&claim.name_any(), false).await?;
    let pod = s.wait_running(&pod).await?;
    let claim = s.claim(&claim.name_any()).await?;
    expect_allocated_for(s, &claim, &pod)?;
    let uid = claim.uid().unwrap_or_default();
    let now = s.cdi.devices().await?;
    let ids = prepared_ids(s, &uid, &before, &now)?;
    expect_cdi_visible(s, &pod, &ids, &now).await?;
    expect_not_unprepared(s, &uid, "while its pod runs")?;
    Ok(Running { pod, claim, uid, ids })
}

/// b: a pod with a claim from the class runs with the driver's devices, prepared once.
pub async fn prepares(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    start_pod(&s).await?;
    Ok(())
}

/// c: deleting the pod unprepares its claim once and removes its CDI devices.
pub async fn unprepares(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let running = start_pod(&s).await?;
    s.delete_pod(&running.pod, None).await?;
    expect_unprepared_once(&s, &running.uid).await?;
    expect_cdi_removed(&s, &running.ids).await?;
    s.wait_unreserved(&running.claim.name_any()).await?;
    Ok(())
}

/// e: force-deleting the pod (grace period 0) still unprepares its claim.
pub async fn force_deleted(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let running = start_pod(&s).await?;
    s.delete_pod(&running.pod, Some(0)).await?;
    expect_unprepared_once(&s, &running.uid).await?;
    expect_cdi_removed(&s, &running.ids).await?;
    Ok(())
}
