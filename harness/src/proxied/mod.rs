//! A DRA kubelet plugin that runs in this process but is reached by the kubelet of a node through
//! a proxy pod on that node: two `hostpathplugin --proxy-endpoint` processes in the pod (DRA socket
//! and registration socket), each paired with a tunnel of pre-established port-forward
//! connections, and CDI files written into the pod through exec.
//!
//! Per proxy pod (design §3; the sockets' paths are the same inside the pod and on the node, via
//! hostPath mounts at identical paths):
//!
//! | socket | path | pod port |
//! |---|---|---|
//! | DRA | `/var/lib/kubelet/plugins/<driver>/dra.sock` | 9001 |
//! | registration | `/var/lib/kubelet/plugins_registry/<driver>-reg.sock` | 9002 |
//!
//! (Another kubelet root directory is taken from [`PluginConfig::dra_endpoint`], see [`sockets`].)
//! Two instances of one driver that run on a node at the same time (a rolling update, upstream's
//! `kubeletplugin.RollingUpdate(<pod UID>)`) each get their own sockets, named after the
//! instance's pod UID: see [`sockets`].
//!
//! CDI files go to the pod's `/cdi` (the node's `/var/run/cdi`) through [`PodFiles`].
//!
//! # A restart of the node's kubelet
//!
//! Every port-forward and exec stream runs through the node's kubelet, so its restart breaks them
//! all, and the plugin goes on by itself: the exec streams end with an error at once
//! ([`crate::podexec::collect`]) and a proxy process whose stream broke is adopted by the next
//! start (it survives: it logs to a file, see [`ProxyProcess`]); CDI file operations run again
//! (they are idempotent); the tunnels dial again; and since the idle tunnel connections the
//! restart ended stay queued, dead, in the proxies, [`ProxyResets`] restarts the proxies in a
//! plugin's start order, after which the restarted kubelet registers the plugin anew on its
//! first try and finds a clean DRA socket (it also re-registers the sockets it finds in
//! `plugins_registry` by itself; its first tries meet the dead connections).

mod paths;
mod reset;

use std::{fmt, future::Future, sync::Arc, time::Duration};

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::Pod;

pub use reset::{ProxyResets, SocketControl};

pub use paths::{
    PLUGINS_DIR, REGISTRY_DIR, UNIX_PATH_MAX, dra_socket, dra_socket_file, registration_socket,
    rolling_update_registration_file, sockets,
};

use crate::{
    calls::Calls,
    plugin::{
        ClaimSource, ClaimState, Forward, HealthState, KubeletPlugin, Listener, PluginConfig, PluginError,
        PluginListeners,
    },
    podexec::{PodExec, PodExecError, PodFiles, ProxyProcess, ProxyProcessConfig, Runner},
    tunnel::{InvalidPod, PodRef, PodWatch, PortForwardDialer, Tunnel, TunnelConfig},
};

/// The pod port of the DRA socket's proxy.
pub const DRA_PORT: u16 = 9001;
/// The pod port of the registration socket's proxy.
pub const REGISTRATION_PORT: u16 = 9002;
/// The pod ports of one plugin's two proxy processes: [`DRA_PORT`] and [`REGISTRATION_PORT`] in a
/// driver's own proxy pod, others in a pod that several drivers share (see
/// [`crate::driver`]'s shared proxy pods).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyPorts {
    /// The DRA socket's proxy.
    pub dra: u16,
    /// The registration socket's proxy.
    pub registration: u16,
}

impl Default for ProxyPorts {
    fn default() -> Self {
        ProxyPorts { dra: DRA_PORT, registration: REGISTRATION_PORT }
    }
}

