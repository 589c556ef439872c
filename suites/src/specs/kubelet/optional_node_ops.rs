//! Upstream's `kubelet [FeatureGate:DRAOptionalNodeOperations]` context (dra.go,
//! `optionalNodeOperationsTests`): one node with one device (`DriverResources(1)`) whose slice
//! declares `spec.skipNodeOperations` (`*` = all, or `NodeUnprepareResources` only), copied into
//! the allocation; the kubelet then leaves out the `NodePrepareResources` /
//! `NodeUnprepareResources` calls the allocated devices skip.
//!
//! - `with control-plane only driver (no node plugin)`: no plugin exists, so the kubelet does not
//!   know the driver: a pod runs only when its allocation skips every node operation, otherwise
//!   the kubelet reports `FailedPrepareDynamicResources`.
//! - `with standard driver (node plugin running)`: the plugin is registered; its recorded calls
//!   show what the kubelet called and what it skipped.
//!
//! The spec's node must declare `DRAOptionalNodeOperations` in `status.declaredFeatures` (without
//! it the scheduler places no pod whose allocation skips node operations there): the specs run on
//! such a node ([`Nodes::select_declaring`]; on a version-skew cluster a v1.37 worker, not the
//! v1.34 one, whose kubelet does not know the gate), and their requirement skips them before
//! anything is created when no ready schedulable node declares it, saying what each node's
//! kubelet is and declares.
//!
//! Beyond upstream, every spec checks that the API server kept `skipNodeOperations` in the slice
//! and copied it into the allocation, and that the kubelet's counters
//! `dra_node_prepare_skips_total` / `dra_node_unprepare_skips_total` for the driver (its
//! `/metrics`, through the API server's node proxy) show the skips (or none, where nothing may be
//! skipped); a counter that cannot be read fails the spec, saying why. With the plugin: a skipped prepare leaves the containers without the driver's
//! variables and the plugin without the claim; a skipped unprepare leaves the claim prepared in
//! the plugin until the spec unprepares it directly (as upstream does), after the claim was
//! deallocated, so that the kubelet had every chance to call.

use anyhow::Context as _;
use harness::{
    builder::{Builder, allocation_results, node_name, phase},
    calls::Method,
    driver::{Driver, DriverConfig, NodeNeeds, Nodes, TooFewNodes, resources, unusable_reason},
    framework::{Ctx, KubeVersion, Label, Precheck, Registry, SpecError, SpecResult, kubelet_min_version},
    plugin::ClaimId,
};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::{Api, ResourceExt as _, api::ListParams};

use super::{
    super::{kubelet_drivers::gates, kubelet_metrics},
    checks::{self, POD_START_TIMEOUT, only_node, wait_event},
};

/// Upstream's `f.WithFeatureGate(features.DRAOptionalNodeOperations)`.
pub const OPTIONAL_NODE_OPS_LABELS: [Label; 1] = [Label::gate("DRAOptionalNodeOperations")];
/// The gate, and the feature a node declares when its kubelet has it.
const GATE: &str = "DRAOptionalNodeOperations";
/// The first kubelet version that knows [`GATE`] (alpha in v1.37).
const GATE_SINCE: KubeVersion = KubeVersion { major: 1, minor: 37, patch: 0 };
/// `skipNodeOperations: ["*"]` (upstream's `SkipNodeOperationAll`).
const SKIP_ALL: &[&str] = &["*"];
/// `skipNodeOperations: ["NodeUnprepareResources"]`.
const SKIP_UNPREPARE: &[&str] = &["NodeUnprepareResources"];
/// The kubelet's event reason when preparing a pod's claims fails.
const FAILED_PREPARE: &str = "FailedPrepareDynamicResources";
/// The kubelet's counters of skipped calls, per driver.
const PREPARE_SKIPS: &str = "dra_node_prepare_skips_total";
const UNPREPARE_SKIPS: &str = "dra_node_unprepare_skips_total";

