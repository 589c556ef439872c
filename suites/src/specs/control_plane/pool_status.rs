//! Upstream's ResourcePoolStatusRequest specs (feature gate `DRAResourcePoolStatus`, API
//! `resource.k8s.io/v1alpha3`): the `control plane` context with `NetworkResources(10)` on one
//! node, the `control plane views` contexts (partitionable and shareable pools), and the
//! `control plane` context with `DriverResources(1)` on exactly two nodes.
//!
//! A request is a one-time snapshot: as upstream does, a spec creates requests until one's
//! status (set by the controller within 15 s) shows what it expects, for at most 60 s, and
//! deletes each request again.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::Builder,
    driver::{Driver, DriverConfig, Nodes, ResourcesFn, resources},
    framework::{Ctx, Label, Registry, Skip, SpecResult},
    wait::{self, Attempt, Verdict, WaitError},
};
use k8s_openapi::api::resource::{
    v1::ResourceSlice,
    v1alpha3::{PoolStatus, ResourcePoolStatusRequest, ResourcePoolStatusRequestStatus},
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

/// Upstream's `f.WithFeatureGate(features.DRAResourcePoolStatus)`.
const POOL_STATUS_LABELS: [Label; 1] = [Label::gate("DRAResourcePoolStatus")];
/// `f.WithFeatureGate(features.DRAPartitionableDevices)`.
const PARTITIONABLE_LABELS: [Label; 1] = [Label::gate("DRAPartitionableDevices")];
/// `f.WithFeatureGate(features.DRAPartitionableDevicesType)`.
const PARTITION_TYPE_LABELS: [Label; 1] = [Label::gate("DRAPartitionableDevicesType")];
/// `f.WithFeatureGate(features.DRAConsumableCapacity)`.
const CONSUMABLE_CAPACITY_LABELS: [Label; 1] = [Label::gate("DRAConsumableCapacity")];
/// How long a spec keeps creating requests (upstream: 60 s, every 2 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one request may take to get the expected status (upstream: 15 s).
const STATUS_TIMEOUT: Duration = Duration::from_secs(15);

/// Registers the specs of the single-node contexts (inside `[sig-node] [DRA]`).
pub fn register_single_node(r: &mut Registry) {
    r.context_with_labels("control plane", POOL_STATUS_LABELS, |r| {
        r.it("should report pool status with correct device counts", device_counts);
        r.it("should reflect allocated devices after pod is scheduled", allocated_devices);
    });
    r.context_with_labels("control plane views", POOL_STATUS_LABELS, |r| {
        let typed = PARTITIONABLE_LABELS.into_iter().chain(PARTITION_TYPE_LABELS);
        r.context_with_labels("partitionable typed view", typed, |r| {
            r.it("should report partitionSummary for a partitionable pool", partition_summary);
        });
        r.context_with_labels("partitionable pool without a partition type", PARTITIONABLE_LABELS, |r| {
            r.it(
                "should report no partition summary when no partition type is declared",
                no_partition_summary,
            );
        });
        r.context_with_labels("shareable view", CONSUMABLE_CAPACITY_LABELS, |r| {
            r.it("should report shareableSummary for a pool with shareable devices", shareable_summary);
        });
    });
}

/// Registers the specs of the two-node context (inside `[sig-node] [DRA]`).
pub fn register_two_nodes(r: &mut Registry) {
    r.context_with_labels("control plane", POOL_STATUS_LABELS, |r| {
        r.it("should populate status for all matching pools", all_matching_pools);
        r.it("should filter by pool name", filter_by_pool_name);
        r.it("should truncate results when limit is reached", truncate_at_limit);
        r.it("should return empty pools for unknown driver", unknown_driver);
        r.it("should not reprocess after status is set", no_reprocessing);
        r.it("should set NodeName when all slices share the same node", node_name_set);
        r.it("should clear NodeName when pool has slices on different nodes", node_name_cleared);
    });
}

/// Skips unless the API server serves ResourcePoolStatusRequests.
async fn require_api(ctx: &Ctx) -> SpecResult {
    ctx.cluster().require_api("resource.k8s.io/v1alpha3")?;
    let resources = ctx.client().list_api_group_resources("resource.k8s.io/v1alpha3").await?;
    if !resources.resources.iter().any(|r| r.name == "resourcepoolstatusrequests") {
        return Err(Skip::because(
            "the cluster does not serve resourcepoolstatusrequests in resource.k8s.io/v1alpha3 (feature gate DRAResourcePoolStatus)",
        ));
    }
    Ok(())
}

/// Nodes, then a control-plane driver publishing `resources`.
async fn setup(ctx: &Ctx, min: usize, max: usize, resources: ResourcesFn) -> SpecResult<(Nodes, Driver)> {
    let nodes = Nodes::select(ctx, min, max).await?;
    require_api(ctx).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::control_plane(resources)).await?;
    Ok((nodes, driver))
}

