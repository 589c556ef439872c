//! Upstream's `control plane` context with `DriverResources(1)` on 1 to 4 nodes and the plugin
//! identity (ServiceAccount with node extras, RBAC and the ValidatingAdmissionPolicy of
//! `manifests/plugin-permissions.yaml`): what a kubelet plugin may write.

use anyhow::Context as _;
use harness::{
    builder::{Builder, node_name},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

use super::{
    FG_DEVICE_STATUS,
    network::{device_status, expect_devices, with_devices},
    single_node::claims_api,
};

/// A node that does not exist: slices for it disturb nobody.
const FICTIONAL_NODE: &str = "dra-fictional-node";

/// Registers the specs (inside the `control plane` context).
pub fn register(r: &mut Registry) {
    r.it("must apply per-node permission checks", per_node_permission_checks);
    r.it(
        "must be possible for a node ServiceAccount to update the node ResourceClaim.Status.Devices once allocated",
        node_account_updates_device_status,
    )
    .label(FG_DEVICE_STATUS);
}

/// 1-4 nodes, one device each, published through each node's plugin identity.
async fn setup(ctx: &Ctx) -> SpecResult<(Nodes, Driver, Builder)> {
    let nodes = Nodes::select(ctx, 1, 4).await?;
    let driver =
        Driver::start(ctx, &nodes, DriverConfig::control_plane(resources::node_local(1)).rbac(true)).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    Ok((nodes, driver, b))
}

/// The policy's denial for a user on `user_node` writing `slice`.
fn denied_message(user_node: &str, slice: &ResourceSlice) -> String {
    let what = match slice.spec.node_name.as_deref() {
        Some(node) if !node.is_empty() => format!("resourceslices on node '{node}'"),
        _ => "cluster resourceslices".to_owned(),
    };
    format!("this user running on node '{user_node}' may not modify {what}")
}

/// Runs one ResourceSlice operation as one user and checks the outcome.
struct Checker {
    name: &'static str,
    api: Api<ResourceSlice>,
    node: Option<String>,
}

impl Checker {
    fn new(name: &'static str, client: &kube::Client, node: Option<&str>) -> Self {
        Checker { name, api: Api::all(client.clone()), node: node.map(str::to_owned) }
    }

    async fn create(&self, slice: &ResourceSlice) -> anyhow::Result<ResourceSlice> {
        self.api
            .create(&PostParams::default(), slice)
            .await
            .with_context(|| format!("CREATE: {} + {}", self.name, slice.name_any()))
    }

    async fn update(&self, slice: &ResourceSlice) -> anyhow::Result<ResourceSlice> {
        self.api
            .replace(&slice.name_any(), &PostParams::default(), slice)
            .await
            .with_context(|| format!("UPDATE: {} + {}", self.name, slice.name_any()))
    }

    async fn delete(&self, slice: &ResourceSlice) -> anyhow::Result<()> {
        self.api
            .delete(&slice.name_any(), &DeleteParams::default())
            .await
            .with_context(|| format!("DELETE: {} + {}", self.name, slice.name_any()))?;
        Ok(())
    }

    fn expect_denied<T>(
        &self,
        op: &str,
        slice: &ResourceSlice,
        result: Result<T, kube::Error>,
    ) -> anyhow::Result<()> {
        let node = self.node.as_deref().unwrap_or_default();
        let want = denied_message(node, slice);
        match result {
            Err(kube::Error::Api(s)) if s.message.contains(&want) => Ok(()),
            Err(e) => fail!(
                "{op}: {} + {}: expected an error containing {want:?}, got: {e}",
                self.name,
                slice.name_any()
            ),
            Ok(_) => fail!(
                "{op}: {} + {}: expected an error containing {want:?}, but it succeeded",
                self.name,
                slice.name_any()
            ),
        }
    }

    async fn fail_create(&self, slice: &ResourceSlice) -> anyhow::Result<()> {
        self.expect_denied("CREATE", slice, self.api.create(&PostParams::default(), slice).await)
    }

    async fn fail_update(&self, slice: &ResourceSlice) -> anyhow::Result<()> {
        self.expect_denied(
            "UPDATE",
            slice,
            self.api.replace(&slice.name_any(), &PostParams::default(), slice).await,
        )
    }

    async fn fail_delete(&self, slice: &ResourceSlice) -> anyhow::Result<()> {
        self.expect_denied(
            "DELETE",
            slice,
            self.api.delete(&slice.name_any(), &DeleteParams::default()).await,
        )
    }
}

/// A slice of `driver` with an empty pool, for `node` (or for all nodes).
fn slice(name: &str, driver: &str, pool: &str, node: Option<&str>) -> anyhow::Result<ResourceSlice> {
    let mut spec =
        json!({"driver": driver, "pool": {"name": pool, "generation": 0, "resourceSliceCount": 1}});
    match node {
        Some(node) => spec["nodeName"] = json!(node),
        None => spec["allNodes"] = json!(true),
    }
    Ok(serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?)
}

/// Deletes a slice at cleanup if it still exists.
fn delete_at_cleanup(ctx: &Ctx, name: &str) {
    ctx.delete_at_cleanup(Api::<ResourceSlice>::all(ctx.client().clone()), name.to_owned());
}

async fn per_node_permission_checks(ctx: Ctx) -> SpecResult {
    let (nodes, driver, _b) = setup(&ctx).await?;
    expect!(!nodes.names().iter().any(|n| n == FICTIONAL_NODE), "a real node is called {FICTIONAL_NODE}");
    // A plugin on a node that does not exist, so nothing interferes with what it creates.
    let fictional_client = driver.impersonate_kubelet_plugin(
        FICTIONAL_NODE,
        &format!("{FICTIONAL_NODE}-dra-plugin"),
        "12345",
    )?;
    let real_node = &nodes.names()[0];
    let real_client = driver.client(real_node).context("no plugin client for the real node")?;
    let real = Checker::new("real plugin", real_client, Some(real_node));
    let fictional = Checker::new("fictional plugin", &fictional_client, Some(FICTIONAL_NODE));
    let admin = Checker::new("admin", ctx.client(), None);

    // A slice on the fictional node.
    let node_slice = slice(
        &ctx.unique_name(&format!("{FICTIONAL_NODE}-slice")),
        "dra.example.com",
        "some-pool",
        Some(FICTIONAL_NODE),
    )?;
    delete_at_cleanup(&ctx, &node_slice.name_any());
    real.fail_create(&node_slice).await?;
    let created = fictional.create(&node_slice).await?;
    fictional.delete(&created).await?;
    let created = admin.create(&node_slice).await?;
    real.fail_update(&created).await?;
    let created = fictional.update(&created).await?;
    let created = admin.update(&created).await?;
    real.fail_delete(&created).await?;
    fictional.delete(&created).await?;

    // A slice for no particular node: only the admin may touch it.
    let cluster_slice =
        slice(&ctx.unique_name("cluster-slice"), "another.example.com", "cluster-pool", None)?;
    delete_at_cleanup(&ctx, &cluster_slice.name_any());
    real.fail_create(&cluster_slice).await?;
    fictional.fail_create(&cluster_slice).await?;
    let created = admin.create(&cluster_slice).await?;
    real.fail_update(&created).await?;
    fictional.fail_update(&created).await?;
    let created = admin.update(&created).await?;
    real.fail_delete(&created).await?;
    fictional.fail_delete(&created).await?;
    admin.delete(&created).await?;

    // Two real nodes: each plugin may write its own node's slices, not the other's.
    if let [a, b, ..] = nodes.names() {
        let client_a = driver.client(a).context("no plugin client")?;
        let client_b = driver.client(b).context("no plugin client")?;
        let plugin_a = Checker::new("plugin on the first node", client_a, Some(a));
        let plugin_b = Checker::new("plugin on the second node", client_b, Some(b));
        let slice_a = slice(&ctx.unique_name("first-node-slice"), "dra.example.com", "pool-a", Some(a))?;
        delete_at_cleanup(&ctx, &slice_a.name_any());
        plugin_b.fail_create(&slice_a).await?;
        let created = plugin_a.create(&slice_a).await?;
        plugin_b.fail_update(&created).await?;
        plugin_b.fail_delete(&created).await?;
        plugin_a.delete(&created).await?;
    } else {
        tracing::info!("one node only: the check between the plugins of two real nodes is left out");
    }

    // The driver's own slices were published through the same identities.
    for slice in driver.slices().await? {
        expect!(
            slice.spec.node_name.is_some() && slice.owner_references().iter().any(|o| o.kind == "Node"),
            "driver slice {} is not a node-local slice owned by its Node: {:?}",
            slice.name_any(),
            slice.spec
        );
    }
    Ok(())
}

async fn node_account_updates_device_status(ctx: Ctx) -> SpecResult {
    let (_nodes, driver, b) = setup(&ctx).await?;
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let scheduled = b.test_pod(&pod, &[]).await?;
    let allocated = claims_api(&ctx).get(&claim.name_any()).await?;
    let results = harness::builder::allocation_results(&allocated);
    expect!(results.len() == 1, "expected one allocated device, got {results:?}");

    // The plugin on the pod's node updates the status of its own node's device.
    let node = node_name(&scheduled).unwrap_or_default().to_owned();
    let client =
        driver.client(&node).with_context(|| format!("pod got scheduled to node {node} without a plugin"))?;
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), ctx.namespace());
    let first = with_devices(&allocated, &[device_status(&allocated, true, true)?])?;
    let updated = api
        .replace_status(&claim.name_any(), &PostParams::default(), &first)
        .await
        .context("first status update")?;
    expect_devices(&updated, &first)?;

    let second = with_devices(&updated, &[device_status(&allocated, false, true)?])?;
    let updated2 = api
        .replace_status(&claim.name_any(), &PostParams::default(), &second)
        .await
        .context("second status update")?;
    expect_devices(&updated2, &second)?;

    let stored = claims_api(&ctx).get(&claim.name_any()).await?;
    expect_devices(&stored, &second)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn denial_messages_match_the_policy() {
        let on_node = slice("s", "d", "p", Some("n2")).unwrap();
        assert_eq!(
            denied_message("n1", &on_node),
            "this user running on node 'n1' may not modify resourceslices on node 'n2'"
        );
        let cluster = slice("s", "d", "p", None).unwrap();
        assert_eq!(
            denied_message("n1", &cluster),
            "this user running on node 'n1' may not modify cluster resourceslices"
        );
        assert_eq!(cluster.spec.all_nodes, Some(true));
    }

    #[test]
    fn the_policy_manifest_has_these_messages() {
        let perms = harness::manifests::plugin_permissions("ns", "d.k8s.io", "d.k8s.io").unwrap();
        let validations = perms.policy.spec.unwrap().validations.unwrap();
        let expr = validations[1].message_expression.clone().unwrap();
        assert!(
            expr.contains("may not modify")
                && expr.contains("cluster resourceslices")
                && expr.contains("resourceslices on node '")
        );
    }
}
