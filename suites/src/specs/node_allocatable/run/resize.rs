//! The `verifies cgroup settings and pod status after resize with ...` specs: the pod runs, its
//! container or pod-level resources are resized in place through the `resize` subresource, and
//! the cgroups, `status.allocatedResources` and the spec must then show the new values.

use std::collections::BTreeMap;

use anyhow::Context as _;
use harness::{
    builder::{POD_START_TIMEOUT, condition},
    calls::Method,
    framework::{Ctx, SpecResult},
    wait::Verdict,
};
use k8s_openapi::{
    api::core::v1::{Pod, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, ResourceExt as _,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use super::{
    super::{
        cases::{CPU_MEM, ContainerCase, Res, ResizeCase},
        cgroups::{Reader, milli},
    },
    container_expectation, delete_and_expect_unprepared, expect_claim_statuses, expect_prepared, setup,
    start_pod, test_pod, verify_container_cgroup, verify_pod_cgroup,
};

/// The container of every resize spec.
const CONTAINER: &str = "c1";

/// The strategic merge patch from `before` to `after` (upstream's `MakeResizePatch`; no case
/// removes a value, so the new values are the patch).
fn resize_patch(case: &ResizeCase) -> Value {
    let mut spec = serde_json::Map::new();
    if case.container.0 != case.container.1 {
        let resources = case.container.1.map(|r| r.requirements()).unwrap_or_else(|| json!({}));
        spec.insert("containers".into(), json!([{ "name": CONTAINER, "resources": resources }]));
    }
    if case.pod_resources.0 != case.pod_resources.1 {
        spec.insert(
            "resources".into(),
            case.pod_resources.1.map(|r| r.requirements()).unwrap_or(Value::Null),
        );
    }
    json!({ "spec": spec })
}

/// Why a resize can never complete: the kubelet's `PodResizePending` condition with reason
/// `Infeasible`.
fn infeasible(pod: &Pod) -> Option<String> {
    let c = condition(pod, "PodResizePending")?;
    (c.reason.as_deref() == Some("Infeasible")).then(|| c.message.clone().unwrap_or_default())
}

/// The kubelet's error when the container runtime cannot write a CPU quota that cgroup v1
/// refuses (a child's `cpu.cfs_quota_us` above its parent's is `EINVAL` there; cgroup v2's
/// `cpu.max` has no such rule). The kubelet retries it forever.
fn v1_quota_refused(pod: &Pod) -> Option<String> {
    let c = condition(pod, "PodResizeInProgress")?;
    let message = c.message.clone().unwrap_or_default();
    (c.reason.as_deref() == Some("Error") && message.contains("cpu.cfs_quota_us: invalid argument"))
        .then_some(message)
}

/// Upstream's `WaitForPodResizeActuation`: the kubelet observed the new generation, no resize is
/// pending or in progress, the pod is ready. Skips when the node cannot fit the new size.
async fn wait_actuated(ctx: &Ctx, pods: &Api<Pod>, name: &str) -> SpecResult<Pod> {
    let what =
        format!("pod {name}'s resize to be actuated (generation observed, no resize condition, ready)");
    let pod = harness::wait::existing(pods, name, what, POD_START_TIMEOUT, |p: &Pod| {
        if infeasible(p).is_some() || v1_quota_refused(p).is_some() {
            return Verdict::Done;
        }
        let observed = p.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
        let resizing =
            condition(p, "PodResizePending").is_some() || condition(p, "PodResizeInProgress").is_some();
        let ready = condition(p, "Ready").is_some_and(|c| c.status == "True");
        Verdict::done_if(observed >= p.metadata.generation.unwrap_or(0) && !resizing && ready)
    })
    .await?;
    if let Some(message) = v1_quota_refused(&pod) {
        return Err(ctx.skip(format!(
            "the kubelet cannot actuate this resize on the node's cgroup v1 hierarchy (a container's CFS quota \
             above its pod's is invalid there): PodResizeInProgress says {message:?}"
        )));
    }
    if let Some(message) = infeasible(&pod) {
        let short = message.contains("Node didn't have enough") || message.contains("Insufficient");
        if short {
            return Err(ctx.skip(format!(
                "the node cannot accommodate the resized pod: the kubelet says {message:?} (upstream's spec \
                 fails here: resize is infeasible)"
            )));
        }
        fail!("the resize of pod {name} is infeasible: {message}");
    }
    Ok(pod)
}

/// Compares a resource list with `(cpu, memory)` semantically; `""` means absent.
fn list_problem(
    what: &str,
    got: Option<&BTreeMap<String, Quantity>>,
    cpu: &str,
    mem: &str,
) -> Option<String> {
    let mut want = BTreeMap::new();
    for (k, v) in [("cpu", cpu), ("memory", mem)] {
        if !v.is_empty() {
            want.insert(k.to_owned(), milli(v).ok()?);
        }
    }
    let got_values: Option<BTreeMap<String, i128>> = got
        .map(|m| m.iter().map(|(k, q)| Some((k.clone(), milli(&q.0).ok()?))).collect::<Option<_>>())
        .unwrap_or(Some(BTreeMap::new()));
    (got_values.as_ref() != Some(&want))
        .then(|| format!("{what} is {got:?}, expected cpu {cpu:?} memory {mem:?}"))
}

/// Upstream's `VerifyPodResources` for one container and the pod-level resources.
fn spec_problems(pod: &Pod, container: Option<Res>, pod_resources: Option<Res>) -> Vec<String> {
    let spec = pod.spec.as_ref();
    let c = spec.and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER));
    let check = |what: &str, got: Option<&ResourceRequirements>, want: Option<Res>| {
        let want = want.unwrap_or_default();
        [
            list_problem(
                &format!("{what} requests"),
                got.and_then(|r| r.requests.as_ref()),
                want.cpu_req,
                want.mem_req,
            ),
            list_problem(
                &format!("{what} limits"),
                got.and_then(|r| r.limits.as_ref()),
                want.cpu_lim,
                want.mem_lim,
            ),
        ]
    };
    let mut problems: Vec<String> =
        check(&format!("container {CONTAINER}"), c.and_then(|c| c.resources.as_ref()), container)
            .into_iter()
            .flatten()
            .collect();
    problems.extend(
        check("pod-level resources", spec.and_then(|s| s.resources.as_ref()), pod_resources)
            .into_iter()
            .flatten(),
    );
    if spec.map(|s| s.containers.len()) != Some(1) {
        problems.push("the pod does not have exactly one container".to_owned());
    }
    problems
}

