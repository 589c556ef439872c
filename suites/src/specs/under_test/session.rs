//! One driver-under-test spec's set-up: the node under test (the first node, by name, with a
//! ResourceSlice of the driver), the interposer on it (with `--interpose`), the CDI reader on it,
//! and the claims and pods the spec makes there, deleted (and waited for) before the interposer
//! goes away.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use harness::{
    builder::{
        BUSYBOX_IMAGE, INFINITE_SLEEP, POD_DELETE_TIMEOUT, POD_START_TIMEOUT, exec, is_allocated, phase,
    },
    calls::Calls,
    framework::{ClusterAccess, Ctx},
    interposer::Interposer,
    wait::{self, Verdict},
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

use super::{Target, cdi::CdiReader};

/// The pod claim name of every test pod.
pub const POD_CLAIM: &str = "device";
/// The container of every test pod.
pub const CONTAINER: &str = "with-device";

/// A spec's driver, node, interposer and CDI reader.
pub struct Session {
    /// The spec's context.
    pub ctx: Ctx,
    /// The driver under test.
    pub target: Arc<Target>,
    /// The node under test.
    pub node: String,
    /// The interposer on the node, with `--interpose`.
    pub interposer: Option<Interposer>,
    /// Reads the node's CDI spec files.
    pub cdi: CdiReader,
    counter: AtomicUsize,
}

/// The ResourceSlices of `driver`, by name.
pub async fn driver_slices(ctx: &impl ClusterAccess, driver: &str) -> anyhow::Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(ctx.client().clone());
    let mut slices = api.list(&ListParams::default().fields(&format!("spec.driver={driver}"))).await?.items;
    slices.retain(|s| s.spec.driver == driver);
    slices.sort_by_key(|s| s.name_any());
    Ok(slices)
}

/// The nodes with a ResourceSlice of `driver` that exist, sorted.
pub async fn served_nodes(ctx: &impl ClusterAccess, driver: &str) -> anyhow::Result<Vec<String>> {
    let slices = driver_slices(ctx, driver).await?;
    let nodes: Api<Node> = Api::all(ctx.client().clone());
    let existing: Vec<String> =
        nodes.list(&ListParams::default()).await?.items.iter().map(|n| n.name_any()).collect();
    let mut served: Vec<String> =
        slices.iter().filter_map(|s| s.spec.node_name.clone()).filter(|n| existing.contains(n)).collect();
    served.sort();
    served.dedup();
    Ok(served)
}

impl Session {
    /// Picks the node, starts the interposer (with `--interpose`) and the CDI reader.
    pub async fn start(ctx: &Ctx, target: &Arc<Target>) -> anyhow::Result<Session> {
        let nodes = served_nodes(ctx, &target.driver).await?;
        let Some(node) = nodes.first().cloned() else {
            anyhow::bail!(
                "driver {} publishes no ResourceSlice for an existing node, so no node serves its devices",
                target.driver
            );
        };
        harness::framework::step(format!("node under test: {node} (driver {})", target.driver));
        let cdi = CdiReader::start(ctx, &node).await?;
        let interposer = if target.interpose {
            let interposer = Interposer::start(ctx, &target.driver, std::slice::from_ref(&node)).await;
            Some(interposer.map_err(|e| anyhow::anyhow!("cannot interpose on node {node}: {e}"))?)
        } else {
            None
        };
        Ok(Session {
            ctx: ctx.clone(),
            target: target.clone(),
            node,
            interposer,
            cdi,
            counter: AtomicUsize::new(0),
        })
    }

    /// The calls of the node under test, when interposed.
    pub fn calls(&self) -> Option<&Calls> {
        self.interposer.as_ref().map(|i| i.calls(&self.node))
    }

