//! What can go wrong while a [`Driver`](super::Driver) is set up, used or torn down.

use super::impersonate::ImpersonationError;
use crate::{
    calls::CallsError, manifests::ManifestError, plugin::MetadataConfigError, proxied::ProxiedError,
    wait::WaitError,
};

/// Errors of setting up or using a [`Driver`](super::Driver).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was attempted.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The embedded manifests are broken.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// An impersonated client cannot be built.
    #[error(transparent)]
    Impersonation(#[from] ImpersonationError),
    /// A wait failed.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// The proxy pods do not match the chosen nodes.
    #[error(
        "expected one proxy pod of driver {driver} on each of {expected:?}, found pods on {found:?}; check the ReplicaSet's events"
    )]
    ProxyPods {
        /// The driver.
        driver: String,
        /// The chosen nodes.
        expected: Vec<String>,
        /// Nodes of the pods found.
        found: Vec<String>,
    },
    /// Forward mode found nothing to forward to on a node.
    #[error("driver {driver} on node {node}: {source}")]
    Forward {
        /// Driver name.
        driver: String,
        /// Node name.
        node: String,
        /// Why (from the [`ForwardResolver`](super::forward::ForwardResolver)).
        source: super::forward::ForwardError,
    },
    /// A proxied plugin did not start.
    #[error("cannot start the kubelet plugin of driver {driver} on node {node}: {source}")]
    Plugin {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: Box<ProxiedError>,
    },
    /// A kubelet did not register a plugin in time.
    #[error("driver {driver} was not registered by the kubelet of node {node}: {source}")]
    NotRegistered {
        /// The driver.
        driver: String,
        /// The node.
        node: String,
        /// The timeout with the node's call log.
        #[source]
        source: Box<CallsError>,
    },
    /// A proxy pod has no UID, which a rolling update needs for its socket names.
    #[error(
        "proxy pod {pod} of driver {driver} has no UID; the rolling update needs it for the socket names"
    )]
    MissingPodUid {
        /// The driver.
        driver: String,
        /// `namespace/name` of the pod.
        pod: String,
    },
    /// The device metadata configuration is not one upstream's helper accepts.
    #[error("driver {driver}: device metadata: {source}")]
    Metadata {
        /// The driver.
        driver: String,
        /// Why.
        #[source]
        source: MetadataConfigError,
    },
    /// The driver does not run on this node.
    #[error("driver {driver} does not run on node {node}; it runs on {nodes:?}")]
    UnknownNode {
        /// The driver.
        driver: String,
        /// The node asked for.
        node: String,
        /// The driver's nodes.
        nodes: Vec<String>,
    },
}

pub(super) fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DriverError {
    let what = what.into();
    move |source| DriverError::Api { what, source }
}
