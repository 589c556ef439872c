//! Upstream's `prioritizedListTests` (`kubelet ... [FeatureGate:DRAPrioritizedList]`): one node
//! with two drivers. Driver `-1` (class parameters `{"driver":"1"}`) has `device-1-1` (version
//! `1.0.0`, PCIe root `bar`) and `device-1-2` (`2.0.0`, `foo`); driver `-2` (`{"driver":"2"}`) has
//! `device-2-1` (`1.0.0`, `foo`). Claims name requests with alternatives (`firstAvailable`) and
//! per-request and per-sub-request configuration.
//!
//! Upstream checks which sub-request the scheduler chose (and, for the config specs, some env).
//! Here every spec also checks which devices were allocated, the container's driver variables
//! exactly (so a config of a sub-request that was not chosen must not reach the container), and
//! from the call logs of both drivers what the kubelet did: each driver with devices in the claim
//! prepared it once with exactly those devices and, after the pod is deleted, unprepared it;
//! a driver without devices in the claim was never asked about it.

use std::collections::BTreeMap;

use anyhow::Context as _;
use harness::{
    builder::{Builder, allocation_results, node_name},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
};
use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceAttribute, ResourceClaim},
};
use kube::ResourceExt as _;
use serde_json::{Value, json};

/// The claim of every spec (upstream's `external-multiclaim`).
const CLAIM: &str = "external-multiclaim";
/// The version attribute of the devices.
const VERSION: &str = "dra.example.com/version";
/// The PCIe root attribute of the devices.
const PCIE_ROOT: &str = "dra.example.com/pcieRoot";

/// Registers the specs (inside `kubelet [Feature:DynamicResourceAllocation]
/// [FeatureGate:DRAPrioritizedList]`).
pub fn register(r: &mut Registry) {
    r.it("selects the first subrequest that can be satisfied", first_satisfiable);
    r.it("uses the config for the selected subrequest", config_of_selected);
    r.it("chooses the correct subrequest subject to constraints", subject_to_constraints);
    r.it("filters config correctly for multiple devices", filters_config);
}

/// The two drivers of a spec, with their builders, on one node.
struct Setup {
    node: String,
    d1: Driver,
    b1: Builder,
    d2: Driver,
    b2: Builder,
}

/// A device's attributes: version and PCIe root.
fn attributes(version: &str, pcie_root: &str) -> anyhow::Result<BTreeMap<String, DeviceAttribute>> {
    Ok(serde_json::from_value(json!({
        VERSION: { "string": version },
        PCIE_ROOT: { "string": pcie_root },
    }))?)
}

/// The devices per driver (see the module documentation).
fn devices() -> anyhow::Result<[BTreeMap<String, BTreeMap<String, DeviceAttribute>>; 2]> {
    Ok([
        BTreeMap::from([
            ("device-1-1".to_owned(), attributes("1.0.0", "bar")?),
            ("device-1-2".to_owned(), attributes("2.0.0", "foo")?),
        ]),
        BTreeMap::from([("device-2-1".to_owned(), attributes("1.0.0", "foo")?)]),
    ])
}

async fn setup(ctx: &Ctx) -> SpecResult<Setup> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let node = nodes.names().first().cloned().context("no node selected")?;
    let [devices1, devices2] = devices()?;
    let config = |suffix: &str, devices| {
        DriverConfig::kubelet(resources::node_local_devices(None, vec![devices])).name_suffix(suffix)
    };
    let (d1, d2) = futures::try_join!(
        Driver::start(ctx, &nodes, config("-1", devices1)),
        Driver::start(ctx, &nodes, config("-2", devices2)),
    )?;
    let b1 = Builder::start(ctx, &d1, Some(json!({"driver": "1"}))).await?;
    let b2 = Builder::start(ctx, &d2, Some(json!({"driver": "2"}))).await?;
    Ok(Setup { node, d1, b1, d2, b2 })
}

/// An exact request for `count` devices of `class`.
fn exactly(class: &str, count: i64) -> Value {
    json!({ "deviceClassName": class, "allocationMode": "ExactCount", "count": count })
}

