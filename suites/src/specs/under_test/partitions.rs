//! m: partitionable devices. The driver's slices publish a counter set (`sharedCounters`) and
//! partitions that consume it (`consumesCounters`); [`features::partitions`] finds a kind of
//! partition of which `fit` fit the counter set at once, with more of them published.
//!
//! Two claims for those partitions, one for one and one for `fit - 1`, together use the counter
//! set up: both pods run with their CDI devices, the claims got `fit` distinct partitions of that
//! kind. A third claim for one more partition stays unallocated while partitions of the kind are
//! still free: its pod is unschedulable (the scheduler's message is in the step) and, interposed,
//! the driver is never asked to prepare it. Once the first pod and claim are gone, their counters
//! are free: the third pod runs with a partition of the kind (interposed, prepared only after
//! the first claim was unprepared).

use std::{collections::BTreeSet, sync::Arc};

use harness::framework::{Ctx, Skip, SpecResult, step};
use kube::ResourceExt as _;
use serde_json::json;

use super::{
    Target,
    checks::{expect_pending, expect_unprepared_before},
    features::{self, PartitionPlan},
    pods::{cdi_known, check_running, run_with_claim},
    session::{Session, allocated_ids as got},
};

/// The request for `count` partitions of the plan's kind.
fn request(plan: &PartitionPlan, count: usize) -> serde_json::Value {
    json!({ "count": count, "selectors": plan.pin.selectors() })
}

/// m: see the module documentation.
pub async fn fill(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let plan = features::partitions(&features::of_session(&s).await?).map_err(Skip::because)?;
    let kind = plan.pin.ids();
    step(format!("{} of the partitions {kind:?} fit counter set {} at once", plan.fit, plan.counter_set));
    let first = s.create_claim_with(request(&plan, 1)).await?;
    let second = s.create_claim_with(request(&plan, plan.fit - 1)).await?;
    let one = run_with_claim(&s, &first).await?;
    let two = run_with_claim(&s, &second).await?;
    let (got1, got2) = (got(&one.claim), got(&two.claim));
    let used: BTreeSet<String> = got1.union(&got2).cloned().collect();
    expect!(
        used.len() == plan.fit && used.is_subset(&kind),
        "claims {} and {} asked for {} partitions of {kind:?} and got {got1:?} and {got2:?}",
        one.claim.name_any(),
        two.claim.name_any(),
        plan.fit
    );

    let third = s.create_claim_with(request(&plan, 1)).await?;
    let name = third.name_any();
    let before = s.cdi.devices().await?;
    let used_up = format!("counter set {} is used up by {used:?}", plan.counter_set);
    let (pod, why) = expect_pending(&s, &name, &used_up).await?;
    let free: Vec<&String> = kind.difference(&used).collect();
    step(format!(
        "claim {name} stays unallocated while partitions {free:?} are free; the scheduler says: {why}"
    ));

    s.delete_pod(&one.pod, None).await?;
    s.delete_claim(&first.name_any()).await?;
    let three = check_running(&s, &name, &pod, &before).await?;
    let got3 = got(&three.claim);
    expect!(
        got3.len() == 1 && got3.is_subset(&kind),
        "claim {name} asked for one partition of {kind:?} and got {got3:?}"
    );
    expect_unprepared_before(&s, (&first.name_any(), &one.uid), (&name, &three.uid))?;
    step(format!("once claim {} was gone, claim {name} got {got3:?}", first.name_any()));
    cdi_known(&s, &[&one, &two, &three])
}
