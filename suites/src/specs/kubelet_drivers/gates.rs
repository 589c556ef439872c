//! Which feature gates the cluster's components run with, read from their own
//! `kubernetes_feature_enabled{name="<gate>",stage="..."} 0|1` metric (every component exports it
//! for every gate it knows, with its effective state, defaults included).
//!
//! - The API server's `/metrics` is always reachable with the admin kubeconfig; preflight reads
//!   its gates once ([`ClusterInfo::api_server_gates`](harness::framework::ClusterInfo)). Its state of a
//!   gate decides what it stores (it drops `allocatedResourcesStatus` and its `message` from pod
//!   status, `firstAvailable` from claims, `sharedCounters` from slices when the gate is off).
//! - A kubelet's `/metrics` is read through the API server's node proxy
//!   (`/api/v1/nodes/<node>/proxy/metrics`). That does not always work: the API server refuses to
//!   proxy to loopback node addresses (`address not allowed`, e.g. the local single-node cluster
//!   whose node is `127.0.0.1`), and it needs the kubelet's serving port reachable. The kubelet's
//!   `configz` has the same reachability problem and lists only gates set explicitly, not
//!   defaults, so it is not used. When a kubelet cannot be asked, the specs infer its gates from
//!   what it does (see the health specs).
//!
//! A metric that is missing means the component does not know the gate: it was removed after
//! graduating (the feature is always on) or the component is older than the gate.
//!
//! Everything here takes a [`ClusterAccess`]: a spec's requirements (a `Precheck`, before the
//! spec's namespace exists) and its body (a `Ctx`) read gates the same way.

use harness::framework::{ClusterAccess, SpecError, SpecResult};
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
    let request = Request::new(path).get("metrics", &GetParams::default()).map_err(|e| e.to_string())?;
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

/// The state of `gate` in the kubelet of `node`, through the API server's node proxy.
pub(crate) async fn kubelet(from: &impl ClusterAccess, node: &str, gate: &str) -> Gate {
    let path = format!("/api/v1/nodes/{node}/proxy");
    match metrics(from, &path).await {
        Ok(text) => gate_from(&text, gate),
        Err(e) => Gate::Unknown(format!("GET {path}/metrics failed: {e}")),
    }
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

/// The kubelet of `node`'s state of `gate`; skips when it reports the gate off. The other states
/// (on, not reported, unknown) are the caller's to interpret.
pub(crate) async fn require_kubelet(from: &impl ClusterAccess, node: &str, gate: &str) -> SpecResult<Gate> {
    let state = kubelet(from, node, gate).await;
    tracing::info!(node, gate, ?state, "feature gate of the kubelet");
    if state.is_off() {
        return Err(SpecError::skip(format!("the kubelet of node {node} runs with feature gate {gate} off")));
    }
    Ok(state)
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
}
