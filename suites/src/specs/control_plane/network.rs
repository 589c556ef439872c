//! Upstream's `control plane` context with `NetworkResources(10)` and a driver without kubelet
//! on one node: admin-access validation, generated claim name truncation, ResourceQuota on
//! claims, and who may set `ResourceClaim.status.devices`.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{Builder, pod_claim_names},
    driver::{Driver, DriverConfig, Impersonation, Nodes, resources},
    framework::{Ctx, Registry, Skip, SpecResult},
    wait::{self, Attempt, Verdict},
};
use k8s_openapi::{
    api::{
        core::v1::{Namespace, ResourceQuota, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
        resource::v1::{ResourceClaim, ResourceClaimTemplate},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff,
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::{
    FG_DEVICE_STATUS,
    single_node::{RETRY_INTERVAL, claims_api},
};

/// What the API server says when a namespace without the label asks for admin access.
const ADMIN_ACCESS_ERROR: &str = "admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the containing namespace";
/// The namespace label that allows admin access.
const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";
/// How long upstream retries API calls in these specs (its default `Eventually` timeout is
/// longer, but nothing here needs more than RBAC and quota caches to catch up).
const RETRY_TIMEOUT: Duration = Duration::from_secs(60);
/// Upstream's timeout for RBAC propagation in the device status specs.
const RBAC_TIMEOUT: Duration = Duration::from_secs(15);

/// Registers the specs (inside the `control plane` context).
pub fn register(r: &mut Registry) {
    r.it("validate ResourceClaimTemplate and ResourceClaim for admin access", admin_access);
    r.it("truncates the name of a generated resource claim", truncates_generated_claim_name);
    r.it("supports count/resourceclaims.resource.k8s.io ResourceQuota", resource_quota);
    r.it(
        "must be impossible for a node ServiceAccount to update the non-node ResourceClaim.Status.Devices once allocated",
        node_account_cannot_update_network_device_status,
    )
    .label(FG_DEVICE_STATUS);
    r.it(
        "must be possible for a control-plane ServiceAccount to update the ResourceClaim.Status.Devices once allocated",
        control_plane_account_updates_device_status,
    )
    .label(FG_DEVICE_STATUS);
}

/// One node, ten network-attached devices; RBAC (the plugin identity) only where needed.
async fn setup(ctx: &Ctx, rbac: bool) -> SpecResult<(Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver =
        Driver::start(ctx, &nodes, DriverConfig::control_plane(resources::network(10, false)).rbac(rbac))
            .await?;
    let b = Builder::start(ctx, &driver, None).await?;
    Ok((driver, b))
}

/// The first exact request of a claim spec.
fn first_request(
    spec: Option<&mut k8s_openapi::api::resource::v1::ResourceClaimSpec>,
) -> anyhow::Result<&mut k8s_openapi::api::resource::v1::ExactDeviceRequest> {
    spec.and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
        .context("claim spec without an exact request")
}

fn requests_admin_access(spec: Option<&k8s_openapi::api::resource::v1::ResourceClaimSpec>) -> bool {
    spec.and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .and_then(|r| r.first())
        .and_then(|r| r.exactly.as_ref())
        .and_then(|e| e.admin_access)
        == Some(true)
}

async fn admin_access(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx, false).await?;
    let mut claim = b.external_claim();
    first_request(claim.spec.as_mut())?.admin_access = Some(true);
    let (_, mut template) = b.pod_inline();
    first_request(template.spec.as_mut().and_then(|s| s.spec.as_mut()))?.admin_access = Some(true);

    let claims = claims_api(&ctx);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    // Both must be rejected without the namespace label.
    let claim_name = claim.name_any();
    wait::poll("creating an admin-access claim to be rejected", RETRY_TIMEOUT, RETRY_INTERVAL, || {
        let (claims, claim, claim_name) = (claims.clone(), claim.clone(), claim_name.clone());
        async move {
            // Delete first, in case an earlier attempt succeeded.
            let _ = claims.delete(&claim_name, &DeleteParams::default()).await;
            match claims.create(&PostParams::default(), &claim).await {
                Err(kube::Error::Api(s)) if s.message.contains(ADMIN_ACCESS_ERROR) => Attempt::Done(()),
                Err(e) => Attempt::Retry(format!("unexpected error: {e}")),
                Ok(created) if !requests_admin_access(created.spec.as_ref()) => Attempt::Fail(
                    "the API server dropped adminAccess (feature gate DRAAdminAccess is off)".to_owned(),
                ),
                Ok(_) => Attempt::Retry("the claim was created".to_owned()),
            }
        }
    })
    .await
    .map_err(skip_if_gate_off)?;
    let template_name = template.name_any();
    wait::poll(
        "creating an admin-access claim template to be rejected",
        RETRY_TIMEOUT,
        RETRY_INTERVAL,
        || {
            let (templates, template, template_name) =
                (templates.clone(), template.clone(), template_name.clone());
            async move {
                let _ = templates.delete(&template_name, &DeleteParams::default()).await;
                match templates.create(&PostParams::default(), &template).await {
                    Err(kube::Error::Api(s)) if s.message.contains(ADMIN_ACCESS_ERROR) => Attempt::Done(()),
                    Err(e) => Attempt::Retry(format!("unexpected error: {e}")),
                    Ok(_) => Attempt::Retry("the template was created".to_owned()),
                }
            }
        },
    )
    .await?;

    // With the label, both are allowed (eventually: admission caches namespaces).
    let namespaces: Api<Namespace> = Api::all(ctx.client().clone());
    namespaces
        .patch(
            ctx.namespace(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}})),
        )
        .await?;
    let created =
        wait::poll("creating an admin-access claim to succeed", RETRY_TIMEOUT, RETRY_INTERVAL, || {
            let (claims, claim) = (claims.clone(), claim.clone());
            async move {
                match claims.create(&PostParams::default(), &claim).await {
                    Ok(c) => Attempt::Done(c),
                    Err(e) => Attempt::Retry(e.to_string()),
                }
            }
        })
        .await?;
    expect!(
        requests_admin_access(created.spec.as_ref()),
        "the stored claim lost adminAccess: {:?}",
        created.spec
    );
    let created = wait::poll(
        "creating an admin-access claim template to succeed",
        RETRY_TIMEOUT,
        RETRY_INTERVAL,
        || {
            let (templates, template) = (templates.clone(), template.clone());
            async move {
                match templates.create(&PostParams::default(), &template).await {
                    Ok(t) => Attempt::Done(t),
                    Err(e) => Attempt::Retry(e.to_string()),
                }
            }
        },
    )
    .await?;
    expect!(
        requests_admin_access(created.spec.as_ref().and_then(|s| s.spec.as_ref())),
        "the stored template lost adminAccess"
    );
    Ok(())
}

