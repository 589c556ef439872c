//! Removing what the cluster left on the machine besides its processes: containers that outlived
//! containerd, mounts, the kubelet's cgroups, the CNI bridge and the state directories. Each step
//! only touches paths and objects that belong to this cluster.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use super::components::BRIDGE;

use crate::common::layout::Layout;
use crate::host_cleanup::{mounts_below, remove_cgroup_tree};

/// The kubelet root of the single-node layout of earlier versions (a host directory then); now only
/// an empty mount point, inside each node's mount namespace a bind mount of the node's own.
pub const HOST_KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Unmounts everything below the cluster's paths (lazily, deepest first).
pub fn unmount_all(layout: &Layout) -> Vec<String> {
    let mut problems = Vec::new();
    for mount in mounts_below(&cluster_mount_roots(layout)) {
        if let Err(e) = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH) {
            problems.push(format!("unmount {}: {e}", mount.display()));
        }
    }
    problems
}

/// Where the cluster's mounts in the host's mount namespace live: the state directory (the node
/// mount namespaces' pins) and the run directory; the kubelet root of earlier versions.
pub fn cluster_mount_roots(layout: &Layout) -> Vec<PathBuf> {
    vec![PathBuf::from(HOST_KUBELET_ROOT), layout.run.clone(), layout.state.clone()]
}

/// The kubelet's cgroups (`kubepods` below every hierarchy), removed leaf first.
pub fn remove_kubepods_cgroups() -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") else { return problems };
    for hierarchy in hierarchies.filter_map(|e| e.ok()).map(|e| e.path()) {
        let kubepods = hierarchy.join("kubepods");
        if kubepods.is_dir()
            && let Err(e) = remove_cgroup_tree(&kubepods)
        {
            problems.push(format!("remove cgroup {}: {e}", kubepods.display()));
        }
    }
    problems
}

/// Deletes the CNI bridge in the host's namespace, which earlier single-node versions created.
pub fn remove_bridge() -> Option<String> {
    if !Path::new("/sys/class/net").join(BRIDGE).exists() {
        return None;
    }
    match Command::new("ip").args(["link", "delete", BRIDGE]).status() {
        Ok(s) if s.success() => None,
        _ => Some(format!("could not delete the network bridge {BRIDGE} (ip link delete {BRIDGE})")),
    }
}

/// Removes every entry of the state directory except the logs, which stay for debugging until
/// the next `cluster up`.
pub fn remove_state_except_logs(layout: &Layout) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let Ok(entries) = fs::read_dir(&layout.state) else { return Ok(problems) };
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        if path == layout.logs() {
            continue;
        }
        let result = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        if let Err(e) = result {
            problems.push(format!("remove {}: {e}", path.display()));
        }
    }
    Ok(problems)
}
