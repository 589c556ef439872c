//! Setting up a driver after its proxy pods run: the plugins per node, RBAC in effect, the
//! node-local ResourceSlices, the kubelets' registration.

use super::*;

impl Driver {
    /// The plugins' device metadata configuration: files under the plugin data directory,
    /// which the proxy pods mount at the node's path.
    pub(super) fn metadata_config(&self) -> Result<Option<MetadataConfig>, DriverError> {
        let inner = &self.inner;
        let Some(versions) = &inner.config.device_metadata else { return Ok(None) };
        let dir = proxy::plugin_data_dir(&inner.config.kubelet_root_dir, &inner.name);
        MetadataConfig::new(dir, versions)
            .map(Some)
            .map_err(|source| DriverError::Metadata { driver: inner.name.clone(), source })
    }

    /// Starts one proxied plugin per proxy pod and registers their stop (the scale-down is
    /// registered before; the nodes' plugins stop at the same time), and per node the
    /// supervisor that moves the plugin to a replacement pod (see [`Driver::proxy_moves`]), with
    /// the clean-up that settles a plugin lost without one ([`Driver::settle_lost_plugins`]).
    pub(super) async fn start_plugins(&self, ctx: &Ctx) -> Result<(), DriverError> {
        let inner = &self.inner;
        let this = self.clone();
        let nodes: Vec<&str> = inner.per_node.keys().map(String::as_str).collect();
        ctx.defer(
            format!("stop the kubelet plugins of driver {} on nodes {}", inner.name, nodes.join(", ")),
            async move {
                this.stop_plugins().await;
                Ok(())
            },
        );
        // Before the spec's pods are deleted: a node whose plugin was lost for good must not
        // leave them to a kubelet that cannot unprepare their claims.
        let this = self.clone();
        ctx.defer_first(
            format!("settle the kubelet plugins of driver {} that moved or were lost", inner.name),
            async move { this.settle_lost_plugins().await },
        );
        for (node, state) in &inner.per_node {
            let Some(pod) = lock(&state.pod).clone() else { continue };
            let plugin = PluginConfig::new(&inner.name, node, "/cdi")
                .dra_endpoint(format!(
                    "{}/dra.sock",
                    proxy::plugin_data_dir(&inner.config.kubelet_root_dir, &inner.name)
                ))
                .dra_v1(inner.config.dra_v1)
                .dra_v1beta1(inner.config.dra_v1beta1)
                .health_v1(inner.config.health_v1)
                .health_v1alpha1(inner.config.health_v1alpha1)
                .metadata(self.metadata_config()?);
            *lock(&state.plugin_config) = Some(plugin);
            let claims = shared_claims::Lease::acquire(&inner.name, node);
            let claim_state = claims.state().clone();
            // The node's, from now until the plugin stops for good (a move keeps it).
            *lock(&state.claims) = Some(claims);
            let started = self.start_node_plugin(node, state, pod, claim_state).await?;
            *lock(&state.plugin) = Some(started);
            self.supervise(ctx, node);
        }
        Ok(())
    }

    /// Starts the proxied plugin of `node` in `pod` with the node's configuration.
    pub(super) async fn start_node_plugin(
        &self,
        node: &str,
        state: &NodeState,
        pod: Pod,
        claim_state: crate::plugin::ClaimState,
    ) -> Result<ProxiedPlugin, DriverError> {
        let inner = &self.inner;
        let mut plugin = lock(&state.plugin_config).clone().ok_or_else(|| DriverError::Plugin {
            driver: inner.name.clone(),
            node: node.to_owned(),
            source: Box::new(ProxiedError::NotConfigured),
        })?;
        if inner.config.rolling_update {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if uid.is_empty() {
                return Err(DriverError::MissingPodUid {
                    driver: inner.name.clone(),
                    pod: format!("{}/{}", inner.namespace, pod.metadata.name.clone().unwrap_or_default()),
                });
            }
            plugin = plugin.rolling_update_uid(uid);
        }
        let forward = match &inner.config.forward {
            Some(resolver) => Some(resolver.resolve(node, &pod).await.map_err(|source| {
                DriverError::Forward { driver: inner.name.clone(), node: node.to_owned(), source }
            })?),
            None => None,
        };
        let claims_client = match &state.identity {
            Some(identity) => identity.client().clone(),
            None => inner.admin.clone(),
        };
        ProxiedPlugin::start(ProxiedPluginSpec {
            forward,
            client: inner.stream.clone(),
            pod,
            plugin,
            claims: Arc::new(KubeClaims::new(claims_client)),
            calls: state.calls.clone(),
            health: state.health.clone(),
            claim_state,
            ports: inner.ports,
        })
        .await
        .map_err(|source| DriverError::Plugin {
            driver: inner.name.clone(),
            node: node.to_owned(),
            source: Box::new(source),
        })
    }

