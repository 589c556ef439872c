//! A driver that survives the loss of a proxy pod: the ReplicaSet behind the pod (the driver's
//! own, or the run's shared one of the node, see `shared_proxy.rs`) replaces a deleted pod at
//! once, and the node's plugin moves to the replacement — new proxy processes, tunnels and CDI
//! file operations in the new pod, the same call log, health and prepared claims, and the
//! plugin's identity bound to the new pod (see `identity.rs`). With a shared pod, every driver
//! whose plugin ran in it moves on its own (each watches the pod), to the same replacement, on
//! the same ports. The prepared claims belong to the node, not to the running plugin: they stay
//! what they were while the plugin moves ([`Driver::prepared_claims`] does not go empty in
//! between), and their CDI files stay on the node (the pods mount its CDI directory; nothing
//! removes them on a move). The kubelet sees the registration socket appear again and registers
//! the plugin anew (new calls in the same log); a prepare it retries for a claim the plugin holds
//! answers with the claim's devices again without rewriting its files, one it had not finished
//! writes them through the new pod, and an unprepare it retries removes them through the new pod.
//! A call the lost pod was carrying fails for the kubelet with its connection, and the kubelet
//! retries it.
//!
//! A pod that is not replaced in time ([`DriverConfig::replacement_timeout`]) fails the spec at once
//! ([`Ctx::fail_now`](crate::framework::Ctx::fail_now)) with what was lost and when, instead of
//! leaving the spec to run into its timeout minutes later. Its clean-up does not leave the
//! spec's pods to a kubelet that cannot unprepare their claims (it would try for ever, and the
//! pods would hold the namespace): before they are deleted, the plugin runs again in a rescue
//! pod of the driver's own on the node, and the kubelet unprepares through it; where not even
//! that runs, the pods are deleted at once (grace period 0, as the run's sweep does). See
//! [`Driver::settle_lost_plugins`].

use std::{collections::BTreeSet, fmt, time::SystemTime};

use k8s_openapi::api::core::v1::Pod;

use super::*;

/// How long the plugin of a lost pod gets to stop (its pod is gone; its exec and port-forward
/// calls fail at once).
const STOP_LOST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a rescue pod (see [`Driver::settle_lost_plugins`]) may take to run.
const RESCUE_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A proxy pod the plugin of a node lost: which, when, why.
struct Loss {
    /// The pod (`namespace/name`).
    from: String,
    /// When the loss was noticed.
    at: SystemTime,
    /// What happened (or, for a rescue pod, why the plugin runs there).
    reason: String,
}

fn pod_display(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// RFC 3339 UTC of `t` (seconds).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let secs = i64::try_from(secs).unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{secs}s"))
}

/// Whether `claim` is allocated with a device of `driver`.
fn allocated_for(claim: &ResourceClaim, driver: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .is_some_and(|results| results.iter().any(|r| r.driver == driver))
}

/// The names of the claims `pod` uses (from its status where the claims were generated, else
/// from its spec).
fn pod_claims(pod: &Pod) -> BTreeSet<String> {
    let from_status = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.resource_claim_name.clone());
    let from_spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.resource_claim_name.clone());
    from_status.chain(from_spec).collect()
}

impl Driver {
    /// The moves of a node's plugin to replacement proxy pods so far (empty while its first pod
    /// runs).
    pub fn proxy_moves(&self, node: &str) -> Vec<ProxyMove> {
        self.inner.per_node.get(node).map(|s| lock(&s.moves).clone()).unwrap_or_default()
    }

