//! What `deploy` applies: `manifests/upstream-test-driver.yaml` (Namespace, DaemonSet,
//! DeviceClass: ours) and upstream's plugin permissions of the cluster's version, read from the
//! Go module cache with their placeholders replaced (ServiceAccount, ClusterRole,
//! ClusterRoleBinding, ValidatingAdmissionPolicy and its binding). Every object carries
//! [`PART_OF`], by which `remove` finds them.

use std::path::Path;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::DaemonSet,
    core::v1::{Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::DeviceClass,
};
use kube::{Api, Client, Resource};

use super::{DRIVER_NAME, NAMESPACE};
use crate::deployed_driver::{
    self,
    objects::{apply, delete_labelled, documents, next},
};

/// Our manifest's text.
pub const TEXT: &str = include_str!("../../../manifests/upstream-test-driver.yaml");
/// Our manifest's name in messages.
const FILE: &str = "manifests/upstream-test-driver.yaml";

/// Upstream's permissions, inside the k8s.io/kubernetes module.
pub const PERMISSIONS: &str = "test/e2e/dra/test-driver/deploy/example/plugin-permissions.yaml";

/// Upstream's placeholders and what replaces them, in this order (the namespace and the driver
/// name first: the last one is their prefix), as upstream's e2e Driver replaces them.
pub const PLACEHOLDERS: [(&str, &str); 3] = [
    ("dra-kubelet-plugin-namespace", NAMESPACE),
    ("dra-kubelet-plugin-driver-name", DRIVER_NAME),
    ("dra-kubelet-plugin", "upstream-test-driver"),
];

/// The label on every object `deploy` applies.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "dra-e2e-upstream-test-driver");

/// The field manager of `deploy`'s server-side apply.
const MANAGER: &str = "dra-e2e-upstream-driver";

/// Every object of one deployment, in the order they are applied.
#[derive(Debug, Clone)]
pub struct Objects {
    /// The driver's namespace (ours).
    pub namespace: Namespace,
    /// The plugin's ServiceAccount (upstream's).
    pub service_account: ServiceAccount,
    /// What it may do (upstream's).
    pub cluster_role: ClusterRole,
    /// Binds the role to the ServiceAccount (upstream's).
    pub cluster_role_binding: ClusterRoleBinding,
    /// Limits its ResourceSlice writes to its own node (upstream's).
    pub policy: ValidatingAdmissionPolicy,
    /// Enables the policy (upstream's).
    pub policy_binding: ValidatingAdmissionPolicyBinding,
    /// The driver on every worker (ours).
    pub daemonset: DaemonSet,
    /// The class of its devices (ours).
    pub device_class: DeviceClass,
}

/// Upstream's permissions text with its placeholders replaced.
pub fn substitute(text: &str) -> String {
    PLACEHOLDERS.iter().fold(text.to_string(), |text, (placeholder, value)| text.replace(placeholder, value))
}

/// Reads upstream's permissions from the k8s.io/kubernetes module in `module_dir`.
pub fn read_permissions(module_dir: &Path) -> Result<String> {
    let path = module_dir.join(PERMISSIONS);
    std::fs::read_to_string(&path)
        .with_context(|| format!("read upstream's plugin permissions {}", path.display()))
}

/// Every object: ours, and upstream's `permissions` (the file's text) with its placeholders
/// replaced; each labelled [`PART_OF`].
pub fn objects(permissions: &str) -> Result<Objects> {
    let ours = documents(TEXT, FILE)?;
    if ours.len() != 3 {
        bail!("{FILE} must hold exactly three objects, found {}", ours.len());
    }
    let upstream = documents(&substitute(permissions), PERMISSIONS)?;
    if upstream.len() != 5 {
        let kinds: Vec<&str> = upstream.iter().map(deployed_driver::objects::kind_of).collect();
        bail!(
            "upstream's {PERMISSIONS} holds {kinds:?}; deploy knows ServiceAccount, ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding"
        );
    }
    let (mut ours, mut upstream) = (ours.into_iter(), upstream.into_iter());
    let mut objects = Objects {
        namespace: next(&mut ours, "Namespace", FILE)?,
        service_account: next(&mut upstream, "ServiceAccount", PERMISSIONS)?,
        cluster_role: next(&mut upstream, "ClusterRole", PERMISSIONS)?,
        cluster_role_binding: next(&mut upstream, "ClusterRoleBinding", PERMISSIONS)?,
        policy: next(&mut upstream, "ValidatingAdmissionPolicy", PERMISSIONS)?,
        policy_binding: next(&mut upstream, "ValidatingAdmissionPolicyBinding", PERMISSIONS)?,
        daemonset: next(&mut ours, "DaemonSet", FILE)?,
        device_class: next(&mut ours, "DeviceClass", FILE)?,
    };
    label(&mut objects.namespace);
    label(&mut objects.service_account);
    label(&mut objects.cluster_role);
    label(&mut objects.cluster_role_binding);
    label(&mut objects.policy);
    label(&mut objects.policy_binding);
    label(&mut objects.daemonset);
    label(&mut objects.device_class);
    Ok(objects)
}