fn requests(ctx: &Ctx) -> Api<ResourcePoolStatusRequest> {
    Api::all(ctx.client().clone())
}

/// Creates a request (`generateName`) and registers its deletion.
async fn create_request(
    ctx: &Ctx,
    prefix: &str,
    spec: serde_json::Value,
) -> anyhow::Result<ResourcePoolStatusRequest> {
    let request: ResourcePoolStatusRequest =
        serde_json::from_value(json!({"metadata": {"generateName": prefix}, "spec": spec}))?;
    let created = requests(ctx)
        .create(&PostParams::default(), &request)
        .await
        .context("create ResourcePoolStatusRequest")?;
    ctx.delete_at_cleanup(requests(ctx), created.name_any());
    Ok(created)
}

fn is_complete(status: &ResourcePoolStatusRequestStatus) -> bool {
    status.conditions.iter().flatten().any(|c| c.type_ == "Complete" && c.status == "True")
}

/// Creates requests with `spec` until one's status satisfies `check` (see the module
/// documentation); returns that status.
async fn expect_status<F>(
    ctx: &Ctx,
    prefix: &str,
    spec: serde_json::Value,
    check: F,
) -> SpecResult<ResourcePoolStatusRequestStatus>
where
    F: Fn(&ResourcePoolStatusRequestStatus) -> Result<(), String> + Clone + Send + Sync,
{
    let what = format!("a ResourcePoolStatusRequest {spec} to report the expected status");
    let status = wait::poll(what, REQUEST_TIMEOUT, Duration::from_secs(2), || {
        let (spec, check) = (spec.clone(), check.clone());
        async move {
            let request = match create_request(ctx, prefix, spec).await {
                Ok(r) => r,
                Err(e) => return Attempt::Fail(format!("{e:#}")),
            };
            let name = request.name_any();
            let mut last = String::from("no status yet");
            let waited = wait::object(
                &requests(ctx),
                &name,
                format!("request {name} to have the expected status"),
                STATUS_TIMEOUT,
                |r| match r.and_then(|r| r.status.as_ref()) {
                    None => Verdict::Pending,
                    Some(status) => match check(status) {
                        Ok(()) => Verdict::Done,
                        Err(problem) => {
                            last = problem;
                            Verdict::Pending
                        }
                    },
                },
            )
            .await;
            let _ = requests(ctx).delete(&name, &DeleteParams::default()).await;
            match waited {
                Ok(Some(r)) => match r.status {
                    Some(status) => Attempt::Done(status),
                    None => Attempt::Retry("request without status".to_owned()),
                },
                Ok(None) => Attempt::Retry("the request disappeared".to_owned()),
                Err(e) => Attempt::Retry(format!("{last}; {e}")),
            }
        }
    })
    .await?;
    Ok(status)
}

/// The single pool of a status, by name.
fn pool<'a>(status: &'a ResourcePoolStatusRequestStatus, name: &str) -> Result<&'a PoolStatus, String> {
    status
        .pools
        .iter()
        .flatten()
        .find(|p| p.pool_name == name)
        .ok_or_else(|| format!("no pool {name} in {:?}", status.pools))
}

/// Checks a field, with a message naming it.
fn field<T: PartialEq + std::fmt::Debug>(name: &str, actual: T, expected: T) -> Result<(), String> {
    if actual == expected { Ok(()) } else { Err(format!("{name} is {actual:?}, expected {expected:?}")) }
}

