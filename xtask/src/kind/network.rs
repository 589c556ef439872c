//! What a kind cluster needs beyond kind.yaml on this host and with our node image: the derived
//! configuration (host settings, no kindnetd) and pod networking without kindnetd.
//!
//! Host settings go into the derived `.e2e/kind-<name>.yaml` only where the host needs them:
//! on a cgroup v1 host the kubelet gets `failCgroupV1: false` and both the kubelet and containerd
//! the cgroupfs driver ([`CGROUP_V1_KUBELET_PATCH`], [`CGROUP_V1_CONTAINERD_PATCH`]); where root
//! lacks CAP_SYS_RESOURCE containerd gets `restrict_oom_score_adj = true` (pod sandboxes fail to
//! start otherwise). kind.yaml itself stays what GitHub's runners use.
//!
//! Pod networking with our image (kindnetd is not on the Go module proxy): every node gets a CNI
//! `bridge` + `host-local` configuration for the podCIDR the controller manager gave it, and a
//! route to every other node's podCIDR via that node's IP on kind's Docker network. Pod traffic
//! keeps its source address; nothing is masqueraded (pods reach nothing outside the cluster).

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};

use super::{Cmd, host::Tools};
use crate::{
    kube_api::client_for,
    wait::{Probe, poll_until},
};

/// What this host needs in the derived kind configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostNeeds {
    /// The host runs cgroup v1: the kubelet needs `failCgroupV1: false`, and the kubelet and
    /// containerd run with the cgroupfs driver.
    pub cgroup_v1: bool,
    /// Root lacks CAP_SYS_RESOURCE: containerd needs `restrict_oom_score_adj = true`.
    pub no_sys_resource: bool,
    /// The node image has no kindnetd: kind must not install its default CNI.
    pub own_cni: bool,
    /// `--registry`: the nodes' containerd reads registry hosts from `/etc/containerd/certs.d`.
    pub registry: bool,
}

impl HostNeeds {
    /// This host's needs; `own_cni` when the cluster runs our node image.
    pub fn detect(own_cni: bool, registry: bool) -> Result<Self> {
        Ok(Self {
            cgroup_v1: !Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
            no_sys_resource: super::engine::caps::missing()?.contains(&caps::Capability::CAP_SYS_RESOURCE),
            own_cni,
            registry,
        })
    }

    /// Whether the configuration needs anything beyond kind.yaml.
    pub fn any(&self) -> bool {
        self.cgroup_v1 || self.no_sys_resource || self.own_cni || self.registry
    }
}

/// The KubeletConfiguration patch of a cgroup v1 host: cgroup v1 allowed, and the cgroupfs
/// driver (kind's `cgroupRoot: /kubelet` stays; kind's entrypoint creates it in every v1
/// hierarchy). Nodes must agree with containerd's driver, [`CGROUP_V1_CONTAINERD_PATCH`].
///
/// Why cgroupfs: with the systemd driver on cgroup v1, runc's `Set` (run for every container at
/// create, "error setting cgroup config for procHooks process") freezes the container's cgroup
/// while systemd rewrites its device rules and fails with "unable to freeze" when the freezer
/// stays FREEZING through its ~1000 tries (a loaded machine); the cgroupfs manager writes the
/// device rules itself and never freezes at create (opencontainers/cgroups v0.0.6, which runc
/// v1.4.3 uses: `systemd/v1.go` `LegacyManager.Set` and `systemd/devices.go` `freezeBeforeSet`
/// against `fs/fs.go` `Manager.Set`, whose freezer step does nothing for an undefined state).
/// Upstream: kubernetes/kubernetes#131087, opencontainers/runc#3803 and #3804.
pub const CGROUP_V1_KUBELET_PATCH: &str = "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nfailCgroupV1: false\ncgroupDriver: cgroupfs\n";

/// The containerd patch of a cgroup v1 host: runc with the cgroupfs driver, for both of the node
/// image's runtimes (kind's own patch for Kubernetes before 1.24, when kind used cgroupfs; the
/// plugin name of the node's version 2 config.toml, so the merged file says it in kind's table).
pub const CGROUP_V1_CONTAINERD_PATCH: &str = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.test-handler.options]\n  SystemdCgroup = false\n";