fn label<K: Resource>(object: &mut K) {
    object.meta_mut().labels.get_or_insert_with(Default::default).insert(PART_OF.0.into(), PART_OF.1.into());
}

/// The DaemonSet for one deployment: its `image`, the archive's `digest` and the API server's
/// address.
pub fn customize(
    daemonset: &mut DaemonSet,
    image: &str,
    digest: &str,
    api_server: &(String, u16),
) -> Result<()> {
    deployed_driver::pin_template(daemonset, digest, api_server)?;
    let pod = daemonset.spec.template.spec.as_mut().context("the DaemonSet has no pod spec")?;
    let container = pod.containers.first_mut().context("the DaemonSet has no container")?;
    container.image = Some(image.to_string());
    Ok(())
}

/// Applies every object (server-side, forced: `deploy` owns them).
pub async fn apply_all(client: &Client, o: &Objects) -> Result<()> {
    let c = || client.clone();
    apply(&Api::<Namespace>::all(c()), &o.namespace, MANAGER).await?;
    apply(&Api::<ServiceAccount>::namespaced(c(), NAMESPACE), &o.service_account, MANAGER).await?;
    apply(&Api::<ClusterRole>::all(c()), &o.cluster_role, MANAGER).await?;
    apply(&Api::<ClusterRoleBinding>::all(c()), &o.cluster_role_binding, MANAGER).await?;
    apply(&Api::<ValidatingAdmissionPolicy>::all(c()), &o.policy, MANAGER).await?;
    apply(&Api::<ValidatingAdmissionPolicyBinding>::all(c()), &o.policy_binding, MANAGER).await?;
    apply(&Api::<DaemonSet>::namespaced(c(), NAMESPACE), &o.daemonset, MANAGER).await?;
    apply(&Api::<DeviceClass>::all(c()), &o.device_class, MANAGER).await
}

/// The selector of [`PART_OF`].
fn part_of() -> String {
    format!("{}={}", PART_OF.0, PART_OF.1)
}

/// Deletes the DaemonSet and the DeviceClass (by label: whatever a deploy of any version
/// applied); missing ones are fine.
pub async fn delete_driver(client: &Client) -> Result<()> {
    delete_labelled(&Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE), &part_of()).await?;
    delete_labelled(&Api::<DeviceClass>::all(client.clone()), &part_of()).await
}

