//! `manifests/example-driver.yaml` as typed objects, the DaemonSet made for one deployment
//! (`--break`, `--static-cdi`, image digest, API server address), applied (server-side) and deleted.

use anyhow::{Context, Result};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::DeviceClass,
};
use kube::{Api, Client};

use super::Break;
use crate::deployed_driver::{
    self,
    objects::{apply, delete, documents, name_of, next},
};

/// The manifest's text.
pub const TEXT: &str = include_str!("../../../manifests/example-driver.yaml");

/// The manifest's name in messages.
const FILE: &str = "manifests/example-driver.yaml";

/// The field manager of `deploy`'s server-side apply.
const MANAGER: &str = "dra-e2e-example-driver";

/// The objects of the manifest, in the order they are applied.
#[derive(Debug, Clone)]
pub struct Objects {
    /// The driver's namespace.
    pub namespace: Namespace,
    /// Its ServiceAccount.
    pub service_account: ServiceAccount,
    /// What the driver may do.
    pub cluster_role: ClusterRole,
    /// Binds the role to the ServiceAccount.
    pub cluster_role_binding: ClusterRoleBinding,
    /// The driver on every worker.
    pub daemonset: DaemonSet,
    /// The class of the driver's devices.
    pub device_class: DeviceClass,
}

/// How one deployment differs from the manifest as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// `--break` for the driver.
    pub brk: Option<Break>,
    /// `--static-cdi` for the driver.
    pub static_cdi: bool,
    /// `--optional-devices` for the driver.
    pub optional_devices: bool,
    /// The image archive's sha256.
    pub image_digest: String,
    /// The API server's address as pods on the host network reach it.
    pub api_server: (String, u16),
}

/// The manifest, parsed: Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet,
/// DeviceClass, in this order.
pub fn objects() -> Result<Objects> {
    let docs = documents(TEXT, FILE)?;
    let count = docs.len();
    let mut docs = docs.into_iter();
    let objects = Objects {
        namespace: next(&mut docs, "Namespace", FILE)?,
        service_account: next(&mut docs, "ServiceAccount", FILE)?,
        cluster_role: next(&mut docs, "ClusterRole", FILE)?,
        cluster_role_binding: next(&mut docs, "ClusterRoleBinding", FILE)?,
        daemonset: next(&mut docs, "DaemonSet", FILE)?,
        device_class: next(&mut docs, "DeviceClass", FILE)?,
    };
    if count != 6 {
        anyhow::bail!("{FILE} must hold exactly six objects, found {count}");
    }
    Ok(objects)
}

/// The DaemonSet of `objects` for `deployment`: `--break`, `--static-cdi` and `--optional-devices` appended to the
/// driver's args, the image digest annotated, the API server's address in the environment.
pub fn customize(daemonset: &mut DaemonSet, deployment: &Deployment) -> Result<()> {
    deployed_driver::pin_template(daemonset, &deployment.image_digest, &deployment.api_server)?;
    let pod = daemonset.spec.template.spec.as_mut().context("the DaemonSet has no pod spec")?;
    let container = pod.containers.first_mut().context("the DaemonSet has no container")?;
    if let Some(brk) = deployment.brk {
        container.args.get_or_insert_with(Vec::new).extend(["--break".to_string(), brk.as_str().to_string()]);
    }
    if deployment.static_cdi {
        container.args.get_or_insert_with(Vec::new).push("--static-cdi".to_string());
    }
    if deployment.optional_devices {
        container.args.get_or_insert_with(Vec::new).push("--optional-devices".to_string());
    }
    Ok(())
}

