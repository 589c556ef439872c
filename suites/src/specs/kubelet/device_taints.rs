//! Upstream's two `kubelet [FeatureGate:DRADeviceTaints]` contexts (dra.go): one node, ten
//! network-attached devices (`NetworkResources(10)`), every device tainted
//! `example.com/taint=tainted` with effect `NoSchedule` (first context) or `NoExecute` (second,
//! upstream's `TaintAllDevices`), and a driver registered with the node's kubelet.
//!
//! Beyond upstream, every spec checks that the API server kept the taints in the published
//! slice (a dropped taint would make "keeps pod pending" fail for the wrong reason and "can be
//! tolerated" pass for it), that a pending pod is unschedulable because the scheduler's DRA
//! plugin could not allocate its claim, and what the kubelet did from the recorded gRPC calls:
//! nothing for a pod that stays pending, a prepare for a tolerated one, and the unprepare of the
//! claim of an evicted one. A tolerated allocation must carry a copy of the request's
//! toleration; a tolerated `NoExecute` pod must keep running for 10 s.
//!
//! The PodGroup variants of the first context (their pod's claim comes from its PodGroup, see
//! [`pod_groups`](super::pod_groups)) need the `GenericWorkload` and `DRAWorkloadResourceClaims`
//! gates, which kind.yaml does not turn on: they run in the workload lane of `cargo xtask test`.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{Builder, POD_START_SHORT_TIMEOUT, allocation_results, condition, node_name},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Label, Registry, SpecResult},
    wait::Verdict,
};
use k8s_openapi::{
    api::{
        core::v1::Pod,
        resource::v1::{DeviceTaintRule, ResourceClaimTemplate},
    },
    jiff,
};
use kube::{
    Api, ResourceExt as _,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde_json::json;

use super::{
    super::kubelet_drivers::gates,
    checks::{self, POD_START_TIMEOUT, only_node, stays},
    pod_groups::{Inline, TAINT_POD_GROUP_LABELS, require_pod_groups},
};

/// Upstream's `f.WithFeatureGate(features.DRADeviceTaints)`.
pub const DEVICE_TAINTS_LABELS: [Label; 1] = [Label::gate("DRADeviceTaints")];
/// `f.WithFeatureGate(features.DRADeviceTaintRules)` on a spec.
const TAINT_RULES_LABELS: [Label; 1] = [Label::gate("DRADeviceTaintRules")];
/// The gate without which the API server drops device taints, and what the specs then lack.
const DEVICE_TAINTS_GATE: &str = "DRADeviceTaints";
const DEVICE_TAINTS_WHY: &str = "without it the API server drops device taints";
/// The gate without which DeviceTaintRules are not served.
const TAINT_RULES_GATE: &str = "DRADeviceTaintRules";
const TAINT_RULES_WHY: &str = "DeviceTaintRules are not served without it";
/// The taint on every device.
const TAINT_KEY: &str = "example.com/taint";
/// What the scheduler's DRA plugin reports when it finds no devices for a pod's claims.
const NO_DEVICE: &str = "cannot allocate all claims";
/// The finalizer that keeps the evicted pod around for its status.
const FINALIZER: &str = "e2e-test/dont-delete-me";
/// How long a tolerated pod must keep running after it started (not in upstream, which relies on
/// its slow `TestPod`).
const STAYS_RUNNING: Duration = Duration::from_secs(10);

/// Registers the `NoSchedule` context's specs (inside `kubelet` with [`DEVICE_TAINTS_LABELS`]).
pub fn register_no_schedule(r: &mut Registry) {
    r.requires(gates::api_server_requirement(DEVICE_TAINTS_GATE, DEVICE_TAINTS_WHY));
    r.it("NoSchedule keeps pod pending", |ctx| keeps_pending(ctx, "NoSchedule", Inline::Pod));
    r.it("NoSchedule can be tolerated", |ctx| tolerated(ctx, "NoSchedule", Inline::Pod));
    r.it("DeviceTaintRule evicts pod", |ctx| rule_evicts_pod(ctx, Inline::Pod))
        .labels(TAINT_RULES_LABELS)
        .requires(gates::api_server_requirement(TAINT_RULES_GATE, TAINT_RULES_WHY));
    r.context_with_labels("", TAINT_POD_GROUP_LABELS, |r| {
        r.requires(require_pod_groups);
        r.it("NoSchedule keeps pod with PodGroup claim pending", |ctx| {
            keeps_pending(ctx, "NoSchedule", Inline::PodGroup)
        });
        r.it("NoSchedule can be tolerated for PodGroup claims", |ctx| {
            tolerated(ctx, "NoSchedule", Inline::PodGroup)
        });
        r.it("DeviceTaintRule evicts pod with PodGroup claim", |ctx| rule_evicts_pod(ctx, Inline::PodGroup))
            .labels(TAINT_RULES_LABELS)
            .requires(gates::api_server_requirement(TAINT_RULES_GATE, TAINT_RULES_WHY));
    });
}

/// Registers the `NoExecute` context's specs (inside `kubelet` with [`DEVICE_TAINTS_LABELS`]).
pub fn register_no_execute(r: &mut Registry) {
    r.requires(gates::api_server_requirement(DEVICE_TAINTS_GATE, DEVICE_TAINTS_WHY));
    r.it("NoExecute keeps pod pending", |ctx| keeps_pending(ctx, "NoExecute", Inline::Pod));
    r.it("NoExecute can be tolerated", |ctx| tolerated(ctx, "NoExecute", Inline::Pod));
}

/// One node, ten network-attached devices tainted with `effect`, a driver registered with the
/// node's kubelet. Checks that the stored slice kept the taint on every device.
async fn setup(ctx: &Ctx, effect: &str) -> SpecResult<(Driver, Builder, String)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let taint = resources::device_taint(TAINT_KEY, "tainted", effect);
    let published = resources::taint_all_devices(resources::network(10, false), vec![taint]);
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(published)).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    let node = only_node(&driver)?;
    let slices = driver.slices().await?;
    let devices: Vec<_> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    expect!(devices.len() == 10, "expected 10 published devices, the slices have {}", devices.len());
    for device in devices {
        let kept = device.taints.iter().flatten().any(|t| t.key == TAINT_KEY && t.effect == effect);
        expect!(
            kept,
            "the API server dropped the {effect} taint of device {}: taints {:?}",
            device.name,
            device.taints
        );
    }
    Ok((driver, b, node))
}

