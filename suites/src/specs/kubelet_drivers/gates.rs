//! Which feature gates the cluster's components run with, read from their own
//! `kubernetes_feature_enabled{name="<gate>",stage="..."} 0|1` metric (every component exports it
//! for every gate it knows, with its effective state, defaults included).
//!
//! - The API server's `/metrics` is always reachable with the admin kubeconfig; preflight reads
//!   its gates once ([`ClusterInfo::api_server_gates`](harness::framework::ClusterInfo)). Its state of a
//!   gate decides what it stores (it drops `allocatedResourcesStatus` and its `message` from pod
//!   status, `firstAvailable` from claims, `sharedCounters` from slices when the gate is off).
//! - A kubelet's `/metrics` is read through the API server's node proxy
//!   (`/api/v1/nodes/<node>/proxy/metrics`); when that fails, its configuration, `/configz`,
//!   through the same proxy: the gates it sets (`kubeletconfig.featureGates`, flags included),
//!   and for a gate it does not set, the gate's default at the kubelet's version (from
//!   [`versions::TABLES`](crate::versions::TABLES); a version without a table leaves it
//!   unknown). Neither works when the API server cannot reach the kubelet (it refuses to proxy to
//!   loopback node addresses, `address not allowed`, and needs the kubelet's serving port): the
//!   gate is then [`Gate::Unknown`], saying why, and a spec that needs it skips. A gate is never
//!   inferred from the behaviour a spec tests.
//!
//! A metric that is missing means the component does not know the gate: it was removed after
//! graduating (the feature is always on) or the component is older than the gate.
//!
//! Everything here takes a [`ClusterAccess`]: a spec's requirements (a `Precheck`, before the
//! spec's namespace exists) and its body (a `Ctx`) read gates the same way.

use harness::framework::{ClusterAccess, KubeVersion, SpecError, SpecResult};
use kube::{api::GetParams, core::Request};

/// What is known about one gate of one component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// The component reports the gate on.
    On,
    /// The component reports the gate off.
    Off,
    /// The component does not report the gate (removed after graduation, or too old).
    NotReported,
    /// The component could not be asked; the text says why.
    Unknown(String),
}

impl Gate {
    /// Whether the component reports the gate off.
    pub(crate) fn is_off(&self) -> bool {
        *self == Gate::Off
    }
}

/// The state of `gate` in Prometheus text exposition (`None` if the metric is not there).
pub(crate) fn gate_from_metrics(text: &str, gate: &str) -> Option<bool> {
    harness::framework::feature_gates_from_metrics(text).get(gate).copied()
}

fn gate_from(text: &str, gate: &str) -> Gate {
    match gate_from_metrics(text, gate) {
        Some(true) => Gate::On,
        Some(false) => Gate::Off,
        None => Gate::NotReported,
    }
}

/// GETs `<path>/metrics` from the API server.
async fn metrics(from: &impl ClusterAccess, path: &str) -> Result<String, String> {
    get_text(from, path, "metrics").await
}

/// GETs `<path>/<what>` from the API server.
async fn get_text(from: &impl ClusterAccess, path: &str, what: &str) -> Result<String, String> {
    let request = Request::new(path).get(what, &GetParams::default()).map_err(|e| e.to_string())?;
    from.client().request_text(request).await.map_err(|e| match e {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        e => e.to_string(),
    })
}

/// The API server's state of `gate`: as preflight read it, else asked now.
pub(crate) async fn api_server(from: &impl ClusterAccess, gate: &str) -> Gate {
    match from.cluster().api_server_gate(gate) {
        Some(Some(true)) => return Gate::On,
        Some(Some(false)) => return Gate::Off,
        Some(None) => return Gate::NotReported,
        None => {}
    }
    match metrics(from, "").await {
        Ok(text) => gate_from(&text, gate),
        Err(e) => Gate::Unknown(format!("GET /metrics failed: {e}")),
    }
}

