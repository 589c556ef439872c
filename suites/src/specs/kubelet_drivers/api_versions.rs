//! Upstream's `v1beta1Tests` and `v1beta2Tests` (`kubelet ... with v1beta1 API` / `with v1beta2
//! API`): the simple claim flow and a request with alternatives, with the objects written through
//! `resource.k8s.io/v1beta1` or `v1beta2` while the scheduler, the controllers and the kubelet
//! work with `v1`. One node, one device, class parameters `{"x":"y"}`.
//!
//! Upstream writes only the template or claim through the beta API; here the DeviceClass is too,
//! so the conversion of its opaque configuration (which becomes `admin_x=y` in the container) is
//! covered as well. The allocation is read back through the same beta API, and the call log shows
//! that the kubelet prepared exactly the claim through `v1.DRAPlugin` and, after the pod is
//! deleted, unprepared it.

use std::fmt::Debug;

use anyhow::Context as _;
use harness::{
    builder::{Builder, node_name},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Label, Registry, SpecResult},
};
use k8s_openapi::{
    api::resource::{v1beta1, v1beta2},
    serde::{Serialize, de::DeserializeOwned},
};
use kube::{Api, Resource, ResourceExt as _, api::PostParams};
use serde_json::{Value, json};

use super::{
    evidence::{self, ClaimKey, DraApi},
    gates,
};

/// The env the class and claim parameters give.
const EXPECTED_ENV: &[(&str, &str)] = &[("admin_x", "y"), ("user_a", "b")];

/// The claim of the alternatives specs.
const MULTI_CLAIM: &str = "external-multiclaim";

/// Registers the specs (inside `kubelet [Feature:DynamicResourceAllocation]`).
pub fn register(r: &mut Registry) {
    for api in [BetaApi::V1beta1, BetaApi::V1beta2] {
        r.context(api.context(), |r| {
            r.it("supports simple ResourceClaim", move |ctx| simple(ctx, api));
            // Upstream: f.WithFeatureGate(features.DRAPrioritizedList).
            r.it("supports requests with alternatives", move |ctx| alternatives(ctx, api))
                .label(Label::gate("DRAPrioritizedList"))
                .requires(gates::api_server_requirement(
                    "DRAPrioritizedList",
                    "it drops firstAvailable from claims",
                ));
        });
    }
}

/// The beta version of `resource.k8s.io` a spec writes its objects with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BetaApi {
    V1beta1,
    V1beta2,
}

