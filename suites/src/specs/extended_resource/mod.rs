//! Upstream's two `[FeatureGate:DRAExtendedResource]` contexts (dra.go): extended resources
//! backed by DRA. A DeviceClass with `spec.extendedResourceName` (or the implicit name
//! `deviceclass.resource.kubernetes.io/<class>`) lets a pod ask for devices through
//! `resources.requests`; the scheduler then creates a ResourceClaim for the pod and names it in
//! `status.extendedResourceClaimStatus`, and the kubelet prepares it like any other claim.
//!
//! | upstream context | module | specs |
//! |---|---|---|
//! | one node, `NetworkResources(10)` | [`pods`] | 8: quota, the one-/three-container variants |
//! | the same | [`lifecycle`] | 7: cleanup on completion and failure, overcommitment, invalid name, claim status, zero, class created later |
//! | the same, `Serial`, with upstream's sample device plugin | [`device_plugin`] | 2: after the plugin's uninstall, device plugin preferred |
//! | two nodes (one reserved for the device plugin), `NetworkResources(2)` | [`device_plugin`] | 1 (`Serial`) |
//!
//! Beyond upstream, every pod that runs with an extended resource is checked from the recorded
//! gRPC calls ([`expect_extended`]): the claim the scheduler made is allocated with devices of
//! the driver only, reserved for the pod, the kubelet prepared it with exactly those devices and
//! the plugin holds it, and the env names the claim itself (`claim_<claim>_<request>=true`, where
//! upstream only matches the `<request>=true` end). Where a claim goes away, the kubelet must
//! have unprepared it; where no claim may exist, the kubelet must not have been asked to prepare
//! anything.

mod device_plugin;
mod lifecycle;
mod pods;

use std::collections::BTreeMap;

use anyhow::Context as _;
use harness::{
    builder::{Builder, allocation_results, node_name},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Label, Registry, SpecResult},
    plugin::claim_env_name,
};
use k8s_openapi::{
    api::{
        core::v1::{Container, Pod},
        resource::v1::ResourceClaim,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::ResourceExt as _;

use super::{FEATURE_DRA, kubelet::checks::only_node};

/// `f.WithFeatureGate(features.DRAExtendedResource), feature.DynamicResourceAllocation` on the
/// two contexts.
const CONTEXT_LABELS: [Label; 2] = [Label::gate("DRAExtendedResource"), Label::new(FEATURE_DRA)];
/// Upstream's `resourceapi.ResourceDeviceClassPrefix`: the implicit extended resource name of a
/// class is this prefix plus the class name.
const DEVICE_CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Registers both contexts under `[sig-node] [DRA]`, in upstream's order.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("", CONTEXT_LABELS, |r| {
            let v = |v: &'static str| Label::new(v);
            let (v134, v135) = (v("KubeletMinVersion:1.34"), v("KubeletMinVersion:1.35"));
            let serial = || [v("KubeletMinVersion:1.35"), Label::trailing("Serial")];
            r.it("must run a pod with extended resource with resource quota", pods::quota)
                .label(v135.clone());
            r.it(
                "must run a pod with both implicit and explicit extended resource with one container two resources",
                pods::implicit_and_explicit,
            )
            .label(v135.clone());
            r.it("must run a pod with explicit extended resource with one container one resource", pods::explicit_one)
                .label(v134.clone());
            r.it("must run a pod with implicit extended resource with one container one resource", pods::implicit_one)
                .label(v135.clone());
            r.it(
                "must run a pod with explicit extended resource with one container three resources",
                pods::explicit_three,
            )
            .label(v134.clone());
            r.it(
                "must run a pod with explicit extended resource with three containers one resource each",
                pods::three_containers_one_each,
            )
            .label(v134.clone());
            r.it(
                "must run a pod with explicit extended resource with three containers multiple resources each",
                pods::three_containers_multiple_each,
            )
            .label(v134.clone());
            r.it("must cleanup extended resource claims when pods complete", lifecycle::cleanup_complete)
                .label(v134.clone());
            r.it("must cleanup extended resource claims when pods fail", lifecycle::cleanup_fail)
                .label(v134.clone());
            r.it("process extended resources after device plugin uninstall", device_plugin::after_uninstall)
                .labels(serial());
            r.it("must prevent overcommitment of extended resources", lifecycle::overcommitment)
                .label(v134.clone());
            r.it("must reject pod with invalid extended resource name", lifecycle::invalid_name)
                .label(v134.clone());
            r.it("must accurately populate ExtendedResourceClaimStatus", lifecycle::claim_status)
                .label(v134.clone());
            r.it("must run a pod with extended resource requesting zero", lifecycle::zero).label(v134.clone());
            r.it("must process extended resource after Device Class creation", lifecycle::class_later)
                .label(v134);
            r.it(
                "must prefer device plugin over DRA when both advertise the same resource on a node",
                device_plugin::prefer_device_plugin,
            )
            .labels(serial());
        });
        r.context_with_labels("", CONTEXT_LABELS, |r| {
            r.it(
                "must run pods with extended resource on dra nodes and device plugin nodes",
                device_plugin::dra_and_device_plugin_nodes,
            )
            .labels([Label::new("KubeletMinVersion:1.35"), Label::trailing("Serial")]);
        });
    });
}

