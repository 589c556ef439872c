//! Upstream's `kubelet` context with `ReconcilePoolWithName` (dra.go): the driver's plugin
//! publishes an all-nodes pool under a given name with a privileged client, reconciles only
//! that pool, and so recreates its slice after it was deleted.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    driver::{Driver, DriverConfig, DriverResources, Nodes, Pool, ResourcesFn, Slice, resources},
    framework::{Ctx, Registry, SpecResult},
    wait::{self, Verdict},
};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams},
    runtime::watcher,
};
use serde_json::json;

/// The pool the driver reconciles.
const POOL: &str = "all-nodes-pool";
/// How long the first slice may take (upstream's default `Eventually`).
const INITIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the recreated slice may take (upstream: 50 s).
const RECREATE_TIMEOUT: Duration = Duration::from_secs(50);

/// Registers the spec (inside the `kubelet` context).
pub fn register(r: &mut Registry) {
    r.it("reconciles ResourceSlices with ReconcilePoolWithName", reconcile_pool_with_name);
}

/// What is wrong with the pool's slices: there must be exactly one, cluster-wide (no node name,
/// `allNodes: true`), of this driver, in pool [`POOL`] with `resourceSliceCount` 1, with the one
/// device `device-00`, and (after a deletion) another UID than `not_uid`.
fn problem(driver: &str, slices: &[ResourceSlice], not_uid: Option<&str>) -> Option<String> {
    let [slice] = slices else {
        return Some(format!("{} slices in pool {POOL}, expected one", slices.len()));
    };
    let spec = &slice.spec;
    let devices = serde_json::to_value(&spec.devices).unwrap_or_default();
    let problems: Vec<&str> = [
        (spec.driver != driver, "wrong driver"),
        (spec.node_name.is_some(), "has a node name"),
        (spec.all_nodes != Some(true), "allNodes is not true"),
        (spec.pool.name != POOL, "wrong pool"),
        (spec.pool.resource_slice_count != 1, "resourceSliceCount is not 1"),
        (devices != json!([{ "name": "device-00" }]), "devices are not exactly [device-00]"),
        (not_uid.is_some() && slice.uid().as_deref() == not_uid, "still the deleted slice (same UID)"),
    ]
    .into_iter()
    .filter_map(|(bad, what)| bad.then_some(what))
    .collect();
    (!problems.is_empty()).then(|| format!("slice {}: {}", slice.name_any(), problems.join(", ")))
}

async fn reconcile_pool_with_name(ctx: Ctx) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let pool_of_first_node = ResourcesFn::new(|nodes: &Nodes| {
        let pool = Pool {
            slices: vec![Slice { devices: vec![resources::device("device-00")], ..Default::default() }],
            ..Default::default()
        };
        let node = nodes.names().first().cloned().unwrap_or_default();
        [(node, DriverResources { pools: [(POOL.to_owned(), pool)].into() })].into()
    });
    let config = DriverConfig::kubelet(pool_of_first_node).reconcile_pool(POOL);
    let driver = Driver::start(&ctx, &nodes, config).await?;

    let api: Api<ResourceSlice> = Api::all(ctx.client().clone());
    let selector = format!("spec.driver={},spec.pool.name={POOL}", driver.name());
    let watch = || watcher::Config::default().fields(&selector);
    let check = |not_uid: Option<String>| {
        let driver = driver.name().to_owned();
        move |slices: &[ResourceSlice]| match problem(&driver, slices, not_uid.as_deref()) {
            None => Verdict::Done,
            Some(_) => Verdict::Pending,
        }
    };
    let what = format!("the ResourceSlice of pool {POOL} of driver {}", driver.name());
    let slices = wait::objects(&api, watch(), &what, INITIAL_TIMEOUT, check(None)).await?;
    let old = slices.first().context("the wait returned no slice")?;
    let old_uid = old.uid().unwrap_or_default();
    api.delete(&old.name_any(), &DeleteParams::default())
        .await
        .with_context(|| format!("delete ResourceSlice {}", old.name_any()))?;

    let what =
        format!("a recreated ResourceSlice of pool {POOL} of driver {} (not UID {old_uid})", driver.name());
    wait::objects(&api, watch(), &what, RECREATE_TIMEOUT, check(Some(old_uid.clone()))).await?;
    // Nothing else of the driver was published: the pool was not also written node-local.
    let all = api.list(&ListParams::default().fields(&format!("spec.driver={}", driver.name()))).await?;
    expect!(
        all.items.len() == 1,
        "driver {} has {} slices, expected only the one of pool {POOL}: {:?}",
        driver.name(),
        all.items.len(),
        all.items.iter().map(|s| s.name_any()).collect::<Vec<_>>()
    );
    Ok(())
}