impl BetaApi {
    fn context(self) -> &'static str {
        match self {
            BetaApi::V1beta1 => "with v1beta1 API",
            BetaApi::V1beta2 => "with v1beta2 API",
        }
    }

    fn group_version(self) -> &'static str {
        match self {
            BetaApi::V1beta1 => "resource.k8s.io/v1beta1",
            BetaApi::V1beta2 => "resource.k8s.io/v1beta2",
        }
    }

    /// A request for one device of `class` (v1beta1 names the class in the request, v1beta2 in
    /// `exactly`).
    fn request(self, name: &str, class: &str) -> Value {
        match self {
            BetaApi::V1beta1 => json!({ "name": name, "deviceClassName": class }),
            BetaApi::V1beta2 => json!({ "name": name, "exactly": { "deviceClassName": class } }),
        }
    }

    /// The DeviceClass of the builder, with the class parameters as opaque configuration.
    fn class(self, b: &Builder, parameters: &Value) -> Value {
        json!({
            "apiVersion": self.group_version(),
            "kind": "DeviceClass",
            "metadata": { "name": b.class_name() },
            "spec": {
                "selectors": [{ "cel": { "expression": format!("device.driver == \"{}\"", b.driver_name()) } }],
                "config": [{ "opaque": { "driver": b.driver_name(), "parameters": parameters } }],
            },
        })
    }

    /// Upstream's `claimSpecWithV1beta1/2`: request `my-request` for the class and the claim
    /// parameters.
    fn claim_spec(self, b: &Builder) -> Value {
        json!({
            "devices": {
                "requests": [self.request(harness::builder::REQUEST_NAME, &b.class_name())],
                "config": [{ "opaque": { "driver": b.driver_name(), "parameters": b.parameters() } }],
            },
        })
    }

    /// Creates an object given as JSON with this version's type for `kind`.
    async fn create(self, ctx: &Ctx, kind: &str, value: Value) -> anyhow::Result<()> {
        let client = ctx.client().clone();
        let ns = ctx.namespace();
        match (self, kind) {
            (BetaApi::V1beta1, "DeviceClass") => create_class::<v1beta1::DeviceClass>(ctx, value).await,
            (BetaApi::V1beta2, "DeviceClass") => create_class::<v1beta2::DeviceClass>(ctx, value).await,
            (BetaApi::V1beta1, "ResourceClaim") => {
                create(Api::<v1beta1::ResourceClaim>::namespaced(client, ns), value).await
            }
            (BetaApi::V1beta2, "ResourceClaim") => {
                create(Api::<v1beta2::ResourceClaim>::namespaced(client, ns), value).await
            }
            (BetaApi::V1beta1, "ResourceClaimTemplate") => {
                create(Api::<v1beta1::ResourceClaimTemplate>::namespaced(client, ns), value).await
            }
            (BetaApi::V1beta2, "ResourceClaimTemplate") => {
                create(Api::<v1beta2::ResourceClaimTemplate>::namespaced(client, ns), value).await
            }
            _ => anyhow::bail!("no {kind} in {}", self.group_version()),
        }
    }

    /// A claim read through this version, as JSON.
    async fn get_claim(self, ctx: &Ctx, name: &str) -> anyhow::Result<Value> {
        let client = ctx.client().clone();
        let ns = ctx.namespace();
        let what = || format!("get ResourceClaim {name} through {}", self.group_version());
        let value = match self {
            BetaApi::V1beta1 => serde_json::to_value(
                Api::<v1beta1::ResourceClaim>::namespaced(client, ns).get(name).await.with_context(what)?,
            )?,
            BetaApi::V1beta2 => serde_json::to_value(
                Api::<v1beta2::ResourceClaim>::namespaced(client, ns).get(name).await.with_context(what)?,
            )?,
        };
        Ok(value)
    }
}

async fn create<K>(api: Api<K>, value: Value) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let obj: K = serde_json::from_value(value).with_context(|| format!("build {kind}"))?;
    tracing::info!(name = %obj.name_any(), %kind, api_version = %K::api_version(&K::DynamicType::default()), "creating");
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("create {kind} {}", obj.name_any()))?;
    Ok(())
}

/// Creates a DeviceClass and registers its deletion.
async fn create_class<K>(ctx: &Ctx, value: Value) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(ctx.client().clone());
    let name = value["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    create(api.clone(), value).await?;
    ctx.delete_at_cleanup(api, name);
    Ok(())
}

/// One node, a driver with one device there, the DeviceClass written through `api`, and a
/// builder (whose teardown runs before the class is deleted).
async fn setup(ctx: &Ctx, api: BetaApi) -> SpecResult<(Driver, Builder)> {
    ctx.cluster().require_api(api.group_version())?;
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::node_local(1))).await?;
    let parameters = json!({"x": "y"});
    let b = Builder::new(ctx, &driver, Some(parameters.clone()));
    api.create(ctx, "DeviceClass", api.class(&b, &parameters)).await?;
    let b = Builder::start_without_class(ctx, &driver, Some(parameters));
    Ok((driver, b))
}

/// `(request, driver, device)` of each allocation result in a claim as JSON.
fn results(claim: &Value) -> Vec<(String, String, String)> {
    let field = |r: &Value, k: &str| r[k].as_str().unwrap_or_default().to_owned();
    claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .map(|rs| rs.iter().map(|r| (field(r, "request"), field(r, "driver"), field(r, "device"))).collect())
        .unwrap_or_default()
}

