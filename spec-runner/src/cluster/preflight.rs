//! What preflight found out about the cluster, and the skip helpers built on it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use crate::spec::error::{SpecError, SpecResult};

/// A Kubernetes version as `major.minor.patch` (from `v1.37.2`, `v1.35.0-alpha.1+abc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KubeVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl KubeVersion {
    /// Parses `v1.37.2` or `1.37` (pre-release and build suffixes are ignored).
    pub fn parse(text: &str) -> Option<Self> {
        let core = text.trim().trim_start_matches('v');
        let core = core.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        Some(Self { major, minor, patch })
    }

    /// `major.minor` as a pair, for comparisons like `>= (1, 34)`.
    pub fn minor_version(self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A node as preflight saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `status.nodeInfo.kubeletVersion` as reported (`v1.37.2`).
    pub kubelet_version: String,
    /// Whether the `Ready` condition is `True`.
    pub ready: bool,
    /// Whether a test pod can land there: not cordoned and no `NoSchedule`/`NoExecute` taint
    /// (the tainted control plane of a kind cluster is not).
    pub schedulable: bool,
}

/// The label key of upstream's `framework.WithKubeletMinVersion("1.34")`: `KubeletMinVersion:1.34`.
pub const KUBELET_MIN_VERSION: &str = "KubeletMinVersion";

/// The kubelet version a spec with these labels needs: the highest `KubeletMinVersion:X` among
/// them (inherited ones included), `None` when it has none. A value that does not parse as
/// `major.minor[.patch]` counts as none.
pub fn kubelet_min_version(labels: &[String]) -> Option<KubeVersion> {
    labels
        .iter()
        .filter_map(|label| {
            let (key, value) = label.split_once(':')?;
            (key.trim() == KUBELET_MIN_VERSION).then(|| KubeVersion::parse(value)).flatten()
        })
        .max()
}

impl NodeInfo {
    /// The parsed kubelet version, if it parses.
    pub fn kubelet(&self) -> Option<KubeVersion> {
        KubeVersion::parse(&self.kubelet_version)
    }
}

/// The cluster, as discovered once before any spec runs; on every [`Ctx`](crate::Ctx).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The API server URL from the kubeconfig.
    pub server: String,
    /// `gitVersion` of the API server (`v1.37.2`).
    pub server_version: String,
    /// Every served API group version: `v1` (core), `apps/v1`, `resource.k8s.io/v1`, ...
    pub api_versions: BTreeSet<String>,
    /// All nodes.
    pub nodes: Vec<NodeInfo>,
    /// The API server's feature gates (every gate it knows, defaults included), from its
    /// `kubernetes_feature_enabled` metric, read once by preflight: they cannot change while it
    /// runs. `None` when its `/metrics` could not be read.
    pub api_server_gates: Option<BTreeMap<String, bool>>,
}

/// Every gate in Prometheus text exposition (`kubernetes_feature_enabled{name="G",stage="..."} 1`,
/// as every Kubernetes component exports it for every gate it knows) and its effective state.
pub fn feature_gates_from_metrics(text: &str) -> BTreeMap<String, bool> {
    text.lines()
        .filter_map(|line| line.strip_prefix("kubernetes_feature_enabled{"))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once('}')?;
            let name = labels.split(',').find_map(|l| l.trim().strip_prefix("name=\""))?.strip_suffix('"')?;
            let value: f64 = value.trim().split(' ').next()?.parse().ok()?;
            Some((name.to_owned(), value != 0.0))
        })
        .collect()
}

impl ClusterInfo {
    /// The API server's state of `gate` as preflight read it: `Some(None)` when it does not know
    /// the gate, `None` when preflight could not read its metrics.
    pub fn api_server_gate(&self, gate: &str) -> Option<Option<bool>> {
        self.api_server_gates.as_ref().map(|gates| gates.get(gate).copied())
    }

    /// Whether the API server serves this group version (`resource.k8s.io/v1beta2`).
    pub fn serves(&self, group_version: &str) -> bool {
        self.api_versions.contains(group_version)
    }

    /// The served versions of one API group, e.g. `resource.k8s.io`.
    pub fn versions_of(&self, group: &str) -> Vec<&str> {
        self.api_versions
            .iter()
            .filter_map(|gv| gv.split_once('/').filter(|(g, _)| *g == group).map(|_| gv.as_str()))
            .collect()
    }

