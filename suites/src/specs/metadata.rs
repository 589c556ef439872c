//! `[sig-node] [DRA] metadata [Feature:DynamicResourceAllocation] ...`: upstream's `metadata`
//! contexts of test/e2e/dra/dra.go (v1.37.2). The driver writes device metadata files
//! (`metadata.resource.k8s.io`, see [`harness::plugin::metadata`]) that CDI mounts into the
//! containers; the specs read them inside the containers and check their content.
//!
//! Beyond upstream: every object in the file's stream is checked (the configured versions, in
//! order, all with the same content), the CDI device ID of the metadata mount must be among
//! those the kubelet got for the request (from the recorded `NodePrepareResources` calls), and
//! at the end the pod is deleted and the kubelet must unprepare each claim successfully, which
//! includes removing the metadata files.

use anyhow::Context as _;
use harness::{
    builder::{Builder, exec, node_name},
    calls::UNPREPARE_TIMEOUT,
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    plugin::{
        MetadataVersion,
        metadata::{self, DeviceMetadata},
    },
};
use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{DeviceClass, ResourceClaim},
};
use kube::ResourceExt as _;
use serde_json::json;

use super::{FEATURE_DRA, kubelet::checks};

/// The one request of the builder's claims.
const REQUEST: &str = "my-request";

/// Registers the specs under `[sig-node] [DRA]`, as upstream's two `metadata` contexts.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("metadata", [FEATURE_DRA], |r| {
            // v1alpha1 alone is not supported by upstream's helper.
            r.context("v1beta1", |r| register_versions(r, &[MetadataVersion::V1beta1]));
            r.context("v1alpha1+v1beta1", |r| {
                register_versions(r, &[MetadataVersion::V1beta1, MetadataVersion::V1alpha1])
            });
        });
        r.context_with_labels("metadata", [FEATURE_DRA], |r| {
            r.it("must not race when multiple drivers write metadata for the same request", multiple_drivers);
        });
    });
}

/// Upstream's `testMetadata(v1beta1, versions...)`: the version consumers get is always v1beta1.
fn register_versions(r: &mut Registry, versions: &'static [MetadataVersion]) {
    r.it("must mount device metadata for resource claims", move |ctx| claims(ctx, versions));
    r.it("must map device metadata to the right containers", move |ctx| containers(ctx, versions));
    r.it("must mount device metadata for resource claim templates", move |ctx| templates(ctx, versions));
}

/// One node, two devices, a driver with device metadata in `versions`.
async fn setup(ctx: &Ctx, versions: &[MetadataVersion]) -> SpecResult<(Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let config = DriverConfig::kubelet(resources::node_local(2)).device_metadata(versions);
    let driver = Driver::start(ctx, &nodes, config).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    Ok((driver, b))
}

/// What a metadata file must say (upstream's `expectedMetadataFile`).
struct Expected<'a> {
    claim: &'a ResourceClaim,
    /// Whether the claim was generated from a template: then `podClaimName` must be
    /// `pod_claim`, else absent.
    pod_claim: Option<&'a str>,
    request: &'a str,
    driver: &'a str,
    versions: &'a [MetadataVersion],
}

