//! What a [`Driver`](super::Driver) publishes as ResourceSlices, and the generators upstream's
//! specs use (`DriverResources`, `NetworkResources`, `ToDriverResources`).
//!
//! A [`ResourcesFn`] turns the chosen [`Nodes`] into [`Resources`]: per node name
//! the node-local pools that node's plugin publishes (owned by the Node, `spec.nodeName` set),
//! and under [`MULTI_HOST`] the network-attached pools the test creates itself with a node
//! selector.

use std::{collections::BTreeMap, fmt, sync::Arc};

use k8s_openapi::{
    api::{
        core::v1::{Node, NodeSelector},
        resource::v1::{CounterSet, Device, DeviceAttribute, DeviceTaint, ResourceSlice},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use serde_json::json;

use super::nodes::Nodes;

/// Key of [`Resources`] for pools that belong to no single node: the test creates their
/// slices with the admin client instead of a node's plugin (upstream's `multi-host`).
pub const MULTI_HOST: &str = "multi-host";

/// Shortest hex index at the start of generated slice names (upstream's resourceslice
/// controller).
const SLICE_INDEX_MIN_LEN: usize = 5;

/// One ResourceSlice's content.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slice {
    /// The devices.
    pub devices: Vec<Device>,
    /// Counter sets shared by devices of the pool (partitionable devices).
    pub shared_counters: Vec<CounterSet>,
    /// The device attribute that names each device's partition type
    /// (`spec.partitionTypeAttribute`, DRAPartitionableDevicesType).
    pub partition_type_attribute: Option<String>,
    /// The kubelet gRPC calls the devices of this slice skip (`spec.skipNodeOperations`,
    /// DRAOptionalNodeOperations: `NodePrepareResources`, `NodeUnprepareResources`, `*`);
    /// empty: none.
    pub skip_node_operations: Vec<String>,
}

/// A pool: one or more slices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pool {
    /// The slices, in order (index `i` becomes name prefix `0000i-` for node-local slices,
    /// `<driver>-<i>` for multi-host ones).
    pub slices: Vec<Slice>,
    /// For multi-host pools: the nodes that can reach the devices.
    pub node_selector: Option<NodeSelector>,
    /// The pool generation; 0 means "1", as the upstream controller starts.
    pub generation: i64,
}

/// The pools of one node (or of [`MULTI_HOST`]), by pool name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverResources {
    /// Pools by name.
    pub pools: BTreeMap<String, Pool>,
}

/// Per node name (or [`MULTI_HOST`]) what gets published.
pub type Resources = BTreeMap<String, DriverResources>;

/// Computes [`Resources`] once the nodes are known.
#[derive(Clone)]
pub struct ResourcesFn(Arc<dyn Fn(&Nodes) -> Resources + Send + Sync>);

impl ResourcesFn {
    /// A generator from a closure.
    pub fn new(f: impl Fn(&Nodes) -> Resources + Send + Sync + 'static) -> Self {
        ResourcesFn(Arc::new(f))
    }

    /// Runs the generator.
    pub fn generate(&self, nodes: &Nodes) -> Resources {
        (self.0)(nodes)
    }
}

impl fmt::Debug for ResourcesFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResourcesFn(..)")
    }
}

/// Publishes nothing.
pub fn none() -> ResourcesFn {
    ResourcesFn::new(|_| Resources::new())
}

/// A device without attributes.
pub fn device(name: impl Into<String>) -> Device {
    Device { name: name.into(), ..Default::default() }
}

/// Upstream's `DriverResources(maxAllocations)`: for every node a pool named after the node
/// with one slice of `max_allocations` devices `device-00`, `device-01`, ...
pub fn node_local(max_allocations: usize) -> ResourcesFn {
    node_local_devices(Some(max_allocations), Vec::new())
}