/// The first context's set-up: one node, ten network-attached devices available on it, the
/// driver registered with its kubelet, the builder (default class, teardown). Returns the node.
async fn setup(ctx: &Ctx) -> SpecResult<(Driver, Builder, String)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::network(10, false))).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    let node = only_node(&driver)?;
    Ok((driver, b, node))
}

/// `name -> quantity` for `resources.requests` / `limits`.
fn quantities(entries: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    entries.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect()
}

/// Sets the container's requests and limits to `res` (upstream sets both to the same list).
fn set_resources(container: &mut Container, res: &BTreeMap<String, Quantity>) {
    let resources = container.resources.get_or_insert_default();
    resources.requests = Some(res.clone());
    resources.limits = Some(res.clone());
}

/// The pod's containers (not init containers), mutable.
fn containers_mut(pod: &mut Pod) -> anyhow::Result<&mut Vec<Container>> {
    pod.spec.as_mut().map(|s| &mut s.containers).context("pod without spec")
}

/// The pod's first container, mutable.
fn first_container(pod: &mut Pod) -> anyhow::Result<&mut Container> {
    containers_mut(pod)?.first_mut().context("pod without container")
}

/// Checks a running pod that got devices through extended resources: the scheduler named a
/// claim in `status.extendedResourceClaimStatus`; the claim is allocated, only with devices of
/// the driver, and reserved for the pod; the kubelet prepared it with exactly those devices
/// ([`Builder::expect_claim_prepared`]); and each `(container, requests)` has
/// `claim_<claim>_<request>=true` for each of its requests (upstream's `TestContainerEnv` of
/// `<request>=true`, here with the claim's name). Returns the claim.
async fn expect_extended(b: &Builder, pod: &Pod, env: &[(&str, &[&str])]) -> anyhow::Result<ResourceClaim> {
    let pod_name = pod.name_any();
    let claim = b
        .extended_resource_claim(pod)
        .await?
        .with_context(|| format!("pod {pod_name} runs, but its status names no extended resource claim"))?;
    let claim_name = claim.name_any();
    let results = allocation_results(&claim);
    expect!(!results.is_empty(), "extended resource claim {claim_name} of pod {pod_name} is not allocated");
    if let Some(other) = results.iter().find(|r| r.driver != b.driver_name()) {
        fail!("extended resource claim {claim_name} got device {} of driver {}", other.device, other.driver);
    }
    let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
    let pod_uid = pod.uid().unwrap_or_default();
    expect!(
        reserved.iter().any(|r| r.resource == "pods" && r.uid == pod_uid),
        "extended resource claim {claim_name} is not reserved for pod {pod_name}: {:?}",
        reserved.iter().map(|r| format!("{}/{}", r.resource, r.name)).collect::<Vec<_>>()
    );
    b.expect_claim_prepared(pod, &claim)?;
    for (container, requests) in env {
        let names: Vec<String> = requests.iter().map(|r| claim_env_name(&claim_name, r)).collect();
        let expected: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "true")).collect();
        b.expect_env(pod, container, &expected).await?;
    }
    Ok(claim)
}