/// What `cluster up` says when it creates a cluster on a cgroup v1 host.
pub const CGROUP_V1_SENTENCE: &str = "cgroup v1 host: the nodes' kubelet and containerd use the cgroupfs driver (with the systemd driver runc can fail a container with \"unable to freeze\", kubernetes/kubernetes#131087)";

/// `config` (kind.yaml's text, possibly with a lane's gates) with what `needs` asks for.
pub fn apply_host_needs(config: &str, needs: HostNeeds) -> Result<String> {
    let mut doc: serde_yaml::Mapping =
        serde_yaml::from_str(config).context("the kind config is not a YAML mapping")?;
    let mut append = |key: &str, item: &str| -> Result<()> {
        let list = doc.entry(key.into()).or_insert_with(|| serde_yaml::Value::Sequence(vec![]));
        let Some(list) = list.as_sequence_mut() else { bail!("{key} of the kind config is not a list") };
        list.push(item.into());
        Ok(())
    };
    if needs.cgroup_v1 {
        append("kubeadmConfigPatches", CGROUP_V1_KUBELET_PATCH)?;
        append("containerdConfigPatches", CGROUP_V1_CONTAINERD_PATCH)?;
    }
    if needs.no_sys_resource {
        append(
            "containerdConfigPatches",
            "[plugins.\"io.containerd.grpc.v1.cri\"]\n  restrict_oom_score_adj = true\n",
        )?;
    }
    if needs.registry {
        append("containerdConfigPatches", super::registry::CONTAINERD_PATCH)?;
    }
    if needs.own_cni {
        let networking = doc.entry("networking".into()).or_insert_with(|| serde_yaml::Mapping::new().into());
        let Some(networking) = networking.as_mapping_mut() else {
            bail!("networking of the kind config is not a mapping")
        };
        networking.insert("disableDefaultCNI".into(), true.into());
    }
    // featureGates stays the last key, as CI lanes append gates to the file.
    if let Some(gates) = doc.remove("featureGates") {
        doc.insert("featureGates".into(), gates);
    }
    Ok(serde_yaml::to_string(&doc)?)
}

/// The CNI configuration of a node whose pods get addresses from `pod_cidr`.
pub fn cni_config(pod_cidr: &str) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "dra-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// A node's name, InternalIP and podCIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNet {
    /// The node (and its container's) name.
    pub name: String,
    /// Its address on kind's Docker network.
    pub ip: String,
    /// Its pods' subnet.
    pub pod_cidr: String,
}

/// The commands that give `node` its CNI configuration and routes to every other node's pods.
pub fn node_commands(node: &NodeNet, all: &[NodeNet]) -> Vec<Cmd> {
    let exec = |args: Vec<String>| {
        let mut all = vec!["exec".to_string(), node.name.clone()];
        all.extend(args);
        Cmd::new("docker", all)
    };
    let mut cmds = vec![
        exec(vec!["sysctl".into(), "-w".into(), "net.ipv4.ip_forward=1".into()]),
        exec(vec![
            "sh".into(),
            "-c".into(),
            "mkdir -p /etc/cni/net.d && printf '%s\\n' \"$1\" > /etc/cni/net.d/.10-dra-e2e.conflist.tmp && mv /etc/cni/net.d/.10-dra-e2e.conflist.tmp /etc/cni/net.d/10-dra-e2e.conflist".into(),
            "sh".into(),
            cni_config(&node.pod_cidr),
        ]),
    ];
    for other in all.iter().filter(|o| o.name != node.name) {
        cmds.push(exec(
            ["ip", "route", "replace", &other.pod_cidr, "via", &other.ip]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ));
    }
    cmds
}