    /// Waits until RBAC and the admission policy are in effect for `identity`, a plugin's
    /// identity on `node` (the policy looks only at its node): it may create (dry run) a slice
    /// on its node, and may not create one on another node. It needs no proxy pod, so it runs
    /// while they start.
    pub(super) async fn wait_permissions_effective(
        identity: kube::Client,
        driver: &str,
        node: &str,
    ) -> Result<(), DriverError> {
        let api: Api<ResourceSlice> = Api::all(identity);
        let probe = |node_name: &str| -> ResourceSlice {
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": { "generateName": "dra-e2e-permission-probe-" },
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": { "name": "probe", "generation": 1, "resourceSliceCount": 1 },
                },
            }))
            .unwrap_or_default()
        };
        let own = probe(node);
        let other = probe("dra-e2e-permission-probe-node");
        let dry = PostParams { dry_run: true, ..Default::default() };
        let what = format!("RBAC and ResourceSlice policy of driver {driver} to take effect");
        wait::poll(what, PERMISSIONS_TIMEOUT, Duration::from_millis(200), || {
            let (api, own, other, dry) = (api.clone(), own.clone(), other.clone(), dry.clone());
            async move {
                if let Err(e) = api.create(&dry, &own).await {
                    return Attempt::Retry(format!("creating a slice on its own node failed: {e}"));
                }
                match api.create(&dry, &other).await {
                    Ok(_) => Attempt::Retry("creating a slice on another node was allowed".to_owned()),
                    Err(kube::Error::Api(s)) if s.message.contains("may not modify") => Attempt::Done(()),
                    Err(e) => Attempt::Retry(format!(
                        "creating a slice on another node failed with an unexpected error: {e}"
                    )),
                }
            }
        })
        .await?;
        Ok(())
    }

    /// Creates the node-local slices of every node, with the node's plugin client when there
    /// is one (as the plugin would), else with the admin client.
    pub(super) async fn publish_node_local(&self, resources: &Resources) -> Result<(), DriverError> {
        let inner = &self.inner;
        for (node, res) in resources.iter().filter(|(k, _)| k.as_str() != MULTI_HOST) {
            let node_obj =
                match inner.nodes.objects().iter().find(|n| n.metadata.name.as_deref() == Some(node)) {
                    Some(n) => n.clone(),
                    None => Api::<Node>::all(inner.admin.clone())
                        .get(node)
                        .await
                        .map_err(api_error(format!("get node {node}")))?,
                };
            let client = self.client(node).cloned().unwrap_or_else(|| inner.admin.clone());
            let api: Api<ResourceSlice> = Api::all(client);
            // A pool reconciled by its own controller is not published here.
            let mut res = res.clone();
            if let Some(pool) = &inner.config.reconcile_pool {
                res.pools.remove(pool);
            }
            // Another instance of the same driver (an update) may have published this node's
            // pools already: keep identical slices, as upstream's slice controller does.
            let existing = Api::<ResourceSlice>::all(inner.admin.clone())
                .list(
                    &ListParams::default()
                        .fields(&format!("spec.driver={},spec.nodeName={node}", inner.name)),
                )
                .await
                .map_err(api_error(format!(
                    "list the ResourceSlices of driver {} on node {node}",
                    inner.name
                )))?
                .items;
            for slice in resources::node_slices(&inner.name, &node_obj, &res) {
                if let Some(same) = existing.iter().find(|e| same_slice_content(e, &slice)) {
                    tracing::info!(slice = ?same.metadata.name, node = %node, "keeping the identical ResourceSlice of an earlier instance");
                    continue;
                }
                api.create(&PostParams::default(), &slice).await.map_err(api_error(format!(
                    "publish a ResourceSlice of driver {} for node {node}",
                    inner.name
                )))?;
            }
        }
        Ok(())
    }

    /// With [`DriverConfig::reconcile_pool`]: per node that has that pool, a controller that
    /// publishes and reconciles it with the admin client, stopped at teardown before the
    /// driver's slices are deleted.
    pub(super) fn start_pool_controllers(&self, ctx: &Ctx, resources: &Resources) {
        let inner = &self.inner;
        let Some(pool) = &inner.config.reconcile_pool else { return };
        for (node, res) in resources.iter().filter(|(k, _)| k.as_str() != MULTI_HOST) {
            let Some(desired) = res.pools.get(pool) else { continue };
            let only = DriverResources { pools: BTreeMap::from([(pool.clone(), desired.clone())]) };
            let controller = crate::slice_controller::SliceController::start_for_pool(
                inner.admin.clone(),
                &inner.name,
                only,
                pool,
            );
            tracing::info!(driver = %inner.name, %node, %pool, "reconciling the pool with the admin client");
            ctx.defer(
                format!("stop reconciling pool {pool} of driver {} for node {node}", inner.name),
                async move {
                    controller.stop();
                    Ok(())
                },
            );
        }
    }

    /// Waits until every node's kubelet reported a successful registration.
    pub(super) async fn wait_registered(&self) -> Result<(), DriverError> {
        let timeout = self.inner.config.registration_timeout;
        let waits = self.inner.per_node.iter().map(|(node, state)| {
            let calls = state.calls.clone();
            let node = node.clone();
            let driver = self.inner.name.clone();
            async move {
                let what = format!("registration of driver {driver} by the kubelet of node {node}");
                calls
                    .wait_for(what, is_registered, timeout)
                    .await
                    .map_err(|source| DriverError::NotRegistered { driver, node, source: Box::new(source) })
            }
        });
        futures::future::try_join_all(waits).await?;
        Ok(())
    }
}
