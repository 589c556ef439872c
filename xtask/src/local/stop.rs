//! Stopping the local cluster and checking what a stopped cluster left behind: processes,
//! containers, mounts, ports, network namespaces, cgroups and state.

use std::{fs, path::PathBuf, time::Duration};

use anyhow::{Result, bail};

use super::{
    CONTROL_PLANE, LocalCluster, host, hugepages, netns,
    nodes::{self, NodeDirs, NodeSpec},
    registry, teardown,
};

use crate::common::{layout::ports, process};
use crate::progress::Step;

impl LocalCluster {
    /// What a stopped cluster would have left behind: running processes of its binaries, mounts
    /// below its paths, host listeners, network namespaces (with their veths and bridges), its
    /// cgroups and state. Empty when clean.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for name in self.sup.recorded() {
            if self.sup.is_running(&name) {
                left.push(format!("{name} still runs"));
            }
        }
        for dir in [self.layout.cache.join("bin"), self.layout.state.join("bin")] {
            for pid in crate::host_cleanup::processes_running_from(&dir) {
                left.push(format!("process {pid} runs a binary from {}", dir.display()));
            }
        }
        for mount in crate::host_cleanup::mounts_below(&teardown::cluster_mount_roots(&self.layout)) {
            left.push(format!("mount {}", mount.display()));
        }
        let registry_port = (registry::port(), "the local registry's forwarder");
        for (port, owner) in ports::ALL.into_iter().chain([registry_port]) {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                left.push(format!("port {port} ({owner}) is still in use"));
            }
        }
        for name in netns::existing() {
            left.push(format!("network namespace {name}"));
        }
        if let Ok(links) = fs::read_dir("/sys/class/net") {
            for link in links.filter_map(|e| e.ok()) {
                let name = link.file_name().to_string_lossy().into_owned();
                if name.starts_with("dra-e2e") {
                    left.push(format!("network link {name} in the host's namespace"));
                }
            }
        }
        left.extend(nodes::leftover_cgroups());
        left.extend(hugepages::leftover(&self.layout));
        if let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") {
            for h in hierarchies.filter_map(|e| e.ok()) {
                if h.path().join("kubepods").exists() {
                    left.push(format!("cgroup {}", h.path().join("kubepods").display()));
                }
            }
        }
        for dir in [
            PathBuf::from(teardown::HOST_KUBELET_ROOT),
            self.layout.run.clone(),
            nodes::nodes_state_dir(&self.layout),
            registry::state_dir(&self.layout),
        ] {
            if dir.exists() {
                left.push(format!("directory {}", dir.display()));
            }
        }
        left
    }

    /// Stops every process the cluster started (by recorded PID) and removes its containers,
    /// mounts, namespaces, links, cgroups and state. Safe to run at any point, also twice.
    pub async fn down(&self) -> Result<()> {
        host::require_root()?;
        let step = Step::start(format!("stop the local cluster ({} nodes)", self.nodes.len()));
        let mut problems: Vec<String> = Vec::new();
        let bin_dir = fs::read_to_string(self.layout.state.join("bin-dir")).ok().map(PathBuf::from);
        let grace = Duration::from_secs(15);

        for node in &self.nodes {
            if let Err(e) = self.sup.stop(&node.kubelet(), grace) {
                problems.push(format!("{e:#}"));
            }
        }
        if let Some(dir) = &bin_dir {
            for node in self.nodes.iter().filter(|n| self.sup.is_running(&n.containerd())) {
                // Not a problem by itself: what the CRI could not remove (a task whose start the
                // kubelet cancelled, say: "cannot delete running task") is removed by force
                // below, and whatever still is left is a problem of `leftovers`.
                if let Some(failed) = cri_reset(dir, &NodeDirs::new(&self.layout, node)) {
                    eprintln!("    note: {failed}; removing what is left by force");
                }
            }
        }
        let mut names: Vec<String> = vec![registry::FORWARD.into(), registry::REGISTRY.into()];
        names.extend(self.nodes.iter().map(NodeSpec::containerd));
        names.extend(CONTROL_PLANE.iter().rev().map(|s| s.to_string()));
        // Anything else recorded (an earlier layout's components) goes too.
        names.extend(self.sup.recorded());
        for name in names {
            if let Err(e) = self.sup.stop(&name, grace) {
                problems.push(format!("{e:#}"));
            }
        }
        if let Some(dir) = &bin_dir {
            // Every node's runc root on disk, also of nodes an interrupted run did not record.
            for runc_root in nodes::runc_roots_on_disk(&self.layout) {
                problems
                    .extend(crate::host_cleanup::delete_leftover_containers(&runc_root, &dir.join("runc")));
            }
            for pid in crate::host_cleanup::processes_running_from(dir) {
                if let Ok(start_time) = process::read_start_time(pid)
                    && let Err(e) = process::stop_process(
                        process::ProcessRecord { pid, start_time },
                        Duration::from_secs(5),
                    )
                {
                    problems.push(format!("leftover process {pid}: {e:#}"));
                }
            }
        }
        problems.extend(teardown::unmount_all(&self.layout));
        problems.extend(netns::delete_all());
        problems.extend(remove_cgroups_when_empty().await);
        problems.extend(teardown::remove_kubepods_cgroups());
        problems.extend(teardown::remove_bridge());
        problems.extend(hugepages::unmount_hugetlb(&self.layout));
        if let Err(e) = host::restore_sysctls(&self.layout) {
            problems.push(format!("{e:#}"));
        }
        problems.extend(nodes::remove_created_mountpoints(&self.layout));
        problems.extend(crate::host_cleanup::remove_dir(&self.layout.run));
        problems.extend(teardown::remove_state_except_logs(&self.layout)?);
        problems.extend(self.leftovers());
        if problems.is_empty() {
            step.done();
            Ok(())
        } else {
            step.finish("incomplete");
            bail!("cluster down could not remove everything:\n  {}", problems.join("\n  "))
        }
    }
}

/// Removes every pod's containers through the CRI of one node's containerd.
fn cri_reset(bin_dir: &std::path::Path, dirs: &NodeDirs) -> Option<String> {
    let endpoint = format!("unix://{}", dirs.containerd_socket().display());
    let out = std::process::Command::new(bin_dir.join("kube"))
        .args(["cri-reset", "--endpoint", &endpoint, "--timeout", "2m"])
        .output();
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "removing pods through the CRI at {endpoint} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run kube cri-reset: {e}")),
    }
}

/// Removes the cluster's cgroups; the kernel frees a cgroup a moment after its last process
/// exits, so busy ones are retried for a few seconds.
async fn remove_cgroups_when_empty() -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let problems = nodes::remove_cgroups();
        if problems.is_empty() || std::time::Instant::now() >= deadline {
            return problems;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
