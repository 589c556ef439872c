//! Upstream's `kubelet` context with per-node resources: 1 to 4 nodes, one device per node
//! (`DriverResources(1)`), published as the node's pool.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{Builder, is_allocated, node_name},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    plugin::ClaimId,
    wait::{self, Verdict},
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::ResourceSlice,
};
use kube::{Api, ResourceExt as _, runtime::watcher};
use serde_json::json;

use super::checks::{
    self, POD_DELETE_TIMEOUT, POD_START_SLOW_TIMEOUT, generated_claim, stays, wait_succeeded,
};
use crate::specs::LONG_PRIORITY;

/// How long the slices may take to appear, and how long they must then stay unchanged
/// (upstream: `Eventually` and `Consistently` with 20 s each).
const SLICES_SETTLE: Duration = Duration::from_secs(20);

/// Registers the specs (inside the `kubelet` context).
pub fn register(r: &mut Registry) {
    r.it("must manage ResourceSlices", manage_slices).priority(LONG_PRIORITY);
    r.it("supports init containers with external claims", init_containers_external_claim);
    r.it("removes reservation from claim when pod is done", removes_reservation);
    r.it("deletes generated claims when pod is done", deletes_generated_claims);
    r.it("does not delete generated claims when pod is restarting", keeps_claims_of_restarting_pod)
        .priority(LONG_PRIORITY);
}

/// 1 to 4 nodes, one device each, a driver registered with their kubelets.
async fn setup(ctx: &Ctx) -> SpecResult<(Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 4).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::node_local(1))).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    Ok((driver, b))
}

/// What is wrong with the driver's slices: each node must have exactly one, owned by its Node
/// object, in a pool named after it, with the one device `device-00`; no other slices.
fn slice_problem(driver: &str, nodes: &[Node], slices: &[ResourceSlice]) -> Option<String> {
    if slices.len() != nodes.len() {
        return Some(format!("{} slices for {} nodes", slices.len(), nodes.len()));
    }
    for node in nodes {
        let name = node.name_any();
        let mine: Vec<&ResourceSlice> =
            slices.iter().filter(|s| s.spec.node_name.as_deref() == Some(name.as_str())).collect();
        let [slice] = mine.as_slice() else {
            return Some(format!("node {name} has {} slices, expected one", mine.len()));
        };
        let owned = slice.owner_references().iter().any(|o| {
            o.api_version == "v1"
                && o.kind == "Node"
                && o.name == name
                && Some(&o.uid) == node.metadata.uid.as_ref()
                && o.controller == Some(true)
                && o.block_owner_deletion.is_none()
        });
        let spec = &slice.spec;
        let devices = serde_json::to_value(&spec.devices).unwrap_or_default();
        let problems: Vec<&str> = [
            (!owned, "not owned by its Node (controller, same UID, no blockOwnerDeletion)"),
            (spec.driver != driver, "wrong driver"),
            (spec.node_selector.is_some() || spec.all_nodes.is_some(), "has a node selector or allNodes"),
            (spec.pool.name != name, "pool not named after the node"),
            (spec.pool.resource_slice_count != 1, "resourceSliceCount is not 1"),
            (devices != json!([{ "name": "device-00" }]), "devices are not exactly [device-00]"),
        ]
        .into_iter()
        .filter_map(|(bad, what)| bad.then_some(what))
        .collect();
        if !problems.is_empty() {
            return Some(format!("slice {} of node {name}: {}", slice.name_any(), problems.join(", ")));
        }
    }
    None
}

async fn manage_slices(ctx: Ctx) -> SpecResult {
    let (driver, _b) = setup(&ctx).await?;
    let node_api: Api<Node> = Api::all(ctx.client().clone());
    let mut nodes = Vec::new();
    for name in driver.node_names() {
        nodes.push(node_api.get(name).await?);
    }
    let slices: Api<ResourceSlice> = Api::all(ctx.client().clone());
    let selector = format!("spec.driver={}", driver.name());
    let name = driver.name().to_owned();
    let found = wait::objects(
        &slices,
        watcher::Config::default().fields(&selector),
        format!("one ResourceSlice per node {:?} of driver {name}", driver.node_names()),
        SLICES_SETTLE,
        |s| Verdict::done_if(slice_problem(&name, &nodes, s).is_none()),
    )
    .await?;
    let mut uids: Vec<String> = found.iter().filter_map(|s| s.uid()).collect();
    uids.sort();
    // Upstream's Consistently: a watch for 20 s in which every state must still match, here also
    // with the same objects (nothing deleted and recreated them).
    stays(
        &slices,
        watcher::Config::default().fields(&selector),
        "the ResourceSlices to stay as published",
        SLICES_SETTLE,
        |s| {
            let mut now: Vec<String> = s.iter().filter_map(|s| s.uid()).collect();
            now.sort();
            slice_problem(&name, &nodes, s)
                .or_else(|| (now != uids).then(|| format!("slices were replaced: UIDs {uids:?} -> {now:?}")))
        },
    )
    .await?;
    for node in driver.node_names() {
        driver.calls(node).expect_none(Method::NodePrepareResources).context("no pod uses the driver")?;
    }
    Ok(())
}

