//! The in-process DRA kubelet plugin: what the kubelet of one node talks to.
//!
//! One [`KubeletPlugin`] serves one driver on one node with two gRPC servers
//! on separate listeners, as upstream's helper does:
//! - the registration server (`pluginregistration.Registration`), whose socket
//!   the kubelet finds in its plugin registry directory;
//! - the DRA server (`DRAPlugin` v1/v1beta1 and `DRAResourceHealth`
//!   v1alpha1/v1, each configurable), at the endpoint advertised in `GetInfo`.
//!
//! Both servers record into one [`Calls`] (call log, counts, fault injection).
//! Claims are read through a [`ClaimSource`], CDI files written through
//! [`FileOps`], device health is set through [`HealthState`].
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use kubelet_plugin::plugin::*;
//! let dir = std::path::Path::new("/tmp/x");
//! let plugin = KubeletPlugin::builder(PluginConfig::new("test.k8s.io", "node-1", dir.join("cdi")))
//!     .claim_source(Arc::new(MemoryClaims::new()))
//!     .start(PluginListeners {
//!         registration: Listener::unix(dir.join("test.k8s.io-reg.sock")),
//!         dra: Listener::unix(dir.join("dra.sock")),
//!     })
//!     .await?;
//! plugin.wait_registered(Duration::from_secs(30)).await?;
//! plugin.health().set("pool", "device-00", Health::Unhealthy, "overheated");
//! plugin.stop().await;
//! # Ok(()) }
//! ```

mod authority;
mod cdi;
mod claims;
mod config;
mod dra;
mod files;
mod forward;
mod forward_claims;
mod health;
pub mod metadata;
mod open_streams;
mod registration;
mod serving;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt as _;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

pub use cdi::{
    CDI_CLASS, CDI_VERSION, CdiContainerEdits, CdiDevice, CdiMount, CdiSpec, base_request, claim_env_name,
    device_id, device_name, env_for_result, kind as cdi_kind, spec_path, static_device_id, static_spec,
};
pub use claims::{ClaimSource, ClaimSourceError, KubeClaims, MemoryClaims, NoClaims};
pub use config::{DEFAULT_HEALTH_RESEND_INTERVAL, PluginConfig};
pub use dra::{ClaimId, ClaimState, PreparedDevice};
pub use files::{FileOps, FileOpsError, LocalDirFiles, tmp_path, write_atomically};
pub use forward::Forward;
pub use health::{DeviceHealth, Health, HealthState};
pub use metadata::{MetadataConfig, MetadataConfigError, MetadataVersion};
pub use serving::{BoxedConnection, Connection, ConnectionSender, ConnectionStream, Listener, ServerGone};

use crate::{
    calls::Calls,
    grpc::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration::RegistrationStatus},
};
use dra::{DraCore, DraV1, DraV1beta1};
use health::{HealthV1, HealthV1alpha1};
use registration::RegistrationService;
use serving::{ServedConnection, bind, remove_socket};

/// Errors of the plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The configuration enables no DRA API version.
    #[error("no DRA gRPC API version is enabled (enable v1 or v1beta1 in the plugin config)")]
    NoDraVersion,
    /// The DRA endpoint to advertise is unknown.
    #[error(
        "the DRA listener is not a Unix socket, so set PluginConfig::dra_endpoint to the socket path the kubelet should use"
    )]
    NoDraEndpoint,
    /// A listener could not be set up.
    #[error("cannot listen for the {server} server on {what}: {source}")]
    Listen {
        /// `registration` or `DRA`.
        server: &'static str,
        /// The socket path or `connection stream`.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A wait for registration ran out of time.
    #[error(
        "the kubelet did not register driver {driver} on node {node} within {timeout:?} (last status: {last}); check that the registration socket is in the kubelet's plugins_registry directory and the kubelet log"
    )]
    NotRegistered {
        /// Driver name.
        driver: String,
        /// Node name.
        node: String,
        /// How long it waited.
        timeout: Duration,
        /// The last NotifyRegistrationStatus, if any.
        last: String,
    },
}

/// The listeners of the two servers.
#[derive(Debug)]
pub struct PluginListeners {
    /// For the registration server (`<registry dir>/<driver>-reg.sock` for a kubelet).
    pub registration: Listener,
    /// For the DRA + health server (the advertised DRA endpoint).
    pub dra: Listener,
}

/// Sets up a [`KubeletPlugin`].
#[derive(Debug)]
pub struct PluginBuilder {
    config: PluginConfig,
    claims: Arc<dyn ClaimSource>,
    files: Arc<dyn FileOps>,
    calls: Calls,
    health: HealthState,
    claim_state: ClaimState,
    record_calls: bool,
    forward: Option<Forward>,
}

