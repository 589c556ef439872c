//! The test DRA driver of a spec (upstream's `utils.Driver`): node selection, ResourceSlices,
//! RBAC and the node-scoping admission policy, the proxy pods and the per-node in-process
//! plugins, and the teardown of all of it.
//!
//! Two modes:
//! - **with kubelet** ([`DriverConfig::kubelet`]): RBAC and policy from
//!   `manifests/plugin-permissions.yaml`, one [`ProxiedPlugin`] per node acting as the driver's
//!   ServiceAccount bound to its proxy pod, registration with each node's kubelet awaited. The
//!   proxy pods are the run's shared ones (one per node, see [`DriverConfig::shares_proxy_pods`]),
//!   or a ReplicaSet of the driver's own pinned to the chosen nodes, as upstream deploys;
//! - **without kubelet** ([`DriverConfig::control_plane`]): only ResourceSlices (and RBAC and
//!   policy if asked for with [`DriverConfig::rbac`]); no pods, no plugins. For specs that
//!   need only the API server, scheduler and controllers.
//!
//! ```no_run
//! # async fn body(ctx: harness::framework::Ctx) -> harness::framework::SpecResult {
//! use harness::driver::{Driver, DriverConfig, Nodes, resources};
//! let nodes = Nodes::select(&ctx, 1, 1).await?;
//! let driver = Driver::start(&ctx, &nodes, DriverConfig::control_plane(resources::node_local(1))).await?;
//! let slices = driver.slices().await?;
//! assert_eq!(slices.len(), 1);
//! # Ok(()) }
//! ```
//!
//! A proxy pod that goes away while the spec runs (deleted, evicted) is replaced by its
//! ReplicaSet (the driver's own, or the run's shared one of the node), and the node's plugin
//! moves to the replacement — with a shared pod, the plugin of every driver that used it: see
//! [`Driver::proxy_moves`] and [`PROXY_REPLACEMENT_TIMEOUT`] (without a ready replacement in time
//! the spec fails at once, and its clean-up still ends: see `failover.rs`).
//!
//! The proxy pods of a driver's own ReplicaSet are ones the driver waits for on every start
//! (about a second) and a later serial spec waits to be gone; the shared ones start once per
//! node and run: see `shared_proxy.rs`.
//!
//! Teardown is registered on the [`Ctx`] while setting up, so it runs in reverse order also
//! after a failed set-up: stop the plugins, scale the proxy pods to zero, delete RBAC and policy,
//! delete the driver's slices when no kubelet will, then wait until every slice of the driver is
//! gone.

mod artifacts;
mod config;
mod deploy;
mod error;
mod failover;
mod forward;
mod identity;
pub mod impersonate;
mod nodes;
pub mod proxy;
mod registration;
mod republish;
pub mod resources;
mod setup;
mod shared_claims;
mod shared_proxy;
mod teardown;

