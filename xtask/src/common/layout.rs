//! Where the local cluster keeps things: build cache, state, sockets, and the fixed host paths the
//! kubelet and DRA use. Everything the cluster creates lives under these paths, so `cluster down`
//! knows exactly what to remove.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Ports of the cluster's components. Only the apiserver's forwarder listens in the host's
/// network namespace (on 127.0.0.1); the others listen inside the nodes' namespaces.
pub mod ports {
    /// etcd client port.
    pub const ETCD_CLIENT: u16 = 2379;
    /// etcd peer port.
    pub const ETCD_PEER: u16 = 2380;
    /// kube-apiserver secure port.
    pub const APISERVER: u16 = 6443;
    /// kube-controller-manager secure port.
    pub const CONTROLLER_MANAGER: u16 = 10257;
    /// kube-scheduler secure port.
    pub const SCHEDULER: u16 = 10259;
    /// kubelet API port.
    pub const KUBELET: u16 = 10250;
    /// kubelet healthz port.
    pub const KUBELET_HEALTHZ: u16 = 10248;
    /// The ports the cluster uses on the host's 127.0.0.1, with their owners.
    pub const ALL: [(u16, &str); 1] = [(APISERVER, "the kube-apiserver forwarder")];
}

/// The directory of the older kubelets of the skew lane, under `xtask/local-cluster` (their Go
/// modules) and `<cache>/bin` (their builds, which [`crate::common::build::prune`] leaves alone).
pub const OLD_KUBELET_DIR: &str = "kubelet";

/// The directories and files of one local cluster.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The repository root.
    pub repo: PathBuf,
    /// Build outputs, keyed by the pinned versions (`$DRA_E2E_CACHE`, else `~/.cache/dra-e2e`).
    pub cache: PathBuf,
    /// Cluster state: PKI, configs, etcd data, containerd root, logs, PID records
    /// (`$DRA_E2E_LOCAL_STATE`, else `/var/lib/dra-e2e/local`).
    pub state: PathBuf,
    /// Runtime sockets (`/run/dra-e2e`).
    pub run: PathBuf,
}

impl Layout {
    /// The layout for this repository and the current environment.
    pub fn from_env(repo: PathBuf) -> Result<Self> {
        let cache = match std::env::var_os("DRA_E2E_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")));
                base.context("neither DRA_E2E_CACHE, XDG_CACHE_HOME nor HOME is set")?.join("dra-e2e")
            }
        };
        let state = std::env::var_os("DRA_E2E_LOCAL_STATE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/lib/dra-e2e/local"));
        Ok(Self { repo, cache, state, run: PathBuf::from("/run/dra-e2e") })
    }

    /// The Go modules that build the cluster (`xtask/local-cluster`).
    pub fn go_dir(&self) -> PathBuf {
        self.repo.join("xtask").join("local-cluster")
    }
    /// The admin kubeconfig users and tests connect with.
    pub fn kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }
    /// Certificates and keys.
    pub fn pki(&self) -> PathBuf {
        self.state.join("pki")
    }
    /// Component configuration files and kubeconfigs.
    pub fn config(&self) -> PathBuf {
        self.state.join("config")
    }
    /// Component logs.
    pub fn logs(&self) -> PathBuf {
        self.state.join("logs")
    }
    /// PID records of the processes the cluster started.
    pub fn pids(&self) -> PathBuf {
        self.state.join("pids")
    }
    /// etcd's data directory.
    pub fn etcd_data(&self) -> PathBuf {
        self.state.join("etcd")
    }
    /// Image tarballs built for import.
    pub fn images(&self) -> PathBuf {
        self.state.join("images")
    }
    /// Values of kernel settings before the kubelet changed them, restored by `down`.
    pub fn saved_sysctls(&self) -> PathBuf {
        self.state.join("sysctls.json")
    }
    /// The node count of the running cluster, written before anything is created.
    pub fn node_count_file(&self) -> PathBuf {
        self.state.join("node-count")
    }
    /// The gates and API versions the cluster runs with on top of kind.yaml's.
    pub fn overrides_file(&self) -> PathBuf {
        self.state.join("overrides")
    }
}

/// Reads the version a go.mod requires (or replaces to) for a module path.
pub fn go_mod_version(go_mod: &Path, module: &str) -> Result<String> {
    let text = std::fs::read_to_string(go_mod).with_context(|| format!("read {}", go_mod.display()))?;
    required_version(&text, module).with_context(|| format!("{} does not require {module}", go_mod.display()))
}

fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let first = words.next()?;
        let (path, version) =
            if first == "require" { (words.next()?, words.next()?) } else { (first, words.next()?) };
        (path == module && version.starts_with('v')).then(|| version.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_required_versions() {
        let go_mod = "module x\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/kubernetes v1.37.2\n\tgo.etcd.io/etcd/server/v3 v3.7.0 // indirect\n)\nrequire github.com/a/b v0.1.0\nreplace k8s.io/api => k8s.io/api v0.37.2\n";
        assert_eq!(required_version(go_mod, "k8s.io/kubernetes").as_deref(), Some("v1.37.2"));
        assert_eq!(required_version(go_mod, "go.etcd.io/etcd/server/v3").as_deref(), Some("v3.7.0"));
        assert_eq!(required_version(go_mod, "github.com/a/b").as_deref(), Some("v0.1.0"));
        assert_eq!(required_version(go_mod, "k8s.io/api"), None);
    }

    #[test]
    fn the_repository_pins_kubernetes_and_containerd() {
        let go_dir = crate::repo::repo_root().join("xtask/local-cluster");
        let k8s = go_mod_version(&go_dir.join("go.mod"), "k8s.io/kubernetes").unwrap();
        assert!(k8s.starts_with("v1."), "{k8s}");
        let containerd =
            go_mod_version(&go_dir.join("containerd/go.mod"), "github.com/containerd/containerd/v2").unwrap();
        assert!(containerd.starts_with("v2."), "{containerd}");
    }
}
