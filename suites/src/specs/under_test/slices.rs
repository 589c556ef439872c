//! a: the driver's ResourceSlices, for every node it serves: published, named for the driver,
//! each node-local one for an existing Node, every pool's slices of one generation and as many as
//! its `resourceSliceCount`, its devices non-empty and uniquely named.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use harness::framework::{Ctx, SpecResult};
use k8s_openapi::api::{core::v1::Node, resource::v1::ResourceSlice};
use kube::{Api, ResourceExt as _, api::ListParams};

use super::{Target, session::driver_slices};

/// Checks the driver's slices against the cluster's nodes.
pub async fn valid(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let slices = driver_slices(&ctx, &target.driver).await?;
    let nodes: Api<Node> = Api::all(ctx.client().clone());
    let nodes: BTreeSet<String> =
        nodes.list(&ListParams::default()).await?.items.iter().map(|n| n.name_any()).collect();
    let problems = problems(&slices, &target.driver, &nodes);
    expect!(
        problems.is_empty(),
        "the ResourceSlices of driver {}:\n- {}",
        target.driver,
        problems.join("\n- ")
    );
    let served: BTreeSet<&str> = slices.iter().filter_map(|s| s.spec.node_name.as_deref()).collect();
    tracing::info!(slices = slices.len(), nodes = ?served, "the driver's ResourceSlices are valid");
    Ok(())
}

/// What is wrong with the slices of `driver`, one sentence each.
fn problems(slices: &[ResourceSlice], driver: &str, nodes: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    if !slices.iter().any(|s| s.spec.node_name.is_some()) {
        problems
            .push(format!("driver {driver} publishes no ResourceSlice for a node ({} in all)", slices.len()));
    }
    let mut pools: BTreeMap<&str, Vec<&ResourceSlice>> = BTreeMap::new();
    for slice in slices {
        let name = slice.name_any();
        if slice.spec.driver != driver {
            problems.push(format!("slice {name} names driver {:?}", slice.spec.driver));
        }
        if slice.spec.pool.name.is_empty() {
            problems.push(format!("slice {name} has no pool name"));
        }
        if let Some(node) = &slice.spec.node_name
            && !nodes.contains(node)
        {
            problems.push(format!("slice {name} is for node {node}, which does not exist"));
        }
        pools.entry(slice.spec.pool.name.as_str()).or_default().push(slice);
    }
    for (pool, slices) in pools {
        let generation = slices.iter().map(|s| s.spec.pool.generation).max().unwrap_or_default();
        let current: Vec<&&ResourceSlice> =
            slices.iter().filter(|s| s.spec.pool.generation == generation).collect();
        let counts: BTreeSet<i64> = current.iter().map(|s| s.spec.pool.resource_slice_count).collect();
        if counts.len() != 1
            || counts.first().is_some_and(|&n| usize::try_from(n).ok() != Some(current.len()))
        {
            problems.push(format!(
                "pool {pool:?}: {} slice(s) of generation {generation}, with resourceSliceCount {counts:?}",
                current.len()
            ));
        }
        let nodes: BTreeSet<Option<&str>> = current.iter().map(|s| s.spec.node_name.as_deref()).collect();
        if nodes.len() > 1 {
            problems.push(format!("pool {pool:?} has slices for several nodes: {nodes:?}"));
        }
        let names: Vec<&str> =
            current.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.as_str()).collect();
        if names.is_empty() {
            problems.push(format!("pool {pool:?} (generation {generation}) has no device"));
        }
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        if unique.len() != names.len() {
            let mut seen = BTreeSet::new();
            let twice: BTreeSet<&str> = names.iter().copied().filter(|n| !seen.insert(*n)).collect();
            problems.push(format!("pool {pool:?} names devices more than once: {twice:?}"));
        }
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn slice(
        name: &str,
        node: &str,
        pool: &str,
        generation: i64,
        count: i64,
        devices: &[&str],
    ) -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": {
                "driver": "d.example.com",
                "nodeName": node,
                "pool": { "name": pool, "generation": generation, "resourceSliceCount": count },
                "devices": devices.iter().map(|d| serde_json::json!({ "name": d })).collect::<Vec<_>>(),
            },
        }))
        .unwrap()
    }

    #[test]
    fn valid_slices_have_no_problem_and_each_problem_is_named() {
        let nodes: BTreeSet<String> = ["n1".to_owned(), "n2".to_owned()].into();
        let good = [
            slice("a", "n1", "n1", 2, 2, &["d0"]),
            slice("b", "n1", "n1", 2, 2, &["d1"]),
            slice("old", "n1", "n1", 1, 1, &["d0"]),
        ];
        assert_eq!(problems(&good, "d.example.com", &nodes), Vec::<String>::new());
        let bad = [slice("a", "gone", "p", 1, 2, &["d0", "d0"]), slice("c", "n2", "q", 1, 1, &[])];
        let found = problems(&bad, "d.example.com", &nodes).join("\n");
        for expected in [
            "node gone, which does not exist",
            "resourceSliceCount {2}",
            "more than once",
            "\"q\" (generation 1) has no device",
        ] {
            assert!(found.contains(expected), "{expected:?} not in {found}");
        }
        assert!(problems(&[], "d.example.com", &nodes)[0].contains("publishes no ResourceSlice"));
    }
}
