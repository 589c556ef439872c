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
mod status;
mod stop;
pub(crate) mod teardown;
mod tools;
mod wait;

use std::{fs, net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

pub use crate::common::kube_module::parse_version as parse_k8s_version;
pub use netns::forward_command;
pub use tools::{kubectl_binary, load, running_kubeconfig};

use self::nodes::{NodeDirs, NodeSpec};
use crate::{
    cluster_config::ClusterConfig,
    common::{
        build::{self, Binaries, Versions},
        images,
        kube_version::KubeVersion,
        layout::{Layout, ports},
        process::Supervisor,
    },
    kube_api::{client_for, node_is_ready},
    overrides::Overrides,
    progress::Step,
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

    async fn up_cluster(&self) -> Result<PathBuf> {
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

    async fn start(
        &self,
        bins: &Binaries,
        versions: &Versions,
        kubelets: &[Option<old_kubelet::OldKubelet>],
    ) -> Result<()> {
        let mut cluster = self.overrides.apply(
            ClusterConfig::load(&repo_root().join("kind.yaml"))
                .context("read feature gates and runtime-config from kind.yaml")?,
        );
        if !self.overrides.is_empty() {
            eprintln!("==> on top of kind.yaml: {}", self.overrides);
        }
        if self.overrides.k8s_version.is_some() || self.overrides.k8s_source.is_some() {
            // kind.yaml names the gates of the pinned release; another release may have removed
            // or locked some of them, and a component refuses a gate it does not list.
            let known = build::known_gates(bins)?;
            let (kept, dropped) = crate::skew::known_gates(&cluster.feature_gates, &known);
            if !dropped.is_empty() {
                eprintln!(
                    "    Kubernetes {} does not take the gates {} (removed or locked): left out",
                    versions.kubernetes,
                    dropped.join(", ")
                );
            }
            cluster.feature_gates = kept;
        }
        let step = Step::start("generate certificates and kubeconfigs");
        let pki = pki::ensure(&self.layout, &self.nodes)?;
        step.done();

        host::save_sysctls(&self.layout)?;
        let mib = self.overrides.node_hugepages_mib();
        if mib > 0 {
            let step = Step::start(format!("reserve {mib} MiB of 2 MiB hugepages for the nodes"));
            let outcome = match hugepages::reserve(&self.layout, mib)? {
                hugepages::Reserved::Refused(why) => format!("refused: {why}"),
                hugepages::Reserved::Pool { mib } => format!("the pool holds {mib} MiB"),
            };
            step.finish(&outcome);
        }

        let step = Step::start(format!(
            "create the cluster network and {} nodes (network and mount namespaces, cgroup roots)",
            self.nodes.len()
        ));
        netns::create(&self.nodes)?;
        nodes::prepare_nodes_dir(&self.layout)?;
        let machine_cpus = node_cpus::machine_cpus()?;
        for node in &self.nodes {
            nodes::create_mount_namespace(&self.layout, node, self.overrides.node_cpus(), &machine_cpus)?;
            nodes::create_cgroup_root(node)?;
        }
        step.done();
        let cp = self.control_plane();
        let in_cp = netns::Connector::new(&cp.netns_path())?;
        let local = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));

        let step = Step::start(format!("start etcd {}", versions.etcd));
        self.sup.start(&components::etcd(bins, &self.layout, cp))?;
        wait::until("healthy", Duration::from_secs(60), Some((&self.sup, "etcd")), || {
            probes::etcd_healthy(&in_cp)
        })
        .await?;
        step.done();

        let step = Step::start(format!(
            "start kube-apiserver on {} (127.0.0.1:{} on the host)",
            cp.ip,
            ports::APISERVER
        ));
        self.sup.start(&components::apiserver(bins, &pki, &cluster, cp))?;
        self.sup.start(&components::forwarder(&self.layout, cp)?)?;
        let kubeconfig = self.kubeconfig();
        wait::until("ready (/readyz)", Duration::from_secs(120), Some((&self.sup, "kube-apiserver")), || {
            probes::readyz(kubeconfig.clone())
        })
        .await?;
        let client = self.admin_client().await?;
        probes::grant_apiserver_kubelet_access(&client).await?;
        step.done();

        let step = Step::start("start kube-controller-manager");
        self.sup.start(&components::controller_manager(bins, &self.layout, &pki, &cluster, cp))?;
        let forward = netns::LocalForward::start(&cp.netns_path(), local(ports::CONTROLLER_MANAGER)).await?;
        wait::until("healthy", Duration::from_secs(90), Some((&self.sup, "kube-controller-manager")), || {
            probes::component_healthz(&forward)
        })
        .await?;
        step.done();

        let step = Step::start("start kube-scheduler");
        self.sup.start(&components::scheduler(bins, &self.layout, &cluster, cp)?)?;
        let forward = netns::LocalForward::start(&cp.netns_path(), local(ports::SCHEDULER)).await?;
        wait::until("healthy", Duration::from_secs(90), Some((&self.sup, "kube-scheduler")), || {
            probes::component_healthz(&forward)
        })
        .await?;
        drop(forward);
        step.done();

        let step = Step::start(format!("start containerd {} on every node (CDI on)", versions.containerd));
        for node in &self.nodes {
            self.sup.start(&components::containerd(bins, &self.layout, node)?)?;
        }
        for node in &self.nodes {
            let socket = NodeDirs::new(&self.layout, node).containerd_socket();
            let ctr_bins = bins.clone();
            wait::until(
                &format!("serving on {}", socket.display()),
                Duration::from_secs(60),
                Some((&self.sup, &node.containerd())),
                || {
                    let (bins, socket) = (ctr_bins.clone(), socket.clone());
                    async move { Ok(images::ctr(&bins, &socket, &["version"]).is_ok()) }
                },
            )
            .await?;
        }
        step.done();

        let step = Step::start(
            "build the pause, busybox, hostpathplugin and sample device plugin images and import them into every node",
        );
        let sockets: Vec<PathBuf> =
            self.nodes.iter().map(|n| NodeDirs::new(&self.layout, n).containerd_socket()).collect();
        images::build_and_import(bins, &self.layout, &sockets)?;
        step.done();

        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let step = Step::start(format!(
            "start kubelet {} (cgroup v1 allowed)",
            old_kubelet::describe(&names, kubelets, &versions.kubernetes)
        ));
        // Whole seconds: the kubelet's heartbeat times carry no fraction.
        let started =
            k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())?;
        for (node, old) in self.nodes.iter().zip(kubelets) {
            self.sup.start(&components::kubelet(
                bins,
                &self.layout,
                &pki,
                &cluster,
                node,
                self.nodes.len(),
                old.as_ref(),
            )?)?;
        }
        let api: Api<Node> = Api::all(client.clone());
        for (node, old) in self.nodes.iter().zip(kubelets) {
            // A restarted cluster keeps its Node objects: the old one reads Ready with the last
            // run's kubelet version until this kubelet posts its first status, and a kubelet
            // that first posted NotReady leaves the not-ready taint until the node lifecycle
            // controller's next pass, which a test that picks its nodes right away would meet.
            let version = old.as_ref().map_or(&versions.kubernetes, |k| &k.version).to_string();
            wait::until(
                &format!(
                    "node {} Ready since its kubelet {version} started, without a not-ready taint",
                    node.name
                ),
                Duration::from_secs(180),
                Some((&self.sup, &node.kubelet())),
                || node_ready(api.clone(), node.name.clone(), version.clone(), started),
            )
            .await?;
        }
        let label = serde_json::json!({"metadata": {"labels": {components::CONTROL_PLANE_LABEL: ""}}});
        api.patch(&cp.name, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .with_context(|| format!("label node {} as the control plane", cp.name))?;
        step.done();

        let step = Step::start("check that the resourceclaim controller generates claims");
        let probe = probes::ClaimControllerProbe::new(client.clone());
        let result = wait::until(
            "a ResourceClaim generated for a probe pod",
            Duration::from_secs(90),
            Some((&self.sup, "kube-controller-manager")),
            || probe.claim_generated(),
        )
        .await;
        probe.clean_up().await;
        result?;
        step.done();
        Ok(())
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

/// True when node `name`'s kubelet reports `kubelet_version`, posted Ready at or after
/// `since`, and the node carries no not-ready or unreachable taint.
async fn node_ready(
    nodes: Api<Node>,
    name: String,
    kubelet_version: String,
    since: k8s_openapi::jiff::Timestamp,
) -> Result<bool> {
    Ok(nodes.get_opt(&name).await?.is_some_and(|node| node_up_since(&node, &kubelet_version, since)))
}

/// Taints the node lifecycle controller sets while a node is not (yet) Ready.
const NOT_READY_TAINTS: [&str; 2] = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"];

/// See [`node_ready`].
fn node_up_since(node: &Node, kubelet_version: &str, since: k8s_openapi::jiff::Timestamp) -> bool {
    let status = node.status.as_ref();
    let reported = status.and_then(|s| s.node_info.as_ref()).map(|i| i.kubelet_version.as_str());
    let heartbeat = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0);
    node_untainted_ready(node) && reported == Some(kubelet_version) && heartbeat.is_some_and(|t| t >= since)
}

/// Whether the node is Ready and carries no not-ready or unreachable taint.
fn node_untainted_ready(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| NOT_READY_TAINTS.contains(&t.key.as_str())));
    node_is_ready(node) && !tainted
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
    fn a_port_in_use_names_the_port_and_its_component() {
        let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = check_ports(&[(port, "kube-apiserver")]).unwrap_err().to_string();
        assert!(err.contains(&format!("port {port}")), "{err}");
        assert!(err.contains("kube-apiserver"), "{err}");
        drop(taken);
        check_ports(&[(port, "kube-apiserver")]).unwrap();
    }

    #[test]
    fn the_default_node_count_is_kind_yaml_s() {
        assert_eq!(default_node_count().unwrap(), 4);
    }

    #[test]
    fn a_node_is_up_once_its_kubelet_posted_ready_since_it_started_and_the_taint_is_gone() {
        let node = |version: &str, heartbeat: i64, taint: Option<&str>| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "kind-worker"},
                "spec": {"taints": taint.map(|key| vec![serde_json::json!({"key": key, "effect": "NoSchedule"})]).unwrap_or_default()},
                "status": {
                    "nodeInfo": {"kubeletVersion": version, "architecture": "", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "", "osImage": "", "systemUUID": ""},
                    "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::from_second(heartbeat).unwrap().to_string()}],
                },
            }))
            .unwrap()
        };
        let since = k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap();
        assert!(node_up_since(&node("v1.34.4", 1_000, None), "v1.34.4", since));
        assert!(!node_up_since(&node("v1.37.2", 1_000, None), "v1.34.4", since), "the last run's kubelet");
        assert!(
            !node_up_since(&node("v1.34.4", 999, None), "v1.34.4", since),
            "a status from before the start"
        );
        assert!(!node_up_since(
            &node("v1.34.4", 1_001, Some("node.kubernetes.io/not-ready")),
            "v1.34.4",
            since
        ));
        assert!(node_up_since(
            &node("v1.34.4", 1_001, Some("node-role.kubernetes.io/control-plane")),
            "v1.34.4",
            since
        ));
    }
}
