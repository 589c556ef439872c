//! The bring-up steps of a new cluster, in order: certificates, the network and the nodes, the
//! control plane, containerd and the images on every node, the kubelets and their Ready nodes,
//! and a check that the resourceclaim controller works.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};

use super::{
    LocalCluster, components, host, hugepages, netns, node_cpus,
    nodes::{self, NodeDirs},
    old_kubelet, pki, probes, wait,
};
use crate::{
    cluster_config::ClusterConfig,
    common::{
        build::{self, Binaries, Versions},
        images,
        layout::ports,
    },
    kube_api::node_is_ready,
    progress::Step,
    repo::repo_root,
};

impl LocalCluster {
    /// Starts every component of a new cluster on `bins` and waits until each is ready; the
    /// nodes run the older kubelets of `kubelets` where given.
    pub(super) async fn start(
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
            "build the pause, busybox, hostpathplugin (with dra-e2e-dial) and sample device plugin images and import them into every node",
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
pub(super) fn node_untainted_ready(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| NOT_READY_TAINTS.contains(&t.key.as_str())));
    node_is_ready(node) && !tainted
}

#[cfg(test)]
mod tests {
    use super::*;

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
