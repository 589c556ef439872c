//! The spec bodies: set-up (driver, claims, pod), the cgroup and OOM-score checks, and the
//! in-place resize.

use std::collections::BTreeMap;

use anyhow::Context as _;
use harness::{
    builder::{
        BUSYBOX_IMAGE, Builder, INFINITE_SLEEP, POD_DELETE_TIMEOUT, POD_START_TIMEOUT, condition, phase,
    },
    calls::{Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, SpecResult},
    wait::Verdict,
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::ResourceClaim,
};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use super::{
    cases::{CgroupCase, ContainerCase, Devices, Res},
    cgroups::{
        self, HOST_CGROUP_MOUNT, HOST_CGROUP_VOLUME, Layout, Reader, burstable_oom_score, bytes, milli_cpu,
    },
};

mod resize;

pub use resize::resize_spec;

/// What every spec sets up: the driver with the case's devices on the first node, the builder,
/// and one external claim per pod claim (pod claim name -> created claim).
pub(super) struct Setup {
    pub driver: Driver,
    pub b: Builder,
    pub node: Node,
    pub claims: BTreeMap<String, ResourceClaim>,
}

/// Upstream's set-up: 1 to 4 nodes, the devices published in the first node's pool, a builder,
/// the claims. With `needs_hugepages`, skips unless the first node has `hugepages-2Mi`.
pub(super) async fn setup(
    ctx: &Ctx,
    devices: Devices,
    claims: &[&str],
    needs_hugepages: bool,
) -> SpecResult<Setup> {
    let nodes = Nodes::select(ctx, 1, 4).await?;
    let first = nodes.names().first().cloned().context("no node selected")?;
    let node = Api::<Node>::all(ctx.client().clone()).get(&first).await?;
    if needs_hugepages {
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let hugepages = allocatable.and_then(|a| a.get("hugepages-2Mi")).map(|q| q.0.clone());
        if hugepages.as_deref().is_none_or(|q| cgroups::milli(q).unwrap_or(0) == 0) {
            return Err(ctx.skip(format!(
                "Node {first} does not support hugepages-2Mi (allocatable: {})",
                hugepages.as_deref().unwrap_or("none")
            )));
        }
    }
    let devices = devices.devices()?;
    let target = first.clone();
    let published = resources::ResourcesFn::new(move |_| {
        let slice = resources::Slice { devices: devices.clone(), ..Default::default() };
        let pool = resources::Pool { slices: vec![slice], ..Default::default() };
        let mut out = resources::Resources::new();
        out.insert(target.clone(), resources::DriverResources { pools: [(target.clone(), pool)].into() });
        out
    });
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(published)).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    let mut created = BTreeMap::new();
    for name in claims {
        let claim = b.create_claim(&b.external_claim()).await?;
        created.insert((*name).to_owned(), claim);
    }
    Ok(Setup { driver, b, node, claims: created })
}

/// Upstream's `makeTestPod`: pod `tester-1`, restart policy Never, busybox containers that sleep,
/// the node's `/sys/fs/cgroup` mounted in the first, pod-level resources, the pod claims sorted
/// by name, each naming its external claim.
pub(super) fn test_pod(
    namespace: &str,
    pod_resources: Option<Res>,
    containers: &[ContainerCase],
    claims: &BTreeMap<String, ResourceClaim>,
) -> anyhow::Result<Pod> {
    let containers: Vec<Value> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut resources = c.resources.map(|r| r.requirements()).unwrap_or_else(|| json!({}));
            if !c.hugepages.is_empty() {
                for list in ["requests", "limits"] {
                    resources[list]["hugepages-2Mi"] = json!(c.hugepages);
                }
            }
            if !c.claims.is_empty() {
                resources["claims"] = c.claims.iter().map(|n| json!({ "name": n })).collect();
            }
            let mut container = json!({
                "name": c.name,
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh"],
                "args": ["-c", INFINITE_SLEEP],
                "resources": resources,
            });
            if i == 0 {
                container["volumeMounts"] =
                    json!([{ "name": HOST_CGROUP_VOLUME, "mountPath": HOST_CGROUP_MOUNT }]);
            }
            container
        })
        .collect();
    let mut spec = json!({
        "restartPolicy": "Never",
        "containers": containers,
        "volumes": [{ "name": HOST_CGROUP_VOLUME, "hostPath": { "path": "/sys/fs/cgroup" } }],
    });
    if let Some(r) = pod_resources {
        spec["resources"] = r.requirements();
    }
    if !claims.is_empty() {
        spec["resourceClaims"] = claims
            .iter()
            .map(|(name, claim)| json!({ "name": name, "resourceClaimName": claim.name_any() }))
            .collect();
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "tester-1", "namespace": namespace },
        "spec": spec,
    });
    Ok(serde_json::from_value(pod)?)
}