/// Upstream's `DriverResources(maxAllocations, devicesPerNode...)`: node `i` (in the sorted
/// order of [`Nodes::names`]) gets the devices of `devices_per_node[i]` (name and attributes)
/// if given, otherwise `max_allocations` plain devices, or nothing when that is `None`.
pub fn node_local_devices(
    max_allocations: Option<usize>,
    devices_per_node: Vec<BTreeMap<String, BTreeMap<String, DeviceAttribute>>>,
) -> ResourcesFn {
    ResourcesFn::new(move |nodes| {
        let mut out = Resources::new();
        for (i, node) in nodes.names().iter().enumerate() {
            let devices: Vec<Device> = if let Some(devices) = devices_per_node.get(i) {
                devices
                    .iter()
                    .map(|(name, attributes)| Device {
                        name: name.clone(),
                        attributes: Some(attributes.clone()),
                        ..Default::default()
                    })
                    .collect()
            } else if let Some(n) = max_allocations {
                (0..n).map(|d| device(format!("device-{d:02}"))).collect()
            } else {
                continue;
            };
            out.insert(node.clone(), single_pool(node, Slice { devices, ..Default::default() }, None));
        }
        out
    })
}

/// Upstream's `NetworkResources(maxAllocations, tainted)`: one [`MULTI_HOST`] pool `network`,
/// generation 1, with devices `device-0`, `device-1`, ... (optionally tainted
/// `example.com/taint=tainted:NoSchedule`), reachable from the chosen nodes.
pub fn network(max_allocations: usize, tainted: bool) -> ResourcesFn {
    ResourcesFn::new(move |nodes| {
        let devices = (0..max_allocations)
            .map(|i| {
                let mut d = device(format!("device-{i}"));
                if tainted {
                    d.taints = Some(vec![
                        serde_json::from_value(json!({
                            "key": "example.com/taint",
                            "value": "tainted",
                            "effect": "NoSchedule",
                        }))
                        .unwrap_or_default(),
                    ]);
                }
                d
            })
            .collect();
        let mut pool =
            single_pool("network", Slice { devices, ..Default::default() }, Some(hostname_selector(nodes)));
        if let Some(p) = pool.pools.get_mut("network") {
            p.generation = 1;
        }
        Resources::from([(MULTI_HOST.to_owned(), pool)])
    })
}

/// Upstream's `ToDriverResources(counters, devices...)` (partitionable devices): on the first
/// node only, a pool named after the node with two slices, the first with only the shared
/// counters, the second with the devices.
pub fn partitionable(counters: Vec<CounterSet>, devices: Vec<Device>) -> ResourcesFn {
    ResourcesFn::new(move |nodes| {
        let Some(node) = nodes.names().first() else { return Resources::new() };
        let pool = Pool {
            slices: vec![
                Slice { shared_counters: counters.clone(), ..Default::default() },
                Slice { devices: devices.clone(), ..Default::default() },
            ],
            ..Default::default()
        };
        Resources::from([(node.clone(), DriverResources { pools: BTreeMap::from([(node.clone(), pool)]) })])
    })
}

/// The attribute that names the partition type of the devices of [`partitioned`]
/// (upstream's `PartitionProfileAttribute`).
pub const PARTITION_PROFILE_ATTRIBUTE: &str = "dra.e2e.example.com/profile";

/// A device of [`partitioned`]: consumes `memory` from counter set `gpu-0`, profile attribute.
fn partition_device(name: &str, profile: &str, memory: &str) -> Device {
    serde_json::from_value(json!({
        "name": name,
        "attributes": { PARTITION_PROFILE_ATTRIBUTE: { "string": profile } },
        "consumesCounters": [{ "counterSet": "gpu-0", "counters": { "memory": { "value": memory } } }],
    }))
    .unwrap_or_else(|_| device(name))
}

/// Upstream's `PartitionableResources(withPartitionType)`: one [`MULTI_HOST`] pool
/// `partitioned` (generation 1, the chosen nodes) with a slice holding counter set `gpu-0`
/// (`memory: 8`) and a slice with devices `full` (profile `Full`, 8), `half-a` and `half-b`
/// (profile `Half`, 4 each); the device slice declares [`PARTITION_PROFILE_ATTRIBUTE`] as its
/// partition type attribute when `with_partition_type`.
pub fn partitioned(with_partition_type: bool) -> ResourcesFn {
    ResourcesFn::new(move |nodes| {
        let counters: Vec<CounterSet> =
            serde_json::from_value(json!([{ "name": "gpu-0", "counters": { "memory": { "value": "8" } } }]))
                .unwrap_or_default();
        let devices = vec![
            partition_device("full", "Full", "8"),
            partition_device("half-a", "Half", "4"),
            partition_device("half-b", "Half", "4"),
        ];
        let pool = Pool {
            slices: vec![
                Slice { shared_counters: counters, ..Default::default() },
                Slice {
                    devices,
                    partition_type_attribute: with_partition_type
                        .then(|| PARTITION_PROFILE_ATTRIBUTE.to_owned()),
                    ..Default::default()
                },
            ],
            node_selector: Some(hostname_selector(nodes)),
            generation: 1,
        };
        Resources::from([(
            MULTI_HOST.to_owned(),
            DriverResources { pools: BTreeMap::from([("partitioned".to_owned(), pool)]) },
        )])
    })
}