/// Waits until every node of `names` has a podCIDR, then configures each node's CNI and routes.
pub async fn setup_pod_network(
    tools: &Tools,
    kubeconfig: &Path,
    names: &[String],
    timeout: Duration,
) -> Result<()> {
    let api: Api<Node> = Api::all(client_for(kubeconfig).await?);
    let nets =
        poll_until("every node to have a podCIDR and an InternalIP", timeout, Duration::from_secs(1), || {
            let api = api.clone();
            async move {
                let listed = api.list(&ListParams::default()).await.context("listing nodes")?;
                let mut nets = Vec::new();
                let mut missing = Vec::new();
                for name in names {
                    match listed
                        .items
                        .iter()
                        .find(|n| n.metadata.name.as_deref() == Some(name))
                        .and_then(node_net)
                    {
                        Some(net) => nets.push(net),
                        None => missing.push(name.as_str()),
                    }
                }
                Ok(if missing.is_empty() {
                    Probe::Done(nets)
                } else {
                    Probe::Pending(format!("waiting for {}", missing.join(", ")))
                })
            }
        })
        .await?;
    for node in &nets {
        for cmd in node_commands(node, &nets) {
            tools
                .output(&cmd, Duration::from_secs(60))
                .await
                .with_context(|| format!("pod network of {}", node.name))?;
        }
    }
    Ok(())
}

/// Waits until kube-system's CoreDNS Deployment has every replica available.
pub async fn wait_coredns(kubeconfig: &Path, timeout: Duration) -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let api: Api<Deployment> = Api::namespaced(client_for(kubeconfig).await?, "kube-system");
    poll_until("kube-system/coredns to have every replica available", timeout, Duration::from_secs(2), || {
        let api = api.clone();
        async move {
            let deployment = api.get("coredns").await.context("reading kube-system/coredns")?;
            let wanted = deployment.spec.replicas.unwrap_or(1);
            let available = deployment.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
            Ok(if available >= wanted && wanted > 0 {
                Probe::Done(())
            } else {
                Probe::Pending(format!("{available} of {wanted} available"))
            })
        }
    })
    .await
}

/// Removes kind's Docker network when no container is attached to it any more (kind leaves it
/// after the last cluster is deleted).
pub async fn remove_unused_kind_network(tools: &Tools) -> Result<()> {
    let quick = Duration::from_secs(60);
    let inspect = Cmd::new("docker", ["network", "inspect", "kind", "--format", "{{len .Containers}}"]);
    let Ok(count) = tools.output(&inspect, quick).await else { return Ok(()) };
    if count.trim() == "0" {
        tools
            .output(&Cmd::new("docker", ["network", "rm", "kind"]), quick)
            .await
            .context("remove the kind network")?;
    }
    Ok(())
}

