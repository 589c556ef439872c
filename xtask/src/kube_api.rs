//! Talking to a cluster from xtask: a client from a kubeconfig file, and node readiness.

use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};

/// Whether a node reports the condition Ready=True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A client for the cluster of `kubeconfig` (its current context).
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let file = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("cannot read kubeconfig {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("cannot use kubeconfig {}", kubeconfig.display()))?;
    Client::try_from(config).context("cannot create a Kubernetes client")
}