    /// `f` of the node's running plugin; while the plugin moves to a replacement proxy pod,
    /// once it runs there. Fails at once when the node has no plugin (stopped, lost without a
    /// replacement, or the driver runs without kubelet), and when the move takes longer than it
    /// may.
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
            let moving = state.moving.load(Ordering::SeqCst);
            let lost = lock(&state.lost).clone();
            async move {
                match (running, lost) {
                    (Some(value), _) => Attempt::Done(value),
                    (None, Some(lost)) => Attempt::Fail(lost),
                    (None, None) if moving => {
                        Attempt::Retry("it is moving to a replacement proxy pod".to_owned())
                    }
                    (None, None) => {
                        Attempt::Fail("it does not run (stopped, or started without kubelet)".to_owned())
                    }
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
                let Some(state) = this.inner.per_node.get(&node) else { return };
                state.moving.store(true, Ordering::SeqCst);
                let moved = this.move_plugin(&node, reason).await;
                if let Err(message) = &moved {
                    *lock(&state.lost) = Some(message.clone());
                }
                state.moving.store(false, Ordering::SeqCst);
                if let Err(message) = moved {
                    ctx.fail_now(message);
                    return;
                }
            }
        });
        *lock(&state.supervisor) = Some(tokio_util::task::AbortOnDropHandle::new(task));
    }

    /// Where the replacements of a node's proxy pod come from: the driver's own ReplicaSet, or
    /// the run's shared one of the node.
    fn proxy_pods(&self, node: &str) -> Option<ProxyPods> {
        let inner = &self.inner;
        match &inner.shared {
            Some(shared) => shared.pods_of(&inner.admin, node),
            None => Some(ProxyPods {
                api: Api::namespaced(inner.admin.clone(), &inner.namespace),
                selector: format!("{INSTANCE_LABEL}={}{}", inner.name, inner.config.instance_suffix),
            }),
        }
    }

    /// Moves the plugin of `node` from its lost pod to the replacement: stops the plugin of the
    /// lost pod first (while its container may still run, so that its proxy processes cannot
    /// remove the replacement's sockets, which live at the same host paths), then waits for the
    /// replacement and starts the plugin there with the same call log, health and prepared
    /// claims (the node's, kept in its [`NodeState`] all along, so that they stay visible while
    /// the plugin moves), with its identity bound to the replacement. `Err`: why it cannot.
    async fn move_plugin(&self, node: &str, reason: String) -> Result<(), String> {
        let inner = &self.inner;
        let Some(state) = inner.per_node.get(node) else { return Ok(()) };
        let lost_at = SystemTime::now();
        let lost = lock(&state.pod).clone().unwrap_or_default();
        let lost_name = pod_display(&lost);
        tracing::warn!(driver = %inner.name, %node, pod = %lost_name, %reason, "proxy pod lost; moving the plugin to its replacement");
        // Stopped meanwhile (teardown): nothing to move. The claims stay with the node.
        if lock(&state.claims).is_none() {
            return Ok(());
        }
        let Some(old) = lock(&state.plugin).take() else { return Ok(()) };
        let kind = if inner.shared.is_some() { "shared proxy pod" } else { "proxy pod" };
        let timeout = inner.config.replacement_timeout;
        let fail = |detail: String| {
            format!(
                "{kind} {lost_name} on node {node}, which the kubelet plugin of driver {} used, was lost at {} ({reason}); no replacement ready after {timeout:?}: {detail}",
                inner.name,
                rfc3339(lost_at)
            )
        };
        let Some(pods) = self.proxy_pods(node) else {
            return Err(fail("the run's shared proxy pods have no namespace".to_owned()));
        };
        // The old plugin stops while the ReplicaSet brings up the replacement.
        let stop_old = async {
            let began = std::time::Instant::now();
            if tokio::time::timeout(STOP_LOST_TIMEOUT, old.stop()).await.is_err() {
                tracing::warn!(driver = %inner.name, %node, "the plugin of the lost proxy pod did not stop within {STOP_LOST_TIMEOUT:?}; dropped");
            } else {
                tracing::info!(driver = %inner.name, %node, took = ?began.elapsed(), "the plugin of the lost proxy pod stopped");
            }
        };
        let what =
            format!("a ready replacement of {kind} {lost_name} on node {node} (driver {})", inner.name);
        let replacement = async {
            let began = std::time::Instant::now();
            let found = pods.ready_on(node, lost.metadata.uid.as_deref(), what, timeout).await;
            tracing::info!(driver = %inner.name, %node, took = ?began.elapsed(), ok = found.is_ok(), "waited for the replacement proxy pod");
            found
        };
        let ((), found) = tokio::join!(stop_old, replacement);
        let new_pod = found.map_err(|e| fail(e.to_string()))?;
        let loss = Loss { from: lost_name.clone(), at: lost_at, reason: reason.clone() };
        self.run_in(node, state, new_pod, loss).await.map_err(fail)?;
        Ok(())
    }

    /// Starts the plugin of `node` in `pod`, in place of the pod of `loss`, with the node's call
    /// log, health and prepared claims and its identity bound to `pod`, and records the move.
    /// `Err`: what failed.
    async fn run_in(&self, node: &str, state: &NodeState, pod: Pod, loss: Loss) -> Result<ProxyMove, String> {
        let to = pod_display(&pod);
        let claim_state = lock(&state.claims)
            .as_ref()
            .map(|c| c.state().clone())
            .ok_or_else(|| "the plugin was stopped meanwhile".to_owned())?;
        if let Some(identity) = &state.identity {
            identity.bind(&pod).map_err(|e| format!("the plugin's identity in {to}: {e}"))?;
        }
        let first_call = state.calls.log().records.iter().map(|r| r.id + 1).max().unwrap_or(0);
        let started = self
            .start_node_plugin(node, state, pod.clone(), claim_state)
            .await
            .map_err(|e| format!("the plugin did not start in {to}: {e}"))?;
        *lock(&state.pod) = Some(pod);
        *lock(&state.plugin) = Some(started);
        let moved = ProxyMove {
            node: node.to_owned(),
            from: loss.from,
            to,
            reason: loss.reason,
            lost_at: loss.at,
            moved_at: SystemTime::now(),
            first_call,
        };
        tracing::warn!(driver = %self.inner.name, "kubelet plugin moved to another proxy pod: {moved}");
        lock(&state.moves).push(moved.clone());
        Ok(moved)
    }

    /// A clean-up that runs before the spec's pods are deleted (registered with
    /// [`Ctx::defer_first`]): waits for the moves in progress to end, and on each node whose
    /// plugin was lost without a replacement, brings the plugin back for the clean-up in a rescue
    /// pod of the driver's own ([`proxy::rescue_pod`], in the spec's namespace), so that the
    /// kubelet unprepares the claims through it and the plugin removes their CDI files. Where
    /// no rescue pod runs either (the node runs no pods), the pods there that use a claim of the
    /// driver are deleted at once (grace period 0: no kubelet can unprepare their claims, so they
    /// would stay terminating until the namespace's wait gives up), and the node's plugin stops
    /// for good, so that it no longer holds their claims as prepared.
    pub(super) async fn settle_lost_plugins(&self) -> anyhow::Result<()> {
        let inner = &self.inner;
        for (node, state) in &inner.per_node {
            let what =
                format!("the move of the kubelet plugin of driver {} on node {node} to end", inner.name);
            let timeout = inner.config.replacement_timeout + STOP_LOST_TIMEOUT;
            wait::poll(what, timeout, Duration::from_millis(100), || {
                let moving = state.moving.load(Ordering::SeqCst);
                async move { if moving { Attempt::Retry("it moves".to_owned()) } else { Attempt::Done(()) } }
            })
            .await?;
            let Some(lost) = lock(&state.lost).clone() else { continue };
            if lock(&state.claims).is_none() {
                continue;
            }
            match self.rescue(node, state, lost).await {
                Ok(moved) => {
                    tracing::warn!(driver = %inner.name, "the plugin serves the clean-up from a rescue pod: {moved}")
                }
                Err(e) => {
                    tracing::warn!(driver = %inner.name, %node, "no rescue pod for the plugin ({e}); deleting the pods that use its claims there at once");
                    self.force_delete_pods(node).await?;
                    self.stop_plugin(node).await;
                }
            }
        }
        Ok(())
    }

    /// Starts the plugin of `node`, lost for `lost`, in a rescue pod and waits until the kubelet
    /// registered it there. `Err`: why it could not.
    async fn rescue(&self, node: &str, state: &NodeState, lost: String) -> Result<ProxyMove, String> {
        let inner = &self.inner;
        let pod = proxy::rescue_pod(node, &inner.config.image, &inner.config.kubelet_root_dir)
            .map_err(|e| e.to_string())?;
        let pods: Api<Pod> = Api::namespaced(inner.admin.clone(), &inner.namespace);
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("cannot create a rescue pod on node {node}: {e}"))?;
        let name = created.metadata.name.unwrap_or_default();
        let what = format!("rescue pod {}/{name} on node {node} to run", inner.namespace);
        let running = wait::object(&pods, &name, what, RESCUE_TIMEOUT, |p| {
            Verdict::done_if(p.is_some_and(|p| is_ready_on(p, node, None)))
        })
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("rescue pod {name} is gone"))?;
        let from = lock(&state.pod).as_ref().map(pod_display).unwrap_or_default();
        let reason = format!("a rescue pod for the clean-up ({lost})");
        let loss = Loss { from, at: SystemTime::now(), reason };
        let moved = self.run_in(node, state, running, loss).await?;
        let first = moved.first_call;
        let what =
            format!("registration of driver {} by the kubelet of node {node} in the rescue pod", inner.name);
        state
            .calls
            .wait_for(what, move |log| registered_since(log, first), inner.config.registration_timeout)
            .await
            .map_err(|e| e.to_string())?;
        Ok(moved)
    }

    /// Deletes the pods of the driver's namespace on `node` that use a claim allocated with a
    /// device of the driver, with grace period 0.
    async fn force_delete_pods(&self, node: &str) -> anyhow::Result<()> {
        let inner = &self.inner;
        let claims: Api<ResourceClaim> = Api::namespaced(inner.admin.clone(), &inner.namespace);
        let ours: BTreeSet<String> = claims
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|c| allocated_for(c, &inner.name))
            .filter_map(|c| c.metadata.name)
            .collect();
        let pods: Api<Pod> = Api::namespaced(inner.admin.clone(), &inner.namespace);
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        for pod in pods.list(&on_node).await?.items {
            if pod_claims(&pod).is_disjoint(&ours) {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            tracing::warn!(driver = %inner.name, %node, pod = %name, "deleting the pod with grace period 0");
            match pods.delete(&name, &DeleteParams::default().grace_period(0)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_claims_come_from_its_status_and_its_spec() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "containers": [],
                "resourceClaims": [
                    {"name": "direct", "resourceClaimName": "shared-claim"},
                    {"name": "templated", "resourceClaimTemplateName": "t"},
                ],
            },
            "status": {
                "resourceClaimStatuses": [
                    {"name": "templated", "resourceClaimName": "pod-templated-x1"},
                ],
            },
        }))
        .unwrap();
        assert_eq!(
            pod_claims(&pod),
            BTreeSet::from(["pod-templated-x1".to_owned(), "shared-claim".to_owned()])
        );
        assert!(pod_claims(&Pod::default()).is_empty());
    }

    #[test]
    fn a_claim_is_the_drivers_when_a_result_names_it() {
        let claim = |driver: &str| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({
                "spec": {},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": driver, "pool": "p", "device": "d"},
                ]}}},
            }))
            .unwrap()
        };
        assert!(allocated_for(&claim("a.k8s.io"), "a.k8s.io"));
        assert!(!allocated_for(&claim("b.k8s.io"), "a.k8s.io"));
        assert!(!allocated_for(&ResourceClaim::default(), "a.k8s.io"));
    }

    #[test]
    fn times_are_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_607_200);
        assert_eq!(rfc3339(t), "2025-12-01T16:40:00Z");
    }
}