/// A sub-request `name` for `count` devices of `class`.
fn devices_of(name: &str, class: &str, count: i64) -> Value {
    let mut sub = exactly(class, count);
    sub["name"] = json!(name);
    sub
}

/// An opaque configuration of `driver` for `requests`.
fn config(requests: &[&str], driver: &str, parameters: Value) -> Value {
    json!({ "requests": requests, "opaque": { "driver": driver, "parameters": parameters } })
}

/// The claim [`CLAIM`] with these requests, constraints and configs.
fn claim(b: &Builder, requests: Value, constraints: Value, configs: Value) -> anyhow::Result<ResourceClaim> {
    let mut devices = json!({ "requests": requests, "config": configs });
    if constraints.as_array().is_some_and(|c| !c.is_empty()) {
        devices["constraints"] = constraints;
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": CLAIM, "namespace": b.namespace() },
        "spec": { "devices": devices },
    }))?)
}

/// `(request, device)` of the allocation results, in order, with the driver checked.
fn results_of(claim: &ResourceClaim, drivers: &[&str]) -> anyhow::Result<Vec<(String, String)>> {
    let results = allocation_results(claim);
    if let Some(r) = results.iter().find(|r| !drivers.contains(&r.driver.as_str())) {
        fail!("claim {CLAIM}: device {} of request {} is from driver {}", r.device, r.request, r.driver);
    }
    Ok(results.iter().map(|r| (r.request.clone(), r.device.clone())).collect())
}

/// Creates the claim and a pod using it (the builder's pod for external claims, or `pod`), waits
/// until the pod runs and the claim is allocated, and checks that the kubelet prepared the claim
/// with exactly its devices of each driver. Returns the running pod and the allocated claim.
async fn run(s: &Setup, claim: &ResourceClaim, pod: Option<Pod>) -> SpecResult<(Pod, ResourceClaim)> {
    s.b1.create_claim(claim).await?;
    let pod = pod.unwrap_or_else(|| s.b1.pod_external(CLAIM));
    s.b1.create_pod(&pod).await?;
    let running = s.b1.wait_running(&pod).await?;
    expect!(
        node_name(&running) == Some(s.node.as_str()),
        "pod {} runs on {:?}, the drivers run on {}",
        running.name_any(),
        node_name(&running),
        s.node
    );
    // Each builder checks its own driver's devices of the claim (and skips a driver without any).
    s.b1.expect_prepared(&running).await?;
    s.b2.expect_prepared(&running).await?;
    let allocated = s.b1.wait_allocated(CLAIM).await?;
    Ok((running, allocated))
}