/// A wait that gave up because a feature gate is off becomes a skip.
fn skip_if_gate_off(e: wait::WaitError) -> harness::framework::SpecError {
    match &e {
        wait::WaitError::Failed { reason, .. } if reason.contains("feature gate") => {
            Skip::because(reason.clone())
        }
        _ => e.into(),
    }
}

async fn truncates_generated_claim_name(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx, false).await?;
    let (mut pod, template) = b.pod_inline();
    pod.metadata.name = Some("p".repeat(63));
    let long_claim = "c".repeat(63);
    let spec = pod.spec.as_mut().context("pod without spec")?;
    if let Some(claim) = spec.resource_claims.as_mut().and_then(|c| c.first_mut()) {
        claim.name = long_claim.clone();
    }
    if let Some(claim) =
        spec.containers[0].resources.as_mut().and_then(|r| r.claims.as_mut()).and_then(|c| c.first_mut())
    {
        claim.name = long_claim.clone();
    }
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let scheduled = b.test_pod(&pod, &[]).await?;
    let generated = pod_claim_names(&scheduled)
        .remove(&long_claim)
        .flatten()
        .context("no claim was generated for the pod claim")?;
    // Both names cut in proportion to their length (57 characters for the base), then the API
    // server's 5 random characters: at most 63.
    let prefix = format!("{}-{}", "p".repeat(28), "c".repeat(28));
    expect!(
        generated.len() <= 63 && generated.starts_with(&prefix),
        "generated claim name {generated:?} ({} characters) is not {prefix:?} plus random characters",
        generated.len()
    );
    Ok(())
}