fn node_net(node: &Node) -> Option<NodeNet> {
    let spec = node.spec.as_ref()?;
    let pod_cidr = spec.pod_cidr.clone()?;
    let ip =
        node.status.as_ref()?.addresses.as_ref()?.iter().find(|a| a.type_ == "InternalIP")?.address.clone();
    Some(NodeNet { name: node.metadata.name.clone()?, ip, pod_cidr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_needs_go_into_the_derived_config_only() {
        let config = "kind: Cluster\nnodes:\n  - role: control-plane\nkubeadmConfigPatches:\n  - |\n    kind: X\nfeatureGates:\n  A: true\n";
        let none = apply_host_needs(config, HostNeeds::default()).unwrap();
        assert!(
            !none.contains("failCgroupV1")
                && !none.contains("restrict_oom")
                && !none.contains("disableDefaultCNI")
        );
        let all = HostNeeds { cgroup_v1: true, no_sys_resource: true, own_cni: true, registry: true };
        let out = apply_host_needs(config, all).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        assert_eq!(doc["kubeadmConfigPatches"].as_sequence().unwrap().len(), 2);
        assert!(doc["kubeadmConfigPatches"][1].as_str().unwrap().contains("failCgroupV1: false"));
        assert!(doc["containerdConfigPatches"][0].as_str().unwrap().contains("SystemdCgroup = false"));
        assert!(
            doc["containerdConfigPatches"][1].as_str().unwrap().contains("restrict_oom_score_adj = true")
        );
        assert!(doc["containerdConfigPatches"][2].as_str().unwrap().contains("config_path"));
        assert_eq!(doc["networking"]["disableDefaultCNI"], true);
        assert!(out.trim_end().ends_with("A: true"), "featureGates stays last:\n{out}");
    }

    #[test]
    fn a_cgroup_v1_host_gets_the_cgroupfs_driver_for_kubelet_and_containerd() {
        let kind_yaml = std::fs::read_to_string(crate::cluster_config::default_path()).unwrap();
        let v1 = HostNeeds { cgroup_v1: true, ..HostNeeds::default() };
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&apply_host_needs(&kind_yaml, v1).unwrap()).unwrap();
        // The kubelet patch is a well-formed KubeletConfiguration, appended after kind.yaml's.
        let kubeadm = doc["kubeadmConfigPatches"].as_sequence().unwrap();
        let kubelet: serde_yaml::Value =
            serde_yaml::from_str(kubeadm.last().unwrap().as_str().unwrap()).unwrap();
        assert_eq!(kubelet["kind"], "KubeletConfiguration");
        assert_eq!(kubelet["apiVersion"], "kubelet.config.k8s.io/v1beta1");
        assert_eq!(kubelet["cgroupDriver"], "cgroupfs");
        assert_eq!(kubelet["failCgroupV1"], false);
        // The containerd patch: for each of kind's runtimes, its options table with SystemdCgroup
        // off, and nothing else (no `version`: kind skips a patch whose version differs from the
        // node's config.toml).
        let containerd = doc["containerdConfigPatches"].as_sequence().unwrap();
        assert!(containerd[0].as_str().unwrap().contains("enable_cdi"), "kind.yaml's patch stays first");
        let lines: Vec<&str> =
            containerd.last().unwrap().as_str().unwrap().lines().filter(|l| !l.trim().is_empty()).collect();
        let table = |runtime: &str| {
            format!("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{runtime}.options]")
        };
        assert_eq!(
            lines,
            [&table("runc"), "  SystemdCgroup = false", &table("test-handler"), "  SystemdCgroup = false"]
        );

        // cgroup v2: kind.yaml's patches only, nothing about the cgroup driver.
        let v2 = apply_host_needs(&kind_yaml, HostNeeds { own_cni: true, ..HostNeeds::default() }).unwrap();
        assert!(
            !v2.contains("cgroupDriver") && !v2.contains("SystemdCgroup") && !v2.contains("failCgroupV1")
        );
        let original: serde_yaml::Value = serde_yaml::from_str(&kind_yaml).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&v2).unwrap();
        assert_eq!(doc["kubeadmConfigPatches"], original["kubeadmConfigPatches"]);
        assert_eq!(doc["containerdConfigPatches"], original["containerdConfigPatches"]);
        assert!(CGROUP_V1_SENTENCE.contains("cgroupfs") && CGROUP_V1_SENTENCE.contains("131087"));
    }

    #[test]
    fn every_node_gets_its_subnet_and_routes_to_the_others() {
        let nodes: Vec<NodeNet> = (0..3)
            .map(|i| NodeNet {
                name: format!("n{i}"),
                ip: format!("172.18.0.{}", i + 2),
                pod_cidr: format!("10.244.{i}.0/24"),
            })
            .collect();
        let cmds: Vec<String> = node_commands(&nodes[1], &nodes).iter().map(|c| c.to_string()).collect();
        assert!(cmds[1].contains("10.244.1.0/24"), "{cmds:?}");
        assert_eq!(cmds[2], "docker exec n1 ip route replace 10.244.0.0/24 via 172.18.0.2");
        assert_eq!(cmds[3], "docker exec n1 ip route replace 10.244.2.0/24 via 172.18.0.4");
        assert_eq!(cmds.len(), 4);
        let conf: serde_json::Value = serde_json::from_str(&cni_config("10.244.1.0/24")).unwrap();
        assert_eq!(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
    }
}
