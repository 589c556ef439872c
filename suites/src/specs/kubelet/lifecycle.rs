//! Upstream's `kubelet` context with individual driver lifecycles: a driver that starts after
//! the pod was created, and updates of a driver (two instances of one driver name).
//!
//! The rolling and failed updates need two instances of one driver registered with a kubelet at
//! the same time, each with its own sockets (upstream's `RollingUpdate`: `dra-<pod UID>.sock`
//! and `<driver>-<pod UID>-reg.sock`). The proxied plugin
//! (`harness::proxied::sockets`) always uses `<driver>-reg.sock`, so a second instance would
//! take over the first one's registration socket; those specs are skipped with that reason
//! until it can place per-instance sockets. The sequential update replaces one instance by
//! another on the same sockets, which the driver supports.

use std::time::Duration;

use harness::{
    builder::{Builder, Objects, POD_START_SHORT_TIMEOUT, condition, node_name},
    calls::Method,
    driver::{Driver, DriverConfig, Nodes, SLICE_REMOVAL_TIMEOUT, driver_name, resources},
    framework::{Ctx, Registry, Skip, SpecResult},
    wait::{self, Verdict},
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::{Api, ResourceExt as _, api::PostParams};
use tokio::time::Instant;

use super::checks::{self, UNPREPARE_TIMEOUT, expect_not_called, only_node};

/// Longest downtime of a sequential update after which the slices must still be the old ones
/// (upstream: 25 s, below the kubelet's 30 s wiping delay).
const MAX_UPDATE_DOWNTIME: Duration = Duration::from_secs(25);

/// Why the rolling and failed update specs are skipped.
const NEEDS_PER_INSTANCE_SOCKETS: &str = "needs two instances of one driver registered at the same time with per-instance \
     sockets (upstream's RollingUpdate: <plugins>/<driver>/dra-<pod UID>.sock and \
     <plugins_registry>/<driver>-<pod UID>-reg.sock); harness::proxied::sockets always derives \
     <driver>-reg.sock, so a second instance would replace the first one's registration socket \
     (and the long-name variant also needs the upstream socket-name shortening)";

/// Registers the specs (inside the `kubelet` context).
pub fn register(r: &mut Registry) {
    r.it("runs pod after driver starts", runs_pod_after_driver_starts);
    r.it("rolling update", needs_per_instance_sockets).label("KubeletMinVersion:1.33");
    r.it("rolling update with long driver name", needs_per_instance_sockets).label("KubeletMinVersion:1.33");
    r.it("failed update", needs_per_instance_sockets).label("KubeletMinVersion:1.33");
    r.it("sequential update with pods replacing each other", sequential_update)
        .labels(["KubeletMinVersion:1.33", "Slow"]);
}

async fn needs_per_instance_sockets(ctx: Ctx) -> SpecResult {
    ctx.cluster().require_kubelet_version(1, 33)?;
    Err(Skip::because(NEEDS_PER_INSTANCE_SOCKETS))
}

async fn runs_pod_after_driver_starts(ctx: Ctx) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 4).await?;
    // The class, claim and pod exist before the driver (upstream's NewBuilderNow on a driver
    // instance that does not run yet).
    let objects = Objects::new(ctx.namespace(), driver_name(ctx.namespace(), ""), "", None);
    let classes: Api<DeviceClass> = Api::all(ctx.client().clone());
    let class = objects.class();
    classes.create(&PostParams::default(), &class).await?;
    ctx.delete_at_cleanup(classes, class.name_any());
    let claim = objects.external_claim();
    let pod = objects.pod_external(&claim.name_any());
    checks::claims(&ctx).create(&PostParams::default(), &claim).await?;
    checks::pods(&ctx).create(&PostParams::default(), &pod).await?;

    // Cannot run: there are no devices.
    let pod_name = pod.name_any();
    wait::object(
        &checks::pods(&ctx),
        &pod_name,
        format!("pod {pod_name} to be unschedulable"),
        POD_START_SHORT_TIMEOUT,
        |p| {
            let Some(p) = p else { return Verdict::Pending };
            if node_name(p).is_some() {
                return Verdict::Fail("the pod got scheduled".to_owned());
            }
            Verdict::done_if(
                condition(p, "PodScheduled")
                    .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable")),
            )
        },
    )
    .await?;

    // Set up the driver, which makes devices available; its builder's teardown runs before the
    // driver's.
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1))).await?;
    let b = Builder::new(&ctx, &driver, None);
    b.register_teardown();

    // Now it runs; its claim was prepared once, after the registration, without a failed try
    // (the kubelet never saw the pod before it was scheduled).
    let running = b.test_pod(&pod, &[]).await?;
    let node = node_name(&running).unwrap_or_default().to_owned();
    let stored = b.pod_claims(&running).await?;
    let uid = stored.values().next().and_then(|c| c.uid()).unwrap_or_default();
    let history = driver.claim_calls(&node, &uid);
    expect!(
        history.prepared() == 1 && history.prepare_failures() == 0,
        "expected one successful prepare: {history}"
    );

    // Clean up explicitly, as upstream does, and see the kubelet unprepare the claim.
    b.delete_pod_and_wait(&pod).await?;
    driver.wait_unprepared(&node, &uid, UNPREPARE_TIMEOUT).await?;
    Ok(())
}

