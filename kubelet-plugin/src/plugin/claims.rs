//! Where the plugin reads ResourceClaims from during `NodePrepareResources`.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex},
};

use async_trait::async_trait;
use k8s_openapi::api::resource::v1::ResourceClaim;

/// A failed claim read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimSourceError {
    /// The claim does not exist. The message is the API server's, e.g.
    /// `resourceclaims.resource.k8s.io "my-claim" not found`.
    #[error("{0}")]
    NotFound(String),
    /// The plugin was started without API access.
    #[error("no kubeconfig: cannot read ResourceClaims (start the plugin with a kubeconfig)")]
    NoKubeconfig,
    /// Any other failure, with its message.
    #[error("{0}")]
    Other(String),
}

impl ClaimSourceError {
    /// The API server's message for a missing claim.
    pub fn not_found(name: &str) -> Self {
        ClaimSourceError::NotFound(format!("resourceclaims.resource.k8s.io \"{name}\" not found"))
    }
}

/// Reads `resource.k8s.io/v1` ResourceClaims.
#[async_trait]
pub trait ClaimSource: Send + Sync + fmt::Debug + 'static {
    /// Returns the claim `namespace/name` as currently stored.
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimSourceError>;
}

/// Reads claims from the API server with a `kube::Client`.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeClaims").finish_non_exhaustive()
    }
}

impl KubeClaims {
    /// Claims read with `client` (use an impersonating client to get a real
    /// plugin's rights).
    pub fn new(client: kube::Client) -> Self {
        KubeClaims { client }
    }
}

#[async_trait]
impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimSourceError> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        api.get(name).await.map_err(|e| match e {
            kube::Error::Api(status) if status.code == 404 => {
                ClaimSourceError::NotFound(status.message.clone())
            }
            kube::Error::Api(status) => ClaimSourceError::Other(if status.message.is_empty() {
                format!("API error {}", status.code)
            } else {
                status.message.clone()
            }),
            other => ClaimSourceError::Other(other.to_string()),
        })
    }
}

/// Fails every read with [`ClaimSourceError::NoKubeconfig`]: for a plugin
/// started without API access, where everything but prepare works.
#[derive(Clone, Debug, Default)]
pub struct NoClaims;

#[async_trait]
impl ClaimSource for NoClaims {
    async fn get(&self, _namespace: &str, _name: &str) -> Result<ResourceClaim, ClaimSourceError> {
        Err(ClaimSourceError::NoKubeconfig)
    }
}

/// Claims held in memory, for tests. Clones share the same set.
#[derive(Clone, Debug, Default)]
pub struct MemoryClaims {
    claims: Arc<Mutex<HashMap<(String, String), ResourceClaim>>>,
}

impl MemoryClaims {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), ResourceClaim>> {
        self.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds or replaces a claim (keyed by its namespace and name).
    pub fn insert(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.map().insert(key, claim);
    }

    /// Removes a claim.
    pub fn remove(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.map().remove(&(namespace.to_string(), name.to_string()))
    }
}

#[async_trait]
impl ClaimSource for MemoryClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimSourceError> {
        self.map()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ClaimSourceError::not_found(name))
    }
}