use std::{
    collections::BTreeMap,
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::ReplicaSet,
    core::v1::{Node, Pod, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

pub use config::{
    DEFAULT_KUBELET_ROOT_DIR, DEFAULT_PROXY_IMAGE, DriverConfig, PROXY_REPLACEMENT_TIMEOUT,
    REGISTRATION_TIMEOUT, deployment_id, driver_name, service_account_name,
};
pub use deploy::{PROXY_START_TIMEOUT, generated_name_base};
pub use error::DriverError;
pub use failover::ProxyMove;
pub use forward::{ForwardError, ForwardResolver};
pub use impersonate::{Impersonation, ImpersonationError};
pub use nodes::{NodeNeeds, Nodes, TooFewNodes, declared_features, undeclared_reason, unusable_reason};
pub use registration::registered_since;
pub use resources::{DriverResources, MULTI_HOST, Pool, Resources, ResourcesFn, Slice};

use self::{
    artifacts::DriverArtifacts, deploy::*, error::api_error, identity::PluginIdentity,
    registration::is_registered, shared_proxy::SharedProxies,
};

use crate::{
    calls::{Calls, FaultGuard, Method},
    framework::Ctx,
    manifests::{self, INSTANCE_LABEL},
    plugin::{ClaimId, HealthState, KubeClaims, MetadataConfig, PluginConfig},
    proxied::{ProxiedError, ProxiedPlugin, ProxiedPluginSpec, ProxyPorts},
    wait::{self, Attempt, Verdict, WaitError},
};

/// How long the driver's slices may take to disappear after teardown (upstream's `IsGone`:
/// 2 min; the kubelet removes a node's slices 30 s after the plugin is gone).
pub const SLICE_REMOVAL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long RBAC and the admission policy may take to become effective.
pub const PERMISSIONS_TIMEOUT: Duration = Duration::from_secs(30);
/// The per-claim error of [`Driver::fail_claim`]; the kubelet quotes it in its errors and events.
pub const INJECTED_CLAIM_ERROR: &str = "injected per-claim error";

/// Per-node state of a driver.
struct NodeState {
    calls: Calls,
    health: HealthState,
    /// The plugin's identity: the ServiceAccount bound to the proxy pod on this node (with
    /// RBAC); after a move, bound to the replacement.
    identity: Option<PluginIdentity>,
    /// The proxy pod (with kubelet): the current one, after a move its replacement.
    pod: Mutex<Option<Pod>>,
    /// The running plugin (with kubelet): taken while it moves to a replacement proxy pod and at
    /// teardown.
    plugin: Mutex<Option<ProxiedPlugin>>,
    /// The node's prepared claims (with kubelet): taken when its plugin first starts, kept while
    /// the plugin moves from a lost proxy pod to its replacement (the claims stay prepared on the
    /// node; only the way to it changes), given back when the plugin stops for good.
    claims: Mutex<Option<shared_claims::Lease>>,
    /// The plugin's configuration without the pod's rolling-update UID, for a restart in a
    /// replacement pod.
    plugin_config: Mutex<Option<PluginConfig>>,
    /// Moves the plugin to a replacement pod when its proxy pod goes away; stopped at teardown.
    supervisor: Mutex<Option<tokio_util::task::AbortOnDropHandle<()>>>,
    /// The moves so far.
    moves: Mutex<Vec<ProxyMove>>,
    /// Whether the plugin is moving to a replacement proxy pod now.
    moving: AtomicBool,
    /// Why the plugin stopped for good without being told to: its proxy pod was lost and no
    /// replacement ran in time (the spec's failure).
    lost: Mutex<Option<String>>,
}

struct Inner {
    name: String,
    namespace: String,
    config: DriverConfig,
    nodes: Nodes,
    admin: kube::Client,
    /// The admin client for tunnels and exec into the proxy pods (`TCP_NODELAY`).
    stream: kube::Client,
    deployment_id: String,
    service_account: Option<String>,
    per_node: BTreeMap<String, NodeState>,
    /// The run's shared proxy pods, when the plugins run in them (see
    /// [`DriverConfig::shares_proxy_pods`]).
    shared: Option<Arc<SharedProxies>>,
    /// The pod ports of each node's two proxy processes.
    ports: ProxyPorts,
}

/// A running test driver. Cheap to clone; clones are the same driver.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.inner.name)
            .field("nodes", &self.inner.nodes.names())
            .field("with_kubelet", &self.inner.config.with_kubelet)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Sets up the driver on `nodes` (see the module documentation) and registers its teardown
    /// on `ctx`. Its ResourceSlices and the recorded gRPC calls go into a failed spec's artifacts.
    pub async fn start(ctx: &Ctx, nodes: &Nodes, config: DriverConfig) -> Result<Driver, DriverError> {
        let name = config.name.clone().unwrap_or_else(|| driver_name(ctx.namespace(), &config.name_suffix));
        let namespace = ctx.namespace().to_owned();
        let admin = ctx.client().clone();
        let with_rbac = config.with_rbac || config.with_kubelet;
        let id = deployment_id(&name, &config.instance_suffix);
        tracing::info!(driver = %name, nodes = ?nodes.names(), with_kubelet = config.with_kubelet, with_rbac, "deploying driver");

        let calls: BTreeMap<String, Calls> = nodes
            .names()
            .iter()
            .map(|n| {
                let scope = format!("the kubelet of node {n} (driver {name}{})", config.instance_suffix);
                (n.clone(), Calls::named(scope))
            })
            .collect();
        ctx.artifact_source(Box::new(DriverArtifacts {
            name: format!("driver-{name}{}", config.instance_suffix),
            driver: name.clone(),
            client: admin.clone(),
            calls: calls.iter().map(|(n, c)| (n.clone(), c.clone())).collect(),
        }));
        {
            // Faults a spec left injected would fail the kubelet's calls during the teardown.
            let calls: Vec<Calls> = calls.values().cloned().collect();
            ctx.defer_first(format!("clear the faults injected into driver {name}"), async move {
                calls.iter().for_each(Calls::clear_all);
                Ok(())
            });
        }

        let slices_api: Api<ResourceSlice> = Api::all(admin.clone());
        // A pure wait after the teardown (the kubelets wipe the slices of a driver whose plugins
        // went away, after their own 30 s grace), on slices of this spec's own driver name: an
        // observation, run after the spec's worker slot is released, that no serial spec waits
        // for (the slices name only this driver, whose classes and claims are gone).
        if config.expect_slice_removal {
            let api = slices_api.clone();
            let driver = name.clone();
            ctx.defer_observation(
                format!("the ResourceSlices of driver {name} to be gone"),
                SLICE_REMOVAL_TIMEOUT + Duration::from_secs(30),
                async move {
                    wait_slices_gone(&api, &driver, SLICE_REMOVAL_TIMEOUT).await?;
                    Ok(())
                },
            );
        }

        let resources = config.resources.generate(nodes);
        let multi_host = resources.get(MULTI_HOST);
        if multi_host.is_some() || !config.with_kubelet || config.reconcile_pool.is_some() {
            // No kubelet removes these (network-attached pools, no registered plugin, or
            // cluster-wide pools published with the admin client).
            let api = slices_api.clone();
            let driver = name.clone();
            ctx.defer(format!("delete the ResourceSlices of driver {name}"), async move {
                api.delete_collection(
                    &DeleteParams::default(),
                    &ListParams::default().fields(&format!("spec.driver={driver}")),
                )
                .await?;
                Ok(())
            });
        }
        if let Some(multi_host) = multi_host {
            for slice in resources::multi_host_slices(&name, multi_host) {
                let slice_name = slice.metadata.name.clone().unwrap_or_default();
                slices_api
                    .create(&PostParams::default(), &slice)
                    .await
                    .map_err(api_error(format!("create network-attached ResourceSlice {slice_name}")))?;
            }
        }

        let service_account = if with_rbac {
            let perms = manifests::plugin_permissions(&namespace, &name, &id)?;
            let sa = perms.service_account.metadata.name.clone().unwrap_or_default();
            create_with_cleanup(
                ctx,
                Api::<ServiceAccount>::namespaced(admin.clone(), &namespace),
                &perms.service_account,
            )
            .await?;
            create_with_cleanup(ctx, Api::<ClusterRole>::all(admin.clone()), &perms.cluster_role).await?;
            create_with_cleanup(
                ctx,
                Api::<ClusterRoleBinding>::all(admin.clone()),
                &perms.cluster_role_binding,
            )
            .await?;
            create_with_cleanup(ctx, Api::<ValidatingAdmissionPolicy>::all(admin.clone()), &perms.policy)
                .await?;
            create_with_cleanup(
                ctx,
                Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()),
                &perms.policy_binding,
            )
            .await?;
            Some(sa)
        } else {
            None
        };

        let rs_name = format!("dra-test-driver{}{}", config.name_suffix, config.instance_suffix);
        let shared = config.shares_proxy_pods().then(|| ctx.run_shared::<SharedProxies>());
        let ports = shared.as_ref().map(|s| s.ports()).unwrap_or_default();
        // RBAC and the admission policy take effect while the proxy pods start and the kubelets
        // register the plugins: only publishing needs them.
        let probe = match (&service_account, nodes.names().first()) {
            (Some(sa), Some(node)) => {
                let probe_pod = format!("{rs_name}-permission-probe");
                let identity = Impersonation::kubelet_plugin(&namespace, sa, node, &probe_pod, &random_uid())
                    .client(&admin)?;
                Some((identity, name.clone(), node.clone()))
            }
            _ => None,
        };
        let permissions = async move {
            let Some((identity, driver, node)) = probe else { return Ok(()) };
            Driver::wait_permissions_effective(identity, &driver, &node).await
        };
        let deploy = async {
            let pods = match &shared {
                _ if !config.with_kubelet => BTreeMap::new(),
                Some(shared) => shared.pods(ctx, nodes.names(), &config).await?,
                None => {
                    let sa = service_account.clone().unwrap_or_default();
                    deploy_proxy(ctx, &admin, &namespace, &name, &rs_name, nodes, &config, &sa).await?
                }
            };
            let per_node = node_states(&NodeIdentity {
                admin: &admin,
                namespace: &namespace,
                service_account: service_account.as_deref(),
                rs_name: &rs_name,
                nodes: nodes.names(),
                pods: &pods,
                calls: &calls,
            })?;
            let driver = Driver {
                inner: Arc::new(Inner {
                    name,
                    namespace,
                    config,
                    nodes: nodes.clone(),
                    admin,
                    stream: ctx.stream_client().clone(),
                    deployment_id: id,
                    service_account,
                    per_node,
                    shared,
                    ports,
                }),
            };
            if driver.inner.config.with_kubelet {
                driver.start_plugins(ctx).await?;
                // Devices only once every kubelet knows the plugin. A pod waiting for devices is
                // scheduled about a second after they appear; a kubelet that gets it before the
                // plugin registered refuses it ("DRA driver … is not registered") and tries
                // again only at the pod's next resync, 60-90 s later (its sync ends without an
                // error). Upstream's plugin serves its registration socket before it publishes,
                // so it registers first.
                driver.wait_registered().await?;
            }
            Ok::<_, DriverError>(driver)
        };
        let ((), driver) = futures::try_join!(permissions, deploy)?;
        driver.publish_node_local(&resources).await?;
        if driver.inner.config.with_kubelet {
            driver.republish_on_registration(ctx, &resources);
        }
        driver.start_pool_controllers(ctx, &resources);
        tracing::info!(driver = %driver.inner.name, "driver is ready");
        // The spec's set-up phase ends here (with its last driver, when it starts several).
        ctx.setup_done();
        Ok(driver)
    }

    /// The driver name (`<namespace><suffix>.k8s.io`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The namespace of the driver's pods and ServiceAccount (the spec's namespace).
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The nodes the driver runs on.
    pub fn nodes(&self) -> &Nodes {
        &self.inner.nodes
    }

    /// The node names, sorted (upstream's `Nodenames`).
    pub fn node_names(&self) -> &[String] {
        self.inner.nodes.names()
    }

    /// Whether plugins run and are registered with the kubelets.
    pub fn with_kubelet(&self) -> bool {
        self.inner.config.with_kubelet
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &DriverConfig {
        &self.inner.config
    }

    /// Identifier in the RBAC object names (see [`deployment_id`]).
    pub fn deployment_id(&self) -> &str {
        &self.inner.deployment_id
    }

    /// The plugin's ServiceAccount, when RBAC was set up.
    pub fn service_account(&self) -> Option<&str> {
        self.inner.service_account.as_deref()
    }

    fn state(&self, node: &str) -> Result<&NodeState, DriverError> {
        self.inner.per_node.get(node).ok_or_else(|| DriverError::UnknownNode {
            driver: self.inner.name.clone(),
            node: node.to_owned(),
            nodes: self.inner.nodes.names().to_vec(),
        })
    }

    /// The call log and fault injection of a node's plugin (empty without kubelet).
    ///
    /// # Panics
    ///
    /// If the driver does not run on `node` (a mistake in the spec).
    pub fn calls(&self, node: &str) -> &Calls {
        match self.state(node) {
            Ok(state) => &state.calls,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`Driver::calls`] without panicking.
    pub fn try_calls(&self, node: &str) -> Result<&Calls, DriverError> {
        self.state(node).map(|s| &s.calls)
    }

    /// Fails every call of `method` on `node` with `Unknown: injected error` (upstream's
    /// `Fail(method, true)`) until the guard is cleared or dropped. Other faults:
    /// `driver.calls(node).fail_next(..)`, `.delay(..)`, `.block(..)`.
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail(&self, node: &str, method: impl Into<crate::calls::CallFilter>) -> FaultGuard {
        self.calls(node).fail(method, tonic::Status::unknown("injected error"))
    }

    /// Fails the claims `filter` matches (usually one: `Method::NodePrepareResources
    /// .for_claim_uid(uid)`) in every prepare or unprepare call on `node`, with the per-claim
    /// error [`INJECTED_CLAIM_ERROR`] in an answer that otherwise succeeds, until the guard is
    /// cleared or dropped. The next `n` only: `driver.calls(node).fail_claim_next(..)`.
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_claim(&self, node: &str, filter: impl Into<crate::calls::CallFilter>) -> FaultGuard {
        self.calls(node).fail_claim(filter, INJECTED_CLAIM_ERROR)
    }

    /// The device health a node's plugin reports.
    ///
    /// # Panics
    ///
    /// If the driver does not run on `node`.
    pub fn health(&self, node: &str) -> &HealthState {
        match self.state(node) {
            Ok(state) => &state.health,
            Err(e) => panic!("{e}"),
        }
    }

    /// The client of a node's plugin: it impersonates the plugin's ServiceAccount with the
    /// extras of its pod and node (`None` without RBAC). The pod is the proxy pod the plugin
    /// runs in; after a move (see [`Driver::proxy_moves`]) the replacement, behind the same
    /// client.
    pub fn client(&self, node: &str) -> Option<&kube::Client> {
        self.inner.per_node.get(node).and_then(|s| s.identity.as_ref()).map(PluginIdentity::client)
    }

    /// The proxy pod on a node (with kubelet): after the plugin moved to a replacement pod
    /// (see [`Driver::proxy_moves`]), the replacement.
    pub fn proxy_pod(&self, node: &str) -> Option<Pod> {
        self.inner.per_node.get(node).and_then(|s| lock(&s.pod).clone())
    }

    /// A client acting as this driver's kubelet plugin in pod `pod_name` (`pod_uid`) on `node`,
    /// which need not exist (upstream's `ImpersonateKubeletPlugin`). Needs RBAC.
    pub fn impersonate_kubelet_plugin(
        &self,
        node: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<kube::Client, DriverError> {
        let sa = self
            .inner
            .service_account
            .clone()
            .unwrap_or_else(|| service_account_name(&self.inner.deployment_id));
        Ok(Impersonation::kubelet_plugin(&self.inner.namespace, &sa, node, pod_name, pod_uid)
            .client(&self.inner.admin)?)
    }

    /// Claims a node's plugin has prepared and not yet unprepared (empty without kubelet, and
    /// after the plugin stopped). While the plugin moves to a replacement proxy pod (see
    /// [`Driver::proxy_moves`]) they stay what they were. While another instance of the driver
    /// runs on the node, the two share their prepared claims (see
    /// [`DriverConfig::rolling_update`]).
    pub fn prepared_claims(&self, node: &str) -> Vec<ClaimId> {
        self.inner
            .per_node
            .get(node)
            .and_then(|s| lock(&s.claims).as_ref().map(|c| c.state().prepared_claims()))
            .unwrap_or_default()
    }

    /// Unprepares `claim` in a node's running plugin directly, without a gRPC call (upstream's
    /// `plugin.UnprepareClaim`): for a claim the kubelet was told not to unprepare
    /// (`skipNodeOperations`), so that the plugin does not hold it at teardown. Nothing goes into
    /// the node's call log. While the plugin moves to a replacement proxy pod this waits for the
    /// move (the claim's files are removed through the replacement). Fails without a plugin on
    /// the node.
    pub async fn unprepare_claim(&self, node: &str, claim: &ResourceClaim) -> anyhow::Result<()> {
        let state = self.state(node)?;
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        // The future owns what it needs: the lock is released before it runs.
        let unprepare = self
            .with_running_plugin(node, state, |p| p.plugin().unprepare_claim(&namespace, &name, &uid))
            .await?;
        unprepare.await.map_err(|e| {
            anyhow::anyhow!("unprepare claim {namespace}/{name} ({uid}) in the plugin on node {node}: {e}")
        })
    }

    /// The DRA and registration socket paths of a node's running plugin, as the kubelet sees
    /// them (`None` without kubelet and after the plugin stopped).
    pub fn socket_paths(&self, node: &str) -> Option<(String, String)> {
        let state = self.inner.per_node.get(node)?;
        let running = lock(&state.plugin);
        let (dra, registration) = running.as_ref()?.socket_paths();
        Some((dra.to_owned(), registration.to_owned()))
    }

    /// Whether a node's kubelet registered the plugin.
    pub fn is_registered(&self, node: &str) -> bool {
        self.inner.per_node.get(node).is_some_and(|s| is_registered(&s.calls.log()))
    }

    /// The driver's ResourceSlices as currently stored (upstream's `NewGetSlices`).
    pub async fn slices(&self) -> Result<Vec<ResourceSlice>, DriverError> {
        let api: Api<ResourceSlice> = Api::all(self.inner.admin.clone());
        let list = api
            .list(&ListParams::default().fields(&format!("spec.driver={}", self.inner.name)))
            .await
            .map_err(api_error(format!("list the ResourceSlices of driver {}", self.inner.name)))?;
        Ok(list.items)
    }

    /// Waits until the driver has no ResourceSlice left (upstream's `IsGone`).
    pub async fn wait_gone(&self, timeout: Duration) -> Result<(), WaitError> {
        wait_slices_gone(&Api::all(self.inner.admin.clone()), &self.inner.name, timeout).await
    }
}

/// What the per-node state of a driver is made from.
struct NodeIdentity<'a> {
    admin: &'a kube::Client,
    namespace: &'a str,
    service_account: Option<&'a str>,
    rs_name: &'a str,
    nodes: &'a [String],
    pods: &'a BTreeMap<String, Pod>,
    calls: &'a BTreeMap<String, Calls>,
}

/// Each node's state: its call log, its proxy pod (with kubelet) and, with RBAC, the plugin's
/// identity: the driver's ServiceAccount bound to that pod and node.
fn node_states(p: &NodeIdentity<'_>) -> Result<BTreeMap<String, NodeState>, DriverError> {
    let mut per_node = BTreeMap::new();
    for node in p.nodes {
        let pod = p.pods.get(node).cloned();
        let identity = match p.service_account {
            Some(sa) => {
                let (pod_name, pod_uid) = match &pod {
                    Some(pod) => (
                        pod.metadata.name.clone().unwrap_or_default(),
                        pod.metadata.uid.clone().unwrap_or_default(),
                    ),
                    // No pod without kubelet: an identity as if there was one.
                    None => (format!("{}-{}", p.rs_name, node.replace('.', "-")), random_uid()),
                };
                Some(PluginIdentity::new(p.admin, p.namespace, sa, node, &pod_name, &pod_uid)?)
            }
            None => None,
        };
        per_node.insert(
            node.clone(),
            NodeState {
                calls: p.calls.get(node).cloned().unwrap_or_default(),
                health: HealthState::new(),
                identity,
                pod: Mutex::new(pod),
                plugin: Mutex::new(None),
                claims: Mutex::new(None),
                plugin_config: Mutex::new(None),
                supervisor: Mutex::new(None),
                moves: Mutex::new(Vec::new()),
                moving: AtomicBool::new(false),
                lost: Mutex::new(None),
            },
        );
    }
    Ok(per_node)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_needs_a_successful_registered_notification() {
        let calls = Calls::new();
        assert!(!is_registered(&calls.log()));
        let config = DriverConfig::control_plane(resources::none());
        assert!(!config.with_kubelet && !config.with_rbac && config.expect_slice_removal);
        let config = DriverConfig::kubelet(resources::none()).name_suffix("-x").dra_versions(true, false);
        assert!(config.with_kubelet && config.with_rbac && !config.dra_v1beta1);
        assert_eq!(config.name_suffix, "-x");
    }
}
