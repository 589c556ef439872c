//! Where the local cluster keeps things: build cache, state, sockets, and the fixed host paths the
//! kubelet and DRA use. Everything the cluster creates lives under these paths, so `cluster down`
//! knows exactly what to remove.

use std::path::PathBuf;

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
