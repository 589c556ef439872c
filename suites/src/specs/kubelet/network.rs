//! Upstream's first `kubelet` context: one node, a driver registered with its kubelet, ten
//! network-attached devices (`NetworkResources(10)`: a `network` pool the test publishes with a
//! node selector, so the plugin publishes nothing itself).

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use harness::{
    builder::{Builder, condition, node_name, phase},
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    plugin::ClaimId,
    proxied::dra_socket,
    wait::{self, Verdict},
};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, Pod},
    resource::v1::ResourceClaim,
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, Patch, PatchParams},
    runtime::watcher,
};
use serde_json::json;

use super::checks::{self, POD_DELETE_TIMEOUT, POD_START_TIMEOUT, force_delete, stays, wait_event};

/// How long a pod whose claim is not ready must stay pending (upstream: 20 s `Consistently`).
const STAYS_PENDING: Duration = Duration::from_secs(20);
/// The kubelet's event reason when preparing a pod's claims fails.
const FAILED_PREPARE: &str = "FailedPrepareDynamicResources";
/// The namespace label that allows admin access.
const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";

/// Registers the specs (inside the `kubelet` context).
pub fn register(r: &mut Registry) {
    r.it("registers plugin", registers_plugin);
    // guide:begin register_retry_prepare
    r.it("must retry NodePrepareResources", retry_prepare);
    // guide:end
    r.it("must not run a pod if a claim is not ready", claim_not_ready);
    r.it("must unprepare resources for force-deleted pod", unprepare_force_deleted);
    r.it("must call NodePrepareResources even if not used by any container", prepare_unused_claim);
    r.it("must map configs and devices to the right containers", map_configs_and_devices);
    r.it("blocks new pod after force-delete", blocks_new_pod_after_force_delete)
        .label("KubeletMinVersion:1.34");
    r.it("DaemonSet with admin access", daemonset_admin_access);
}

// guide:begin setup
/// One node, ten network-attached devices, a driver registered with the node's kubelet, a
/// DeviceClass for it.
async fn setup(ctx: &Ctx) -> SpecResult<(Driver, Builder, String)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::network(10, false))).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    let node = nodes.names()[0].clone();
    Ok((driver, b, node))
}
// guide:end

async fn registers_plugin(ctx: Ctx) -> SpecResult {
    let (driver, _b, node) = setup(&ctx).await?;
    let log = driver.calls(&node).log();
    // Driver::start waited for a successful NotifyRegistrationStatus(registered=true).
    expect!(
        driver.is_registered(&node),
        "the kubelet did not report the plugin as registered; call log:\n{log}"
    );
    let info = log
        .matching(Method::GetInfo)
        .into_iter()
        .find(|r| r.succeeded())
        .and_then(|r| r.response.clone())
        .with_context(|| format!("the kubelet never got a GetInfo answer; call log:\n{log}"))?;
    let field = |k: &str| info.get(k).cloned().unwrap_or_default();
    expect!(
        field("type") == json!("DRAPlugin")
            && field("name") == json!(driver.name())
            && field("endpoint") == json!(dra_socket(driver.name())),
        "GetInfo answered {info}, expected type DRAPlugin, name {} and endpoint {}",
        driver.name(),
        dra_socket(driver.name())
    );
    let versions = field("supported_versions");
    expect!(
        versions.as_array().is_some_and(|v| v.len() >= 2
            && v[0] == json!("v1.DRAPlugin")
            && v[1] == json!("v1beta1.DRAPlugin")),
        "GetInfo advertised {versions}, expected v1.DRAPlugin and v1beta1.DRAPlugin first"
    );
    // Nothing asked the kubelet to prepare anything.
    driver.calls(&node).expect_none(Method::NodePrepareResources).context("no pod uses the driver")?;
    driver.calls(&node).expect_none(Method::NodeUnprepareResources).context("no pod uses the driver")?;
    Ok(())
}

