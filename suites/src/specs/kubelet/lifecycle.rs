//! Upstream's `kubelet` context with individual driver lifecycles: a driver that starts after
//! the pod was created, and updates of a driver (two instances of one driver name).
//!
//! The rolling and failed updates run two instances of one driver on a node at the same time,
//! each registered with the kubelet through its own sockets (upstream's `RollingUpdate`:
//! `dra-<pod UID>.sock` and a registration socket named after the pod UID, see
//! [`harness::proxied::sockets`]). Besides upstream's checks (the pod runs, the slices stay
//! the same objects), they check which instance the kubelet talked to: both registered, each
//! with its own endpoint, and every `NodePrepareResources` / `NodeUnprepareResources` went to
//! the instance that still runs. The sequential update replaces one instance by another on the
//! same sockets.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{Builder, Objects, POD_START_SHORT_TIMEOUT, condition, node_name},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{
        DEFAULT_KUBELET_ROOT_DIR, Driver, DriverConfig, Nodes, SLICE_REMOVAL_TIMEOUT, driver_name, proxy,
        resources,
    },
    framework::{Ctx, Registry, SpecResult},
    proxied::{UNIX_PATH_MAX, dra_socket_file, rolling_update_registration_file},
    wait::{self, Attempt, Verdict},
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::{Api, ResourceExt as _, api::PostParams};
use serde_json::json;
use tokio::time::Instant;

use super::checks::{self, only_node};
use crate::specs::LONG_PRIORITY;

/// Longest downtime of a sequential update after which the slices must still be the old ones
/// (upstream: 25 s, below the kubelet's 30 s wiping delay).
const MAX_UPDATE_DOWNTIME: Duration = Duration::from_secs(25);

/// How long the first instance's slices may take to appear (upstream: `Eventually`).
const SLICES_TIMEOUT: Duration = Duration::from_secs(60);

/// A driver name longer than this does not fit `<driver>-<pod UID>-reg.sock` into the 108 bytes
/// of an AF_UNIX path under `/var/lib/kubelet/plugins_registry` (kubernetes#139166): the
/// registration socket then uses a hash of the UID.
const FULL_UID_MAX_NAME: usize = 28;

/// Upstream's long driver name for the rolling update is `gpu.dra-example-driver.sigs.k8s.io`
/// (`LongRollingUpdateDriverName`), 34 bytes; a shorter spec driver name is padded to this
/// length.
const LONG_NAME_LEN: usize = 34;

