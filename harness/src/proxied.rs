//! A DRA kubelet plugin that runs in this process but is reached by the kubelet of a node through
//! a proxy pod on that node: two `hostpathplugin --proxy-endpoint` processes in the pod (DRA socket
//! and registration socket), each paired with a tunnel of pre-established port-forward
//! connections, and CDI files written into the pod through exec.
//!
//! (Interface agreed for the Driver; the implementation lands with the tunnel.)

use std::{future::Future, sync::Arc};

use k8s_openapi::api::core::v1::Pod;

use crate::{
    calls::Calls,
    plugin::{ClaimSource, HealthState, KubeletPlugin, PluginConfig},
};

/// Errors of starting a proxied plugin.
#[derive(Debug, thiserror::Error)]
pub enum ProxiedError {
    /// Not implemented yet.
    #[error("proxied plugins are not implemented yet")]
    NotImplemented,
}

/// What a proxied plugin needs.
pub struct ProxiedPluginSpec {
    /// Admin client: exec and port-forward into the proxy pod.
    pub client: kube::Client,
    /// The running proxy pod (namespace, name, first container, node name).
    pub pod: Pod,
    /// The plugin: driver name, node name, CDI dir as seen in the pod (`/cdi`), API versions.
    pub plugin: PluginConfig,
    /// Where prepare reads claims (the client impersonating the plugin's ServiceAccount).
    pub claims: Arc<dyn ClaimSource>,
    /// The node's call log, owned by the Driver.
    pub calls: Calls,
    /// The node's device health.
    pub health: HealthState,
}

/// A running proxied plugin.
#[derive(Debug)]
pub struct ProxiedPlugin {
    plugin: KubeletPlugin,
}

impl ProxiedPlugin {
    /// Starts the proxy processes, the tunnels and the plugin.
    pub async fn start(_spec: ProxiedPluginSpec) -> Result<ProxiedPlugin, ProxiedError> {
        Err(ProxiedError::NotImplemented)
    }

    /// The in-process plugin.
    pub fn plugin(&self) -> &KubeletPlugin {
        &self.plugin
    }

    /// Stops the plugin, closes every tunnel connection and stops the proxy processes (their
    /// sockets are removed).
    pub async fn stop(self) {
        self.plugin.stop().await;
    }

    /// Resolves (with a description) when the proxy pod was deleted or replaced.
    pub fn gone(&self) -> impl Future<Output = String> + Send + 'static {
        std::future::pending()
    }
}