/// Errors of starting a proxied plugin.
#[derive(Debug, thiserror::Error)]
pub enum ProxiedError {
    /// The pod object cannot be used.
    #[error(transparent)]
    InvalidPod(#[from] InvalidPod),
    /// The driver has no plugin configuration for the node (it was never started there).
    #[error("no plugin configuration to start the plugin with")]
    NotConfigured,
    /// The in-process plugin did not start.
    #[error("cannot start the plugin for proxy pod {pod}: {source}")]
    Plugin {
        /// `namespace/name`.
        pod: String,
        /// The cause.
        source: PluginError,
    },
}

/// What a proxied plugin needs.
pub struct ProxiedPluginSpec {
    /// Admin client: exec and port-forward into the proxy pod, and a watch of the pod. Prefer
    /// one made by [`tunnel_client`](crate::tunnel::tunnel_client) (TCP_NODELAY: calls through
    /// the tunnel avoid 40 ms delayed-ACK stalls).
    pub client: kube::Client,
    /// The running proxy pod (namespace, name, first container, node name).
    pub pod: Pod,
    /// The plugin: driver name, node name, CDI dir as seen in the pod (`/cdi`), API versions.
    pub plugin: PluginConfig,
    /// Where prepare reads claims (the client impersonating the plugin's ServiceAccount).
    pub claims: Arc<dyn ClaimSource>,
    /// The node's call log, owned by the Driver.
    pub calls: Calls,
    /// The node's device health.
    pub health: HealthState,
    /// Where prepared claims are kept: shared by the instances of one driver on one node that
    /// run at the same time (see [`PluginBuilder::claim_state`](crate::plugin::PluginBuilder::claim_state)),
    /// else [`ClaimState::default`].
    pub claim_state: ClaimState,
    /// Forward mode: pass the DRA and health calls on to this target (see
    /// [`PluginBuilder::forward`](crate::plugin::PluginBuilder::forward)); `None`: serve them.
    pub forward: Option<Forward>,
    /// The pod ports of the two proxy processes ([`ProxyPorts::default`] in a driver's own pod).
    pub ports: ProxyPorts,
}

impl fmt::Debug for ProxiedPluginSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxiedPluginSpec")
            .field("pod", &(&self.pod.metadata.namespace, &self.pod.metadata.name))
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

/// The tunnel settings a proxied plugin uses: upstream's 10 pre-established connections, and
/// retries at most 250 ms apart while the proxy process is not listening yet, so that the
/// kubelet's first `GetInfo` (1 s budget) finds a connection soon after the socket appears.
pub fn tunnel_config() -> TunnelConfig {
    TunnelConfig { max_backoff: Duration::from_millis(250), ..TunnelConfig::default() }
}

/// One socket: its tunnel and its proxy process.
#[derive(Debug)]
struct ProxiedSocket {
    tunnel: Tunnel,
    proxy: ProxyProcess,
    retry: tokio::task::JoinHandle<()>,
}

/// A running proxied plugin.
#[derive(Debug)]
pub struct ProxiedPlugin {
    plugin: KubeletPlugin,
    pod: PodRef,
    sockets: Vec<ProxiedSocket>,
    paths: (String, String),
    watch: PodWatch,
    /// Restarts the proxies when their tunnels lost their queued connections.
    resets: ProxyResets,
}

impl ProxiedPlugin {
    /// Starts the proxy processes, the tunnels and the plugin.
    pub async fn start(spec: ProxiedPluginSpec) -> Result<ProxiedPlugin, ProxiedError> {
        let ProxiedPluginSpec {
            client,
            pod,
            plugin: config,
            claims,
            calls,
            health,
            claim_state,
            forward,
            ports,
        } = spec;
        let pod = PodRef::from_pod(&pod)?;
        let driver = config.driver_name.clone();
        let (dra, registration) = sockets(&config);
        let exec: Arc<dyn Runner> = Arc::new(PodExec::new(client.clone(), pod.clone()));
        let tunnel_config = tunnel_config();

        // The servers first, so that handed-over connections are served at once.
        let (dra_tx, dra_listener) = Listener::channel(tunnel_config.max_open);
        let (reg_tx, reg_listener) = Listener::channel(tunnel_config.max_open);
        let mut builder = KubeletPlugin::builder(config.dra_endpoint(&dra));
        if let Some(forward) = forward {
            builder = builder.forward(forward);
        }
        let plugin = builder
            .claim_source(claims)
            .file_ops(Arc::new(PodFiles::new(exec.clone())))
            .calls(calls)
            .health(health)
            .claim_state(claim_state)
            .start(PluginListeners { registration: reg_listener, dra: dra_listener })
            .await
            .map_err(|source| ProxiedError::Plugin { pod: pod.display(), source })?;

        // Then per socket: the tunnel, then the proxy process in the pod. The registration
        // proxy starts once the DRA socket exists, so the kubelet cannot call the plugin before
        // its DRA endpoint exists (a NodePrepareResources that fails so is retried only at the
        // pod's next resync, a minute later).
        let watch = PodWatch::start(client.clone(), pod.clone());
        let mut sockets = Vec::new();
        let paths = (dra.clone(), registration.clone());
        let registration_proxy = ProxyProcessConfig::new(registration, ports.registration).after_socket(&dra);
        let dra_proxy = ProxyProcessConfig::new(dra, ports.dra);
        for (config, port, sender) in
            [(dra_proxy, ports.dra, dra_tx), (registration_proxy, ports.registration, reg_tx)]
        {
            let dialer = PortForwardDialer::new(client.clone(), pod.clone(), port);
            let tunnel = Tunnel::start(Arc::new(dialer), sender, tunnel_config.clone());
            let proxy = ProxyProcess::start(exec.clone(), config);
            let retry = retry_on_start(&tunnel, &proxy);
            sockets.push(ProxiedSocket { tunnel, proxy, retry });
        }
        let [dra_socket, reg_socket] =
            [&sockets[0], &sockets[1]].map(|s| SocketControl::new(&s.tunnel, &s.proxy));
        let resets = ProxyResets::start(dra_socket, reg_socket, format!("{driver} in pod {}", pod.display()));
        tracing::info!(%driver, pod = %pod.display(), dra = %paths.0, registration = %paths.1, "proxied plugin started");
        Ok(ProxiedPlugin { plugin, pod, sockets, paths, watch, resets })
    }

