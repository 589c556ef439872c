//! What every DRA suite adds to the generic runner: the API it needs at preflight, and the DRA
//! objects a failed spec's artifacts hold (the spec's ResourceClaims and the DeviceClasses; each
//! `Driver` adds its own ResourceSlices and recorded calls).
//!
//! ```
//! let mut registry = harness::framework::Registry::new();
//! harness::suite::configure(&mut registry);
//! ```

use std::{path::Path, time::Duration};

use async_trait::async_trait;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, TypeMeta},
};

use crate::framework::{ArtifactSource, Registry, write_list};

/// The API group version every DRA spec needs.
pub const DRA_API: &str = "resource.k8s.io/v1";

/// Requires [`DRA_API`] at preflight and adds [`DraObjects`] to every spec's artifacts; the
/// waits of the kubelet plugin's call API show in the runner's progress reports.
pub fn configure(registry: &mut Registry) {
    kubelet_plugin::progress::set_wait_reporter(RunnerWaits);
    registry
        .require_api(DRA_API, format!("the DRA specs need Kubernetes 1.34 or newer with {DRA_API} enabled"));
    registry.before_each(|ctx| {
        ctx.artifact_source(Box::new(DraObjects {
            client: ctx.client().clone(),
            namespace: ctx.namespace().to_owned(),
        }))
    });
}

/// Hands the kubelet plugin's waits to the spec runner's progress reports.
struct RunnerWaits;

impl kubelet_plugin::progress::WaitReporter for RunnerWaits {
    fn waiting(&self, what: String, timeout: Option<Duration>) -> kubelet_plugin::progress::WaitToken {
        Box::new(crate::framework::waiting(what, timeout))
    }
}

/// Lists a `resource.k8s.io/v1` kind as dynamic objects, so no field the compiled-in k8s-openapi
/// version lacks is dropped; `namespace: None` lists all namespaces (or cluster-scoped objects).
pub async fn list_dra_objects(
    client: &Client,
    kind: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>, kube::Error> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|mut o| {
            // List items come without apiVersion/kind; put them back for readers.
            o.types =
                Some(TypeMeta { api_version: resource.api_version.clone(), kind: resource.kind.clone() });
            o
        })
        .collect())
}

/// A failed spec's ResourceClaims (`resourceclaims.yaml`) and the cluster's DeviceClasses
/// (`deviceclasses.yaml`), in the `dra-objects` folder of its artifacts.
pub struct DraObjects {
    client: Client,
    namespace: String,
}

#[async_trait]
impl ArtifactSource for DraObjects {
    fn name(&self) -> &str {
        "dra-objects"
    }

    async fn collect(&self, dir: &Path) -> anyhow::Result<()> {
        let claims =
            list_dra_objects(&self.client, "ResourceClaim", "resourceclaims", Some(&self.namespace)).await;
        let claims = write_list(dir, "resourceclaims.yaml", claims).await;
        let classes = list_dra_objects(&self.client, "DeviceClass", "deviceclasses", None).await;
        let classes = write_list(dir, "deviceclasses.yaml", classes).await;
        match (claims, classes) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(anyhow::anyhow!(e)),
            (Err(a), Err(b)) => Err(anyhow::anyhow!("{a}; {b}")),
        }
    }
}