/// The pod's node, or an error naming the pod.
fn node_of(pod: &Pod) -> anyhow::Result<String> {
    node_name(pod).map(str::to_owned).with_context(|| format!("pod {} is not scheduled", pod.name_any()))
}

/// The container's name.
fn container_name(pod: &Pod, index: usize) -> anyhow::Result<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.get(index))
        .map(|c| c.name.clone())
        .with_context(|| format!("pod {} has no container #{index}", pod.name_any()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// The full texts as upstream's dry run prints them (upstream/specs-v1.37.2.txt).
    #[test]
    fn full_texts_match_upstream() {
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry);
        registry.validate().unwrap();
        let texts: Vec<String> = registry.specs().map(|s| s.full_text().to_owned()).collect();
        let k = "[sig-node] [DRA] [FeatureGate:DRAExtendedResource] [Feature:DynamicResourceAllocation]";
        let g = "[FeatureGate:DynamicResourceAllocation]";
        let expected = [
            format!(
                "{k} must run a pod with extended resource with resource quota [KubeletMinVersion:1.35] {g}"
            ),
            format!(
                "{k} must run a pod with both implicit and explicit extended resource with one container two resources [KubeletMinVersion:1.35] {g}"
            ),
            format!(
                "{k} must run a pod with explicit extended resource with one container one resource [KubeletMinVersion:1.34] {g}"
            ),
            format!(
                "{k} must run a pod with implicit extended resource with one container one resource [KubeletMinVersion:1.35] {g}"
            ),
            format!(
                "{k} must run a pod with explicit extended resource with one container three resources [KubeletMinVersion:1.34] {g}"
            ),
            format!(
                "{k} must run a pod with explicit extended resource with three containers one resource each [KubeletMinVersion:1.34] {g}"
            ),
            format!(
                "{k} must run a pod with explicit extended resource with three containers multiple resources each [KubeletMinVersion:1.34] {g}"
            ),
            format!(
                "{k} must cleanup extended resource claims when pods complete [KubeletMinVersion:1.34] {g}"
            ),
            format!("{k} must cleanup extended resource claims when pods fail [KubeletMinVersion:1.34] {g}"),
            format!(
                "{k} process extended resources after device plugin uninstall [KubeletMinVersion:1.35] {g} [Serial]"
            ),
            format!("{k} must prevent overcommitment of extended resources [KubeletMinVersion:1.34] {g}"),
            format!("{k} must reject pod with invalid extended resource name [KubeletMinVersion:1.34] {g}"),
            format!("{k} must accurately populate ExtendedResourceClaimStatus [KubeletMinVersion:1.34] {g}"),
            format!("{k} must run a pod with extended resource requesting zero [KubeletMinVersion:1.34] {g}"),
            format!(
                "{k} must process extended resource after Device Class creation [KubeletMinVersion:1.34] {g}"
            ),
            format!(
                "{k} must prefer device plugin over DRA when both advertise the same resource on a node [KubeletMinVersion:1.35] {g} [Serial]"
            ),
            format!(
                "{k} must run pods with extended resource on dra nodes and device plugin nodes [KubeletMinVersion:1.35] {g} [Serial]"
            ),
        ];
        assert_eq!(texts, expected);
        let serial = registry.specs().filter(|s| s.is_serial()).count();
        assert_eq!(serial, 3);
    }

    #[test]
    fn resources_are_requested_and_limited_alike() {
        let mut c = Container::default();
        set_resources(&mut c, &quantities(&[("a.k8s.io/resource-x", "2")]));
        let r = c.resources.unwrap();
        assert_eq!(r.requests, r.limits);
        assert_eq!(r.requests.unwrap()["a.k8s.io/resource-x"], Quantity("2".to_owned()));
    }
}
