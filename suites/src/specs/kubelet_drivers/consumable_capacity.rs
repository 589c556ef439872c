//! Upstream's `consumableCapacityTests` (`kubelet ... [FeatureGate:DRAConsumableCapacity]`): one
//! node with a single device `consumable-device-1` that allows multiple allocations and has 8Gi of
//! consumable `memory` (request policy: default 1Gi, at least 1Gi). Claims of 4Gi, 8Gi and 4Gi:
//! the first and third share the device, the second must wait until both are gone.
//!
//! Beyond upstream, the spec checks each allocation (the device, the capacity it consumed, a share
//! ID of its own), that the scheduler reports the 8Gi pod unschedulable before watching it stay
//! pending for upstream's 20 s, that its claim stays unallocated and the kubelet is never asked
//! to prepare it meanwhile, that the kubelet unprepares the first and third claim after their
//! pods are deleted, and that it prepares the second claim only after that deletion.

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use harness::{
    builder::{Builder, allocation_results, is_allocated, node_name, phase},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
};
use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{Device, ResourceClaim},
};
use kube::{ResourceExt as _, runtime::watcher};
use serde_json::json;

use super::gates;
use crate::specs::{
    LONG_PRIORITY,
    kubelet::checks::{self, stays},
};

/// The device.
const DEVICE: &str = "consumable-device-1";
/// How long the 8Gi pod must stay pending (upstream: 20 s `Consistently`).
const STAYS_PENDING: Duration = Duration::from_secs(20);

/// Registers the spec (inside `kubelet [Feature:DynamicResourceAllocation]
/// [FeatureGate:DRAConsumableCapacity]`).
pub fn register(r: &mut Registry) {
    r.it("must allow multiple allocations and consume capacity", consume_capacity)
        .label("KubeletMinVersion:1.34")
        .priority(LONG_PRIORITY)
        .requires(gates::api_server_requirement(
            "DRAConsumableCapacity",
            "it drops allowMultipleAllocations and capacity requests",
        ));
}

/// The shareable device with 8Gi of consumable memory.
fn consumable_device() -> anyhow::Result<Device> {
    Ok(serde_json::from_value(json!({
        "name": DEVICE,
        "allowMultipleAllocations": true,
        "capacity": { "memory": {
            "value": "8Gi",
            "requestPolicy": { "default": "1Gi", "validRange": { "min": "1Gi" } },
        } },
    }))?)
}

/// An external claim of the builder that requests `memory` of the device's capacity.
fn claim_with_memory(b: &Builder, memory: &str) -> anyhow::Result<ResourceClaim> {
    let mut claim = b.external_claim();
    let request = claim
        .spec
        .as_mut()
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
        .context("external claim without an exact request")?;
    request.capacity = Some(serde_json::from_value(json!({ "requests": { "memory": memory } }))?);
    Ok(claim)
}

/// Checks that the claim got the device with `memory` consumed and returns its share ID.
fn check_share(claim: &ResourceClaim, driver: &str, memory: &str) -> anyhow::Result<String> {
    let name = claim.name_any();
    let results = allocation_results(claim);
    let [result] = results else {
        anyhow::bail!("claim {name} has {} allocation results, expected one: {results:?}", results.len());
    };
    let consumed = result.consumed_capacity.as_ref().and_then(|c| c.get("memory")).map(|q| q.0.as_str());
    anyhow::ensure!(
        result.driver == driver && result.device == DEVICE && consumed == Some(memory),
        "claim {name} got device {}/{} consuming memory {consumed:?}, expected {driver}/{DEVICE} consuming {memory}",
        result.driver,
        result.device
    );
    result
        .share_id
        .clone()
        .filter(|id| !id.is_empty())
        .with_context(|| format!("the allocation of claim {name} has no share ID: {result:?}"))
}

