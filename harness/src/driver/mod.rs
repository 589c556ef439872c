//! The test DRA driver of a spec (upstream's `utils.Driver`): node selection, ResourceSlices,
//! RBAC and the node-scoping admission policy, the proxy pods and the per-node in-process
//! plugins, and the teardown of all of it.
//!
//! Two modes:
//! - **with kubelet** ([`DriverConfig::kubelet`]): RBAC and policy from
//!   `manifests/plugin-permissions.yaml`, the proxy ReplicaSet pinned to the chosen nodes, one
//!   [`ProxiedPlugin`] per pod acting as the pod's ServiceAccount, registration with each
//!   node's kubelet awaited;
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
//! Teardown is registered on the [`Ctx`] while setting up, so it runs in reverse order also
//! after a failed set-up: stop the plugins, scale the proxy pods to zero, delete RBAC and policy,
//! delete the driver's slices when no kubelet will, then wait until every slice of the driver is
//! gone.

pub mod impersonate;
mod nodes;
pub mod proxy;
pub mod resources;
mod shared_claims;

use std::{
    collections::BTreeMap,
    fmt,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::ReplicaSet,
    core::v1::{Node, Pod, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Resource,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;
use sha2::{Digest as _, Sha256};

pub use impersonate::{Impersonation, ImpersonationError};
pub use nodes::{Nodes, TooFewNodes, unusable_reason};
pub use resources::{DriverResources, MULTI_HOST, Pool, Resources, ResourcesFn, Slice};

use crate::{
    calls::{CallLog, Calls, CallsError, FaultGuard, Method},
    framework::{ArtifactSource, Ctx},
    manifests::{self, INSTANCE_LABEL, ManifestError},
    plugin::{ClaimId, HealthState, KubeClaims, PluginConfig},
    proxied::{ProxiedError, ProxiedPlugin, ProxiedPluginSpec},
    wait::{self, Attempt, Verdict, WaitError},
};

/// The kubelet's default root directory.
pub const DEFAULT_KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";
/// The proxy pods' image (never pulled by the tests; it must be present on the nodes).
pub const DEFAULT_PROXY_IMAGE: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1";
/// How long the kubelets get to register the plugins (upstream: 1 min).
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the driver's slices may take to disappear after teardown (upstream's `IsGone`:
/// 2 min; the kubelet removes a node's slices 30 s after the plugin is gone).
pub const SLICE_REMOVAL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the proxy pods may take to become available.
pub const PROXY_START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long RBAC and the admission policy may take to become effective.
pub const PERMISSIONS_TIMEOUT: Duration = Duration::from_secs(30);

/// The driver name: `<namespace><name suffix>.k8s.io`.
pub fn driver_name(namespace: &str, name_suffix: &str) -> String {
    format!("{namespace}{name_suffix}.k8s.io")
}

/// Identifier in the names of the driver's RBAC objects: `<driver><instance suffix>`, or
/// `dra-<16 hex digits of its SHA-256>` when that is longer than 40 characters (so
/// `dra-kubelet-plugin-<id>-service-account` stays a valid name), as upstream does.
pub fn deployment_id(driver_name: &str, instance_suffix: &str) -> String {
    let base = format!("{driver_name}{instance_suffix}");
    if base.len() <= 40 {
        return base;
    }
    let digest = Sha256::digest(base.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("dra-{hex}")
}

/// The plugin's ServiceAccount: `dra-kubelet-plugin-<deployment id>-service-account`.
pub fn service_account_name(deployment_id: &str) -> String {
    format!("{}-{deployment_id}-service-account", manifests::NAME_PLACEHOLDER)
}

/// How a [`Driver`] is set up.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Appended to the namespace in the driver name (several drivers in one spec).
    pub name_suffix: String,
    /// Distinguishes two instances of the same driver (object names, instance label).
    pub instance_suffix: String,
    /// Per-instance sockets, so that this instance can run next to another instance of the same
    /// driver (upstream's `Driver.RollingUpdate`, which passes the proxy pod's UID to
    /// `kubeletplugin.RollingUpdate`; needs a kubelet of 1.33 or newer): each node's plugin
    /// uses its proxy pod's UID in its socket names (`dra-<pod UID>.sock` and a registration
    /// socket named after the UID, see [`crate::proxied::sockets`]).
    ///
    /// Instances of one driver that run on a node at the same time always share their
    /// prepared claims, whether or not this is set: the kubelet may prepare a claim through
    /// one and unprepare it through the other, and two instances never work on the same claim
    /// at once (upstream serializes the calls of all instances with a file lock instead).
    pub rolling_update: bool,
    /// What to publish.
    pub resources: ResourcesFn,
    /// Run proxy pods and plugins and expect the kubelets to register them.
    pub with_kubelet: bool,
    /// Create the ServiceAccount, RBAC and admission policy and give each node an
    /// impersonated client (always on with kubelet). Node-local slices are then written with
    /// those clients, as a real plugin writes them.
    pub with_rbac: bool,
    /// Serve the kubelet's `v1.DRAPlugin`.
    pub dra_v1: bool,
    /// Serve the kubelet's `v1beta1.DRAPlugin`.
    pub dra_v1beta1: bool,
    /// Serve and advertise `v1.DRAResourceHealth` (upstream's `Driver.HealthV1`).
    pub health_v1: bool,
    /// Serve and advertise `v1alpha1.DRAResourceHealth` (upstream's `Driver.HealthV1alpha1`).
    pub health_v1alpha1: bool,
    /// Wait at teardown until every slice of the driver is gone (upstream's
    /// `ExpectResourceSliceRemoval`, default on).
    pub expect_slice_removal: bool,
    /// The kubelet's root directory on the nodes.
    pub kubelet_root_dir: String,
    /// The proxy pods' image.
    pub image: String,
    /// How long the kubelets get to register the plugins.
    pub registration_timeout: Duration,
}

impl DriverConfig {
    /// Proxy pods, plugins registered with the kubelet, RBAC and policy (upstream's default
    /// `WithKubelet: true`).
    pub fn kubelet(resources: ResourcesFn) -> Self {
        DriverConfig {
            name_suffix: String::new(),
            instance_suffix: String::new(),
            rolling_update: false,
            resources,
            with_kubelet: true,
            with_rbac: true,
            dra_v1: true,
            dra_v1beta1: true,
            health_v1: true,
            health_v1alpha1: true,
            expect_slice_removal: true,
            kubelet_root_dir: DEFAULT_KUBELET_ROOT_DIR.to_owned(),
            image: DEFAULT_PROXY_IMAGE.to_owned(),
            registration_timeout: REGISTRATION_TIMEOUT,
        }
    }

    /// Only ResourceSlices; no pods, no plugins, no RBAC (see [`DriverConfig::rbac`]).
    pub fn control_plane(resources: ResourcesFn) -> Self {
        DriverConfig { with_kubelet: false, with_rbac: false, ..Self::kubelet(resources) }
    }

    /// Sets [`DriverConfig::name_suffix`].
    pub fn name_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.name_suffix = suffix.into();
        self
    }

    /// Sets [`DriverConfig::instance_suffix`].
    pub fn instance_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.instance_suffix = suffix.into();
        self
    }

    /// Sets [`DriverConfig::rolling_update`].
    pub fn rolling_update(mut self, on: bool) -> Self {
        self.rolling_update = on;
        self
    }

    /// Sets [`DriverConfig::with_rbac`] (ignored with kubelet, where it is always on).
    pub fn rbac(mut self, on: bool) -> Self {
        self.with_rbac = on;
        self
    }

    /// Which kubelet gRPC API versions the plugins serve.
    pub fn dra_versions(mut self, v1: bool, v1beta1: bool) -> Self {
        self.dra_v1 = v1;
        self.dra_v1beta1 = v1beta1;
        self
    }

    /// Which `DRAResourceHealth` API versions the plugins serve and advertise (both by default).
    pub fn health_versions(mut self, v1: bool, v1alpha1: bool) -> Self {
        self.health_v1 = v1;
        self.health_v1alpha1 = v1alpha1;
        self
    }

    /// Sets [`DriverConfig::expect_slice_removal`].
    pub fn expect_slice_removal(mut self, on: bool) -> Self {
        self.expect_slice_removal = on;
        self
    }

    /// Sets [`DriverConfig::kubelet_root_dir`].
    pub fn kubelet_root_dir(mut self, dir: impl Into<String>) -> Self {
        self.kubelet_root_dir = dir.into();
        self
    }

    /// Sets [`DriverConfig::image`].
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = image.into();
        self
    }
}

