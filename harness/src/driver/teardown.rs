//! Stopping a driver's plugins: in the middle of a spec ([`Driver::stop`]) and at its cleanup.

use super::*;

impl Driver {
    /// Upstream's `TearDown` in the middle of a spec (e.g. to replace this instance by another
    /// one of the same driver): stops every node's plugin, so that its sockets go away and the
    /// kubelets unregister it, then scales its own proxy pods to zero (shared ones stay for the
    /// run's other drivers). RBAC, policy and the
    /// ResourceSlices stay; the teardown registered by [`Driver::start`] still runs at the end
    /// and finds nothing left to stop. Without kubelet this does nothing.
    pub async fn stop(&self) -> Result<(), DriverError> {
        let inner = &self.inner;
        if !inner.config.with_kubelet {
            return Ok(());
        }
        tracing::info!(driver = %inner.name, instance = %inner.config.instance_suffix, "stopping driver");
        self.stop_plugins().await;
        if inner.shared.is_some() {
            // The run's shared pods stay for its other drivers.
            return Ok(());
        }
        let rs_api: Api<ReplicaSet> = Api::namespaced(inner.admin.clone(), &inner.namespace);
        let rs_name = format!("dra-test-driver{}{}", inner.config.name_suffix, inner.config.instance_suffix);
        scale_proxy_down(&rs_api, &rs_name, &inner.name).await
    }

    /// [`Driver::stop_plugin`] for every node of the driver, at the same time.
    pub(super) async fn stop_plugins(&self) {
        futures::future::join_all(self.inner.per_node.keys().map(|node| self.stop_plugin(node))).await;
    }

    /// Stops a node's plugin for good: no more moves to replacement proxy pods, the plugin (if
    /// it runs: a move that failed left none) stops, and the node's claim state is given back.
    /// Claims it still holds as prepared (the kubelet did not unprepare them, e.g. after a
    /// failed spec) would leave their CDI files on the node: those are then removed through the
    /// proxy pod, with a warning, unless another instance of the driver still runs on the node
    /// and shares the claims (it may still be asked to unprepare them). With device metadata,
    /// the last instance also removes the metadata directory (neither is possible when the
    /// proxy pod was lost and not even a rescue pod ran: they stay, with a warning). Stopping a
    /// stopped plugin does nothing.
    pub(super) async fn stop_plugin(&self, node: &str) {
        let driver = &self.inner.name;
        let Some(node_state) = self.inner.per_node.get(node) else { return };
        // No more moves first: the pods are about to go.
        drop(lock(&node_state.supervisor).take());
        let plugin = lock(&node_state.plugin).take();
        let ran = plugin.is_some();
        // Stop serving first, so that the prepared claims no longer change through this instance.
        if let Some(plugin) = plugin {
            plugin.stop().await;
        }
        let Some(claims) = lock(&node_state.claims).take() else { return };
        let Some(config) = lock(&node_state.plugin_config).clone() else { return };
        let state = claims.state().clone();
        let cdi_dir = config.cdi_dir.clone();
        let metadata = config.metadata.clone();
        let leftover = state.prepared_claims();
        let last = claims.release();
        if !last && !leftover.is_empty() {
            tracing::info!(%driver, %node, claims = ?leftover, "another instance of the driver still runs on the node and keeps the prepared claims");
        }
        let leftover_files = last && !leftover.is_empty();
        if leftover_files {
            tracing::warn!(%driver, %node, claims = ?leftover, "stopping a plugin that still holds prepared claims; removing their CDI files");
        }
        let remove_metadata_dir = last && metadata.is_some();
        if !leftover_files && !remove_metadata_dir {
            return;
        }
        if let Some(lost) = lock(&node_state.lost).clone().filter(|_| !ran) {
            tracing::warn!(%driver, %node, claims = ?leftover, "no proxy pod reaches the node ({lost}): the CDI files of these claims and the device metadata stay there");
            return;
        }
        let pod = self.proxy_pod(node).as_ref().map(crate::tunnel::PodRef::from_pod);
        let Some(Ok(pod)) = pod else { return };
        let files = crate::podexec::PodFiles::new(Arc::new(crate::podexec::PodExec::new(
            self.inner.stream.clone(),
            pod,
        )));
        for claim in leftover.iter().filter(|_| leftover_files) {
            let devices = state.prepared_devices(claim).unwrap_or_default();
            let mut requests: Vec<&String> = devices.iter().flat_map(|d| &d.requests).collect();
            requests.sort();
            requests.dedup();
            for request in requests {
                let mut paths = vec![crate::plugin::spec_path(&cdi_dir, driver, &claim.uid, request)];
                if metadata.is_some() {
                    paths.push(crate::plugin::metadata::cdi_spec_path(&cdi_dir, driver, &claim.uid, request));
                }
                for path in paths {
                    if let Err(e) = crate::plugin::FileOps::remove(&files, &path).await {
                        tracing::warn!(%driver, %node, error = %e, "cannot remove a leftover CDI file");
                    }
                }
            }
        }
        // The last instance removes the metadata directory with whatever is left in it (the
        // namespaces of leftover claims, which name their directories, are not kept).
        if let Some(metadata) = &metadata
            && last
            && let Err(e) = crate::plugin::FileOps::remove_all(&files, &metadata.host_root()).await
        {
            tracing::warn!(%driver, %node, error = %e, "cannot remove the device metadata directory");
        }
    }
}