async fn resource_quota(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx, false).await?;
    let claims = claims_api(&ctx);
    let mut claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "claim-0", "namespace": ctx.namespace()},
        "spec": {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": b.class_name()}}]}},
    }))?;
    claims.create(&PostParams::default(), &claim).await.context("create first claim")?;

    let resource = "count/resourceclaims.resource.k8s.io";
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "object-count", "namespace": ctx.namespace()},
        "spec": {"hard": {resource: "1"}},
    }))?;
    let quotas: Api<ResourceQuota> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    quotas.create(&PostParams::default(), &quota).await.context("create resource quota")?;

    // The quota status counts the existing claim.
    wait::object(
        &quotas,
        "object-count",
        "quota object-count to count the existing claim",
        RETRY_TIMEOUT,
        |q| {
            let status = q.and_then(|q| q.status.as_ref());
            let get = |list: Option<
                &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
            >| { list.and_then(|l| l.get(resource)).map(|q| q.0.clone()) };
            let exact = status.is_some_and(|s| {
                s.hard.as_ref().map(|h| h.len()) == Some(1)
                    && s.used.as_ref().map(|u| u.len()) == Some(1)
                    && get(s.hard.as_ref()).as_deref() == Some("1")
                    && get(s.used.as_ref()).as_deref() == Some("1")
            });
            Verdict::done_if(exact)
        },
    )
    .await?;

    // Another claim is rejected eventually (the quota may reach the API server's cache late).
    // A new name each time, so an erroneous success does not turn into "already exists".
    claim.metadata.name = None;
    claim.metadata.generate_name = Some("claim-1-".to_owned());
    let expected = format!(
        "exceeded quota: object-count, requested: {resource}=1, used: {resource}=1, limited: {resource}=1"
    );
    wait::poll("creating a second claim to exceed the quota", RETRY_TIMEOUT, RETRY_INTERVAL, || {
        let (claims, claim, expected) = (claims.clone(), claim.clone(), expected.clone());
        async move {
            match claims.create(&PostParams::default(), &claim).await {
                Err(kube::Error::Api(s)) if s.message.contains(&expected) => Attempt::Done(()),
                Err(e) => Attempt::Retry(format!("unexpected error: {e}")),
                Ok(c) => Attempt::Retry(format!("claim {} was created", c.name_any())),
            }
        }
    })
    .await?;
    Ok(())
}

/// One entry of `status.devices` for the first allocation result, with upstream's test data:
/// `first` picks the first or second set of values.
pub(crate) fn device_status(
    claim: &ResourceClaim,
    first: bool,
    with_share_id: bool,
) -> anyhow::Result<Value> {
    let result = harness::builder::allocation_results(claim).first().context("claim is not allocated")?;
    // Whole seconds, as the API stores them.
    let now = Time(jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())?);
    let (cond, data, net) = if first {
        (
            json!({"type": "a", "status": "True", "message": "c", "reason": "d"}),
            json!({"foo": "bar"}),
            json!({"interfaceName": "inf1", "ips": ["10.9.8.0/24", "2001:db8::/64"], "hardwareAddress": "bc:1c:b6:3e:b8:25"}),
        )
    } else {
        (
            json!({"type": "e", "status": "True", "message": "g", "reason": "h"}),
            json!({"bar": "foo"}),
            json!({"interfaceName": "inf2", "ips": ["10.9.8.1/24", "2001:db8::1/64"], "hardwareAddress": "bc:1c:b6:3e:b8:26"}),
        )
    };
    let mut condition = cond;
    condition["lastTransitionTime"] = serde_json::to_value(&now)?;
    let mut status = json!({
        "driver": result.driver,
        "pool": result.pool,
        "device": result.device,
        "conditions": [condition],
        "data": data,
        "networkData": net,
    });
    if with_share_id && let Some(share) = &result.share_id {
        status["shareID"] = json!(share);
    }
    Ok(status)
}

/// `status.devices` of a claim as JSON (for comparisons).
pub(crate) fn devices_json(claim: &ResourceClaim) -> Value {
    serde_json::to_value(claim.status.as_ref().and_then(|s| s.devices.as_ref())).unwrap_or_default()
}

/// The claim with `status.devices` set to exactly `devices`.
pub(crate) fn with_devices(claim: &ResourceClaim, devices: &[Value]) -> anyhow::Result<ResourceClaim> {
    let mut claim = claim.clone();
    claim.status.get_or_insert_default().devices =
        Some(serde_json::from_value(Value::Array(devices.to_vec()))?);
    Ok(claim)
}

