//! The proxy pods a run's drivers share: one per node, in a namespace of the run's own, created
//! by the first driver that needs a node and removed when the run ends.
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
//! The pods run in the namespace `dra-e2e-proxies-<random>`; like everything the run creates
//! they carry the run's label, so a run that is killed before its end leaves them to the next
//! run's sweep. Drivers that act on their pods, or need pods of another kind, deploy their own
//! ReplicaSet (see [`DriverConfig::shares_proxy_pods`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Namespace, Pod},
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
    deploy::{PROXY_START_TIMEOUT, is_running_and_ready, random_uid},
    error::{DriverError, api_error},
    proxy,
};
use crate::{
    framework::Ctx,
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

/// The run's shared proxy pods (a [`Ctx::run_shared`](crate::framework::Ctx::run_shared) value).
#[derive(Default)]
pub(crate) struct SharedProxies {
    namespace: OnceCell<String>,
    pods: Mutex<HashMap<String, Arc<OnceCell<Pod>>>>,
    next_pair: AtomicU32,
}

impl SharedProxies {
    /// The shared pod of each node (empty until it runs).
    fn cells(&self) -> MutexGuard<'_, HashMap<String, Arc<OnceCell<Pod>>>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pair of pod ports no other running driver of the run uses.
    pub(crate) fn ports(&self) -> ProxyPorts {
        let pair = self.next_pair.fetch_add(1, Ordering::Relaxed) % PORT_PAIRS;
        let first = FIRST_PORT + u16::try_from(2 * pair).unwrap_or_default();
        ProxyPorts { dra: first, registration: first + 1 }
    }

    /// The running shared pod of each of `nodes`, started where there is none yet.
    pub(crate) async fn pods(
        &self,
        ctx: &Ctx,
        nodes: &[String],
        config: &DriverConfig,
    ) -> Result<BTreeMap<String, Pod>, DriverError> {
        let namespace = self.namespace(ctx).await?;
        let pods = futures::future::try_join_all(nodes.iter().map(|node| async {
            let cell = self.cells().entry(node.clone()).or_default().clone();
            let pod = cell.get_or_try_init(|| start_pod(ctx, namespace, node, config)).await?;
            Ok::<_, DriverError>((node.clone(), pod.clone()))
        }))
        .await?;
        Ok(pods.into_iter().collect())
    }

    /// Forgets the shared pod of `node` if it is the one with `uid` (it was lost), so that the
    /// next driver on the node starts another.
    pub(crate) fn forget(&self, node: &str, uid: Option<&str>) {
        let mut pods = self.cells();
        let lost =
            pods.get(node).and_then(|cell| cell.get()).is_some_and(|pod| pod.metadata.uid.as_deref() == uid);
        if lost {
            pods.remove(node);
        }
    }

    /// The shared pods' namespace, created on first use together with its removal at the run's
    /// end.
    async fn namespace(&self, ctx: &Ctx) -> Result<&String, DriverError> {
        self.namespace
            .get_or_try_init(|| async {
                let name = format!("dra-e2e-proxies-{}", &random_uid()[..8]);
                let api: Api<Namespace> = Api::all(ctx.client().clone());
                let ns = Namespace {
                    metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
                    ..Namespace::default()
                };
                api.create(&PostParams::default(), &ns)
                    .await
                    .map_err(api_error(format!("create namespace {name} for the shared proxy pods")))?;
                tracing::info!(namespace = %name, "created the namespace of the shared proxy pods");
                let remove = name.clone();
                let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), &name);
                ctx.defer_to_run_end(
                    format!("delete namespace {name} of the shared proxy pods"),
                    REMOVE_TIMEOUT,
                    async move { remove_namespace(&api, pods, &remove).await },
                );
                Ok(name)
            })
            .await
    }
}

/// Removes the shared pods' namespace: its pods first (they end at once on SIGTERM), so that
/// the namespace controller finds it empty and removes it in one pass instead of coming back
/// for pods that are still terminating.
async fn remove_namespace(api: &Api<Namespace>, pods: Api<Pod>, name: &str) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    pods.delete_collection(&DeleteParams::background(), &ListParams::default()).await?;
    let what = format!("the shared proxy pods in namespace {name} to be gone");
    wait::objects(&pods, watcher::Config::default(), what, REMOVE_TIMEOUT / 2, |left| {
        Verdict::done_if(left.is_empty())
    })
    .await?;
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let what = format!("namespace {name} of the shared proxy pods to be gone");
    wait::gone(api, name, what, REMOVE_TIMEOUT / 2).await?;
    tracing::info!(namespace = %name, took = ?started.elapsed(), "removed the shared proxy pods");
    Ok(())
}

/// Creates the shared pod of `node` and waits until it runs and is ready.
async fn start_pod(
    ctx: &Ctx,
    namespace: &str,
    node: &str,
    config: &DriverConfig,
) -> Result<Pod, DriverError> {
    let pod = proxy::shared_pod(node, &config.image, &config.kubelet_root_dir)?;
    let api: Api<Pod> = Api::namespaced(ctx.client().clone(), namespace);
    let created = api
        .create(&PostParams::default(), &pod)
        .await
        .map_err(api_error(format!("create the shared proxy pod of node {node}")))?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let timeout = PROXY_START_TIMEOUT.min(ctx.remaining());
    let running = wait::existing(
        &api,
        &name,
        format!("shared proxy pod {namespace}/{name} on node {node} to run"),
        timeout,
        |p| match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some(phase @ ("Failed" | "Succeeded")) => Verdict::Fail(format!("it ended ({phase})")),
            _ => Verdict::done_if(is_running_and_ready(p)),
        },
    )
    .await?;
    tracing::info!(pod = %format!("{namespace}/{name}"), %node, "the shared proxy pod runs");
    Ok(running)
}

#[cfg(test)]
mod tests {
    use super::*;

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
