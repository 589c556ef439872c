//! Which feature gates the cluster's components run with, read from their own
//! `kubernetes_feature_enabled{name="<gate>",stage="..."} 0|1` metric (every component exports it
//! for every gate it knows, with its effective state, defaults included).
//!
//! - The API server's `/metrics` is always reachable with the admin kubeconfig. Its state of a
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

use harness::framework::Ctx;
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
    let needle = format!("name=\"{gate}\"");
    text.lines()
        .filter(|line| line.starts_with("kubernetes_feature_enabled{"))
        .find(|line| {
            line.split_once('}')
                .is_some_and(|(labels, _)| labels.split([',', '{']).any(|label| label == needle))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value != 0.0)
}

fn gate_from(text: &str, gate: &str) -> Gate {
    match gate_from_metrics(text, gate) {
        Some(true) => Gate::On,
        Some(false) => Gate::Off,
        None => Gate::NotReported,
    }
}

/// GETs `<path>/metrics` from the API server.
async fn metrics(ctx: &Ctx, path: &str) -> Result<String, String> {
    let request = Request::new(path).get("metrics", &GetParams::default()).map_err(|e| e.to_string())?;
    ctx.client().request_text(request).await.map_err(|e| match e {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        e => e.to_string(),
    })
}

/// The API server's state of `gate`.
pub(crate) async fn api_server(ctx: &Ctx, gate: &str) -> Gate {
    match metrics(ctx, "").await {
        Ok(text) => gate_from(&text, gate),
        Err(e) => Gate::Unknown(format!("GET /metrics failed: {e}")),
    }
}

/// The state of `gate` in the kubelet of `node`, through the API server's node proxy.
pub(crate) async fn kubelet(ctx: &Ctx, node: &str, gate: &str) -> Gate {
    let path = format!("/api/v1/nodes/{node}/proxy");
    match metrics(ctx, &path).await {
        Ok(text) => gate_from(&text, gate),
        Err(e) => Gate::Unknown(format!("GET {path}/metrics failed: {e}")),
    }
}

/// Skips when the API server reports `gate` off; `why` says what the spec then cannot see.
pub(crate) async fn require_api_server(ctx: &Ctx, gate: &str, why: &str) -> harness::framework::SpecResult {
    let state = api_server(ctx, gate).await;
    tracing::info!(gate, ?state, "feature gate of the API server");
    if state.is_off() {
        return Err(ctx.skip(format!(
            "the API server runs with feature gate {gate} off ({why}); turn it on in kind.yaml's featureGates"
        )));
    }
    Ok(())
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
