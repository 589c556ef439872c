//! The local provider: a real multi-node Kubernetes built from official Go modules and run as
//! child processes of xtask (no Docker, no image to pull; an image registry only with
//! `cluster up --registry`, see [`registry`]). By default it has the nodes
//! kind.yaml lists (one control plane and three workers, named as kind names them); `--nodes N`
//! overrides. Each node is a real kubelet with its own containerd, in its own network namespace
//! (a veth on the cluster bridge, a node IP that exists only inside the cluster's namespaces), its
//! own mount namespace (every node-local path bind-mounted from the node's state) and its own
//! cgroup root. etcd, kube-apiserver, kube-controller-manager and kube-scheduler run once, in the
//! control-plane node's network namespace; the host reaches the apiserver on 127.0.0.1:6443
//! through a forwarder. Pods have no default route; there is no kube-proxy and no DNS.
//!
//! Here: the [`LocalCluster`] type and the commands on it; `cluster up`'s decisions are in
//! [`bring_up`], the steps that start a new cluster in [`start`].

mod bring_up;
mod components;
mod host;
pub(crate) mod hugepages;
mod netns;
pub(crate) mod node_cpus;
mod nodes;
mod old_kubelet;
mod pki;
mod probes;
pub(crate) mod registry;
mod restart;
mod start;
mod status;
mod stop;
pub(crate) mod teardown;
mod tools;
mod wait;

use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail};
use kube::Client;

pub use crate::common::kube_module::parse_version as parse_k8s_version;
pub use netns::forward_command;
pub use tools::{kubectl_binary, load, running_kubeconfig};

use self::nodes::NodeSpec;
use crate::{
    cluster_config::ClusterConfig,
    common::{
        build::{self, Versions},
        kube_version::KubeVersion,
        layout::Layout,
        process::Supervisor,
    },
    kube_api::client_for,
    overrides::Overrides,
    repo::repo_root,
};

/// The control-plane components in start order (all in the control-plane node's network
/// namespace, except the forwarder, which listens on the host's 127.0.0.1:6443).
const CONTROL_PLANE: [&str; 5] =
    ["etcd", "kube-apiserver", "apiserver-forward", "kube-controller-manager", "kube-scheduler"];

/// The local cluster of this repository.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    layout: Layout,
    sup: Supervisor,
    nodes: Vec<NodeSpec>,
    /// Gates and API versions on top of kind.yaml's (recorded with the state while it runs).
    overrides: Overrides,
}

/// The node count kind.yaml lists.
pub fn default_node_count() -> Result<usize> {
    let config =
        ClusterConfig::load(&repo_root().join("kind.yaml")).context("read the node list from kind.yaml")?;
    Ok(config.node_roles.len())
}

impl LocalCluster {
    /// The local cluster with the default layout and `node_count` nodes (default: the recorded
    /// count of a running cluster, else kind.yaml's node list).
    pub fn new(node_count: Option<usize>) -> Result<Self> {
        let layout = Layout::from_env(repo_root())?;
        let sup = Supervisor::new(layout.pids(), layout.logs());
        let count = match node_count {
            Some(n) if n == 0 || n > nodes::MAX_NODES => {
                bail!("--nodes must be between 1 and {}, not {n}", nodes::MAX_NODES)
            }
            Some(n) => n,
            None => match recorded_node_count(&layout) {
                Some(n) => n,
                None => default_node_count()?,
            },
        };
        let overrides = recorded_overrides(&layout).unwrap_or_default();
        Ok(Self { layout, sup, nodes: nodes::cluster_nodes(count), overrides })
    }

    /// The same cluster with these gates and API versions on top of kind.yaml's; `None` keeps
    /// those of the running cluster.
    pub fn with_overrides(mut self, overrides: Option<Overrides>) -> Self {
        if let Some(overrides) = overrides {
            self.overrides = overrides;
        }
        self
    }

    /// The gates, API versions and releases the cluster runs (or will run) with.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The versions of what this cluster runs: the pinned release, `--k8s-version`'s or
    /// `--k8s-source`'s.
    fn versions(&self) -> Result<Versions> {
        Versions::for_cluster(
            &self.layout,
            self.overrides.k8s_version.as_ref(),
            self.overrides.k8s_source.as_deref(),
        )
    }

    /// The admin kubeconfig of the cluster.
    pub fn kubeconfig(&self) -> PathBuf {
        self.layout.kubeconfig()
    }