/// Upstream's `ShareableResources(count)`: one [`MULTI_HOST`] pool `shareable` (generation 1,
/// the chosen nodes) with `count` devices `shared-<i>` that allow multiple allocations and have
/// capacity `memory: 16`.
pub fn shareable(count: usize) -> ResourcesFn {
    ResourcesFn::new(move |nodes| {
        let devices: Vec<Device> = (0..count)
            .map(|i| {
                serde_json::from_value(json!({
                    "name": format!("shared-{i}"),
                    "allowMultipleAllocations": true,
                    "capacity": { "memory": { "value": "16" } },
                }))
                .unwrap_or_else(|_| device(format!("shared-{i}")))
            })
            .collect();
        let pool = Pool {
            slices: vec![Slice { devices, ..Default::default() }],
            node_selector: Some(hostname_selector(nodes)),
            generation: 1,
        };
        Resources::from([(
            MULTI_HOST.to_owned(),
            DriverResources { pools: BTreeMap::from([("shareable".to_owned(), pool)]) },
        )])
    })
}

/// Upstream's `TaintAllDevices(taints...)`: `inner`, with `taints` added to every device of
/// every slice it publishes (node-local and [`MULTI_HOST`] pools alike).
pub fn taint_all_devices(inner: ResourcesFn, taints: Vec<DeviceTaint>) -> ResourcesFn {
    ResourcesFn::new(move |nodes| {
        let mut resources = inner.generate(nodes);
        let devices = resources
            .values_mut()
            .flat_map(|r| r.pools.values_mut())
            .flat_map(|p| p.slices.iter_mut())
            .flat_map(|s| s.devices.iter_mut());
        for device in devices {
            device.taints.get_or_insert_default().extend(taints.iter().cloned());
        }
        resources
    })
}

/// A device taint `key=value:effect` without `timeAdded` (the API server sets it).
pub fn device_taint(key: &str, value: &str, effect: &str) -> DeviceTaint {
    DeviceTaint {
        key: key.to_owned(),
        value: Some(value.to_owned()),
        effect: effect.to_owned(),
        time_added: None,
    }
}

/// Upstream's `SkipNodeOperations(ops...)` mutator: `inner`, with every slice it publishes
/// declaring `spec.skipNodeOperations: ops` (DRAOptionalNodeOperations). Upstream's
/// `DriverResourcesWithSkipNodeOperationsNow(nodes, n, ops...)` is
/// `skip_node_operations(node_local(n), ops)`.
pub fn skip_node_operations(inner: ResourcesFn, ops: &[&str]) -> ResourcesFn {
    let ops: Vec<String> = ops.iter().map(|o| (*o).to_owned()).collect();
    ResourcesFn::new(move |nodes| {
        let mut resources = inner.generate(nodes);
        let slices =
            resources.values_mut().flat_map(|r| r.pools.values_mut()).flat_map(|p| p.slices.iter_mut());
        for slice in slices {
            slice.skip_node_operations.clone_from(&ops);
        }
        resources
    })
}

fn single_pool(name: &str, slice: Slice, node_selector: Option<NodeSelector>) -> DriverResources {
    DriverResources {
        pools: BTreeMap::from([(
            name.to_owned(),
            Pool { slices: vec![slice], node_selector, generation: 0 },
        )]),
    }
}

