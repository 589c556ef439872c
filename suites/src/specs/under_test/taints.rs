//! o: device taints. The driver's slices publish devices with a `NoSchedule` or `NoExecute`
//! taint; [`features::taints`] finds a kind of them (same attributes, all tainted) that a claim
//! can ask for without getting an untainted device, or all devices when every one is tainted.
//!
//! A claim for such a device without a toleration is not allocated: its pod is unschedulable
//! (the scheduler's message is in the step) and, interposed, the driver is never asked to
//! prepare it. The same claim with a toleration of each taint (key and effect, `Exists`) is
//! allocated a tainted device of that kind, the allocation carries the tolerations, and its pod
//! runs with the claim's CDI devices. The first pod is still unschedulable then.

use std::sync::Arc;

use harness::{
    builder::allocation_results,
    framework::{Ctx, Skip, SpecResult, step},
};
use kube::ResourceExt as _;
use serde_json::json;

use super::{
    Target,
    checks::expect_pending,
    features,
    pods::{cdi_known, run_with_claim},
    session::{Session, allocated_ids as got},
};

/// o: see the module documentation.
pub async fn tolerated(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let plan = features::taints(&features::of_session(&s).await?).map_err(Skip::because)?;
    let kind = plan.pin.ids();
    let taints: Vec<String> =
        plan.taints.iter().map(|t| format!("{}={}:{}", t.key, t.value, t.effect)).collect();
    step(format!("devices {kind:?} are tainted {taints:?}"));

    let untolerated = s.create_claim_with(json!({ "selectors": plan.pin.selectors() })).await?;
    let name = untolerated.name_any();
    let tainted = format!("it tolerates no taint and the devices {kind:?} are tainted");
    let (pending, why) = expect_pending(&s, &name, &tainted).await?;
    step(format!("claim {name}, without a toleration, stays unallocated; the scheduler says: {why}"));

    let tolerations = plan.tolerations();
    let claim =
        s.create_claim_with(json!({ "selectors": plan.pin.selectors(), "tolerations": tolerations })).await?;
    let running = run_with_claim(&s, &claim).await?;
    let devices = got(&running.claim);
    expect!(
        !devices.is_empty() && devices.is_subset(&kind),
        "claim {} tolerates {taints:?} and got {devices:?}, not devices of {kind:?}",
        running.claim.name_any()
    );
    let results = allocation_results(&running.claim);
    let carried = results.iter().all(|r| r.tolerations.as_ref().is_some_and(|t| !t.is_empty()));
    expect!(
        carried,
        "the allocation of claim {} carries no tolerations: {results:?}",
        running.claim.name_any()
    );
    s.wait_unschedulable(&pending).await?;
    step(format!(
        "claim {}, with tolerations {tolerations}, got {devices:?}; claim {name} is still unallocated",
        running.claim.name_any()
    ));
    cdi_known(&s, &[&running])
}
