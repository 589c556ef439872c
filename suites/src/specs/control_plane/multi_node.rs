//! Upstream's `multiNodeTests(withKubelet)`: 2 to 8 nodes; skipped with the reason on smaller
//! clusters. Without kubelet ([`register`], inside `control plane`) the pods only get scheduled;
//! with kubelet ([`register_kubelet`], inside `kubelet ... on multiple nodes`) the driver's
//! plugins register with every chosen node's kubelet through proxy pods, which publish the
//! ResourceSlices, and the pods run.

use std::collections::{BTreeMap, BTreeSet};

use harness::{
    builder::{Builder, POD_START_SHORT_TIMEOUT, condition, node_name},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    wait::Verdict,
};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceSelector};
use kube::ResourceExt as _;
use serde_json::json;

const FIRST_DEVICE: &str = "pre-defined-device-01";
const SECOND_DEVICE: &str = "pre-defined-device-02";

/// Registers the specs without kubelet (inside the `control plane` context).
pub fn register(r: &mut Registry) {
    register_with(r, false);
}

/// Registers the specs with kubelet (inside the `kubelet ... on multiple nodes` context).
pub fn register_kubelet(r: &mut Registry) {
    register_with(r, true);
}

fn register_with(r: &mut Registry, kubelet: bool) {
    r.context("with different ResourceSlices", move |r| {
        r.it("keeps pod pending because of CEL runtime errors", move |ctx| cel_runtime_errors(ctx, kubelet));
    });
    r.context("with node-local resources", move |r| {
        r.it("uses all resources", move |ctx| uses_all_resources(ctx, kubelet));
    });
}

/// The driver config: with kubelet (proxy pods, plugins) or control plane only.
fn config(kubelet: bool, resources: harness::driver::ResourcesFn) -> DriverConfig {
    if kubelet { DriverConfig::kubelet(resources) } else { DriverConfig::control_plane(resources) }
}

fn bool_attribute(value: bool) -> DeviceAttribute {
    DeviceAttribute { bool: Some(value), ..Default::default() }
}

/// Device attributes per node: the first node's device has `healthy` and `exists`, the
/// second's only `healthy`.
fn devices_per_node() -> Vec<BTreeMap<String, BTreeMap<String, DeviceAttribute>>> {
    vec![
        BTreeMap::from([(
            FIRST_DEVICE.to_owned(),
            BTreeMap::from([
                ("healthy".to_owned(), bool_attribute(true)),
                ("exists".to_owned(), bool_attribute(true)),
            ]),
        )]),
        BTreeMap::from([(
            SECOND_DEVICE.to_owned(),
            BTreeMap::from([("healthy".to_owned(), bool_attribute(false))]),
        )]),
    ]
}

async fn cel_runtime_errors(ctx: Ctx, kubelet: bool) -> SpecResult {
    let nodes = Nodes::select(&ctx, 2, 8).await?;
    let per_node = devices_per_node();
    let driver =
        Driver::start(&ctx, &nodes, config(kubelet, resources::node_local_devices(None, per_node.clone())))
            .await?;
    let b = Builder::start(&ctx, &driver, None).await?;

    // Exactly the two slices, with the devices as defined.
    let slices = driver.slices().await?;
    let mut seen: Vec<(String, Option<BTreeMap<String, DeviceAttribute>>)> = slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .map(|d| (d.name, d.attributes))
        .collect();
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    let expected: Vec<(String, Option<BTreeMap<String, DeviceAttribute>>)> =
        per_node.iter().flat_map(|m| m.iter().map(|(n, a)| (n.clone(), Some(a.clone())))).collect();
    expect!(
        slices.len() == 2 && seen == expected,
        "driver slices have devices {seen:?}, expected {expected:?}"
    );

    let (pod, mut template) = b.pod_inline();
    // A runtime error on one node (no "exists" attribute), but not on the other.
    let selector: DeviceSelector = serde_json::from_value(
        json!({"cel": {"expression": format!(r#"device.attributes["{}"].exists"#, driver.name())}}),
    )?;
    if let Some(exactly) = template
        .spec
        .as_mut()
        .and_then(|s| s.spec.as_mut())
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
    {
        exactly.selectors.get_or_insert_default().push(selector);
    }
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;

    b.wait_pod(&pod, "to be unschedulable because of a CEL runtime error", POD_START_SHORT_TIMEOUT, |p| {
        match condition(p, "PodScheduled") {
            Some(c) if c.status != "False" => Verdict::Fail("the pod got scheduled".to_owned()),
            Some(c) => {
                Verdict::done_if(c.message.as_deref().is_some_and(|m| m.contains("CEL runtime error")))
            }
            None => Verdict::Pending,
        }
    })
    .await?;
    Ok(())
}

async fn uses_all_resources(ctx: Ctx, kubelet: bool) -> SpecResult {
    let nodes = Nodes::select(&ctx, 2, 8).await?;
    let driver = Driver::start(&ctx, &nodes, config(kubelet, resources::node_local(1))).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let mut pods = Vec::new();
    for _ in nodes.names() {
        let (pod, template) = b.pod_inline();
        b.create_pod(&pod).await?;
        b.create_template(&template).await?;
        pods.push(pod);
    }
    let mut used: BTreeMap<String, String> = BTreeMap::new();
    for pod in &pods {
        let scheduled = b.test_pod(pod, &[]).await?;
        let node = node_name(&scheduled).unwrap_or_default().to_owned();
        // One device per node: the pods must cover all nodes.
        if let Some(other) = used.insert(node.clone(), pod.name_any()) {
            return Err(anyhow::anyhow!(
                "pod {} got scheduled on node {node} like pod {other}, although each node has only one device",
                pod.name_any()
            )
            .into());
        }
    }
    let covered: BTreeSet<&String> = used.keys().collect();
    let all: BTreeSet<&String> = nodes.names().iter().collect();
    expect!(covered == all, "pods ran on {covered:?}, expected every node {all:?}");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn second_node_lacks_the_exists_attribute() {
        let d = devices_per_node();
        assert!(d[0][FIRST_DEVICE].contains_key("exists"));
        assert!(!d[1][SECOND_DEVICE].contains_key("exists"));
        assert_eq!(d[1][SECOND_DEVICE]["healthy"].bool, Some(false));
    }
}
