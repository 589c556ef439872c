//! A ResourceSlice controller for pools that belong to no node (upstream's `resourceslice`
//! controller of k8s.io/dynamic-resource-allocation, started without an owner): it publishes the
//! desired pools of one driver and keeps the stored slices in line with them, with the same
//! naming, generation and reuse rules, and counts its writes ([`SliceStats`], upstream's
//! `Controller.GetStats`).
//!
//! - Slice `i` of a pool is created with `generateName` `<i in hex, at least 5 digits>-<driver>-`.
//! - A stored slice matches desired slice `i` when its name starts with that index (and the
//!   index width of the desired slice count) and it has the pool's highest generation; every
//!   other stored slice of the pool is obsolete and deleted.
//! - The generation stays when at most one matched slice changes and none is new; otherwise it
//!   goes up by one (or to the pool's own generation when that is higher), and then every matched
//!   slice is updated.
//! - A pool without node selector is published with `allNodes: true`.
//!
//! It reconciles after start, after [`SliceController::update`] and after every change a watch of
//! the driver's slices reports (so a slice deleted behind its back comes back), each time from a
//! fresh list, so a converged controller writes nothing.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use tokio::{sync::Notify, task::JoinHandle};

use crate::driver::{DriverResources, Pool, resources::slice_index_len};

/// How long the controller waits after a trigger for more (watch events come in bursts).
const SETTLE: Duration = Duration::from_millis(200);
/// How long it waits before retrying a failed reconciliation.
const RETRY: Duration = Duration::from_secs(1);

/// The writes a [`SliceController`] made (upstream's `resourceslice.Stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceStats {
    /// Slices created.
    pub creates: u64,
    /// Slices updated.
    pub updates: u64,
    /// Slices deleted.
    pub deletes: u64,
}

struct Inner {
    api: Api<ResourceSlice>,
    driver: String,
    /// Only this pool is reconciled (upstream's `ReconcilePoolWithName`): other pools' slices
    /// are left alone, and desired pools of other names are not published.
    only_pool: Option<String>,
    desired: Mutex<DriverResources>,
    stats: Mutex<SliceStats>,
    errors: Mutex<Vec<String>>,
    wake: Notify,
}

/// A running controller; see the module documentation. Stop it with [`SliceController::stop`]
/// (dropping it stops it too); the slices stay.
pub struct SliceController {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SliceController {
    /// Starts publishing `resources` for `driver` with `client`.
    pub fn start(client: kube::Client, driver: impl Into<String>, resources: DriverResources) -> Self {
        Self::start_inner(client, driver.into(), resources, None)
    }

    /// Like [`SliceController::start`], but reconciles only the pool `pool` (upstream's
    /// `kubeletplugin.ReconcilePoolWithName`): slices of the driver's other pools are neither
    /// deleted nor changed, and only `pool` of `resources` is published.
    pub fn start_for_pool(
        client: kube::Client,
        driver: impl Into<String>,
        resources: DriverResources,
        pool: impl Into<String>,
    ) -> Self {
        Self::start_inner(client, driver.into(), resources, Some(pool.into()))
    }

    fn start_inner(
        client: kube::Client,
        driver: String,
        resources: DriverResources,
        only_pool: Option<String>,
    ) -> Self {
        let inner = Arc::new(Inner {
            api: Api::all(client),
            driver,
            only_pool,
            desired: Mutex::new(resources),
            stats: Mutex::new(SliceStats::default()),
            errors: Mutex::new(Vec::new()),
            wake: Notify::new(),
        });
        let watch = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let config = watcher::Config::default().fields(&inner.field_selector());
                let mut events = watcher(inner.api.clone(), config).boxed();
                while let Some(event) = events.next().await {
                    if event.is_ok() {
                        inner.wake.notify_one();
                    }
                }
            })
        };
        let run = {
            let inner = inner.clone();
            tokio::spawn(async move {
                loop {
                    match inner.reconcile().await {
                        Ok(()) => inner.wake.notified().await,
                        Err(e) => {
                            tracing::warn!(driver = %inner.driver, error = %e, "ResourceSlice controller: sync failed");
                            lock(&inner.errors).push(e);
                            tokio::time::sleep(RETRY).await;
                        }
                    }
                    tokio::time::sleep(SETTLE).await;
                }
            })
        };
        inner.wake.notify_one();
        SliceController { inner, tasks: vec![run, watch] }
    }

    /// Replaces the desired pools (upstream's `Controller.Update`).
    pub fn update(&self, resources: DriverResources) {
        *lock(&self.inner.desired) = resources;
        self.inner.wake.notify_one();
    }

    /// The writes so far.
    pub fn stats(&self) -> SliceStats {
        *lock(&self.inner.stats)
    }

    /// Failed reconciliations so far (each was retried).
    pub fn errors(&self) -> Vec<String> {
        lock(&self.inner.errors).clone()
    }

    /// Stops reconciling.
    pub fn stop(mut self) {
        self.tasks.drain(..).for_each(|t| t.abort());
    }
}

