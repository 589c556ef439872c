//! `cluster up`'s decisions around the start: whether the running cluster can stay or is
//! recreated (other nodes, other overrides, a rebuilt checkout), the leftovers of an earlier
//! cluster, the host's prerequisites, the build and what is recorded before the start, and the
//! clean-up of a failed start.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail};

use super::{
    LocalCluster, host, netns, nodes, old_kubelet, recorded_node_count, recorded_overrides, teardown,
};
use crate::{
    cluster_config::ClusterConfig,
    common::{
        build::{self, Binaries},
        layout::ports,
    },
    progress::Step,
    repo::repo_root,
};

impl LocalCluster {
    /// Brings the cluster up (see [`LocalCluster::up`]), without the registry.
    pub(super) async fn up_cluster(&self) -> Result<PathBuf> {
        let total = std::time::Instant::now();
        host::require_root()?;
        let recorded = recorded_node_count(&self.layout);
        let recorded_overrides = recorded_overrides(&self.layout).unwrap_or_default();
        let running = recorded.is_some_and(|n| {
            let same = Self { nodes: nodes::cluster_nodes(n), ..self.clone() };
            same.all_running()
        });
        // A checkout is built before anything else: its sources may have changed since the
        // running cluster was built from it.
        let checkout_build = match &self.overrides.k8s_source {
            Some(_) => {
                let running_kube = fs::read_to_string(self.layout.state.join("bin-dir"))
                    .ok()
                    .and_then(|dir| file_digest(&Binaries { dir: dir.into() }.kube()));
                let versions = self.versions()?;
                let bins = build::ensure(&self.layout, &versions)?;
                let changed = running_kube != file_digest(&bins.kube());
                Some((versions, bins, changed))
            }
            None => None,
        };
        let rebuilt = checkout_build.as_ref().is_some_and(|(_, _, changed)| *changed);
        if running && self.admin_client().await.is_ok() {
            let same_nodes = recorded == Some(self.nodes.len());
            let same = same_nodes && recorded_overrides == self.overrides;
            if same && rebuilt {
                eprintln!(
                    "==> the checkout's Kubernetes binaries changed: restarting the local cluster with them"
                );
            } else if same {
                eprintln!("the local cluster already runs ({} nodes, {})", self.nodes.len(), self.overrides);
                self.print_kubeconfig();
                return Ok(self.kubeconfig());
            } else if same_nodes {
                eprintln!(
                    "==> the local cluster runs with {recorded_overrides}, {} was asked for: stopping it and starting it again",
                    self.overrides
                );
            } else {
                eprintln!(
                    "==> the local cluster runs with {} nodes, {} were asked for: stopping it and starting it again with {}",
                    recorded.unwrap_or_default(),
                    self.nodes.len(),
                    self.nodes.len()
                );
            }
        }
        if !self.sup.recorded().is_empty()
            || self.layout.state.join("config").exists()
            || !netns::existing().is_empty()
        {
            eprintln!("==> found state of an earlier local cluster: cleaning it up first");
            let old = Self::new(recorded)?;
            old.down().await?;
        }
        let step =
            Step::start("check host prerequisites (root, go, libseccomp-dev, CNI plugins, busybox-static)");
        host::ensure_packages()?;
        check_ports(&ports::ALL)?;
        check_host_kubelet_root_free()?;
        step.done();

        let (versions, bins) = match checkout_build {
            Some((versions, bins, _)) => (versions, bins),
            None => {
                let versions = self.versions()?;
                let bins = build::ensure(&self.layout, &versions)?;
                (versions, bins)
            }
        };
        let kubelets = old_kubelet::for_nodes(
            &self.layout,
            &versions.kubernetes,
            &ClusterConfig::load(&repo_root().join("kind.yaml"))
                .context("read the node list from kind.yaml")?,
            self.nodes.len(),
            &self.overrides.kubelet_versions,
        )?;
        fs::create_dir_all(&self.layout.state)?;
        fs::write(self.layout.state.join("bin-dir"), bins.dir.display().to_string())?;
        // Recorded before anything is created, so `down` always knows which nodes to clean up.
        fs::write(self.layout.node_count_file(), self.nodes.len().to_string())?;
        fs::write(self.layout.overrides_file(), self.overrides.to_record())?;
        // Logs of the previous run stay until now, for debugging.
        if let Some(problem) = crate::host_cleanup::remove_dir(&self.layout.logs()) {
            bail!("{problem}");
        }

        match self.start(&bins, &versions, &kubelets).await {
            Ok(()) => {
                eprintln!(
                    "==> local cluster up: Kubernetes {} on {} nodes ({}) in {}",
                    versions.kubernetes,
                    self.nodes.len(),
                    self.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "),
                    crate::progress::human(total.elapsed())
                );
                self.print_kubeconfig();
                Ok(self.kubeconfig())
            }
            Err(err) => {
                eprintln!(
                    "==> cluster up failed; stopping what was started (logs stay in {})",
                    self.layout.logs().display()
                );
                if let Err(down_err) = self.down().await {
                    eprintln!("warning: clean-up after the failed start also failed: {down_err:#}");
                }
                Err(err)
            }
        }
    }

    fn print_kubeconfig(&self) {
        println!("{}", self.kubeconfig().display());
        eprintln!("    export KUBECONFIG={}", self.kubeconfig().display());
    }
}

fn check_ports(ports: &[(u16, &str)]) -> Result<()> {
    for &(port, owner) in ports {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!(
                "port {port} on 127.0.0.1, which {owner} needs, is in use by another process; stop that process (if it is a leftover of this cluster, run `cargo xtask cluster down --provider local`)"
            );
        }
    }
    Ok(())
}

/// Refuses to start while another kubelet uses the host's /var/lib/kubelet (the cluster's nodes
/// only use it as an empty mount point).
fn check_host_kubelet_root_free() -> Result<()> {
    let root = std::path::Path::new(teardown::HOST_KUBELET_ROOT);
    let busy = fs::read_dir(root).map(|mut d| d.next().is_some()).unwrap_or(false);
    if busy {
        bail!(
            "{} is not empty: another kubelet may use this machine (an earlier single-node version of this cluster? then run its `cluster down`); the nodes of the local cluster mount their own directory there",
            root.display()
        );
    }
    Ok(())
}

/// The SHA-256 of a file, `None` when it cannot be read.
fn file_digest(path: &std::path::Path) -> Option<Vec<u8>> {
    use sha2::Digest;
    let mut file = fs::File::open(path).ok()?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).ok()?;
    Some(hasher.finalize().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_names_the_port_and_its_component() {
        let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = check_ports(&[(port, "kube-apiserver")]).unwrap_err().to_string();
        assert!(err.contains(&format!("port {port}")), "{err}");
        assert!(err.contains("kube-apiserver"), "{err}");
        drop(taken);
        check_ports(&[(port, "kube-apiserver")]).unwrap();
    }
}