/// Registers the specs (inside `kubelet` with [`OPTIONAL_NODE_OPS_LABELS`]).
pub fn register(r: &mut Registry) {
    r.requires(gates::api_server_requirement(GATE, "without it the API server drops skipNodeOperations"));
    r.requires(require_declaring_node);
    r.context("with control-plane only driver (no node plugin)", |r| {
        r.it("bypasses node preparation when SkipNodeOperations is All", control_plane_skip_all);
        r.it("fails node preparation when SkipNodeOperations is not set", |ctx| {
            control_plane_fails(ctx, &[])
        });
        r.it("fails node preparation when SkipNodeOperations is UnprepareOnly", |ctx| {
            control_plane_fails(ctx, SKIP_UNPREPARE)
        });
    });
    r.context("with standard driver (node plugin running)", |r| {
        r.it("bypasses node preparation and unprepare when SkipNodeOperations is All", standard_skip_all);
        r.it("bypasses node unprepare when SkipNodeOperations is UnprepareOnly", standard_skip_unprepare);
    });
}

/// The requirement of every spec: some ready schedulable node (with the spec's
/// `KubeletMinVersion`, if any) declares [`GATE`]; the specs' set-up selects such a node.
async fn require_declaring_node(pre: Precheck) -> SpecResult {
    let all = Nodes::list(&pre).await?;
    let needs = NodeNeeds { kubelet: kubelet_min_version(pre.labels()), declares: Some(GATE) };
    match Nodes::choose_with(&all, 1, 1, 0, needs) {
        Ok(_) => Ok(()),
        Err(too_few) => Err(SpecError::skip(no_declaring_node(&all, &too_few))),
    }
}

/// Why no node can run the specs: what was found (each node's kubelet and declared features, in
/// `too_few`'s reasons), and what would help, which depends on whether any usable kubelet is
/// new enough to know the gate.
fn no_declaring_node(all: &[Node], too_few: &TooFewNodes) -> String {
    let usable: Vec<&Node> = all.iter().filter(|n| unusable_reason(n).is_none()).collect();
    let kubelet = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .and_then(|i| KubeVersion::parse(&i.kubelet_version))
    };
    let knowing: Vec<String> =
        usable.iter().filter(|n| kubelet(n).is_some_and(|v| v >= GATE_SINCE)).map(|n| n.name_any()).collect();
    let help = if usable.is_empty() {
        "no node is ready and schedulable".to_owned()
    } else if knowing.is_empty() {
        format!(
            "every ready schedulable node runs a kubelet older than v{}.{}, which does not know the gate: \
             these specs need a node with a v{}.{} or newer kubelet that runs with {GATE} (and NodeDeclaredFeatures) on",
            GATE_SINCE.major, GATE_SINCE.minor, GATE_SINCE.major, GATE_SINCE.minor
        )
    } else {
        format!(
            "the kubelets of {} know the gate but run with it off: turn {GATE} (and NodeDeclaredFeatures) on for \
             the kubelets in kind.yaml's featureGates",
            knowing.join(", ")
        )
    };
    format!(
        "no ready schedulable node declares {GATE} in status.declaredFeatures, so the scheduler would place no pod \
         whose allocation skips node operations ({}); {help}",
        too_few.reasons.join("; ")
    )
}

/// One node that declares the feature, a driver with one device on it whose slice skips `skip`
/// (with or without plugin), a builder. Checks that the stored slice kept `skip`.
async fn setup(ctx: &Ctx, skip: &[&str], kubelet: bool) -> SpecResult<(Driver, Builder, String)> {
    let nodes = Nodes::select_declaring(ctx, 1, 1, GATE).await?;
    let published = if skip.is_empty() {
        resources::node_local(1)
    } else {
        resources::skip_node_operations(resources::node_local(1), skip)
    };
    let config =
        if kubelet { DriverConfig::kubelet(published) } else { DriverConfig::control_plane(published) };
    let driver = Driver::start(ctx, &nodes, config).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    let node = only_node(&driver)?;
    let stored: Vec<Vec<String>> =
        driver.slices().await?.into_iter().map(|s| s.spec.skip_node_operations.unwrap_or_default()).collect();
    expect!(
        !stored.is_empty() && stored.iter().all(|s| s.iter().map(String::as_str).eq(skip.iter().copied())),
        "expected the driver's slices to skip {skip:?}, the API server stored {stored:?}"
    );
    Ok((driver, b, node))
}