/// Checks that each driver prepared the claim exactly once (no failure) when it has devices in
/// it and was never asked about it otherwise; then deletes the pod and waits until every driver
/// with devices unprepared the claim.
async fn check_calls_and_unprepare(s: &Setup, pod: &Pod, claim: &ResourceClaim) -> SpecResult {
    let uid = claim.uid().context("the claim has no UID")?;
    let results = allocation_results(claim);
    let mut with_devices = Vec::new();
    for driver in [&s.d1, &s.d2] {
        let calls = driver.calls(&s.node);
        if !results.iter().any(|r| r.driver == driver.name()) {
            calls
                .expect_none(Method::NodePrepareResources.for_claim_uid(uid.clone()))
                .with_context(|| format!("driver {} has no device in claim {CLAIM}", driver.name()))?;
            continue;
        }
        calls.expect_none(Method::NodePrepareResources.for_claim_uid(&uid).failed())?;
        calls.claim(&uid).expect_prepared_once()?;
        with_devices.push(driver);
    }
    s.b1.delete_pod_and_wait(pod).await?;
    for driver in with_devices {
        driver.calls(&s.node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    }
    Ok(())
}

async fn first_satisfiable(ctx: Ctx) -> SpecResult {
    let s = setup(&ctx).await?;
    let class = s.b1.class_name();
    let claim = claim(
        &s.b1,
        json!([{
            "name": "request-1",
            "firstAvailable": [
                devices_of("sub-request-1", &class, 3),
                devices_of("sub-request-2", &class, 2),
                devices_of("sub-request-3", &class, 1),
            ],
        }]),
        json!([]),
        json!([config(&["request-1"], s.d1.name(), json!({"a": "b"}))]),
    )?;
    let (running, allocated) = run(&s, &claim, None).await?;
    // Three devices cannot be had (driver -1 has two), two can.
    let got = results_of(&allocated, &[s.d1.name()])?;
    let sub = "request-1/sub-request-2".to_owned();
    expect!(
        got == [(sub.clone(), "device-1-1".to_owned()), (sub, "device-1-2".to_owned())],
        "claim {CLAIM} has allocation results {got:?}, expected request-1/sub-request-2 with device-1-1 and device-1-2"
    );
    s.b1.expect_env_exact(
        &running,
        harness::builder::CLAIM_CONTAINER,
        &[("admin_driver", "1"), ("claim_external_multiclaim_request_1", "true"), ("user_a", "b")],
    )
    .await?;
    check_calls_and_unprepare(&s, &running, &allocated).await
}

async fn config_of_selected(ctx: Ctx) -> SpecResult {
    let s = setup(&ctx).await?;
    let class = s.b1.class_name();
    let d1 = s.d1.name();
    let claim = claim(
        &s.b1,
        json!([{
            "name": "request-1",
            "firstAvailable": [devices_of("sub-request-1", &class, 3), devices_of("sub-request-2", &class, 2)],
        }]),
        json!([]),
        json!([
            config(&["request-1"], d1, json!({"a": "b"})),
            config(&["request-1/sub-request-1"], d1, json!({"c": "d"})),
            config(&["request-1/sub-request-2"], d1, json!({"e": "f"})),
        ]),
    )?;
    let (running, allocated) = run(&s, &claim, None).await?;
    let got = results_of(&allocated, &[d1])?;
    expect!(
        got.len() == 2 && got.iter().all(|(r, _)| r == "request-1/sub-request-2"),
        "claim {CLAIM} has allocation results {got:?}, expected two devices for request-1/sub-request-2"
    );
    // The parent request's config and the chosen sub-request's, not sub-request-1's (user_c).
    s.b1.expect_env_exact(
        &running,
        harness::builder::CLAIM_CONTAINER,
        &[
            ("admin_driver", "1"),
            ("claim_external_multiclaim_request_1", "true"),
            ("user_a", "b"),
            ("user_e", "f"),
        ],
    )
    .await?;
    check_calls_and_unprepare(&s, &running, &allocated).await
}

/// Requests of the constraint and config specs: `request-1` with two single-device alternatives
/// of driver -1 (the first given), `request-2` for one device of driver -2.
fn two_requests(s: &Setup, first_count: i64) -> Value {
    let class1 = s.b1.class_name();
    json!([
        {
            "name": "request-1",
            "firstAvailable": [
                devices_of("sub-request-1", &class1, first_count),
                devices_of("sub-request-2", &class1, 1),
            ],
        },
        { "name": "request-2", "exactly": exactly(&s.b2.class_name(), 1) },
    ])
}

async fn subject_to_constraints(ctx: Ctx) -> SpecResult {
    let s = setup(&ctx).await?;
    let claim = claim(
        &s.b1,
        two_requests(&s, 1),
        json!([
            { "requests": ["request-1", "request-2"], "matchAttribute": VERSION },
            { "requests": ["request-1/sub-request-1", "request-2"], "matchAttribute": PCIE_ROOT },
        ]),
        json!([config(&[], s.d1.name(), json!({"a": "b"}))]),
    )?;
    let (running, allocated) = run(&s, &claim, None).await?;
    // No device of driver -1 has both version 1.0.0 and PCIe root foo (device-2-1's), so the
    // first alternative fails; device-1-1 matches the version only, which is all the second needs.
    let got = results_of(&allocated, &[s.d1.name(), s.d2.name()])?;
    expect!(
        got == [
            ("request-1/sub-request-2".to_owned(), "device-1-1".to_owned()),
            ("request-2".to_owned(), "device-2-1".to_owned()),
        ],
        "claim {CLAIM} has allocation results {got:?}, expected request-1/sub-request-2 with device-1-1 and request-2 with device-2-1"
    );
    // Both drivers' devices reach the container; the config (all requests) only driver -1's.
    // (Both drivers set admin_driver, so its value depends on the order of the CDI devices.)
    s.b1.expect_env(
        &running,
        harness::builder::CLAIM_CONTAINER,
        &[
            ("claim_external_multiclaim_request_1", "true"),
            ("claim_external_multiclaim_request_2", "true"),
            ("user_a", "b"),
        ],
    )
    .await?;
    check_calls_and_unprepare(&s, &running, &allocated).await
}

async fn filters_config(ctx: Ctx) -> SpecResult {
    let s = setup(&ctx).await?;
    let (d1, d2) = (s.d1.name(), s.d2.name());
    let claim = claim(
        &s.b1,
        // Twenty devices are more than there are.
        two_requests(&s, 20),
        json!([]),
        json!([
            config(&["request-1"], d1, json!({"a": "b"})),
            config(&["request-1/sub-request-1"], d1, json!({"c": "d"})),
            config(&["request-1/sub-request-2"], d1, json!({"e": "f"})),
            config(&["request-2"], d2, json!({"g": "h"})),
        ]),
    )?;
    let (pod, _) =
        s.b1.pod_with_claims()
            .claim(CLAIM, CLAIM)
            .container("with-resource-0", &[&format!("{CLAIM}/request-1")])
            .container("with-resource-1", &[&format!("{CLAIM}/request-2")])
            .build();

    let (running, allocated) = run(&s, &claim, Some(pod)).await?;
    let got = results_of(&allocated, &[d1, d2])?;
    expect!(
        got.len() == 2
            && got[0].0 == "request-1/sub-request-2"
            && got[1] == ("request-2".to_owned(), "device-2-1".to_owned()),
        "claim {CLAIM} has allocation results {got:?}, expected request-1/sub-request-2 and request-2 with device-2-1"
    );
    s.b1.expect_env_exact(
        &running,
        "with-resource-0",
        &[
            ("claim_external_multiclaim_request_1", "true"),
            ("user_a", "b"),
            ("user_e", "f"),
            ("admin_driver", "1"),
        ],
    )
    .await?;
    s.b1.expect_env_exact(
        &running,
        "with-resource-1",
        &[("claim_external_multiclaim_request_2", "true"), ("user_g", "h"), ("admin_driver", "2")],
    )
    .await?;
    check_calls_and_unprepare(&s, &running, &allocated).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_second_alternative_fits_the_constraints() {
        let [d1, d2] = devices().unwrap_or_default();
        let attr = |d: &BTreeMap<String, DeviceAttribute>, k: &str| d[k].string.clone().unwrap_or_default();
        let other = &d2["device-2-1"];
        // sub-request-1 needs version and PCIe root of device-2-1: no device of driver -1 has both.
        assert!(d1.values().all(
            |d| attr(d, VERSION) != attr(other, VERSION) || attr(d, PCIE_ROOT) != attr(other, PCIE_ROOT)
        ));
        // sub-request-2 needs the version only: device-1-1.
        let matching: Vec<_> =
            d1.iter().filter(|(_, d)| attr(d, VERSION) == attr(other, VERSION)).map(|(n, _)| n).collect();
        assert_eq!(matching, ["device-1-1"]);
    }

    #[test]
    fn sub_requests_are_named_exact_requests() {
        assert_eq!(
            exactly("c", 1),
            json!({ "deviceClassName": "c", "allocationMode": "ExactCount", "count": 1 })
        );
        assert_eq!(devices_of("s", "c", 2)["name"], "s");
        assert_eq!(devices_of("s", "c", 2)["count"], 2);
    }
}