/// Deletes what the driver's pods needed, once they are gone: policy, binding, role, namespace
/// (with the ServiceAccount).
pub async fn delete_rest(client: &Client) -> Result<()> {
    let c = || client.clone();
    delete_labelled(&Api::<ValidatingAdmissionPolicyBinding>::all(c()), &part_of()).await?;
    delete_labelled(&Api::<ValidatingAdmissionPolicy>::all(c()), &part_of()).await?;
    delete_labelled(&Api::<ClusterRoleBinding>::all(c()), &part_of()).await?;
    delete_labelled(&Api::<ClusterRole>::all(c()), &part_of()).await?;
    delete_labelled(&Api::<Namespace>::all(c()), &part_of()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployed_driver::IMAGE_ANNOTATION;

    /// Upstream's file as v1.37.2 ships it, in the Go module cache when the cluster was built.
    fn upstream_permissions() -> Option<String> {
        let cache = std::env::var("GOMODCACHE")
            .ok()
            .or_else(|| std::env::var("HOME").ok().map(|home| format!("{home}/go/pkg/mod")))?;
        read_permissions(&Path::new(&cache).join("k8s.io/kubernetes@v1.37.2")).ok()
    }

    /// A stand-in with upstream's shape and placeholders, when the module cache lacks it.
    const SHAPE: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: dra-kubelet-plugin-service-account, namespace: dra-kubelet-plugin-namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: dra-kubelet-plugin-role}
rules: [{apiGroups: [resource.k8s.io], resources: [resourceclaims/driver], verbs: ["associated-node:patch"], resourceNames: [dra-kubelet-plugin-driver-name]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: dra-kubelet-plugin-role-binding}
subjects: [{kind: ServiceAccount, name: dra-kubelet-plugin-service-account, namespace: dra-kubelet-plugin-namespace}]
roleRef: {kind: ClusterRole, name: dra-kubelet-plugin-role, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: resourceslices-policy-dra-kubelet-plugin}
spec:
  matchConditions:
  - name: isRestrictedUser
    expression: request.userInfo.username == "system:serviceaccount:dra-kubelet-plugin-namespace:dra-kubelet-plugin-service-account"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: resourceslices-policy-dra-kubelet-plugin}
spec: {policyName: resourceslices-policy-dra-kubelet-plugin, validationActions: [Deny]}
"#;

    #[test]
    fn upstream_s_permissions_are_for_this_driver_and_its_daemonset() {
        let text = upstream_permissions().unwrap_or_else(|| SHAPE.to_string());
        let o = objects(&text).unwrap();
        let sa = o.service_account.metadata.name.clone().unwrap();
        assert_eq!(sa, "upstream-test-driver-service-account");
        assert_eq!(o.service_account.metadata.namespace.as_deref(), Some(NAMESPACE));
        let pod = o.daemonset.spec.template.spec.as_ref().unwrap();
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some(sa.as_str()),
            "the DaemonSet runs as upstream's account"
        );
        let subject = &o.cluster_role_binding.subjects.as_ref().unwrap()[0];
        assert_eq!((subject.name.as_str(), subject.namespace.as_deref()), (sa.as_str(), Some(NAMESPACE)));
        assert_eq!(o.cluster_role_binding.role_ref.name, o.cluster_role.metadata.name.clone().unwrap());
        let rules = serde_json::to_string(&o.cluster_role.rules).unwrap();
        assert!(rules.contains(&format!(r#""resourceNames":["{DRIVER_NAME}"]"#)), "{rules}");
        let policy = serde_json::to_string(&o.policy).unwrap();
        assert!(policy.contains(&format!("system:serviceaccount:{NAMESPACE}:{sa}")), "{policy}");
        let binding = &o.policy_binding.spec;
        assert_eq!(Some(binding.policy_name.as_str()), o.policy.metadata.name.as_deref());
        let all = format!("{o:?}");
        assert!(!all.contains("dra-kubelet-plugin"), "a placeholder is left: {all}");
        for labels in
            [&o.namespace.metadata.labels, &o.cluster_role.metadata.labels, &o.daemonset.metadata.labels]
        {
            assert_eq!(labels.as_ref().unwrap().get(PART_OF.0).map(String::as_str), Some(PART_OF.1));
        }
    }

    #[test]
    fn our_manifest_runs_the_kubelet_plugin_where_the_kubelet_looks() {
        let o = objects(SHAPE).unwrap();
        assert_eq!(o.namespace.metadata.name.as_deref(), Some(NAMESPACE));
        assert_eq!(o.daemonset.metadata.name.as_deref(), Some(super::super::DEPLOYED.daemonset));
        assert_eq!(o.device_class.metadata.name.as_deref(), Some(super::super::DEVICE_CLASS));
        let class = serde_json::to_string(&o.device_class.spec).unwrap();
        assert!(class.contains(&format!(r#"device.driver == \"{DRIVER_NAME}\""#)), "{class}");
        let pod = o.daemonset.spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.host_network, Some(true));
        let container = &pod.containers[0];
        let args = container.args.as_ref().unwrap();
        assert_eq!(
            args,
            &[
                format!("--drivername={DRIVER_NAME}").as_str(),
                "-v=6",
                "kubelet-plugin",
                "--node-name=$(NODE_NAME)"
            ]
        );
        let env = container.env.as_ref().unwrap();
        let node = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
        assert_eq!(node.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "spec.nodeName");
        // The plugin tells the kubelet its socket's path: inside the container it must be the node's.
        let mounts = container.volume_mounts.as_ref().unwrap();
        for mount in mounts {
            let volume = pod.volumes.as_ref().unwrap().iter().find(|v| v.name == mount.name).unwrap();
            assert_eq!(volume.host_path.as_ref().unwrap().path, mount.mount_path);
        }
        let paths: Vec<&str> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/var/lib/kubelet/plugins_registry",
                "/var/lib/kubelet/plugins/test-driver.cdi.k8s.io",
                "/var/run/cdi"
            ]
        );
        let labels = o.daemonset.spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        let (key, value) = super::super::DEPLOYED.pod_selector.split_once('=').unwrap();
        assert_eq!(labels.get(key).map(String::as_str), Some(value));
    }

    #[test]
    fn a_deployment_sets_its_image_digest_and_api_server() {
        let mut ds = objects(SHAPE).unwrap().daemonset;
        customize(&mut ds, "dra-e2e.local/dra-test-driver:v1.37.2", "abc", &("10.1.2.3".into(), 443))
            .unwrap();
        let template = &ds.spec.template;
        assert_eq!(
            template.metadata.as_ref().unwrap().annotations.as_ref().unwrap()[IMAGE_ANNOTATION],
            "abc"
        );
        let container = &template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some("dra-e2e.local/dra-test-driver:v1.37.2"));
        assert_eq!(container.image_pull_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn another_shape_of_upstream_s_file_is_refused_naming_what_it_holds() {
        let err =
            objects("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\n").unwrap_err().to_string();
        assert!(err.contains(r#"holds ["ServiceAccount"]"#), "{err}");
    }
}