async fn consume_capacity(ctx: Ctx) -> SpecResult {
    // Its `KubeletMinVersion:1.34` label and the gate are decided before anything is created.
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let resources = resources::partitionable(Vec::new(), vec![consumable_device()?]);
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources)).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let node = nodes.names().first().cloned().context("no node selected")?;
    let calls = driver.calls(&node);

    // The first pod gets 4Gi of the device.
    let claim1 = claim_with_memory(&b, "4Gi")?;
    let pod1 = b.pod_external(&claim1.name_any());
    b.create_claim(&claim1).await?;
    b.create_pod(&pod1).await?;
    b.test_pod(&pod1, &[]).await?;

    // The second wants all 8Gi, the third the remaining 4Gi.
    let claim2 = claim_with_memory(&b, "8Gi")?;
    let pod2 = b.pod_external(&claim2.name_any());
    let uid2 = b.create_claim(&claim2).await?.uid().unwrap_or_default();
    b.create_pod(&pod2).await?;
    let claim3 = claim_with_memory(&b, "4Gi")?;
    let pod3 = b.pod_external(&claim3.name_any());
    b.create_claim(&claim3).await?;
    b.create_pod(&pod3).await?;
    let running3 = b.test_pod(&pod3, &[]).await?;
    expect!(
        node_name(&running3) == Some(node.as_str()),
        "pod {} runs on {:?}, not on the driver's node {node}",
        pod3.name_any(),
        node_name(&running3)
    );

    // The device is shared: one allocation each, with its own share ID.
    let claims = checks::claims(&ctx);
    let stored1 = claims.get(&claim1.name_any()).await?;
    let stored3 = claims.get(&claim3.name_any()).await?;
    let share1 = check_share(&stored1, driver.name(), "4Gi")?;
    let share3 = check_share(&stored3, driver.name(), "4Gi")?;
    expect!(share1 != share3, "claims 1 and 3 got the same share ID {share1} of {DEVICE}");

    // The 8Gi pod cannot be scheduled while 8Gi are consumed, and stays pending.
    b.wait_unschedulable(&pod2).await?;
    let pod2_name = pod2.name_any();
    stays(
        &checks::pods(&ctx),
        watcher::Config::default().fields(&format!("metadata.name={pod2_name}")),
        &format!("pod {pod2_name} to stay Pending"),
        STAYS_PENDING,
        |pods: &[Pod]| match pods.first() {
            None => Some(format!("pod {pod2_name} is gone")),
            Some(p) if phase(p) != "Pending" => Some(format!("pod {pod2_name} has phase {}", phase(p))),
            Some(p) if node_name(p).is_some() => Some(format!("pod {pod2_name} got scheduled")),
            Some(_) => None,
        },
    )
    .await?;
    let stored2 = claims.get(&claim2.name_any()).await?;
    expect!(!is_allocated(&stored2), "claim {} got allocated although 8Gi are consumed", claim2.name_any());
    calls
        .expect_none(Method::NodePrepareResources.for_claim_uid(uid2.clone()))
        .context("the 8Gi claim cannot be allocated yet")?;

    // Deleting the first and third pod frees the capacity.
    let deleted_at = SystemTime::now();
    b.delete_pod_and_wait(&pod1).await?;
    b.delete_pod_and_wait(&pod3).await?;
    for claim in [&stored1, &stored3] {
        calls.wait_unprepared(&claim.uid().unwrap_or_default(), UNPREPARE_TIMEOUT).await?;
    }
    b.test_pod(&pod2, &[]).await?;
    let stored2 = claims.get(&claim2.name_any()).await?;
    check_share(&stored2, driver.name(), "8Gi")?;
    let history = calls.claim(&uid2);
    let first = history.first_prepared().context("the 8Gi claim was never prepared")?;
    expect!(
        first.record.started >= deleted_at,
        "the 8Gi claim was prepared (#{}) before the other pods were deleted: {history}",
        first.id
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_shareable_with_a_request_policy() {
        let device = consumable_device().unwrap_or_default();
        assert_eq!(device.allow_multiple_allocations, Some(true));
        let memory = &device.capacity.unwrap_or_default()["memory"];
        assert_eq!(memory.value.0, "8Gi");
        let policy = memory.request_policy.clone().unwrap_or_default();
        assert_eq!(policy.default.map(|q| q.0).as_deref(), Some("1Gi"));
        assert_eq!(policy.valid_range.map(|r| r.min.0).as_deref(), Some("1Gi"));
    }
}