// guide:begin retry_prepare
async fn retry_prepare(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let calls = driver.calls(&node);
    // Every NodePrepareResources fails, in whichever API version the kubelet uses.
    let failing = driver.fail(&node, Method::NodePrepareResources);
    let (pod, template) = b.pod_inline();
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;

    // The kubelet calls and fails. As upstream, the failure is lifted after the first call:
    // the kubelet retries only at its next pod resync (60-90 s), so waiting for a second failed
    // call would cost a minute.
    calls.wait_at_least(Method::NodePrepareResources.injected(), 1, POD_START_TIMEOUT).await?;
    failing.clear();
    let running = b.test_pod(&pod, &[]).await?;

    // The claim's first prepare was the injected failure, and it was prepared exactly once.
    for uid in b.pod_claim_uids(&running).await?.values() {
        calls.expect_first(Method::NodePrepareResources.for_claim_uid(uid).injected())?;
        calls.claim(uid).expect_prepared_once()?;
    }
    Ok(())
}
// guide:end

async fn claim_not_ready(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let claim = b.external_claim();
    b.create_claim(&claim).await?;
    let mut pod = b.pod_external(&claim.name_any());
    // This bypasses scheduling, so the pod lands on the node although its claim is neither
    // allocated nor reserved for it; nothing will allocate it later.
    pod.spec.as_mut().context("pod without spec")?.node_name = Some(node.clone());
    b.create_pod(&pod).await?;

    // The kubelet saw the pod and refused to prepare its claim...
    wait_event(
        &ctx,
        &pod.name_any(),
        FAILED_PREPARE,
        "is not allowed to use ResourceClaim",
        POD_START_TIMEOUT,
    )
    .await?;
    // ...and the pod stays pending: upstream's `Consistently(20s)`, here a watch of the pod for
    // 20 s in which every state seen must be Pending.
    let pod_name = pod.name_any();
    stays(
        &checks::pods(&ctx),
        watcher::Config::default().fields(&format!("metadata.name={pod_name}")),
        &format!("pod {pod_name} to stay Pending"),
        STAYS_PENDING,
        |pods| match pods.first() {
            None => Some(format!("pod {pod_name} is gone")),
            Some(p) if phase(p) != "Pending" => Some(format!("pod {pod_name} has phase {}", phase(p))),
            Some(_) => None,
        },
    )
    .await?;
    let stored = checks::claims(&ctx).get(&claim.name_any()).await?;
    expect!(!harness::builder::is_allocated(&stored), "claim {} got allocated", claim.name_any());
    // The kubelet checks the reservation before it calls the driver.
    driver
        .calls(&node)
        .expect_none(Method::NodePrepareResources)
        .context("the claim is not reserved for the pod")?;
    Ok(())
}

async fn unprepare_force_deleted(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let claim = b.external_claim();
    let mut pod = b.pod_external(&claim.name_any());
    pod.spec.as_mut().context("pod without spec")?.termination_grace_period_seconds = Some(0);
    let created_claim = b.create_claim(&claim).await?;
    let created = b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;
    let uid = created_claim.uid().unwrap_or_default();

    tracing::info!(pod = %pod.name_any(), "force-deleting the test pod");
    force_delete(&ctx, &pod.name_any(), created.uid()).await?;
    // Upstream waits one minute for the plugin's prepared set to become empty; the call log
    // says more: a NodeUnprepareResources for the claim that succeeded.
    let history = driver.calls(&node).wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    let prepared = driver.prepared_claims(&node);
    expect!(prepared.is_empty(), "claims still prepared on node {node}: {prepared:?}");
    expect!(history.prepared() >= 1, "the claim was never prepared: {history}");
    Ok(())
}

async fn prepare_unused_claim(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let (mut pod, template) = b.pod_inline();
    let spec = pod.spec.as_mut().context("pod without spec")?;
    for c in &mut spec.containers {
        if let Some(r) = c.resources.as_mut() {
            r.claims = None;
        }
    }
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;
    let running = b.wait_running(&pod).await?;
    let prepared = driver.prepared_claims(&node);
    expect!(!prepared.is_empty(), "claims should be prepared on node {node} while the pod is running");
    // The kubelet called NodePrepareResources for the claim although no container uses it...
    b.expect_prepared(&running).await?;
    // ...and gave no container its devices: no driver variables anywhere.
    for c in running.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default() {
        b.expect_env_exact(&running, &c.name, &[]).await?;
    }
    Ok(())
}