/// Reads `path` in `container` and checks it as upstream's `testContainerMetadataFile` does,
/// and more: every object of the stream, in the configured versions' order.
async fn check_file(ctx: &Ctx, pod: &Pod, container: &str, path: &str, want: &Expected<'_>) -> SpecResult {
    let out = exec(ctx.client(), ctx.namespace(), &pod.name_any(), container, &["cat", path]).await?;
    let at = format!("metadata file {path} in container {container}");
    expect!(out.success && out.stderr.is_empty(), "read {at}: {} (stderr {:?})", out.message, out.stderr);
    let objects =
        DeviceMetadata::decode_stream(out.stdout.as_bytes()).with_context(|| format!("decode {at}"))?;
    let versions: Vec<MetadataVersion> = objects.iter().map(|(v, _)| *v).collect();
    expect!(versions == want.versions, "{at} holds versions {versions:?}, expected {:?}", want.versions);
    // What upstream's decoder returns: the first object of a known version.
    expect!(versions.first() == Some(&MetadataVersion::V1beta1), "{at}: the first object is not v1beta1");
    let first = &objects[0].1;
    for (version, object) in &objects {
        let same = DeviceMetadata { kind: String::new(), api_version: String::new(), ..object.clone() };
        let first_same = DeviceMetadata { kind: String::new(), api_version: String::new(), ..first.clone() };
        expect!(same == first_same, "{at}: the {version:?} object differs from the first one");
        let problems = object.validate();
        expect!(problems.is_empty(), "validation of {at} ({version:?}): {problems:?}");
    }
    let claim = want.claim;
    let meta = &first.metadata;
    expect!(
        meta.name == claim.name_any(),
        "{at}: claim name {:?}, expected {:?}",
        meta.name,
        claim.name_any()
    );
    let namespace = claim.namespace().unwrap_or_default();
    expect!(
        meta.namespace == namespace,
        "{at}: claim namespace {:?}, expected {namespace:?}",
        meta.namespace
    );
    let uid = claim.uid().unwrap_or_default();
    expect!(meta.uid == uid, "{at}: claim UID {:?}, expected {uid:?}", meta.uid);
    expect!(meta.generation == 1, "{at}: generation {}, expected 1", meta.generation);
    let pod_claim = want.pod_claim.map(str::to_owned);
    expect!(
        first.pod_claim_name == pod_claim,
        "{at}: podClaimName {:?}, expected {pod_claim:?}",
        first.pod_claim_name
    );
    let [request] = first.requests.as_slice() else {
        fail!("{at}: {} requests, expected exactly one", first.requests.len());
    };
    expect!(request.name == want.request, "{at}: request {:?}, expected {:?}", request.name, want.request);
    expect!(!request.devices.is_empty(), "{at}: no devices in request {}", request.name);
    let allocated: Vec<(&str, &str)> = harness::builder::allocation_results(claim)
        .iter()
        .filter(|r| r.driver == want.driver && r.request == want.request)
        .map(|r| (r.pool.as_str(), r.device.as_str()))
        .collect();
    for device in &request.devices {
        let name = format!("device {}/{} in {at}", device.pool, device.name);
        expect!(
            device.driver == want.driver,
            "{name}: driver {:?}, expected {:?}",
            device.driver,
            want.driver
        );
        expect!(!device.pool.is_empty() && !device.name.is_empty(), "{name}: empty pool or name");
        for (attribute, value) in
            [("driverName", want.driver), ("pool", &device.pool), ("device", &device.name)]
        {
            let got = device.string_attribute(attribute);
            expect!(got == Some(value), "{name}: attribute {attribute} is {got:?}, expected {value:?}");
        }
        expect!(
            allocated.contains(&(device.pool.as_str(), device.name.as_str())),
            "{name}: not allocated to request {} (allocated: {allocated:?})",
            want.request
        );
    }
    expect!(
        request.devices.len() == allocated.len(),
        "{at}: {} devices, allocated {allocated:?}",
        request.devices.len()
    );
    Ok(())
}

/// From the node's call log: the kubelet prepared the claim, and for each request the devices
/// it got carry the CDI ID of the request's metadata mount.
fn check_prepared(driver: &Driver, pod: &Pod, claim: &ResourceClaim, requests: &[&str]) -> SpecResult {
    let node = node_name(pod).context("the running pod has no node")?;
    let calls = driver.calls(node);
    let uid = claim.uid().unwrap_or_default();
    let history = calls.claim(&uid);
    let Some(prepare) = history.prepares().filter(|c| c.succeeded()).last() else {
        fail!(
            "the kubelet never prepared claim {} with driver {}: {history}",
            claim.name_any(),
            driver.name()
        );
    };
    for request in requests {
        let id = metadata::cdi_device_id(driver.name(), &uid, request);
        let found = prepare.devices.iter().filter(|(_, _, ids)| ids.contains(&id)).count();
        expect!(
            found == 1,
            "NodePrepareResources #{} returned the metadata CDI ID {id} with {found} devices, expected one: {:?}",
            prepare.id,
            prepare.devices
        );
    }
    Ok(())
}