/// Errors of setting up or using a [`Driver`].
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was attempted.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The embedded manifests are broken.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// An impersonated client cannot be built.
    #[error(transparent)]
    Impersonation(#[from] ImpersonationError),
    /// A wait failed.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// The proxy pods do not match the chosen nodes.
    #[error(
        "expected one proxy pod of driver {driver} on each of {expected:?}, found pods on {found:?}; check the ReplicaSet's events"
    )]
    ProxyPods {
        /// The driver.
        driver: String,
        /// The chosen nodes.
        expected: Vec<String>,
        /// Nodes of the pods found.
        found: Vec<String>,
    },
    /// A proxied plugin did not start.
    #[error("cannot start the kubelet plugin of driver {driver} on node {node}: {source}")]
    Plugin {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: Box<ProxiedError>,
    },
    /// A kubelet did not register a plugin in time.
    #[error("driver {driver} was not registered by the kubelet of node {node}: {source}")]
    NotRegistered {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
        /// The timeout with the node's call log.
        #[source]
        source: Box<CallsError>,
    },
    /// A proxy pod has no UID, which a rolling update needs for its socket names.
    #[error(
        "proxy pod {pod} of driver {driver} has no UID; the rolling update needs it for the socket names"
    )]
    MissingPodUid {
        /// The driver.
        driver: String,
        /// `namespace/name` of the pod.
        pod: String,
    },
    /// The driver does not run on this node.
    #[error("driver {driver} does not run on node {node}; it runs on {nodes:?}")]
    UnknownNode {
        /// The driver.
        driver: String,
        /// The node asked for.
        node: String,
        /// The driver's nodes.
        nodes: Vec<String>,
    },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DriverError {
    let what = what.into();
    move |source| DriverError::Api { what, source }
}