/// A claim named `name` with three requests `req0..2` and three configs: the first for all
/// requests, the others for `req1` and `req2` only, with parameters `<name>_config<i>=true`.
fn mapping_claim(b: &Builder, name: &str) -> anyhow::Result<ResourceClaim> {
    let request = |r: &str| json!({ "name": r, "exactly": { "deviceClassName": b.class_name() } });
    let config = |i: usize, requests: Option<&str>| {
        let mut c = json!({ "opaque": { "driver": b.driver_name(), "parameters": { format!("{name}_config{i}"): "true" } } });
        if let Some(r) = requests {
            c["requests"] = json!([r]);
        }
        c
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": name, "namespace": b.namespace() },
        "spec": { "devices": {
            "requests": [request("req0"), request("req1"), request("req2")],
            "config": [config(0, None), config(1, Some("req1")), config(2, Some("req2"))],
        } },
    }))?)
}

/// `name=true` for every name.
fn trues<'a>(names: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    names.iter().map(|n| (*n, "true")).collect()
}

async fn map_configs_and_devices(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let claims =
        [mapping_claim(&b, "all")?, mapping_claim(&b, "container0")?, mapping_claim(&b, "container1")?];
    let (pod, _) = b
        .pod_with_claims()
        .claim("all", "all")
        .claim("container0", "container0")
        .claim("container1", "container1")
        // Everything from "all" and "container0".
        .container("container0", &["all", "container0"])
        // Everything from "all", but only req1 of "container1": only configs 0 and 1 apply.
        .container("container1", &["all", "container1/req1"])
        .build();

    let all = [
        "user_all_config0",
        "user_all_config1",
        "user_all_config2",
        "claim_all_req0",
        "claim_all_req1",
        "claim_all_req2",
    ];
    let mut container0 = trues(&all);
    container0.extend(trues(&[
        "user_container0_config0",
        "user_container0_config1",
        "user_container0_config2",
        "claim_container0_req0",
        "claim_container0_req1",
        "claim_container0_req2",
    ]));
    let mut container1 = trues(&all);
    container1.extend(trues(&[
        "user_container1_config0",
        "user_container1_config1",
        "claim_container1_req1",
    ]));

    for claim in &claims {
        b.create_claim(claim).await?;
    }
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    // Each claim prepared with its three devices (one per request)...
    let stored = b.expect_prepared(&running).await?;
    let uids: Vec<String> = stored.values().map(|c| c.uid().unwrap_or_default()).collect();
    // ...in one call: the kubelet batches a pod's claims per driver.
    let log = driver.calls(&node).log();
    expect!(
        log.matching(Method::NodePrepareResources).iter().any(|r| r.succeeded()
            && r.claims.len() == 3
            && uids.iter().all(|uid| r.claims.iter().any(|c| &c.uid == uid))),
        "expected one NodePrepareResources call naming all three claims {uids:?}; call log:\n{log}"
    );
    b.expect_env_exact(&running, "container0", &container0).await?;
    b.expect_env_exact(&running, "container1", &container1).await?;
    Ok(())
}

