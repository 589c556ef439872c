//! Upstream's kubelet PodGroup specs (dra.go `podGroupResourceClaimTests`, context
//! `kubelet [FeatureGate:GenericWorkload] [FeatureGate:DRAWorkloadResourceClaims]
//! [KubeletMinVersion:1.36]`): one node, one node-local device (`DriverResources(1)`), a
//! Workload with one PodGroup template whose claim is an existing claim or is generated from a
//! template for the whole group, a PodGroup of it, and a pod in that group that uses the group's
//! claim. Also the way the PodGroup variants of the device-taint specs make their objects.
//!
//! Beyond upstream, each spec checks what the gates change: the claim is reserved for the
//! PodGroup (not only for the pod), a generated claim belongs to the PodGroup, and the kubelet
//! prepared the claim (the recorded calls, as `test_pod` checks for every kubelet spec).
//!
//! Both gates are beta and off by default in 1.37, and the PodGroup API is
//! `scheduling.k8s.io/v1beta1`, which the API server does not serve by default; kind.yaml turns
//! none of them on (they change how the scheduler handles pods). `cargo xtask test` runs these
//! specs in a lane of their own, on the cluster restarted with [`LANE_FLAGS`]. Elsewhere they are
//! skipped by their requirement ([`require_pod_groups`]) before anything is created.

use anyhow::Context as _;
use harness::{
    builder::{Builder, INLINE_CLAIM_NAME},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Label, Precheck, Registry, SpecError, SpecResult},
};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaimTemplate};
use kube::{ResourceExt as _, core::Request};

use super::super::{FEATURE_DRA, kubelet_drivers::gates};

/// The `cluster up` flags of the lane these specs run in.
pub const LANE_FLAGS: &str = "--feature-gates DRAWorkloadResourceClaims=true,GenericWorkload=true --runtime-config scheduling.k8s.io/v1beta1=true";

/// `f.WithFeatureGate(features.GenericWorkload), f.WithFeatureGate(features.DRAWorkloadResourceClaims),
/// f.WithKubeletMinVersion("1.36")` on the `kubelet` context.
pub const POD_GROUP_LABELS: [Label; 4] = [
    Label::new(FEATURE_DRA),
    Label::gate("GenericWorkload"),
    Label::gate("DRAWorkloadResourceClaims"),
    Label::new("KubeletMinVersion:1.36"),
];

/// The same gates on the PodGroup context inside the device-taint context, in its order:
/// `f.WithFeatureGate(DRAWorkloadResourceClaims), f.WithFeatureGate(GenericWorkload),
/// f.WithLabel("KubeletMinVersion:1.36")`.
pub const TAINT_POD_GROUP_LABELS: [Label; 3] = [
    Label::gate("DRAWorkloadResourceClaims"),
    Label::gate("GenericWorkload"),
    Label::new("KubeletMinVersion:1.36"),
];

/// Registers the PodGroup context's specs (inside `kubelet` with [`POD_GROUP_LABELS`]).
pub fn register(r: &mut Registry) {
    r.requires(require_pod_groups);
    r.it("allocates devices for PodGroups", allocates_for_pod_groups);
    r.it("generates claims from templates for PodGroups", generates_claims_for_pod_groups);
}

/// How a spec's pod gets its inline claim: from its own template (`b.PodInline()`), or from its
/// PodGroup's (`b.WorkloadInline()` + `b.PodGroup(...)` + `b.GroupedPodWithClaims(...)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inline {
    /// The pod's own claim template.
    Pod,
    /// The claim template of the pod's PodGroup.
    PodGroup,
}

impl Inline {
    /// Makes and creates the pod and its claim template (`change` edits the template first,
    /// `finalizers` go onto the pod); returns the pod as made.
    pub async fn create(
        self,
        b: &Builder,
        change: impl FnOnce(&mut ResourceClaimTemplate) -> anyhow::Result<()>,
        finalizers: &[&str],
    ) -> SpecResult<Pod> {
        let (mut pod, mut template, group) = match self {
            Inline::Pod => {
                let (pod, template) = b.pod_inline();
                (pod, template, None)
            }
            Inline::PodGroup => {
                let (workload, template) = b.objects().workload_inline();
                let group = b.objects().pod_group_of(&workload);
                b.create_workload(&workload).await?;
                (b.objects().grouped_pod_with_claims(&group), template, Some(group))
            }
        };
        change(&mut template)?;
        if !finalizers.is_empty() {
            pod.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        }
        if let Some(group) = &group {
            b.create_pod_group(group).await?;
        }
        b.create_pod(&pod).await?;
        b.create_template(&template).await?;
        Ok(pod)
    }
}