/// Checks through the call log of the pod's node that the kubelet prepared exactly `claim`
/// through `v1.DRAPlugin`; then deletes the pod and waits until it unprepared the claim.
async fn check_calls(
    driver: &Driver,
    b: &Builder,
    pod: &k8s_openapi::api::core::v1::Pod,
    claim: ClaimKey,
) -> SpecResult {
    let node = node_name(pod).context("the running pod has no node")?.to_owned();
    let calls = driver.try_calls(&node)?;
    let prepared = evidence::check_prepared(&calls.log(), DraApi::V1, std::slice::from_ref(&claim))?;
    b.delete_pod_and_wait(pod).await?;
    let unprepared = evidence::wait_unprepared(calls, DraApi::V1, std::slice::from_ref(&claim)).await?;
    tracing::info!("kubelet gRPC evidence on node {node}: {prepared}; {unprepared}");
    Ok(())
}

async fn simple(ctx: Ctx, api: BetaApi) -> SpecResult {
    let (driver, b) = setup(&ctx, api).await?;
    let (pod, _) = b.pod_inline();
    let template = json!({
        "apiVersion": api.group_version(),
        "kind": "ResourceClaimTemplate",
        "metadata": { "name": pod.name_any(), "namespace": ctx.namespace() },
        "spec": { "spec": api.claim_spec(&b) },
    });
    b.create_pod(&pod).await?;
    api.create(&ctx, "ResourceClaimTemplate", template).await?;
    let running = b.test_pod(&pod, EXPECTED_ENV).await?;

    let claims = b.pod_claims(&running).await?;
    let claim = claims.values().next().context("the pod has no claim")?;
    let read = api.get_claim(&ctx, &claim.name_any()).await?;
    let got = results(&read);
    expect!(
        got.len() == 1
            && got[0].0 == harness::builder::REQUEST_NAME
            && got[0].1 == driver.name()
            && got[0].2 == "device-00",
        "claim {} read through {} has allocation results {got:?}, expected one for request {} with device {}/device-00",
        claim.name_any(),
        api.group_version(),
        harness::builder::REQUEST_NAME,
        driver.name()
    );
    check_calls(&driver, &b, &running, ClaimKey::of(claim)?).await
}

async fn alternatives(ctx: Ctx, api: BetaApi) -> SpecResult {
    let (driver, b) = setup(&ctx, api).await?;
    let sub_request = |name: &str, count: i64| {
        json!({
            "name": name,
            "deviceClassName": b.class_name(),
            "allocationMode": "ExactCount",
            "count": count,
        })
    };
    let claim = json!({
        "apiVersion": api.group_version(),
        "kind": "ResourceClaim",
        "metadata": { "name": MULTI_CLAIM, "namespace": ctx.namespace() },
        "spec": { "devices": {
            "requests": [{
                "name": "request-1",
                // Two devices cannot be had (there is one), so the second alternative is chosen.
                "firstAvailable": [sub_request("sub-request-1", 2), sub_request("sub-request-2", 1)],
            }],
            "config": [{ "opaque": { "driver": b.driver_name(), "parameters": b.parameters() } }],
        } },
    });
    api.create(&ctx, "ResourceClaim", claim).await?;
    let pod = b.pod_external(MULTI_CLAIM);
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, EXPECTED_ENV).await?;
    // The driver names the env after the request without the sub-request.
    b.expect_env(
        &running,
        harness::builder::CLAIM_CONTAINER,
        &[("claim_external_multiclaim_request_1", "true")],
    )
    .await?;

    let read = api.get_claim(&ctx, MULTI_CLAIM).await?;
    let got = results(&read);
    expect!(
        got.len() == 1 && got[0].0 == "request-1/sub-request-2" && got[0].1 == driver.name(),
        "claim {MULTI_CLAIM} read through {} has allocation results {got:?}, expected one for request-1/sub-request-2 of driver {}",
        api.group_version(),
        driver.name()
    );
    let claims = b.pod_claims(&running).await?;
    let claim = claims.values().next().context("the pod has no claim")?;
    check_calls(&driver, &b, &running, ClaimKey::of(claim)?).await
}
