//! The nodes of the local cluster, isolated the way a kind node container isolates them but
//! without an image: each node has its own network namespace (see [`super::netns`]), its own
//! persistent mount namespace in which every node-local path is bind-mounted from the node's
//! state directory, and its own cgroup root. Names, roles and IPs follow kind's defaults.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::common::layout::Layout;

/// kind's default cluster name, the prefix of its node names.
pub const CLUSTER_NAME: &str = "kind";
/// The first three octets of the private /24 of the node IPs (exists only inside the network
/// namespaces the cluster creates).
pub const NODE_SUBNET: [u8; 3] = [10, 89, 0];
/// The prefix length of the node network.
pub const NODE_PREFIX: u8 = 24;
/// The cgroup directory (in every hierarchy) under which each node has its cgroup root.
pub const CGROUP_PARENT: &str = "dra-e2e";
/// The most nodes the cluster supports (IPs .2 to .201, pod subnets 10.244.0-199.0/24).
pub const MAX_NODES: usize = 200;

/// One node of the local cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// 0 for the control plane, then the workers in order.
    pub index: usize,
    /// The node name as kind gives it: `kind-control-plane`, `kind-worker`, `kind-worker2`, ...
    pub name: String,
    /// The node IP on the cluster network.
    pub ip: Ipv4Addr,
    /// Whether this is the control-plane node (runs etcd, the apiserver, the controller manager
    /// and the scheduler in its network namespace).
    pub control_plane: bool,
}

impl NodeSpec {
    /// The node's network namespace name (`ip netns`).
    pub fn netns(&self) -> String {
        format!("dra-e2e-{}", self.name)
    }
    /// The path of the node's network namespace.
    pub fn netns_path(&self) -> PathBuf {
        Path::new("/run/netns").join(self.netns())
    }
    /// The pod subnet of the node's CNI bridge (kind uses 10.244.N.0/24).
    pub fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }
    /// The kubelet's cgroup root.
    pub fn cgroup_root(&self) -> String {
        format!("/{CGROUP_PARENT}/{}", self.name)
    }
    /// Supervisor name of this node's containerd.
    pub fn containerd(&self) -> String {
        format!("containerd-{}", self.name)
    }
    /// Supervisor name of this node's kubelet.
    pub fn kubelet(&self) -> String {
        format!("kubelet-{}", self.name)
    }
}

/// The nodes of a cluster of `count` nodes: one control plane and `count - 1` workers, named and
/// numbered as kind does.
pub fn cluster_nodes(count: usize) -> Vec<NodeSpec> {
    (0..count.clamp(1, MAX_NODES))
        .map(|index| {
            let name = match index {
                0 => format!("{CLUSTER_NAME}-control-plane"),
                1 => format!("{CLUSTER_NAME}-worker"),
                n => format!("{CLUSTER_NAME}-worker{n}"),
            };
            let [a, b, c] = NODE_SUBNET;
            let host = u8::try_from(index + 2).unwrap_or(u8::MAX);
            NodeSpec { index, name, ip: Ipv4Addr::new(a, b, c, host), control_plane: index == 0 }
        })
        .collect()
}

/// The control-plane node IP (where the kubelets reach the apiserver).
pub fn control_plane_ip() -> Ipv4Addr {
    let [a, b, c] = NODE_SUBNET;
    Ipv4Addr::new(a, b, c, 2)
}

/// A node's directories (under the cluster's state and run directories).
#[derive(Debug, Clone)]
pub struct NodeDirs {
    /// Persistent node state: `<state>/nodes/<name>`.
    pub state: PathBuf,
    /// Runtime state: `<run>/nodes/<name>`.
    pub run: PathBuf,
}

impl NodeDirs {
    /// The directories of `node` in `layout`.
    pub fn new(layout: &Layout, node: &NodeSpec) -> Self {
        Self {
            state: nodes_state_dir(layout).join(&node.name),
            run: layout.run.join("nodes").join(&node.name),
        }
    }
    /// The file pinning the node's mount namespace.
    pub fn mntns(&self) -> PathBuf {
        self.state.join("mntns")
    }
    /// containerd's persistent root.
    pub fn containerd_root(&self) -> PathBuf {
        self.state.join("containerd")
    }
    /// containerd's runtime state (task bundles).
    pub fn containerd_state(&self) -> PathBuf {
        self.run.join("containerd")
    }
    /// containerd's gRPC socket; the same path on the host and inside the node.
    pub fn containerd_socket(&self) -> PathBuf {
        self.containerd_state().join("containerd.sock")
    }
    /// runc's state directory.
    pub fn runc_root(&self) -> PathBuf {
        self.run.join("runc")
    }
    /// CNI configuration directory.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.state.join("cni")
    }
    /// host-local IPAM data.
    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.state.join("cni-ipam")
    }
    /// Component configuration files of the node.
    pub fn config(&self) -> PathBuf {
        self.state.join("config")
    }
    /// The node's `/var/lib/kubelet`, seen from the host.
    pub fn kubelet_root(&self) -> PathBuf {
        self.state.join("kubelet")
    }
    /// The node's `/var/run/cdi`, seen from the host.
    pub fn cdi_dir(&self) -> PathBuf {
        self.state.join("cdi")
    }
    /// The node's `/tmp`, seen from the host.
    pub fn tmp(&self) -> PathBuf {
        self.state.join("tmp")
    }

    /// Node-local paths: (source in the node's state, path inside the node's mount namespace).
    pub fn bind_mounts(&self) -> Vec<(PathBuf, PathBuf)> {
        let s = |p: &str| self.state.join(p);
        vec![
            (self.kubelet_root(), PathBuf::from("/var/lib/kubelet")),
            (self.cdi_dir(), PathBuf::from("/var/run/cdi")),
            (s("log-pods"), PathBuf::from("/var/log/pods")),
            (s("log-containers"), PathBuf::from("/var/log/containers")),
            (s("etc-cni"), PathBuf::from("/etc/cni/net.d")),
            (self.run.join("netns"), PathBuf::from("/run/netns")),
            (self.run.join("run-containerd"), PathBuf::from("/run/containerd")),
            (self.tmp(), PathBuf::from("/tmp")),
        ]
    }
}