/// Creates the pod and waits until it runs; skips when the scheduler finds no node with enough
/// CPU or memory for it (the claims' node-allocatable resources included) although no other pod
/// on the devices' node requests any: the node is too small for the spec. While other pods there
/// hold CPU or memory, it keeps waiting.
pub(super) async fn start_pod(ctx: &Ctx, s: &Setup, pod: &Pod) -> SpecResult<Pod> {
    tracing::info!(pod = %serde_json::to_string(pod).unwrap_or_default(), "pod to create");
    s.b.create_pod(pod).await?;
    let deadline = tokio::time::Instant::now() + POD_START_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let what = "to run (or to be unschedulable for lack of CPU or memory)";
        // Past the deadline one more short look, so that a pod still unschedulable is reported as
        // such below (a zero timeout would end the wait before its first list).
        let look = left.max(std::time::Duration::from_secs(10));
        let started =
            s.b.wait_pod(pod, what, look, |p| match phase(p) {
                "Running" => Verdict::Done,
                "Succeeded" | "Failed" => {
                    Verdict::Fail(format!("the pod terminated with phase {}", phase(p)))
                }
                _ if insufficient(p).is_some() => Verdict::Done,
                _ => Verdict::Pending,
            })
            .await?;
        let Some(message) = insufficient(&started) else { return Ok(started) };
        let others = requesting_pods(ctx, &s.node.name_any(), &pod.name_any()).await?;
        if others.is_empty() {
            let allocatable = s.node.status.as_ref().and_then(|st| st.allocatable.as_ref());
            let get = |k: &str| allocatable.and_then(|a| a.get(k)).map(|q| q.0.clone()).unwrap_or_default();
            return Err(ctx.skip(format!(
                "no node can fit the pod with what its claims add: the scheduler says {message:?}; node {} has \
                 {} CPU and {} memory allocatable and no other pod there requests any (upstream's spec fails \
                 here: its pod never starts)",
                s.node.name_any(),
                get("cpu"),
                get("memory"),
            )));
        }
        tracing::info!(
            ?others,
            "the pod is unschedulable while other pods hold CPU or memory of the node; waiting"
        );
        if left.is_zero() {
            fail!(
                "pod {} stayed unschedulable ({message}) while other pods held the node: {others:?}",
                pod.name_any()
            );
        }
        tokio::time::sleep(std::time::Duration::from_secs(5).min(left)).await;
    }
}

/// The pods on `node` other than `ours` that request CPU or memory (in containers or at pod
/// level), as `namespace/name`.
async fn requesting_pods(ctx: &Ctx, node: &str, ours: &str) -> anyhow::Result<Vec<String>> {
    let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = Api::<Pod>::all(ctx.client().clone()).list(&params).await?;
    let requests = |r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>| {
        r.and_then(|r| r.requests.as_ref()).is_some_and(|m| m.contains_key("cpu") || m.contains_key("memory"))
    };
    Ok(pods
        .items
        .iter()
        .filter(|p| !(p.namespace().as_deref() == Some(ctx.namespace()) && p.name_any() == ours))
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .filter(|p| {
            p.spec.as_ref().is_some_and(|s| {
                requests(s.resources.as_ref()) || s.containers.iter().any(|c| requests(c.resources.as_ref()))
            })
        })
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect())
}