    /// The control-plane node.
    fn control_plane(&self) -> &NodeSpec {
        &self.nodes[0]
    }

    /// Every component's supervisor name: the control plane, then each node's containerd and
    /// kubelet.
    fn components(&self) -> Vec<String> {
        let mut names: Vec<String> = CONTROL_PLANE.iter().map(|s| s.to_string()).collect();
        for node in &self.nodes {
            names.push(node.containerd());
            names.push(node.kubelet());
        }
        names
    }

    /// Whether every component runs.
    fn all_running(&self) -> bool {
        self.components().iter().all(|name| self.sup.is_running(name))
    }

    /// Whether the cluster runs and its apiserver is ready.
    pub async fn is_up(&self) -> bool {
        self.all_running() && probes::readyz(self.kubeconfig()).await.unwrap_or(false)
    }

    /// Brings the cluster up; does nothing but report when it already runs with the same node
    /// count and overrides. A running cluster with another node count or other gates is stopped
    /// and recreated (and says so). With `with_registry`, the local registry is started too (see
    /// [`registry`]), also on a cluster that already runs, without restarting anything of it.
    pub async fn up(&self, with_registry: bool) -> Result<PathBuf> {
        let kubeconfig = self.up_cluster().await?;
        if with_registry {
            self.up_registry().await?;
        }
        Ok(kubeconfig)
    }

    /// Builds the registry if the cache lacks it and starts it on the running cluster.
    async fn up_registry(&self) -> Result<()> {
        let versions = self.versions()?;
        let bins = build::ensure_wanted(&self.layout, &versions, build::Wanted::Registry)?;
        registry::ensure(self, &bins).await
    }

    /// A client with the admin kubeconfig.
    pub async fn admin_client(&self) -> Result<Client> {
        client_for(&self.kubeconfig()).await
    }

    /// Prints which components run on which node, with their PIDs, the pods of each node, and the
    /// log tail of every component that died. True when everything runs and every node is Ready.
    pub async fn status(&self) -> Result<bool> {
        status::print(self).await
    }
}

/// The node count a cluster recorded when it was started.
fn recorded_node_count(layout: &Layout) -> Option<usize> {
    fs::read_to_string(layout.node_count_file()).ok()?.trim().parse().ok()
}

/// The overrides of the running (or last) cluster; `None` if none were recorded.
fn recorded_overrides(layout: &Layout) -> Option<Overrides> {
    let text = fs::read_to_string(layout.overrides_file()).ok()?;
    match Overrides::from_record(&text) {
        Ok(overrides) => Some(overrides),
        Err(err) => {
            eprintln!("warning: ignoring {}: {err:#}", layout.overrides_file().display());
            None
        }
    }
}

/// `cluster up --provider local [--nodes N] [--feature-gates …] [--runtime-config …]
/// [--registry]`: without flags, kind.yaml's nodes and settings.
pub async fn up(nodes: Option<usize>, overrides: Option<Overrides>, with_registry: bool) -> Result<PathBuf> {
    let count = match nodes {
        Some(n) => n,
        None => default_node_count()?,
    };
    LocalCluster::new(Some(count))?
        .with_overrides(Some(overrides.unwrap_or_default()))
        .up(with_registry)
        .await
}

/// `cluster build`: the cluster's binaries and the older kubelets `kubelet_versions` names,
/// built unless cached; starts nothing.
pub fn build(
    k8s_version: Option<&KubeVersion>,
    k8s_source: Option<&std::path::Path>,
    kubelet_versions: &[KubeVersion],
) -> Result<()> {
    let layout = Layout::from_env(repo_root())?;
    let versions = Versions::for_cluster(&layout, k8s_version, k8s_source)?;
    let bins = build::ensure(&layout, &versions)?;
    eprintln!(
        "==> the cluster's binaries (Kubernetes {}) are in {}",
        versions.kubernetes,
        bins.dir.display()
    );
    for version in kubelet_versions {
        let kubelet = old_kubelet::ensure(&layout, version)?;
        eprintln!("==> kubelet {version} is {}", kubelet.binary.display());
    }
    Ok(())
}

pub use restart::{Stop, restart};

/// `cluster down --provider local`.
pub async fn down() -> Result<()> {
    LocalCluster::new(None)?.down().await
}

/// `cluster status --provider local`.
pub async fn status() -> Result<bool> {
    LocalCluster::new(None)?.status().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_node_count_is_kind_yaml_s() {
        assert_eq!(default_node_count().unwrap(), 4);
    }
}