/// Deletes the pod and waits until the kubelet unprepared each claim through each driver.
async fn delete_and_unprepare(b: &Builder, pod: &Pod, claims: &[(&Driver, &ResourceClaim)]) -> SpecResult {
    let node = node_name(pod).context("the running pod has no node")?.to_owned();
    b.delete_pod_and_wait(pod).await?;
    for (driver, claim) in claims {
        driver.calls(&node).wait_unprepared(&claim.uid().unwrap_or_default(), UNPREPARE_TIMEOUT).await?;
    }
    Ok(())
}

/// The pod's first container (upstream's `with-resource`).
fn first_container(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).unwrap_or_default()
}

async fn claims(ctx: Ctx, versions: &'static [MetadataVersion]) -> SpecResult {
    let (driver, b) = setup(&ctx, versions).await?;
    let claim = b.create_claim(&b.external_claim()).await?;
    let pod = b.pod_external(&claim.name_any());
    b.create_pod(&pod).await?;
    let pod = b.test_pod(&pod, &[]).await?;
    let claim = checks::claims(&ctx).get(&claim.name_any()).await.context("get the allocated claim")?;
    let path = metadata::resource_claim_file_path(driver.name(), &claim.name_any(), REQUEST);
    let want = Expected { claim: &claim, pod_claim: None, request: REQUEST, driver: driver.name(), versions };
    check_file(&ctx, &pod, &first_container(&pod), &path, &want).await?;
    check_prepared(&driver, &pod, &claim, &[REQUEST])?;
    delete_and_unprepare(&b, &pod, &[(&driver, &claim)]).await
}

async fn containers(ctx: Ctx, versions: &'static [MetadataVersion]) -> SpecResult {
    let (driver, b) = setup(&ctx, versions).await?;
    let mut claim = b.external_claim();
    let devices =
        claim.spec.as_mut().and_then(|s| s.devices.as_mut()).context("the builder's claim has no devices")?;
    let first = devices.requests.as_ref().and_then(|r| r.first()).cloned().context("no request")?;
    let named = |name: &str| {
        let mut request = first.clone();
        request.name = name.to_owned();
        request
    };
    devices.requests = Some(vec![named("req0"), named("req1")]);
    let claim = b.create_claim(&claim).await?;

    let (pod, _) = b
        .pod_with_claims()
        .claim("resource-claim", &claim.name_any())
        .container("all-requests", &["resource-claim"])
        .container("req1-only", &["resource-claim/req1"])
        .build();
    b.create_pod(&pod).await?;
    let pod = b.test_pod(&pod, &[]).await?;
    let claim = checks::claims(&ctx).get(&claim.name_any()).await.context("get the allocated claim")?;

    for (container, request) in [("all-requests", "req0"), ("all-requests", "req1"), ("req1-only", "req1")] {
        let path = metadata::resource_claim_file_path(driver.name(), &claim.name_any(), request);
        let want = Expected { claim: &claim, pod_claim: None, request, driver: driver.name(), versions };
        check_file(&ctx, &pod, container, &path, &want).await?;
    }
    let req0 = metadata::resource_claim_file_path(driver.name(), &claim.name_any(), "req0");
    let out = exec(ctx.client(), ctx.namespace(), &pod.name_any(), "req1-only", &["cat", &req0]).await?;
    expect!(
        !out.success,
        "container req1-only can read {req0}, which belongs to request req0:\n{}",
        out.stdout
    );
    check_prepared(&driver, &pod, &claim, &["req0", "req1"])?;
    delete_and_unprepare(&b, &pod, &[(&driver, &claim)]).await
}

