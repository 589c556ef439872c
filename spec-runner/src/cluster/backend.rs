//! What the runner needs from a cluster, behind a small trait so the runner
//! core can be tested without Kubernetes. The production implementation is
//! [`KubeBackend`](crate::KubeBackend).

use std::{path::Path, time::Duration};

use async_trait::async_trait;

use crate::cluster::preflight::{ClusterInfo, PreflightError};

/// What a spec's namespace should look like.
#[derive(Debug, Clone)]
pub struct NamespaceRequest {
    /// `metadata.generateName`, e.g. `dra-registers-plugin-`.
    pub generate_name: String,
    /// The spec's full text (recorded as an annotation).
    pub full_text: String,
}

/// A namespace created for a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecNamespace {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`, to know when exactly this namespace is gone.
    pub uid: String,
}

/// Where to put a failed spec's cluster artifacts.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactRequest<'a> {
    /// The spec's namespace.
    pub namespace: &'a str,
    /// The spec's artifact folder (exists).
    pub dir: &'a Path,
}

/// A cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The API server returned an error.
    #[error("{what}: {source}")]
    Kube {
        /// What was attempted (`create namespace with generateName dra-x-`).
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// A wait ran out of time.
    #[error("timed out after {after} waiting for {what}")]
    Timeout {
        /// What was awaited (`namespace dra-x-abcde to be gone`).
        what: String,
        /// The timeout, for humans.
        after: String,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The cluster, as the runner uses it.
#[async_trait]
pub trait ClusterBackend: Send + Sync + 'static {
    /// Connects, discovers the served API versions and the nodes, and describes the cluster.
    async fn preflight(&self) -> Result<ClusterInfo, PreflightError>;

    /// The admin client specs get on their [`Ctx`](crate::Ctx).
    fn client(&self) -> kube::Client;

    /// Whether the run watches this cluster for disruptions (the API server not answering, a
    /// kubelet starting again) and names those a failed spec overlapped in its message. By
    /// default not (a backend without a real API server behind its client).
    fn watches_disruptions(&self) -> bool {
        false
    }

    /// The admin client for long-lived streams (port-forward tunnels, exec): by default the
    /// same as [`client`](Self::client).
    fn stream_client(&self) -> kube::Client {
        self.client()
    }

    /// Creates a spec's namespace (privileged pod security, labels marking it as ours).
    async fn create_namespace(&self, request: &NamespaceRequest) -> Result<SpecNamespace, ClusterError>;

    /// Deletes a spec's namespace (asks for it; an already-gone namespace is fine).
    async fn delete_namespace(&self, namespace: &SpecNamespace) -> Result<(), ClusterError>;

    /// Waits until a deleted namespace is gone, at most `timeout` (the runner does this as a
    /// deferred check, after the spec's worker slot is released).
    async fn wait_namespace_gone(
        &self,
        namespace: &SpecNamespace,
        timeout: Duration,
    ) -> Result<(), ClusterError>;

    /// Waits until no pod is left in a deleted namespace, at most `timeout`: what a later
    /// `[Serial]` spec must not share the nodes with. The runner waits for it as a settling
    /// deferred check, and for the namespace itself to be gone as an observation.
    async fn wait_namespace_pods_gone(
        &self,
        namespace: &SpecNamespace,
        timeout: Duration,
    ) -> Result<(), ClusterError>;

    /// Writes the cluster's view of a failed spec into `request.dir`
    /// (events, pods, container logs; suites add more as artifact sources). Returns the
    /// problems met; collection never changes a spec's outcome.
    async fn collect_artifacts(&self, request: ArtifactRequest<'_>) -> Vec<String>;
}
