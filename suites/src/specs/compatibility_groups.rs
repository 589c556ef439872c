//! `[sig-node] [DRA] [FeatureGate:DRADeviceCompatibilityGroups] device compatibility groups ...`:
//! upstream's test/e2e/dra/compatibility_groups.go (Kubernetes v1.37). One node, a driver
//! registered with its kubelet, counter set `gpu` (`mem: 2`) and two devices that consume
//! `mem: 1` each and name a compatibility group on that consumption. The counters leave room for
//! both devices; only the groups decide whether they can be allocated at the same time.
//!
//! Beyond upstream, both specs first check that the API server kept the compatibility groups in
//! the published slice (it drops them when the gate is off, and the specs then skip with that
//! reason), check which device each claim got, and check from the call log that the kubelet
//! prepared each running pod's claim with exactly that device. The incompatible spec also checks
//! that the second claim stays unallocated and the kubelet is never asked to prepare it, and then
//! that it runs once the first pod is deleted and the kubelet unprepared the first claim: the
//! first device, not a shortage, kept it out.

use anyhow::Context as _;
use harness::{
    builder::{Builder, allocation_results, is_allocated},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Label, Registry, SpecResult},
};
use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourceClaim};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use super::kubelet_drivers::gates;

/// The counter set both devices consume from.
const COUNTER_SET: &str = "gpu";

/// Upstream's `framework.WithLabel("DRA")` and `framework.WithFeatureGate(
/// features.DRADeviceCompatibilityGroups)`.
const LABELS: [Label; 2] = [Label::new("DRA"), Label::gate("DRADeviceCompatibilityGroups")];

/// Registers the specs under `[sig-node]`.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", LABELS, |r| {
        r.context("device compatibility groups", |r| {
            r.requires(gates::api_server_requirement(
                "DRADeviceCompatibilityGroups",
                "it drops compatibilityGroups",
            ));
            r.context("incompatible devices", |r| {
                r.it("leave a pod requesting an incompatible device unschedulable", incompatible);
            });
            r.context("compatible devices", |r| {
                r.it("schedule two pods that share a compatibility group", compatible);
            });
        });
    });
}

/// Counter set [`COUNTER_SET`] with room for two devices.
fn counters() -> anyhow::Result<Vec<CounterSet>> {
    Ok(serde_json::from_value(json!([{ "name": COUNTER_SET, "counters": { "mem": { "value": "2" } } }]))?)
}

/// A device that consumes half of the counter set, in compatibility group `group`.
fn device(name: &str, group: &str) -> anyhow::Result<Device> {
    Ok(serde_json::from_value(json!({
        "name": name,
        "consumesCounters": [{
            "counterSet": COUNTER_SET,
            "counters": { "mem": { "value": "1" } },
            "compatibilityGroups": [group],
        }],
    }))?)
}

/// One node, the driver with the two devices, its builder; skips unless the API server kept the
/// compatibility groups (the gate reported off skipped the spec before this; when the API server
/// does not report it, only the stored slices tell).
async fn setup(ctx: &Ctx, devices: Vec<Device>) -> SpecResult<(Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver =
        Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::partitionable(counters()?, devices)))
            .await?;
    let slices = driver.slices().await?;
    let groups: Vec<Vec<String>> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .flat_map(|d| d.consumes_counters.iter().flatten())
        .map(|c| c.compatibility_groups.clone().unwrap_or_default())
        .collect();
    if groups.is_empty() || groups.iter().any(Vec::is_empty) {
        return Err(ctx.skip(format!(
            "the API server dropped the compatibility groups from the driver's ResourceSlices (groups stored: {groups:?}): feature gate DRADeviceCompatibilityGroups is off"
        )));
    }
    let b = Builder::start(ctx, &driver, None).await?;
    Ok((driver, b))
}

/// The one device allocated to the claim.
fn device_of(claim: &ResourceClaim) -> anyhow::Result<String> {
    match allocation_results(claim) {
        [result] => Ok(result.device.clone()),
        results => {
            anyhow::bail!("claim {} has allocation results {results:?}, expected one", claim.name_any())
        }
    }
}

fn claims(ctx: &Ctx) -> Api<ResourceClaim> {
    Api::namespaced(ctx.client().clone(), ctx.namespace())
}

