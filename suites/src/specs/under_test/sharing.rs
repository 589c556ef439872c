//! n: consumable capacity. The driver's slices publish a device that allows multiple
//! allocations (`allowMultipleAllocations`) with a capacity that has a request policy;
//! [`features::sharing`] finds one that its attributes single out, and the smallest amount its
//! policy accepts, of which two fit.
//!
//! Two claims ask for that device with that amount of the capacity each (`capacity.requests`):
//! both pods run, at once, with their CDI devices; each claim's allocation is that device, carries
//! `consumedCapacity` of at least the amount requested (the policy may round up) and a `shareID`
//! of its own.

use std::sync::Arc;

use harness::{
    builder::allocation_results,
    framework::{Ctx, Skip, SpecResult, step},
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt as _;
use serde_json::json;

use super::{
    Target,
    features::{self, SharePlan},
    pods::{cdi_known, run_with_claim},
    session::Session,
};
use crate::specs::node_allocatable::cgroups::milli;

/// The share of the device a claim got: its share ID and the capacity it consumed (as published).
fn share(claim: &ResourceClaim, plan: &SharePlan) -> anyhow::Result<(String, String)> {
    let name = claim.name_any();
    let results = allocation_results(claim);
    let [result] = results else {
        anyhow::bail!("claim {name} has {} allocation results, expected one: {results:?}", results.len());
    };
    let device = format!("{}/{}", result.pool, result.device);
    anyhow::ensure!(device == plan.device, "claim {name} got device {device}, not {}", plan.device);
    let consumed = result.consumed_capacity.as_ref().and_then(|c| c.get(&plan.capacity)).map(|q| q.0.clone());
    let Some(consumed) = consumed else {
        anyhow::bail!(
            "the allocation of claim {name} has no consumedCapacity of {} (it requested {}): {result:?}",
            plan.capacity,
            plan.amount
        );
    };
    anyhow::ensure!(
        milli(&consumed)? >= plan.amount_milli,
        "claim {name} requested {} of {} and its allocation consumed {consumed}",
        plan.amount,
        plan.capacity
    );
    let share_id = result.share_id.clone().filter(|id| !id.is_empty());
    let Some(share_id) = share_id else {
        anyhow::bail!(
            "the allocation of claim {name} on the shared device {device} has no shareID: {result:?}"
        );
    };
    Ok((share_id, consumed))
}

/// n: see the module documentation.
pub async fn share_capacity(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let plan = features::sharing(&features::of_session(&s).await?).map_err(Skip::because)?;
    step(format!(
        "device {} is shared: two claims ask for {} of its {} each",
        plan.device, plan.amount, plan.capacity
    ));
    let request = json!({
        "selectors": plan.pin.selectors(),
        "capacity": { "requests": { plan.capacity.clone(): plan.amount } },
    });
    let first = s.create_claim_with(request.clone()).await?;
    let second = s.create_claim_with(request).await?;
    let one = run_with_claim(&s, &first).await?;
    let two = run_with_claim(&s, &second).await?;
    let (id1, consumed1) = share(&one.claim, &plan)?;
    let (id2, consumed2) = share(&two.claim, &plan)?;
    expect!(
        id1 != id2,
        "claims {} and {} got the same shareID {id1} of device {}",
        one.claim.name_any(),
        two.claim.name_any(),
        plan.device
    );
    step(format!(
        "claims {} and {} share device {}: shareIDs {id1} and {id2}, consumed {consumed1} and {consumed2} of {}",
        one.claim.name_any(),
        two.claim.name_any(),
        plan.device,
        plan.capacity
    ));
    cdi_known(&s, &[&one, &two])
}