/// One `verifies cgroup settings and pod status after resize with ...` spec.
pub async fn resize_spec(ctx: Ctx, case: ResizeCase) -> SpecResult {
    let s = setup(&ctx, case.devices, &[CPU_MEM], false).await?;
    let before =
        [ContainerCase { name: CONTAINER, resources: case.container.0, claims: &[CPU_MEM], hugepages: "" }];
    let pod = test_pod(ctx.namespace(), case.pod_resources.0, &before, &s.claims)?;
    let pod = start_pod(&ctx, &s, &pod).await?;
    expect_prepared(&s, &pod, &before).await?;
    expect_claim_statuses(&s, &pod, &before)?;
    let calls = s.driver.calls(&s.node.name_any());
    let prepares = calls.count(Method::NodePrepareResources);

    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let name = pod.name_any();
    let patch = resize_patch(&case);
    tracing::info!(%patch, "patching the pod for resize");
    let patched = match pods
        .patch_subresource("resize", &name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(p) => p,
        // The API server refuses a resize that cannot fit the node (the claims' resources
        // included): a node too small for the spec, not a failure of the feature.
        Err(kube::Error::Api(s))
            if s.code == 403 && s.message.contains("didn't have enough allocatable resources") =>
        {
            return Err(ctx.skip(format!(
                "the node cannot fit the resized pod: the API server refused the resize with {:?} (upstream's \
                 spec fails here the same way)",
                s.message
            )));
        }
        Err(e) => return Err(anyhow::Error::new(e).context("patching the pod for resize").into()),
    };
    let resized = wait_actuated(&ctx, &pods, &name).await?;

    let r = Reader { client: ctx.client(), pod: &resized };
    let layout = r.layout().await.map_err(anyhow::Error::msg)?;
    verify_pod_cgroup(&r, layout, &case.pod_cgroup)
        .await
        .context("verifying updated pod cgroup limits after resize")?;
    let want = container_expectation(&case.container_cgroup, case.container.1);
    verify_container_cgroup(&r, layout, CONTAINER, &want, case.pod_resources.1)
        .await
        .context("verifying updated container cgroup limits after resize")?;

    let allocated = resized.status.as_ref().and_then(|st| st.allocated_resources.as_ref());
    let (cpu, mem) = case.pod_allocated;
    if let Some(problem) = list_problem("the pod's status.allocatedResources", allocated, cpu, mem) {
        fail!("verifying pod status updates match spec after resize: {problem}");
    }
    let problems = spec_problems(&patched, case.container.1, case.pod_resources.1);
    expect!(problems.is_empty(), "verifying pod spec resources after patch: {}", problems.join("; "));

    // A resize is no reason to prepare or unprepare a claim.
    let log = calls.log();
    expect!(
        log.count(Method::NodePrepareResources) == prepares && log.count(Method::NodeUnprepareResources) == 0,
        "the resize made the kubelet prepare or unprepare claims:\n{log}"
    );
    delete_and_expect_unprepared(&s, &resized).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::{super::super::cases::resize_cases, *};

    #[test]
    fn patches_hold_what_changes() {
        let cases = resize_cases();
        assert_eq!(
            resize_patch(&cases[0]),
            json!({ "spec": { "containers": [{ "name": "c1", "resources": {
                "limits": { "cpu": "1500m", "memory": "2000Mi" }, "requests": { "cpu": "500m", "memory": "1000Mi" } } }] } })
        );
        assert_eq!(
            resize_patch(&cases[2]),
            json!({ "spec": { "resources": {
                "limits": { "cpu": "5", "memory": "5Gi" }, "requests": { "cpu": "3", "memory": "3Gi" } } } })
        );
    }

    #[test]
    fn compares_quantities_semantically() {
        let got: BTreeMap<String, Quantity> =
            [("cpu".to_owned(), Quantity("1500m".into())), ("memory".to_owned(), Quantity("2000Mi".into()))]
                .into();
        assert_eq!(list_problem("x", Some(&got), "1.5", "2000Mi"), None);
        assert!(list_problem("x", Some(&got), "1500m", "").is_some());
        assert_eq!(list_problem("x", None, "", ""), None);
    }
}
