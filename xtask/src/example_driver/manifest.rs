//! `manifests/example-driver.yaml` as typed objects, the DaemonSet made for one deployment
//! (`--break`, image digest, API server address), applied (server-side) and deleted.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{EnvVar, Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::DeviceClass,
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, Patch, PatchParams},
};
use serde::{Deserialize as _, Serialize, de::DeserializeOwned};

use super::Break;

/// The manifest's text.
pub const TEXT: &str = include_str!("../../../manifests/example-driver.yaml");

/// The field manager of `deploy`'s server-side apply.
const MANAGER: &str = "dra-e2e-example-driver";

/// The pod annotation that holds the image archive's digest (a new image rolls the pods).
pub const IMAGE_ANNOTATION: &str = "dra-e2e.test/image-digest";

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
    /// The image archive's sha256.
    pub image_digest: String,
    /// The API server's address as pods on the host network reach it.
    pub api_server: (String, u16),
}

fn parse<T: DeserializeOwned>(docs: &mut std::vec::IntoIter<serde_json::Value>, kind: &str) -> Result<T> {
    let doc = docs.next().with_context(|| format!("manifests/example-driver.yaml lacks its {kind}"))?;
    let found = doc.get("kind").and_then(|k| k.as_str()).unwrap_or("?").to_string();
    if found != kind {
        bail!("manifests/example-driver.yaml: expected a {kind}, found a {found}");
    }
    serde_json::from_value(doc).with_context(|| format!("manifests/example-driver.yaml: its {kind}"))
}

/// The manifest, parsed: Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet,
/// DeviceClass, in this order.
pub fn objects() -> Result<Objects> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(TEXT) {
        let value =
            serde_json::Value::deserialize(doc).context("manifests/example-driver.yaml is not YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    let count = docs.len();
    let mut docs = docs.into_iter();
    let objects = Objects {
        namespace: parse(&mut docs, "Namespace")?,
        service_account: parse(&mut docs, "ServiceAccount")?,
        cluster_role: parse(&mut docs, "ClusterRole")?,
        cluster_role_binding: parse(&mut docs, "ClusterRoleBinding")?,
        daemonset: parse(&mut docs, "DaemonSet")?,
        device_class: parse(&mut docs, "DeviceClass")?,
    };
    if count != 6 {
        bail!("manifests/example-driver.yaml must hold exactly six objects, found {count}");
    }
    Ok(objects)
}

/// The DaemonSet of `objects` for `deployment`: `--break` and `--static-cdi` appended to the driver's args, the
/// image digest annotated, the API server's address in the environment.
pub fn customize(daemonset: &mut DaemonSet, deployment: &Deployment) -> Result<()> {
    let template = &mut daemonset.spec.template;
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(IMAGE_ANNOTATION.to_string(), deployment.image_digest.clone());
    let pod = template.spec.as_mut().context("the DaemonSet has no pod spec")?;
    let container = pod.containers.first_mut().context("the DaemonSet has no container")?;
    if let Some(brk) = deployment.brk {
        container.args.get_or_insert_with(Vec::new).extend(["--break".to_string(), brk.as_str().to_string()]);
    }
    if deployment.static_cdi {
        container.args.get_or_insert_with(Vec::new).push("--static-cdi".to_string());
    }
    let env = container.env.get_or_insert_with(Vec::new);
    let (host, port) = &deployment.api_server;
    for (name, value) in
        [("KUBERNETES_SERVICE_HOST", host.clone()), ("KUBERNETES_SERVICE_PORT", port.to_string())]
    {
        env.retain(|e| e.name != name);
        env.push(EnvVar { name: name.to_string(), value: Some(value), value_from: None });
    }
    Ok(())
}

async fn apply<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object.meta().name.clone().context("an object without a name")?;
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(object))
        .await
        .with_context(|| format!("apply {} {name}", K::kind(&Default::default())))?;
    Ok(())
}

/// Applies every object (server-side, forced: `deploy` owns them).
pub async fn apply_all(client: &Client, objects: &Objects) -> Result<()> {
    let ns = super::NAMESPACE;
    apply(&Api::<Namespace>::all(client.clone()), &objects.namespace).await?;
    apply(&Api::<ServiceAccount>::namespaced(client.clone(), ns), &objects.service_account).await?;
    apply(&Api::<ClusterRole>::all(client.clone()), &objects.cluster_role).await?;
    apply(&Api::<ClusterRoleBinding>::all(client.clone()), &objects.cluster_role_binding).await?;
    apply(&Api::<DaemonSet>::namespaced(client.clone(), ns), &objects.daemonset).await?;
    apply(&Api::<DeviceClass>::all(client.clone()), &objects.device_class).await?;
    Ok(())
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("delete {} {name}", K::kind(&Default::default()))),
    }
}

/// Deletes every object; missing ones are fine. The DaemonSet goes first, so its pods stop
/// (and delete their slices) while their permissions still exist.
pub async fn delete_all(client: &Client, objects: &Objects) -> Result<()> {
    let ns = super::NAMESPACE;
    let name = |meta: &kube::core::ObjectMeta| meta.name.clone().unwrap_or_default();
    delete(&Api::<DaemonSet>::namespaced(client.clone(), ns), &name(&objects.daemonset.metadata)).await?;
    delete(&Api::<DeviceClass>::all(client.clone()), &name(&objects.device_class.metadata)).await?;
    Ok(())
}

/// Deletes what the driver's pods needed, once they are gone: binding, role, namespace.
pub async fn delete_rest(client: &Client, objects: &Objects) -> Result<()> {
    let name = |meta: &kube::core::ObjectMeta| meta.name.clone().unwrap_or_default();
    delete(&Api::<ClusterRoleBinding>::all(client.clone()), &name(&objects.cluster_role_binding.metadata))
        .await?;
    delete(&Api::<ClusterRole>::all(client.clone()), &name(&objects.cluster_role.metadata)).await?;
    delete(&Api::<Namespace>::all(client.clone()), &name(&objects.namespace.metadata)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn a_deployment_adds_its_break_static_cdi_digest_and_api_server() {
        let mut ds = objects().unwrap().daemonset;
        let deployment = Deployment {
            brk: Some(Break::SkipUnprepare),
            static_cdi: true,
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
        assert_eq!(container.args.as_ref().unwrap()[2..], ["--break", "skip-unprepare", "--static-cdi"]);
        let env = container.env.as_ref().unwrap();
        let value =
            |name: &str| env.iter().filter(|e| e.name == name).map(|e| e.value.clone()).collect::<Vec<_>>();
        assert_eq!(value("KUBERNETES_SERVICE_HOST"), [Some("10.1.2.3".to_string())]);
        assert_eq!(value("KUBERNETES_SERVICE_PORT"), [Some("443".to_string())]);
        assert_eq!(value("NODE_NAME").len(), 1);
    }
}
