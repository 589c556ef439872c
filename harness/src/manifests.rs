//! The driver's manifests (`manifests/` at the top of the repository), embedded in the harness,
//! and their per-driver instantiation.
//!
//! - [`PROXY_REPLICASET`]: the proxy ReplicaSet (one hostpathplugin pod per node).
//! - [`PLUGIN_PERMISSIONS`]: ServiceAccount, ClusterRole, ClusterRoleBinding and a
//!   ValidatingAdmissionPolicy (+ binding) that lets a plugin write only its own node's
//!   ResourceSlices. Placeholders are replaced as upstream does it:
//!   [`plugin_permissions`].
//! - [`SAMPLE_DEVICE_PLUGIN`]: upstream's sample device plugin as a DaemonSet, with the spec's
//!   namespace for its placeholder: [`sample_device_plugin`] (deployed by the `device_plugin` module).

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::{DaemonSet, ReplicaSet},
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::de::DeserializeOwned;

/// `manifests/dra-test-driver-proxy.yaml`.
pub const PROXY_REPLICASET: &str = include_str!("../../manifests/dra-test-driver-proxy.yaml");

/// `manifests/plugin-permissions.yaml`.
pub const PLUGIN_PERMISSIONS: &str = include_str!("../../manifests/plugin-permissions.yaml");

/// `manifests/sample-device-plugin.yaml`.
pub const SAMPLE_DEVICE_PLUGIN: &str = include_str!("../../manifests/sample-device-plugin.yaml");

/// Placeholder for the namespace of the sample device plugin's DaemonSet.
pub const DEVICE_PLUGIN_NAMESPACE_PLACEHOLDER: &str = "sample-device-plugin-namespace";

/// Placeholder for the namespace of the plugin's ServiceAccount.
pub const NAMESPACE_PLACEHOLDER: &str = "dra-kubelet-plugin-namespace";
/// Placeholder for the driver name.
pub const DRIVER_NAME_PLACEHOLDER: &str = "dra-kubelet-plugin-driver-name";
/// Prefix of every per-driver object name; replaced last.
pub const NAME_PLACEHOLDER: &str = "dra-kubelet-plugin";

/// The command of the pods that only wait, the test pods and the proxy pods (whose manifest says
/// the same): sleep until SIGTERM, then exit at once. Upstream's `InfiniteSleepCommand` runs
/// `sleep 1` in the foreground, so its shell takes the trap only once that sleep ends (up to 1 s
/// into every deletion); here the shell waits in `wait`, which the trapped signal interrupts.
pub const INFINITE_SLEEP: &str = "trap exit TERM; while true; do sleep 1 & wait; done";

/// Label that marks the proxy pods (test pod cleanup skips them).
pub const PART_OF_LABEL: (&str, &str) = ("app.kubernetes.io/part-of", "dra-test-driver");
/// Label whose value identifies one driver instance's proxy pods.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Errors of manifest handling. They mean the embedded manifests are broken.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A document is not valid YAML or does not fit the expected type.
    #[error("manifest document {index} ({kind}) cannot be parsed: {reason}")]
    Parse {
        /// Position of the document (0-based).
        index: usize,
        /// The expected kind.
        kind: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// A manifest does not have the expected documents.
    #[error("manifests/{file} must hold exactly {expected}, found {found:?}")]
    Shape {
        /// The manifest's file name.
        file: &'static str,
        /// What was expected.
        expected: &'static str,
        /// The kinds found.
        found: Vec<String>,
    },
}

/// Replaces the placeholders of [`PLUGIN_PERMISSIONS`] (namespace, then driver name, then the
/// object-name prefix with `dra-kubelet-plugin-<deployment_id>`), as upstream's Driver does.
pub fn substitute_permissions(text: &str, namespace: &str, driver_name: &str, deployment_id: &str) -> String {
    text.replace(NAMESPACE_PLACEHOLDER, namespace)
        .replace(DRIVER_NAME_PLACEHOLDER, driver_name)
        .replace(NAME_PLACEHOLDER, &format!("{NAME_PLACEHOLDER}-{deployment_id}"))
}

/// Splits a multi-document YAML text at lines that are exactly `---` and drops documents that
/// hold only comments or whitespace.
pub fn documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs.push(current);
    docs.into_iter()
        .filter(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .collect()
}

fn parse<T: DeserializeOwned>(index: usize, kind: &'static str, doc: &str) -> Result<T, ManifestError> {
    let value: serde_json::Value =
        serde_yaml::from_str(doc).map_err(|e| ManifestError::Parse { index, kind, reason: e.to_string() })?;
    serde_json::from_value(value).map_err(|e| ManifestError::Parse { index, kind, reason: e.to_string() })
}

