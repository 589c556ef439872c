//! A cluster backend without a cluster, shared by the framework tests: one ready node with
//! kubelet v1.37.2, namespaces that exist only in a [`Journal`] of what the runner asked for.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use harness::framework::{
    ArtifactRequest, ClusterBackend, ClusterError, ClusterInfo, NamespaceRequest, NodeInfo, Output,
    PreflightError, Registry, RunOptions, RunReport, Selection, SpecNamespace, init_tracing,
    run_with_backend,
};
use tokio_util::sync::CancellationToken;

/// Runs `reg` at `-p procs` against a [`FakeCluster`] recording into `journal` (seed 7, specs'
/// timeout 30 s, output captured and dropped).
pub async fn run_recorded(
    reg: Registry,
    journal: &Journal,
    procs: usize,
    interrupt: CancellationToken,
) -> RunReport {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (output, _buffer) = Output::capture();
    let options = RunOptions {
        procs,
        default_timeout: Duration::from_secs(30),
        artifacts: dir.path().join("artifacts"),
        output,
        seed: Some(7),
        ..RunOptions::default()
    };
    run_with_backend(reg, &Selection::all(), options, Arc::new(FakeCluster::recording(journal)), interrupt)
        .await
}

/// What the runner asked the backend for, in order: `create <ns>`, `delete <ns>`, `gone <ns>`.
#[derive(Default, Clone)]
pub struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    /// Adds an entry (tests add their own between the backend's).
    pub fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }

    /// Every entry so far.
    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// The fake cluster.
#[derive(Default, Clone)]
pub struct FakeCluster {
    journal: Journal,
    /// Requests of its client never complete (else they fail at once).
    hang: bool,
}

impl FakeCluster {
    /// A cluster whose client's requests fail at once: specs that never talk to an API server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cluster whose client's requests never complete: a watch waits for its list forever.
    pub fn hanging() -> Self {
        Self { hang: true, ..Self::default() }
    }

    /// A cluster that records into `journal`.
    pub fn recording(journal: &Journal) -> Self {
        Self { journal: journal.clone(), ..Self::default() }
    }

    /// What the runner asked for so far.
    pub fn journal(&self) -> Vec<String> {
        self.journal.entries()
    }
}

type Response = http::Response<http_body_util::Empty<bytes::Bytes>>;

#[async_trait]
impl ClusterBackend for FakeCluster {
    async fn preflight(&self) -> Result<ClusterInfo, PreflightError> {
        Ok(ClusterInfo {
            server: "https://fake".into(),
            server_version: "v1.37.2".into(),
            api_versions: ["v1".to_owned(), "resource.k8s.io/v1".to_owned()].into(),
            nodes: vec![NodeInfo {
                name: "node".into(),
                kubelet_version: "v1.37.2".into(),
                ready: true,
                schedulable: true,
            }],
            api_server_gates: None,
        })
    }

    fn client(&self) -> kube::Client {
        let hang = self.hang;
        let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Err::<Response, _>(std::io::Error::other("no cluster in this test"))
        });
        kube::Client::new(service, "default")
    }

    async fn create_namespace(&self, request: &NamespaceRequest) -> Result<SpecNamespace, ClusterError> {
        let name = format!("{}x", request.generate_name);
        self.journal.push(format!("create {name}"));
        Ok(SpecNamespace { name, uid: "uid".into() })
    }

    async fn delete_namespace(&self, namespace: &SpecNamespace) -> Result<(), ClusterError> {
        self.journal.push(format!("delete {}", namespace.name));
        Ok(())
    }

    async fn wait_namespace_gone(&self, namespace: &SpecNamespace, _: Duration) -> Result<(), ClusterError> {
        self.journal.push(format!("gone {}", namespace.name));
        Ok(())
    }

    async fn wait_namespace_pods_gone(
        &self,
        namespace: &SpecNamespace,
        _: Duration,
    ) -> Result<(), ClusterError> {
        self.journal.push(format!("pods gone {}", namespace.name));
        Ok(())
    }

    async fn collect_artifacts(&self, _: ArtifactRequest<'_>) -> Vec<String> {
        Vec::new()
    }
}