/// `kubernetes.io/hostname In <nodes>`.
pub fn hostname_selector(nodes: &Nodes) -> NodeSelector {
    serde_json::from_value(json!({
        "nodeSelectorTerms": [{
            "matchExpressions": [{
                "key": "kubernetes.io/hostname",
                "operator": "In",
                "values": nodes.names(),
            }],
        }],
    }))
    .unwrap_or_default()
}

/// Hex index width for `count` slices: at least 5 digits (upstream's resourceslice controller).
pub fn slice_index_len(count: usize) -> usize {
    let highest = count.saturating_sub(1);
    SLICE_INDEX_MIN_LEN.max(format!("{highest:x}").len())
}

fn slice_spec(driver: &str, pool_name: &str, pool: &Pool, slice: &Slice) -> serde_json::Value {
    let mut spec = json!({
        "driver": driver,
        "pool": {
            "name": pool_name,
            "generation": if pool.generation > 0 { pool.generation } else { 1 },
            "resourceSliceCount": pool.slices.len(),
        },
    });
    if !slice.devices.is_empty() {
        spec["devices"] = serde_json::to_value(&slice.devices).unwrap_or_default();
    }
    if !slice.shared_counters.is_empty() {
        spec["sharedCounters"] = serde_json::to_value(&slice.shared_counters).unwrap_or_default();
    }
    if let Some(attribute) = &slice.partition_type_attribute {
        spec["partitionTypeAttribute"] = json!(attribute);
    }
    if !slice.skip_node_operations.is_empty() {
        spec["skipNodeOperations"] = json!(slice.skip_node_operations);
    }
    spec
}

/// The slices a node's plugin publishes for its pools, as upstream's resourceslice controller
/// creates them: `generateName` `<hex index>-<driver>-<node>-`, owned by the Node (controller
/// reference), `spec.nodeName` set.
pub fn node_slices(driver: &str, node: &Node, resources: &DriverResources) -> Vec<ResourceSlice> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.clone(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut out = Vec::new();
    for (pool_name, pool) in &resources.pools {
        let width = slice_index_len(pool.slices.len());
        for (i, slice) in pool.slices.iter().enumerate() {
            let mut spec = slice_spec(driver, pool_name, pool, slice);
            spec["nodeName"] = json!(node_name);
            let value = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "generateName": format!("{i:0width$x}-{driver}-{node_name}-"),
                    "ownerReferences": [owner],
                },
                "spec": spec,
            });
            if let Ok(slice) = serde_json::from_value(value) {
                out.push(slice);
            }
        }
    }
    out
}

