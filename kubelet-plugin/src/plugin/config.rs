//! Static configuration of a plugin instance.

use std::{path::PathBuf, time::Duration};

use super::metadata::MetadataConfig;
use crate::grpc::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1};

/// Default interval at which the health stream resends the full snapshot even
/// without changes. The kubelet treats device health as unknown when it is not
/// refreshed within its health timeout (30 s by default); upstream's test
/// driver resends every 2 s.
pub const DEFAULT_HEALTH_RESEND_INTERVAL: Duration = Duration::from_secs(2);

/// Configuration of one plugin instance (one driver on one node).
///
/// ```
/// use kubelet_plugin::plugin::PluginConfig;
/// let config = PluginConfig::new("test.k8s.io", "node-1", "/var/run/cdi")
///     .dra_v1beta1(false)
///     .health_v1alpha1(false);
/// assert_eq!(config.supported_versions(), ["v1.DRAPlugin", "v1.DRAResourceHealth"]);
/// ```
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// The DRA driver name, e.g. `<namespace>.k8s.io`.
    pub driver_name: String,
    /// The node this instance serves.
    pub node_name: String,
    /// Directory for CDI spec files, as seen by the plugin's [`FileOps`](super::FileOps)
    /// (`/cdi` inside the proxy pod, a local directory in tests).
    pub cdi_dir: PathBuf,
    /// The DRA endpoint advertised in `GetInfo`: the full path of the DRA
    /// socket as the kubelet sees it. `None` means the path of the DRA
    /// listener, which then must be a Unix socket.
    pub dra_endpoint: Option<String>,
    /// The pod UID of this instance when it runs next to another instance of the same driver
    /// on the same node (upstream's `kubeletplugin.RollingUpdate`): each instance then has its
    /// own sockets, `dra-<uid>.sock` and a registration socket named after the UID (see
    /// `harness::proxied::sockets`). `None` (or empty): the fixed `dra.sock` and
    /// `<driver>-reg.sock`.
    pub rolling_update_uid: Option<String>,
    /// Serve and advertise `v1.DRAPlugin`.
    pub dra_v1: bool,
    /// Serve and advertise `v1beta1.DRAPlugin`.
    pub dra_v1beta1: bool,
    /// Serve and advertise `v1.DRAResourceHealth`.
    pub health_v1: bool,
    /// Serve and advertise `v1alpha1.DRAResourceHealth`.
    pub health_v1alpha1: bool,
    /// Resend the full health snapshot this often even without changes
    /// (`None`: only on changes).
    pub health_resend_interval: Option<Duration>,
    /// How long [`KubeletPlugin::stop`](super::KubeletPlugin::stop) lets
    /// in-flight calls finish before it closes all connections.
    pub stop_grace: Duration,
    /// Write device metadata files for prepared claims and mount them into the containers
    /// (upstream's `EnableDeviceMetadata`); `None`: off, as by default upstream.
    pub metadata: Option<MetadataConfig>,
    /// Static CDI devices (default: off, a CDI spec per claim): the node's devices are defined
    /// once, by a spec the driver writes when it starts ([`static_spec`](super::cdi::static_spec));
    /// prepare answers `<driver>/device=<device>` for each allocated device and writes no file,
    /// unprepare removes none.
    pub static_cdi: bool,
}

impl PluginConfig {
    /// Both DRA versions and both health versions on, health resent every 2 s.
    pub fn new(
        driver_name: impl Into<String>,
        node_name: impl Into<String>,
        cdi_dir: impl Into<PathBuf>,
    ) -> Self {
        PluginConfig {
            driver_name: driver_name.into(),
            node_name: node_name.into(),
            cdi_dir: cdi_dir.into(),
            dra_endpoint: None,
            rolling_update_uid: None,
            dra_v1: true,
            dra_v1beta1: true,
            health_v1: true,
            health_v1alpha1: true,
            health_resend_interval: Some(DEFAULT_HEALTH_RESEND_INTERVAL),
            stop_grace: Duration::from_millis(500),
            metadata: None,
            static_cdi: false,
        }
    }

    /// Sets [`PluginConfig::static_cdi`].
    pub fn static_cdi(mut self, on: bool) -> Self {
        self.static_cdi = on;
        self
    }

    /// Sets [`PluginConfig::dra_endpoint`].
    pub fn dra_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.dra_endpoint = Some(endpoint.into());
        self
    }

    /// Sets [`PluginConfig::rolling_update_uid`]; an empty UID turns rolling updates off, as
    /// upstream's `RollingUpdate("")` does.
    pub fn rolling_update_uid(mut self, uid: impl Into<String>) -> Self {
        let uid = uid.into();
        self.rolling_update_uid = (!uid.is_empty()).then_some(uid);
        self
    }

    /// Sets [`PluginConfig::dra_v1`].
    pub fn dra_v1(mut self, on: bool) -> Self {
        self.dra_v1 = on;
        self
    }

    /// Sets [`PluginConfig::dra_v1beta1`].
    pub fn dra_v1beta1(mut self, on: bool) -> Self {
        self.dra_v1beta1 = on;
        self
    }

    /// Sets [`PluginConfig::health_v1`].
    pub fn health_v1(mut self, on: bool) -> Self {
        self.health_v1 = on;
        self
    }

    /// Sets [`PluginConfig::health_v1alpha1`].
    pub fn health_v1alpha1(mut self, on: bool) -> Self {
        self.health_v1alpha1 = on;
        self
    }

    /// Sets [`PluginConfig::health_resend_interval`].
    pub fn health_resend_interval(mut self, interval: Option<Duration>) -> Self {
        self.health_resend_interval = interval;
        self
    }

    /// Sets [`PluginConfig::metadata`].
    pub fn metadata(mut self, metadata: Option<MetadataConfig>) -> Self {
        self.metadata = metadata;
        self
    }

    /// Sets [`PluginConfig::stop_grace`].
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// `supported_versions` as sent in `GetInfo`, in upstream's 1.37 order:
    /// `v1.DRAPlugin`, `v1beta1.DRAPlugin`, `v1.DRAResourceHealth`,
    /// `v1alpha1.DRAResourceHealth` (each only if enabled).
    pub fn supported_versions(&self) -> Vec<&'static str> {
        [
            (self.dra_v1, dra_v1::SERVICE_VERSION),
            (self.dra_v1beta1, dra_v1beta1::SERVICE_VERSION),
            (self.health_v1, health_v1::SERVICE_VERSION),
            (self.health_v1alpha1, health_v1alpha1::SERVICE_VERSION),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}