    /// `"\ncall log of node N:\n..."` when interposed, else nothing: for failure messages.
    pub fn call_log(&self) -> String {
        match self.calls() {
            Some(calls) => {
                format!("\ncall log of node {} (through the interposer):\n{}", self.node, calls.log())
            }
            None => String::new(),
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client().clone(), self.ctx.namespace())
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.ctx.client().clone(), self.ctx.namespace())
    }

    fn next(&self) -> usize {
        self.counter.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Creates a claim for one device of the class; it is deleted (and its deletion waited for)
    /// at cleanup, before the interposer goes.
    pub async fn create_claim(&self) -> anyhow::Result<ResourceClaim> {
        self.create_claim_for(1).await
    }

    /// Creates a claim for `count` devices of the class (one request), deleted like
    /// [`Session::create_claim`]'s.
    pub async fn create_claim_for(&self, count: u32) -> anyhow::Result<ResourceClaim> {
        let exactly = if count == 1 { json!({}) } else { json!({ "count": count }) };
        self.create_claim_with(exactly).await
    }

    /// Creates a claim with one request for devices of the class, `exactly` adding to it
    /// (`count`, `selectors`, `capacity`, `tolerations`, `adminAccess`, `allocationMode`);
    /// deleted like [`Session::create_claim`]'s.
    pub async fn create_claim_with(&self, mut exactly: serde_json::Value) -> anyhow::Result<ResourceClaim> {
        exactly["deviceClassName"] = json!(self.target.class);
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": format!("claim-{}", self.next()) },
            "spec": { "devices": { "requests": [{ "name": "device", "exactly": exactly }] } },
        }))?;
        let created = self.claims().create(&PostParams::default(), &claim).await?;
        self.delete_and_wait_at_cleanup(self.claims(), "claim", created.name_any());
        Ok(created)
    }

    /// Deletes the claim and waits until it is gone.
    pub async fn delete_claim(&self, name: &str) -> anyhow::Result<()> {
        delete(&self.claims(), name, DeleteParams::default()).await?;
        wait::gone(&self.claims(), name, format!("claim {name} to be gone"), POD_DELETE_TIMEOUT).await?;
        Ok(())
    }

    /// Creates a busybox pod that uses `claim`: on the node under test through node affinity
    /// (`bind`: false) or bound to it directly, past the scheduler (`bind`: true). It is deleted
    /// (and its deletion waited for) at cleanup, before the interposer goes.
    pub async fn create_pod(&self, claim: &str, bind: bool) -> anyhow::Result<Pod> {
        let spec = json!({
            "resourceClaims": [{ "name": POD_CLAIM, "resourceClaimName": claim }],
            "containers": [container(CONTAINER, POD_CLAIM)],
        });
        self.create_pod_with(spec, bind).await
    }

    /// Creates a busybox pod on the node under test (node affinity) with one container per
    /// `(name, claim)`, named `name`, that uses ResourceClaim `claim` as pod claim `name`; deleted
    /// like [`Session::create_pod`]'s.
    pub async fn create_pod_with_claims(&self, claims: &[(&str, &str)]) -> anyhow::Result<Pod> {
        let spec = json!({
            "resourceClaims": claims.iter().map(|(name, claim)| json!({ "name": name, "resourceClaimName": claim })).collect::<Vec<_>>(),
            "containers": claims.iter().map(|(name, _)| container(name, name)).collect::<Vec<_>>(),
        });
        self.create_pod_with(spec, false).await
    }

    /// Creates the pod of `spec` (claims and containers), placed as [`Session::create_pod`] says.
    async fn create_pod_with(&self, mut spec: serde_json::Value, bind: bool) -> anyhow::Result<Pod> {
        spec["restartPolicy"] = json!("Never");
        spec["terminationGracePeriodSeconds"] = json!(5);
        if bind {
            spec["nodeName"] = json!(self.node);
        } else {
            spec["affinity"] = json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": [self.node] },
                ] }],
            } } });
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": format!("pod-{}", self.next()) },
            "spec": spec,
        }))?;
        let created = self.pods().create(&PostParams::default(), &pod).await?;
        self.delete_and_wait_at_cleanup(self.pods(), "pod", created.name_any());
        Ok(created)
    }

    /// Registers a cleanup that deletes the object and waits until it is gone, so that the
    /// kubelet has unprepared what it used before the interposer (registered earlier) goes.
    fn delete_and_wait_at_cleanup<K>(&self, api: Api<K>, kind: &'static str, name: String)
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + k8s_openapi::serde::Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        self.ctx.defer_with_timeout(format!("delete {kind} {name}"), POD_DELETE_TIMEOUT, async move {
            delete(&api, &name, DeleteParams::default()).await?;
            wait::gone(&api, &name, format!("{kind} {name} to be gone"), POD_DELETE_TIMEOUT).await?;
            Ok(())
        });
    }

    /// Waits until the scheduler reports the pod unschedulable (`PodScheduled=False`, reason
    /// `Unschedulable`); fails at once if it gets a node. Returns the scheduler's message.
    pub async fn wait_unschedulable(&self, pod: &Pod) -> anyhow::Result<String> {
        let name = pod.name_any();
        let what = format!("pod {name} to be unschedulable");
        let pending = wait::existing(&self.pods(), &name, what, POD_START_TIMEOUT, |p| {
            if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                return Verdict::Fail(format!("pod {name} got scheduled"));
            }
            Verdict::done_if(
                harness::builder::condition(p, "PodScheduled")
                    .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable")),
            )
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}{}", self.call_log()))?;
        let condition = harness::builder::condition(&pending, "PodScheduled");
        Ok(condition.and_then(|c| c.message.clone()).unwrap_or_default())
    }

    /// Waits until the pod runs; fails at once if it terminates.
    pub async fn wait_running(&self, pod: &Pod) -> anyhow::Result<Pod> {
        let name = pod.name_any();
        let what = format!("pod {name} to run on node {}", self.node);
        let running = wait::existing(&self.pods(), &name, what, POD_START_TIMEOUT, |p| match phase(p) {
            "Running" => Verdict::Done,
            "Succeeded" | "Failed" => Verdict::Fail(format!("the pod terminated with phase {}", phase(p))),
            _ => Verdict::Pending,
        })
        .await;
        running.map_err(|e| anyhow::anyhow!("{e}{}", self.call_log()))
    }

    /// Deletes the pod (`grace`: its grace period, `Some(0)` force-deletes) and waits until it
    /// is gone.
    pub async fn delete_pod(&self, pod: &Pod, grace: Option<u32>) -> anyhow::Result<()> {
        let name = pod.name_any();
        let params = DeleteParams { grace_period_seconds: grace, ..DeleteParams::default() };
        delete(&self.pods(), &name, params).await?;
        let gone =
            wait::gone(&self.pods(), &name, format!("pod {name} to be gone"), POD_DELETE_TIMEOUT).await;
        gone.map_err(|e| match grace {
            Some(0) => anyhow::anyhow!("{e}"),
            _ => anyhow::anyhow!(
                "{e}: the kubelet removes a gracefully deleted pod only once its containers stopped and \
                 NodeUnprepareResources of driver {} succeeded for the claims it was the last to use{}",
                self.target.driver,
                self.call_log()
            ),
        })
    }

    /// The pod now.
    pub async fn pod(&self, name: &str) -> anyhow::Result<Pod> {
        Ok(self.pods().get(name).await?)
    }

    /// The claim now.
    pub async fn claim(&self, name: &str) -> anyhow::Result<ResourceClaim> {
        Ok(self.claims().get(name).await?)
    }

    /// Waits until the claim is reserved for no pod any more.
    pub async fn wait_unreserved(&self, name: &str) -> anyhow::Result<ResourceClaim> {
        let what = format!("claim {name} to be reserved for no pod");
        Ok(wait::existing(&self.claims(), name, what, POD_DELETE_TIMEOUT, |c| {
            Verdict::done_if(reserved_for(c).is_empty())
        })
        .await?)
    }

    /// The `env` output of `container` of the pod.
    pub async fn container_env(&self, pod: &Pod, container: &str) -> anyhow::Result<String> {
        let out = exec(self.ctx.client(), self.ctx.namespace(), &pod.name_any(), container, &["env"]).await?;
        anyhow::ensure!(
            out.success,
            "env in container {container} of pod {} failed: {} {}",
            pod.name_any(),
            out.message,
            out.stderr
        );
        Ok(out.stdout)
    }

    /// The devices of the driver's ResourceSlices for the node under test, as `(pool, device)`.
    pub async fn node_devices(&self) -> anyhow::Result<Vec<(String, String)>> {
        node_devices(&self.ctx, &self.target.driver, &self.node).await
    }
}