    /// The in-process plugin.
    pub fn plugin(&self) -> &KubeletPlugin {
        &self.plugin
    }

    /// The proxy pod.
    pub fn pod(&self) -> &PodRef {
        &self.pod
    }

    /// The socket paths (DRA, registration), as the kubelet sees them (see [`sockets`]).
    pub fn socket_paths(&self) -> (&str, &str) {
        (&self.paths.0, &self.paths.1)
    }

    /// The tunnels: DRA first, then registration.
    pub fn tunnels(&self) -> impl Iterator<Item = &Tunnel> {
        self.sockets.iter().map(|s| &s.tunnel)
    }

    /// The proxy processes: DRA first, then registration.
    pub fn proxies(&self) -> impl Iterator<Item = &ProxyProcess> {
        self.sockets.iter().map(|s| &s.proxy)
    }

    /// Stops the plugin, closes every tunnel connection and stops the proxy processes (their
    /// sockets are removed). Problems are logged; [`ProxiedPlugin::stop_checked`] returns them.
    pub async fn stop(self) {
        if let Err(e) = self.stop_checked().await {
            tracing::warn!(error = %e, "proxied plugin did not stop cleanly");
        }
    }

    /// Like [`ProxiedPlugin::stop`], but returns the first problem (after doing all steps).
    pub async fn stop_checked(self) -> Result<(), StopError> {
        let ProxiedPlugin { plugin, pod, sockets, paths: _, watch, resets } = self;
        // A restart of the proxies in flight ends here; stopping them comes next anyway.
        resets.stop().await;
        plugin.stop().await;
        // The sockets one beside the other; each closes its tunnel, then stops its proxy.
        let stops = sockets.into_iter().map(|ProxiedSocket { tunnel, proxy, retry }| async move {
            retry.abort();
            let closed = tunnel.close().await.map_err(|e| StopError::Tunnel(e.to_string()));
            let stopped = proxy.stop().await.map_err(StopError::Proxy);
            [closed.err(), stopped.err()]
        });
        let first = futures::future::join_all(stops).await.into_iter().flatten().flatten().next();
        drop(watch);
        tracing::info!(pod = %pod.display(), driver = %plugin.config().driver_name, "proxied plugin stopped");
        first.map_or(Ok(()), Err)
    }

    /// Resolves (with a description) when the proxy pod was deleted or replaced. Stays pending
    /// while the plugin runs on a live pod and after [`ProxiedPlugin::stop`].
    pub fn gone(&self) -> impl Future<Output = String> + Send + 'static {
        let mut signals = vec![self.watch.gone().boxed()];
        signals.extend(self.sockets.iter().map(|s| s.tunnel.gone().boxed()));
        futures::future::select_all(signals).map(|(reason, _, _)| reason)
    }
}

/// A problem while stopping.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    /// A tunnel did not close in time.
    #[error("tunnel: {0}")]
    Tunnel(String),
    /// A proxy process could not be stopped (it may still run in the pod).
    #[error("proxy process: {0}")]
    Proxy(PodExecError),
}

/// Dials again at once whenever the proxy process (re)starts, instead of waiting for the
/// tunnel's backoff.
fn retry_on_start(tunnel: &Tunnel, proxy: &ProxyProcess) -> tokio::task::JoinHandle<()> {
    let mut started = proxy.started();
    let retry = tunnel.retry_handle();
    tokio::spawn(async move {
        while started.changed().await.is_ok() {
            retry.retry_now();
        }
    })
}
