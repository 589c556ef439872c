//! `cluster status --provider local`: the control-plane components, then every node with its
//! containerd and kubelet, its Ready condition and the pods that run on it. A component that
//! died is reported with the tail of its log.

use std::collections::BTreeMap;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::ListParams};

use super::{CONTROL_PLANE, LocalCluster};

use crate::common::process;
use crate::kube_api::node_is_ready;

/// Lines of a dead component's log that status prints.
const TAIL_LINES: usize = 15;

/// Prints the status of `cluster`; true when everything runs and every node is Ready.
pub async fn print(cluster: &LocalCluster) -> Result<bool> {
    let mut all = true;
    println!("control plane (network namespace {})", cluster.control_plane().netns());
    for name in CONTROL_PLANE {
        all &= component(cluster, name, "  ");
    }
    let api = if cluster.sup.is_running("kube-apiserver") { cluster.admin_client().await.ok() } else { None };
    let (nodes, pods) = match &api {
        Some(client) => {
            let nodes: BTreeMap<String, Node> = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items.into_iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect()
                })
                .unwrap_or_default();
            let mut pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
            if let Ok(list) = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await {
                for pod in list.items {
                    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                    let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    let ns = pod.metadata.namespace.unwrap_or_default();
                    let name = pod.metadata.name.unwrap_or_default();
                    pods.entry(node).or_default().push(format!("{ns}/{name} ({phase})"));
                }
            }
            (nodes, pods)
        }
        None => (BTreeMap::new(), BTreeMap::new()),
    };
    for node in &cluster.nodes {
        let state = match nodes.get(&node.name) {
            Some(n) if node_is_ready(n) => "Ready",
            Some(_) => "not Ready",
            None if api.is_some() => "not registered",
            None => "unknown (no apiserver)",
        };
        all &= state == "Ready";
        println!("node {} ({}, cgroup root {}): {state}", node.name, node.ip, node.cgroup_root());
        if let Some(reported) = nodes.get(&node.name).and_then(reported_capacity) {
            println!("  reports {reported}");
        }
        all &= component(cluster, &node.containerd(), "  ");
        all &= component(cluster, &node.kubelet(), "  ");
        match pods.get(&node.name) {
            Some(list) => {
                println!("  pods: {}", list.len());
                for pod in list {
                    println!("    {pod}");
                }
            }
            None => println!("  pods: none"),
        }
    }
    if let Some(line) = super::registry::status_line(cluster) {
        all &= super::registry::is_running(cluster);
        println!("{line}");
    }
    println!("kubeconfig {}", cluster.kubeconfig().display());
    Ok(all)
}

/// Prints one component's line (and its log tail when it is not running); true when it runs.
fn component(cluster: &LocalCluster, name: &str, indent: &str) -> bool {
    match cluster.sup.record(name) {
        Some(r) if process::is_alive(r) => {
            println!("{indent}{name:<34} running (pid {})", r.pid);
            true
        }
        record => {
            let what = if record.is_some() { "DIED" } else { "not running" };
            println!("{indent}{name:<34} {what}");
            if record.is_some() || cluster.sup.log_path(name).exists() {
                println!("{indent}  last lines of {}:", cluster.sup.log_path(name).display());
                for line in cluster.sup.log_tail(name, TAIL_LINES).lines() {
                    println!("{indent}  | {line}");
                }
            }
            false
        }
    }
}

/// What a node's kubelet reports as its capacity: CPUs (the sysfs its node shows, see
/// `node_cpus.rs`), memory and hugepages.
fn reported_capacity(node: &Node) -> Option<String> {
    let capacity = node.status.as_ref()?.capacity.as_ref()?;
    let get = |name: &str| capacity.get(name).map(|q| q.0.clone()).unwrap_or_else(|| "0".into());
    Some(format!(
        "cpu {}, memory {}, hugepages-2Mi {}, hugepages-1Gi {}",
        get("cpu"),
        get("memory"),
        get("hugepages-2Mi"),
        get("hugepages-1Gi")
    ))
}