impl PluginBuilder {
    /// Forward mode (default: off): serve no DRA or health calls here but pass each one on to
    /// another plugin and answer with its response (see [`Forward`]); advertise the versions of
    /// `forward` instead of the configured ones. Calls are still recorded and can be failed.
    pub fn forward(mut self, forward: Forward) -> Self {
        self.forward = Some(forward);
        self
    }

    /// Where claims are read (default: [`NoClaims`], prepare fails).
    pub fn claim_source(mut self, claims: Arc<dyn ClaimSource>) -> Self {
        self.claims = claims;
        self
    }

    /// Where CDI files go (default: [`LocalDirFiles`]).
    pub fn file_ops(mut self, files: Arc<dyn FileOps>) -> Self {
        self.files = files;
        self
    }

    /// Record into this call log (default: a new one). Lets a driver create
    /// the log of a node before its plugin starts.
    pub fn calls(mut self, calls: Calls) -> Self {
        self.calls = calls;
        self
    }

    /// Report this device health (default: a new, empty state).
    pub fn health(mut self, health: HealthState) -> Self {
        self.health = health;
        self
    }

    /// Keep prepared claims in this state (default: a new one). Plugin instances of one driver
    /// on one node that run at the same time (a rolling update) share one, so that each can
    /// unprepare what another prepared and they never work on the same claim at once.
    pub fn claim_state(mut self, state: ClaimState) -> Self {
        self.claim_state = state;
        self
    }

    /// Whether to install the call-recording layer (default: true). Without
    /// it nothing is recorded and no fault can be injected; for benchmarks.
    pub fn record_calls(mut self, on: bool) -> Self {
        self.record_calls = on;
        self
    }

    /// Binds both listeners and starts both servers (DRA first, then
    /// registration, so the DRA endpoint works before the kubelet learns of it).
    pub async fn start(self, listeners: PluginListeners) -> Result<KubeletPlugin, PluginError> {
        KubeletPlugin::start_with(self, listeners).await
    }
}

struct RunningServer {
    name: &'static str,
    task: JoinHandle<()>,
    socket: Option<PathBuf>,
}

#[derive(Debug)]
struct Shared {
    config: PluginConfig,
    calls: Calls,
    health: HealthState,
    dra: Arc<DraCore>,
    status: watch::Sender<Option<RegistrationStatus>>,
    /// Stops accepting and asks connections to finish (graceful).
    shutdown: CancellationToken,
    /// Closes all connections (hard).
    kill: CancellationToken,
}

/// A running plugin. Stop it with [`KubeletPlugin::stop`]; dropping it stops
/// the servers too, without waiting.
pub struct KubeletPlugin {
    shared: Arc<Shared>,
    servers: Mutex<Vec<RunningServer>>,
}

impl std::fmt::Debug for KubeletPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletPlugin")
            .field("driver", &self.shared.config.driver_name)
            .field("node", &self.shared.config.node_name)
            .finish_non_exhaustive()
    }
}

type Layered = tower::util::Either<crate::calls::CallsLayer, tower::layer::util::Identity>;

/// Every server's layers: the calls recorded if asked.
type Layers = tower::layer::util::Stack<Layered, tower::layer::util::Identity>;

fn server_builder(calls: &Calls, record: bool) -> tonic::transport::Server<Layers> {
    // No timeouts or keep-alive limits: tunnel connections may sit idle.
    tonic::transport::Server::builder().layer(tower::util::option_layer(record.then(|| calls.layer())))
}

type DraRouter = tonic::transport::server::Router<Layers>;

/// The DRA server of forward mode: a [`forward::Forwarder`] per service the driver advertised.
fn forward_router(forward: &Forward, calls: &Calls, record: bool) -> DraRouter {
    use forward::{DraV1Service, DraV1beta1Service, HealthV1Service, HealthV1alpha1Service, ServiceName};
    server_builder(calls, record)
        .add_optional_service(
            forward.serves(DraV1Service::VERSION).then(|| forward.forwarder::<DraV1Service>()),
        )
        .add_optional_service(
            forward.serves(DraV1beta1Service::VERSION).then(|| forward.forwarder::<DraV1beta1Service>()),
        )
        .add_optional_service(
            forward.serves(HealthV1Service::VERSION).then(|| forward.forwarder::<HealthV1Service>()),
        )
        .add_optional_service(
            forward
                .serves(HealthV1alpha1Service::VERSION)
                .then(|| forward.forwarder::<HealthV1alpha1Service>()),
        )
}