/// The slices of [`MULTI_HOST`] pools, which the test creates itself: name `<driver>-<i>`
/// (`<driver>-<pool>-<i>` when there are several pools), the pool's node selector.
pub fn multi_host_slices(driver: &str, resources: &DriverResources) -> Vec<ResourceSlice> {
    let several = resources.pools.len() > 1;
    let mut out = Vec::new();
    for (pool_name, pool) in &resources.pools {
        for (i, slice) in pool.slices.iter().enumerate() {
            let mut spec = slice_spec(driver, pool_name, pool, slice);
            if let Some(selector) = &pool.node_selector {
                spec["nodeSelector"] = serde_json::to_value(selector).unwrap_or_default();
            } else {
                spec["allNodes"] = json!(true);
            }
            let name = if several { format!("{driver}-{pool_name}-{i}") } else { format!("{driver}-{i}") };
            let value = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": { "name": name },
                "spec": spec,
            });
            if let Ok(slice) = serde_json::from_value(value) {
                out.push(slice);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Nodes {
        Nodes::from_names(names.iter().map(|s| s.to_string()).collect(), Vec::new())
    }

    fn node(name: &str, uid: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.uid = Some(uid.into());
        n
    }

    #[test]
    fn node_local_gives_every_node_numbered_devices() {
        let r = node_local(2).generate(&nodes(&["a", "b"]));
        assert_eq!(r.keys().collect::<Vec<_>>(), ["a", "b"]);
        let pool = &r["b"].pools["b"];
        let names: Vec<_> = pool.slices[0].devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["device-00", "device-01"]);
        assert_eq!(pool.generation, 0);
        assert!(pool.node_selector.is_none());
    }

    #[test]
    fn explicit_devices_per_node_and_none_for_the_rest() {
        let attrs = BTreeMap::from([(
            "healthy".to_owned(),
            DeviceAttribute { bool: Some(true), ..Default::default() },
        )]);
        let r = node_local_devices(None, vec![BTreeMap::from([("dev-1".to_owned(), attrs.clone())])])
            .generate(&nodes(&["a", "b"]));
        assert_eq!(r.len(), 1);
        let d = &r["a"].pools["a"].slices[0].devices[0];
        assert_eq!((d.name.as_str(), d.attributes.as_ref()), ("dev-1", Some(&attrs)));
    }

    #[test]
    fn network_is_one_multi_host_pool_with_a_hostname_selector() {
        let r = network(3, true).generate(&nodes(&["a", "b"]));
        let pool = &r[MULTI_HOST].pools["network"];
        assert_eq!(pool.generation, 1);
        let names: Vec<_> = pool.slices[0].devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["device-0", "device-1", "device-2"]);
        let taint = &pool.slices[0].devices[0].taints.as_ref().unwrap()[0];
        assert_eq!(
            (taint.key.as_str(), taint.value.as_deref(), taint.effect.as_str()),
            ("example.com/taint", Some("tainted"), "NoSchedule")
        );
        let expr =
            &pool.node_selector.as_ref().unwrap().node_selector_terms[0].match_expressions.as_ref().unwrap()
                [0];
        assert_eq!((expr.key.as_str(), expr.operator.as_str()), ("kubernetes.io/hostname", "In"));
        assert_eq!(expr.values.as_deref().unwrap(), ["a", "b"]);
    }

    #[test]
    fn partitionable_uses_the_first_node_and_two_slices() {
        let counters = vec![CounterSet { name: "gpu-0".into(), ..Default::default() }];
        let r = partitionable(counters.clone(), vec![device("part-a")]).generate(&nodes(&["a", "b"]));
        assert_eq!(r.keys().collect::<Vec<_>>(), ["a"]);
        let slices = &r["a"].pools["a"].slices;
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0].shared_counters, counters);
        assert!(slices[0].devices.is_empty());
        assert_eq!(slices[1].devices[0].name, "part-a");
    }

    #[test]
    fn partitioned_pool_has_a_counter_slice_and_typed_devices() {
        let r = partitioned(true).generate(&nodes(&["a", "b"]));
        let pool = &r[MULTI_HOST].pools["partitioned"];
        assert_eq!(pool.generation, 1);
        assert_eq!(pool.slices[0].shared_counters[0].name, "gpu-0");
        assert_eq!(pool.slices[0].shared_counters[0].counters["memory"].value.0, "8");
        let devices = &pool.slices[1].devices;
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["full", "half-a", "half-b"]);
        let profile = &devices[1].attributes.as_ref().unwrap()[PARTITION_PROFILE_ATTRIBUTE];
        assert_eq!(profile.string.as_deref(), Some("Half"));
        assert_eq!(devices[0].consumes_counters.as_ref().unwrap()[0].counter_set, "gpu-0");
        assert_eq!(pool.slices[1].partition_type_attribute.as_deref(), Some(PARTITION_PROFILE_ATTRIBUTE));
        assert!(
            partitioned(false).generate(&nodes(&["a"]))[MULTI_HOST].pools["partitioned"].slices[1]
                .partition_type_attribute
                .is_none()
        );
        let slices = multi_host_slices("d.k8s.io", &r[MULTI_HOST]);
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[1].spec.partition_type_attribute.as_deref(), Some(PARTITION_PROFILE_ATTRIBUTE));
        assert_eq!(slices[1].metadata.name.as_deref(), Some("d.k8s.io-1"));
    }

    #[test]
    fn shareable_devices_allow_multiple_allocations() {
        let r = shareable(2).generate(&nodes(&["a"]));
        let devices = &r[MULTI_HOST].pools["shareable"].slices[0].devices;
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1].name, "shared-1");
        assert_eq!(devices[0].allow_multiple_allocations, Some(true));
        assert_eq!(devices[0].capacity.as_ref().unwrap()["memory"].value.0, "16");
    }

    #[test]
    fn taint_all_devices_adds_the_taints_everywhere() {
        let taint = device_taint("example.com/taint", "tainted", "NoExecute");
        let r = taint_all_devices(network(2, true), vec![taint.clone()]).generate(&nodes(&["a"]));
        for d in &r[MULTI_HOST].pools["network"].slices[0].devices {
            let taints = d.taints.as_ref().unwrap();
            // The NoSchedule taint of `network(_, true)` stays; the new one comes after it.
            assert_eq!(taints.len(), 2);
            assert_eq!(taints[0].effect, "NoSchedule");
            assert_eq!(taints[1], taint);
        }
        let r = taint_all_devices(node_local(1), vec![taint.clone()]).generate(&nodes(&["a", "b"]));
        assert_eq!(r["b"].pools["b"].slices[0].devices[0].taints.as_deref(), Some(&[taint][..]));
        let slices = multi_host_slices(
            "d.k8s.io",
            &taint_all_devices(network(1, false), vec![device_taint("k", "v", "NoSchedule")])
                .generate(&nodes(&["a"]))[MULTI_HOST],
        );
        let published = serde_json::to_value(&slices[0].spec.devices.as_ref().unwrap()[0]).unwrap();
        assert_eq!(published["taints"], json!([{ "key": "k", "value": "v", "effect": "NoSchedule" }]));
    }

    #[test]
    fn skip_node_operations_go_into_every_slice_spec() {
        let r = skip_node_operations(node_local(1), &["*"]).generate(&nodes(&["a", "b"]));
        assert_eq!(r["a"].pools["a"].slices[0].skip_node_operations, ["*"]);
        let slices = node_slices("d.k8s.io", &node("b", "uid-b"), &r["b"]);
        assert_eq!(slices[0].spec.skip_node_operations.as_deref(), Some(&["*".to_owned()][..]));
        // Without the mutator the field is absent, not empty.
        let plain =
            node_slices("d.k8s.io", &node("a", "uid-a"), &node_local(1).generate(&nodes(&["a"]))["a"]);
        assert!(plain[0].spec.skip_node_operations.is_none());
        let value = serde_json::to_value(&plain[0].spec).unwrap();
        assert!(value.get("skipNodeOperations").is_none());
    }

    #[test]
    fn index_width_grows_beyond_five_hex_digits_only_when_needed() {
        assert_eq!(slice_index_len(1), 5);
        assert_eq!(slice_index_len(0x100000), 5);
        assert_eq!(slice_index_len(0x100001), 6);
    }

    #[test]
    fn node_slices_look_like_the_upstream_controllers() {
        let r = partitionable(vec![CounterSet { name: "c".into(), ..Default::default() }], vec![device("d")])
            .generate(&nodes(&["127.0.0.1"]));
        let slices = node_slices("drv.k8s.io", &node("127.0.0.1", "uid-1"), &r["127.0.0.1"]);
        assert_eq!(slices.len(), 2);
        let s = &slices[1];
        assert_eq!(s.metadata.generate_name.as_deref(), Some("00001-drv.k8s.io-127.0.0.1-"));
        assert!(s.metadata.name.is_none());
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("v1", "Node", "127.0.0.1", "uid-1", Some(true))
        );
        assert_eq!(s.spec.node_name.as_deref(), Some("127.0.0.1"));
        assert_eq!(s.spec.driver, "drv.k8s.io");
        assert_eq!(
            (s.spec.pool.name.as_str(), s.spec.pool.generation, s.spec.pool.resource_slice_count),
            ("127.0.0.1", 1, 2)
        );
        assert!(slices[0].spec.devices.is_none());
        assert_eq!(slices[0].spec.shared_counters.as_ref().unwrap()[0].name, "c");
    }

    #[test]
    fn multi_host_slices_have_fixed_names_and_the_selector() {
        let r = network(2, false).generate(&nodes(&["a"]));
        let slices = multi_host_slices("drv.k8s.io", &r[MULTI_HOST]);
        assert_eq!(slices.len(), 1);
        let s = &slices[0];
        assert_eq!(s.metadata.name.as_deref(), Some("drv.k8s.io-0"));
        assert!(s.spec.node_name.is_none());
        assert!(s.spec.node_selector.is_some());
        assert_eq!(s.spec.devices.as_ref().unwrap().len(), 2);
        assert_eq!(s.spec.pool.generation, 1);
    }
}
