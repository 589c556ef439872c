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
//!
//! CDI files go to the pod's `/cdi` (the node's `/var/run/cdi`) through [`PodFiles`].

use std::{fmt, future::Future, sync::Arc, time::Duration};

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::Pod;

use crate::{
    calls::Calls,
    plugin::{ClaimSource, HealthState, KubeletPlugin, Listener, PluginConfig, PluginError, PluginListeners},
    podexec::{PodExec, PodExecError, PodFiles, ProxyProcess, ProxyProcessConfig, Runner},
    tunnel::{InvalidPod, PodRef, PodWatch, PortForwardDialer, Tunnel, TunnelConfig},
};

/// The pod port of the DRA socket's proxy.
pub const DRA_PORT: u16 = 9001;
/// The pod port of the registration socket's proxy.
pub const REGISTRATION_PORT: u16 = 9002;
/// The kubelet's plugin directory; a driver's DRA socket is `<this>/<driver>/dra.sock`.
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The kubelet's plugin registry directory; a driver's registration socket is
/// `<this>/<driver>-reg.sock`.
pub const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

/// The DRA socket of `driver`, as seen by the kubelet and inside the proxy pod.
pub fn dra_socket(driver: &str) -> String {
    format!("{PLUGINS_DIR}/{driver}/dra.sock")
}

/// The registration socket of `driver`, as seen by the kubelet and inside the proxy pod.
pub fn registration_socket(driver: &str) -> String {
    format!("{REGISTRY_DIR}/{driver}-reg.sock")
}

/// The DRA and registration socket paths for `config`: the DRA socket is
/// [`PluginConfig::dra_endpoint`] when set (e.g. under another kubelet root directory
/// `<root>/plugins/<driver>/dra.sock`; the registration socket then goes to
/// `<root>/plugins_registry`), else [`dra_socket`]; the registration socket is
/// [`registration_socket`] under the default root.
pub fn sockets(config: &PluginConfig) -> (String, String) {
    let driver = &config.driver_name;
    let Some(dra) = config.dra_endpoint.clone() else {
        return (dra_socket(driver), registration_socket(driver));
    };
    // <root>/plugins/<driver>/dra.sock -> <root>
    let path = std::path::Path::new(&dra);
    let root = path
        .parent()
        .filter(|dir| dir.file_name().is_some_and(|name| name == driver.as_str()))
        .and_then(|dir| dir.parent())
        .filter(|plugins| plugins.file_name().is_some_and(|name| name == "plugins"))
        .and_then(|plugins| plugins.parent());
    let registration = match root {
        Some(root) => root.join("plugins_registry").join(format!("{driver}-reg.sock")).display().to_string(),
        None => registration_socket(driver),
    };
    (dra, registration)
}

/// Errors of starting a proxied plugin.
#[derive(Debug, thiserror::Error)]
pub enum ProxiedError {
    /// The pod object cannot be used.
    #[error(transparent)]
    InvalidPod(#[from] InvalidPod),
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
    watch: PodWatch,
}

impl ProxiedPlugin {
    /// Starts the proxy processes, the tunnels and the plugin.
    pub async fn start(spec: ProxiedPluginSpec) -> Result<ProxiedPlugin, ProxiedError> {
        let ProxiedPluginSpec { client, pod, plugin: config, claims, calls, health } = spec;
        let pod = PodRef::from_pod(&pod)?;
        let driver = config.driver_name.clone();
        let (dra, registration) = sockets(&config);
        let exec: Arc<dyn Runner> = Arc::new(PodExec::new(client.clone(), pod.clone()));
        let tunnel_config = tunnel_config();

        // The servers first, so that handed-over connections are served at once.
        let (dra_tx, dra_listener) = Listener::channel(tunnel_config.max_open);
        let (reg_tx, reg_listener) = Listener::channel(tunnel_config.max_open);
        let plugin = KubeletPlugin::builder(config.dra_endpoint(&dra))
            .claim_source(claims)
            .file_ops(Arc::new(PodFiles::new(exec.clone())))
            .calls(calls)
            .health(health)
            .start(PluginListeners { registration: reg_listener, dra: dra_listener })
            .await
            .map_err(|source| ProxiedError::Plugin { pod: pod.display(), source })?;

        // Then per socket (DRA before registration, so the DRA endpoint works before the kubelet
        // learns of it): the tunnel, then the proxy process in the pod.
        let watch = PodWatch::start(client.clone(), pod.clone());
        let mut sockets = Vec::new();
        for (socket, port, sender) in [(dra, DRA_PORT, dra_tx), (registration, REGISTRATION_PORT, reg_tx)] {
            let dialer = PortForwardDialer::new(client.clone(), pod.clone(), port);
            let tunnel = Tunnel::start(Arc::new(dialer), sender, tunnel_config.clone());
            let proxy = ProxyProcess::start(exec.clone(), ProxyProcessConfig::new(socket, port));
            let retry = retry_on_start(&tunnel, &proxy);
            sockets.push(ProxiedSocket { tunnel, proxy, retry });
        }
        tracing::info!(%driver, pod = %pod.display(), "proxied plugin started");
        Ok(ProxiedPlugin { plugin, pod, sockets, watch })
    }

    /// The in-process plugin.
    pub fn plugin(&self) -> &KubeletPlugin {
        &self.plugin
    }

    /// The proxy pod.
    pub fn pod(&self) -> &PodRef {
        &self.pod
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
        let ProxiedPlugin { plugin, pod, sockets, watch } = self;
        plugin.stop().await;
        let mut first = None;
        for ProxiedSocket { tunnel, proxy, retry } in sockets {
            retry.abort();
            if let Err(e) = tunnel.close().await {
                first.get_or_insert(StopError::Tunnel(e.to_string()));
            }
            if let Err(e) = proxy.stop().await {
                first.get_or_insert(StopError::Proxy(e));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths() {
        let config = PluginConfig::new("d.k8s.io", "node", "/cdi");
        assert_eq!(
            sockets(&config),
            (
                "/var/lib/kubelet/plugins/d.k8s.io/dra.sock".to_string(),
                "/var/lib/kubelet/plugins_registry/d.k8s.io-reg.sock".to_string()
            )
        );
        let other_root = config.clone().dra_endpoint("/data/kubelet/plugins/d.k8s.io/dra.sock");
        assert_eq!(sockets(&other_root).1, "/data/kubelet/plugins_registry/d.k8s.io-reg.sock");
        let odd = config.dra_endpoint("/somewhere/dra.sock");
        assert_eq!(
            sockets(&odd),
            (
                "/somewhere/dra.sock".to_string(),
                "/var/lib/kubelet/plugins_registry/d.k8s.io-reg.sock".to_string()
            )
        );
    }
}