/// Upstream's expectations on the network pool: everything but the allocated/available counts.
fn check_network_pool(status: &ResourcePoolStatusRequestStatus, driver: &str) -> Result<(), String> {
    field("poolCount", status.pool_count, 1)?;
    field("number of pools", status.pools.as_ref().map_or(0, Vec::len), 1)?;
    let p = pool(status, "network")?;
    field("driver", p.driver.as_str(), driver)?;
    field("generation", p.generation, 1)?;
    field("resourceSliceCount", p.resource_slice_count, Some(1))?;
    field("totalDevices", p.total_devices, Some(10))?;
    field("unavailableDevices", p.unavailable_devices, Some(0))?;
    field("nodeName", p.node_name.as_deref(), None)?;
    field("validationError", p.validation_error.as_deref(), None)?;
    field("partitionSummary", p.partition_summary.as_ref().map_or(0, Vec::len), 0)?;
    field("shareableSummary", p.shareable_summary.is_none(), true)?;
    if !is_complete(status) {
        return Err(format!("no Complete=True condition in {:?}", status.conditions));
    }
    Ok(())
}

async fn device_counts(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = setup(&ctx, 1, 1, resources::network(10, false)).await?;
    let name = driver.name().to_owned();
    expect_status(&ctx, "e2e-counts-", json!({"driver": name}), move |s| {
        check_network_pool(s, &name)?;
        let p = pool(s, "network")?;
        field("allocatedDevices", p.allocated_devices, Some(0))?;
        field("availableDevices", p.available_devices, Some(10))
    })
    .await?;
    Ok(())
}

async fn allocated_devices(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = setup(&ctx, 1, 1, resources::network(10, false)).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let (pod, template) = b.pod_inline();
    b.create_pod(&pod).await?;
    b.create_template(&template).await?;
    b.test_pod(&pod, &[]).await?;
    let name = driver.name().to_owned();
    expect_status(&ctx, "e2e-allocated-", json!({"driver": name}), move |s| {
        check_network_pool(s, &name)?;
        let p = pool(s, "network")?;
        match (p.allocated_devices, p.available_devices) {
            (Some(allocated), Some(available)) if allocated > 0 => {
                field("allocated + available", allocated + available, 10)
            }
            other => {
                Err(format!("(allocatedDevices, availableDevices) is {other:?}, expected some allocated"))
            }
        }
    })
    .await?;
    Ok(())
}

/// Skips when the API server dropped a field of the driver's slices (its feature gate is off).
async fn require_slice_field(
    driver: &Driver,
    gate: &str,
    present: impl Fn(&ResourceSlice) -> bool,
) -> SpecResult {
    let slices = driver.slices().await?;
    if slices.iter().any(present) {
        return Ok(());
    }
    Err(Skip::because(format!(
        "the API server dropped the ResourceSlice fields of feature gate {gate}, which is off"
    )))
}

fn partition_type(p: &PoolStatus) -> Vec<(String, String, i32, i32)> {
    let mut v: Vec<_> = p
        .partition_summary
        .iter()
        .flatten()
        .map(|s| (s.attribute.clone(), s.type_.clone(), s.total, s.allocatable))
        .collect();
    v.sort();
    v
}

async fn partition_summary(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = setup(&ctx, 1, 1, resources::partitioned(true)).await?;
    require_slice_field(&driver, "DRAPartitionableDevices", |s| s.spec.shared_counters.is_some()).await?;
    require_slice_field(&driver, "DRAPartitionableDevicesType", |s| {
        s.spec.partition_type_attribute.is_some()
    })
    .await?;
    let attr = resources::PARTITION_PROFILE_ATTRIBUTE.to_owned();
    expect_status(&ctx, "e2e-views-", json!({"driver": driver.name()}), move |s| {
        if !is_complete(s) {
            return Err("not complete".to_owned());
        }
        let p = pool(s, "partitioned")?;
        field("validationError", p.validation_error.as_deref(), None)?;
        field(
            "partitionSummary",
            partition_type(p),
            vec![(attr.clone(), "Full".to_owned(), 1, 1), (attr.clone(), "Half".to_owned(), 2, 2)],
        )
    })
    .await?;
    Ok(())
}

async fn no_partition_summary(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = setup(&ctx, 1, 1, resources::partitioned(false)).await?;
    require_slice_field(&driver, "DRAPartitionableDevices", |s| s.spec.shared_counters.is_some()).await?;
    expect_status(&ctx, "e2e-views-", json!({"driver": driver.name()}), |s| {
        if !is_complete(s) {
            return Err("not complete".to_owned());
        }
        let p = pool(s, "partitioned")?;
        field("validationError", p.validation_error.as_deref(), None)?;
        field("partitionSummary", partition_type(p), Vec::new())
    })
    .await?;
    Ok(())
}

