//! The proxy ReplicaSet of one driver instance, patched from `manifests/dra-test-driver-proxy.yaml`
//! as upstream's Driver patches it; the ReplicaSet of a node's shared proxy pod and a rescue pod,
//! both made from it.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::ReplicaSet,
        core::v1::{NodeAffinity, Pod},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::manifests::{INSTANCE_LABEL, ManifestError, proxy_replicaset};

/// What the proxy ReplicaSet of a driver instance needs.
#[derive(Clone, Debug)]
pub struct ProxyParams<'a> {
    /// `NameSuffix + InstanceSuffix`, appended to `dra-test-driver`.
    pub name_suffix: &'a str,
    /// Value of the instance label: `<driver name><instance suffix>`.
    pub instance: &'a str,
    /// The driver name (plugin data directory `<kubelet root>/plugins/<driver>`).
    pub driver: &'a str,
    /// The chosen nodes (one pod each).
    pub nodes: &'a [String],
    /// The plugin's ServiceAccount.
    pub service_account: &'a str,
    /// The hostpathplugin image.
    pub image: &'a str,
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_root_dir: &'a str,
}

/// The plugin data directory of a driver: `<kubelet root>/plugins/<driver>`.
pub fn plugin_data_dir(kubelet_root_dir: &str, driver: &str) -> String {
    format!("{}/plugins/{driver}", kubelet_root_dir.trim_end_matches('/'))
}

/// The kubelet's plugin directory, every driver's data directory in it: `<kubelet root>/plugins`.
pub fn plugins_dir(kubelet_root_dir: &str) -> String {
    format!("{}/plugins", kubelet_root_dir.trim_end_matches('/'))
}

/// The value of the instance label of the shared proxy pods.
pub const SHARED_INSTANCE: &str = "dra-e2e-shared-proxy";

/// The kubelet's plugin registry directory: `<kubelet root>/plugins_registry`.
pub fn registry_dir(kubelet_root_dir: &str) -> String {
    format!("{}/plugins_registry", kubelet_root_dir.trim_end_matches('/'))
}

/// The ReplicaSet from the manifest with the per-driver changes: name, replicas, instance label
/// (selector, template, anti-affinity), image, ServiceAccount, required node affinity on the
/// chosen nodes, and host path == mount path for the plugin and registry directories.
pub fn replicaset(p: &ProxyParams<'_>) -> Result<ReplicaSet, ManifestError> {
    let mut rs = proxy_replicaset()?;
    let base_name = rs.metadata.name.clone().unwrap_or_default();
    rs.metadata.name = Some(format!("{base_name}{}", p.name_suffix));
    let set_instance = |labels: &mut Option<BTreeMap<String, String>>| {
        labels.get_or_insert_with(BTreeMap::new).insert(INSTANCE_LABEL.to_owned(), p.instance.to_owned());
    };
    set_instance(&mut rs.metadata.labels);
    let data_dir = plugin_data_dir(p.kubelet_root_dir, p.driver);
    let registry = registry_dir(p.kubelet_root_dir);
    let affinity: NodeAffinity = serde_json::from_value(json!({
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{
                "matchExpressions": [{
                    "key": "kubernetes.io/hostname",
                    "operator": "In",
                    "values": p.nodes,
                }],
            }],
        },
    }))
    .unwrap_or_default();
    {
        let spec = &mut rs.spec;
        spec.replicas = Some(i32::try_from(p.nodes.len()).unwrap_or(i32::MAX));
        set_instance(&mut spec.selector.match_labels);
        if let Some(template) = spec.template.as_mut() {
            set_instance(&mut template.metadata.get_or_insert_with(Default::default).labels);
            if let Some(pod) = template.spec.as_mut() {
                pod.service_account_name = Some(p.service_account.to_owned());
                let aff = pod.affinity.get_or_insert_with(Default::default);
                if let Some(term) = aff
                    .pod_anti_affinity
                    .as_mut()
                    .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_mut())
                    .and_then(|terms| terms.first_mut())
                {
                    set_instance(&mut term.label_selector.get_or_insert_with(Default::default).match_labels);
                }
                aff.node_affinity = Some(affinity);
                if let Some(c) = pod.containers.first_mut() {
                    c.image = Some(p.image.to_owned());
                    if let Some(mounts) = c.volume_mounts.as_mut() {
                        if let Some(m) = mounts.get_mut(0) {
                            m.mount_path = data_dir.clone();
                        }
                        if let Some(m) = mounts.get_mut(1) {
                            m.mount_path = registry.clone();
                        }
                    }
                }
                if let Some(volumes) = pod.volumes.as_mut() {
                    for (i, path) in [(0, &data_dir), (1, &registry)] {
                        if let Some(hp) = volumes.get_mut(i).and_then(|v| v.host_path.as_mut()) {
                            hp.path = path.clone();
                        }
                    }
                }
            }
        }
    }
    Ok(rs)
}

