//! The specs' requirements on a simulated cluster, without a cluster: the registered specs run
//! on a backend whose API server answers the few reads a requirement makes (its `/metrics`, the
//! node list, a kubelet's `/metrics` through the node proxy, API discovery) and which counts the
//! namespaces the runner asks for. A cluster without the workload gates, with a v1.34 worker and a
//! v1.37 worker whose kubelet runs `ResourceHealthStatus` and `DRAOptionalNodeOperations` off:
//! every PodGroup, optional-node-operations and health spec is skipped before its namespace
//! exists, with the reason its body used to find only after creating one.
#![allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use harness::framework::{
    ArtifactRequest, ClusterBackend, ClusterError, ClusterInfo, NamespaceRequest, NodeInfo, Outcome, Output,
    PreflightError, Registry, RunOptions, Selection, SpecNamespace, run_with_backend,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The API server's gates: the workload ones off, the others on.
const SERVER_METRICS: &str = "\
kubernetes_feature_enabled{name=\"GenericWorkload\",stage=\"BETA\"} 0
kubernetes_feature_enabled{name=\"DRAWorkloadResourceClaims\",stage=\"BETA\"} 0
kubernetes_feature_enabled{name=\"DRAOptionalNodeOperations\",stage=\"ALPHA\"} 1
kubernetes_feature_enabled{name=\"DRADeviceTaints\",stage=\"BETA\"} 1
kubernetes_feature_enabled{name=\"ResourceHealthStatus\",stage=\"BETA\"} 1
kubernetes_feature_enabled{name=\"ResourceHealthStatusMessage\",stage=\"BETA\"} 1
";
/// The v1.37 worker's kubelet: `ResourceHealthStatus` off.
const KUBELET_METRICS: &str = "kubernetes_feature_enabled{name=\"ResourceHealthStatus\",stage=\"BETA\"} 0\n";

/// A Ready node as the API server returns it: `kubelet`'s version, the control-plane taint when
/// `tainted`, `declared` in `status.declaredFeatures` (also used by the optional-node-ops tests).
pub(crate) fn node(name: &str, kubelet: &str, declared: &[&str], tainted: bool) -> serde_json::Value {
    let taints = if tainted {
        json!([{ "key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule" }])
    } else {
        json!([])
    };
    json!({
        "metadata": { "name": name },
        "spec": { "taints": taints },
        "status": {
            "conditions": [{ "type": "Ready", "status": "True" }],
            "nodeInfo": { "kubeletVersion": kubelet, "machineID": "", "systemUUID": "", "bootID": "",
                "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64" },
            "declaredFeatures": declared,
        },
    })
}

const NODES: [(&str, &str, bool); 3] = [
    ("kind-control-plane", "v1.37.2", true),
    ("kind-worker", "v1.34.4", false),
    ("kind-worker2", "v1.37.2", false),
];

/// The simulated cluster; `namespaces` is every namespace the runner asked for.
#[derive(Default, Clone)]
struct Simulated {
    namespaces: Arc<Mutex<Vec<String>>>,
}

type Response = http::Response<http_body_util::Full<bytes::Bytes>>;

fn answer(path: &str) -> Response {
    let (code, body) = match path {
        "/metrics" => (200, SERVER_METRICS.to_owned()),
        "/api/v1/nodes/kind-worker2/proxy/metrics" => (200, KUBELET_METRICS.to_owned()),
        "/api/v1/nodes" => {
            let items: Vec<_> = NODES
                .iter()
                .map(|(n, v, cp)| node(n, v, if *cp { &["DRAOptionalNodeOperations"] } else { &[] }, *cp))
                .collect();
            (
                200,
                json!({ "apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items }).to_string(),
            )
        }
        _ => (
            404,
            json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("{path} not found"), "reason": "NotFound", "code": 404 })
            .to_string(),
        ),
    };
    http::Response::builder().status(code).body(body.into()).unwrap()
}

#[async_trait]
impl ClusterBackend for Simulated {
    async fn preflight(&self) -> Result<ClusterInfo, PreflightError> {
        Ok(ClusterInfo {
            server: "https://simulated".into(),
            server_version: "v1.37.2".into(),
            api_versions: ["v1".to_owned(), "resource.k8s.io/v1".to_owned()].into(),
            nodes: NODES
                .iter()
                .map(|(name, kubelet, cp)| NodeInfo {
                    name: (*name).into(),
                    kubelet_version: (*kubelet).into(),
                    ready: true,
                    schedulable: !cp,
                })
                .collect(),
            // As the real preflight reads them from the API server's /metrics.
            api_server_gates: Some(harness::framework::feature_gates_from_metrics(SERVER_METRICS)),
        })
    }

    fn client(&self) -> kube::Client {
        let service = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            Ok::<_, std::convert::Infallible>(answer(req.uri().path()))
        });
        kube::Client::new(service, "default")
    }

    async fn create_namespace(&self, request: &NamespaceRequest) -> Result<SpecNamespace, ClusterError> {
        let name = format!("{}x", request.generate_name);
        self.namespaces.lock().unwrap().push(name.clone());
        Ok(SpecNamespace { name, uid: "uid".into() })
    }

    async fn delete_namespace(&self, _: &SpecNamespace) -> Result<(), ClusterError> {
        Ok(())
    }

    async fn wait_namespace_gone(&self, _: &SpecNamespace, _: Duration) -> Result<(), ClusterError> {
        Ok(())
    }

    async fn wait_namespace_pods_gone(&self, _: &SpecNamespace, _: Duration) -> Result<(), ClusterError> {
        Ok(())
    }

    async fn collect_artifacts(&self, _: ArtifactRequest<'_>) -> Vec<String> {
        Vec::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmet_requirements_skip_before_any_namespace() {
    let mut registry = Registry::for_version(crate::versions::DEFAULT);
    super::register(&mut registry);
    let focus = ["PodGroup|DRAOptionalNodeOperations|FeatureGate:ResourceHealthStatus".to_owned()];
    let selection = Selection::new(&focus, &[], None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (output, _buffer) = Output::capture();
    let options = RunOptions {
        procs: 2,
        default_timeout: Duration::from_secs(30),
        artifacts: dir.path().join("artifacts"),
        output,
        seed: Some(1),
        ..RunOptions::default()
    };
    let backend = Simulated::default();
    let report =
        run_with_backend(registry, &selection, options, Arc::new(backend.clone()), CancellationToken::new())
            .await;

    let reason = |needle: &str| {
        let specs: Vec<_> = report.specs.iter().filter(|s| s.full_text.contains(needle)).collect();
        assert!(!specs.is_empty(), "no spec {needle:?}: {:?}", report.error);
        specs
            .iter()
            .map(|s| match &s.outcome {
                Outcome::Skipped { reason } => {
                    assert!(s.duration < Duration::from_millis(500), "{} took {:?}", s.full_text, s.duration);
                    reason.clone()
                }
                other => panic!("{} was not skipped: {other:?}", s.full_text),
            })
            .collect::<Vec<_>>()
    };
    // 2 PodGroup specs and the 3 PodGroup device-taint ones.
    let pod_groups = reason("PodGroup");
    assert_eq!(pod_groups.len(), 5, "{pod_groups:?}");
    for r in pod_groups {
        assert!(
            r.starts_with("the API server does not serve scheduling.k8s.io/v1beta1; start the cluster"),
            "{r}"
        );
    }
    let ops = reason("DRAOptionalNodeOperations");
    assert_eq!(ops.len(), 5, "{ops:?}");
    for r in ops {
        assert!(
            r.contains("kind-worker (kubelet v1.34.4) does not declare DRAOptionalNodeOperations"),
            "{r}"
        );
        let help = "the kubelets of kind-worker2 know the gate but run with it off: turn \
                    DRAOptionalNodeOperations (and NodeDeclaredFeatures) on for the kubelets in kind.yaml's featureGates";
        assert!(r.ends_with(help), "{r}");
    }
    // The health specs need kubelet v1.36: their node is kind-worker2, whose kubelet says off.
    let health = reason("FeatureGate:ResourceHealthStatus");
    assert_eq!(health.len(), 4, "{health:?}");
    for r in health {
        assert_eq!(r, "the kubelet of node kind-worker2 runs with feature gate ResourceHealthStatus off");
    }
    assert_eq!(*backend.namespaces.lock().unwrap(), Vec::<String>::new());
}