/// Creates an external claim and a pod using it; returns the pod.
async fn claim_and_pod(b: &Builder) -> anyhow::Result<(k8s_openapi::api::core::v1::Pod, String)> {
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    Ok((pod, claim.name_any()))
}

/// Checks that the claim's allocation copied `skip` from the slice, and that the pod is on `node`.
async fn expect_allocation(
    b: &Builder,
    claim: &str,
    pod: &k8s_openapi::api::core::v1::Pod,
    node: &str,
    skip: &[&str],
) -> anyhow::Result<k8s_openapi::api::resource::v1::ResourceClaim> {
    expect!(
        node_name(pod) == Some(node),
        "pod scheduled to {:?}, the driver's device is on {node}",
        node_name(pod)
    );
    let claim = b.wait_allocated(claim).await?;
    let results = allocation_results(&claim);
    expect!(!results.is_empty(), "claim {} has no allocated device", claim.name_any());
    for r in results {
        let copied = r.skip_node_operations.as_deref().unwrap_or_default();
        expect!(
            copied.iter().map(String::as_str).eq(skip.iter().copied()),
            "the allocation of device {} skips {copied:?}, the slice {skip:?}",
            r.device
        );
    }
    Ok(claim)
}

/// The kubelet's counter `metric` for `driver` on `node`: `Err` when its `/metrics` cannot be
/// read, `Ok(0)` when the series does not exist (yet).
async fn kubelet_counter(ctx: &Ctx, node: &str, metric: &str, driver: &str) -> Result<f64, String> {
    let text = kubelet_metrics::read(ctx, node).await?;
    Ok(kubelet_metrics::sum(&text, metric, &[("driver_name", driver)]))
}

/// Checks the kubelet's skip counter against `check`; fails when the kubelet's metrics cannot
/// be read.
async fn expect_counter(
    ctx: &Ctx,
    driver: &Driver,
    node: &str,
    metric: &str,
    check: impl Fn(f64) -> bool,
    want: &str,
) -> anyhow::Result<()> {
    let read = kubelet_counter(ctx, node, metric, driver.name()).await;
    let value = judge_counter(read, node, metric, driver.name(), check, want)?;
    tracing::info!(%node, metric, value, "kubelet skip counter");
    Ok(())
}

/// The counter's value when it was `read` and passes `check`; otherwise why not.
fn judge_counter(
    read: Result<f64, String>,
    node: &str,
    metric: &str,
    driver: &str,
    check: impl Fn(f64) -> bool,
    want: &str,
) -> anyhow::Result<f64> {
    let value = read.map_err(|e| {
        anyhow::anyhow!(
            "cannot read {metric} of driver {driver} from the kubelet of node {node}, so its skips cannot be checked: {e}"
        )
    })?;
    expect!(
        check(value),
        "the kubelet of node {node}: {metric} of driver {driver} is {value}, expected {want}"
    );
    Ok(value)
}

/// The pod's events with reason `reason`.
async fn pod_events(ctx: &Ctx, pod: &str, reason: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let selector = format!("involvedObject.kind=Pod,involvedObject.name={pod},reason={reason}");
    Ok(api.list(&ListParams::default().fields(&selector)).await?.items)
}

async fn control_plane_skip_all(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx, SKIP_ALL, false).await?;
    let (pod, claim) = claim_and_pod(&b).await?;
    // Runs although no plugin of the driver exists on the node.
    let running = b.wait_running(&pod).await?;
    let claim = expect_allocation(&b, &claim, &running, &node, SKIP_ALL).await?;
    expect!(!driver.is_registered(&node), "no plugin runs, yet the driver is registered");
    let failed = pod_events(&ctx, &pod.name_any(), FAILED_PREPARE).await?;
    expect!(
        failed.is_empty(),
        "unexpected {FAILED_PREPARE} events: {:?}",
        failed.iter().map(|e| &e.message).collect::<Vec<_>>()
    );
    expect_counter(&ctx, &driver, &node, PREPARE_SKIPS, |v| v >= 1.0, "at least 1").await?;
    // The kubelet tears the pod down without the driver too.
    b.delete_pod_and_wait(&pod).await?;
    b.wait_deallocated(&claim.name_any()).await?;
    expect_counter(&ctx, &driver, &node, UNPREPARE_SKIPS, |v| v >= 1.0, "at least 1").await?;
    Ok(())
}