impl Drop for SliceController {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Inner {
    /// `spec.driver=<driver>`, and `spec.pool.name=<pool>` when only one pool is reconciled.
    fn field_selector(&self) -> String {
        match &self.only_pool {
            Some(pool) => format!("spec.driver={},spec.pool.name={pool}", self.driver),
            None => format!("spec.driver={}", self.driver),
        }
    }

    async fn reconcile(&self) -> Result<(), String> {
        let list = self
            .api
            .list(&ListParams::default().fields(&self.field_selector()))
            .await
            .map_err(|e| format!("list the ResourceSlices of driver {}: {e}", self.driver))?;
        let mut by_pool: BTreeMap<String, Vec<ResourceSlice>> = BTreeMap::new();
        for slice in list.items.into_iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
            by_pool.entry(slice.spec.pool.name.clone()).or_default().push(slice);
        }
        let mut desired = lock(&self.desired).clone();
        if let Some(only) = &self.only_pool {
            desired.pools.retain(|name, _| name == only);
            by_pool.retain(|name, _| name == only);
        }
        for (name, slices) in &by_pool {
            if !desired.pools.contains_key(name) {
                self.delete(slices.iter()).await?;
            }
        }
        for (name, pool) in &desired.pools {
            let plan =
                plan(&self.driver, name, pool, by_pool.get(name).map(Vec::as_slice).unwrap_or_default());
            self.apply(plan).await?;
        }
        Ok(())
    }

    async fn delete(&self, slices: impl Iterator<Item = &ResourceSlice>) -> Result<(), String> {
        for slice in slices {
            let name = slice.name_any();
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => lock(&self.stats).deletes += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(format!("delete ResourceSlice {name}: {e}")),
            }
        }
        Ok(())
    }

    async fn apply(&self, plan: Plan) -> Result<(), String> {
        self.delete(plan.delete.iter()).await?;
        for slice in plan.update {
            let name = slice.name_any();
            self.api
                .replace(&name, &PostParams::default(), &slice)
                .await
                .map_err(|e| format!("update ResourceSlice {name}: {e}"))?;
            lock(&self.stats).updates += 1;
        }
        for slice in plan.create {
            let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
            self.api
                .create(&PostParams::default(), &slice)
                .await
                .map_err(|e| format!("create ResourceSlice {prefix}*: {e}"))?;
            lock(&self.stats).creates += 1;
        }
        Ok(())
    }
}

/// What one sync of a pool does.
#[derive(Debug, Default)]
struct Plan {
    delete: Vec<ResourceSlice>,
    update: Vec<ResourceSlice>,
    create: Vec<ResourceSlice>,
}

/// The index a slice name starts with, if it has exactly `width` hex digits before the first `-`.
fn decode_index(name: &str, width: usize) -> Option<usize> {
    let (prefix, _) = name.split_once('-')?;
    (prefix.len() == width).then(|| usize::from_str_radix(prefix, 16).ok()).flatten()
}

/// The spec of desired slice `index` of `pool`, with `meta` as its pool.
fn desired_spec(driver: &str, pool: &Pool, index: usize, meta: &ResourcePool) -> ResourceSliceSpec {
    let slice = pool.slices.get(index).cloned().unwrap_or_default();
    ResourceSliceSpec {
        driver: driver.to_owned(),
        pool: meta.clone(),
        node_selector: pool.node_selector.clone(),
        all_nodes: pool.node_selector.is_none().then_some(true),
        devices: (!slice.devices.is_empty()).then_some(slice.devices),
        shared_counters: (!slice.shared_counters.is_empty()).then_some(slice.shared_counters),
        partition_type_attribute: slice.partition_type_attribute,
        ..Default::default()
    }
}