/// The stored slices as JSON, sorted by name, for comparing whole objects.
fn slices_json(slices: &[ResourceSlice]) -> Vec<serde_json::Value> {
    let mut sorted: Vec<&ResourceSlice> = slices.iter().collect();
    sorted.sort_by_key(|s| s.name_any());
    sorted.into_iter().map(|s| serde_json::to_value(s).unwrap_or_default()).collect()
}

async fn sequential_update(ctx: Ctx) -> SpecResult {
    ctx.cluster().require_kubelet_version(1, 33)?;
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    // Same driver name, same sockets.
    let old =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1)).instance_suffix("-old"))
            .await?;
    let node = only_node(&old)?;
    let old_slices = old.slices().await?;
    expect!(!old_slices.is_empty(), "driver should have published ResourceSlices, got none");

    // "Update" the driver by taking it down and bringing up a new one: the pods never run at
    // the same time, as a DaemonSet update with maxSurge 0 does it.
    tracing::info!("reinstalling the driver");
    let start = Instant::now();
    old.stop().await?;
    let new =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1)).instance_suffix("-new"))
            .await?;
    let downtime = start.elapsed();

    // The builder behaves the same for both instances; use the running one.
    let b = Builder::start(&ctx, &new, None).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    let created = b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;
    let uid = created.uid().unwrap_or_default();

    // The kubelet talked to the new instance only: the old one never saw a prepare.
    expect_not_called(
        &old,
        &node,
        Method::NodePrepareResources,
        "the old instance was stopped before the pod existed",
    )?;
    let history = new.claim_calls(&node, &uid);
    expect!(history.prepared() >= 1, "the new instance did not prepare the claim: {history}");

    // The slices survive the update if it was quick enough: otherwise the kubelet (30 s
    // wiping delay) removed them and the new instance published new ones.
    if downtime <= MAX_UPDATE_DOWNTIME {
        tracing::info!(?downtime, "checking the ResourceSlices after the update");
        let new_slices = new.slices().await?;
        expect!(
            slices_json(&new_slices) == slices_json(&old_slices),
            "the old slices should have survived a downtime of {downtime:?}: before {:?}, after {:?}",
            slices_json(&old_slices),
            slices_json(&new_slices)
        );
    } else {
        tracing::info!(?downtime, "not checking the ResourceSlices, the downtime was too long");
    }

    // Clean up explicitly, as upstream does (the driver goes away below).
    b.delete_pod_and_wait(&pod).await?;
    new.wait_unprepared(&node, &uid, UNPREPARE_TIMEOUT).await?;

    // Now shut down for good and wait for the kubelet to remove the slices.
    tracing::info!("uninstalling the driver and waiting for the ResourceSlices to be wiped");
    new.stop().await?;
    new.wait_gone(SLICE_REMOVAL_TIMEOUT).await?;
    Ok(())
}