/// Fails (or skips, when the API server dropped the field: gate off) unless the stored claim
/// has exactly `expected` as `status.devices`.
pub(crate) fn expect_devices(stored: &ResourceClaim, expected: &ResourceClaim) -> SpecResult {
    let (got, want) = (devices_json(stored), devices_json(expected));
    if got.is_null() && !want.is_null() {
        return Err(Skip::because(
            "the API server dropped ResourceClaim.status.devices (feature gate DRAResourceClaimDeviceStatus is off)",
        ));
    }
    expect!(got == want, "status.devices is {got}, expected {want}");
    Ok(())
}

async fn node_account_cannot_update_network_device_status(ctx: Ctx) -> SpecResult {
    let (driver, b) = setup(&ctx, true).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let scheduled = b.test_pod(&pod, &[]).await?;
    let allocated = claims_api(&ctx).get(&claim.name_any()).await?;
    let results = harness::builder::allocation_results(&allocated);
    expect!(results.len() == 1, "expected one allocated device, got {results:?}");
    let update = with_devices(&allocated, &[device_status(&allocated, true, true)?])?;

    // The plugin on the pod's node: the device is network-attached, not on that node.
    let node = harness::builder::node_name(&scheduled).unwrap_or_default().to_owned();
    let client =
        driver.client(&node).with_context(|| format!("pod got scheduled to node {node} without a plugin"))?;
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), ctx.namespace());
    match api.replace_status(&claim.name_any(), &PostParams::default(), &update).await {
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("cannot arbitrary-node:update") => {
            Ok(())
        }
        Err(e) => fail!("expected an Invalid error with \"cannot arbitrary-node:update\", got: {e}"),
        Ok(stored) if devices_json(&stored).is_null() => Err(Skip::because(
            "the API server dropped ResourceClaim.status.devices (feature gate DRAResourceClaimDeviceStatus is off)",
        )),
        Ok(_) => fail!("the node's plugin was allowed to set the status of a network-attached device"),
    }
}

async fn control_plane_account_updates_device_status(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx, false).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;

    // A ServiceAccount with a ClusterRole that may update claim status (but not yet for any driver).
    let sa_name = "claim-status-updater-sa";
    let role_name = ctx.unique_name("claim-status-updater-role");
    let binding_name = ctx.unique_name("claim-status-updater-binding");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": sa_name, "namespace": ctx.namespace()}}))?;
    Api::<ServiceAccount>::namespaced(ctx.client().clone(), ctx.namespace())
        .create(&PostParams::default(), &sa)
        .await?;
    let base_rules = json!([
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update", "patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    ]);
    let roles: Api<ClusterRole> = Api::all(ctx.client().clone());
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": role_name}, "rules": base_rules}))?;
    roles.create(&PostParams::default(), &role).await?;
    ctx.delete_at_cleanup(roles.clone(), role_name.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client().clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": binding_name},
        "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": ctx.namespace()}],
        "roleRef": {"kind": "ClusterRole", "name": role_name, "apiGroup": "rbac.authorization.k8s.io"},
    }))?;
    bindings.create(&PostParams::default(), &binding).await?;
    ctx.delete_at_cleanup(bindings, binding_name);
    let sa_client = Impersonation::service_account(ctx.namespace(), sa_name).client(ctx.client())?;
    let sa_claims: Api<ResourceClaim> = Api::namespaced(sa_client, ctx.namespace());

    let allocated = claims_api(&ctx).get(&claim.name_any()).await?;
    let first = with_devices(&allocated, &[device_status(&allocated, true, false)?])?;

    // Without a resourceclaims/driver rule the DRA validation rejects the update (plain 403s
    // mean RBAC has not caught up with the new binding yet).
    let name = claim.name_any();
    wait::poll("the device status update without driver permission to be rejected", RBAC_TIMEOUT, Duration::from_secs(1), || {
        let (api, first, name) = (sa_claims.clone(), first.clone(), name.clone());
        async move {
            match api.replace_status(&name, &PostParams::default(), &first).await {
                Ok(stored) if devices_json(&stored).is_null() => Attempt::Fail(
                    "the API server dropped ResourceClaim.status.devices (feature gate DRAResourceClaimDeviceStatus is off)".to_owned(),
                ),
                Ok(_) => Attempt::Fail("the update succeeded without permission for the driver".to_owned()),
                Err(kube::Error::Api(s)) if s.code == 403 => Attempt::Retry(format!("RBAC not synced yet: {}", s.message)),
                Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("is forbidden") => Attempt::Done(()),
                Err(e) => Attempt::Retry(format!("unexpected error: {e}")),
            }
        }
    })
    .await
    .map_err(skip_if_gate_off)?;

    // Allowed for this driver.
    let driver_rule = json!({
        "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
        "verbs": ["arbitrary-node:update", "arbitrary-node:patch"], "resourceNames": [b.driver_name()],
    });
    set_rules(&roles, &role_name, &base_rules, driver_rule).await?;
    let updated =
        update_status_eventually(&sa_claims, &name, &first, "after adding the driver-specific rule").await?;
    expect_devices(&updated, &first)?;

    // Allowed for all drivers.
    let wildcard_rule = json!({
        "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
        "verbs": ["arbitrary-node:update", "arbitrary-node:patch"],
    });
    set_rules(&roles, &role_name, &base_rules, wildcard_rule).await?;
    let second = with_devices(&updated, &[device_status(&allocated, false, false)?])?;
    let updated2 = update_status_eventually(&sa_claims, &name, &second, "after the wildcard rule").await?;
    expect_devices(&updated2, &second)?;

    let stored = claims_api(&ctx).get(&name).await?;
    expect_devices(&stored, &second)?;
    Ok(())
}