/// The scheduler's message when it found too little CPU or memory for the pod.
fn insufficient(pod: &Pod) -> Option<String> {
    let c = condition(pod, "PodScheduled")?;
    let message = c.message.clone().unwrap_or_default();
    let short = message.contains("Insufficient cpu") || message.contains("Insufficient memory");
    (c.status == "False" && c.reason.as_deref() == Some("Unschedulable") && short).then_some(message)
}

/// Checks what the kubelet did before the pod ran: every claim prepared with its allocated
/// devices (from the call log), and the claims' CDI environment in the containers using them.
pub(super) async fn expect_prepared(s: &Setup, pod: &Pod, containers: &[ContainerCase]) -> SpecResult {
    s.b.expect_prepared(pod).await?;
    let env = s.b.parameters_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for c in containers.iter().filter(|c| !c.claims.is_empty()) {
        s.b.expect_env(pod, c.name, &env).await?;
    }
    Ok(())
}

/// Beyond upstream: the pod status names, for every claim a container uses, the containers
/// that use it (`status.nodeAllocatableResourceClaimStatuses`, which the kubelet's cgroup
/// enforcement reads). Claims no container uses are not checked.
pub(super) fn expect_claim_statuses(s: &Setup, pod: &Pod, containers: &[ContainerCase]) -> SpecResult {
    let statuses = pod.status.as_ref().and_then(|st| st.node_allocatable_resource_claim_statuses.clone());
    let statuses = statuses.unwrap_or_default();
    for (pod_claim, claim) in &s.claims {
        let mut users: Vec<String> = containers
            .iter()
            .filter(|c| c.claims.contains(&pod_claim.as_str()))
            .map(|c| c.name.to_owned())
            .collect();
        if users.is_empty() {
            continue;
        }
        users.sort();
        let entry = statuses.iter().find(|e| e.resource_claim_name == claim.name_any());
        let mut listed = entry.and_then(|e| e.containers.clone()).unwrap_or_default();
        listed.sort();
        expect!(
            entry.is_some() && listed == users,
            "status.nodeAllocatableResourceClaimStatuses of pod {} for claim {} ({pod_claim}): expected containers \
             {users:?}, got {statuses:?}",
            pod.name_any(),
            claim.name_any()
        );
    }
    Ok(())
}

/// Deletes the pod, then waits until the kubelet unprepared every claim.
pub(super) async fn delete_and_expect_unprepared(s: &Setup, pod: &Pod) -> SpecResult {
    s.b.delete_pod_and_wait(pod).await?;
    let calls = s.driver.calls(&s.node.name_any());
    for claim in s.claims.values() {
        let uid = claim.uid().unwrap_or_default();
        calls.wait_unprepared(&uid, UNPREPARE_TIMEOUT.max(POD_DELETE_TIMEOUT)).await?;
    }
    Ok(())
}

/// Upstream's `VerifyPodCgroups`: a positive CPU weight, the CPU quota and the memory limit of
/// the pod's cgroup.
pub(super) async fn verify_pod_cgroup(r: &Reader<'_>, layout: Layout, want: &Res) -> anyhow::Result<()> {
    let first = r.first_container();
    let cpu_dir = match r.pod_dir(layout, "cpu").await {
        Ok(dir) => dir,
        Err(_) => r.pod_dir(layout, "cpu,cpuacct").await.map_err(anyhow::Error::msg)?,
    };
    let (weight, limit) =
        if layout.v2 { ("cpu.weight", "cpu.max") } else { ("cpu.shares", "cpu.cfs_quota_us") };
    r.read_int(&first, &format!("{cpu_dir}/{weight}"), true).await.map_err(anyhow::Error::msg)?;
    let quota = cgroups::cpu_limit_values(milli_cpu(want.cpu_lim)?, layout.v2);
    r.expect_value(&first, &format!("{cpu_dir}/{limit}"), &quota)
        .await
        .map_err(|e| anyhow::anyhow!("pod cgroup cpu limit: {e}"))?;
    if let Some(mem) = layout.memory_value(bytes(want.mem_lim)?) {
        let mem_dir = r.pod_dir(layout, "memory").await.map_err(anyhow::Error::msg)?;
        let file = if layout.v2 { "memory.max" } else { "memory.limit_in_bytes" };
        r.expect_value(&first, &format!("{mem_dir}/{file}"), &[mem])
            .await
            .map_err(|e| anyhow::anyhow!("pod cgroup memory limit: {e}"))?;
    }
    Ok(())
}