/// The label that tells the shared ReplicaSets of the nodes apart (their selectors must not
/// overlap): its value is [`shared_node_label`] of the node.
pub const SHARED_NODE_LABEL: &str = "dra-e2e.k8s.io/proxy-node";

/// The value of [`SHARED_NODE_LABEL`] for `node`: the node name, or `node-<16 hex digits of its
/// SHA-256>` when it is longer than a label value may be (63 characters).
pub fn shared_node_label(node: &str) -> String {
    if node.len() <= 63 {
        return node.to_owned();
    }
    let digest = Sha256::digest(node.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("node-{hex}")
}

/// The ReplicaSet of the proxy pod that the drivers of a run share on `node` (one replica): the
/// driver ReplicaSet's pod template with the kubelet's whole plugin directory mounted (each
/// driver's data directory is created by its proxy process), the instance label
/// [`SHARED_INSTANCE`] and [`SHARED_NODE_LABEL`] in its selector, required node affinity on
/// `node`, no anti-affinity (a replacement may start beside the pod it replaces while that one
/// terminates), and the namespace's default ServiceAccount without a token (the plugins act as
/// their own driver's ServiceAccount, see [`super::Impersonation::kubelet_plugin`]). `run_label`
/// (the run's label and its value) goes onto the pods too, so that they carry it as every
/// object of the run does.
pub fn shared_replicaset(
    node: &str,
    image: &str,
    kubelet_root_dir: &str,
    run_label: Option<(&str, &str)>,
) -> Result<ReplicaSet, ManifestError> {
    let nodes = [node.to_owned()];
    let node_label = shared_node_label(node);
    let mut rs = replicaset(&ProxyParams {
        name_suffix: &format!("-shared-{node_label}"),
        instance: SHARED_INSTANCE,
        driver: "",
        nodes: &nodes,
        service_account: "default",
        image,
        kubelet_root_dir,
    })?;
    let broken =
        |reason: &str| ManifestError::Parse { index: 0, kind: "ReplicaSet", reason: reason.to_owned() };
    let add = |labels: &mut Option<BTreeMap<String, String>>, key: &str, value: &str| {
        labels.get_or_insert_with(BTreeMap::new).insert(key.to_owned(), value.to_owned());
    };
    add(&mut rs.metadata.labels, SHARED_NODE_LABEL, &node_label);
    add(&mut rs.spec.selector.match_labels, SHARED_NODE_LABEL, &node_label);
    let template = rs.spec.template.as_mut().ok_or_else(|| broken("no pod template"))?;
    let metadata = template.metadata.get_or_insert_with(Default::default);
    add(&mut metadata.labels, SHARED_NODE_LABEL, &node_label);
    if let Some((key, value)) = run_label {
        add(&mut metadata.labels, key, value);
    }
    let spec = template.spec.as_mut().ok_or_else(|| broken("no pod template spec"))?;
    let plugins = plugins_dir(kubelet_root_dir);
    if let Some(m) =
        spec.containers.first_mut().and_then(|c| c.volume_mounts.as_mut()).and_then(|m| m.get_mut(0))
    {
        m.mount_path = plugins.clone();
    }
    if let Some(hp) = spec.volumes.as_mut().and_then(|v| v.get_mut(0)).and_then(|v| v.host_path.as_mut()) {
        hp.path = plugins;
    }
    if let Some(affinity) = spec.affinity.as_mut() {
        affinity.pod_anti_affinity = None;
    }
    spec.service_account_name = None;
    spec.automount_service_account_token = Some(false);
    Ok(rs)
}

/// The value of the instance label of a rescue pod (see [`rescue_pod`]).
pub const RESCUE_INSTANCE: &str = "dra-e2e-rescue-proxy";

/// A proxy pod of no controller on `node` for a driver whose proxy pod was lost without a
/// replacement, so that its plugin can serve the kubelet's unprepares at the spec's clean-up:
/// the pod template of [`shared_replicaset`] (the whole plugin directory, so it serves any
/// driver) with the instance label [`RESCUE_INSTANCE`], which no proxy ReplicaSet selects (a
/// ReplicaSet scaled to zero would adopt a pod it selects and delete it).
pub fn rescue_pod(node: &str, image: &str, kubelet_root_dir: &str) -> Result<Pod, ManifestError> {
    let rs = shared_replicaset(node, image, kubelet_root_dir, None)?;
    let broken =
        |reason: &str| ManifestError::Parse { index: 0, kind: "ReplicaSet", reason: reason.to_owned() };
    let template = rs.spec.template.ok_or_else(|| broken("no pod template"))?;
    let mut labels = template.metadata.and_then(|m| m.labels).unwrap_or_default();
    labels.remove(SHARED_NODE_LABEL);
    labels.insert(INSTANCE_LABEL.to_owned(), RESCUE_INSTANCE.to_owned());
    Ok(Pod {
        metadata: ObjectMeta {
            generate_name: Some("dra-test-driver-rescue-".to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        ..Pod::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_like_upstream() {
        let nodes = vec!["n1".to_owned(), "n2".to_owned()];
        let rs = replicaset(&ProxyParams {
            name_suffix: "-x",
            instance: "ns.k8s.io",
            driver: "ns.k8s.io",
            nodes: &nodes,
            service_account: "sa",
            image: "img:1",
            kubelet_root_dir: "/var/lib/kubelet/",
        })
        .unwrap();
        assert_eq!(rs.metadata.name.as_deref(), Some("dra-test-driver-x"));
        let spec = rs.spec;
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.selector.match_labels.unwrap()[INSTANCE_LABEL], "ns.k8s.io");
        let template = spec.template.unwrap();
        assert_eq!(template.metadata.unwrap().labels.unwrap()[INSTANCE_LABEL], "ns.k8s.io");
        let pod = template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("sa"));
        let affinity = pod.affinity.unwrap();
        let anti =
            &affinity.pod_anti_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap()
                [0];
        assert_eq!(
            anti.label_selector.as_ref().unwrap().match_labels.as_ref().unwrap()[INSTANCE_LABEL],
            "ns.k8s.io"
        );
        let required =
            affinity.node_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap();
        let expr = &required.node_selector_terms[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!((expr.key.as_str(), expr.operator.as_str()), ("kubernetes.io/hostname", "In"));
        assert_eq!(expr.values.as_deref().unwrap(), ["n1", "n2"]);
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("img:1"));
        let mounts: Vec<_> =
            c.volume_mounts.as_ref().unwrap().iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(
            mounts,
            ["/var/lib/kubelet/plugins/ns.k8s.io", "/var/lib/kubelet/plugins_registry", "/cdi"]
        );
        let paths: Vec<_> =
            pod.volumes.unwrap().iter().map(|v| v.host_path.as_ref().unwrap().path.clone()).collect();
        assert_eq!(
            paths,
            ["/var/lib/kubelet/plugins/ns.k8s.io", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"]
        );
    }

    #[test]
    fn a_shared_replicaset_runs_one_pod_on_its_node_with_the_whole_plugin_directory() {
        let rs = shared_replicaset("n1", "img:1", "/var/lib/kubelet/", Some(("run", "r1"))).unwrap();
        assert_eq!(rs.metadata.name.as_deref(), Some("dra-test-driver-shared-n1"));
        let spec = rs.spec;
        assert_eq!(spec.replicas, Some(1));
        let selector = spec.selector.match_labels.unwrap();
        assert_eq!(selector[INSTANCE_LABEL], SHARED_INSTANCE);
        assert_eq!(selector[SHARED_NODE_LABEL], "n1");
        let template = spec.template.unwrap();
        let labels = template.metadata.unwrap().labels.unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "{labels:?}");
        assert_eq!(labels["run"], "r1");
        let spec = template.spec.unwrap();
        assert_eq!(spec.service_account_name, None);
        assert_eq!(spec.automount_service_account_token, Some(false));
        let affinity = spec.affinity.unwrap();
        assert!(affinity.pod_anti_affinity.is_none());
        let required =
            affinity.node_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap();
        assert_eq!(
            required.node_selector_terms[0].match_expressions.as_ref().unwrap()[0].values.as_deref().unwrap(),
            ["n1"]
        );
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("img:1"));
        let mounts: Vec<_> =
            c.volume_mounts.as_ref().unwrap().iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(mounts, ["/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/cdi"]);
        let paths: Vec<_> =
            spec.volumes.unwrap().iter().map(|v| v.host_path.as_ref().unwrap().path.clone()).collect();
        assert_eq!(paths, ["/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"]);
    }

    #[test]
    fn a_rescue_pod_is_the_shared_pod_that_no_replicaset_selects() {
        let pod = rescue_pod("n1", "img:1", "/var/lib/kubelet").unwrap();
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("dra-test-driver-rescue-"));
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels[INSTANCE_LABEL], RESCUE_INSTANCE);
        assert!(!labels.contains_key(SHARED_NODE_LABEL));
        let shared = shared_replicaset("n1", "img:1", "/var/lib/kubelet", None).unwrap();
        assert_eq!(pod.spec, shared.spec.template.unwrap().spec);
    }

    #[test]
    fn the_node_label_is_the_node_name_unless_it_is_too_long() {
        assert_eq!(shared_node_label("kind-worker2"), "kind-worker2");
        let long = format!("{}.example.com", "n".repeat(60));
        let label = shared_node_label(&long);
        assert_eq!(label.len(), 5 + 16, "{label}");
        assert!(label.starts_with("node-"));
        assert_ne!(label, shared_node_label(&format!("{long}x")));
        let rs = shared_replicaset(&long, "img:1", "/var/lib/kubelet", None).unwrap();
        assert_eq!(rs.metadata.name, Some(format!("dra-test-driver-shared-{label}")));
    }
}