    /// Fails preflight unless every `(group version, hint)` is served.
    pub(crate) fn require_apis(&self, required: &[(String, String)]) -> Result<(), PreflightError> {
        for (api, hint) in required {
            if self.serves(api) {
                continue;
            }
            let group = api.split_once('/').map_or("", |(g, _)| g);
            let served = self.versions_of(group);
            return Err(PreflightError::MissingApi {
                server: self.server.clone(),
                api: api.clone(),
                served: if served.is_empty() {
                    format!(
                        "no version of {} is served",
                        if group.is_empty() { "the core group" } else { group }
                    )
                } else {
                    format!("it serves {}", served.join(", "))
                },
                hint: hint.clone(),
            });
        }
        Ok(())
    }

    /// The parsed API server version.
    pub fn server(&self) -> Option<KubeVersion> {
        KubeVersion::parse(&self.server_version)
    }

    /// Nodes whose `Ready` condition is `True`.
    pub fn ready_nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.iter().filter(|n| n.ready)
    }

    /// Skips unless the API server serves this group version.
    pub fn require_api(&self, group_version: &str) -> SpecResult {
        if self.serves(group_version) {
            return Ok(());
        }
        let group = group_version.split_once('/').map_or("", |(g, _)| g);
        let served = self.versions_of(group);
        Err(SpecError::skip(format!(
            "needs API {group_version}, which the cluster does not serve (it serves {})",
            if served.is_empty() { "no version of that group".to_owned() } else { served.join(", ") }
        )))
    }

    /// Skips unless at least `count` nodes are ready.
    pub fn require_nodes(&self, count: usize) -> SpecResult {
        let ready = self.ready_nodes().count();
        if ready >= count {
            return Ok(());
        }
        Err(SpecError::skip(format!("needs {count} ready nodes, the cluster has {ready}")))
    }

    /// Skips unless some ready schedulable node's kubelet is at least `major.minor` (upstream's
    /// `WithKubeletMinVersion`). The runner checks a spec's `KubeletMinVersion` label the same
    /// way before it starts ([`ClusterInfo::kubelet_min_version_skip`]), and node selection
    /// (`harness::driver::Nodes`) then picks only such nodes.
    pub fn require_kubelet_version(&self, major: u32, minor: u32) -> SpecResult {
        match self.kubelet_min_version_skip(KubeVersion { major, minor, patch: 0 }) {
            None => Ok(()),
            Some(reason) => Err(SpecError::skip(reason)),
        }
    }

    /// Why no node can run a spec that needs kubelet `min`, or `None` if a ready schedulable
    /// node's kubelet is at least `min` (`1.34` means any v1.34 patch).
    pub fn kubelet_min_version_skip(&self, min: KubeVersion) -> Option<String> {
        let usable: Vec<&NodeInfo> = self.ready_nodes().filter(|n| n.schedulable).collect();
        if usable.iter().any(|n| n.kubelet().is_some_and(|v| v >= min)) {
            return None;
        }
        let wanted = if min.patch == 0 { format!("v{}.{}", min.major, min.minor) } else { min.to_string() };
        let found: Vec<String> =
            usable.iter().map(|n| format!("{} has {}", n.name, n.kubelet_version)).collect();
        Some(format!(
            "needs kubelet {wanted} or newer ({KUBELET_MIN_VERSION}:{}.{}{}), but {}",
            min.major,
            min.minor,
            if min.patch == 0 { String::new() } else { format!(".{}", min.patch) },
            if found.is_empty() { "no node is ready and schedulable".to_owned() } else { found.join(", ") }
        ))
    }

    /// Skips unless the API server is at least `major.minor`.
    pub fn require_server_version(&self, major: u32, minor: u32) -> SpecResult {
        match self.server() {
            Some(v) if v.minor_version() >= (major, minor) => Ok(()),
            _ => Err(SpecError::skip(format!(
                "needs an API server v{major}.{minor} or newer, the cluster runs {}",
                self.server_version
            ))),
        }
    }
}