async fn blocks_new_pod_after_force_delete(ctx: Ctx) -> SpecResult {
    ctx.cluster().require_kubelet_version(1, 34)?;
    let (driver, b, node) = setup(&ctx).await?;
    // A force-deleted pod may still be torn down by the kubelet when a new claim and pod with
    // the same names arrive; the kubelet must notice that the claim is not the one it still
    // holds and keep the new pod waiting until the old claim is unprepared.
    let claim = b.external_claim();
    let claim_name = claim.name_any();
    let mut pod = b.pod_external(&claim_name);
    pod.spec.as_mut().context("pod without spec")?.node_selector =
        Some(BTreeMap::from([("kubernetes.io/hostname".to_owned(), node.clone())]));
    let old_claim = b.create_claim(&claim).await?;
    let old_pod = b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;
    let old_uid = old_claim.uid().unwrap_or_default();

    // Fail NodeUnprepareResources (both API versions) to simulate a long teardown. Upstream
    // injects it right after the force delete; before it, the kubelet cannot win the race.
    // (If the spec fails, the guard goes with it, and the driver clears every fault before the
    // teardown, which needs the claims unprepared.)
    let failing_unprepare = driver.fail(&node, Method::NodeUnprepareResources);
    tracing::info!("force-deleting claim and pod");
    force_delete(&ctx, &pod.name_any(), old_pod.uid()).await?;
    // The pod is gone at once.
    let left = checks::pods(&ctx).get_opt(&pod.name_any()).await?;
    expect!(left.is_none(), "the force-deleted pod still exists: {left:?}");
    // The claim may take a bit longer because of the allocation and its finalizer.
    let zero = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    checks::claims(&ctx).delete(&claim_name, &zero).await?;
    wait::gone(
        &checks::claims(&ctx),
        &claim_name,
        format!("claim {claim_name} to be gone"),
        POD_DELETE_TIMEOUT,
    )
    .await?;
    let old_id = ClaimId { name: claim_name.clone(), uid: old_uid.clone() };
    let prepared = driver.prepared_claims(&node);
    expect!(prepared == [old_id.clone()], "the old claim should still be prepared, prepared: {prepared:?}");

    tracing::info!("re-creating the same claim and pod");
    let new_claim = b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let new_uid = new_claim.uid().unwrap_or_default();
    // The kubelet refuses the new pod at its first sync (right after it arrives) and tries
    // again only at the pod's next resync, 60-90 s later; upstream allows 10 min
    // (PodStartTimeout * 2).
    let message =
        format!("old ResourceClaim with same name {claim_name} and different UID {old_uid} still exists");
    wait_event(&ctx, &pod.name_any(), FAILED_PREPARE, &message, POD_START_TIMEOUT * 2).await?;
    // The kubelet refused before asking the driver: no prepare call for the new claim yet, and
    // the old claim is still prepared (no unprepare got through).
    let new_history = driver.calls(&node).claim(&new_uid);
    expect!(new_history.prepares().count() == 0, "the new claim must not be prepared yet: {new_history}");
    let old_history = driver.calls(&node).claim(&old_uid);
    expect!(
        old_history.unprepared() == 0 && driver.prepared_claims(&node) == [old_id.clone()],
        "the old claim must still be prepared: {old_history}; prepared: {:?}",
        driver.prepared_claims(&node)
    );

    // The old claim is unprepared soon after this: the kubelet often has not even tried yet
    // (it is still stopping the old pod's container), else it retries after its pod worker's
    // back-off (10-15 s). The new pod starts only at its next resync (see above): that is what
    // this wait waits for.
    failing_unprepare.clear();
    b.test_pod(&pod, &[]).await?;
    let new_id = ClaimId { name: claim_name.clone(), uid: new_uid.clone() };
    let prepared = driver.prepared_claims(&node);
    expect!(prepared == [new_id], "only the new claim should be prepared now, prepared: {prepared:?}");
    // The new pod did not start before the old claim was unprepared: the first successful
    // prepare of the new claim started after the old claim's unprepare finished.
    let old_history = driver.calls(&node).claim(&old_uid);
    let new_history = driver.calls(&node).claim(&new_uid);
    let unprepared = old_history.last_unprepared().context("the old claim was never unprepared")?;
    let prepared = new_history.first_prepared().context("the new claim was never prepared")?;
    expect!(
        unprepared.record.finished.is_some_and(|done| done <= prepared.record.started),
        "the new claim was prepared (#{}) before the old one was unprepared (#{}): old: {old_history}; new: {new_history}",
        prepared.id,
        unprepared.id
    );
    Ok(())
}