/// The objects of [`PLUGIN_PERMISSIONS`] for one driver.
#[derive(Clone, Debug)]
pub struct PluginPermissions {
    /// The plugin's ServiceAccount (in the driver's namespace).
    pub service_account: ServiceAccount,
    /// What the ServiceAccount may do.
    pub cluster_role: ClusterRole,
    /// Binds the role to the ServiceAccount.
    pub cluster_role_binding: ClusterRoleBinding,
    /// Limits ResourceSlice writes of the ServiceAccount to its own node.
    pub policy: ValidatingAdmissionPolicy,
    /// Enables the policy.
    pub policy_binding: ValidatingAdmissionPolicyBinding,
}

/// [`PLUGIN_PERMISSIONS`] with placeholders replaced, parsed into typed objects.
pub fn plugin_permissions(
    namespace: &str,
    driver_name: &str,
    deployment_id: &str,
) -> Result<PluginPermissions, ManifestError> {
    let text = substitute_permissions(PLUGIN_PERMISSIONS, namespace, driver_name, deployment_id);
    let docs = documents(&text);
    let kinds: Vec<String> = docs
        .iter()
        .map(|d| {
            serde_yaml::from_str::<serde_json::Value>(d)
                .ok()
                .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
                .unwrap_or_default()
        })
        .collect();
    const EXPECTED: [&str; 5] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    if kinds != EXPECTED {
        return Err(ManifestError::Shape {
            file: "plugin-permissions.yaml",
            expected: "ServiceAccount, ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding in this order",
            found: kinds,
        });
    }
    Ok(PluginPermissions {
        service_account: parse(0, "ServiceAccount", &docs[0])?,
        cluster_role: parse(1, "ClusterRole", &docs[1])?,
        cluster_role_binding: parse(2, "ClusterRoleBinding", &docs[2])?,
        policy: parse(3, "ValidatingAdmissionPolicy", &docs[3])?,
        policy_binding: parse(4, "ValidatingAdmissionPolicyBinding", &docs[4])?,
    })
}

/// [`PROXY_REPLICASET`], parsed (not yet patched for a driver).
pub fn proxy_replicaset() -> Result<ReplicaSet, ManifestError> {
    let docs = documents(PROXY_REPLICASET);
    match docs.as_slice() {
        [doc] => parse(0, "ReplicaSet", doc),
        _ => Err(ManifestError::Shape {
            file: "dra-test-driver-proxy.yaml",
            expected: "one ReplicaSet",
            found: vec![format!("{} documents", docs.len())],
        }),
    }
}