/// Why the runner cannot use the cluster. Each message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The kubeconfig file cannot be read or used.
    #[error("cannot use the kubeconfig {path}: {reason}; pass --kubeconfig with a valid admin kubeconfig")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// No `--kubeconfig`, and neither `KUBECONFIG`, `~/.kube/config` nor an in-cluster config exists.
    #[error(
        "no kubeconfig found: KUBECONFIG is unset, ~/.kube/config cannot be used ({reason}) and this is not a pod in a cluster; pass --kubeconfig PATH or set KUBECONFIG, or start a cluster with `cargo xtask cluster up`"
    )]
    NoKubeconfig {
        /// What kube-rs tried.
        reason: String,
    },
    /// Connecting failed.
    #[error(
        "cannot reach the API server at {server}: {reason}; is the cluster running (`cargo xtask cluster up` starts one) and is the kubeconfig's server address right?"
    )]
    Unreachable {
        /// The API server URL.
        server: String,
        /// The root cause.
        reason: String,
    },
    /// The API server did not answer in time.
    #[error(
        "the API server at {server} did not answer within {secs}s; is the cluster running and is the kubeconfig's server address right?"
    )]
    Timeout {
        /// The API server URL.
        server: String,
        /// The preflight timeout.
        secs: u64,
    },
    /// The API server's certificate is not one the kubeconfig trusts (TLS refused it).
    #[error(
        "the API server at {server} is not trusted: {reason} (TLS: {detail}); set the kubeconfig's certificate-authority-data to this cluster's CA (the admin kubeconfig the cluster wrote has it) and check its server address"
    )]
    ServerNotTrusted {
        /// The API server URL.
        server: String,
        /// What is wrong with its certificate.
        reason: String,
        /// What TLS said.
        detail: String,
    },
    /// The kubeconfig's client certificate has expired, and the API server refused it.
    #[error(
        "the kubeconfig's client certificate expired on {expired}, and the API server at {server} refused it ({reason}); get a fresh kubeconfig for this cluster (its admin kubeconfig)"
    )]
    ClientCertificateExpired {
        /// The API server URL.
        server: String,
        /// When it expired.
        expired: String,
        /// What the API server said.
        reason: String,
    },
    /// The API server refused the kubeconfig's client certificate (not expired).
    #[error(
        "the API server at {server} does not accept the kubeconfig's client certificate ({reason}): it was not issued by this cluster's client CA; use this cluster's admin kubeconfig"
    )]
    ClientCertificateRefused {
        /// The API server URL.
        server: String,
        /// What the API server said.
        reason: String,
    },
    /// The API server refused the kubeconfig's token (401).
    #[error(
        "the API server at {server} refused the kubeconfig's token ({reason}): it has expired, was revoked or is another cluster's; put a valid token in the kubeconfig or use this cluster's admin kubeconfig"
    )]
    TokenRefused {
        /// The API server URL.
        server: String,
        /// What the API server said.
        reason: String,
    },
    /// The API server knows the kubeconfig's user but forbids what the run needs (403).
    #[error(
        "the API server at {server} forbids the kubeconfig's user what the run needs ({reason}); use an admin kubeconfig (a user bound to cluster-admin)"
    )]
    Forbidden {
        /// The API server URL.
        server: String,
        /// What the API server said.
        reason: String,
    },
    /// Authentication failed (401) with credentials that are neither a client certificate nor a
    /// token (or none at all).
    #[error(
        "the API server at {server} refused the kubeconfig's credentials ({reason}); use an admin kubeconfig"
    )]
    Unauthorized {
        /// The API server URL.
        server: String,
        /// The status message.
        reason: String,
    },
    /// An API group version the suite requires ([`Registry::require_api`](crate::Registry::require_api))
    /// is not served.
    #[error("the cluster at {server} does not serve {api} ({served}); {hint}")]
    MissingApi {
        /// The API server URL.
        server: String,
        /// The group version, e.g. `resource.k8s.io/v1`.
        api: String,
        /// What it serves of that group.
        served: String,
        /// What the suite needs, from its registration.
        hint: String,
    },
    /// Anything else the API server answered.
    #[error("preflight against {server} failed: {reason}")]
    Other {
        /// The API server URL.
        server: String,
        /// What failed.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn node(name: &str, kubelet: &str, ready: bool) -> NodeInfo {
        NodeInfo { name: name.into(), kubelet_version: kubelet.into(), ready, schedulable: true }
    }

    fn cluster() -> ClusterInfo {
        ClusterInfo {
            server: "https://127.0.0.1:6443".into(),
            server_version: "v1.37.2".into(),
            api_versions: ["v1", "resource.k8s.io/v1", "resource.k8s.io/v1beta1"].map(String::from).into(),
            nodes: vec![
                node("a", "v1.37.2", true),
                node("b", "v1.33.1", true),
                node("c", "v1.30.0", false),
                NodeInfo { schedulable: false, ..node("control-plane", "v1.38.0", true) },
            ],
            api_server_gates: None,
        }
    }

    #[test]
    fn feature_gates_are_read_from_the_metric_of_every_gate() {
        let text = "\
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name=\"ResourceHealthStatus\",stage=\"BETA\"} 1
kubernetes_feature_enabled{name=\"DRADeviceTaints\",stage=\"ALPHA\"} 0
kubernetes_feature_enabled{stage=\"\",name=\"DRAPrioritizedList\"} 1
other_metric{name=\"Foo\"} 0
";
        let gates = feature_gates_from_metrics(text);
        let want: BTreeMap<String, bool> =
            [("DRADeviceTaints", false), ("DRAPrioritizedList", true), ("ResourceHealthStatus", true)]
                .map(|(g, on)| (g.to_owned(), on))
                .into();
        assert_eq!(gates, want);
        let info = ClusterInfo { api_server_gates: Some(gates), ..cluster() };
        assert_eq!(info.api_server_gate("DRADeviceTaints"), Some(Some(false)));
        assert_eq!(info.api_server_gate("NoSuchGate"), Some(None));
        assert_eq!(cluster().api_server_gate("DRADeviceTaints"), None);
    }

    #[test]
    fn required_apis_fail_preflight_with_the_suites_hint() {
        let c = cluster();
        c.require_apis(&[("resource.k8s.io/v1".into(), "unused".into())]).unwrap();
        let err = c
            .require_apis(&[("resource.k8s.io/v2".into(), "the specs need resource.k8s.io/v2".into())])
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(
                "does not serve resource.k8s.io/v2 (it serves resource.k8s.io/v1, resource.k8s.io/v1beta1); the specs need resource.k8s.io/v2"
            ),
            "{err}"
        );
        let err = c.require_apis(&[("other.io/v1".into(), "hint".into())]).unwrap_err().to_string();
        assert!(err.contains("(no version of other.io is served); hint"), "{err}");
    }

    #[rstest]
    #[case("v1.37.2", Some((1, 37, 2)))]
    #[case("1.34", Some((1, 34, 0)))]
    #[case("v1.35.0-alpha.1+abc", Some((1, 35, 0)))]
    #[case("v1.36.1+k3s1", Some((1, 36, 1)))]
    #[case("garbage", None)]
    fn parses_versions(#[case] text: &str, #[case] expected: Option<(u32, u32, u32)>) {
        assert_eq!(
            KubeVersion::parse(text),
            expected.map(|(major, minor, patch)| KubeVersion { major, minor, patch })
        );
    }

    #[test]
    fn requirements_skip_with_reasons() {
        let c = cluster();
        assert!(c.require_api("resource.k8s.io/v1").is_ok());
        assert_eq!(
            c.require_api("resource.k8s.io/v1beta2").unwrap_err().skip_reason(),
            Some(
                "needs API resource.k8s.io/v1beta2, which the cluster does not serve (it serves resource.k8s.io/v1, resource.k8s.io/v1beta1)"
            )
        );
        assert!(c.require_nodes(3).is_ok());
        assert_eq!(
            c.require_nodes(4).unwrap_err().skip_reason(),
            Some("needs 4 ready nodes, the cluster has 3")
        );
        // One node new enough is enough: node selection takes that one.
        assert!(c.require_kubelet_version(1, 33).is_ok());
        assert!(c.require_kubelet_version(1, 37).is_ok());
        // The unschedulable control plane's newer kubelet does not count; neither does the
        // node that is not ready.
        assert_eq!(
            c.require_kubelet_version(1, 38).unwrap_err().skip_reason(),
            Some("needs kubelet v1.38 or newer (KubeletMinVersion:1.38), but a has v1.37.2, b has v1.33.1")
        );
        assert_eq!(
            c.kubelet_min_version_skip(KubeVersion { major: 1, minor: 37, patch: 3 }).as_deref(),
            Some(
                "needs kubelet v1.37.3 or newer (KubeletMinVersion:1.37.3), but a has v1.37.2, b has v1.33.1"
            )
        );
        assert!(c.require_server_version(1, 37).is_ok());
        assert!(c.require_server_version(1, 38).unwrap_err().is_skip());
    }

    #[rstest]
    #[case(&[], None)]
    #[case(&["Slow", "KubeletMinVersion:1.34"], Some((1, 34, 0)))]
    #[case(&["KubeletMinVersion:1.33", "KubeletMinVersion:1.36", "KubeletMinVersion: 1.35.2"], Some((1, 36, 0)))]
    #[case(&["KubeletMinVersion:1.35.2"], Some((1, 35, 2)))]
    #[case(&["KubeletMinVersion:soon", "FeatureGate:X"], None)]
    #[case(&["kubeletminversion:1.34"], None)]
    fn the_min_kubelet_version_is_the_highest_label(
        #[case] labels: &[&str],
        #[case] expected: Option<(u32, u32, u32)>,
    ) {
        let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        assert_eq!(
            kubelet_min_version(&labels),
            expected.map(|(major, minor, patch)| KubeVersion { major, minor, patch })
        );
    }
}