async fn templates(ctx: Ctx, versions: &'static [MetadataVersion]) -> SpecResult {
    let (driver, b) = setup(&ctx, versions).await?;
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let pod = b.test_pod(&pod, &[]).await?;
    let claims = b.pod_claims(&pod).await?;
    let claim = claims.get("my-inline-claim").context("the pod has no claim my-inline-claim")?;
    let path = metadata::resource_claim_template_file_path(driver.name(), "my-inline-claim", REQUEST);
    let want = Expected {
        claim,
        pod_claim: Some("my-inline-claim"),
        request: REQUEST,
        driver: driver.name(),
        versions,
    };
    check_file(&ctx, &pod, &first_container(&pod), &path, &want).await?;
    check_prepared(&driver, &pod, claim, &[REQUEST])?;
    delete_and_unprepare(&b, &pod, &[(&driver, claim)]).await
}

async fn multiple_drivers(ctx: Ctx) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let start = |suffix: &'static str| {
        let config = DriverConfig::kubelet(resources::node_local(1))
            .name_suffix(suffix)
            .device_metadata(&[MetadataVersion::V1beta1]);
        Driver::start(&ctx, &nodes, config)
    };
    let driver_a = start("-a").await?;
    let driver_b = start("-b").await?;
    let b_a = Builder::start(&ctx, &driver_a, None).await?;
    let b_b = Builder::start_without_class(&ctx, &driver_b, None);

    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": { "name": format!("{}-shared-class", ctx.namespace()) },
        "spec": { "selectors": [{ "cel": { "expression": format!(
            r#"device.driver == "{}" || device.driver == "{}""#, driver_a.name(), driver_b.name()
        ) } }] },
    }))
    .context("the shared DeviceClass")?;
    b_a.create_class(&class).await?;
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": { "name": "multi-driver-claim", "namespace": ctx.namespace() },
        "spec": { "devices": { "requests": [{ "name": REQUEST, "exactly": {
            "deviceClassName": class.name_any(), "allocationMode": "ExactCount", "count": 2,
        } }] } },
    }))
    .context("the claim")?;
    let claim = b_a.create_claim(&claim).await?;
    let pod = b_a.pod_external(&claim.name_any());
    b_a.create_pod(&pod).await?;
    let pod = b_a.wait_running(&pod).await?;
    b_a.expect_prepared(&pod).await?;
    b_b.expect_prepared(&pod).await?;
    let claim = checks::claims(&ctx).get(&claim.name_any()).await.context("get the allocated claim")?;
    for driver in [&driver_a, &driver_b] {
        let path = metadata::resource_claim_file_path(driver.name(), &claim.name_any(), REQUEST);
        let want = Expected {
            claim: &claim,
            pod_claim: None,
            request: REQUEST,
            driver: driver.name(),
            versions: &[MetadataVersion::V1beta1],
        };
        check_file(&ctx, &pod, &first_container(&pod), &path, &want).await?;
        check_prepared(driver, &pod, &claim, &[REQUEST])?;
    }
    delete_and_unprepare(&b_a, &pod, &[(&driver_a, &claim), (&driver_b, &claim)]).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// The full texts as upstream renders them (ginkgo `--dry-run -v` of v1.37.2 dra.go).
    #[test]
    fn full_texts_match_upstream() {
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry);
        registry.validate().unwrap();
        let mut texts: Vec<String> = registry.specs().map(|s| s.full_text().to_owned()).collect();
        texts.sort();
        let m = "[sig-node] [DRA] metadata [Feature:DynamicResourceAllocation]";
        let mut expected =
            vec![format!("{m} must not race when multiple drivers write metadata for the same request")];
        for versions in ["v1beta1", "v1alpha1+v1beta1"] {
            for spec in [
                "must mount device metadata for resource claims",
                "must map device metadata to the right containers",
                "must mount device metadata for resource claim templates",
            ] {
                expected.push(format!("{m} {versions} {spec}"));
            }
        }
        expected.sort();
        assert_eq!(texts, expected);
    }
}