/// A value's JSON form, for comparing API objects.
fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Whether a stored spec has the desired content (an empty list and no list are the same).
fn same_spec(stored: &ResourceSliceSpec, desired: &ResourceSliceSpec) -> bool {
    stored.pool == desired.pool
        && stored.node_name.is_none()
        && stored.node_selector == desired.node_selector
        && stored.all_nodes.unwrap_or_default() == desired.all_nodes.unwrap_or_default()
        && json(&stored.devices.clone().unwrap_or_default())
            == json(&desired.devices.clone().unwrap_or_default())
        && json(&stored.shared_counters.clone().unwrap_or_default())
            == json(&desired.shared_counters.clone().unwrap_or_default())
        && stored.partition_type_attribute == desired.partition_type_attribute
        && !stored.per_device_node_selection.unwrap_or_default()
}

/// Upstream's `syncPool` for pool `name` with its stored `slices`.
fn plan(driver: &str, name: &str, pool: &Pool, slices: &[ResourceSlice]) -> Plan {
    let mut generation = slices.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
    let count = pool.slices.len();
    let width = slice_index_len(count);
    let mut matched: BTreeMap<usize, &ResourceSlice> = BTreeMap::new();
    let mut plan = Plan::default();
    for slice in slices {
        let index = decode_index(&slice.name_any(), width).filter(|i| *i < count);
        match index {
            Some(i) if slice.spec.pool.generation >= generation && !matched.contains_key(&i) => {
                matched.insert(i, slice);
            }
            _ => plan.delete.push(slice.clone()),
        }
    }
    let mut meta = ResourcePool {
        name: name.to_owned(),
        generation,
        resource_slice_count: i64::try_from(count).unwrap_or(i64::MAX),
    };
    let changed: Vec<usize> = matched
        .iter()
        .filter(|(i, s)| !same_spec(&s.spec, &desired_spec(driver, pool, **i, &meta)))
        .map(|(i, _)| *i)
        .collect();
    let new = count - matched.len();
    let bumped = if pool.generation > generation {
        generation = pool.generation;
        true
    } else if new == 0 && changed.len() <= 1 {
        false
    } else {
        generation += 1;
        true
    };
    meta.generation = generation;
    for (i, stored) in &matched {
        if !bumped && !changed.contains(i) {
            continue;
        }
        let mut slice = (*stored).clone();
        slice.spec = desired_spec(driver, pool, *i, &meta);
        plan.update.push(slice);
    }
    for i in (0..count).filter(|i| !matched.contains_key(i)) {
        let mut slice = ResourceSlice { spec: desired_spec(driver, pool, i, &meta), ..Default::default() };
        slice.metadata.generate_name = Some(format!("{i:0width$x}-{driver}-"));
        plan.create.push(slice);
    }
    plan
}

/// The protobuf size of a stored slice (upstream's `ResourceSlice.Size()`): the slice read as
/// `application/vnd.kubernetes.protobuf`, measured inside the API server's envelope (magic
/// `k8s\0`, then a `runtime.Unknown` whose field 2 holds the encoded object).
pub async fn protobuf_size(client: &kube::Client, name: &str) -> Result<usize, String> {
    let request = http::Request::get(format!("/apis/resource.k8s.io/v1/resourceslices/{name}"))
        .header(http::header::ACCEPT, "application/vnd.kubernetes.protobuf")
        .body(kube::client::Body::empty())
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| format!("GET ResourceSlice {name}: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("read ResourceSlice {name}: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("GET ResourceSlice {name} as protobuf: {status}"));
    }
    envelope_raw_len(&body).ok_or_else(|| format!("ResourceSlice {name}: not a protobuf envelope"))
}

