//! The nodes of the local cluster (kind's default: one control plane, three workers) and where
//! a node's files are on the host.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;

/// The control-plane node (tainted NoSchedule).
pub const CONTROL_PLANE: &str = "kind-control-plane";
/// The workers.
pub const WORKERS: [&str; 3] = ["kind-worker", "kind-worker2", "kind-worker3"];
/// The worker most tests use.
pub const NODE: &str = "kind-worker";
/// Another worker, to check that NODE's things are NODE's only.
pub const OTHER_NODE: &str = "kind-worker2";

/// The cluster's state directory.
pub fn state_dir() -> PathBuf {
    std::env::var_os("DRA_E2E_LOCAL_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/dra-e2e/local"))
}

/// Where `path` (an absolute path as the node's kubelet and pods see it, under /var/lib/kubelet,
/// /var/run/cdi or /tmp) is on the host: in the node's state directory.
pub fn node_path(node: &str, path: &str) -> PathBuf {
    let state = state_dir().join("nodes").join(node);
    for (inside, dir) in [("/var/lib/kubelet", "kubelet"), ("/var/run/cdi", "cdi"), ("/tmp", "tmp")] {
        if let Ok(rest) = Path::new(path).strip_prefix(inside) {
            return state.join(dir).join(rest);
        }
    }
    panic!("{path} is not a node-local path this test knows")
}

/// The ctr binary the cluster was built with.
pub fn ctr() -> Result<PathBuf> {
    let dir = std::fs::read_to_string(state_dir().join("bin-dir")).context("read the cluster's bin-dir")?;
    Ok(PathBuf::from(dir.trim()).join("ctr"))
}

/// A node's containerd socket on the host.
pub fn containerd_socket(node: &str) -> PathBuf {
    PathBuf::from("/run/dra-e2e/nodes").join(node).join("containerd/containerd.sock")
}

/// `pod` bound to `node` (tolerating every taint, so the control plane works too).
pub fn on_node(mut pod: Pod, node: &str) -> Result<Pod> {
    let spec = pod.spec.as_mut().context("pod without spec")?;
    spec.node_name = Some(node.to_string());
    spec.tolerations = Some(serde_json::from_value(serde_json::json!([{"operator": "Exists"}]))?);
    Ok(pod)
}
