//! Upstream's `kubelet ... on single node with multiple claims allocation`: one node with two
//! devices, a pod that mixes an already prepared claim with a new one (regression test for
//! kubernetes#135901).

use anyhow::Context as _;
use harness::{
    builder::Builder,
    calls::Method,
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
};
use kube::ResourceExt as _;

use super::checks::only_node;

/// Registers the spec (inside the `kubelet ... on single node with multiple claims allocation`
/// context).
pub fn register(r: &mut Registry) {
    r.it("requests an already allocated and a new claim for a pod", already_allocated_and_new_claim);
}

async fn already_allocated_and_new_claim(ctx: Ctx) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    // Two devices, so that two claims can be prepared on the node.
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(2))).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let node = only_node(&driver)?;

    let first = b.external_claim();
    let second = b.external_claim();
    let first_uid = b.create_claim(&first).await?.uid().unwrap_or_default();
    let second_uid = b.create_claim(&second).await?.uid().unwrap_or_default();

    // The first pod uses only the first claim.
    let first_pod = b.pod_external(&first.name_any());
    b.create_pod(&first_pod).await?;
    b.test_pod(&first_pod, &[]).await?;

    // The second pod uses the first claim (already prepared) and the second one (new).
    let (second_pod, _) =
        b.pod_with_claims().claim("first", &first.name_any()).claim("second", &second.name_any()).build();
    b.create_pod(&second_pod).await?;
    b.test_pod(&second_pod, &[]).await?;

    // The kubelet prepared the first claim once, for the first pod, and for the second pod
    // asked the driver only for the new claim.
    let calls = driver.calls(&node);
    calls.expect_count(Method::NodePrepareResources.for_claim_uid(&first_uid), 1)?;
    calls.claim(&first_uid).expect_prepared_once().context("the already prepared claim")?;
    let second_history = calls.claim(&second_uid);
    let call = second_history.first_prepared().context("the second claim was never prepared")?;
    expect!(
        call.record.claims.iter().all(|c| c.uid != first_uid),
        "the call that prepared the new claim also named the already prepared one: #{} {:?}",
        call.id,
        call.record.claims
    );
    let prepared = driver.prepared_claims(&node);
    expect!(prepared.len() == 2, "both claims should be prepared, prepared: {prepared:?}");
    Ok(())
}