/// The state of `gate` in the kubelet of `node`, through the API server's node proxy: from its
/// `/metrics`, else from its configuration (`/configz`, see [`gate_from_configz`]).
pub(crate) async fn kubelet(from: &impl ClusterAccess, node: &str, gate: &str) -> Gate {
    let path = format!("/api/v1/nodes/{node}/proxy");
    let metrics_failed = match metrics(from, &path).await {
        Ok(text) => return gate_from(&text, gate),
        Err(e) => format!("GET {path}/metrics failed: {e}"),
    };
    let version = from.cluster().nodes.iter().find(|n| n.name == node).and_then(|n| n.kubelet());
    match get_text(from, &path, "configz").await {
        Ok(text) => gate_from_configz(&text, gate, version)
            .unwrap_or_else(|why| Gate::Unknown(format!("{metrics_failed}; {path}/configz: {why}"))),
        Err(e) => Gate::Unknown(format!("{metrics_failed}; GET {path}/configz failed: {e}")),
    }
}

/// The state of `gate` in a kubelet's configuration as its `/configz` reports it
/// (`{"kubeletconfig": {..., "featureGates": {...}}}`): as set there, else its default at the
/// kubelet's `version`. `Err` says why it cannot be told.
pub(crate) fn gate_from_configz(
    text: &str,
    gate: &str,
    version: Option<KubeVersion>,
) -> Result<Gate, String> {
    let configz: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let config = configz.get("kubeletconfig").ok_or("no kubeletconfig in it")?;
    if let Some(set) = config.get("featureGates").and_then(|g| g.get(gate)) {
        return match set.as_bool() {
            Some(true) => Ok(Gate::On),
            Some(false) => Ok(Gate::Off),
            None => Err(format!("featureGates.{gate} is {set}, not a boolean")),
        };
    }
    let version =
        version.ok_or_else(|| format!("it does not set {gate}, and the kubelet's version is unknown"))?;
    default_at(version, gate).map(|on| if on { Gate::On } else { Gate::Off }).ok_or_else(|| {
        format!(
            "it does not set {gate}, and dra-e2e knows no default of it for a v{}.{} kubelet",
            version.major, version.minor
        )
    })
}

/// The default of `gate` at `version` (its minor release), from the gate tables: a gate the
/// table lists as removed is on (it graduated); `None` without a table or gate.
fn default_at(version: KubeVersion, gate: &str) -> Option<bool> {
    let table = crate::versions::TABLES.iter().find(|t| {
        KubeVersion::parse(t.version).is_some_and(|v| (v.major, v.minor) == (version.major, version.minor))
    })?;
    if table.removed.contains(&gate) {
        return Some(true);
    }
    table.gates.iter().find(|g| g.name == gate).map(|g| g.default)
}

/// Skips when the API server reports `gate` off; `why` says what the spec then cannot see.
pub(crate) async fn require_api_server(from: &impl ClusterAccess, gate: &str, why: &str) -> SpecResult {
    let state = api_server(from, gate).await;
    tracing::info!(gate, ?state, "feature gate of the API server");
    if state.is_off() {
        return Err(SpecError::skip(format!(
            "the API server runs with feature gate {gate} off ({why}); turn it on in kind.yaml's featureGates"
        )));
    }
    Ok(())
}

/// A requirement ([`Registry::requires`](harness::framework::Registry::requires)) that skips
/// the spec before anything is created when the API server reports `gate` off (see
/// [`require_api_server`]).
pub(crate) fn api_server_requirement(
    gate: &'static str,
    why: &'static str,
) -> impl Fn(harness::framework::Precheck) -> futures::future::BoxFuture<'static, SpecResult> + Send + Sync + 'static
{
    move |pre| Box::pin(async move { require_api_server(&pre, gate, why).await })
}

/// Skips unless the kubelet of `node` runs with `gate` on: off, not known to the kubelet, or
/// unknown (its metrics and configuration cannot be read), each said in the skip.
pub(crate) async fn require_kubelet(from: &impl ClusterAccess, node: &str, gate: &str) -> SpecResult {
    let state = kubelet(from, node, gate).await;
    tracing::info!(node, gate, ?state, "feature gate of the kubelet");
    kubelet_gate_on(node, gate, &state).map_err(SpecError::skip)
}