/// The first request of the template tolerates every taint with `effect`.
fn tolerate_all(template: &mut ResourceClaimTemplate, effect: &str) -> anyhow::Result<()> {
    let request = template
        .spec
        .as_mut()
        .and_then(|s| s.spec.as_mut())
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
        .context("template without an exact request")?;
    // No key: tolerate *all* taints with this effect.
    request.tolerations = Some(serde_json::from_value(json!([{ "effect": effect, "operator": "Exists" }]))?);
    Ok(())
}

async fn keeps_pending(ctx: Ctx, effect: &str, how: Inline) -> SpecResult {
    let (driver, b, node) = setup(&ctx, effect).await?;
    let pod = how.create(&b, |_| Ok(()), &[]).await?;
    b.wait_unschedulable(&pod).await?;
    // Beyond upstream: because the DRA plugin found no device for the claim (not, e.g., because
    // the claim did not exist yet).
    let pending = b
        .wait_pod(&pod, "to be unschedulable for its claim", POD_START_SHORT_TIMEOUT, |p| {
            if node_name(p).is_some() {
                return Verdict::Fail("the pod got scheduled".to_owned());
            }
            Verdict::done_if(condition(p, "PodScheduled").is_some_and(|c| {
                c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref().is_some_and(|m| m.contains(NO_DEVICE))
            }))
        })
        .await?;
    let message = condition(&pending, "PodScheduled").and_then(|c| c.message.clone()).unwrap_or_default();
    tracing::info!(pod = %pod.name_any(), %message, "pod is unschedulable");
    // The claim, if generated yet, found no device it may use.
    for claim in checks::claims(&ctx).list(&Default::default()).await?.items {
        expect!(
            !harness::builder::is_allocated(&claim),
            "claim {} got allocated although every device is tainted {effect}: {:?}",
            claim.name_any(),
            allocation_results(&claim)
        );
    }
    driver.calls(&node).expect_none(Method::NodePrepareResources).context("the pod was never scheduled")?;
    Ok(())
}

