//! PLACEHOLDER of the interposer's API, so that the driver-under-test specs compile; the real
//! module replaces this file at merge.

use kubelet_plugin::calls::{CallFilter, Calls, FaultGuard};

use crate::framework::Ctx;

/// Why interposing is impossible.
#[derive(Debug, thiserror::Error)]
pub enum InterposerError {
    /// This build has no interposer.
    #[error("this build has only a placeholder of the interposer")]
    Unavailable,
}

/// Stands between the kubelet and a real driver (placeholder).
pub struct Interposer {
    nodes: Vec<String>,
    calls: Calls,
}

impl Interposer {
    /// Registers in place of `driver` on `nodes` (placeholder: always fails).
    pub async fn start(_ctx: &Ctx, _driver: &str, nodes: &[String]) -> Result<Interposer, InterposerError> {
        let _unused = Interposer { nodes: nodes.to_vec(), calls: Calls::new() };
        Err(InterposerError::Unavailable)
    }

    /// The calls the kubelet made through the interposer on `node`.
    pub fn calls(&self, _node: &str) -> &Calls {
        &self.calls
    }

    /// Fails `method` on `node` until the guard drops.
    pub fn fail(&self, _node: &str, method: impl Into<CallFilter>) -> FaultGuard {
        self.calls.fail(method, tonic::Status::unavailable("placeholder"))
    }

    /// The nodes interposed.
    pub fn node_names(&self) -> &[String] {
        &self.nodes
    }
}