async fn control_plane_fails(ctx: Ctx, skip: &'static [&'static str]) -> SpecResult {
    let (driver, b, node) = setup(&ctx, skip, false).await?;
    let (pod, claim) = claim_and_pod(&b).await?;
    let scheduled = b.wait_scheduled(&pod).await?;
    expect_allocation(&b, &claim, &scheduled, &node, skip).await?;
    expect!(!driver.is_registered(&node), "no plugin runs, yet the driver is registered");
    // The kubelet needs the driver for NodePrepareResources and does not know it.
    let message = format!("DRA driver {} is not registered", driver.name());
    wait_event(&ctx, &pod.name_any(), FAILED_PREPARE, &message, POD_START_TIMEOUT).await?;
    let now = checks::pods(&ctx).get(&pod.name_any()).await?;
    expect!(phase(&now) == "Pending", "the pod has phase {}, expected Pending", phase(&now));
    expect_counter(&ctx, &driver, &node, PREPARE_SKIPS, |v| v == 0.0, "0").await?;
    Ok(())
}

async fn standard_skip_all(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx, SKIP_ALL, true).await?;
    let calls = driver.calls(&node);
    let (pod, claim) = claim_and_pod(&b).await?;
    // Not `test_pod`: without NodePrepareResources the containers get no driver variables.
    let running = b.wait_running(&pod).await?;
    let claim = expect_allocation(&b, &claim, &running, &node, SKIP_ALL).await?;
    calls.expect_none(Method::NodePrepareResources).context("NodePrepareResources should not be called")?;
    for c in running.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default() {
        b.expect_env_exact(&running, &c.name, &[]).await?;
    }
    let prepared = driver.prepared_claims(&node);
    expect!(prepared.is_empty(), "the plugin holds claims as prepared: {prepared:?}");
    expect_counter(&ctx, &driver, &node, PREPARE_SKIPS, |v| v >= 1.0, "at least 1").await?;

    b.delete_pod_and_wait(&pod).await?;
    calls
        .expect_none(Method::NodeUnprepareResources)
        .context("NodeUnprepareResources should not be called")?;
    // Still none once the claim is deallocated.
    b.wait_deallocated(&claim.name_any()).await?;
    calls
        .expect_none(Method::NodeUnprepareResources)
        .context("NodeUnprepareResources should not be called")?;
    calls.expect_none(Method::NodePrepareResources).context("NodePrepareResources should not be called")?;
    expect_counter(&ctx, &driver, &node, UNPREPARE_SKIPS, |v| v >= 1.0, "at least 1").await?;
    Ok(())
}