/// The runc roots of every node directory under the run directory (whatever the recorded node
/// count says).
pub fn runc_roots_on_disk(layout: &Layout) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(layout.run.join("nodes")) else { return Vec::new() };
    let mut roots: Vec<PathBuf> =
        entries.filter_map(|e| e.ok()).map(|e| e.path().join("runc")).filter(|p| p.is_dir()).collect();
    roots.sort();
    roots
}

/// `<state>/nodes`: a private bind mount of itself, so mount namespaces can be pinned in it.
pub fn nodes_state_dir(layout: &Layout) -> PathBuf {
    layout.state.join("nodes")
}

/// The file recording which host mount points the cluster created (removed again by `down`).
fn created_mountpoints_file(layout: &Layout) -> PathBuf {
    layout.state.join("created-mountpoints")
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!("{program} {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Makes `<state>/nodes` a private mount (a bind mount of itself), which `unshare --mount=FILE`
/// needs for the pin files in it.
pub fn prepare_nodes_dir(layout: &Layout) -> Result<()> {
    let dir = nodes_state_dir(layout);
    fs::create_dir_all(&dir)?;
    let d = dir.display().to_string();
    run("mount", &["--bind", &d, &d])?;
    run("mount", &["--make-private", &d])
}

/// Creates the node's directories and its persistent mount namespace with every node-local path
/// bind-mounted from the node's state, and the sysfs that shows `cpus` CPUs when that is more
/// than the machine's `machine_cpus` (see [`super::node_cpus`]).
pub fn create_mount_namespace(
    layout: &Layout,
    node: &NodeSpec,
    cpus: usize,
    machine_cpus: &[usize],
) -> Result<()> {
    let dirs = NodeDirs::new(layout, node);
    for dir in [&dirs.state, &dirs.run, &dirs.containerd_root(), &dirs.containerd_state(), &dirs.runc_root()]
    {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let mut created = fs::read_to_string(created_mountpoints_file(layout)).unwrap_or_default();
    let mut args: Vec<String> = Vec::new();
    for (source, target) in dirs.bind_mounts() {
        fs::create_dir_all(&source).with_context(|| format!("create {}", source.display()))?;
        if !target.exists() {
            fs::create_dir_all(&target)
                .with_context(|| format!("create mount point {}", target.display()))?;
            created.push_str(&format!("{}\n", target.display()));
        }
        args.extend(["bind".to_string(), source.display().to_string(), target.display().to_string()]);
    }
    fs::write(created_mountpoints_file(layout), created)?;
    let sysfs = super::node_cpus::prepare(&dirs.state.join("sysfs"), cpus, machine_cpus)
        .with_context(|| format!("prepare the {cpus} CPUs of node {}", node.name))?;
    for mount in sysfs {
        let kind = if mount.recursive { "rbind" } else { "bind" };
        args.extend([
            kind.to_string(),
            mount.source.display().to_string(),
            mount.target.display().to_string(),
        ]);
    }
    fs::write(dirs.mntns(), b"")?;
    let pin = format!("--mount={}", dirs.mntns().display());
    let script = "set -e; while [ $# -gt 0 ]; do mount --$1 \"$2\" \"$3\"; shift 3; done";
    let mut cmd = vec![pin.as_str(), "--propagation", "private", "--", "sh", "-c", script, "sh"];
    cmd.extend(args.iter().map(String::as_str));
    run("unshare", &cmd).with_context(|| format!("create the mount namespace of node {}", node.name))
}

/// The command prefix that runs a program inside a node (its mount and network namespaces);
/// nsenter execs the program without forking, so the recorded PID is the program's.
pub fn enter_node(layout: &Layout, node: &NodeSpec) -> Vec<String> {
    vec![
        format!("--mount={}", NodeDirs::new(layout, node).mntns().display()),
        format!("--net={}", node.netns_path().display()),
        "--".into(),
    ]
}

/// The command prefix that runs a program in a node's network namespace only (the control-plane
/// components, which use the host's file system).
pub fn enter_net(node: &NodeSpec) -> Vec<String> {
    vec![format!("--net={}", node.netns_path().display()), "--".into()]
}

/// The cgroup v1 (and hybrid unified) hierarchies mounted under /sys/fs/cgroup.
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/fs/cgroup") else { return Vec::new() };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| !p.is_symlink() && p.join("cgroup.procs").is_file())
        .collect();
    found.sort();
    found
}

/// Creates the node's cgroup root in every hierarchy (the kubelet requires it to exist); cpuset
/// directories get their parent's CPUs and memory nodes.
pub fn create_cgroup_root(node: &NodeSpec) -> Result<()> {
    for hierarchy in hierarchies() {
        let parent = hierarchy.join(CGROUP_PARENT);
        let dir = parent.join(&node.name);
        fs::create_dir_all(&dir).with_context(|| format!("create cgroup {}", dir.display()))?;
        if hierarchy.join("cpuset.cpus").is_file() {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = fs::read_to_string(hierarchy.join(file))?;
                for d in [&parent, &dir] {
                    let current = fs::read_to_string(d.join(file)).unwrap_or_default();
                    if current.trim().is_empty() {
                        fs::write(d.join(file), value.trim())
                            .with_context(|| format!("write {}", d.join(file).display()))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Removes the cluster's cgroups (`dra-e2e` in every hierarchy), leaf first.
pub fn remove_cgroups() -> Vec<String> {
    let mut problems = Vec::new();
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(CGROUP_PARENT);
        if dir.is_dir()
            && let Err(e) = crate::host_cleanup::remove_cgroup_tree(&dir)
        {
            problems.push(format!("remove cgroup {}: {e}", dir.display()));
        }
    }
    problems
}

/// The cluster's cgroups that still exist.
pub fn leftover_cgroups() -> Vec<String> {
    hierarchies()
        .into_iter()
        .map(|h| h.join(CGROUP_PARENT))
        .filter(|d| d.exists())
        .map(|d| format!("cgroup {}", d.display()))
        .collect()
}

/// Removes the host mount points the cluster created (deepest first); one that another program
/// has put files in since is left, with a note.
pub fn remove_created_mountpoints(layout: &Layout) -> Vec<String> {
    let mut problems = Vec::new();
    let text = fs::read_to_string(created_mountpoints_file(layout)).unwrap_or_default();
    let mut paths: Vec<PathBuf> = text.lines().filter(|l| !l.trim().is_empty()).map(PathBuf::from).collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    paths.dedup();
    for path in paths {
        match fs::remove_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Another program uses the directory now (the run's Docker engine puts its
            // shims' sockets in /run/containerd/s): no longer only our mount point.
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => eprintln!(
                "    note: left the mount point {}: another program has put files in it since the cluster created it",
                path.display()
            ),
            Err(e) => problems.push(format!("remove mount point {}: {e}", path.display())),
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_mount_points_are_removed_unless_another_program_uses_them() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            repo: dir.path().into(),
            cache: dir.path().join("cache"),
            state: dir.path().join("state"),
            run: dir.path().join("run"),
        };
        let (empty, used) = (dir.path().join("empty"), dir.path().join("used"));
        fs::create_dir_all(used.join("s")).unwrap();
        fs::create_dir_all(&empty).unwrap();
        fs::create_dir_all(&layout.state).unwrap();
        let list =
            format!("{}\n{}\n{}\n", empty.display(), used.display(), dir.path().join("gone").display());
        fs::write(created_mountpoints_file(&layout), list).unwrap();
        assert_eq!(remove_created_mountpoints(&layout), Vec::<String>::new());
        assert!(!empty.exists() && used.join("s").is_dir());
    }

    #[test]
    fn names_and_addresses_follow_kind() {
        let nodes = cluster_nodes(4);
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["kind-control-plane", "kind-worker", "kind-worker2", "kind-worker3"]);
        assert_eq!(nodes[0].ip, control_plane_ip());
        assert_eq!(nodes[3].ip, Ipv4Addr::new(10, 89, 0, 5));
        assert!(nodes[0].control_plane && !nodes[1].control_plane);
        assert_eq!(nodes[2].pod_cidr(), "10.244.2.0/24");
        assert_eq!(nodes[1].cgroup_root(), "/dra-e2e/kind-worker");
        assert_eq!(cluster_nodes(0).len(), 1, "a cluster has at least its control plane");
    }

    #[test]
    fn node_paths_stay_in_the_node_state() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let node = &cluster_nodes(2)[1];
        let dirs = NodeDirs::new(&layout, node);
        for (source, target) in dirs.bind_mounts() {
            assert!(source.starts_with(&dirs.state) || source.starts_with(&dirs.run), "{}", source.display());
            assert!(target.is_absolute());
        }
        assert!(dirs.bind_mounts().iter().any(|(_, t)| t == Path::new("/var/lib/kubelet")));
        assert!(dirs.containerd_socket().starts_with(&dirs.run));
    }
}
