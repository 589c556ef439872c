//! Upstream's `singleNodeTests(withKubelet)`: one node, one device (`DriverResources(1)`),
//! class parameters `{"x":"y"}`, five pods for the concurrency specs. Registered twice, as
//! upstream does: in the `control plane` context without kubelet ([`register`]: pods are only
//! scheduled, allocations are checked) and in `kubelet ... on single node` with kubelet
//! ([`register_kubelet`]: pods run, their env is checked inside the containers, and the
//! recorded gRPC calls show that the kubelet prepared and unprepared their claims). The kubelet
//! context adds "supports extended resources together with ResourceClaim", which deploys
//! upstream's sample device plugin ([`harness::device_plugin`]).

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use futures::future::try_join_all;
use harness::{
    builder::{Builder, exec, pod_claim_names},
    calls::{Method, UNPREPARE_TIMEOUT},
    device_plugin::{self, DevicePlugin},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
};
use k8s_openapi::{
    api::{
        core::v1::Pod,
        resource::v1::{DeviceClass, ResourceClaim},
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, ResourceExt as _,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// Number of pods of the concurrency specs.
const NUM_PODS: usize = 5;

/// The env the class and claim parameters give.
const EXPECTED_ENV: &[(&str, &str)] = &[("admin_x", "y"), ("user_a", "b")];

/// Registers the specs without kubelet (inside the `control plane` context).
pub fn register(r: &mut Registry) {
    register_with(r, false);
}

/// Registers the specs with kubelet (inside the `kubelet ... on single node` context), plus the
/// kubelet-only extended resources spec (upstream registers it only with kubelet, too).
pub fn register_kubelet(r: &mut Registry) {
    register_with(r, true);
    r.it("supports extended resources together with ResourceClaim", extended_resources).label("Serial");
}

/// Registers every spec of `singleNodeTests(kubelet)`.
fn register_with(r: &mut Registry, kubelet: bool) {
    r.it("supports claim and class parameters", move |ctx| claim_and_class_parameters(ctx, kubelet));
    r.it("supports reusing resources", move |ctx| reusing_resources(ctx, kubelet));
    r.it("supports sharing a claim concurrently", move |ctx| sharing_a_claim(ctx, kubelet));
    r.it("retries pod scheduling after creating device class", move |ctx| {
        retry_after_creating_class(ctx, kubelet)
    });
    r.it("retries pod scheduling after updating device class", move |ctx| {
        retry_after_updating_class(ctx, kubelet)
    });
    r.it("runs a pod without a generated resource claim", move |ctx| without_generated_claim(ctx, kubelet));
    r.it("supports simple pod referencing inline resource claim", move |ctx| inline_claim(ctx, kubelet));
    r.it("supports inline claim referenced by multiple containers", move |ctx| {
        inline_claim_multiple_containers(ctx, kubelet)
    });
    r.it("supports simple pod referencing external resource claim", move |ctx| external_claim(ctx, kubelet));
    r.it("supports external claim referenced by multiple pods", move |ctx| {
        external_claim_multiple_pods(ctx, kubelet)
    });
    r.it("supports external claim referenced by multiple containers of multiple pods", move |ctx| {
        external_claim_multiple_containers_and_pods(ctx, kubelet)
    });
    r.it("supports init containers", move |ctx| init_containers(ctx, kubelet));
    r.it("must deallocate after use", move |ctx| deallocate_after_use(ctx, kubelet));
}

/// One node, a driver with one device on it (registered with the kubelet or control plane
/// only), a builder with class parameters.
async fn setup(ctx: &Ctx, kubelet: bool) -> SpecResult<(Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let config = if kubelet {
        DriverConfig::kubelet(resources::node_local(1))
    } else {
        DriverConfig::control_plane(resources::node_local(1))
    };
    let driver = Driver::start(ctx, &nodes, config).await?;
    let b = Builder::start(ctx, &driver, Some(json!({"x": "y"}))).await?;
    Ok((driver, b))
}

/// With kubelet: fails unless the kubelet never called `NodePrepareResources` (why: `why`).
fn expect_no_prepare(driver: &Driver, kubelet: bool, why: &str) -> anyhow::Result<()> {
    if kubelet {
        let node = &driver.node_names()[0];
        driver.calls(node).expect_none(Method::NodePrepareResources).context(why.to_owned())?;
    }
    Ok(())
}

/// With kubelet: waits until the kubelet unprepared each claim (by UID) after its pod is gone.
async fn expect_unprepared(driver: &Driver, kubelet: bool, claims: &[&ResourceClaim]) -> anyhow::Result<()> {
    if !kubelet {
        return Ok(());
    }
    let node = &driver.node_names()[0];
    for claim in claims {
        let uid = claim.uid().unwrap_or_default();
        let history = driver.calls(node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
        expect!(history.prepared() >= 1, "claim {} was never prepared: {history}", claim.name_any());
    }
    Ok(())
}

/// With kubelet: the plugin holds exactly these claims (by UID) as prepared.
fn expect_held(driver: &Driver, kubelet: bool, claims: &[&ResourceClaim]) -> anyhow::Result<()> {
    if !kubelet {
        return Ok(());
    }
    let node = &driver.node_names()[0];
    let mut held: Vec<String> = driver.prepared_claims(node).into_iter().map(|c| c.uid).collect();
    let mut want: Vec<String> = claims.iter().map(|c| c.uid().unwrap_or_default()).collect();
    held.sort();
    want.sort();
    want.dedup();
    expect!(held == want, "the plugin on node {node} holds claims {held:?} as prepared, expected {want:?}");
    Ok(())
}

async fn claim_and_class_parameters(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (_driver, b) = setup(&ctx, kubelet).await?;
    let (pod, template) = b.pod_inline();
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;
    let pod = b.test_pod(&pod, EXPECTED_ENV).await?;
    if kubelet {
        // Exactly the driver's variables: class and claim parameters and the claim marker.
        let claim = pod_claim_names(&pod).into_values().next().flatten().context("no generated claim")?;
        let marker = harness::plugin::claim_env_name(&claim, harness::builder::REQUEST_NAME);
        let mut env = EXPECTED_ENV.to_vec();
        env.push((marker.as_str(), "true"));
        let container =
            pod.spec.as_ref().and_then(|s| s.containers.first()).context("pod without container")?;
        b.expect_env_exact(&pod, &container.name, &env).await?;
    }
    Ok(())
}

async fn reusing_resources(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let mut pods = Vec::new();
    for _ in 0..NUM_PODS {
        let (pod, template) = b.pod_inline();
        b.create_pod(&pod).await?;
        b.create_template(&template).await?;
        pods.push(pod);
    }
    // The order does not matter: each pod gets the one device eventually, then frees it.
    let devices = try_join_all(pods.iter().map(|pod| {
        let b = b.clone();
        async move {
            let scheduled = b.test_pod(pod, EXPECTED_ENV).await?;
            let claims = b.pod_claims(&scheduled).await?;
            b.delete_pod_and_wait(pod).await?;
            // With kubelet, the device is free for the next pod once the kubelet unprepared it.
            expect_unprepared(b.driver(), kubelet, &claims.values().collect::<Vec<_>>()).await?;
            anyhow::Ok(allocated_devices(claims.values()))
        }
    }))
    .await?;
    let node = &driver.node_names()[0];
    for (pod, devices) in pods.iter().zip(&devices) {
        expect!(
            devices == &[format!("{node}/device-00")],
            "pod {} got devices {devices:?}, expected the node's only device {node}/device-00",
            pod.name_any()
        );
    }
    Ok(())
}

async fn sharing_a_claim(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let claim = b.external_claim();
    b.create_claim(&claim).await?;
    let mut pods = Vec::new();
    for _ in 0..NUM_PODS {
        let pod = b.pod_external(&claim.name_any());
        b.create_pod(&pod).await?;
        pods.push(pod);
    }
    let scheduled = try_join_all(pods.iter().map(|pod| b.test_pod(pod, EXPECTED_ENV))).await?;
    // One allocation, reserved for all of them at the same time.
    let stored_claim = claims_api(&ctx).get(&claim.name_any()).await?;
    let reserved: Vec<String> = stored_claim
        .status
        .clone()
        .and_then(|s| s.reserved_for)
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.uid)
        .collect();
    for pod in &scheduled {
        let uid = pod.uid().unwrap_or_default();
        expect!(
            reserved.contains(&uid),
            "claim is not reserved for pod {} at the same time as the others: {reserved:?}",
            pod.name_any()
        );
    }
    // With kubelet, the one claim is prepared once for all of them.
    expect_held(&driver, kubelet, &[&stored_claim])?;
    if kubelet {
        expect_shared_claim_lifecycle(&driver, &b, &stored_claim, &scheduled).await?;
    }
    Ok(())
}

/// Beyond upstream, which only runs the pods: the kubelet prepared the shared claim for them (at
/// most once per pod: pods that start together may each prepare it before the first call
/// returns, which the contract allows, prepares being idempotent), kept it prepared while any of
/// them still ran, and unprepared it once after the last.
async fn expect_shared_claim_lifecycle(
    driver: &Driver,
    b: &Builder,
    claim: &ResourceClaim,
    pods: &[Pod],
) -> anyhow::Result<()> {
    let node = &driver.node_names()[0];
    let uid = claim.uid().unwrap_or_default();
    let history = driver.calls(node).claim(&uid);
    let prepares = history.prepares().count();
    expect!(
        (1..=pods.len()).contains(&prepares) && history.prepared() == prepares,
        "the kubelet sent {prepares} NodePrepareResources calls for the claim that {} pods share, expected between one and one per pod, each succeeding: {history}",
        pods.len()
    );
    let Some((last, others)) = pods.split_last() else { return Ok(()) };
    // A pod is gone only once the kubelet reclaimed its resources (its claims unprepared or
    // released), so what the kubelet did for these pods is in the log now.
    try_join_all(others.iter().map(|pod| b.delete_pod_and_wait(pod))).await?;
    let history = driver.calls(node).claim(&uid);
    expect!(
        history.unprepares().count() == 0,
        "the kubelet unprepared the shared claim while pod {} still uses it (after the other {} pods were deleted): {history}",
        last.name_any(),
        others.len()
    );
    b.delete_pod_and_wait(last).await?;
    driver.calls(node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    let history = driver.calls(node).claim(&uid);
    expect!(
        history.unprepares().count() == 1,
        "the kubelet sent {} NodeUnprepareResources calls for the shared claim after its last pod went, expected one: {history}",
        history.unprepares().count()
    );
    Ok(())
}

async fn retry_after_creating_class(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let (pod, mut template) = b.pod_inline();
    let class_name = format!("{}-b", b.class_name());
    set_template_class(&mut template, &class_name)?;
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    b.wait_unschedulable(&pod).await?;
    expect_no_prepare(&driver, kubelet, "the pod is not scheduled")?;

    let mut class = classes_api(&ctx).get(&b.class_name()).await?;
    class.metadata = Default::default();
    class.metadata.name = Some(class_name);
    b.create_class(&class).await?;
    b.test_pod(&pod, EXPECTED_ENV).await?;
    Ok(())
}

async fn retry_after_updating_class(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let (pod, template) = b.pod_inline();
    // First make the class match no devices.
    let api = classes_api(&ctx);
    let mut class = api.get(&b.class_name()).await?;
    let original = class.spec.clone();
    class.spec.get_or_insert_default().selectors =
        Some(vec![serde_json::from_value(json!({"cel": {"expression": "false"}}))?]);
    let class = api.replace(&b.class_name(), &PostParams::default(), &class).await?;

    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    b.wait_unschedulable(&pod).await?;
    expect_no_prepare(&driver, kubelet, "the pod is not scheduled")?;

    // Unblock the pod.
    let mut class = class;
    class.spec = original;
    api.replace(&b.class_name(), &PostParams::default(), &class).await?;
    b.test_pod(&pod, EXPECTED_ENV).await?;
    Ok(())
}

async fn without_generated_claim(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    // No template: the claim could never be generated.
    let (pod, _template) = b.pod_inline();
    let created = b.create_pod(&pod).await?;
    // The status says that the claim is not needed, which lets the pod run.
    let claim_name = pod_claim_names(&created).into_keys().next().context("the pod has no pod claim")?;
    let patch = json!({"status": {"resourceClaimStatuses": [{"name": claim_name}]}});
    pods_api(&ctx).patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    b.wait_running(&pod).await?;
    let claims = claims_api(&ctx).list(&ListParams::default()).await?;
    expect!(
        claims.items.is_empty(),
        "no ResourceClaim should exist, found {:?}",
        claims.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    // With kubelet, the pod runs without the driver being asked for anything.
    expect_no_prepare(&driver, kubelet, "the pod has no claim")?;
    Ok(())
}

async fn inline_claim(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let (pod, template) = b.pod_inline();
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;
    let running = b.test_pod(&pod, &[]).await?;
    let claims = b.pod_claims(&running).await?;
    expect_held(&driver, kubelet, &claims.values().collect::<Vec<_>>())?;
    Ok(())
}

async fn inline_claim_multiple_containers(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let (pod, template) = b.pod_inline_multiple();
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;
    let scheduled = b.test_pod(&pod, &[]).await?;
    expect_containers_use_claim(&scheduled, 3)?;
    let claims = b.pod_claims(&scheduled).await?;
    expect_held(&driver, kubelet, &claims.values().collect::<Vec<_>>())?;
    Ok(())
}

async fn external_claim(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    let created = b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;
    expect_held(&driver, kubelet, &[&created])?;
    Ok(())
}

async fn external_claim_multiple_pods(ctx: Ctx, kubelet: bool) -> SpecResult {
    external_claim_shared(ctx, kubelet, false).await
}

async fn external_claim_multiple_containers_and_pods(ctx: Ctx, kubelet: bool) -> SpecResult {
    external_claim_shared(ctx, kubelet, true).await
}

/// Three pods (of one or three containers each) share one external claim.
async fn external_claim_shared(ctx: Ctx, kubelet: bool, multiple_containers: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let claim = b.external_claim();
    let pods: Vec<Pod> = (0..3)
        .map(|_| {
            if multiple_containers {
                b.pod_external_multiple(&claim.name_any())
            } else {
                b.pod_external(&claim.name_any())
            }
        })
        .collect();
    let created = b.create_claim(&claim).await?;
    for pod in &pods {
        b.create_pod(pod).await?;
    }
    let mut allocations = Vec::new();
    for pod in &pods {
        let scheduled = b.test_pod(pod, &[]).await?;
        expect_containers_use_claim(&scheduled, if multiple_containers { 3 } else { 1 })?;
        allocations.push(allocated_devices(b.pod_claims(&scheduled).await?.values()));
    }
    expect!(
        allocations.windows(2).all(|w| w[0] == w[1]),
        "the pods see different allocations: {allocations:?}"
    );
    // With kubelet, the one claim is prepared for all three pods.
    expect_held(&driver, kubelet, &[&created])?;
    Ok(())
}

async fn init_containers(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (_driver, b) = setup(&ctx, kubelet).await?;
    let (mut pod, template) = b.pod_inline();
    let spec = pod.spec.as_mut().context("pod without spec")?;
    let first = spec.containers.first().context("pod without container")?;
    // This must succeed for the pod to start (with a kubelet).
    spec.init_containers = Some(vec![harness::builder::env_checking_init_container(first)]);
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;
    let scheduled = b.test_pod(&pod, &[]).await?;
    let init_claims = scheduled
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.claims.clone())
        .unwrap_or_default();
    expect!(init_claims.len() == 1, "the init container must use the claim, it uses {init_claims:?}");
    if kubelet {
        // The init container found the claim's env (its grep succeeded).
        let exit = scheduled
            .status
            .as_ref()
            .and_then(|s| s.init_container_statuses.as_ref())
            .and_then(|s| s.first())
            .and_then(|s| s.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        expect!(exit == Some(0), "the init container should have terminated with exit code 0, got {exit:?}");
    }
    Ok(())
}

async fn deallocate_after_use(ctx: Ctx, kubelet: bool) -> SpecResult {
    let (driver, b) = setup(&ctx, kubelet).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    b.wait_allocated(&claim.name_any()).await?;
    b.test_pod(&pod, &[]).await?;
    tracing::info!(pod = %pod.name_any(), "deleting pod");
    pods_api(&ctx).delete(&pod.name_any(), &Default::default()).await?;
    let claim = b.wait_deallocated(&claim.name_any()).await?;
    let reserved = claim.status.clone().and_then(|s| s.reserved_for).unwrap_or_default();
    expect!(reserved.is_empty(), "deallocated claim is still reserved for {reserved:?}");
    // With kubelet, the kubelet unprepared the claim (before its pod was gone).
    expect_unprepared(&driver, kubelet, &[&claim]).await?;
    Ok(())
}

/// Upstream's "supports extended resources together with ResourceClaim" (kubelet only, `Serial`:
/// the sample device plugin's resource name is fixed): with upstream's sample device plugin
/// advertising `example.com/resource` on the node, a pod that requests one of it and uses an
/// external claim runs with the claim's env. Beyond upstream: the recorded calls show that the
/// kubelet prepared the claim exactly once and without failure, and the container has the mount
/// the device plugin's Allocate answered for exactly one of its devices.
async fn extended_resources(ctx: Ctx) -> SpecResult {
    let (driver, b) = setup(&ctx, true).await?;
    let node = driver.node_names().first().cloned().context("the driver runs on no node")?;
    // After the builder, so that the plugin is removed before the builder's teardown runs.
    let plugin = DevicePlugin::deploy(&ctx, driver.node_names()).await?;

    let claim = b.external_claim();
    let mut pod = b.pod_external(&claim.name_any());
    let container =
        pod.spec.as_mut().and_then(|s| s.containers.first_mut()).context("pod without container")?;
    let one: BTreeMap<String, Quantity> =
        [(plugin.resource_name().to_owned(), Quantity("1".to_owned()))].into();
    let resources = container.resources.get_or_insert_default();
    resources.requests = Some(one.clone());
    resources.limits = Some(one);
    let container_name = container.name.clone();
    let created = b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, EXPECTED_ENV).await?;

    let uid = created.uid().unwrap_or_default();
    let calls = driver.calls(&node);
    calls.expect_none(Method::NodePrepareResources.for_claim_uid(&uid).failed())?;
    calls.claim(&uid).expect_prepared_once()?;
    expect_held(&driver, true, &[&created])?;

    // One device of the extended resource: the device plugin's mount for exactly one of them.
    let script = format!(
        "for d in {}; do if [ -e $d ]; then echo $d; fi; done",
        device_plugin::DEVICE_PATHS.join(" ")
    );
    let out =
        exec(ctx.client(), ctx.namespace(), &running.name_any(), &container_name, &["sh", "-c", &script])
            .await?;
    let mounted: Vec<&str> = out.stdout.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    expect!(
        out.success && mounted.len() == 1,
        "container {container_name} of pod {} should see the mount of exactly one {} device (one of {:?}), \
         it sees {mounted:?} (exec: success={}, {}; stderr: {})",
        running.name_any(),
        plugin.resource_name(),
        device_plugin::DEVICE_PATHS,
        out.success,
        out.message,
        out.stderr.trim()
    );
    Ok(())
}

/// `pool/device` of every allocation result, sorted.
pub(crate) fn allocated_devices<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Vec<String> {
    let mut out: Vec<String> = claims
        .into_iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref()?.results.clone())
        .flatten()
        .map(|r| format!("{}/{}", r.pool, r.device))
        .collect();
    out.sort();
    out
}

/// Every one of the `n` containers uses the pod's claim.
fn expect_containers_use_claim(pod: &Pod, n: usize) -> anyhow::Result<()> {
    let containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    expect!(
        containers.len() == n,
        "pod {} has {} containers, expected {n}",
        pod.name_any(),
        containers.len()
    );
    for c in &containers {
        let claims = c.resources.as_ref().and_then(|r| r.claims.clone()).unwrap_or_default();
        expect!(claims.len() == 1, "container {} uses claims {claims:?}, expected the pod's claim", c.name);
    }
    Ok(())
}

/// Points the template's request at another class.
fn set_template_class(
    template: &mut k8s_openapi::api::resource::v1::ResourceClaimTemplate,
    class: &str,
) -> anyhow::Result<()> {
    let exactly = template
        .spec
        .as_mut()
        .and_then(|s| s.spec.as_mut())
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
        .context("template without an exact request")?;
    exactly.device_class_name = class.to_owned();
    Ok(())
}

pub(crate) fn pods_api(ctx: &Ctx) -> Api<Pod> {
    Api::namespaced(ctx.client().clone(), ctx.namespace())
}

pub(crate) fn claims_api(ctx: &Ctx) -> Api<ResourceClaim> {
    Api::namespaced(ctx.client().clone(), ctx.namespace())
}

fn classes_api(ctx: &Ctx) -> Api<DeviceClass> {
    Api::all(ctx.client().clone())
}

/// Polling interval of the `Eventually` loops that retry API calls.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_millis(500);

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn allocated_devices_lists_pool_and_device() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "d", "pool": "node-1", "device": "device-00"}
            ]}}},
        }))
        .unwrap();
        assert_eq!(allocated_devices([&claim, &ResourceClaim::default()]), ["node-1/device-00"]);
    }

    #[test]
    fn template_class_can_be_changed() {
        let objects = harness::builder::Objects::new("ns", "ns.k8s.io", "", None);
        let (_, mut template) = objects.pod_inline();
        set_template_class(&mut template, "other").unwrap();
        let spec = template.spec.unwrap().spec.unwrap();
        assert_eq!(
            spec.devices.unwrap().requests.unwrap()[0].exactly.as_ref().unwrap().device_class_name,
            "other"
        );
    }
}