async fn tolerated(ctx: Ctx, effect: &str, how: Inline) -> SpecResult {
    let (driver, b, node) = setup(&ctx, effect).await?;
    let pod = how.create(&b, |t| tolerate_all(t, effect), &[]).await?;
    // Runs, and the kubelet prepared the claim with the allocated (tainted) device.
    let running = b.test_pod(&pod, &[]).await?;
    let claims = b.pod_claims(&running).await?;
    let claim = claims.values().next().context("the pod has no claim")?;
    for result in allocation_results(claim) {
        let copied = result.tolerations.iter().flatten().any(|t| {
            t.effect.as_deref() == Some(effect) && t.operator.as_deref() == Some("Exists") && t.key.is_none()
        });
        expect!(
            copied,
            "the allocation of device {} does not carry the request's toleration: {:?}",
            result.device,
            result.tolerations
        );
    }
    if effect == "NoExecute" {
        // Not evicted: keeps running, and the kubelet keeps the claim prepared.
        let name = pod.name_any();
        stays(
            &checks::pods(&ctx),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            &format!("pod {name} to keep running"),
            STAYS_RUNNING,
            |pods| match pods.first() {
                None => Some(format!("pod {name} is gone")),
                Some(p) if p.metadata.deletion_timestamp.is_some() => {
                    Some(format!("pod {name} is being deleted"))
                }
                Some(p) if harness::builder::phase(p) != "Running" => {
                    Some(format!("pod {name} has phase {}", harness::builder::phase(p)))
                }
                Some(_) => None,
            },
        )
        .await?;
        let history = driver.calls(&node).claim(&claim.uid().unwrap_or_default());
        expect!(history.is_prepared(), "the kubelet unprepared the claim of the running pod: {history}");
    }
    Ok(())
}

/// Removes the finalizer of the pod (gone is fine).
async fn remove_finalizers(pods: Api<Pod>, name: String) -> anyhow::Result<()> {
    let patch = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
    match pods.patch(&name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("remove the finalizers of pod {name}"))),
    }
}

async fn rule_evicts_pod(ctx: Ctx, how: Inline) -> SpecResult {
    let (driver, b, node) = setup(&ctx, "NoSchedule").await?;
    // A finalizer keeps the pod after the eviction (a deletion), so its status can be checked.
    let pod = how.create(&b, |t| tolerate_all(t, "NoSchedule"), &[FINALIZER]).await?;
    ctx.defer(
        format!("remove the finalizer of pod {}", pod.name_any()),
        remove_finalizers(checks::pods(&ctx), pod.name_any()),
    );
    let running = b.test_pod(&pod, &[]).await?;
    let claim_name = checks::generated_claim(&running)?;
    let claim_uid = driver.calls(&node).log().claim_uid(&claim_name)?;

    tracing::info!("evicting the pod with a NoExecute DeviceTaintRule for all devices of the driver");
    let rule: DeviceTaintRule = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": { "generateName": format!("device-taint-rule-{}-", ctx.namespace()) },
        "spec": {
            // All devices of this driver.
            "deviceSelector": { "driver": driver.name() },
            // No timeAdded: the API server sets it.
            "taint": { "effect": "NoExecute", "key": "test.example.com/evict", "value": "now" },
        },
    }))?;
    let rules: Api<DeviceTaintRule> = Api::all(ctx.client().clone());
    let created = rules.create(&PostParams::default(), &rule).await.context("create the DeviceTaintRule")?;
    ctx.delete_at_cleanup(rules, created.name_any());
    let added = created
        .spec
        .taint
        .time_added
        .as_ref()
        .map(|t| t.0)
        .context("the API server did not set timeAdded")?;
    let drift = jiff::Timestamp::now().duration_since(added).unsigned_abs();
    expect!(drift <= Duration::from_secs(60), "timeAdded {added} is {drift:?} away from now");

    let evicted = b
        .wait_pod(&pod, "to be terminating", POD_START_TIMEOUT, |p| {
            Verdict::done_if(p.metadata.deletion_timestamp.is_some())
        })
        .await?;
    let disruption = condition(&evicted, "DisruptionTarget");
    expect!(
        disruption.is_some_and(|c| c.status == "True"
            && c.reason.as_deref() == Some("DeletionByDeviceTaintManager")
            && c.message.as_deref() == Some("Device Taint manager: deleting due to NoExecute taint")),
        "expected condition DisruptionTarget=True, reason DeletionByDeviceTaintManager, message \"Device Taint manager: deleting due to NoExecute taint\"; conditions: {:?}",
        evicted.status.as_ref().and_then(|s| s.conditions.as_ref())
    );
    // The kubelet stopped the pod and unprepared its claim (the pod object stays, finalized).
    let history = driver.calls(&node).wait_unprepared(&claim_uid, UNPREPARE_TIMEOUT).await?;
    expect!(history.prepared() >= 1, "the claim was never prepared: {history}");
    Ok(())
}
