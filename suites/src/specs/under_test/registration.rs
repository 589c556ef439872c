//! h: the kubelet registered the driver's plugin, as the node shows it. DRA drivers do not
//! appear in CSINode; what the kubelet shows is its `/metrics` (read through the API server's
//! node proxy):
//!
//! - `plugin_manager_total_plugins{state="actual_state_of_world"}`: the sockets of
//!   `/var/lib/kubelet/plugins_registry` its plugin manager registered (pkg/kubelet/pluginmanager
//!   /metrics of v1.37.2). The socket names do not name the driver (the rolling-update names are
//!   hashes), so this shows that a registration happened, not whose.
//! - `dra_grpc_operations_duration_seconds_count{driver_name="NAME"}`: the kubelet's gRPC client of
//!   driver NAME, which exists only for a registered plugin, counts each call it made with the
//!   method and its gRPC status (pkg/kubelet/cm/dra/plugin/dra_plugin.go:152-156). A successful
//!   NodePrepareResources counted there while a pod with a claim of the driver started shows the
//!   kubelet had the driver registered and reached it.
//!
//! Interposed, the interposer found the driver's registration socket by asking each socket of
//! the registry (`GetInfo` answered with the driver's name) and the claim's NodePrepareResources
//! went through it to the driver (exactly one, OK). Upstream's e2e tells registration by its test
//! driver's recorded `GetInfo` and `NotifyRegistrationStatus` calls, which a driver under test
//! does not record.

use std::sync::Arc;

use harness::framework::{Ctx, SpecError, SpecResult, step};
use kube::ResourceExt as _;

use super::{
    super::kubelet_metrics::{self, Sample},
    Target,
    pods::start_pod,
    session::Session,
};

/// The kubelet's plugin manager metric.
const PLUGINS: &str = "plugin_manager_total_plugins";
/// The kubelet's count of DRA gRPC calls per driver, method and status.
const GRPC_CALLS: &str = "dra_grpc_operations_duration_seconds_count";
/// Where the kubelet's plugin manager finds registration sockets.
const REGISTRY: &str = "/var/lib/kubelet/plugins_registry/";

/// The registration sockets the kubelet's plugin manager registered (`actual_state_of_world`).
fn registered_sockets(metrics: &str) -> Vec<String> {
    let mut sockets: Vec<String> = kubelet_metrics::samples(metrics, PLUGINS)
        .iter()
        .filter(|s| s.label("state") == Some("actual_state_of_world") && s.value > 0.0)
        .filter_map(|s| s.label("socket_path").map(str::to_owned))
        .collect();
    sockets.sort();
    sockets
}

/// How many NodePrepareResources (any API version) of `driver` the kubelet counted as OK.
fn prepares_ok(metrics: &str, driver: &str) -> f64 {
    let is_prepare =
        |s: &Sample| s.label("method_name").is_some_and(|m| m.ends_with("/NodePrepareResources"));
    kubelet_metrics::samples(metrics, GRPC_CALLS)
        .iter()
        .filter(|s| s.has(&[("driver_name", driver), ("grpc_status_code", "OK")]) && is_prepare(s))
        .fold(0.0, |sum, s| sum + s.value)
}

/// The failure when the kubelet's `/metrics` cannot be read: the registration is then not
/// checked, which fails the spec (a check that cannot be made never passes; the kubeconfig the
/// driver suite needs is cluster-admin, so nodes/proxy is allowed and a kubelet that does not
/// answer is the cluster's fault, not a missing permission).
fn unreadable_metrics(driver: &str, node: &str, error: &str) -> SpecError {
    SpecError::Failed(anyhow::anyhow!(
        "the kubelet's registration of driver {driver} cannot be checked: its /metrics on node {node} cannot be \
         read through the API server's node proxy: {error}"
    ))
}

/// h: see the module documentation.
pub async fn registered(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let cannot_read = |e: String| unreadable_metrics(&target.driver, &s.node, &e);
    let before = kubelet_metrics::read(&ctx, &s.node).await.map_err(cannot_read)?;
    let sockets = registered_sockets(&before);
    let in_registry: Vec<&String> = sockets.iter().filter(|p| p.starts_with(REGISTRY)).collect();
    expect!(
        !in_registry.is_empty(),
        "the kubelet of node {} registered no plugin socket of {REGISTRY} ({PLUGINS}{{state=\"actual_state_of_world\"}} \
         lists {sockets:?}), so driver {} is not registered there",
        s.node,
        target.driver
    );
    step(format!("the kubelet of node {} registered the plugin sockets {in_registry:?}", s.node));

    let prepared_before = prepares_ok(&before, &target.driver);
    let running = start_pod(&s).await?;
    let after = kubelet_metrics::read(&ctx, &s.node).await.map_err(cannot_read)?;
    let prepared_after = prepares_ok(&after, &target.driver);
    let counted = prepared_after - prepared_before;
    if counted < 1.0 {
        fail!(
            "pod {} with claim {} runs, but the kubelet of node {} counted no successful NodePrepareResources of driver \
             {} meanwhile ({GRPC_CALLS}{{driver_name=\"{}\",grpc_status_code=\"OK\"}}: {prepared_before} before, \
             {prepared_after} after){}",
            running.pod.name_any(),
            running.claim.name_any(),
            s.node,
            target.driver,
            target.driver,
            s.call_log()
        );
    }
    let through = if s.calls().is_some() {
        "; through the interposer, exactly one NodePrepareResources of the claim reached the driver and succeeded"
    } else {
        ""
    };
    step(format!(
        "driver {} is registered with the kubelet of node {}, shown by: the kubelet's own client of the driver \
         counted {} successful NodePrepareResources while pod {} started{through}",
        target.driver,
        s.node,
        counted,
        running.pod.name_any()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# TYPE plugin_manager_total_plugins gauge
plugin_manager_total_plugins{socket_path="/var/lib/kubelet/plugins_registry/dra-x-reg.sock",state="actual_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/var/lib/kubelet/plugins_registry/dra-y-reg.sock",state="desired_state_of_world"} 1
dra_grpc_operations_duration_seconds_count{driver_name="d.example.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 3
dra_grpc_operations_duration_seconds_count{driver_name="d.example.com",grpc_status_code="Unknown",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1
dra_grpc_operations_duration_seconds_count{driver_name="d.example.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"} 2
dra_grpc_operations_duration_seconds_count{driver_name="e.example.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"} 5
"#;

    /// Issue 47: a metric that cannot be read fails its spec with the reason (it skipped).
    #[test]
    fn metrics_that_cannot_be_read_fail_the_spec() {
        let err = unreadable_metrics("d.example.com", "n1", "403 Forbidden");
        assert!(matches!(err, SpecError::Failed(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the kubelet's registration of driver d.example.com cannot be checked: its /metrics on node n1 cannot be \
             read through the API server's node proxy: 403 Forbidden"
        );
    }

    #[test]
    fn the_registered_sockets_are_the_actual_state_of_the_plugin_manager() {
        assert_eq!(registered_sockets(METRICS), ["/var/lib/kubelet/plugins_registry/dra-x-reg.sock"]);
        assert!(registered_sockets("").is_empty());
    }

    #[test]
    fn only_successful_prepares_of_the_driver_count() {
        assert_eq!(prepares_ok(METRICS, "d.example.com"), 3.0);
        assert_eq!(prepares_ok(METRICS, "e.example.com"), 5.0);
        assert_eq!(prepares_ok(METRICS, "f.example.com"), 0.0);
    }
}
