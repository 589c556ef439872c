//! The `Serial` specs with upstream's sample device plugin ([`harness::device_plugin`]), which
//! advertises `example.com/resource` through the kubelet's device manager: the same name a
//! DeviceClass maps to DRA here.

use anyhow::Context as _;
use harness::{
    builder::{Builder, exec},
    calls::Method,
    device_plugin::{self, DevicePlugin},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, SpecResult},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt as _, api::ListParams};

use super::{
    super::kubelet::checks::claims, container_name, expect_extended, first_container, node_of, quantities,
    set_resources, setup,
};

/// A pod of the builder whose container asks for `count` devices of the plugin's resource.
fn device_plugin_pod(b: &Builder, count: &str) -> anyhow::Result<Pod> {
    let mut pod = b.pod();
    set_resources(first_container(&mut pod)?, &quantities(&[(device_plugin::RESOURCE_NAME, count)]));
    Ok(pod)
}

/// The device plugin's mounts (`/tmp/Dev-<n>`) the container sees.
async fn device_plugin_mounts(ctx: &Ctx, pod: &Pod, container: &str) -> anyhow::Result<Vec<String>> {
    let script = format!(
        "for d in {}; do if [ -e $d ]; then echo $d; fi; done",
        device_plugin::DEVICE_PATHS.join(" ")
    );
    let out = exec(ctx.client(), ctx.namespace(), &pod.name_any(), container, &["sh", "-c", &script]).await?;
    expect!(
        out.success,
        "looking for the device plugin's mounts in {}/{container} failed: {}; stderr: {}",
        pod.name_any(),
        out.message,
        out.stderr.trim()
    );
    Ok(out.stdout.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect())
}

/// Checks that a pod served by the device plugin has no extended resource claim, and sees the
/// plugin's mounts for `devices` devices.
async fn expect_served_by_device_plugin(ctx: &Ctx, pod: &Pod, devices: usize) -> anyhow::Result<()> {
    let status = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    expect!(
        status.is_none(),
        "pod {} should be served by the device plugin, without a special claim; its status has {status:?}",
        pod.name_any()
    );
    let container = container_name(pod, 0)?;
    let mounts = device_plugin_mounts(ctx, pod, &container).await?;
    expect!(
        mounts.len() == devices,
        "pod {} should see the device plugin's mounts of {devices} device(s) (of {:?}), it sees {mounts:?}",
        pod.name_any(),
        device_plugin::DEVICE_PATHS
    );
    Ok(())
}

/// "process extended resources after device plugin uninstall": once the device plugin that
/// advertised `example.com/resource` is gone, a class for that name makes DRA serve it.
/// Beyond upstream: [`expect_extended`] (the kubelet prepared the special claim).
pub async fn after_uninstall(ctx: Ctx) -> SpecResult {
    let (_driver, b, node) = setup(&ctx).await?;
    let plugin = DevicePlugin::deploy(&ctx, std::slice::from_ref(&node)).await?;
    expect!(
        plugin.resource_name() == device_plugin::RESOURCE_NAME,
        "unexpected resource {}",
        plugin.resource_name()
    );
    plugin.undeploy().await?;

    let mut pod = device_plugin_pod(&b, "1")?;
    first_container(&mut pod)?.name = "container0".to_owned();
    b.create_class(&b.class_with_extended_resource(device_plugin::RESOURCE_NAME)).await?;
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    expect!(
        running.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some(),
        "after device plugin uninstall, DRA must serve the resource and create a special claim"
    );
    expect_extended(&b, &running, &[("container0", &["container_0_request_0"])]).await?;
    Ok(())
}

/// "must prefer device plugin over DRA when both advertise the same resource on a node": no
/// special claim. Beyond upstream: no claim exists, the kubelet was not asked to prepare
/// anything, and the container sees the device plugin's mount of one device.
pub async fn prefer_device_plugin(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let plugin = DevicePlugin::deploy(&ctx, std::slice::from_ref(&node)).await?;
    expect!(
        plugin.resource_name() == device_plugin::RESOURCE_NAME,
        "unexpected resource {}",
        plugin.resource_name()
    );
    let pod = device_plugin_pod(&b, "1")?;
    b.create_class(&b.class_with_extended_resource(device_plugin::RESOURCE_NAME)).await?;
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    expect_served_by_device_plugin(&ctx, &running, 1).await?;
    let list = claims(&ctx).list(&ListParams::default()).await.context("list ResourceClaims")?;
    let names: Vec<String> = list.items.iter().map(|c| c.name_any()).collect();
    expect!(names.is_empty(), "no claim should exist when the device plugin serves the pod, found {names:?}");
    driver
        .calls(&node)
        .expect_none(Method::NodePrepareResources)
        .context("the device plugin serves the pod")?;
    Ok(())
}

/// The second context: "must run pods with extended resource on dra nodes and device plugin
/// nodes". One node with the driver and two devices, one reserved node with the device plugin;
/// two pods asking for two devices each land one on each. Beyond upstream: the DRA pod's claim
/// is checked with [`expect_extended`] and has both devices, the device plugin's pod sees both
/// of its mounts.
pub async fn dra_and_device_plugin_nodes(ctx: Ctx) -> SpecResult {
    let nodes = Nodes::select_reserving(&ctx, 1, 1, 1).await?;
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::network(2, false))).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let (dra_node, dp_node) = match (nodes.names(), nodes.extra()) {
        ([d], [p]) => (d.clone(), p.clone()),
        (d, p) => fail!("expected one driver node and one reserved node, got {d:?} and {p:?}"),
    };
    let plugin = DevicePlugin::deploy(&ctx, std::slice::from_ref(&dp_node)).await?;
    expect!(
        plugin.resource_name() == device_plugin::RESOURCE_NAME,
        "unexpected resource {}",
        plugin.resource_name()
    );

    let pods = [device_plugin_pod(&b, "2")?, device_plugin_pod(&b, "2")?];
    b.create_class(&b.class_with_extended_resource(device_plugin::RESOURCE_NAME)).await?;
    for pod in &pods {
        b.create_pod(pod).await?;
    }
    let mut running = Vec::new();
    for pod in &pods {
        running.push(b.wait_running(pod).await?);
    }
    let (first, second) = (node_of(&running[0])?, node_of(&running[1])?);
    let (dra_pod, dp_pod) =
        if first == dp_node { (&running[1], &running[0]) } else { (&running[0], &running[1]) };
    expect!(
        node_of(dp_pod)? == dp_node,
        "one pod should run on the device plugin's node {dp_node}; they run on {first} and {second}"
    );
    expect!(
        node_of(dra_pod)? == dra_node,
        "the other pod should run on the driver's node {dra_node}, not {}",
        node_of(dra_pod)?
    );
    expect_served_by_device_plugin(&ctx, dp_pod, 2).await?;
    let container = container_name(dra_pod, 0)?;
    let claim = expect_extended(&b, dra_pod, &[(&container, &["container_0_request_0"])]).await?;
    let devices = harness::builder::allocation_results(&claim).len();
    expect!(devices == 2, "the DRA pod's claim should have both devices, it has {devices}");
    Ok(())
}
