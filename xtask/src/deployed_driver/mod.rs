//! What the DRA drivers `cargo xtask` runs as DaemonSets share: the example driver
//! ([`crate::example_driver`]) and upstream's test driver ([`crate::upstream_driver`]). Each
//! brings its own build, image and manifest; this is the floor under both: the check that the
//! cluster answers, the API server's address for pods on the host network, the image archive's
//! digest and its import into the nodes, the pod template every deployment pins
//! ([`pin_template`]), server-side apply and delete of their objects ([`objects`]), and the
//! waits on the DaemonSet's pods, the driver's ResourceSlices and its namespace ([`readiness`]).

pub mod objects;
pub mod readiness;

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::EnvVar, core::v1::Node, discovery::v1::EndpointSlice};
use kube::{Api, Client, api::ListParams};
use sha2::{Digest, Sha256};

use crate::{kube_api, local, repo::repo_root, usage::UsageError};

/// The bound of the first request, which tells whether there is a cluster at all.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

/// The pod annotation that holds the image archive's digest (a new image rolls the pods).
pub const IMAGE_ANNOTATION: &str = "dra-e2e.test/image-digest";

/// One driver as a DaemonSet: what its waits and its removal look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deployed {
    /// The driver, as its messages name it ("the example driver").
    pub what: &'static str,
    /// The driver's name: its ResourceSlices' `spec.driver`.
    pub driver: &'static str,
    /// The namespace of the DaemonSet.
    pub namespace: &'static str,
    /// The DaemonSet.
    pub daemonset: &'static str,
    /// The label selector of the DaemonSet's pods.
    pub pod_selector: &'static str,
}

/// A client for `kubeconfig` whose cluster answers; otherwise a usage error in one sentence.
pub async fn reachable_client(kubeconfig: &Path) -> Result<Client> {
    if !kubeconfig.is_file() {
        return Err(UsageError::new(format!(
            "there is no kubeconfig at {} (is the local cluster up? `cargo xtask cluster up`)",
            kubeconfig.display()
        ))
        .into());
    }
    let client = kube_api::client_for(kubeconfig).await.map_err(|e| UsageError::new(format!("{e:#}")))?;
    let nodes: Api<Node> = Api::all(client.clone());
    match tokio::time::timeout(REACH_TIMEOUT, nodes.list(&ListParams::default().limit(1))).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => {
            Err(UsageError::new(format!("the cluster of {} does not answer: {e}", kubeconfig.display()))
                .into())
        }
        Err(_) => Err(UsageError::new(format!(
            "the cluster of {} does not answer within {REACH_TIMEOUT:?}",
            kubeconfig.display()
        ))
        .into()),
    }
}

/// The API server's address for pods on the host network: the `kubernetes` EndpointSlice's
/// (pods of the local cluster may not reach the API server through the service IP).
pub async fn api_server(client: &Client) -> Result<(String, u16)> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let list = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .context("read the kubernetes EndpointSlice")?;
    list.items
        .iter()
        .find_map(|slice| {
            let address = slice.endpoints.as_ref()?.first()?.addresses.first()?.clone();
            let ports = slice.ports.as_ref()?;
            let port = ports.iter().find(|p| p.name.as_deref() == Some("https")).or(ports.first())?.port?;
            Some((address, u16::try_from(port).ok()?))
        })
        .context("the kubernetes EndpointSlice in default names no API server address")
}

/// Pins `daemonset`'s pod template to one deployment: the image archive's `digest` as the
/// [`IMAGE_ANNOTATION`] (a new image rolls the pods) and `KUBERNETES_SERVICE_HOST`/`PORT` of its
/// first container set to `api_server`.
pub fn pin_template(daemonset: &mut DaemonSet, digest: &str, api_server: &(String, u16)) -> Result<()> {
    let template = &mut daemonset.spec.template;
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(IMAGE_ANNOTATION.to_string(), digest.to_string());
    let pod = template.spec.as_mut().context("the DaemonSet has no pod spec")?;
    let container = pod.containers.first_mut().context("the DaemonSet has no container")?;
    let env = container.env.get_or_insert_with(Vec::new);
    let (host, port) = api_server;
    for (name, value) in
        [("KUBERNETES_SERVICE_HOST", host.clone()), ("KUBERNETES_SERVICE_PORT", port.to_string())]
    {
        env.retain(|e| e.name != name);
        env.push(EnvVar { name: name.to_string(), value: Some(value), value_from: None });
    }
    Ok(())
}

/// The args of `daemonset`'s first container (what [`readiness::daemonset_ready`] compares).
pub fn container_args(daemonset: &DaemonSet) -> Vec<String> {
    daemonset
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}

/// The sha256 of an image archive, hex.
pub fn archive_digest(archive: &Path) -> Result<String> {
    let mut file = std::fs::File::open(archive).with_context(|| format!("open {}", archive.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("read {}", archive.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Imports the archive into every node's containerd (what `cargo xtask cluster load` does).
pub async fn load(archive: &Path) -> Result<()> {
    local::load(&[archive.to_path_buf()]).await
}

/// The local cluster's admin kubeconfig, the default of `--kubeconfig`.
pub fn default_kubeconfig() -> Result<std::path::PathBuf> {
    Ok(crate::common::layout::Layout::from_env(repo_root())?.kubeconfig())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_template_carries_the_digest_and_the_api_server_once() {
        let mut ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{
                "name": "c", "args": ["a"],
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "old"}, {"name": "NODE_NAME", "value": "n"}]
            }]}}}
        }))
        .unwrap();
        pin_template(&mut ds, "abc", &("10.1.2.3".into(), 443)).unwrap();
        let template = &ds.spec.template;
        assert_eq!(
            template.metadata.as_ref().unwrap().annotations.as_ref().unwrap()[IMAGE_ANNOTATION],
            "abc"
        );
        let env = template.spec.as_ref().unwrap().containers[0].env.as_ref().unwrap();
        let value =
            |name: &str| env.iter().filter(|e| e.name == name).map(|e| e.value.clone()).collect::<Vec<_>>();
        assert_eq!(value("KUBERNETES_SERVICE_HOST"), [Some("10.1.2.3".to_string())]);
        assert_eq!(value("KUBERNETES_SERVICE_PORT"), [Some("443".to_string())]);
        assert_eq!(value("NODE_NAME").len(), 1);
        assert_eq!(container_args(&ds), ["a"]);
    }

    #[test]
    fn an_archive_digest_is_its_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.tar");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(
            archive_digest(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(archive_digest(&dir.path().join("none")).is_err());
    }
}
