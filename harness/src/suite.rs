//! What every DRA suite adds to the generic runner: the API it needs at preflight, and the DRA
//! objects a failed spec's artifacts hold (the spec's ResourceClaims and the DeviceClasses; each
//! `Driver` adds its own ResourceSlices and recorded calls); on request ([`show_calls`]) each
//! driver's call logs of every spec, passed or failed, on the run's output.
//!
//! ```
//! let mut registry = harness::framework::Registry::new();
//! harness::suite::configure(&mut registry);
//! harness::suite::show_calls(&mut registry); // dra-e2e --show-calls
//! ```

use std::{
    io::Write as _,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use async_trait::async_trait;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, TypeMeta},
};

use crate::{
    calls::Calls,
    framework::{ArtifactSource, Ctx, Registry, write_list},
};

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

/// `dra-e2e --show-calls`: when a spec's cleanups are done, every [`Driver`](crate::driver::Driver)
/// it started prints each node's call log (what the kubelet asked of the plugin, how each call
/// ended), for passed specs too, so that an author sees what the kubelet did.
pub fn show_calls(registry: &mut Registry) {
    registry.before_each(|ctx| ctx.run_shared::<ShowCalls>().0.store(true, Ordering::Relaxed));
}

/// Whether the run shows the call logs ([`show_calls`]).
#[derive(Default)]
struct ShowCalls(AtomicBool);

/// With [`show_calls`], registers the printing of these call logs as a cleanup of `ctx`; register
/// it before anything the logs should include the calls of (the cleanups run last first).
pub(crate) fn print_calls_at_end(ctx: &Ctx, calls: Vec<Calls>) {
    if !ctx.run_shared::<ShowCalls>().0.load(Ordering::Relaxed) {
        return;
    }
    let spec = ctx.full_text().to_owned();
    ctx.defer("print the kubelet's calls (--show-calls)", async move {
        let text = calls_text(&spec, &calls);
        // One write, so that the lines of parallel specs never interleave.
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            tracing::warn!("cannot print the call logs: {e}");
        }
        Ok(())
    });
}

/// The call logs of a spec as [`show_calls`] prints them.
fn calls_text(spec: &str, calls: &[Calls]) -> String {
    calls
        .iter()
        .map(|calls| {
            let log = calls.log();
            format!("\ncalls to {} in {spec:?} ({} calls):\n{log}", log.scope, log.records.len())
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_calls_name_the_node_the_spec_and_every_call() {
        let (a, b) = (
            Calls::named("the kubelet of node n1 (driver d)"),
            Calls::named("the kubelet of node n2 (driver d)"),
        );
        let _failing = a.fail(crate::calls::Method::GetInfo, crate::calls::GrpcStatus::unavailable("x"));
        let text = calls_text("[sig-node] spec", &[a, b]);
        assert!(text.starts_with("\ncalls to the kubelet of node n1 (driver d) in \"[sig-node] spec\" (0 calls):\n  (no calls)\n"), "{text}");
        assert!(text.contains("\ncalls to the kubelet of node n2 (driver d)"), "{text}");
    }
}
