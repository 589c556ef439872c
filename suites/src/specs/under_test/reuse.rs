//! i: a device is used again: pod 1 with claim 1 runs and goes, claim 1 goes, then pod 2 with a
//! new claim 2 runs on the same node. When the driver offers one device on the node, claim 2
//! must get the very device claim 1 had; with more, the scheduler may pick any, and the step
//! names which it got. Interposed, claim 1 was unprepared (once) before claim 2 was first
//! prepared.

use std::sync::Arc;

use harness::framework::{Ctx, SpecResult, step};
use kube::ResourceExt as _;

use super::{
    Target,
    checks::expect_unprepared_before,
    evidence::Deletion,
    pods::{start_pod, unprepare},
    session::{Session, allocated_devices},
};

/// i: see the module documentation.
pub async fn reuses(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let offered = s.node_devices().await?;
    let first = start_pod(&s).await?;
    let first_devices = allocated_devices(&first.claim);
    let evidence = unprepare(&s, &first, Deletion::Graceful).await?;
    s.delete_claim(&first.claim.name_any()).await?;
    step(format!(
        "pod {} and claim {} are gone, the claim unprepared, shown by: {}",
        first.pod.name_any(),
        first.claim.name_any(),
        evidence.join("; ")
    ));

    let second = start_pod(&s).await?;
    let second_devices = allocated_devices(&second.claim);
    let same = first_devices == second_devices;
    if offered.len() == 1 {
        expect!(
            same,
            "driver {} offers one device on node {} ({offered:?}), claim {} had {first_devices:?}, but claim {} got \
             {second_devices:?}",
            target.driver,
            s.node,
            first.claim.name_any(),
            second.claim.name_any()
        );
    }
    step(format!(
        "claim {} got {second_devices:?}, {} than claim {} (the driver offers {} device(s) on node {})",
        second.claim.name_any(),
        if same { "the same device(s)" } else { "other device(s)" },
        first.claim.name_any(),
        offered.len(),
        s.node
    ));

    let (gone, new) = (first.claim.name_any(), second.claim.name_any());
    expect_unprepared_before(&s, (&gone, &first.uid), (&new, &second.uid))?;
    Ok(())
}