/// Upstream's `VerifyContainerCgroupValues` for one container: the memory limit and CPU quota
/// of `want` (or the pod-level limits when `want` has none and the pod sets them), and a positive
/// CPU weight unless the container requests no CPU in a pod with pod-level resources.
pub(super) async fn verify_container_cgroup(
    r: &Reader<'_>,
    layout: Layout,
    container: &str,
    want: &Res,
    pod_resources: Option<Res>,
) -> anyhow::Result<()> {
    let root = "/sys/fs/cgroup";
    let mut mem = bytes(want.mem_lim)?;
    let mut cpu = milli_cpu(want.cpu_lim)?;
    if let Some(p) = pod_resources {
        if mem == 0 {
            mem = bytes(p.mem_lim)?;
        }
        if cpu == 0 {
            cpu = milli_cpu(p.cpu_lim)?;
        }
    }
    if let Some(mem) = layout.memory_value(mem) {
        r.expect_value(container, &format!("{root}/{}", layout.memory_limit()), &[mem])
            .await
            .map_err(|e| anyhow::anyhow!("container {container} memory limit: {e}"))?;
    }
    r.expect_value(
        container,
        &format!("{root}/{}", layout.cpu_limit()),
        &cgroups::cpu_limit_values(cpu, layout.v2),
    )
    .await
    .map_err(|e| anyhow::anyhow!("container {container} cpu limit: {e}"))?;
    if milli_cpu(want.cpu_req)? != 0 || pod_resources.is_none() {
        r.read_int(container, &format!("{root}/{}", layout.cpu_weight()), true)
            .await
            .map_err(|e| anyhow::anyhow!("container {container} cpu weight: {e}"))?;
    }
    Ok(())
}

/// The expected cgroup of a container: the case's values, with the container's own requests
/// (`own`) when the case names none (upstream falls back to the spec's requests).
pub(super) fn container_expectation(want: &Res, own: Option<Res>) -> Res {
    let mut want = *want;
    if want.cpu_req.is_empty()
        && want.mem_req.is_empty()
        && let Some(own) = own
    {
        want.cpu_req = own.cpu_req;
        want.mem_req = own.mem_req;
    }
    want
}

/// The kubelet's `oom_score_adj` for the containers of a Guaranteed pod.
const GUARANTEED_OOM_SCORE_ADJ: i128 = -997;

/// The `oom_score_adj` of a plain Guaranteed pod (no claims) on the devices' node: whether the
/// node's container runtime can lower a container's score at all (a runtime without
/// CAP_SYS_RESOURCE cannot go below its own).
async fn control_oom_score_adj(ctx: &Ctx, s: &Setup) -> anyhow::Result<i128> {
    let resources = json!({ "cpu": "10m", "memory": "16Mi" });
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "oom-score-control", "namespace": s.b.namespace() },
        "spec": {
            "restartPolicy": "Never",
            "nodeName": s.node.name_any(),
            "containers": [{
                "name": "control",
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh"],
                "args": ["-c", INFINITE_SLEEP],
                "resources": { "requests": resources, "limits": resources },
            }],
        },
    }))?;
    s.b.create_pod(&pod).await?;
    let pod = s.b.wait_running(&pod).await?;
    let r = Reader { client: ctx.client(), pod: &pod };
    r.oom_score_adj("control").await.map_err(anyhow::Error::msg)
}

/// The memory capacity of the node in bytes.
fn node_memory(node: &Node) -> anyhow::Result<i128> {
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    let memory = capacity.and_then(|c| c.get("memory")).context("node without memory capacity")?;
    bytes(&memory.0)
}