async fn standard_skip_unprepare(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx, SKIP_UNPREPARE, true).await?;
    let calls = driver.calls(&node);
    let (pod, claim) = claim_and_pod(&b).await?;
    // Prepared as usual: runs with the claim's env, prepared per the call log.
    let running = b.test_pod(&pod, &[]).await?;
    let claim = expect_allocation(&b, &claim, &running, &node, SKIP_UNPREPARE).await?;
    calls.expect_at_least(Method::NodePrepareResources, 1)?;
    let uid = claim.uid().unwrap_or_default();
    {
        // Should the spec fail before it unprepares the claim itself, the plugin must not hold
        // it at the builder's teardown (this runs before it; an unknown claim is fine).
        let (driver, node, claim) = (driver.clone(), node.clone(), claim.clone());
        ctx.defer(format!("unprepare claim {} in the plugin", claim.name_any()), async move {
            driver.unprepare_claim(&node, &claim).await
        });
    }
    let history = calls.claim(&uid);
    expect!(history.prepared() >= 1, "expected a successful prepare of the claim: {history}");
    expect_counter(&ctx, &driver, &node, PREPARE_SKIPS, |v| v == 0.0, "0").await?;

    b.delete_pod_and_wait(&pod).await?;
    calls
        .expect_none(Method::NodeUnprepareResources)
        .context("NodeUnprepareResources should not be called")?;
    let stored = b.wait_deallocated(&claim.name_any()).await?;
    calls
        .expect_none(Method::NodeUnprepareResources)
        .context("NodeUnprepareResources should not be called")?;
    let id = ClaimId { name: claim.name_any(), uid: uid.clone() };
    let prepared = driver.prepared_claims(&node);
    expect!(prepared.contains(&id), "the plugin should still hold the claim as prepared: {prepared:?}");
    expect_counter(&ctx, &driver, &node, UNPREPARE_SKIPS, |v| v >= 1.0, "at least 1").await?;

    // The plugin unprepares it itself (upstream: plugin.UnprepareClaim), with the stored UID.
    expect!(stored.uid() == Some(uid), "the claim was replaced");
    driver.unprepare_claim(&node, &stored).await?;
    let prepared = driver.prepared_claims(&node);
    expect!(prepared.is_empty(), "the plugin still holds claims as prepared: {prepared:?}");
    calls.expect_none(Method::NodeUnprepareResources).context("the direct unprepare is no gRPC call")?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn node(name: &str, kubelet: &str, declared: &[&str], taint: bool) -> Node {
        serde_json::from_value(crate::specs::prechecked::node(name, kubelet, declared, taint)).unwrap()
    }

    /// The skip says which nodes were found with which kubelets and features, and what would
    /// help: a newer kubelet when none knows the gate, turning the gate on when one does.
    #[test]
    fn the_skip_says_what_was_found_and_what_would_help() {
        let control_plane = node("kind-control-plane", "v1.37.2", &[GATE], true);
        let old = node("kind-worker", "v1.34.4", &[], false);
        let off = node("kind-worker2", "v1.37.2", &["Other"], false);
        let on = node("kind-worker3", "v1.37.2", &[GATE], false);
        let decide = |all: &[Node]| {
            let needs = NodeNeeds { kubelet: None, declares: Some(GATE) };
            Nodes::choose_with(all, 1, 1, 0, needs)
                .map(|n| n.names().to_vec())
                .map_err(|e| no_declaring_node(all, &e))
        };
        assert_eq!(decide(&[control_plane.clone(), old.clone(), off.clone(), on]).unwrap(), ["kind-worker3"]);
        let too_old = decide(&[control_plane.clone(), old.clone()]).unwrap_err();
        assert_eq!(
            too_old,
            "no ready schedulable node declares DRAOptionalNodeOperations in status.declaredFeatures, so the scheduler \
             would place no pod whose allocation skips node operations (kind-control-plane has taint \
             node-role.kubernetes.io/control-plane:NoSchedule; kind-worker (kubelet v1.34.4) does not declare \
             DRAOptionalNodeOperations (declares nothing)); every ready schedulable node runs a kubelet older than \
             v1.37, which does not know the gate: these specs need a node with a v1.37 or newer kubelet that runs \
             with DRAOptionalNodeOperations (and NodeDeclaredFeatures) on"
        );
        assert!(!too_old.contains("kind.yaml"), "{too_old}");
        let gate_off = decide(&[control_plane, old, off]).unwrap_err();
        assert!(
            gate_off.ends_with(
                "kind-worker2 (kubelet v1.37.2) does not declare DRAOptionalNodeOperations (declares Other)); the \
                 kubelets of kind-worker2 know the gate but run with it off: turn DRAOptionalNodeOperations (and \
                 NodeDeclaredFeatures) on for the kubelets in kind.yaml's featureGates"
            ),
            "{gate_off}"
        );
    }

    /// The loophole of issue 47: a counter that could not be read was skipped with a warning and
    /// the spec passed; now it fails, saying why.
    #[test]
    fn a_counter_that_cannot_be_read_fails() {
        let unreadable = Err("GET /api/v1/nodes/n/proxy/metrics: address not allowed".to_owned());
        let err = judge_counter(unreadable, "n", PREPARE_SKIPS, "d.k8s.io", |v| v >= 1.0, "at least 1")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read dra_node_prepare_skips_total of driver d.k8s.io from the kubelet of node n, so its skips \
             cannot be checked: GET /api/v1/nodes/n/proxy/metrics: address not allowed"
        );
        assert!(judge_counter(Ok(0.0), "n", PREPARE_SKIPS, "d", |v| v >= 1.0, "at least 1").is_err());
        assert_eq!(judge_counter(Ok(2.0), "n", PREPARE_SKIPS, "d", |v| v >= 1.0, "at least 1").unwrap(), 2.0);
    }
}
