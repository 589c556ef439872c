//! The proxy ReplicaSet of one driver instance, patched from `manifests/dra-test-driver-proxy.yaml`
//! as upstream's Driver patches it.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::ReplicaSet,
        core::v1::{NodeAffinity, Pod},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::json;

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

/// A proxy pod that the drivers of a run share on `node`: the ReplicaSet's pod template with
/// the kubelet's whole plugin directory mounted (each driver's data directory is created by its
/// proxy process), the instance label [`SHARED_INSTANCE`], required node affinity on `node`, no
/// anti-affinity, and the namespace's default ServiceAccount without a token (the plugins act as
/// their own driver's ServiceAccount, see [`super::Impersonation::kubelet_plugin`]).
pub fn shared_pod(node: &str, image: &str, kubelet_root_dir: &str) -> Result<Pod, ManifestError> {
    let nodes = [node.to_owned()];
    let rs = replicaset(&ProxyParams {
        name_suffix: "",
        instance: SHARED_INSTANCE,
        driver: "",
        nodes: &nodes,
        service_account: "default",
        image,
        kubelet_root_dir,
    })?;
    let broken =
        |reason: &str| ManifestError::Parse { index: 0, kind: "ReplicaSet", reason: reason.to_owned() };
    let template = rs.spec.template.ok_or_else(|| broken("no pod template"))?;
    let mut spec = template.spec.ok_or_else(|| broken("no pod template spec"))?;
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
    let base = rs.metadata.name.unwrap_or_default();
    Ok(Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{base}-shared-")),
            labels: template.metadata.and_then(|m| m.labels),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
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
    fn a_shared_pod_mounts_the_whole_plugin_directory_on_its_node() {
        let pod = shared_pod("n1", "img:1", "/var/lib/kubelet/").unwrap();
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("dra-test-driver-shared-"));
        assert_eq!(pod.metadata.labels.as_ref().unwrap()[INSTANCE_LABEL], SHARED_INSTANCE);
        let spec = pod.spec.unwrap();
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
}
