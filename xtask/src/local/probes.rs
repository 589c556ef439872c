//! Readiness checks of the control plane and the probes `cluster up` runs: etcd's and the
//! components' health endpoints (inside the control-plane node's network namespace), the
//! apiserver's /readyz, the RBAC binding the apiserver needs towards kubelets, and a probe that
//! the resourceclaim controller generates claims.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::api::{core::v1::Pod, rbac::v1::ClusterRoleBinding, resource::v1::ResourceClaimTemplate};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

use super::netns;

use crate::common::{images, layout::ports};
use crate::kube_api::client_for;

/// etcd's /health, through a connection made inside the control-plane node's namespace.
pub async fn etcd_healthy(connector: &netns::Connector) -> Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = connector.connect(SocketAddr::from(([127, 0, 0, 1], ports::ETCD_CLIENT))).await?;
    stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body.contains("\"health\":\"true\""))
}

/// The apiserver's /readyz through a kubeconfig.
pub async fn readyz(kubeconfig: PathBuf) -> Result<bool> {
    let client = client_for(&kubeconfig).await?;
    let text = client.request_text(http::Request::get("/readyz").body(Vec::new())?).await?;
    Ok(text.trim() == "ok")
}

/// `/healthz` of a component's secure port, reached through `forward` (its serving certificate is
/// self-signed; /healthz is always allowed without credentials).
pub async fn component_healthz(forward: &netns::LocalForward) -> Result<bool> {
    let mut config = kube::Config::new(format!("https://{}", forward.addr).parse()?);
    config.accept_invalid_certs = true;
    let client = Client::try_from(config)?;
    let text = client.request_text(http::Request::get("/healthz").body(Vec::new())?).await?;
    Ok(text.trim() == "ok")
}

/// The apiserver talks to the kubelet (exec, port-forward, logs) as user `kube-apiserver`.
pub async fn grant_apiserver_kubelet_access(client: &Client) -> Result<()> {
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kube-apiserver-kubelet-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver"}],
    }))?;
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    api.patch(
        "kube-apiserver-kubelet-admin",
        &PatchParams::apply("dra-e2e-xtask").force(),
        &Patch::Apply(&binding),
    )
    .await
    .context("create the kube-apiserver-kubelet-admin ClusterRoleBinding")?;
    Ok(())
}

/// Proves the resourceclaim controller works: a pod that no scheduler picks up (unknown
/// schedulerName) references a ResourceClaimTemplate, and the controller must generate its claim.
pub struct ClaimControllerProbe {
    templates: Api<ResourceClaimTemplate>,
    pods: Api<Pod>,
}

impl ClaimControllerProbe {
    const NAME: &str = "dra-e2e-claim-controller-probe";
    const NAMESPACE: &str = "default";

    /// A probe using `client`.
    pub fn new(client: Client) -> Self {
        Self {
            templates: Api::namespaced(client.clone(), Self::NAMESPACE),
            pods: Api::namespaced(client, Self::NAMESPACE),
        }
    }

    /// Creates the template and pod (idempotent) and says whether the claim was generated.
    pub async fn claim_generated(&self) -> Result<bool> {
        let template: ResourceClaimTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": Self::NAME},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "probe", "exactly": {"deviceClassName": Self::NAME}}
            ]}}},
        }))?;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": Self::NAME},
            "spec": {
                "schedulerName": "dra-e2e-no-scheduler",
                "resourceClaims": [{"name": "probe", "resourceClaimTemplateName": Self::NAME}],
                "containers": [{"name": "probe", "image": images::PAUSE, "resources": {"claims": [{"name": "probe"}]}}],
            },
        }))?;
        let params = PatchParams::apply("dra-e2e-xtask").force();
        self.templates.patch(Self::NAME, &params, &Patch::Apply(&template)).await?;
        let pod = self.pods.patch(Self::NAME, &params, &Patch::Apply(&pod)).await?;
        Ok(pod
            .status
            .and_then(|s| s.resource_claim_statuses)
            .is_some_and(|statuses| statuses.iter().any(|s| s.resource_claim_name.is_some())))
    }

    /// Deletes the probe's objects (the generated claim goes with the pod, its owner).
    pub async fn clean_up(&self) {
        let params = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        let _ = self.pods.delete(Self::NAME, &params).await;
        let _ = self.templates.delete(Self::NAME, &Default::default()).await;
    }
}
