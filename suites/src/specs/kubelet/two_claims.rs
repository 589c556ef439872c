//! A spec of our own (no upstream counterpart), and the guide's example of one
//! (suites/README.md, "A spec of your own", shows it verbatim): a pod with two claims whose first
//! `NodePrepareResources` fails. The kubelet batches a pod's claims per driver in one call
//! (pkg/kubelet/cm/dra/manager.go of v1.37.2), marks none of them prepared when the call fails,
//! and calls again at the pod's next sync; so each claim is prepared successfully exactly once,
//! nothing is unprepared while the pod runs, and each claim is unprepared exactly once after the
//! pod is gone.

use harness::prelude::*;

// guide:begin two_claims
/// Registers the spec (inside `kubelet` > `two claims in one pod`).
pub fn register(r: &mut Registry) {
    r.it(
        "are prepared once after a failed NodePrepareResources and unprepared once after the pod is deleted",
        prepared_and_unprepared_once,
    );
}

async fn prepared_and_unprepared_once(ctx: Ctx) -> SpecResult {
    // One node; a driver with ten network-attached devices, registered with its kubelet; a
    // DeviceClass. All of it goes away when the spec ends, passed or failed.
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::network(10, false))).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let node = &nodes.names()[0];
    let calls = driver.calls(node);

    // Two claims, and a pod whose container uses both.
    let first = b.create_claim(&b.external_claim()).await?;
    let second = b.create_claim(&b.external_claim()).await?;
    let (pod, _) =
        b.pod_with_claims().claim("first", &first.name_any()).claim("second", &second.name_any()).build();

    // The first NodePrepareResources fails; the kubelet calls again at the pod's next sync.
    let _first_fails = driver.fail_next(node, Method::NodePrepareResources, 1);
    let created = calls.mark();
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[]).await?;
    calls.expect_count(Method::NodePrepareResources.injected(), 1)?;
    calls.expect_first(Method::NodePrepareResources.injected())?;
    let uids = b.pod_claim_uids(&running).await?;
    for uid in uids.values() {
        calls.claim(uid).expect_prepared_once()?;
    }

    // Nothing unprepared while the pod ran; each claim unprepared once after it is gone.
    calls.since(created).expect_none(Method::NodeUnprepareResources)?;
    b.delete_pod_and_wait(&running).await?;
    for uid in uids.values() {
        calls.wait_unprepared(uid, UNPREPARE_TIMEOUT).await?.expect_unprepared_once()?;
    }
    Ok(())
}
// guide:end
