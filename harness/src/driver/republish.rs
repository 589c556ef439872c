//! A node's ResourceSlices published again when its kubelet registers the plugin again. A kubelet
//! that starts deletes every ResourceSlice of its node (pkg/kubelet/cm/dra: its plugin manager
//! wipes them at startup, since the plugins that still run will register again and publish
//! theirs); a real driver's slice controller then publishes them anew (upstream's
//! kubeletplugin helper reconciles its slices all along). The driver does the same for its
//! node-local slices each time a node's kubelet registers the plugin after the first time (a
//! kubelet restart, or the plugin moving to a replacement proxy pod): identical slices that are
//! still there are kept, so a registration that wiped nothing writes nothing. The kubelet's wipe
//! runs beside its first registrations, so the missing slices are published again for
//! [`REPUBLISH_ROUNDS`] × [`REPUBLISH_EVERY`] after each.

use super::*;

/// How long one wait for the next registration lasts before it starts again (it ends with the
/// spec's cleanup).
const WAIT_SLICE: Duration = Duration::from_secs(3600);
/// After a registration, how often and how many times the slices that are missing are published.
const REPUBLISH_EVERY: Duration = Duration::from_secs(1);
/// See [`REPUBLISH_EVERY`].
const REPUBLISH_ROUNDS: u32 = 10;

impl Driver {
    /// For each node with a plugin: republishes the node's slices of `resources` whenever its
    /// kubelet registers the plugin again; stopped by a cleanup registered here (it runs before
    /// the cleanups registered earlier, which delete the slices).
    pub(super) fn republish_on_registration(&self, ctx: &Ctx, resources: &Resources) {
        let inner = &self.inner;
        for (node, state) in &inner.per_node {
            let Some(mine) = resources.get(node) else { continue };
            let only: Resources = BTreeMap::from([(node.clone(), mine.clone())]);
            let calls = state.calls.clone();
            let this = self.clone();
            let node_name = node.clone();
            let task = tokio::spawn(async move {
                let mut seen = calls.count(Method::NotifyRegistrationStatus);
                loop {
                    let next =
                        calls.wait_at_least(Method::NotifyRegistrationStatus, seen + 1, WAIT_SLICE).await;
                    if next.is_err() {
                        continue;
                    }
                    seen = calls.count(Method::NotifyRegistrationStatus);
                    tracing::info!(driver = %this.inner.name, node = %node_name, "the kubelet registered the plugin again; publishing the node's ResourceSlices again");
                    // The kubelet's startup wipe runs beside its first registrations and may
                    // come just after one: publish again (what is missing) for a while.
                    for _ in 0..REPUBLISH_ROUNDS {
                        if let Err(e) = this.publish_node_local(&only).await {
                            tracing::warn!(driver = %this.inner.name, node = %node_name, error = %e, "publishing the node's ResourceSlices again failed");
                        }
                        tokio::time::sleep(REPUBLISH_EVERY).await;
                    }
                }
            });
            let task = tokio_util::task::AbortOnDropHandle::new(task);
            ctx.defer(
                format!("stop republishing the ResourceSlices of driver {} on node {node}", inner.name),
                async move {
                    drop(task);
                    Ok(())
                },
            );
        }
    }
}