/// [`SAMPLE_DEVICE_PLUGIN`] for the namespace `namespace`, parsed (node affinity not yet set).
pub fn sample_device_plugin(namespace: &str) -> Result<DaemonSet, ManifestError> {
    let text = SAMPLE_DEVICE_PLUGIN.replace(DEVICE_PLUGIN_NAMESPACE_PLACEHOLDER, namespace);
    let docs = documents(&text);
    match docs.as_slice() {
        [doc] => parse(0, "DaemonSet", doc),
        _ => Err(ManifestError::Shape {
            file: "sample-device-plugin.yaml",
            expected: "one DaemonSet",
            found: vec![format!("{} documents", docs.len())],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "dra-test-abcde";
    const DRIVER: &str = "dra-test-abcde.k8s.io";

    #[test]
    fn splits_documents_and_drops_comment_only_ones() {
        let docs = documents("# header\n---\na: 1\n---\n# only a comment\n---\nb: 2\n  ---x\n");
        assert_eq!(docs, ["a: 1\n", "b: 2\n  ---x\n"]);
    }

    #[test]
    fn substitution_replaces_every_placeholder_in_upstream_order() {
        let text = substitute_permissions(PLUGIN_PERMISSIONS, NS, DRIVER, DRIVER);
        // Namespace and driver name first; the generic prefix must not eat them.
        assert!(!text.contains(NAMESPACE_PLACEHOLDER), "{text}");
        assert!(!text.contains(DRIVER_NAME_PLACEHOLDER), "{text}");
        for line in text.lines().filter(|l| l.contains(NAME_PLACEHOLDER)) {
            assert!(line.contains(&format!("{NAME_PLACEHOLDER}-{DRIVER}")), "unreplaced prefix in {line:?}");
        }
    }

    #[test]
    fn permissions_are_per_driver() {
        let p = plugin_permissions(NS, DRIVER, DRIVER).unwrap();
        let sa = format!("dra-kubelet-plugin-{DRIVER}-service-account");
        assert_eq!(p.service_account.metadata.name.as_deref(), Some(sa.as_str()));
        assert_eq!(p.service_account.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(
            p.cluster_role.metadata.name.as_deref(),
            Some(format!("dra-kubelet-plugin-{DRIVER}-role").as_str())
        );
        let rules = p.cluster_role.rules.clone().unwrap_or_default();
        let driver_rule = rules
            .iter()
            .find(|r| r.resources.as_deref().is_some_and(|res| res == ["resourceclaims/driver"]))
            .unwrap();
        assert_eq!(driver_rule.resource_names.as_deref(), Some(&[DRIVER.to_owned()][..]));
        let slice_rule = rules
            .iter()
            .find(|r| r.resources.as_deref().is_some_and(|res| res == ["resourceslices"]))
            .unwrap();
        for verb in ["get", "list", "watch", "create", "update", "patch", "delete"] {
            assert!(slice_rule.verbs.iter().any(|v| v == verb), "{verb}");
        }
        let binding = &p.cluster_role_binding;
        assert_eq!(binding.role_ref.name, format!("dra-kubelet-plugin-{DRIVER}-role"));
        let subject = &binding.subjects.as_ref().unwrap()[0];
        assert_eq!((subject.name.as_str(), subject.namespace.as_deref()), (sa.as_str(), Some(NS)));
    }

    #[test]
    fn policy_matches_slices_of_every_version_and_only_the_plugin_user() {
        let p = plugin_permissions(NS, DRIVER, DRIVER).unwrap();
        let name = format!("resourceslices-policy-dra-kubelet-plugin-{DRIVER}");
        assert_eq!(p.policy.metadata.name.as_deref(), Some(name.as_str()));
        let spec = p.policy.spec.as_ref().unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        let constraints = spec.match_constraints.as_ref().unwrap();
        assert_eq!(constraints.match_policy.as_deref(), Some("Equivalent"));
        let rules = constraints.resource_rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].api_groups.as_deref(), Some(&["resource.k8s.io".to_owned()][..]));
        assert_eq!(rules[0].api_versions.as_deref(), Some(&["*".to_owned()][..]), "not v1alpha3 only");
        assert_eq!(rules[0].resources.as_deref(), Some(&["resourceslices".to_owned()][..]));
        assert_eq!(rules[0].operations.clone().unwrap(), ["CREATE", "UPDATE", "DELETE"]);
        let condition = &spec.match_conditions.as_ref().unwrap()[0].expression;
        assert!(
            condition
                .contains(&format!("system:serviceaccount:{NS}:dra-kubelet-plugin-{DRIVER}-service-account")),
            "{condition}"
        );
        let validations = spec.validations.as_ref().unwrap();
        assert_eq!(validations.len(), 2);
        assert!(validations[1].message_expression.as_deref().unwrap().contains("may not modify"));
        let binding = &p.policy_binding.spec;
        assert_eq!(binding.policy_name, name);
        assert_eq!(binding.validation_actions, ["Deny"]);
        assert_eq!(p.policy_binding.metadata.name.as_deref(), Some(name.as_str()));
    }

    #[test]
    fn proxy_replicaset_has_upstreams_shape() {
        let rs = proxy_replicaset().unwrap();
        assert_eq!(rs.metadata.name.as_deref(), Some("dra-test-driver"));
        let pod = rs.spec.template.as_ref().unwrap().spec.as_ref().unwrap();
        let c = &pod.containers[0];
        assert_eq!(pod.containers.len(), 1);
        assert_eq!(c.name, "pause");
        // Unlike upstream's, the proxy stops at once on SIGTERM (no 30s grace period to wait out).
        let command = c.command.as_deref().unwrap();
        assert_eq!(command, ["/bin/sh", "-c", INFINITE_SLEEP]);
        assert_eq!(c.image.as_deref(), Some("registry.k8s.io/sig-storage/hostpathplugin:v1.17.1"));
        assert!(c.security_context.as_ref().unwrap().privileged.unwrap());
        assert!(c.ports.is_none());
        let mounts: Vec<_> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("socket-dir", "/var/lib/kubelet/plugins/test-driver.dra.k8s.io"),
                ("registration-dir", "/var/lib/kubelet/plugins_registry"),
                ("cdi-dir", "/cdi")
            ]
        );
        let volumes: Vec<_> = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| {
                let hp = v.host_path.as_ref().unwrap();
                (v.name.as_str(), hp.path.as_str(), hp.type_.as_deref())
            })
            .collect();
        assert_eq!(
            volumes,
            [
                ("socket-dir", "/var/lib/kubelet/plugins/test-driver.dra.k8s.io", Some("DirectoryOrCreate")),
                ("registration-dir", "/var/lib/kubelet/plugins_registry", Some("DirectoryOrCreate")),
                ("cdi-dir", "/var/run/cdi", Some("DirectoryOrCreate"))
            ]
        );
        let labels = rs.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(PART_OF_LABEL.0).map(String::as_str), Some(PART_OF_LABEL.1));
        assert!(labels.contains_key(INSTANCE_LABEL));
        let anti = pod.affinity.as_ref().unwrap().pod_anti_affinity.as_ref().unwrap();
        let term = &anti.required_during_scheduling_ignored_during_execution.as_ref().unwrap()[0];
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
    }
}