/// `Ok` when `state` is on, else why not, for a skip.
fn kubelet_gate_on(node: &str, gate: &str, state: &Gate) -> Result<(), String> {
    match state {
        Gate::On => Ok(()),
        Gate::Off => Err(format!("the kubelet of node {node} runs with feature gate {gate} off")),
        Gate::NotReported => Err(format!(
            "the kubelet of node {node} reports no state of feature gate {gate} (kubernetes_feature_enabled): it does not know the gate"
        )),
        Gate::Unknown(why) => Err(format!(
            "cannot tell whether the kubelet of node {node} runs with feature gate {gate} on: neither its metrics nor its configuration could be read ({why})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "\
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name=\"ResourceHealthStatus\",stage=\"BETA\"} 1
kubernetes_feature_enabled{name=\"ResourceHealthStatusMessage\",stage=\"BETA\"} 0
kubernetes_feature_enabled{stage=\"\",name=\"DRAPrioritizedList\"} 1
other_metric{name=\"Foo\"} 0
";

    #[test]
    fn reads_gates_from_metrics() {
        assert_eq!(gate_from_metrics(METRICS, "ResourceHealthStatus"), Some(true));
        assert_eq!(gate_from_metrics(METRICS, "ResourceHealthStatusMessage"), Some(false));
        assert_eq!(gate_from_metrics(METRICS, "DRAPrioritizedList"), Some(true));
        assert_eq!(gate_from_metrics(METRICS, "Foo"), None);
        assert_eq!(gate_from_metrics(METRICS, "ResourceHealth"), None);
        assert_eq!(gate_from(METRICS, "ResourceHealthStatusMessage"), Gate::Off);
        assert_eq!(gate_from("", "X"), Gate::NotReported);
    }

    /// Recorded from a kubelet of the local cluster (`/api/v1/nodes/kind-worker/proxy/configz`),
    /// shortened; `ResourceHealthStatusMessage` set off here, `DRAPrioritizedList` not set.
    const CONFIGZ: &str = r#"{"kubeletconfig":{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1",
        "enableServer":true,"address":"10.89.0.3","port":10250,"featureGates":{"DRAConsumableCapacity":true,
        "DRAOptionalNodeOperations":true,"ResourceHealthStatus":true,"ResourceHealthStatusMessage":false},
        "failCgroupV1":false}}"#;

    #[test]
    fn reads_gates_from_the_kubelets_configuration() {
        let v1_37 = KubeVersion { major: 1, minor: 37, patch: 0 };
        assert_eq!(gate_from_configz(CONFIGZ, "ResourceHealthStatus", Some(v1_37)), Ok(Gate::On));
        assert_eq!(gate_from_configz(CONFIGZ, "ResourceHealthStatusMessage", Some(v1_37)), Ok(Gate::Off));
        // Not set: the default of v1.37 (on); off by default: off.
        assert_eq!(gate_from_configz(CONFIGZ, "DRAPrioritizedList", Some(v1_37)), Ok(Gate::On));
        assert_eq!(gate_from_configz(CONFIGZ, "GenericWorkload", Some(v1_37)), Ok(Gate::Off));
        let old = KubeVersion { major: 1, minor: 30, patch: 0 };
        let unknown = gate_from_configz(CONFIGZ, "DRAPrioritizedList", Some(old)).unwrap_err();
        assert!(unknown.contains("knows no default of it for a v1.30 kubelet"), "{unknown}");
        assert!(
            gate_from_configz("{}", "ResourceHealthStatus", Some(v1_37))
                .unwrap_err()
                .contains("no kubeletconfig")
        );
        assert!(gate_from_configz("<html>", "ResourceHealthStatus", None).unwrap_err().contains("not JSON"));
    }

    /// The loophole of issue 47: a kubelet whose gate could not be read had it inferred from the
    /// behaviour the spec tests; now only on runs the spec, every other state skips saying why.
    #[test]
    fn only_a_gate_known_to_be_on_runs_the_spec() {
        assert_eq!(kubelet_gate_on("n", "G", &Gate::On), Ok(()));
        for (state, says) in [
            (Gate::Off, "runs with feature gate G off"),
            (Gate::NotReported, "does not know the gate"),
            (
                Gate::Unknown("GET failed".into()),
                "neither its metrics nor its configuration could be read (GET failed)",
            ),
        ] {
            let why = kubelet_gate_on("n", "G", &state).unwrap_err();
            assert!(why.contains(says), "{why}");
        }
    }
}
