//! `[sig-node] [DRA] ResourceSlice Controller creates slices`: upstream's dra.go runs the
//! integration test `TestCreateResourceSlices` with ten slices. A ResourceSlice controller
//! ([`harness::slice_controller`], the equivalent of upstream's `resourceslice` controller)
//! publishes one network-attached pool (all nodes) of ten slices, each as large as the API
//! allows: 128 devices with 63-character names, 32 attributes each with 63-character domains,
//! 32-character identifiers and 64-character string values. Only the API server is involved.
//!
//! As upstream, the spec waits for the ten slices, checks the protobuf size of a slice (at least
//! 600 KiB, below 1 MiB), that the controller created ten slices and then writes nothing for
//! twice the mutation cache TTL (20 s), then shrinks the pool to one empty slice and checks that
//! one slice was updated to be empty and nine were deleted, and again nothing more.
//!
//! Beyond upstream: every stored slice is compared with the desired one (name index, pool,
//! generation, slice count, all nodes, every device with all attributes), every slice's size is
//! checked, not just the first's, the controller must not have failed a sync, and the slice that
//! remains is the former first slice (same UID, its generation kept since one update suffices)
//! with a slice count of one.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use harness::{
    driver::{DriverResources, Pool, Slice},
    framework::{Ctx, Registry, SpecResult},
    slice_controller::{SliceController, SliceStats, protobuf_size},
    wait::{self, Verdict},
};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourcePool, ResourceSlice};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams},
    runtime::watcher,
};

/// How many slices (upstream's E2E variant: 10).
const NUM_SLICES: usize = 10;
/// The pool.
const POOL: &str = "network-attached";
/// `resourceapi.ResourceSliceMaxDevices`.
const MAX_DEVICES: usize = 128;
/// `resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
const MAX_ATTRIBUTES: usize = 32;
/// `resourceapi.DeviceMaxDomainLength`.
const MAX_DOMAIN: usize = 63;
/// `resourceapi.DeviceMaxIDLength`.
const MAX_ID: usize = 32;
/// `resourceapi.DeviceAttributeMaxValueLength`.
const MAX_VALUE: usize = 64;
/// `validation.DNS1035LabelMaxLength`.
const MAX_DEVICE_NAME: usize = 63;
/// Upstream's mutation cache TTL; "no further changes" is watched for twice as long.
const MUTATION_CACHE_TTL: Duration = Duration::from_secs(10);
/// How often the stats are sampled while they must stay the same.
const SAMPLE: Duration = Duration::from_millis(200);

/// Registers the spec under `[sig-node] [DRA]`.
pub fn register(registry: &mut harness::framework::Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r: &mut Registry| {
        r.context("ResourceSlice Controller", |r| {
            r.it("creates slices", creates_slices);
        });
    });
}