/// Applies every object (server-side, forced: `deploy` owns them).
pub async fn apply_all(client: &Client, objects: &Objects) -> Result<()> {
    let ns = super::NAMESPACE;
    apply(&Api::<Namespace>::all(client.clone()), &objects.namespace, MANAGER).await?;
    apply(&Api::<ServiceAccount>::namespaced(client.clone(), ns), &objects.service_account, MANAGER).await?;
    apply(&Api::<ClusterRole>::all(client.clone()), &objects.cluster_role, MANAGER).await?;
    apply(&Api::<ClusterRoleBinding>::all(client.clone()), &objects.cluster_role_binding, MANAGER).await?;
    apply(&Api::<DaemonSet>::namespaced(client.clone(), ns), &objects.daemonset, MANAGER).await?;
    apply(&Api::<DeviceClass>::all(client.clone()), &objects.device_class, MANAGER).await?;
    Ok(())
}

/// Deletes every object; missing ones are fine. The DaemonSet goes first, so its pods stop
/// (and delete their slices) while their permissions still exist.
pub async fn delete_all(client: &Client, objects: &Objects) -> Result<()> {
    let ns = super::NAMESPACE;
    delete(&Api::<DaemonSet>::namespaced(client.clone(), ns), &name_of(&objects.daemonset)).await?;
    delete(&Api::<DeviceClass>::all(client.clone()), &name_of(&objects.device_class)).await?;
    Ok(())
}

/// Deletes what the driver's pods needed, once they are gone: binding, role, namespace.
pub async fn delete_rest(client: &Client, objects: &Objects) -> Result<()> {
    delete(&Api::<ClusterRoleBinding>::all(client.clone()), &name_of(&objects.cluster_role_binding)).await?;
    delete(&Api::<ClusterRole>::all(client.clone()), &name_of(&objects.cluster_role)).await?;
    delete(&Api::<Namespace>::all(client.clone()), &name_of(&objects.namespace)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployed_driver::IMAGE_ANNOTATION;

    #[test]
    fn the_manifest_holds_what_deploy_and_the_lane_name() {
        let objects = objects().unwrap();
        assert_eq!(objects.namespace.metadata.name.as_deref(), Some(super::super::NAMESPACE));
        assert_eq!(objects.daemonset.metadata.name.as_deref(), Some(super::super::DAEMONSET));
        assert_eq!(objects.device_class.metadata.name.as_deref(), Some(super::super::DEVICE_CLASS));
        let pod = objects.daemonset.spec.template.spec.as_ref().unwrap();
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some(super::super::IMAGE));
        assert_eq!(container.image_pull_policy.as_deref(), Some("Never"));
        let args = container.args.as_ref().unwrap();
        assert_eq!(args, &["--driver-name", super::super::DRIVER_NAME]);
        let class = serde_json::to_string(&objects.device_class.spec).unwrap();
        assert!(class.contains(&format!(r#"device.driver == \"{}\""#, super::super::DRIVER_NAME)), "{class}");
        let labels = objects.daemonset.spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        let (key, value) = super::super::DEPLOYED.pod_selector.split_once('=').unwrap();
        assert_eq!(labels.get(key).map(String::as_str), Some(value));
    }

    #[test]
    fn a_deployment_adds_its_break_static_cdi_optional_devices_digest_and_api_server() {
        let mut ds = objects().unwrap().daemonset;
        let deployment = Deployment {
            brk: Some(Break::SkipUnprepare),
            static_cdi: true,
            optional_devices: true,
            image_digest: "abc".into(),
            api_server: ("10.1.2.3".into(), 443),
        };
        customize(&mut ds, &deployment).unwrap();
        let template = &ds.spec.template;
        assert_eq!(
            template.metadata.as_ref().unwrap().annotations.as_ref().unwrap()[IMAGE_ANNOTATION],
            "abc"
        );
        let container = &template.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            container.args.as_ref().unwrap()[2..],
            ["--break", "skip-unprepare", "--static-cdi", "--optional-devices"]
        );
        let env = container.env.as_ref().unwrap();
        let value =
            |name: &str| env.iter().filter(|e| e.name == name).map(|e| e.value.clone()).collect::<Vec<_>>();
        assert_eq!(value("KUBERNETES_SERVICE_HOST"), [Some("10.1.2.3".to_string())]);
        assert_eq!(value("NODE_NAME").len(), 1);
    }
}