/// A protobuf varint at the start of `b`: its value and length.
fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The length of field 2 (`raw`) of the `runtime.Unknown` after the `k8s\0` magic.
fn envelope_raw_len(body: &[u8]) -> Option<usize> {
    let mut rest = body.strip_prefix(b"k8s\0")?;
    while !rest.is_empty() {
        let (key, n) = varint(rest)?;
        rest = &rest[n..];
        match key & 7 {
            2 => {
                let (len, n) = varint(rest)?;
                let len = usize::try_from(len).ok()?;
                if key >> 3 == 2 {
                    return Some(len);
                }
                rest = rest.get(n + len..)?;
            }
            0 => rest = &rest[varint(rest)?.1..],
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::driver::{Slice, resources::device};

    fn pool(slices: usize, devices: usize) -> Pool {
        Pool {
            slices: (0..slices)
                .map(|s| Slice {
                    devices: (0..devices).map(|d| device(format!("dev-{s}-{d}"))).collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// The slices a plan creates, as the API server would store them.
    fn stored(plan: &Plan) -> Vec<ResourceSlice> {
        plan.create
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut s = s.clone();
                s.metadata.name = Some(format!("{}x{i}", s.metadata.generate_name.clone().unwrap()));
                s
            })
            .collect()
    }

    #[test]
    fn creates_every_slice_with_generation_one_then_nothing() {
        let p = pool(10, 2);
        let first = plan("d", "network-attached", &p, &[]);
        assert_eq!((first.create.len(), first.update.len(), first.delete.len()), (10, 0, 0));
        let s = &first.create[10 - 1];
        assert_eq!(s.metadata.generate_name.as_deref(), Some("00009-d-"));
        assert_eq!(
            s.spec.pool,
            ResourcePool { name: "network-attached".into(), generation: 1, resource_slice_count: 10 }
        );
        assert_eq!(s.spec.all_nodes, Some(true));
        let again = plan("d", "network-attached", &p, &stored(&first));
        assert!(again.create.is_empty() && again.update.is_empty() && again.delete.is_empty(), "{again:?}");
    }

    #[test]
    fn shrinking_to_one_empty_slice_updates_one_and_deletes_the_rest() {
        let first = plan("d", "p", &pool(10, 2), &[]);
        let slices = stored(&first);
        let shrunk = plan("d", "p", &pool(1, 0), &slices);
        assert_eq!((shrunk.create.len(), shrunk.update.len(), shrunk.delete.len()), (0, 1, 9));
        let updated = &shrunk.update[0];
        assert_eq!(updated.metadata.name, slices[0].metadata.name);
        assert_eq!(updated.spec.pool.generation, 1, "one update keeps the generation");
        assert_eq!(updated.spec.pool.resource_slice_count, 1);
        assert!(updated.spec.devices.is_none());
    }

    #[test]
    fn several_changes_bump_the_generation_and_update_all() {
        let slices = stored(&plan("d", "p", &pool(2, 1), &[]));
        let changed = plan("d", "p", &pool(2, 3), &slices);
        assert_eq!(changed.update.len(), 2);
        assert!(changed.update.iter().all(|s| s.spec.pool.generation == 2));
        let older = plan("d", "p", &pool(1, 1), &[changed.update[0].clone(), slices[1].clone()]);
        assert_eq!(older.delete.len(), 1, "a slice of an older generation is obsolete");
    }

    #[test]
    fn indexes_need_the_expected_width() {
        assert_eq!(decode_index("0000a-d-xyz", 5), Some(10));
        assert_eq!(decode_index("000a-d-xyz", 5), None);
        assert_eq!(decode_index("zzzzz-d", 5), None);
        assert_eq!(decode_index("nodash", 5), None);
    }

    #[test]
    fn reads_the_raw_length_from_the_envelope() {
        // k8s\0, field 1 (typeMeta, 2 bytes), field 2 (raw, 300 bytes), field 4 (contentType).
        let mut body = b"k8s\0".to_vec();
        body.extend([0x0a, 2, 0x0a, 0]);
        body.extend([0x12, 0xac, 0x02]);
        body.extend(vec![7u8; 300]);
        body.extend([0x22, 0]);
        assert_eq!(envelope_raw_len(&body), Some(300));
        assert_eq!(envelope_raw_len(b"{\"kind\":\"ResourceSlice\"}"), None);
        assert_eq!(varint(&[0xac, 0x02]), Some((300, 2)));
    }
}
