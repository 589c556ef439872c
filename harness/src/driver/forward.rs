//! A driver that stands in for another one: [`ForwardResolver`] gives each node's plugin the
//! channel to the real driver's DRA endpoint (see [`DriverConfig::forward`](super::DriverConfig::forward)).

use std::fmt;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use crate::plugin::Forward;

/// Why a [`ForwardResolver`] found no driver to forward to.
pub type ForwardError = Box<dyn std::error::Error + Send + Sync>;

/// Finds, for one node, where its plugin forwards the kubelet's DRA calls to (the plugin then
/// runs in forward mode, see [`PluginBuilder::forward`](crate::plugin::PluginBuilder::forward)).
/// Called each time the node's plugin starts, also in a replacement proxy pod.
#[async_trait]
pub trait ForwardResolver: Send + Sync + fmt::Debug {
    /// The forward target of the plugin on `node`, whose proxy pod is `pod`.
    async fn resolve(&self, node: &str, pod: &Pod) -> Result<Forward, ForwardError>;
}
