//! The proxy pods a run's drivers share: one per node, each the pod of a ReplicaSet of its own
//! (one replica, pinned to the node) in a namespace of the run's own, created by the first
//! driver that needs the node and removed when the run ends.
//!
//! A proxy pod holds nothing of a driver but the processes the driver execs into it (one
//! `hostpathplugin --proxy-endpoint` per socket, found and stopped by its socket path) and the
//! ports those listen on. So a pod can serve every driver on its node at once, each with a pair of
//! ports of its own ([`SharedProxies::ports`]), and a driver that uses one no longer waits for a
//! pod of its own to be scheduled and started (about a second per spec, 0.6 s when the cluster
//! is quiet), nor does a serial spec wait for the previous spec's pods to be gone. What a
//! spec checks stays per driver: its ServiceAccount, RBAC and admission policy, and the identity
//! its plugin acts as (the driver's ServiceAccount, bound to this pod and its node).
//!
//! A shared pod that goes away (deleted, evicted) is replaced by its ReplicaSet, and every
//! driver whose plugin ran in it moves to the replacement as a driver with a ReplicaSet of its
//! own does (see `failover.rs`): losing the pod costs the specs on the node a move, not their
//! run. One ReplicaSet per node rather than one DaemonSet for the run, because:
//! - a ReplicaSet replaces a pod as soon as it is being deleted (it counts only active pods),
//!   while the DaemonSet controller starts a node's new pod only once the old one is gone
//!   (v1.37.2 `podsShouldBeOnNode`: a terminating pod still "exists" on its node), which would
//!   put the old pod's termination into every move;
//! - a node gets a pod only when a driver needs it, as before: a DaemonSet runs on every node
//!   it may, and narrowing it to the nodes in use means changing its pod template, which
//!   replaces the pods of every other node;
//! - the replacement is found exactly as for a driver's own ReplicaSet (its pods' labels, on
//!   the node), so both kinds of proxy pod move the same way.
//!
//! The pods run in the namespace `dra-e2e-proxies-<random>`; like everything the run creates
//! the namespace and the ReplicaSets carry the run's label, and so do the pods (copied from the
//! namespace into the pod template), so a run that is killed before its end leaves them to the
//! next run's sweep. Drivers that act on their pods, or need pods of another kind, deploy their
//! own ReplicaSet (see [`DriverConfig::shares_proxy_pods`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::{
        apps::v1::ReplicaSet,
        core::v1::{Namespace, Pod},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use tokio::sync::OnceCell;

use super::{
    config::DriverConfig,
    deploy::{PROXY_START_TIMEOUT, ProxyPods, random_uid},
    error::{DriverError, api_error},
    proxy,
};
use crate::{
    framework::{Ctx, RUN_LABEL},
    manifests::INSTANCE_LABEL,
    proxied::ProxyPorts,
    wait::{self, Verdict},
};

/// The first pod port handed out; each driver gets the next two.
const FIRST_PORT: u16 = 10_000;
/// How many port pairs there are before the numbering starts again (ports 10000-49999): far
/// more than drivers run at the same time.
const PORT_PAIRS: u32 = 20_000;
/// How long removing the namespace (its pods stop on SIGTERM at once) may take at the run's end.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(120);

/// The namespace of the shared pods.
struct SharedNamespace {
    name: String,
    /// The run's label on it (copied to the pods).
    run_label: Option<String>,
}

/// The run's shared proxy pods (a [`Ctx::run_shared`](crate::framework::Ctx::run_shared) value).
#[derive(Default)]
pub(crate) struct SharedProxies {
    namespace: OnceCell<SharedNamespace>,
    /// Per node: its ReplicaSet was created.
    sets: Mutex<HashMap<String, Arc<OnceCell<()>>>>,
    next_pair: AtomicU32,
}

impl SharedProxies {
    fn sets(&self) -> MutexGuard<'_, HashMap<String, Arc<OnceCell<()>>>> {
        self.sets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pair of pod ports no other running driver of the run uses.
    pub(crate) fn ports(&self) -> ProxyPorts {
        let pair = self.next_pair.fetch_add(1, Ordering::Relaxed) % PORT_PAIRS;
        let first = FIRST_PORT + u16::try_from(2 * pair).unwrap_or_default();
        ProxyPorts { dra: first, registration: first + 1 }
    }

    /// The running shared pod of each of `nodes`: the ReplicaSet of a node is created where
    /// there is none yet, and a node whose pod is being replaced waits for the replacement. A
    /// node whose pod runs costs one list of its pods.
    pub(crate) async fn pods(
        &self,
        ctx: &Ctx,
        nodes: &[String],
        config: &DriverConfig,
    ) -> Result<BTreeMap<String, Pod>, DriverError> {
        let namespace = self.namespace(ctx).await?;
        let pods = futures::future::try_join_all(nodes.iter().map(|node| async move {
            let cell = self.sets().entry(node.clone()).or_default().clone();
            cell.get_or_try_init(|| create_replicaset(ctx, namespace, node, config)).await?;
            let what = format!("the shared proxy pod of node {node} in namespace {} to run", namespace.name);
            let timeout = PROXY_START_TIMEOUT.min(ctx.remaining());
            let pod =
                pods_on(ctx.client(), &namespace.name, node).ready_on(node, None, what, timeout).await?;
            Ok::<_, DriverError>((node.clone(), pod))
        }))
        .await?;
        Ok(pods.into_iter().collect())
    }

