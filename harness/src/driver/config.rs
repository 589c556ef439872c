//! How a [`Driver`](super::Driver) is named and set up: the driver name, the deployment id of its RBAC
//! objects, and [`DriverConfig`].

use std::{sync::Arc, time::Duration};

use sha2::{Digest as _, Sha256};

use super::{forward::ForwardResolver, resources::ResourcesFn};
use crate::{manifests, plugin::MetadataVersion};

/// The kubelet's default root directory.
pub const DEFAULT_KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";
/// The proxy pods' image (never pulled by the tests; it must be present on the nodes).
pub const DEFAULT_PROXY_IMAGE: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1";
/// How long a replacement of a deleted proxy pod may take to run and be ready, by default
/// ([`DriverConfig::replacement_timeout`]).
pub const PROXY_REPLACEMENT_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the kubelets get to register the plugins (upstream: 1 min).
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(60);

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

/// How a [`Driver`](super::Driver) is set up.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The driver name instead of `<namespace><name suffix>.k8s.io` (see [`driver_name`]): for
    /// standing in for a driver that runs outside the harness ([`DriverConfig::forward`]).
    pub name: Option<String>,
    /// Forward mode: each node's plugin passes the kubelet's DRA and health calls on to what
    /// this finds on the node (the real driver) and advertises that driver's versions instead
    /// of [`DriverConfig::dra_v1`] and the others; `None`: the plugins serve the calls
    /// themselves.
    pub forward: Option<Arc<dyn ForwardResolver>>,
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
    /// How long the replacement of a lost proxy pod may take to be ready before the spec fails
    /// (see [`Driver::proxy_moves`](super::Driver::proxy_moves)).
    pub replacement_timeout: Duration,
    /// Device metadata: the versions each metadata file holds, in this order (upstream's
    /// `EnableDeviceMetadata` with `DeviceMetadataVersions`); `None`: off. Must include
    /// v1beta1 (see [`crate::plugin::MetadataConfig::new`]).
    pub device_metadata: Option<Vec<MetadataVersion>>,
    /// Upstream's `ReconcilePoolWithName` together with `UsePrivilegedClient`: each node's
    /// pool of this name is published with the admin client by a [`SliceController`] that
    /// reconciles only that pool (so a deleted slice comes back), instead of once as a
    /// node-local slice; a pool without node selector is published with `allNodes: true`. The
    /// driver deletes those slices at teardown (no kubelet owns them).
    ///
    /// [`SliceController`]: crate::slice_controller::SliceController
    pub reconcile_pool: Option<String>,
    /// Deploy the driver's own proxy ReplicaSet even where it could use the run's shared proxy
    /// pods (see [`DriverConfig::shares_proxy_pods`]): for specs that act on the proxy pods
    /// (delete one and watch the plugin move to its replacement, say).
    pub own_proxy_pods: bool,
}

impl DriverConfig {
    /// Proxy pods, plugins registered with the kubelet, RBAC and policy (upstream's default
    /// `WithKubelet: true`).
    pub fn kubelet(resources: ResourcesFn) -> Self {
        DriverConfig {
            name: None,
            forward: None,
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
            replacement_timeout: PROXY_REPLACEMENT_TIMEOUT,
            device_metadata: None,
            reconcile_pool: None,
            own_proxy_pods: false,
        }
    }

    /// Only ResourceSlices; no pods, no plugins, no RBAC (see [`DriverConfig::rbac`]).
    pub fn control_plane(resources: ResourcesFn) -> Self {
        DriverConfig { with_kubelet: false, with_rbac: false, ..Self::kubelet(resources) }
    }

    /// Sets [`DriverConfig::name`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets [`DriverConfig::forward`].
    pub fn forward(mut self, resolver: Arc<dyn ForwardResolver>) -> Self {
        self.forward = Some(resolver);
        self
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

    /// Turns device metadata on with these versions (see [`DriverConfig::device_metadata`]).
    pub fn device_metadata(mut self, versions: &[MetadataVersion]) -> Self {
        self.device_metadata = Some(versions.to_vec());
        self
    }

    /// Sets [`DriverConfig::reconcile_pool`].
    pub fn reconcile_pool(mut self, pool: impl Into<String>) -> Self {
        self.reconcile_pool = Some(pool.into());
        self
    }

    /// Sets [`DriverConfig::image`].
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = image.into();
        self
    }

    /// Sets [`DriverConfig::own_proxy_pods`].
    pub fn own_proxy_pods(mut self, on: bool) -> Self {
        self.own_proxy_pods = on;
        self
    }

    /// Whether the plugins run in the run's shared proxy pods (one per node, started by the
    /// first driver that needs it and kept until the run ends) instead of a ReplicaSet of the
    /// driver's own. Drivers with kubelet share them unless they need a pod of their own: a
    /// second instance of a driver or a rolling update (sockets and pod UIDs per instance),
    /// forward mode (it looks at its pod), another image or kubelet root directory, or
    /// [`DriverConfig::own_proxy_pods`].
    pub fn shares_proxy_pods(&self) -> bool {
        self.with_kubelet
            && !self.own_proxy_pods
            && !self.rolling_update
            && self.instance_suffix.is_empty()
            && self.forward.is_none()
            && self.image == DEFAULT_PROXY_IMAGE
            && self.kubelet_root_dir == DEFAULT_KUBELET_ROOT_DIR
    }
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
    fn only_plain_kubelet_drivers_share_proxy_pods() {
        let plain = || DriverConfig::kubelet(crate::driver::resources::node_local(1));
        assert!(plain().shares_proxy_pods());
        assert!(!DriverConfig::control_plane(crate::driver::resources::node_local(1)).shares_proxy_pods());
        assert!(!plain().own_proxy_pods(true).shares_proxy_pods());
        assert!(!plain().rolling_update(true).shares_proxy_pods());
        assert!(!plain().instance_suffix("-new").shares_proxy_pods());
        assert!(!plain().image("other:1").shares_proxy_pods());
        assert!(!plain().kubelet_root_dir("/var/lib/k").shares_proxy_pods());
    }

    #[test]
    fn deployment_id_hash_matches_upstream_algorithm() {
        // base longer than 40 characters -> "dra-" + hex(sha256(base)[:8])
        let base = "a".repeat(41);
        let digest = Sha256::digest(base.as_bytes());
        let expected: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        assert_eq!(deployment_id(&base, ""), format!("dra-{expected}"));
    }
}
