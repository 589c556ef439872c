//! Node isolation of the local cluster: node-local paths, containers and cgroups of one node are
//! that node's only.

use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt, api::PostParams};

use super::{
    BUSYBOX, client, exec, in_namespace,
    nodes_support::{NODE, OTHER_NODE, containerd_socket, ctr, node_path, on_node},
    pod, wait_running,
};

/// A pod on `node` with the host paths mounted at /h0, /h1, ...
fn with_host_paths(name: &str, node: &str, paths: &[String]) -> Result<Pod> {
    let mut p = on_node(pod(name, BUSYBOX, &["sleep", "3600"])?, node)?;
    let spec = p.spec.as_mut().context("spec")?;
    let volumes: Vec<serde_json::Value> = paths
        .iter()
        .enumerate()
        .map(|(i, path)| serde_json::json!({"name": format!("h{i}"), "hostPath": {"path": path, "type": "DirectoryOrCreate"}}))
        .collect();
    let mounts: Vec<serde_json::Value> = (0..paths.len())
        .map(|i| serde_json::json!({"name": format!("h{i}"), "mountPath": format!("/h{i}")}))
        .collect();
    spec.volumes = Some(serde_json::from_value(serde_json::Value::Array(volumes))?);
    spec.containers[0].volume_mounts = Some(serde_json::from_value(serde_json::Value::Array(mounts))?);
    Ok(p)
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn a_file_written_through_a_host_path_on_one_worker_is_absent_on_another() -> Result<()> {
    let client = client().await?;
    let marker = format!("isolation-{:x}", std::process::id());
    let paths =
        vec![format!("/var/lib/kubelet/plugins/{marker}"), "/var/run/cdi".to_string(), "/tmp".to_string()];
    let result = in_namespace(&client, |client, ns| {
        let (paths, marker) = (paths.clone(), marker.clone());
        async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            pods.create(&PostParams::default(), &with_host_paths("writer", NODE, &paths)?).await?;
            pods.create(&PostParams::default(), &with_host_paths("reader", OTHER_NODE, &paths)?).await?;
            wait_running(&pods, "writer").await?;
            wait_running(&pods, "reader").await?;
            for (i, path) in paths.iter().enumerate() {
                exec(&pods, "writer", &["sh", "-c", &format!("echo {NODE} > /h{i}/{marker}")]).await?;
                let host = node_path(NODE, path).join(&marker);
                let text = std::fs::read_to_string(&host).with_context(|| {
                    format!("{path}/{marker} written on {NODE} is not at {}", host.display())
                })?;
                assert_eq!(text.trim(), NODE);
                let listing = exec(&pods, "reader", &["ls", "-a", &format!("/h{i}")]).await?;
                assert!(
                    !listing.lines().any(|l| l == marker),
                    "{path}/{marker} written on {NODE} is visible on {OTHER_NODE}:\n{listing}"
                );
                assert!(!node_path(OTHER_NODE, path).join(&marker).exists());
            }
            Ok(())
        }
    })
    .await;
    for path in &paths {
        let _ = std::fs::remove_file(node_path(NODE, path).join(&marker));
    }
    for node in [NODE, OTHER_NODE] {
        let _ = std::fs::remove_dir(node_path(node, &paths[0]));
    }
    result
}

/// Containers with the pod's namespace label in a node's containerd.
fn containers_of_namespace(node: &str, ns: &str) -> Result<Vec<String>> {
    let out = Command::new(ctr()?)
        .arg("--address")
        .arg(containerd_socket(node))
        .args(["--namespace", "k8s.io", "containers", "list", "-q"])
        .arg(format!("labels.\"io.kubernetes.pod.namespace\"=={ns}"))
        .output()?;
    if !out.status.success() {
        bail!("ctr containers list on {node}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect())
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn a_pod_on_one_node_shows_up_only_in_that_node_s_kubelet_containerd_and_cgroups() -> Result<()> {
    let client = client().await?;
    in_namespace(&client, |client, ns| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        pods.create(&PostParams::default(), &on_node(pod("alone", BUSYBOX, &["sleep", "3600"])?, NODE)?)
            .await?;
        wait_running(&pods, "alone").await?;
        let uid = pods.get("alone").await?.uid().context("pod uid")?;

        let here = containers_of_namespace(NODE, &ns)?;
        assert_eq!(here.len(), 2, "{NODE}'s containerd should run the sandbox and the container: {here:?}");
        let there = containers_of_namespace(OTHER_NODE, &ns)?;
        assert!(there.is_empty(), "{NODE}'s pod shows up in {OTHER_NODE}'s containerd: {there:?}");

        for (node, expected) in [(NODE, true), (OTHER_NODE, false)] {
            let text = client
                .request_text(
                    http::Request::get(format!("/api/v1/nodes/{node}/proxy/pods")).body(Vec::new())?,
                )
                .await
                .with_context(|| format!("the kubelet of {node} through the apiserver"))?;
            assert_eq!(
                text.contains(&uid),
                expected,
                "{node}'s kubelet pods list: pod {uid} present = {}",
                !expected
            );
        }

        let cgroup = format!("/sys/fs/cgroup/memory/dra-e2e/{NODE}/kubepods/besteffort/pod{uid}");
        assert!(std::path::Path::new(&cgroup).is_dir(), "no pod cgroup {cgroup} under {NODE}'s cgroup root");
        let elsewhere = format!("/sys/fs/cgroup/memory/dra-e2e/{OTHER_NODE}/kubepods/besteffort/pod{uid}");
        assert!(!std::path::Path::new(&elsewhere).exists(), "{elsewhere} exists");
        Ok(())
    })
    .await
}
