//! The interposer: the harness between the kubelet and a real DRA driver on some nodes.
//!
//! [`Interposer::start`] registers with each node's kubelet under the real driver's name, with
//! socket names of its own (rolling-update names after the proxy pod's UID, so they never
//! collide with the driver's). The kubelet (v1.33+) keeps every registration of a driver and
//! talks to the newest, so from then on its DRA calls reach the interposer, which records each
//! one (see [`Interposer::calls`]), fails those a [`FaultGuard`] names
//! ([`Interposer::fail`]) and forwards the rest to the driver's own DRA socket, answering with
//! the driver's exact response or error. The interposer publishes no ResourceSlices.
//!
//! It is a [`Driver`] in forward mode (see [`DriverConfig::forward`]): its proxy pods mount the
//! real driver's plugin directory and the plugin registry, and the interposer reaches the
//! driver's sockets through `/dra-e2e-dial` exec'd in them (see [`dial`]): first its
//! registration socket, found by asking each socket of the registry ([`discover`]), then its
//! DRA endpoint, over one HTTP/2 connection that is dialled again when it breaks.
//!
//! Teardown is registered on the [`Ctx`]: the interposer's plugins stop and remove their own
//! sockets only, the kubelet drops their registration and goes back to the driver.
//!
//! ```no_run
//! # async fn body(ctx: harness::framework::Ctx) -> harness::framework::SpecResult {
//! use harness::{calls::Method, interposer::Interposer};
//! let nodes = vec!["kind-worker2".to_owned()];
//! let interposer = Interposer::start(&ctx, "gpu.example.com", &nodes).await?;
//! // … run a pod with a claim of the driver …
//! let _fault = interposer.fail("kind-worker2", Method::NodePrepareResources);
//! # Ok(()) }
//! ```

pub mod dial;
pub mod discover;

use std::sync::Arc;

use crate::{
    calls::{CallFilter, Calls, FaultGuard},
    driver::{Driver, DriverConfig, DriverError, Nodes, resources},
    framework::Ctx,
};

/// Why [`Interposer::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum InterposerError {
    /// Interposing is impossible on a node.
    #[error("cannot interpose driver {driver} on node {node}: {reason}")]
    Impossible {
        /// The real driver's name.
        driver: String,
        /// The node.
        node: String,
        /// Why: e.g. no registration socket of the driver in the node's plugin registry, or no
        /// `/dra-e2e-dial` in the proxy image.
        reason: String,
    },
    /// A connection to a socket in a proxy pod could not be made.
    #[error("cannot connect to {socket} through proxy pod {pod}: {reason}")]
    Dial {
        /// The socket path (on the node and in the pod).
        socket: String,
        /// `namespace/name` of the proxy pod.
        pod: String,
        /// Why.
        reason: String,
    },
    /// Setting up the interposing driver (proxy pods, plugins, registration) failed.
    #[error(transparent)]
    Driver(Box<DriverError>),
}

impl From<DriverError> for InterposerError {
    /// A resolver's [`InterposerError`] comes back as itself; anything else is
    /// [`InterposerError::Driver`].
    fn from(error: DriverError) -> Self {
        match error {
            DriverError::Forward { driver, node, source } => match source.downcast::<InterposerError>() {
                Ok(error) => *error,
                Err(source) => {
                    InterposerError::Driver(Box::new(DriverError::Forward { driver, node, source }))
                }
            },
            other => InterposerError::Driver(Box::new(other)),
        }
    }
}

/// The harness registered in place of a real driver on some nodes (see the module
/// documentation).
#[derive(Clone, Debug)]
pub struct Interposer {
    driver: Driver,
    nodes: Vec<String>,
}

impl Interposer {
    /// Registers in place of the driver `driver` on each node in `nodes` and forwards every DRA
    /// call (v1 and v1beta1 DRAPlugin services, and the health stream if the driver serves it)
    /// to the driver's own DRA socket; teardown is registered on `ctx` (like [`Driver`]'s) and
    /// unregisters, so the kubelet goes back to the driver. Returns once every node's kubelet
    /// registered the interposer.
    pub async fn start(ctx: &Ctx, driver: &str, nodes: &[String]) -> Result<Interposer, InterposerError> {
        let resolver =
            discover::FindDriver { client: ctx.stream_client().clone(), driver: driver.to_owned() };
        let config = DriverConfig::kubelet(resources::none())
            .name(driver)
            .instance_suffix("-interposer")
            .rolling_update(true)
            .expect_slice_removal(false)
            .forward(Arc::new(resolver));
        let selected = Nodes::from_names(nodes.to_vec(), Vec::new());
        let started = Driver::start(ctx, &selected, config).await?;
        tracing::info!(%driver, ?nodes, "interposer registered");
        Ok(Interposer { driver: started, nodes: nodes.to_vec() })
    }

    /// The calls the kubelet made through the interposer on `node` (same type as
    /// [`Driver::calls`]).
    pub fn calls(&self, node: &str) -> &Calls {
        self.driver.calls(node)
    }

    /// Fails `method` on `node` until the guard drops (same as [`Driver::fail`]): the call is
    /// answered with the fault and not forwarded.
    pub fn fail(&self, node: &str, method: impl Into<CallFilter>) -> FaultGuard {
        self.driver.fail(node, method)
    }

    /// The nodes interposed.
    pub fn node_names(&self) -> &[String] {
        &self.nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolver_error_comes_back_as_itself() {
        let impossible = InterposerError::Impossible {
            driver: "d".into(),
            node: "n".into(),
            reason: "no registration socket".into(),
        };
        let wrapped =
            DriverError::Forward { driver: "d".into(), node: "n".into(), source: Box::new(impossible) };
        let back = InterposerError::from(wrapped);
        assert_eq!(back.to_string(), "cannot interpose driver d on node n: no registration socket");
        let other = DriverError::Forward { driver: "d".into(), node: "n".into(), source: "boom".into() };
        assert!(matches!(InterposerError::from(other), InterposerError::Driver(_)));
    }
}