impl KubeletPlugin {
    /// Starts configuring a plugin.
    pub fn builder(config: PluginConfig) -> PluginBuilder {
        PluginBuilder {
            config,
            claims: Arc::new(NoClaims),
            files: Arc::new(LocalDirFiles),
            calls: Calls::new(),
            health: HealthState::new(),
            claim_state: ClaimState::default(),
            record_calls: true,
            forward: None,
        }
    }

    async fn start_with(builder: PluginBuilder, listeners: PluginListeners) -> Result<Self, PluginError> {
        let PluginBuilder { config, claims, files, calls, health, claim_state, record_calls, forward } =
            builder;
        if forward.is_none() && !config.dra_v1 && !config.dra_v1beta1 {
            return Err(PluginError::NoDraVersion);
        }
        let endpoint = match (&config.dra_endpoint, listeners.dra.unix_path()) {
            (Some(endpoint), _) => endpoint.clone(),
            (None, Some(path)) => path.display().to_string(),
            (None, None) => return Err(PluginError::NoDraEndpoint),
        };
        let shared = Arc::new(Shared {
            dra: Arc::new(DraCore::new(config.clone(), claims, files, claim_state)),
            config,
            calls,
            health,
            status: watch::Sender::new(None),
            shutdown: CancellationToken::new(),
            kill: CancellationToken::new(),
        });
        let plugin = KubeletPlugin { shared: shared.clone(), servers: Mutex::new(Vec::new()) };
        let config = &shared.config;

        // DRA + health server first.
        let dra_router = match &forward {
            Some(forward) => forward_router(forward, &shared.calls, record_calls),
            None => {
                let core = shared.dra.clone();
                let health = HealthV1 {
                    health: shared.health.clone(),
                    resend: config.health_resend_interval,
                    stop: shared.shutdown.clone(),
                };
                server_builder(&shared.calls, record_calls)
                    .add_optional_service(
                        config
                            .dra_v1
                            .then(|| dra_v1::dra_plugin_server::DraPluginServer::new(DraV1(core.clone()))),
                    )
                    .add_optional_service(config.dra_v1beta1.then(|| {
                        dra_v1beta1::dra_plugin_server::DraPluginServer::new(DraV1beta1(core.clone()))
                    }))
                    .add_optional_service(config.health_v1.then(|| {
                        health_v1::dra_resource_health_server::DraResourceHealthServer::new(health.clone())
                    }))
                    .add_optional_service(config.health_v1alpha1.then(|| {
                        health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                            HealthV1alpha1(health.clone()),
                        )
                    }))
            }
        };
        plugin.serve("DRA", dra_router, listeners.dra)?;

        let versions: Vec<&str> = match &forward {
            Some(forward) => forward.versions().iter().map(String::as_str).collect(),
            None => config.supported_versions(),
        };
        let registration =
            RegistrationService::new(&config.driver_name, &endpoint, &versions, shared.status.clone());
        let registration_router = server_builder(&shared.calls, record_calls).add_service(
            crate::grpc::registration::registration_server::RegistrationServer::new(registration),
        );
        plugin.serve("registration", registration_router, listeners.registration)?;