async fn shareable_summary(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = setup(&ctx, 1, 1, resources::shareable(2)).await?;
    require_slice_field(&driver, "DRAConsumableCapacity", |s| {
        s.spec.devices.iter().flatten().any(|d| d.allow_multiple_allocations == Some(true))
    })
    .await?;
    expect_status(&ctx, "e2e-views-", json!({"driver": driver.name()}), |s| {
        if !is_complete(s) {
            return Err("not complete".to_owned());
        }
        let p = pool(s, "shareable")?;
        field("validationError", p.validation_error.as_deref(), None)?;
        let summary = p.shareable_summary.as_ref().ok_or("no shareableSummary")?;
        field("fullyAvailableDevices", summary.fully_available_devices, 2)?;
        field("partiallyAvailableDevices", summary.partially_available_devices, 0)?;
        let names: Vec<&str> = summary.capacity.iter().flatten().map(|c| c.name.as_str()).collect();
        field("capacity names", names, vec!["memory"])
    })
    .await?;
    Ok(())
}

async fn two_nodes(ctx: &Ctx) -> SpecResult<(Nodes, Driver)> {
    setup(ctx, 2, 2, resources::node_local(1)).await
}

async fn all_matching_pools(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = two_nodes(&ctx).await?;
    expect_status(&ctx, "e2e-basic-", json!({"driver": driver.name()}), |s| {
        field("number of pools", s.pools.as_ref().map_or(0, Vec::len), 2)?;
        field("poolCount", s.pool_count, 2)?;
        if is_complete(s) { Ok(()) } else { Err("not complete".to_owned()) }
    })
    .await?;
    Ok(())
}

async fn filter_by_pool_name(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = two_nodes(&ctx).await?;
    let all = expect_status(&ctx, "e2e-filter-all-", json!({"driver": driver.name()}), |s| {
        if s.pools.as_ref().is_some_and(|p| !p.is_empty()) { Ok(()) } else { Err("no pools".to_owned()) }
    })
    .await?;
    let pool_name = all.pools.iter().flatten().next().map(|p| p.pool_name.clone()).context("no pool")?;
    let expected = pool_name.clone();
    expect_status(
        &ctx,
        "e2e-filter-one-",
        json!({"driver": driver.name(), "poolName": pool_name}),
        move |s| {
            field("poolCount", s.pool_count, 1)?;
            let names: Vec<&str> = s.pools.iter().flatten().map(|p| p.pool_name.as_str()).collect();
            field("pools", names, vec![expected.as_str()])
        },
    )
    .await?;
    Ok(())
}

async fn truncate_at_limit(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = two_nodes(&ctx).await?;
    expect_status(&ctx, "e2e-limit-", json!({"driver": driver.name(), "limit": 1}), |s| {
        field("number of pools", s.pools.as_ref().map_or(0, Vec::len), 1)?;
        field("poolCount", s.pool_count, 2)
    })
    .await?;
    Ok(())
}

async fn unknown_driver(ctx: Ctx) -> SpecResult {
    let (_nodes, _driver) = two_nodes(&ctx).await?;
    let request =
        create_request(&ctx, "e2e-unknown-", json!({"driver": "nonexistent.driver.example.com"})).await?;
    let name = request.name_any();
    wait::object(
        &requests(&ctx),
        &name,
        format!("request {name} to report no pools"),
        Duration::from_secs(30),
        |r| {
            Verdict::done_if(
                r.and_then(|r| r.status.as_ref())
                    .is_some_and(|s| s.pool_count == 0 && s.pools.as_ref().is_none_or(Vec::is_empty)),
            )
        },
    )
    .await?;
    Ok(())
}