/// Registers the specs (inside the `kubelet` context).
pub fn register(r: &mut Registry) {
    r.it("runs pod after driver starts", runs_pod_after_driver_starts);
    r.it("rolling update", rolling_update).label("KubeletMinVersion:1.33").priority(LONG_PRIORITY);
    r.it("rolling update with long driver name", rolling_update_with_long_driver_name)
        .label("KubeletMinVersion:1.33")
        .priority(LONG_PRIORITY);
    r.it("failed update", failed_update).label("KubeletMinVersion:1.33");
    r.it("sequential update with pods replacing each other", sequential_update)
        .labels(["KubeletMinVersion:1.33", "Slow"])
        .priority(LONG_PRIORITY);
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
    let calls = driver.calls(&node);
    calls.expect_none(Method::NodePrepareResources.for_claim_uid(&uid).failed())?;
    calls.claim(&uid).expect_prepared_once()?;

    // Clean up explicitly, as upstream does, and see the kubelet unprepare the claim.
    b.delete_pod_and_wait(&pod).await?;
    driver.calls(&node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    Ok(())
}

/// The stored slices as JSON, sorted by name, for comparing whole objects.
fn slices_json(slices: &[ResourceSlice]) -> Vec<serde_json::Value> {
    let mut sorted: Vec<&ResourceSlice> = slices.iter().collect();
    sorted.sort_by_key(|s| s.name_any());
    sorted.into_iter().map(|s| serde_json::to_value(s).unwrap_or_default()).collect()
}

/// One instance of the driver with per-instance sockets (upstream's `RollingUpdate = true`).
fn rolling_instance(name_suffix: &str, instance: &str) -> DriverConfig {
    DriverConfig::kubelet(resources::node_local(1))
        .name_suffix(name_suffix)
        .instance_suffix(instance)
        .rolling_update(true)
}

/// Waits until the driver has exactly one ResourceSlice per node (upstream's
/// `Eventually(getSlices).Should(HaveLen(len(nodes)))`) and returns them.
async fn wait_slices(driver: &Driver) -> anyhow::Result<Vec<ResourceSlice>> {
    let want = driver.node_names().len();
    let slices = wait::poll(
        format!("{want} ResourceSlice(s) of driver {}", driver.name()),
        SLICES_TIMEOUT,
        Duration::from_millis(500),
        || async {
            match driver.slices().await {
                Ok(slices) if slices.len() == want => Attempt::Done(slices),
                Ok(slices) => Attempt::Retry(format!(
                    "{} slice(s): {:?}",
                    slices.len(),
                    slices.iter().map(|s| s.name_any()).collect::<Vec<_>>()
                )),
                Err(e) => Attempt::Retry(format!("listing failed: {e}")),
            }
        },
    )
    .await?;
    Ok(slices)
}

/// The sockets of a rolling-update instance on `node`, as upstream's helper names them for its
/// proxy pod's UID: `(pod UID, DRA socket, registration socket)`.
fn expected_sockets(driver: &Driver, node: &str) -> anyhow::Result<(String, String, String)> {
    let pod = driver
        .proxy_pod(node)
        .with_context(|| format!("driver {} has no proxy pod on {node}", driver.name()))?;
    let uid = pod.uid().with_context(|| format!("proxy pod {} has no UID", pod.name_any()))?;
    let root = &driver.config().kubelet_root_dir;
    let dra = format!("{}/{}", proxy::plugin_data_dir(root, driver.name()), dra_socket_file(Some(&uid)));
    let registry = proxy::registry_dir(root);
    let registration =
        format!("{registry}/{}", rolling_update_registration_file(&registry, driver.name(), &uid));
    Ok((uid, dra, registration))
}

/// Checks that both instances run on `node` with their own sockets named after their pod UIDs,
/// that the kubelet registered both, and that each told the kubelet its own DRA endpoint.
fn expect_two_instances(old: &Driver, new: &Driver, node: &str) -> anyhow::Result<()> {
    let mut seen = Vec::new();
    for (instance, driver) in [("old", old), ("new", new)] {
        let (uid, dra, registration) = expected_sockets(driver, node)?;
        let actual =
            driver.socket_paths(node).with_context(|| format!("the {instance} instance does not run"))?;
        expect!(
            actual == (dra.clone(), registration.clone()),
            "the {instance} instance (pod UID {uid}) uses sockets {actual:?}, expected {:?}",
            (&dra, &registration)
        );
        let log = driver.calls(node).log();
        expect!(
            driver.is_registered(node),
            "the kubelet did not register the {instance} instance; call log:\n{log}"
        );
        let endpoint = log
            .matching(Method::GetInfo)
            .into_iter()
            .rev()
            .filter(|r| r.succeeded())
            .find_map(|r| r.response.as_ref().and_then(|info| info.get("endpoint")).cloned())
            .with_context(|| {
                format!(
                    "the kubelet never got a GetInfo answer from the {instance} instance; call log:\n{log}"
                )
            })?;
        expect!(
            endpoint == json!(dra),
            "the {instance} instance advertised endpoint {endpoint}, expected {dra}"
        );
        tracing::info!(instance, %uid, %dra, %registration, "instance registered with its own sockets");
        seen.push((dra, registration));
    }
    expect!(seen[0].0 != seen[1].0 && seen[0].1 != seen[1].1, "the two instances share a socket: {seen:?}");
    Ok(())
}

/// After an update in which `stopped` went away: a pod with an external claim runs on `running`
/// (the builder behaves the same for both instances), the exact same slices as `initial` still
/// exist, and the kubelet called only `running` for the claim ([`expect_served_by`]).
async fn run_pod_after_update(
    ctx: &Ctx,
    running: &Driver,
    stopped: &Driver,
    stopped_name: &str,
    node: &str,
    initial: &[ResourceSlice],
) -> anyhow::Result<()> {
    let b = Builder::start(ctx, running, None).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    let created = b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;
    let uid = created.uid().unwrap_or_default();

    let after = running.slices().await?;
    expect!(
        slices_json(&after) == slices_json(initial),
        "the slices changed after the {stopped_name} instance went away: before {:?}, after {:?}",
        slices_json(initial),
        slices_json(&after)
    );
    expect_served_by(running, stopped, stopped_name, &b, node, &pod, &uid).await
}

/// The kubelet prepared the pod's claim through `serving` only, then (after the pod was deleted)
/// unprepared it there; `other` (torn down before the pod existed) got neither call.
async fn expect_served_by(
    serving: &Driver,
    other: &Driver,
    other_name: &str,
    b: &Builder,
    node: &str,
    pod: &k8s_openapi::api::core::v1::Pod,
    uid: &str,
) -> anyhow::Result<()> {
    let why = format!("the {other_name} instance was torn down before the pod existed");
    other.calls(node).expect_none(Method::NodePrepareResources).context(why.clone())?;
    let history = serving.calls(node).claim(uid);
    expect!(
        history.prepared() >= 1 && history.is_prepared(),
        "the running instance did not prepare the claim: {history}"
    );

    // Clean up explicitly, as upstream does, and see the same instance unprepare the claim.
    b.delete_pod_and_wait(pod).await?;
    serving.calls(node).wait_unprepared(uid, UNPREPARE_TIMEOUT).await?;
    other.calls(node).expect_none(Method::NodeUnprepareResources).context(why.clone())?;
    other.calls(node).expect_none(Method::NodePrepareResources).context(why.clone())?;
    Ok(())
}

/// Upstream's "rolling update": a second instance starts next to the first, the first goes
/// away, and the driver keeps working without its slices changing.
async fn rolling_update(ctx: Ctx) -> SpecResult {
    rolling_update_with(ctx, "", false).await
}

/// The same with a driver name longer than 28 bytes (upstream's regression test for
/// kubernetes#139166): the spec's driver name (`<namespace>.k8s.io`) is padded with a name
/// suffix to upstream's 34 bytes if it is shorter than 29.
async fn rolling_update_with_long_driver_name(ctx: Ctx) -> SpecResult {
    ctx.cluster().require_kubelet_version(1, 33)?;
    let suffix = long_name_suffix(ctx.namespace())?;
    rolling_update_with(ctx, &suffix, true).await
}

/// The name suffix that makes `<namespace><suffix>.k8s.io` longer than [`FULL_UID_MAX_NAME`]
/// bytes: empty when the name is already, else padding to [`LONG_NAME_LEN`]. Fails when the name
/// is too long for the DRA socket `<root>/plugins/<driver>/dra-<pod UID>.sock` (below
/// [`UNIX_PATH_MAX`] bytes; upstream v1.37's helper does not shorten it, kubernetes#142002).
fn long_name_suffix(namespace: &str) -> anyhow::Result<String> {
    let base = driver_name(namespace, "").len();
    // <root>/plugins/ + <driver> + /dra-<36-byte UID>.sock must stay below 108 bytes.
    let uid = "00000000-0000-0000-0000-000000000000";
    let max = UNIX_PATH_MAX
        - 1
        - proxy::plugin_data_dir(DEFAULT_KUBELET_ROOT_DIR, "").len()
        - 1
        - dra_socket_file(Some(uid)).len();
    anyhow::ensure!(
        base <= max,
        "driver name {} is {base} bytes; its dra-<pod UID>.sock would not fit into an AF_UNIX path (at most {max} bytes of driver name)",
        driver_name(namespace, "")
    );
    if base > FULL_UID_MAX_NAME {
        return Ok(String::new());
    }
    Ok(format!("-{}", "l".repeat(LONG_NAME_LEN - base - 1)))
}

/// The rolling update of a driver named `<namespace><name_suffix>.k8s.io`; `long_name`: check
/// the sockets of a name longer than [`FULL_UID_MAX_NAME`] bytes.
async fn rolling_update_with(ctx: Ctx, name_suffix: &str, long_name: bool) -> SpecResult {
    ctx.cluster().require_kubelet_version(1, 33)?;
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let old = Driver::start(&ctx, &nodes, rolling_instance(name_suffix, "-old")).await?;
    let node = only_node(&old)?;
    let initial = wait_slices(&old).await?;
    if long_name {
        expect_long_name_sockets(&old, &node)?;
    }

    // Same driver name, different sockets because of the rolling update.
    let new = Driver::start(&ctx, &nodes, rolling_instance(name_suffix, "-new")).await?;
    expect_two_instances(&old, &new, &node)?;

    // Stop the old instance.
    old.stop().await?;
    expect!(old.socket_paths(&node).is_none(), "the old instance still runs after its teardown");

    // The kubelet did not wipe the slices when the old instance went away, and the new one did
    // not replace them.
    run_pod_after_update(&ctx, &new, &old, "old", &node, &initial).await?;
    Ok(())
}

/// For the long-name spec: the driver name is longer than 28 bytes, so the registration socket
/// carries a hash of the pod UID instead of the UID, and both sockets fit into an AF_UNIX path.
fn expect_long_name_sockets(driver: &Driver, node: &str) -> anyhow::Result<()> {
    let name = driver.name();
    expect!(
        name.len() > FULL_UID_MAX_NAME,
        "the driver name {name} is only {} bytes, the spec needs more than {FULL_UID_MAX_NAME}",
        name.len()
    );
    let (uid, dra, registration) = expected_sockets(driver, node)?;
    expect!(
        !registration.contains(&uid) && registration.contains(&format!("/{name}-")),
        "registration socket {registration} should name the driver and a hash of pod UID {uid}"
    );
    // Bindable: shorter than sun_path, which includes the terminating NUL.
    expect!(
        registration.len() < UNIX_PATH_MAX && dra.len() < UNIX_PATH_MAX,
        "socket paths too long for AF_UNIX: {registration} ({} bytes), {dra} ({} bytes)",
        registration.len(),
        dra.len()
    );
    Ok(())
}

/// Upstream's "failed update": a second instance starts and dies; the kubelet keeps using the
/// first one and the slices stay as they were.
async fn failed_update(ctx: Ctx) -> SpecResult {
    ctx.cluster().require_kubelet_version(1, 33)?;
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let old = Driver::start(&ctx, &nodes, rolling_instance("", "-old")).await?;
    let node = only_node(&old)?;
    let initial = wait_slices(&old).await?;

    // Same driver name, different sockets because of the rolling update. Its slices cannot be
    // gone when its teardown ends: the old instance still runs then.
    let new = Driver::start(&ctx, &nodes, rolling_instance("", "-new").expect_slice_removal(false)).await?;
    expect_two_instances(&old, &new, &node)?;

    // Stop the new instance, as if it failed. The kubelet should still have the old one.
    new.stop().await?;
    expect!(new.socket_paths(&node).is_none(), "the new instance still runs after its teardown");

    run_pod_after_update(&ctx, &old, &new, "new", &node, &initial).await?;
    Ok(())
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
    old.calls(&node)
        .expect_none(Method::NodePrepareResources)
        .context("the old instance was stopped before the pod existed")?;
    let history = new.calls(&node).claim(&uid);
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
    new.calls(&node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;

    // Now shut down for good and wait for the kubelet to remove the slices.
    tracing::info!("uninstalling the driver and waiting for the ResourceSlices to be wiped");
    new.stop().await?;
    new.wait_gone(SLICE_REMOVAL_TIMEOUT).await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn long_driver_names() {
        // The spec's own namespace ("dra-rolling-update-with-" + 5 random characters) already
        // yields 36 bytes, the longest name whose dra-<pod UID>.sock fits.
        let ns = "dra-rolling-update-with-abcde";
        assert_eq!(long_name_suffix(ns).unwrap(), "");
        assert_eq!(driver_name(ns, "").len(), 36);
        // Short names are padded to upstream's 34 bytes.
        for ns in ["dra-x-abcde", "dra-rolling-update-ab"] {
            let suffix = long_name_suffix(ns).unwrap();
            assert_eq!(driver_name(ns, &suffix).len(), LONG_NAME_LEN, "{ns}{suffix}");
            assert!(suffix.starts_with('-'));
        }
        // 29 bytes is long enough.
        let ns = "dra-rolling-update-xy";
        assert_eq!(driver_name(ns, "").len(), 28);
        assert_ne!(long_name_suffix(ns).unwrap(), "");
        let ns = "dra-rolling-update-xyz";
        assert_eq!(long_name_suffix(ns).unwrap(), "");
        // 37 bytes would make a 108-byte DRA socket path.
        assert!(long_name_suffix("dra-rolling-update-with-abcdef").is_err());
    }
}
