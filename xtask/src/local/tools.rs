//! The local cluster's commands besides `up`, `down` and `status`: `cluster load` (image archives
//! into every node's containerd) and what `cargo xtask kubectl` needs (kubectl of the pinned
//! version, and the kubeconfig of a running cluster).

use std::{fs, path::PathBuf};

use anyhow::{Context, Result};

use super::{Layout, LocalCluster, host, nodes::NodeDirs};

use crate::common::{
    build::{self, Binaries, Versions},
    images,
};
use crate::{progress::Step, repo::repo_root};

/// The admin kubeconfig of the local cluster when it runs and its apiserver is ready.
pub async fn running_kubeconfig() -> Result<Option<PathBuf>> {
    let cluster = LocalCluster::new(None)?;
    Ok(cluster.is_up().await.then(|| cluster.kubeconfig()))
}

/// kubectl of the pinned Kubernetes version, built into the cluster's cache if missing.
pub fn kubectl_binary() -> Result<PathBuf> {
    let layout = Layout::from_env(repo_root())?;
    let versions = Versions::read(&layout)?;
    Ok(build::ensure_wanted(&layout, &versions, build::Wanted::Kubectl)?.kubectl())
}

/// `cluster load --provider local ARCHIVE...`: `ctr images import` of every archive into every
/// node's containerd, with the ctr of the running cluster's build.
pub async fn load(archives: &[PathBuf]) -> Result<()> {
    let cluster = LocalCluster::new(None)?;
    if !cluster.is_up().await {
        return Err(crate::usage::UsageError::new(
            "no local cluster is up to load images into; start it with `cargo xtask cluster up` first",
        )
        .into());
    }
    host::require_root()?;
    let recorded = cluster.layout.state.join("bin-dir");
    let dir = fs::read_to_string(&recorded).with_context(|| format!("read {}", recorded.display()))?;
    let bins = Binaries { dir: PathBuf::from(dir.trim()) };
    let sockets: Vec<PathBuf> =
        cluster.nodes.iter().map(|n| NodeDirs::new(&cluster.layout, n).containerd_socket()).collect();
    let step = Step::start(format!("import {} archive(s) into {} nodes", archives.len(), sockets.len()));
    let loaded = images::load(&bins, &sockets, archives)?;
    step.done();
    for (archive, names) in loaded {
        if names.is_empty() {
            eprintln!(
                "warning: {} holds no image name (RepoTags, or the OCI ref.name annotation): pods cannot refer to it",
                archive.display()
            );
        } else {
            eprintln!("    {}: {}", archive.display(), names.join(", "));
        }
    }
    Ok(())
}
