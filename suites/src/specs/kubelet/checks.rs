//! Waits and checks shared by the kubelet specs: events, bounded "stays so" watches (upstream's
//! `gomega.Consistently`), pod phases and deletions. Checks on the recorded gRPC calls are
//! `driver.calls(node)` ([`harness::calls`]).

use std::time::Duration;

use harness::{
    builder::{Builder, phase},
    driver::Driver,
    framework::Ctx,
    wait::{self, Verdict, WaitError},
};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::serde::{Serialize, de::DeserializeOwned};
use kube::{
    Api, Resource, ResourceExt as _,
    api::{DeleteParams, Preconditions},
    runtime::watcher,
};

/// Upstream's `framework.PodStartTimeout`.
pub const POD_START_TIMEOUT: Duration = harness::builder::POD_START_TIMEOUT;
/// Upstream's `f.Timeouts.PodDelete`.
pub const POD_DELETE_TIMEOUT: Duration = harness::builder::POD_DELETE_TIMEOUT;
/// Upstream's `f.Timeouts.PodStartSlow`.
pub const POD_START_SLOW_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The spec's pods.
pub fn pods(ctx: &Ctx) -> Api<Pod> {
    Api::namespaced(ctx.client().clone(), ctx.namespace())
}

/// The spec's claims.
pub fn claims(ctx: &Ctx) -> Api<k8s_openapi::api::resource::v1::ResourceClaim> {
    Api::namespaced(ctx.client().clone(), ctx.namespace())
}

/// The only node of a one-node driver.
pub fn only_node(driver: &Driver) -> anyhow::Result<String> {
    match driver.node_names() {
        [node] => Ok(node.clone()),
        nodes => anyhow::bail!("expected the driver on exactly one node, it runs on {nodes:?}"),
    }
}

/// Upstream's `gomega.Consistently`, as a bounded watch: the objects `config` selects must
/// satisfy `condition` (which says what is wrong, or `None`) at the start and after every
/// change during all of `duration`. Returns how many states were checked.
pub async fn stays<K, F>(
    api: &Api<K>,
    config: watcher::Config,
    what: &str,
    duration: Duration,
    mut condition: F,
) -> anyhow::Result<usize>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
    F: FnMut(&[K]) -> Option<String>,
{
    let mut checked = 0;
    let result = wait::objects(api, config, format!("{what} for {duration:?}"), duration, |objs| {
        checked += 1;
        match condition(objs) {
            Some(problem) => Verdict::Fail(problem),
            None => Verdict::Pending,
        }
    })
    .await;
    match result {
        // The watch ran out of time with the condition holding all along: that is success.
        Err(WaitError::Timeout { .. }) if checked > 0 => Ok(checked),
        Err(WaitError::Timeout { last, .. }) => {
            anyhow::bail!(
                "could not observe {what}: the initial list did not complete within {duration:?}; {last}"
            )
        }
        Err(e @ (WaitError::Failed { .. } | WaitError::Cancelled { .. })) => {
            Err(anyhow::anyhow!("expected {what} for {duration:?}: {e}"))
        }
        Ok(_) => anyhow::bail!("internal error: the bounded watch for {what} ended early"),
    }
}

/// Waits for an event about the pod with this reason whose message contains `message`
/// (upstream's `WaitTimeoutForEvent`). Returns the event.
pub async fn wait_event(
    ctx: &Ctx,
    pod: &str,
    reason: &str,
    message: &str,
    timeout: Duration,
) -> anyhow::Result<Event> {
    let api: Api<Event> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let selector = format!(
        "involvedObject.kind=Pod,involvedObject.name={pod},involvedObject.namespace={},reason={reason}",
        ctx.namespace()
    );
    let found = wait::objects(
        &api,
        watcher::Config::default().fields(&selector),
        format!("a {reason} event for pod {pod} with message containing {message:?}"),
        timeout,
        |events| {
            Verdict::done_if(
                events.iter().any(|e| e.message.as_deref().unwrap_or_default().contains(message)),
            )
        },
    )
    .await?;
    found
        .into_iter()
        .find(|e| e.message.as_deref().unwrap_or_default().contains(message))
        .ok_or_else(|| anyhow::anyhow!("internal error: the matching event is missing"))
}

/// Whether any container of the pod has started (running or terminated).
pub fn started(pod: &Pod) -> bool {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    statuses.iter().any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some()))
}

/// Waits until the pod has terminated with phase `Succeeded`; fails at once on `Failed`.
pub async fn wait_succeeded(b: &Builder, pod: &Pod) -> anyhow::Result<Pod> {
    Ok(b.wait_pod(pod, "to succeed", POD_START_TIMEOUT, |p| match phase(p) {
        "Succeeded" => Verdict::Done,
        "Failed" => Verdict::Fail("the pod failed".to_owned()),
        _ => Verdict::Pending,
    })
    .await?)
}

/// Deletes the pod at once (grace period 0, upstream's force delete); a pod that is already gone
/// is fine. Preconditioned on the UID when given, so a recreated pod of the same name is never
/// hit.
pub async fn force_delete(ctx: &Ctx, name: &str, uid: Option<String>) -> anyhow::Result<()> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid.map(|uid| Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::default()
    };
    match pods(ctx).delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("force-delete pod {name}"))),
    }
}

/// The name of the claim generated for the pod's only pod claim (`status.resourceClaimStatuses`).
pub fn generated_claim(pod: &Pod) -> anyhow::Result<String> {
    harness::builder::pod_claim_names(pod)
        .into_values()
        .next()
        .flatten()
        .ok_or_else(|| anyhow::anyhow!("pod {} has no generated ResourceClaim in its status", pod.name_any()))
}
