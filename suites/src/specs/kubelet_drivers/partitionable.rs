//! Upstream's `partitionableDevicesTests` (`kubelet ... [FeatureGate:DRAPartitionableDevices]`):
//! one node with counter set `counter-1` (`memory: 6Gi`) and devices `device-1` and `device-2`
//! that consume 4Gi each, so only one of them can be allocated at a time.
//!
//! Upstream watches the second pod stay `Pending` for 20 s. Here the spec waits for the
//! scheduler's verdict instead (`PodScheduled=False`, reason `Unschedulable`), checks that its
//! claim is not allocated and that the kubelet never asked the plugin to prepare it, then deletes
//! the first pod: the kubelet unprepares the first claim, and only after the deletion prepares the
//! second claim, whose pod then runs.

use std::time::SystemTime;

use anyhow::Context as _;
use harness::{
    builder::{Builder, is_allocated, node_name},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
};
use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourceClaim};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use super::{
    evidence::{self, ClaimKey, DraApi},
    gates,
};

/// Registers the spec (inside `kubelet [Feature:DynamicResourceAllocation]
/// [FeatureGate:DRAPartitionableDevices]`).
pub fn register(r: &mut Registry) {
    r.it("must consume and free up counters", consume_and_free_counters).requires(
        gates::api_server_requirement(
            "DRAPartitionableDevices",
            "it drops sharedCounters and consumesCounters",
        ),
    );
}

/// Counter set `counter-1` with 6Gi of memory, and two devices that consume 4Gi each.
fn counters_and_devices() -> anyhow::Result<(Vec<CounterSet>, Vec<Device>)> {
    let counters = serde_json::from_value(json!([
        { "name": "counter-1", "counters": { "memory": { "value": "6Gi" } } },
    ]))?;
    let device = |name: &str| {
        json!({
            "name": name,
            "consumesCounters": [{ "counterSet": "counter-1", "counters": { "memory": { "value": "4Gi" } } }],
        })
    };
    let devices = serde_json::from_value(json!([device("device-1"), device("device-2")]))?;
    Ok((counters, devices))
}

async fn consume_and_free_counters(ctx: Ctx) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let (counters, devices) = counters_and_devices()?;
    let driver =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::partitionable(counters, devices)))
            .await?;
    let b = Builder::start(&ctx, &driver, None).await?;

    // Both devices are free, so the counters suffice for one of them.
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    let key1 = ClaimKey::of(&b.create_claim(&claim).await?)?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[]).await?;
    let node = node_name(&running).context("the running pod has no node")?.to_owned();
    let calls = driver.try_calls(&node)?;

    // The other device would need 4Gi more of the 6Gi; 2Gi are left.
    let claim2 = b.external_claim();
    let pod2 = b.pod_external(&claim2.name_any());
    let key2 = ClaimKey::of(&b.create_claim(&claim2).await?)?;
    b.create_pod(&pod2).await?;
    b.wait_unschedulable(&pod2).await?;
    let stored2 = Api::<ResourceClaim>::namespaced(ctx.client().clone(), ctx.namespace())
        .get(&key2.name)
        .await
        .with_context(|| format!("get claim {key2}"))?;
    expect!(!is_allocated(&stored2), "claim {key2} got allocated although the counters are used up");
    let log = calls.log();
    let prepared = evidence::check_prepared(&log, DraApi::V1, std::slice::from_ref(&key1))?;
    evidence::check_not_named(&log, &DraApi::V1.prepare(), &key2)?;

    // Freeing the first device's counters lets the second pod run.
    let deleted_at = SystemTime::now();
    b.delete_pod_and_wait(&pod).await?;
    let unprepared = evidence::wait_unprepared(calls, DraApi::V1, std::slice::from_ref(&key1)).await?;
    b.test_pod(&pod2, &[]).await?;
    let log = calls.log();
    let prepared2 = evidence::check_prepared(&log, DraApi::V1, &[key1, key2.clone()])?;
    let first = evidence::first_call_for(&log, &DraApi::V1.prepare(), &key2)?;
    expect!(
        first.started >= deleted_at,
        "{} was called for claim {key2} before the first pod was deleted\ncall log:\n{log}",
        DraApi::V1.prepare()
    );
    tracing::info!(
        "kubelet gRPC evidence on node {node}: while pending: {prepared}, none for {}; after deleting {}: {unprepared}; then {prepared2}",
        key2.name,
        pod.name_any()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_devices_do_not_fit_the_counter_set() {
        let (counters, devices) = counters_and_devices().unwrap_or_default();
        assert_eq!(counters.len(), 1);
        assert_eq!(counters[0].counters["memory"].value.0, "6Gi");
        assert_eq!(devices.len(), 2);
        for d in &devices {
            let consumes = d.consumes_counters.clone().unwrap_or_default();
            assert_eq!(consumes[0].counter_set, "counter-1");
            assert_eq!(consumes[0].counters["memory"].value.0, "4Gi");
        }
    }
}