/// Per-node state of a driver.
struct NodeState {
    calls: Calls,
    health: HealthState,
    /// The plugin's client: impersonates the ServiceAccount on this node (with RBAC).
    client: Option<kube::Client>,
    /// The proxy pod (with kubelet).
    pod: Option<Pod>,
    /// The running plugin (with kubelet), taken at teardown.
    plugin: Mutex<Option<RunningPlugin>>,
}

/// A node's running plugin and its share of the claim state of the driver on the node.
struct RunningPlugin {
    plugin: ProxiedPlugin,
    claims: shared_claims::Lease,
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

/// Writes the driver's ResourceSlices and each node's recorded gRPC calls into a failed spec's
/// artifacts.
struct DriverArtifacts {
    name: String,
    driver: String,
    client: kube::Client,
    calls: Vec<(String, Calls)>,
}

#[async_trait]
impl ArtifactSource for DriverArtifacts {
    fn name(&self) -> &str {
        &self.name
    }

    async fn collect(&self, dir: &Path) -> anyhow::Result<()> {
        let slices = crate::suite::list_dra_objects(&self.client, "ResourceSlice", "resourceslices", None)
            .await
            .map(|slices| {
                let ours = |s: &kube::api::DynamicObject| {
                    s.data.pointer("/spec/driver").and_then(|d| d.as_str()) == Some(self.driver.as_str())
                };
                slices.into_iter().filter(ours).collect::<Vec<_>>()
            });
        let slices = crate::framework::write_list(dir, "resourceslices.yaml", slices).await;
        for (node, calls) in &self.calls {
            let log: CallLog = calls.log();
            tokio::fs::write(dir.join(format!("grpc-calls-{node}.json")), serde_json::to_vec_pretty(&log)?)
                .await?;
            tokio::fs::write(dir.join(format!("grpc-calls-{node}.txt")), log.to_string()).await?;
        }
        slices.map_err(|e| anyhow::anyhow!(e))
    }
}

/// Creates an object and registers its deletion (waiting until it is gone) on `ctx`.
async fn create_with_cleanup<K>(ctx: &Ctx, api: Api<K>, obj: &K) -> Result<K, DriverError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let name = obj.meta().name.clone().unwrap_or_default();
    let created = api
        .create(&PostParams { field_manager: Some("dra-e2e".into()), ..Default::default() }, obj)
        .await
        .map_err(api_error(format!("create {kind} {name}")))?;
    ctx.delete_at_cleanup(api, name);
    Ok(created)
}

/// A random UID-shaped string (for plugin identities without a pod).
fn random_uid() -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    let b: [u8; 16] = rng.random();
    let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