async fn incompatible(ctx: Ctx) -> SpecResult {
    let (driver, b) = setup(&ctx, vec![device("gpu-mig", "mig")?, device("gpu-vgpu", "vgpu")?]).await?;
    let node = driver.node_names().first().cloned().context("the driver runs on no node")?;
    let calls = driver.calls(&node);

    // The first pod takes one of the two devices.
    let claim1 = b.external_claim();
    let uid1 = b.create_claim(&claim1).await?.uid().unwrap_or_default();
    let pod1 = b.pod_external(&claim1.name_any());
    b.create_pod(&pod1).await?;
    b.test_pod(&pod1, &[]).await?;
    let first = device_of(&claims(&ctx).get(&claim1.name_any()).await?)?;

    // The other device is in another group on the same counter set: no pod can have it now.
    let claim2 = b.external_claim();
    let uid2 = b.create_claim(&claim2).await?.uid().unwrap_or_default();
    let pod2 = b.pod_external(&claim2.name_any());
    b.create_pod(&pod2).await?;
    b.wait_unschedulable(&pod2)
        .await
        .with_context(|| format!("only a device incompatible with {first} remains on the counter set"))?;
    let stored2 = claims(&ctx).get(&claim2.name_any()).await?;
    expect!(
        !is_allocated(&stored2),
        "claim {} got allocated next to {first}: {:?}",
        claim2.name_any(),
        allocation_results(&stored2)
    );
    calls
        .expect_none(Method::NodePrepareResources.for_claim_uid(uid2.clone()))
        .context("the second claim cannot be allocated")?;

    // Once the first device is free again, the second pod runs.
    b.delete_pod_and_wait(&pod1).await?;
    calls.wait_unprepared(&uid1, UNPREPARE_TIMEOUT).await?;
    b.test_pod(&pod2, &[]).await?;
    device_of(&claims(&ctx).get(&claim2.name_any()).await?)?;
    let history = calls.claim(&uid2);
    expect!(history.prepared() >= 1 && history.prepare_failures() == 0, "the second claim: {history}");
    Ok(())
}

async fn compatible(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx, vec![device("gpu-0", "mig")?, device("gpu-1", "mig")?]).await?;
    let mut devices = Vec::new();
    for _ in 0..2 {
        let claim = b.external_claim();
        b.create_claim(&claim).await?;
        let pod = b.pod_external(&claim.name_any());
        b.create_pod(&pod).await?;
        b.test_pod(&pod, &[]).await?;
        devices.push(device_of(&claims(&ctx).get(&claim.name_any()).await?)?);
    }
    // Both devices of the group are in use at once, one per claim.
    devices.sort();
    expect!(devices == ["gpu-0", "gpu-1"], "the claims got devices {devices:?}, expected gpu-0 and gpu-1");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// The full texts as upstream renders them (ginkgo `--dry-run -v` of v1.37.2).
    #[test]
    fn full_texts_match_upstream() {
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry);
        registry.validate().unwrap();
        let texts: Vec<&str> = registry.specs().map(|s| s.full_text()).collect();
        let g = "[sig-node] [DRA] [FeatureGate:DRADeviceCompatibilityGroups] device compatibility groups";
        let tail = "[Alpha] [Beta] [Feature:OffByDefault] [FeatureGate:DRAPartitionableDevices] [FeatureGate:DynamicResourceAllocation]";
        assert_eq!(
            texts,
            [
                format!(
                    "{g} incompatible devices leave a pod requesting an incompatible device unschedulable {tail}"
                ),
                format!("{g} compatible devices schedule two pods that share a compatibility group {tail}"),
            ]
        );
    }

    #[test]
    fn devices_consume_half_of_the_counters_in_their_group() {
        assert_eq!(counters().unwrap()[0].counters["mem"].value.0, "2");
        let d = device("gpu-mig", "mig").unwrap();
        let consumption = &d.consumes_counters.unwrap()[0];
        assert_eq!(consumption.counter_set, COUNTER_SET);
        assert_eq!(consumption.counters["mem"].value.0, "1");
        assert_eq!(consumption.compatibility_groups.as_deref().unwrap(), ["mig"]);
    }
}