        tracing::info!(
            driver = %config.driver_name,
            node = %config.node_name,
            %endpoint,
            ?versions,
            forward = forward.is_some(),
            "kubelet plugin started"
        );
        Ok(plugin)
    }

    fn serve(
        &self,
        name: &'static str,
        router: tonic::transport::server::Router<Layers>,
        listener: Listener,
    ) -> Result<(), PluginError> {
        let what = match &listener {
            Listener::Unix(path) => path.display().to_string(),
            Listener::Connections(_) => "connection stream".to_string(),
        };
        let bound = bind(listener).map_err(|source| PluginError::Listen {
            server: name,
            what: what.clone(),
            source,
        })?;
        let (shutdown, kill) = (self.shared.shutdown.clone(), self.shared.kill.clone());
        let stopping = shutdown.clone();
        let incoming = bound.incoming.map(move |c| c.map(|c| ServedConnection::new(c, &stopping, &kill)));
        let task = tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()).await {
                tracing::error!(server = name, error = %e, "gRPC server failed");
            }
            tracing::debug!(server = name, "gRPC server ended");
        });
        self.lock_servers().push(RunningServer { name, task, socket: bound.socket });
        tracing::debug!(server = name, listener = %what, "serving");
        Ok(())
    }

    fn lock_servers(&self) -> std::sync::MutexGuard<'_, Vec<RunningServer>> {
        self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The configuration.
    pub fn config(&self) -> &PluginConfig {
        &self.shared.config
    }

    /// The call log and fault injection of this plugin.
    pub fn calls(&self) -> &Calls {
        &self.shared.calls
    }

    /// The device health this plugin reports.
    pub fn health(&self) -> &HealthState {
        &self.shared.health
    }

    /// Whether the kubelet's last `NotifyRegistrationStatus` said registered.
    pub fn is_registered(&self) -> bool {
        self.shared.status.borrow().as_ref().is_some_and(|s| s.plugin_registered)
    }

    /// The kubelet's last `NotifyRegistrationStatus`, if any.
    pub fn registration_status(&self) -> Option<RegistrationStatus> {
        self.shared.status.borrow().clone()
    }

    /// Waits until the kubelet reports a successful registration.
    pub async fn wait_registered(&self, timeout: Duration) -> Result<(), PluginError> {
        let mut rx = self.shared.status.subscribe();
        let waited =
            tokio::time::timeout(timeout, rx.wait_for(|s| s.as_ref().is_some_and(|s| s.plugin_registered)))
                .await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(PluginError::NotRegistered {
                driver: self.shared.config.driver_name.clone(),
                node: self.shared.config.node_name.clone(),
                timeout,
                last: match self.registration_status() {
                    None => "none".to_string(),
                    Some(s) => format!("registered={} error={:?}", s.plugin_registered, s.error),
                },
            }),
        }
    }

    /// Claims currently prepared, sorted (by this plugin or another instance sharing its
    /// [`ClaimState`]).
    pub fn prepared_claims(&self) -> Vec<ClaimId> {
        self.shared.dra.state().prepared_claims()
    }

    /// The devices returned for a prepared claim.
    pub fn prepared_devices(&self, claim: &ClaimId) -> Option<Vec<PreparedDevice>> {
        self.shared.dra.state().prepared_devices(claim)
    }

    /// The claim state (see [`PluginBuilder::claim_state`]).
    pub fn claim_state(&self) -> &ClaimState {
        self.shared.dra.state()
    }

    /// Unprepares a claim as a `NodeUnprepareResources` call naming only it would (removes its
    /// CDI files, forgets it; an unknown claim is fine), but directly, not through gRPC: nothing
    /// goes into the call log, which stays the record of what the kubelet did (upstream's
    /// `ExamplePlugin.UnprepareClaim`, for claims the kubelet was told not to unprepare).
    /// The future owns what it needs, so the plugin need not outlive it (nor a lock around it).
    pub fn unprepare_claim(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send + use<> {
        let dra = self.shared.dra.clone();
        let uid = uid.to_owned();
        let request =
            dra::ClaimRequest { namespace: namespace.to_owned(), name: name.to_owned(), uid: uid.clone() };
        async move { dra.unprepare(&[request], None).await.remove(&uid).unwrap_or(Ok(())) }
    }

    /// Stops both servers: stops accepting, ends health streams, gives
    /// in-flight calls [`PluginConfig::stop_grace`] to finish, then closes all
    /// connections and removes the socket files this plugin created.
    pub async fn stop(&self) {
        let servers: Vec<RunningServer> = std::mem::take(&mut *self.lock_servers());
        if servers.is_empty() {
            return;
        }
        self.shared.shutdown.cancel();
        let deadline = tokio::time::Instant::now() + self.shared.config.stop_grace;
        let mut sockets = Vec::new();
        let mut lingering = Vec::new();
        for mut server in servers {
            sockets.extend(server.socket.take());
            if tokio::time::timeout_at(deadline, &mut server.task).await.is_err() {
                lingering.push(server);
            }
        }
        if !lingering.is_empty() {
            tracing::debug!("closing remaining plugin connections");
            self.shared.kill.cancel();
            for mut server in lingering {
                if tokio::time::timeout(Duration::from_secs(5), &mut server.task).await.is_err() {
                    tracing::warn!(server = server.name, "gRPC server did not stop, aborting it");
                    server.task.abort();
                }
            }
        }
        self.shared.kill.cancel();
        for socket in sockets {
            remove_socket(&socket);
        }
        tracing::info!(driver = %self.shared.config.driver_name, node = %self.shared.config.node_name, "kubelet plugin stopped");
    }
}

impl Drop for KubeletPlugin {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        self.shared.kill.cancel();
        for server in std::mem::take(&mut *self.lock_servers()) {
            server.task.abort();
            if let Some(socket) = server.socket {
                remove_socket(&socket);
            }
        }
    }
}