async fn daemonset_admin_access(ctx: Ctx) -> SpecResult {
    let (_driver, b, node) = setup(&ctx).await?;
    // Admin access needs the namespace label.
    let namespaces: Api<Namespace> = Api::all(ctx.client().clone());
    let label = json!({ "metadata": { "labels": { ADMIN_ACCESS_LABEL: "true" } } });
    namespaces.patch(ctx.namespace(), &PatchParams::default(), &Patch::Merge(&label)).await?;

    let (pod, mut template) = b.pod_inline();
    template
        .spec
        .as_mut()
        .and_then(|s| s.spec.as_mut())
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
        .context("template without an exact request")?
        .admin_access = Some(true);
    // Limit the DaemonSet to the driver's node.
    let mut spec = pod.spec.clone().context("pod without spec")?;
    spec.node_selector = Some(BTreeMap::from([("kubernetes.io/hostname".to_owned(), node.clone())]));
    spec.restart_policy = Some("Always".into());
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": "monitoring-ds", "namespace": ctx.namespace() },
        "spec": {
            "selector": { "matchLabels": { "app": "monitoring" } },
            "template": { "metadata": { "labels": { "app": "monitoring" } }, "spec": spec },
        },
    }))?;

    let created = b.create_template(&template).await?;
    let kept = created
        .spec
        .and_then(|s| s.spec)
        .and_then(|s| s.devices)
        .and_then(|d| d.requests)
        .and_then(|r| r.into_iter().next())
        .and_then(|r| r.exactly)
        .and_then(|e| e.admin_access);
    expect!(
        kept == Some(true),
        "AdminAccess field was cleared. This test depends on the DRAAdminAccess feature."
    );
    let ds_api: Api<DaemonSet> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    ds_api.create(&Default::default(), &ds).await?;
    {
        // Before the builder's teardown, which would fight the DaemonSet controller over the pods.
        let (ds_api, pods) = (ds_api.clone(), checks::pods(&ctx));
        ctx.defer("delete DaemonSet monitoring-ds and its pods", async move {
            match ds_api.delete("monitoring-ds", &DeleteParams::foreground()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            wait::gone(&ds_api, "monitoring-ds", "DaemonSet monitoring-ds to be gone", POD_DELETE_TIMEOUT)
                .await?;
            wait::objects(
                &pods,
                watcher::Config::default().labels("app=monitoring"),
                "the DaemonSet's pods to be gone",
                POD_DELETE_TIMEOUT,
                |pods| Verdict::done_if(pods.is_empty()),
            )
            .await?;
            Ok(())
        });
    }

    // Upstream's CheckDaemonPodOnNodes: an available pod on the node, none elsewhere.
    let pods = wait::objects(
        &checks::pods(&ctx),
        watcher::Config::default().labels("app=monitoring"),
        format!("the DaemonSet pod to run on node {node}"),
        POD_START_TIMEOUT,
        |pods: &[Pod]| {
            if let Some(p) = pods.iter().find(|p| node_name(p).is_some_and(|n| n != node)) {
                return Verdict::Fail(format!(
                    "DaemonSet pod {} runs on node {:?}",
                    p.name_any(),
                    node_name(p)
                ));
            }
            Verdict::done_if(pods.iter().any(|p| {
                node_name(p) == Some(node.as_str())
                    && phase(p) == "Running"
                    && condition(p, "Ready").is_some_and(|c| c.status == "True")
            }))
        },
    )
    .await?;
    // Upstream's CheckDaemonStatus: every desired pod scheduled and ready.
    wait::object(&ds_api, "monitoring-ds", "DaemonSet monitoring-ds to be ready", POD_START_TIMEOUT, |ds| {
        let Some(status) = ds.and_then(|d| d.status.as_ref()) else { return Verdict::Pending };
        Verdict::done_if(
            status.desired_number_scheduled > 0
                && status.current_number_scheduled == status.desired_number_scheduled
                && status.number_ready == status.desired_number_scheduled,
        )
    })
    .await?;
    // The kubelet prepared the admin-access claim and its container sees the claim's config.
    let ds_pod = pods
        .into_iter()
        .find(|p| node_name(p) == Some(node.as_str()))
        .context("the DaemonSet pod disappeared")?;
    b.test_pod(&ds_pod, &[]).await?;
    Ok(())
}