/// The desired pool: `slices` slices of maximal size (see the module documentation).
fn large_pool(slices: usize) -> DriverResources {
    let domain = format!("{}.example.com", "x".repeat(MAX_DOMAIN - ".example.com".len()));
    let value = "v".repeat(MAX_VALUE);
    let attributes: BTreeMap<String, DeviceAttribute> = (0..MAX_ATTRIBUTES)
        .map(|j| {
            let name = format!("{domain}/{}{j:04}", "x".repeat(MAX_ID - 4));
            (name, DeviceAttribute { string: Some(value.clone()), ..Default::default() })
        })
        .collect();
    let prefix = "dev-";
    let mut n = 0usize;
    let slices = (0..slices)
        .map(|_| Slice {
            devices: (0..MAX_DEVICES)
                .map(|_| {
                    let name = format!("{prefix}{}{n:06}", "x".repeat(MAX_DEVICE_NAME - prefix.len() - 6));
                    n += 1;
                    Device { name, attributes: Some(attributes.clone()), ..Default::default() }
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    DriverResources { pools: BTreeMap::from([(POOL.to_owned(), Pool { slices, ..Default::default() })]) }
}

fn json<T: k8s_openapi::serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Checks every stored slice against the desired pool; returns the stored slices by index.
fn check_slices(
    driver: &str,
    stored: &[ResourceSlice],
    desired: &Pool,
    generation: i64,
) -> anyhow::Result<BTreeMap<usize, ResourceSlice>> {
    let count = desired.slices.len();
    let want_pool = ResourcePool {
        name: POOL.to_owned(),
        generation,
        resource_slice_count: i64::try_from(count).unwrap_or(i64::MAX),
    };
    let mut by_index = BTreeMap::new();
    for slice in stored {
        let name = slice.name_any();
        let index =
            (0..count).find(|i| name.starts_with(&format!("{i:05x}-{driver}-"))).with_context(|| {
                format!("slice {name} does not start with an index below {count} and the driver name")
            })?;
        anyhow::ensure!(
            by_index.insert(index, slice.clone()).is_none(),
            "two slices have index {index}: {:?}",
            stored.iter().map(|s| s.name_any()).collect::<Vec<_>>()
        );
        let spec = &slice.spec;
        anyhow::ensure!(
            spec.pool == want_pool && spec.all_nodes == Some(true) && spec.node_name.is_none(),
            "slice {name}: pool {:?}, allNodes {:?}, nodeName {:?}; expected pool {want_pool:?} on all nodes",
            spec.pool,
            spec.all_nodes,
            spec.node_name
        );
        let devices = spec.devices.clone().unwrap_or_default();
        let want = &desired.slices[index].devices;
        if json(&devices) != json(want) {
            let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            anyhow::bail!(
                "slice {name} (index {index}) has {} devices that differ from the {} desired ones (first names: {:?})",
                devices.len(),
                want.len(),
                &names[..names.len().min(3)]
            );
        }
    }
    anyhow::ensure!(by_index.len() == count, "expected {count} slices, found indexes {:?}", by_index.keys());
    Ok(by_index)
}

/// Fails unless the controller's stats stay `expected` for `duration`.
async fn stats_stay(
    controller: &SliceController,
    expected: SliceStats,
    duration: Duration,
) -> anyhow::Result<()> {
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let stats = controller.stats();
        anyhow::ensure!(
            stats == expected,
            "the controller's writes changed to {stats:?}, expected them to stay {expected:?}"
        );
        tokio::time::sleep(SAMPLE).await;
    }
    Ok(())
}

/// Waits until the controller's stats are `expected`.
async fn stats_become(
    controller: &SliceController,
    expected: SliceStats,
    timeout: Duration,
) -> anyhow::Result<()> {
    let what = format!("the controller's writes to become {expected:?}");
    wait::poll(what, timeout, SAMPLE, || async {
        let stats = controller.stats();
        if stats == expected {
            wait::Attempt::Done(())
        } else {
            wait::Attempt::Retry(format!("writes so far: {stats:?}"))
        }
    })
    .await?;
    Ok(())
}

async fn creates_slices(ctx: Ctx) -> SpecResult {
    let driver = ctx.namespace().to_owned();
    let api: Api<ResourceSlice> = Api::all(ctx.client().clone());
    let selector = format!("spec.driver={driver}");
    {
        // Runs after the controller is gone (it stops when the spec's body ends).
        let (api, selector, driver) = (api.clone(), selector.clone(), driver.clone());
        ctx.defer(format!("delete the ResourceSlices of driver {driver}"), async move {
            api.delete_collection(&DeleteParams::default(), &ListParams::default().fields(&selector)).await?;
            wait::objects(
                &api,
                watcher::Config::default().fields(&selector),
                format!("the ResourceSlices of driver {driver} to be gone"),
                Duration::from_secs(60),
                |s| Verdict::done_if(s.is_empty()),
            )
            .await?;
            Ok(())
        });
    }

    tracing::info!(%driver, slices = NUM_SLICES, "creating slices");
    let resources = large_pool(NUM_SLICES);
    let desired = resources.pools[POOL].clone();
    let controller = SliceController::start(ctx.client().clone(), &driver, resources);
    let all = wait::objects(
        &api,
        watcher::Config::default().fields(&selector),
        format!("{NUM_SLICES} ResourceSlices of driver {driver}"),
        Duration::from_secs(180),
        |s| Verdict::done_if(s.len() == NUM_SLICES),
    )
    .await?;
    let by_index = check_slices(&driver, &all, &desired, 1)?;
    for slice in by_index.values() {
        let size = protobuf_size(ctx.client(), &slice.name_any()).await.map_err(anyhow::Error::msg)?;
        tracing::info!(slice = %slice.name_any(), size, "protobuf size of the slice: {} KiB", size / 1024);
        expect!(
            (600 * 1024..1024 * 1024).contains(&size),
            "ResourceSlice {} has a protobuf size of {size} bytes, expected at least 600 KiB and below 1 MiB",
            slice.name_any()
        );
    }
    let created = SliceStats { creates: NUM_SLICES as u64, ..Default::default() };
    // The last create's response may arrive after its slice showed up in the watch.
    stats_become(&controller, created, Duration::from_secs(10)).await?;
    // No further changes.
    stats_stay(&controller, created, 2 * MUTATION_CACHE_TTL).await?;

    tracing::info!("deleting slices");
    let first_uid = by_index.get(&0).and_then(|s| s.uid()).context("the first slice has no UID")?;
    let mut shrunk = DriverResources::default();
    let one_empty = Pool { slices: vec![Slice::default()], ..Default::default() };
    shrunk.pools.insert(POOL.to_owned(), one_empty.clone());
    controller.update(shrunk);
    let left = wait::objects(
        &api,
        watcher::Config::default().fields(&selector),
        "one empty ResourceSlice",
        Duration::from_secs(120),
        |s| {
            Verdict::done_if(
                s.len() == 1 && s.iter().all(|s| s.spec.devices.clone().unwrap_or_default().is_empty()),
            )
        },
    )
    .await?;
    // One update keeps the generation.
    let remaining = check_slices(&driver, &left, &one_empty, 1)?;
    let uid = remaining.get(&0).and_then(|s| s.uid()).unwrap_or_default();
    expect!(
        uid == first_uid,
        "the remaining slice has UID {uid}, expected the former first slice ({first_uid})"
    );
    let shrunk_stats = SliceStats { creates: NUM_SLICES as u64, updates: 1, deletes: NUM_SLICES as u64 - 1 };
    // The stats can lag behind the list by the controller's round trips.
    stats_become(&controller, shrunk_stats, Duration::from_secs(30)).await?;
    stats_stay(&controller, shrunk_stats, 2 * MUTATION_CACHE_TTL).await?;
    let errors = controller.errors();
    expect!(errors.is_empty(), "the controller failed syncs: {errors:?}");
    controller.stop();
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn full_texts_match_upstream() {
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry);
        registry.validate().unwrap();
        let texts: Vec<&str> = registry.specs().map(|s| s.full_text()).collect();
        assert_eq!(texts, ["[sig-node] [DRA] ResourceSlice Controller creates slices"]);
    }

    #[test]
    fn slices_are_as_large_as_the_api_allows() {
        let resources = large_pool(2);
        let pool = &resources.pools[POOL];
        assert_eq!(pool.slices.len(), 2);
        let devices = &pool.slices[1].devices;
        assert_eq!(devices.len(), MAX_DEVICES);
        let d = &devices[MAX_DEVICES - 1];
        assert_eq!(d.name.len(), MAX_DEVICE_NAME);
        assert!(d.name.ends_with("000255"), "{}", d.name);
        let attributes = d.attributes.as_ref().unwrap();
        assert_eq!(attributes.len(), MAX_ATTRIBUTES);
        let (name, value) = attributes.iter().next().unwrap();
        let (domain, id) = name.split_once('/').unwrap();
        assert_eq!((domain.len(), id.len()), (MAX_DOMAIN, MAX_ID));
        assert_eq!(value.string.as_ref().unwrap().len(), MAX_VALUE);
    }
}