    /// Where the shared pods of `node` come from (`None` before the first driver asked for one).
    pub(crate) fn pods_of(&self, client: &kube::Client, node: &str) -> Option<ProxyPods> {
        self.namespace.get().map(|ns| pods_on(client, &ns.name, node))
    }

    /// The shared pods' namespace, created on first use together with its removal at the run's
    /// end.
    async fn namespace(&self, ctx: &Ctx) -> Result<&SharedNamespace, DriverError> {
        self.namespace
            .get_or_try_init(|| async {
                let name = format!("dra-e2e-proxies-{}", &random_uid()[..8]);
                let api: Api<Namespace> = Api::all(ctx.client().clone());
                let ns = Namespace {
                    metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
                    ..Namespace::default()
                };
                let created = api
                    .create(&PostParams::default(), &ns)
                    .await
                    .map_err(api_error(format!("create namespace {name} for the shared proxy pods")))?;
                tracing::info!(namespace = %name, "created the namespace of the shared proxy pods");
                let run_label = created.metadata.labels.and_then(|mut l| l.remove(RUN_LABEL));
                let client = ctx.client().clone();
                let remove = name.clone();
                ctx.defer_to_run_end(
                    format!("delete namespace {name} of the shared proxy pods"),
                    REMOVE_TIMEOUT,
                    async move { remove_namespace(&client, &remove).await },
                );
                Ok(SharedNamespace { name, run_label })
            })
            .await
    }
}

/// The shared pods of `node` in `namespace`.
fn pods_on(client: &kube::Client, namespace: &str, node: &str) -> ProxyPods {
    ProxyPods { api: Api::namespaced(client.clone(), namespace), selector: selector(node) }
}

/// The label selector of the shared pods of `node`.
fn selector(node: &str) -> String {
    format!(
        "{INSTANCE_LABEL}={},{}={}",
        proxy::SHARED_INSTANCE,
        proxy::SHARED_NODE_LABEL,
        proxy::shared_node_label(node)
    )
}

/// Creates the ReplicaSet of the shared pod of `node`.
async fn create_replicaset(
    ctx: &Ctx,
    namespace: &SharedNamespace,
    node: &str,
    config: &DriverConfig,
) -> Result<(), DriverError> {
    let run_label = namespace.run_label.as_deref().map(|value| (RUN_LABEL, value));
    let rs = proxy::shared_replicaset(node, &config.image, &config.kubelet_root_dir, run_label)?;
    let name = rs.metadata.name.clone().unwrap_or_default();
    match Api::<ReplicaSet>::namespaced(ctx.client().clone(), &namespace.name)
        .create(&PostParams::default(), &rs)
        .await
    {
        Ok(_) => {}
        // An earlier attempt created it, and its answer was lost.
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => {
            return Err(api_error(format!(
                "create ReplicaSet {name} of the shared proxy pod of node {node}"
            ))(e));
        }
    }
    tracing::info!(namespace = %namespace.name, replicaset = %name, %node, "created the shared proxy pod's ReplicaSet");
    Ok(())
}

/// Removes the shared pods' namespace: the ReplicaSets first (foreground: they replace no pod
/// from then on), their pods at once (they end at once on SIGTERM), so that the namespace
/// controller finds the namespace empty and removes it in one pass instead of coming back for
/// pods that are still terminating.
async fn remove_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    sets.delete_collection(&DeleteParams::foreground(), &ListParams::default()).await?;
    pods.delete_collection(&DeleteParams::background(), &ListParams::default()).await?;
    let what = format!("the shared proxy pods in namespace {name} to be gone");
    wait::objects(&pods, watcher::Config::default(), what, REMOVE_TIMEOUT / 2, |left| {
        Verdict::done_if(left.is_empty())
    })
    .await?;
    let api: Api<Namespace> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let what = format!("namespace {name} of the shared proxy pods to be gone");
    wait::gone(&api, name, what, REMOVE_TIMEOUT / 2).await?;
    tracing::info!(namespace = %name, took = ?started.elapsed(), "removed the shared proxy pods");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_looked_for_are_the_ones_of_the_nodes_replicaset() {
        for node in ["kind-worker".to_owned(), format!("{}.example.com", "n".repeat(60))] {
            let rs = proxy::shared_replicaset(&node, "img:1", "/var/lib/kubelet", None).unwrap();
            let selects: Vec<String> =
                rs.spec.selector.match_labels.unwrap().iter().map(|(k, v)| format!("{k}={v}")).collect();
            let looked_for = selector(&node);
            assert!(
                looked_for.split(',').all(|l| selects.iter().any(|s| s == l)),
                "{looked_for} {selects:?}"
            );
            let node_label = format!("{}={}", proxy::SHARED_NODE_LABEL, proxy::shared_node_label(&node));
            assert!(looked_for.split(',').any(|l| l == node_label), "{looked_for}");
        }
        assert_ne!(selector("a"), selector("b"));
    }

    #[test]
    fn each_driver_gets_two_ports_of_its_own() {
        let shared = SharedProxies::default();
        let first = shared.ports();
        let second = shared.ports();
        assert_eq!(first, ProxyPorts { dra: 10_000, registration: 10_001 });
        assert_eq!(second, ProxyPorts { dra: 10_002, registration: 10_003 });
        shared.next_pair.store(PORT_PAIRS - 1, Ordering::Relaxed);
        assert_eq!(shared.ports(), ProxyPorts { dra: 49_998, registration: 49_999 });
        assert_eq!(shared.ports(), first, "the numbering starts again");
    }
}
