//! A driver that survives the loss of a proxy pod: the ReplicaSet replaces a deleted pod at
//! once, and the node's plugin moves to the replacement — new proxy processes, tunnels and CDI
//! file operations in the new pod, the same call log, health and prepared claims. The prepared
//! claims belong to the node, not to the running plugin: they stay what they were while the
//! plugin moves ([`Driver::prepared_claims`] does not go empty in between), and their CDI files
//! stay on the node (the pods mount its CDI directory; nothing removes them on a move). The
//! kubelet sees the registration socket appear again and registers the plugin anew (new calls in
//! the same log); a prepare it retries for a claim the plugin holds answers with the claim's
//! devices again without rewriting its files, one it had not finished writes them through the new
//! pod, and an unprepare it retries removes them through the new pod.
//!
//! A pod that is not replaced in time ([`DriverConfig::replacement_timeout`]) fails the spec at once
//! ([`Ctx::fail_now`](crate::framework::Ctx::fail_now)) with what was lost and when, instead of
//! leaving the spec to run into its timeout minutes later.

use std::{fmt, time::SystemTime};

use k8s_openapi::api::core::v1::Pod;

use super::*;

/// How long the plugin of a lost pod gets to stop (its pod is gone; its exec and port-forward
/// calls fail at once).
const STOP_LOST_TIMEOUT: Duration = Duration::from_secs(10);

/// One move of a node's plugin from a lost proxy pod to its replacement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyMove {
    /// The node.
    pub node: String,
    /// The lost pod (`namespace/name`).
    pub from: String,
    /// The replacement (`namespace/name`).
    pub to: String,
    /// Why the plugin moved (e.g. `pod ns/x was deleted`).
    pub reason: String,
    /// When the loss was noticed.
    pub lost_at: SystemTime,
    /// When the plugin ran in the replacement.
    pub moved_at: SystemTime,
    /// The id of the first call in the node's call log that was not started before the move:
    /// calls from this id on went through the replacement.
    pub first_call: u64,
}

impl fmt::Display for ProxyMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let took = self.moved_at.duration_since(self.lost_at).unwrap_or_default();
        write!(
            f,
            "node {}: {} -> {} after {took:?} ({}); calls from #{} on go through {}",
            self.node, self.from, self.to, self.reason, self.first_call, self.to
        )
    }
}

fn pod_display(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether `pod` may replace the lost pod `lost_uid` on `node`: another pod, on that node, not
/// being deleted, running and ready.
fn is_replacement(pod: &Pod, node: &str, lost_uid: Option<&str>) -> bool {
    pod.metadata.uid.as_deref() != lost_uid
        && pod.metadata.deletion_timestamp.is_none()
        && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
        && is_running_and_ready(pod)
}

/// RFC 3339 UTC of `t` (seconds).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let secs = i64::try_from(secs).unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{secs}s"))
}

impl Driver {
    /// The moves of a node's plugin to replacement proxy pods so far (empty while its first pod
    /// runs).
    pub fn proxy_moves(&self, node: &str) -> Vec<ProxyMove> {
        self.inner.per_node.get(node).map(|s| lock(&s.moves).clone()).unwrap_or_default()
    }

    /// `f` of the node's running plugin; while the plugin moves to a replacement proxy pod,
    /// once it runs there. Fails at once when the node has no plugin (stopped, or the driver runs
    /// without kubelet), and when the move takes longer than it may.
    pub(super) async fn with_running_plugin<T>(
        &self,
        node: &str,
        state: &NodeState,
        f: impl Fn(&ProxiedPlugin) -> T,
    ) -> Result<T, WaitError> {
        let what = format!("the kubelet plugin of driver {} on node {node} to run", self.inner.name);
        let timeout = self.inner.config.replacement_timeout + STOP_LOST_TIMEOUT;
        wait::poll(what, timeout, Duration::from_millis(100), || {
            let running = lock(&state.plugin).as_ref().map(&f);
            let moving = lock(&state.claims).is_some();
            async move {
                match running {
                    Some(value) => Attempt::Done(value),
                    None if moving => Attempt::Retry("it is moving to a replacement proxy pod".to_owned()),
                    None => Attempt::Fail("it does not run (stopped, or started without kubelet)".to_owned()),
                }
            }
        })
        .await
    }