impl Driver {
    /// Sets up the driver on `nodes` (see the module documentation) and registers its teardown
    /// on `ctx`. Its ResourceSlices and the recorded gRPC calls go into a failed spec's artifacts.
    pub async fn start(ctx: &Ctx, nodes: &Nodes, config: DriverConfig) -> Result<Driver, DriverError> {
        let name = driver_name(ctx.namespace(), &config.name_suffix);
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
        // Registered first, so it runs last.
        if config.expect_slice_removal {
            let api = slices_api.clone();
            let driver = name.clone();
            ctx.defer_with_timeout(
                format!("wait until the ResourceSlices of driver {name} are gone"),
                SLICE_REMOVAL_TIMEOUT + Duration::from_secs(30),
                async move {
                    wait_slices_gone(&api, &driver, SLICE_REMOVAL_TIMEOUT).await?;
                    Ok(())
                },
            );
        }

        let resources = config.resources.generate(nodes);
        let multi_host = resources.get(MULTI_HOST);
        if multi_host.is_some() || !config.with_kubelet {
            // No kubelet removes these (network-attached pools, or no registered plugin).
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
        let pods: BTreeMap<String, Pod> = if config.with_kubelet {
            let sa = service_account.clone().unwrap_or_default();
            deploy_proxy(ctx, &admin, &namespace, &name, &rs_name, nodes, &config, &sa).await?
        } else {
            BTreeMap::new()
        };

        let mut per_node = BTreeMap::new();
        for node in nodes.names() {
            let pod = pods.get(node).cloned();
            let client = match &service_account {
                Some(sa) => {
                    let (pod_name, pod_uid) = match &pod {
                        Some(p) => (
                            p.metadata.name.clone().unwrap_or_default(),
                            p.metadata.uid.clone().unwrap_or_default(),
                        ),
                        // No pod without kubelet: an identity as if there was one.
                        None => (format!("{rs_name}-{}", node.replace('.', "-")), random_uid()),
                    };
                    Some(
                        Impersonation::kubelet_plugin(&namespace, sa, node, &pod_name, &pod_uid)
                            .client(&admin)?,
                    )
                }
                None => None,
            };
            per_node.insert(
                node.clone(),
                NodeState {
                    calls: calls.get(node).cloned().unwrap_or_default(),
                    health: HealthState::new(),
                    client,
                    pod,
                    plugin: Mutex::new(None),
                },
            );
        }

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
            }),
        };

        if driver.inner.service_account.is_some() {
            driver.wait_permissions_effective().await?;
        }

        if driver.inner.config.with_kubelet {
            driver.start_plugins(ctx).await?;
        }

        driver.publish_node_local(&resources).await?;

        if driver.inner.config.with_kubelet {
            driver.wait_registered().await?;
        }
        tracing::info!(driver = %driver.inner.name, "driver is ready");
        Ok(driver)
    }

    /// Upstream's `TearDown` in the middle of a spec (e.g. to replace this instance by another
    /// one of the same driver): stops every node's plugin, so that its sockets go away and the
    /// kubelets unregister it, then scales the proxy pods to zero. RBAC, policy and the
    /// ResourceSlices stay; the teardown registered by [`Driver::start`] still runs at the end
    /// and finds nothing left to stop. Without kubelet this does nothing.
    pub async fn stop(&self) -> Result<(), DriverError> {
        let inner = &self.inner;
        if !inner.config.with_kubelet {
            return Ok(());
        }
        tracing::info!(driver = %inner.name, instance = %inner.config.instance_suffix, "stopping driver");
        for (node, state) in &inner.per_node {
            let running = lock(&state.plugin).take();
            if let Some(running) = running {
                self.stop_plugin(node, running).await;
            }
        }
        let rs_api: Api<ReplicaSet> = Api::namespaced(inner.admin.clone(), &inner.namespace);
        let rs_name = format!("dra-test-driver{}{}", inner.config.name_suffix, inner.config.instance_suffix);
        scale_proxy_down(&rs_api, &rs_name, &inner.name).await
    }

    /// Stops a node's plugin. Claims it still holds as prepared (the kubelet did not unprepare
    /// them, e.g. after a failed spec) would leave their CDI files on the node: those are then
    /// removed through the proxy pod, with a warning, unless another instance of the driver still
    /// runs on the node and shares the claims (it may still be asked to unprepare them).
    async fn stop_plugin(&self, node: &str, running: RunningPlugin) {
        let driver = &self.inner.name;
        let RunningPlugin { plugin, claims } = running;
        // Stop serving first, so that the prepared claims no longer change through this instance.
        let state = plugin.plugin().claim_state().clone();
        let cdi_dir = plugin.plugin().config().cdi_dir.clone();
        plugin.stop().await;
        let leftover = state.prepared_claims();
        let last = claims.release();
        if !last && !leftover.is_empty() {
            tracing::info!(%driver, %node, claims = ?leftover, "another instance of the driver still runs on the node and keeps the prepared claims");
        }
        if last && !leftover.is_empty() {
            tracing::warn!(%driver, %node, claims = ?leftover, "stopping a plugin that still holds prepared claims; removing their CDI files");
            let pod = self
                .inner
                .per_node
                .get(node)
                .and_then(|s| s.pod.as_ref())
                .map(crate::tunnel::PodRef::from_pod);
            if let Some(Ok(pod)) = pod {
                let files = crate::podexec::PodFiles::new(Arc::new(crate::podexec::PodExec::new(
                    self.inner.stream.clone(),
                    pod,
                )));
                for claim in &leftover {
                    let devices = state.prepared_devices(claim).unwrap_or_default();
                    let mut requests: Vec<&String> = devices.iter().flat_map(|d| &d.requests).collect();
                    requests.sort();
                    requests.dedup();
                    for request in requests {
                        let path = crate::plugin::spec_path(&cdi_dir, driver, &claim.uid, request);
                        if let Err(e) = crate::plugin::FileOps::remove(&files, &path).await {
                            tracing::warn!(%driver, %node, error = %e, "cannot remove a leftover CDI file");
                        }
                    }
                }
            }
        }
    }

    /// Starts one proxied plugin per proxy pod and registers their stop, then the scale-down.
    async fn start_plugins(&self, ctx: &Ctx) -> Result<(), DriverError> {
        let inner = &self.inner;
        for (node, state) in &inner.per_node {
            let Some(pod) = state.pod.clone() else { continue };
            let claims_client = state.client.clone().unwrap_or_else(|| inner.admin.clone());
            let mut plugin = PluginConfig::new(&inner.name, node, "/cdi")
                .dra_endpoint(format!(
                    "{}/dra.sock",
                    proxy::plugin_data_dir(&inner.config.kubelet_root_dir, &inner.name)
                ))
                .dra_v1(inner.config.dra_v1)
                .dra_v1beta1(inner.config.dra_v1beta1)
                .health_v1(inner.config.health_v1)
                .health_v1alpha1(inner.config.health_v1alpha1);
            if inner.config.rolling_update {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if uid.is_empty() {
                    return Err(DriverError::MissingPodUid {
                        driver: inner.name.clone(),
                        pod: format!("{}/{}", inner.namespace, pod.metadata.name.clone().unwrap_or_default()),
                    });
                }
                plugin = plugin.rolling_update_uid(uid);
            }
            let claims = shared_claims::Lease::acquire(&inner.name, node);
            let started = ProxiedPlugin::start(ProxiedPluginSpec {
                client: inner.stream.clone(),
                pod,
                plugin,
                claims: Arc::new(KubeClaims::new(claims_client)),
                calls: state.calls.clone(),
                health: state.health.clone(),
                claim_state: claims.state().clone(),
            })
            .await
            .map_err(|source| DriverError::Plugin {
                driver: inner.name.clone(),
                node: node.clone(),
                source: Box::new(source),
            })?;
            *lock(&state.plugin) = Some(RunningPlugin { plugin: started, claims });
            let this = self.clone();
            let node = node.clone();
            ctx.defer(
                format!("stop the kubelet plugin of driver {} on node {node}", inner.name),
                async move {
                    let running = this.inner.per_node.get(&node).and_then(|s| lock(&s.plugin).take());
                    if let Some(running) = running {
                        this.stop_plugin(&node, running).await;
                    }
                    Ok(())
                },
            );
        }
        Ok(())
    }

    /// Waits until RBAC and the admission policy are in effect: the first node's identity may
    /// create (dry run) a slice on its node, and may not create one on another node.
    async fn wait_permissions_effective(&self) -> Result<(), DriverError> {
        let Some((node, state)) = self.inner.per_node.iter().next() else { return Ok(()) };
        let Some(client) = state.client.clone() else { return Ok(()) };
        let api: Api<ResourceSlice> = Api::all(client);
        let probe = |node_name: &str| -> ResourceSlice {
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": { "generateName": "dra-e2e-permission-probe-" },
                "spec": {
                    "driver": self.inner.name,
                    "nodeName": node_name,
                    "pool": { "name": "probe", "generation": 1, "resourceSliceCount": 1 },
                },
            }))
            .unwrap_or_default()
        };
        let own = probe(node);
        let other = probe("dra-e2e-permission-probe-node");
        let dry = PostParams { dry_run: true, ..Default::default() };
        let what = format!("RBAC and ResourceSlice policy of driver {} to take effect", self.inner.name);
        wait::poll(what, PERMISSIONS_TIMEOUT, Duration::from_millis(200), || {
            let (api, own, other, dry) = (api.clone(), own.clone(), other.clone(), dry.clone());
            async move {
                if let Err(e) = api.create(&dry, &own).await {
                    return Attempt::Retry(format!("creating a slice on its own node failed: {e}"));
                }
                match api.create(&dry, &other).await {
                    Ok(_) => Attempt::Retry("creating a slice on another node was allowed".to_owned()),
                    Err(kube::Error::Api(s)) if s.message.contains("may not modify") => Attempt::Done(()),
                    Err(e) => Attempt::Retry(format!(
                        "creating a slice on another node failed with an unexpected error: {e}"
                    )),
                }
            }
        })
        .await?;
        Ok(())
    }

    /// Creates the node-local slices of every node, with the node's plugin client when there
    /// is one (as the plugin would), else with the admin client.
    async fn publish_node_local(&self, resources: &Resources) -> Result<(), DriverError> {
        let inner = &self.inner;
        for (node, res) in resources.iter().filter(|(k, _)| k.as_str() != MULTI_HOST) {
            let node_obj =
                match inner.nodes.objects().iter().find(|n| n.metadata.name.as_deref() == Some(node)) {
                    Some(n) => n.clone(),
                    None => Api::<Node>::all(inner.admin.clone())
                        .get(node)
                        .await
                        .map_err(api_error(format!("get node {node}")))?,
                };
            let client = inner
                .per_node
                .get(node)
                .and_then(|s| s.client.clone())
                .unwrap_or_else(|| inner.admin.clone());
            let api: Api<ResourceSlice> = Api::all(client);
            // Another instance of the same driver (an update) may have published this node's
            // pools already: keep identical slices, as upstream's slice controller does.
            let existing = Api::<ResourceSlice>::all(inner.admin.clone())
                .list(
                    &ListParams::default()
                        .fields(&format!("spec.driver={},spec.nodeName={node}", inner.name)),
                )
                .await
                .map_err(api_error(format!(
                    "list the ResourceSlices of driver {} on node {node}",
                    inner.name
                )))?
                .items;
            for slice in resources::node_slices(&inner.name, &node_obj, res) {
                if let Some(same) = existing.iter().find(|e| same_slice_content(e, &slice)) {
                    tracing::info!(slice = ?same.metadata.name, node = %node, "keeping the identical ResourceSlice of an earlier instance");
                    continue;
                }
                api.create(&PostParams::default(), &slice).await.map_err(api_error(format!(
                    "publish a ResourceSlice of driver {} for node {node}",
                    inner.name
                )))?;
            }
        }
        Ok(())
    }

    /// Waits until every node's kubelet reported a successful registration.
    async fn wait_registered(&self) -> Result<(), DriverError> {
        let timeout = self.inner.config.registration_timeout;
        let waits = self.inner.per_node.iter().map(|(node, state)| {
            let calls = state.calls.clone();
            let node = node.clone();
            let driver = self.inner.name.clone();
            async move {
                let what = format!("registration of driver {driver} by the kubelet of node {node}");
                calls
                    .wait_for(what, is_registered, timeout)
                    .await
                    .map_err(|source| DriverError::NotRegistered { driver, node, source: Box::new(source) })
            }
        });
        futures::future::try_join_all(waits).await?;
        Ok(())
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
    /// node's pod and node extras (`None` without RBAC).
    pub fn client(&self, node: &str) -> Option<&kube::Client> {
        self.inner.per_node.get(node).and_then(|s| s.client.as_ref())
    }

    /// The proxy pod on a node (with kubelet).
    pub fn proxy_pod(&self, node: &str) -> Option<&Pod> {
        self.inner.per_node.get(node).and_then(|s| s.pod.as_ref())
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
    /// after the plugin stopped). While another instance of the driver runs on the node, the
    /// two share their prepared claims (see [`DriverConfig::rolling_update`]).
    pub fn prepared_claims(&self, node: &str) -> Vec<ClaimId> {
        self.inner
            .per_node
            .get(node)
            .and_then(|s| lock(&s.plugin).as_ref().map(|p| p.plugin.plugin().prepared_claims()))
            .unwrap_or_default()
    }

    /// Unprepares `claim` in a node's running plugin directly, without a gRPC call (upstream's
    /// `plugin.UnprepareClaim`): for a claim the kubelet was told not to unprepare
    /// (`skipNodeOperations`), so that the plugin does not hold it at teardown. Nothing goes into
    /// the node's call log. Fails without a running plugin on the node.
    pub async fn unprepare_claim(&self, node: &str, claim: &ResourceClaim) -> anyhow::Result<()> {
        let state = self.state(node)?;
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        // The future owns what it needs: the lock is released before it runs.
        let unprepare =
            lock(&state.plugin).as_ref().map(|p| p.plugin.plugin().unprepare_claim(&namespace, &name, &uid));
        let unprepare = unprepare.ok_or_else(|| {
            anyhow::anyhow!("driver {} has no running plugin on node {node}", self.inner.name)
        })?;
        unprepare.await.map_err(|e| {
            anyhow::anyhow!("unprepare claim {namespace}/{name} ({uid}) in the plugin on node {node}: {e}")
        })
    }

    /// The DRA and registration socket paths of a node's running plugin, as the kubelet sees
    /// them (`None` without kubelet and after the plugin stopped).
    pub fn socket_paths(&self, node: &str) -> Option<(String, String)> {
        let state = self.inner.per_node.get(node)?;
        let running = lock(&state.plugin);
        let (dra, registration) = running.as_ref()?.plugin.socket_paths();
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a stored slice has the content a plugin would publish (`driver`, `nodeName`, pool and
/// devices as in `desired`).
fn same_slice_content(stored: &ResourceSlice, desired: &ResourceSlice) -> bool {
    let (a, b) = (&stored.spec, &desired.spec);
    a.driver == b.driver
        && a.node_name == b.node_name
        && a.pool.name == b.pool.name
        && a.pool.resource_slice_count == b.pool.resource_slice_count
        && serde_json::to_value(&a.devices).ok() == serde_json::to_value(&b.devices).ok()
        && serde_json::to_value(&a.shared_counters).ok() == serde_json::to_value(&b.shared_counters).ok()
        && a.skip_node_operations == b.skip_node_operations
        && desired
            .metadata
            .generate_name
            .as_deref()
            .is_some_and(|prefix| stored.metadata.name.as_deref().unwrap_or_default().starts_with(prefix))
}

/// Whether the call log holds a successful `NotifyRegistrationStatus` that says registered
/// (upstream's `BeRegistered`).
fn is_registered(log: &CallLog) -> bool {
    log.matching(Method::NotifyRegistrationStatus).iter().any(|r| {
        r.succeeded()
            && r.request.as_ref().is_some_and(|req| {
                ["plugin_registered", "pluginRegistered"]
                    .iter()
                    .any(|k| req.get(k).and_then(serde_json::Value::as_bool) == Some(true))
            })
    })
}

async fn wait_slices_gone(
    api: &Api<ResourceSlice>,
    driver: &str,
    timeout: Duration,
) -> Result<(), WaitError> {
    tracing::info!(driver, "waiting for the driver's ResourceSlices to be removed");
    wait::objects(
        api,
        watcher::Config::default().fields(&format!("spec.driver={driver}")),
        format!("every ResourceSlice of driver {driver} to be removed"),
        timeout,
        |slices| Verdict::done_if(slices.is_empty()),
    )
    .await
    .map(|_| ())
}

/// Creates the proxy ReplicaSet, registers its scale-down, waits for its pods and returns them
/// by node.
#[allow(clippy::too_many_arguments)]
async fn deploy_proxy(
    ctx: &Ctx,
    admin: &kube::Client,
    namespace: &str,
    driver: &str,
    rs_name: &str,
    nodes: &Nodes,
    config: &DriverConfig,
    service_account: &str,
) -> Result<BTreeMap<String, Pod>, DriverError> {
    let instance = format!("{driver}{}", config.instance_suffix);
    let rs = proxy::replicaset(&proxy::ProxyParams {
        name_suffix: &format!("{}{}", config.name_suffix, config.instance_suffix),
        instance: &instance,
        driver,
        nodes: nodes.names(),
        service_account,
        image: &config.image,
        kubelet_root_dir: &config.kubelet_root_dir,
    })?;
    let rs_api: Api<ReplicaSet> = Api::namespaced(admin.clone(), namespace);
    rs_api
        .create(&PostParams::default(), &rs)
        .await
        .map_err(api_error(format!("create the proxy ReplicaSet {rs_name}")))?;
    {
        let rs_api = rs_api.clone();
        let rs_name = rs_name.to_owned();
        let driver = driver.to_owned();
        ctx.defer_with_timeout(
            format!("scale the proxy pods of driver {driver} down to zero"),
            PROXY_START_TIMEOUT,
            async move {
                scale_proxy_down(&rs_api, &rs_name, &driver).await?;
                Ok(())
            },
        );
    }
    let want = i32::try_from(nodes.len()).unwrap_or(i32::MAX);
    let timeout = PROXY_START_TIMEOUT.min(ctx.remaining());
    wait::object(
        &rs_api,
        rs_name,
        format!("{want} available proxy pods of driver {driver}"),
        timeout,
        |rs| Verdict::done_if(rs.is_some_and(|rs| available_replicas(rs) >= want)),
    )
    .await?;
    let pods = Api::<Pod>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .map_err(api_error(format!("list the proxy pods of driver {driver}")))?;
    let by_node: BTreeMap<String, Pod> = pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()).map(|n| (n, p)))
        .collect();
    if by_node.keys().map(String::as_str).ne(nodes.names().iter().map(String::as_str)) {
        return Err(DriverError::ProxyPods {
            driver: driver.to_owned(),
            expected: nodes.names().to_vec(),
            found: by_node.keys().cloned().collect(),
        });
    }
    Ok(by_node)
}

/// Scales the proxy ReplicaSet to zero and waits until it has no available replica (a missing
/// ReplicaSet is fine).
async fn scale_proxy_down(rs_api: &Api<ReplicaSet>, rs_name: &str, driver: &str) -> Result<(), DriverError> {
    let scale = Patch::Merge(json!({"spec": {"replicas": 0}}));
    match rs_api.patch(rs_name, &PatchParams::default(), &scale).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(api_error(format!("scale the proxy ReplicaSet {rs_name} down"))(e)),
    }
    wait::object(
        rs_api,
        rs_name,
        format!("ReplicaSet {rs_name} of driver {driver} to have no available replicas"),
        PROXY_START_TIMEOUT - Duration::from_secs(10),
        |rs| Verdict::done_if(rs.is_none_or(|rs| available_replicas(rs) == 0)),
    )
    .await?;
    Ok(())
}

fn available_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("dra-abc", "", "dra-abc.k8s.io")]
    #[case("dra-abc", "-other", "dra-abc-other.k8s.io")]
    fn driver_names(#[case] ns: &str, #[case] suffix: &str, #[case] expected: &str) {
        assert_eq!(driver_name(ns, suffix), expected);
    }

    #[test]
    fn deployment_id_is_the_name_when_short_and_a_hash_when_long() {
        assert_eq!(deployment_id("dra-abc.k8s.io", ""), "dra-abc.k8s.io");
        assert_eq!(deployment_id("dra-abc.k8s.io", "-2"), "dra-abc.k8s.io-2");
        let long = "dra-supports-claim-and-c-xyz12.k8s.io-instance";
        let id = deployment_id(long, "");
        assert_eq!(id.len(), 4 + 16);
        assert!(id.starts_with("dra-"));
        assert_ne!(id, deployment_id(long, "-b"));
        assert_eq!(id, deployment_id(long, ""), "stable");
        // sha256("abc") starts with ba7816bf8f01cfea.
        assert_eq!(deployment_id(&"abc".repeat(14), "").len(), 20);
        assert_eq!(service_account_name("x"), "dra-kubelet-plugin-x-service-account");
    }

    #[test]
    fn deployment_id_hash_matches_upstream_algorithm() {
        // base longer than 40 characters -> "dra-" + hex(sha256(base)[:8])
        let base = "a".repeat(41);
        let digest = Sha256::digest(base.as_bytes());
        let expected: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        assert_eq!(deployment_id(&base, ""), format!("dra-{expected}"));
    }

    #[test]
    fn random_uids_look_like_uids() {
        let uid = random_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(uid.matches('-').count(), 4);
        assert_ne!(uid, random_uid());
    }

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