async fn no_reprocessing(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = two_nodes(&ctx).await?;
    let request = create_request(&ctx, "e2e-noreprocess-", json!({"driver": driver.name()})).await?;
    let name = request.name_any();
    let done = wait::object(
        &requests(&ctx),
        &name,
        format!("request {name} to get a status"),
        Duration::from_secs(30),
        |r| Verdict::done_if(r.is_some_and(|r| r.status.is_some())),
    )
    .await?
    .context("the request is gone")?;
    let version = done.resource_version();
    // A snapshot: nothing may change it any more (watched for 5 s).
    let watched = wait::object(
        &requests(&ctx),
        &name,
        format!("request {name} to stay unchanged"),
        Duration::from_secs(5),
        |r| match r {
            Some(r) if r.resource_version() != version => Verdict::Fail(format!(
                "resourceVersion changed from {version:?} to {:?}",
                r.resource_version()
            )),
            _ => Verdict::Pending,
        },
    )
    .await;
    match watched {
        Err(WaitError::Timeout { .. }) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(_) => Err(anyhow::anyhow!("the request {name} disappeared").into()),
    }
}

async fn node_name_set(ctx: Ctx) -> SpecResult {
    let (_nodes, driver) = two_nodes(&ctx).await?;
    expect_status(&ctx, "e2e-nodename-set-", json!({"driver": driver.name()}), |s| {
        let pools = s.pools.as_deref().unwrap_or_default();
        if pools.is_empty() {
            return Err("no pools".to_owned());
        }
        if let Some(p) = pools.iter().find(|p| p.node_name.is_none()) {
            return Err(format!("pool {} has no nodeName", p.pool_name));
        }
        if is_complete(s) { Ok(()) } else { Err("not complete".to_owned()) }
    })
    .await?;
    Ok(())
}

async fn node_name_cleared(ctx: Ctx) -> SpecResult {
    let (nodes, driver) = two_nodes(&ctx).await?;
    let pool_name = "mixed-node-pool";
    let slices: Api<ResourceSlice> = Api::all(ctx.client().clone());
    for (i, node) in nodes.names().iter().enumerate() {
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{}-mixed-node-{i}", driver.name())},
            "spec": {
                "driver": driver.name(),
                "nodeName": node,
                "pool": {"name": pool_name, "generation": 1, "resourceSliceCount": 2},
                "devices": [{"name": format!("device-{i}")}],
            },
        }))?;
        let created = slices.create(&PostParams::default(), &slice).await?;
        ctx.delete_at_cleanup(slices.clone(), created.name_any());
    }
    expect_status(
        &ctx,
        "e2e-nodename-clear-",
        json!({"driver": driver.name(), "poolName": pool_name}),
        |s| {
            field("poolCount", s.pool_count, 1)?;
            let pools = s.pools.as_deref().unwrap_or_default();
            field("number of pools", pools.len(), 1)?;
            field("nodeName", pools[0].node_name.as_deref(), None)?;
            if is_complete(s) { Ok(()) } else { Err("not complete".to_owned()) }
        },
    )
    .await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn status(value: serde_json::Value) -> ResourcePoolStatusRequestStatus {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn network_pool_check_names_the_wrong_field() {
        let good = status(json!({
            "poolCount": 1,
            "conditions": [{"type": "Complete", "status": "True", "reason": "r", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "pools": [{"driver": "d", "poolName": "network", "generation": 1, "resourceSliceCount": 1,
                       "totalDevices": 10, "allocatedDevices": 0, "availableDevices": 10, "unavailableDevices": 0}],
        }));
        assert_eq!(check_network_pool(&good, "d"), Ok(()));
        assert_eq!(check_network_pool(&good, "x").unwrap_err(), r#"driver is "d", expected "x""#);
        let mut incomplete = good.clone();
        incomplete.conditions = None;
        assert!(check_network_pool(&incomplete, "d").unwrap_err().starts_with("no Complete=True condition"));
    }

    #[test]
    fn partition_types_are_sorted_tuples() {
        let s = status(
            json!({"poolCount": 1, "pools": [{"driver": "d", "poolName": "p", "generation": 1, "partitionSummary": [
                {"attribute": "a", "type": "Half", "total": 2, "allocatable": 2},
                {"attribute": "a", "type": "Full", "total": 1, "allocatable": 1},
            ]}]}),
        );
        assert_eq!(
            partition_type(pool(&s, "p").unwrap()),
            [("a".to_owned(), "Full".to_owned(), 1, 1), ("a".to_owned(), "Half".to_owned(), 2, 2)]
        );
        assert!(pool(&s, "q").is_err());
    }
}