    /// Starts the supervisor of a node's plugin: whenever its proxy pod goes away, it moves the
    /// plugin to the replacement, or fails the spec at once if none is ready in time. Stopped
    /// (dropped) when the plugin stops.
    pub(super) fn supervise(&self, ctx: &Ctx, node: &str) {
        let Some(state) = self.inner.per_node.get(node) else { return };
        let this = self.clone();
        let ctx = ctx.clone();
        let node = node.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let gone = match this.inner.per_node.get(&node) {
                    Some(state) => lock(&state.plugin).as_ref().map(|p| p.gone()),
                    None => None,
                };
                let Some(gone) = gone else { return };
                let reason = gone.await;
                if let Some(shared) = &this.inner.shared {
                    ctx.fail_now(this.lost_shared_pod(shared, &node, &reason));
                    return;
                }
                if let Err(message) = this.move_plugin(&node, reason).await {
                    ctx.fail_now(message);
                    return;
                }
            }
        });
        *lock(&state.supervisor) = Some(tokio_util::task::AbortOnDropHandle::new(task));
    }

    /// A shared proxy pod was lost: nothing replaces it within the spec, so the run's next
    /// driver on the node starts another one. Returns the spec's failure.
    fn lost_shared_pod(&self, shared: &SharedProxies, node: &str, reason: &str) -> String {
        let Some(state) = self.inner.per_node.get(node) else { return reason.to_owned() };
        let lost = lock(&state.pod).clone().unwrap_or_default();
        shared.forget(node, lost.metadata.uid.as_deref());
        format!(
            "shared proxy pod {} on node {node}, which the kubelet plugin of driver {} used, was lost at {} ({reason})",
            pod_display(&lost),
            self.inner.name,
            rfc3339(SystemTime::now())
        )
    }

    /// Moves the plugin of `node` from its lost pod to the replacement: stops the plugin of the
    /// lost pod first (while its container may still run, so that its proxy processes cannot
    /// remove the replacement's sockets, which live at the same host paths), then waits for the
    /// replacement and starts the plugin there with the same call log, health and prepared
    /// claims (the node's, kept in its [`NodeState`] all along, so that they stay visible while
    /// the plugin moves). `Err`: why it cannot.
    async fn move_plugin(&self, node: &str, reason: String) -> Result<(), String> {
        let inner = &self.inner;
        let Some(state) = inner.per_node.get(node) else { return Ok(()) };
        let lost_at = SystemTime::now();
        let lost = lock(&state.pod).clone().unwrap_or_default();
        let lost_name = pod_display(&lost);
        tracing::warn!(driver = %inner.name, %node, pod = %lost_name, %reason, "proxy pod lost; moving the plugin to its replacement");
        // Stopped meanwhile (teardown): nothing to move. The claims stay with the node.
        let Some(claim_state) = lock(&state.claims).as_ref().map(|c| c.state().clone()) else {
            return Ok(());
        };
        let Some(old) = lock(&state.plugin).take() else { return Ok(()) };
        // The old plugin stops while the ReplicaSet brings up the replacement.
        let stop_old = async {
            let began = std::time::Instant::now();
            if tokio::time::timeout(STOP_LOST_TIMEOUT, old.stop()).await.is_err() {
                tracing::warn!(driver = %inner.name, %node, "the plugin of the lost proxy pod did not stop within {STOP_LOST_TIMEOUT:?}; dropped");
            } else {
                tracing::info!(driver = %inner.name, %node, took = ?began.elapsed(), "the plugin of the lost proxy pod stopped");
            }
        };
        let lost_uid = lost.metadata.uid.clone();
        let pods: Api<Pod> = Api::namespaced(inner.admin.clone(), &inner.namespace);
        let instance = format!("{}{}", inner.name, inner.config.instance_suffix);
        let config = watcher::Config::default().labels(&format!("{INSTANCE_LABEL}={instance}"));
        let what =
            format!("a ready replacement of proxy pod {lost_name} of driver {} on node {node}", inner.name);
        let timeout = inner.config.replacement_timeout;
        let replacement = async {
            let began = std::time::Instant::now();
            let found = wait::objects(&pods, config, what, timeout, |pods| {
                Verdict::done_if(pods.iter().any(|p| is_replacement(p, node, lost_uid.as_deref())))
            })
            .await;
            tracing::info!(driver = %inner.name, %node, took = ?began.elapsed(), ok = found.is_ok(), "waited for the replacement proxy pod");
            found
        };
        let ((), found) = tokio::join!(stop_old, replacement);
        let fail = |detail: String| {
            format!(
                "proxy pod {lost_name} of driver {} on node {node} was deleted at {} ({reason}); no replacement ready after {timeout:?}: {detail}",
                inner.name,
                rfc3339(lost_at)
            )
        };
        let found = found.map_err(|e| fail(e.to_string()))?;
        let Some(new_pod) = found.into_iter().find(|p| is_replacement(p, node, lost_uid.as_deref())) else {
            return Err(fail("the wait ended without one".to_owned()));
        };
        let new_name = pod_display(&new_pod);
        let first_call = state.calls.log().records.iter().map(|r| r.id + 1).max().unwrap_or(0);
        let started = self
            .start_node_plugin(node, state, new_pod.clone(), claim_state)
            .await
            .map_err(|e| fail(format!("the plugin did not start in {new_name}: {e}")))?;
        *lock(&state.pod) = Some(new_pod);
        *lock(&state.plugin) = Some(started);
        let moved = ProxyMove {
            node: node.to_owned(),
            from: lost_name,
            to: new_name,
            reason,
            lost_at,
            moved_at: SystemTime::now(),
            first_call,
        };
        tracing::warn!(driver = %inner.name, "kubelet plugin moved to a replacement proxy pod: {moved}");
        lock(&state.moves).push(moved);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodSpec, PodStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn pod(uid: &str, node: &str, phase: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta { uid: Some(uid.into()), ..Default::default() },
            spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_replacement_is_another_ready_running_pod_on_the_node() {
        assert!(is_replacement(&pod("new", "n1", "Running", true), "n1", Some("old")));
        assert!(!is_replacement(&pod("old", "n1", "Running", true), "n1", Some("old")));
        assert!(!is_replacement(&pod("new", "n2", "Running", true), "n1", Some("old")));
        assert!(!is_replacement(&pod("new", "n1", "Pending", false), "n1", Some("old")));
        assert!(!is_replacement(&pod("new", "n1", "Running", false), "n1", Some("old")));
        let mut deleting = pod("new", "n1", "Running", true);
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!is_replacement(&deleting, "n1", Some("old")));
    }

    #[test]
    fn times_are_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_607_200);
        assert_eq!(rfc3339(t), "2025-12-01T16:40:00Z");
    }
}