/// Replaces the ClusterRole's rules with `base` plus `extra`.
async fn set_rules(roles: &Api<ClusterRole>, name: &str, base: &Value, extra: Value) -> anyhow::Result<()> {
    let mut role = roles.get(name).await?;
    let mut rules = base.as_array().cloned().unwrap_or_default();
    rules.push(extra);
    role.rules = Some(serde_json::from_value(Value::Array(rules))?);
    roles.replace(name, &PostParams::default(), &role).await?;
    Ok(())
}

/// Retries a status update until RBAC allows it (upstream: 15 s, every second). The update is
/// based on `claim`'s resourceVersion as given, like upstream's.
async fn update_status_eventually(
    api: &Api<ResourceClaim>,
    name: &str,
    claim: &ResourceClaim,
    when: &str,
) -> anyhow::Result<ResourceClaim> {
    let updated = wait::poll(
        format!("the device status update to succeed {when}"),
        RBAC_TIMEOUT,
        Duration::from_secs(1),
        || {
            let (api, claim) = (api.clone(), claim.clone());
            async move {
                match api.replace_status(name, &PostParams::default(), &claim).await {
                    Ok(c) => Attempt::Done(c),
                    Err(e) => Attempt::Retry(e.to_string()),
                }
            }
        },
    )
    .await?;
    Ok(updated)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn allocated() -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "d.k8s.io", "pool": "network", "device": "device-3", "shareID": "s-1"}
            ]}}},
        }))
        .unwrap()
    }

    #[test]
    fn device_status_uses_the_allocated_device_and_upstreams_data() {
        let s = device_status(&allocated(), true, true).unwrap();
        assert_eq!(
            (s["driver"].as_str(), s["pool"].as_str(), s["device"].as_str()),
            (Some("d.k8s.io"), Some("network"), Some("device-3"))
        );
        assert_eq!(s["shareID"], "s-1");
        assert_eq!(s["networkData"]["interfaceName"], "inf1");
        assert_eq!(s["conditions"][0]["type"], "a");
        let t = s["conditions"][0]["lastTransitionTime"].as_str().unwrap();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
        let second = device_status(&allocated(), false, false).unwrap();
        assert!(second.get("shareID").is_none());
        assert_eq!(second["data"], json!({"bar": "foo"}));
        // It parses as the API type.
        let claim = with_devices(&allocated(), &[s]).unwrap();
        assert_eq!(devices_json(&claim)[0]["device"], "device-3");
    }

    #[test]
    fn missing_devices_mean_the_gate_is_off() {
        let want = with_devices(&allocated(), &[device_status(&allocated(), true, false).unwrap()]).unwrap();
        assert!(expect_devices(&allocated(), &want).unwrap_err().is_skip());
        assert!(expect_devices(&want, &want).is_ok());
    }
}