async fn init_containers_external_claim(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx).await?;
    let claim = b.external_claim();
    let mut pod = b.pod_external(&claim.name_any());
    let spec = pod.spec.as_mut().context("pod without spec")?;
    let first = spec.containers.first().context("pod without container")?;
    // This must succeed for the pod to start.
    spec.init_containers = Some(vec![harness::builder::env_checking_init_container(first)]);
    b.create_pod(&pod).await?;
    b.create_claim(&claim).await?;
    let running = b.test_pod(&pod, &[]).await?;
    // The init container found the claim's env (grep succeeded) before the pod could run.
    let exit = running
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(|s| s.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    expect!(exit == Some(0), "the init container should have terminated with exit code 0, got {exit:?}");
    Ok(())
}

/// Makes the pod's first container exit 0 at once.
fn run_true(pod: &mut Pod) -> anyhow::Result<()> {
    let spec = pod.spec.as_mut().context("pod without spec")?;
    spec.containers.first_mut().context("pod without container")?.command = Some(vec!["true".into()]);
    Ok(())
}

async fn removes_reservation(ctx: Ctx) -> SpecResult {
    let (driver, b) = setup(&ctx).await?;
    let claim = b.external_claim();
    let mut pod = b.pod_external(&claim.name_any());
    run_true(&mut pod)?;
    let created = b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let done = wait_succeeded(&b, &pod).await?;
    let node = node_name(&done).context("the pod ran on no node")?.to_owned();
    let uid = created.uid().unwrap_or_default();
    // The kubelet prepared the claim for the container, and unprepared it once the pod was done.
    let history = driver.calls(&node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    expect!(history.prepared() >= 1, "the claim was never prepared: {history}");
    b.wait_claim(&claim.name_any(), "to be unreserved", POD_DELETE_TIMEOUT, |c| {
        Verdict::done_if(c.status.as_ref().and_then(|s| s.reserved_for.as_ref()).is_none_or(Vec::is_empty))
    })
    .await?;
    Ok(())
}

async fn deletes_generated_claims(ctx: Ctx) -> SpecResult {
    let (driver, b) = setup(&ctx).await?;
    let (mut pod, template) = b.pod_inline();
    run_true(&mut pod)?;
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let done = wait_succeeded(&b, &pod).await?;
    let node = node_name(&done).context("the pod ran on no node")?.to_owned();
    let claim = generated_claim(&done)?;
    let uid = driver.calls(&node).log().claim_uid(&claim)?;
    let history = driver.calls(&node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    expect!(history.prepared() >= 1, "the generated claim {claim} was never prepared: {history}");
    wait::objects(
        &checks::claims(&ctx),
        watcher::Config::default(),
        "the generated claim to be deleted",
        POD_DELETE_TIMEOUT,
        |claims| Verdict::done_if(claims.is_empty()),
    )
    .await?;
    Ok(())
}

async fn keeps_claims_of_restarting_pod(ctx: Ctx) -> SpecResult {
    let (driver, b) = setup(&ctx).await?;
    let (mut pod, template) = b.pod_inline();
    let spec = pod.spec.as_mut().context("pod without spec")?;
    spec.containers.first_mut().context("pod without container")?.command =
        Some(vec!["sh".into(), "-c".into(), "sleep 1; exit 1".into()]);
    spec.restart_policy = Some("Always".into());
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let restarted = b
        .wait_pod(&pod, "to restart twice", POD_START_SLOW_TIMEOUT, |p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
                .unwrap_or(0);
            Verdict::done_if(restarts >= 2)
        })
        .await?;
    // The claim is still there, allocated and reserved for the pod...
    let name = generated_claim(&restarted)?;
    let claim = checks::claims(&ctx).get(&name).await?;
    let pod_uid = restarted.uid().unwrap_or_default();
    let reserved = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| r.iter().any(|r| r.uid == pod_uid));
    expect!(is_allocated(&claim) && reserved, "claim {name} should stay allocated and reserved for the pod");
    // ...and the kubelet prepared it once and never unprepared it while restarting containers.
    let node = node_name(&restarted).context("the pod runs on no node")?.to_owned();
    let uid = claim.uid().unwrap_or_default();
    let history = driver.calls(&node).claim(&uid);
    history.expect_prepared_once()?;
    history.expect_never_unprepared()?;
    let id = ClaimId { name: name.clone(), uid };
    expect!(
        driver.prepared_claims(&node).contains(&id),
        "the plugin no longer holds claim {name} as prepared"
    );
    Ok(())
}