/// One `verifies cgroup inflation and container OOM adjustment with ...` spec.
pub async fn cgroup_spec(ctx: Ctx, case: CgroupCase) -> SpecResult {
    let mut claim_names: Vec<&str> = case
        .containers
        .iter()
        .flat_map(|c| c.claims.iter().copied())
        .chain(case.unreferenced.iter().copied())
        .collect();
    claim_names.sort_unstable();
    claim_names.dedup();
    let s = setup(&ctx, case.devices, &claim_names, case.hugepages.is_some()).await?;
    let pod = test_pod(ctx.namespace(), case.pod_resources, &case.containers, &s.claims)?;
    let pod = start_pod(&ctx, &s, &pod).await?;
    expect_prepared(&s, &pod, &case.containers).await?;
    expect_claim_statuses(&s, &pod, &case.containers)?;

    let r = Reader { client: ctx.client(), pod: &pod };
    let layout = r.layout().await.map_err(anyhow::Error::msg)?;
    verify_pod_cgroup(&r, layout, &case.pod_cgroup)
        .await
        .context("verifying pod cgroup limits on the node")?;
    for (c, want) in case.containers.iter().zip(&case.container_cgroups) {
        let want = container_expectation(want, c.resources);
        verify_container_cgroup(&r, layout, c.name, &want, case.pod_resources)
            .await
            .context("verifying containers cgroup limits on the node")?;
    }

    if let Some((pod_limit, container_limits)) = &case.hugepages {
        let dir = r.pod_dir(layout, "hugetlb").await.map_err(anyhow::Error::msg)?;
        let file = layout.hugetlb_limit("2MB");
        let file = file.rsplit('/').next().unwrap_or_default();
        r.expect_value(&r.first_container(), &format!("{dir}/{file}"), &[(*pod_limit).to_owned()])
            .await
            .map_err(|e| anyhow::anyhow!("pod hugepages limit: {e}"))?;
        for (c, limit) in case.containers.iter().zip(container_limits) {
            let path = format!("/sys/fs/cgroup/{}", layout.hugetlb_limit("2MB"));
            r.expect_value(c.name, &path, &[(*limit).to_owned()])
                .await
                .map_err(|e| anyhow::anyhow!("container {} hugepages limit: {e}", c.name))?;
        }
    }

    // The OOM score adjustment per QoS class (the API server's, as upstream's GetPodQOS).
    let node_memory = node_memory(&s.node)?;
    let qos = pod.status.as_ref().and_then(|st| st.qos_class.clone()).unwrap_or_default();
    for (c, request_mi) in case.containers.iter().zip(&case.score_mem_request_mi) {
        let want = match qos.as_str() {
            "Guaranteed" => GUARANTEED_OOM_SCORE_ADJ,
            "BestEffort" => 1000,
            "Burstable" => burstable_oom_score(*request_mi, node_memory),
            other => fail!("pod {} has QoS class {other:?}", pod.name_any()),
        };
        let got = r.oom_score_adj(c.name).await.map_err(anyhow::Error::msg)?;
        if got != want && want < 0 {
            let control = control_oom_score_adj(&ctx, &s).await?;
            if control != GUARANTEED_OOM_SCORE_ADJ {
                return Err(ctx.skip(format!(
                    "node {} cannot give a container a negative oom_score_adj: a Guaranteed pod without claims \
                     there gets {control}, not {GUARANTEED_OOM_SCORE_ADJ} (its container runtime lacks \
                     CAP_SYS_RESOURCE), so the kubelet's {want} for container {} (which got {got}) cannot be seen",
                    s.node.name_any(),
                    c.name
                )));
            }
        }
        expect!(
            got == want,
            "oom_score_adj of container {} is {got}, expected {want} ({qos} pod, memory request {request_mi}Mi with \
             the claims' share, node memory {node_memory} bytes)",
            c.name
        );
    }

    // Nothing but the pod's start prepared the claims, and they stay prepared while it runs.
    let calls = s.driver.calls(&s.node.name_any());
    calls.expect_none(Method::NodeUnprepareResources).context("the pod still runs")?;
    delete_and_expect_unprepared(&s, &pod).await
}