/// A requirement ([`Registry::requires`]) of every spec that makes PodGroups: skips unless the
/// API server serves PodGroups and runs with both gates on, before anything is created.
pub async fn require_pod_groups(pre: Precheck) -> SpecResult {
    let lane = format!("start the cluster with `cargo xtask cluster up {LANE_FLAGS}`");
    // What preflight discovered first: it costs no request (the API server's /metrics, read for
    // the gates, can take seconds on a busy server).
    if !pre.cluster().serves("scheduling.k8s.io/v1beta1") {
        return Err(SpecError::skip(format!(
            "the API server does not serve scheduling.k8s.io/v1beta1; {lane}"
        )));
    }
    for gate in ["GenericWorkload", "DRAWorkloadResourceClaims"] {
        if gates::api_server(&pre, gate).await.is_off() {
            return Err(SpecError::skip(format!("the API server runs with feature gate {gate} off; {lane}")));
        }
    }
    // GET /apis/scheduling.k8s.io/v1beta1: the group version's resource list.
    let request = Request::new("/apis/scheduling.k8s.io").get("v1beta1", &Default::default())?;
    let served = match pre.client().request_text(request).await {
        Ok(text) => text.contains("\"podgroups\""),
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        Err(e) => return Err(anyhow::Error::new(e).context("GET /apis/scheduling.k8s.io/v1beta1").into()),
    };
    if !served {
        return Err(SpecError::skip(format!(
            "the API server does not serve scheduling.k8s.io/v1beta1 PodGroups; {lane}"
        )));
    }
    Ok(())
}

/// One node, one node-local device, a driver registered with the node's kubelet.
async fn setup(ctx: &Ctx) -> SpecResult<(Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::node_local(1))).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    Ok((driver, b))
}

/// Checks that `claim` of the pod is reserved for its PodGroup `group`.
async fn expect_reserved_for_group(b: &Builder, pod: &Pod, group: &str) -> SpecResult {
    let claims = b.pod_claims(pod).await?;
    let claim = claims.values().next().context("the pod has no claim")?;
    let reserved: Vec<(String, String)> = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .map(|r| (r.resource.clone(), r.name.clone()))
        .collect();
    expect!(
        reserved.iter().any(|(resource, name)| resource == "podgroups" && name == group),
        "claim {} is not reserved for PodGroup {group}: reservedFor {reserved:?}",
        claim.name_any()
    );
    Ok(())
}

async fn allocates_for_pod_groups(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx).await?;
    let claim = b.external_claim();
    let workload = b.objects().workload_external(&claim.name_any());
    let group = b.objects().pod_group_of(&workload);
    let pod = b.objects().grouped_pod_with_claims(&group);
    b.create_workload(&workload).await?;
    b.create_pod_group(&group).await?;
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[]).await?;
    expect_reserved_for_group(&b, &running, &group.name_any()).await
}

async fn generates_claims_for_pod_groups(ctx: Ctx) -> SpecResult {
    let (_driver, b) = setup(&ctx).await?;
    let (workload, template) = b.objects().workload_inline();
    let group = b.objects().pod_group_of(&workload);
    let pod = b.objects().grouped_pod_with_claims(&group);
    b.create_workload(&workload).await?;
    b.create_pod_group(&group).await?;
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[]).await?;
    // The claim was generated for the group: the PodGroup owns it, not the pod.
    let claims = b.pod_claims(&running).await?;
    let claim = claims.get(INLINE_CLAIM_NAME).context("the pod has no generated claim")?;
    let owners: Vec<(String, String)> =
        claim.owner_references().iter().map(|o| (o.kind.clone(), o.name.clone())).collect();
    expect!(
        owners.iter().any(|(kind, name)| kind == "PodGroup" && *name == group.name_any()),
        "the generated claim {} is not owned by PodGroup {}: owners {owners:?}",
        claim.name_any(),
        group.name_any()
    );
    expect_reserved_for_group(&b, &running, &group.name_any()).await
}