/// A busybox container `name` that uses pod claim `claim`.
fn container(name: &str, claim: &str) -> serde_json::Value {
    json!({
        "name": name,
        "image": BUSYBOX_IMAGE,
        "command": ["/bin/sh", "-c", INFINITE_SLEEP],
        "resources": { "claims": [{ "name": claim }] },
    })
}

/// The devices of `driver`'s ResourceSlices for `node`, as `(pool, device)`.
pub async fn node_devices(
    from: &impl ClusterAccess,
    driver: &str,
    node: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let slices = driver_slices(from, driver).await?;
    Ok(slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| (s.spec.pool.name.clone(), d.name.clone())))
        .collect())
}

/// Deletes an object; one that is gone already is fine.
async fn delete<K>(api: &Api<K>, name: &str, params: DeleteParams) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(anyhow::anyhow!("delete {name}: {e}")),
    }
}

/// The names of the consumers a claim is reserved for.
pub fn reserved_for(claim: &ResourceClaim) -> Vec<String> {
    let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.as_ref());
    reserved.into_iter().flatten().map(|r| r.name.clone()).collect()
}

/// The allocated devices of a claim as `(driver, pool, device)`.
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<(String, String, String)> {
    if !is_allocated(claim) {
        return Vec::new();
    }
    harness::builder::allocation_results(claim)
        .iter()
        .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
        .collect()
}

/// The devices a claim got, as `pool/name`.
pub fn allocated_ids(claim: &ResourceClaim) -> std::collections::BTreeSet<String> {
    allocated_devices(claim).into_iter().map(|(_, pool, device)| format!("{pool}/{device}")).collect()
}

/// How long a spec watches that something does not happen (upstream's `Consistently` of 20 s).
pub const CONSISTENTLY: Duration = Duration::from_secs(20);
