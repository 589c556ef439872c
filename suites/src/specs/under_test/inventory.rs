//! What the driver's ResourceSlices offer on the node under test, as the optional-feature specs
//! need it: each device of the pools' current generation with its attributes, the counters it
//! consumes, its capacity and taints, and the pools' counter sets ([`Inventory`]); and how a
//! claim asks for one kind of device ([`Pin`]: a CEL selector on the device's attributes, with
//! the devices of the node that it matches).
//!
//! A claim cannot name a device: its CEL selectors see the driver, the attributes and the
//! capacity, not the device's name. So a spec that needs, say, the partitions of a counter set
//! asks for the attributes of one partition, and [`Inventory::pin`] says which devices of the
//! node share them (the claim may get any of those). Only `string`, `int` and `bool`
//! attributes are compared; the DeviceClass's own selectors are ANDed by the scheduler and are
//! assumed to select every device of the driver (see `class_selector`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

use crate::specs::node_allocatable::cgroups::milli;

/// A scalar attribute value a selector can compare.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    /// `string`.
    Str(String),
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
}

impl Value {
    /// The value as a CEL literal.
    fn cel(&self) -> String {
        match self {
            Value::Str(s) => serde_json::Value::String(s.clone()).to_string(),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
        }
    }
}

/// A capacity of a device: its value and request policy (in thousandths of the unit, as
/// [`milli`] parses quantities), with the quantities as published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The capacity, in thousandths.
    pub value: i128,
    /// Whether the capacity has a `requestPolicy`.
    pub has_policy: bool,
    /// The smallest amount a claim may request, as published (`validValues`' least,
    /// `validRange.min`, else `default`); `None` without one.
    pub smallest: Option<(String, i128)>,
}

/// One taint of a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Taint {
    /// Its key.
    pub key: String,
    /// Its value, `""` without one.
    pub value: String,
    /// Its effect (`NoSchedule`, `NoExecute`, …).
    pub effect: String,
}

impl Taint {
    /// Whether the scheduler keeps the device from claims that do not tolerate it.
    pub fn keeps_off(&self) -> bool {
        self.effect == "NoSchedule" || self.effect == "NoExecute"
    }
}

/// One device of the node under test.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub name: String,
    /// Its scalar attributes, by `(domain, id)` (an unqualified name is in the driver's domain).
    pub attributes: BTreeMap<(String, String), Value>,
    /// What it consumes: `(counter set, counter) → amount` in thousandths.
    pub consumes: BTreeMap<(String, String), i128>,
    /// `allowMultipleAllocations`.
    pub multiple: bool,
    /// Its capacity, by name as published.
    pub capacity: BTreeMap<String, Capacity>,
    /// Its taints.
    pub taints: Vec<Taint>,
}

impl DeviceInfo {
    /// `pool/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.pool, self.name)
    }

    /// A device without optional features: no counters, one allocation at a time, no taint
    /// that keeps claims off.
    pub fn is_plain(&self) -> bool {
        self.consumes.is_empty() && !self.multiple && !self.taints.iter().any(Taint::keeps_off)
    }
}

/// The driver's devices and counter sets on one node, current generations only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The node.
    pub node: String,
    /// Its devices, in slice order.
    pub devices: Vec<DeviceInfo>,
    /// The counter sets: `(pool, counter set) → counter → amount` in thousandths.
    pub counter_sets: BTreeMap<(String, String), BTreeMap<String, i128>>,
}

/// How a claim asks for one kind of device: a CEL selector (none: every device of the class)
/// and the devices of the node it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The CEL expression, `None` when the kind has no attribute to ask for.
    pub selector: Option<String>,
    /// The devices of the node under test it matches.
    pub devices: Vec<DeviceInfo>,
}

impl Pin {
    /// The `selectors` of a request that asks for these devices.
    pub fn selectors(&self) -> serde_json::Value {
        match &self.selector {
            Some(expression) => serde_json::json!([{ "cel": { "expression": expression } }]),
            None => serde_json::json!([]),
        }
    }

    /// The matched devices as `pool/name`.
    pub fn ids(&self) -> BTreeSet<String> {
        self.devices.iter().map(DeviceInfo::id).collect()
    }
}

impl Inventory {
    /// The devices and counter sets of `driver`'s `slices` for `node` (their pools' current
    /// generation only). A quantity that does not parse leaves its entry out.
    pub fn of(slices: &[ResourceSlice], driver: &str, node: &str) -> Inventory {
        let ours: Vec<&ResourceSlice> = slices
            .iter()
            .filter(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(node))
            .collect();
        let mut current: BTreeMap<&str, i64> = BTreeMap::new();
        for s in &ours {
            let g = current.entry(s.spec.pool.name.as_str()).or_insert(s.spec.pool.generation);
            *g = (*g).max(s.spec.pool.generation);
        }
        let mut inventory = Inventory { node: node.to_owned(), ..Inventory::default() };
        for s in ours
            .into_iter()
            .filter(|s| current.get(s.spec.pool.name.as_str()) == Some(&s.spec.pool.generation))
        {
            let pool = &s.spec.pool.name;
            for set in s.spec.shared_counters.iter().flatten() {
                let counters = set
                    .counters
                    .iter()
                    .filter_map(|(k, c)| Some((k.clone(), milli(&c.value.0).ok()?)))
                    .collect();
                inventory.counter_sets.insert((pool.clone(), set.name.clone()), counters);
            }
            for device in s.spec.devices.iter().flatten() {
                inventory.devices.push(device_info(pool, device, driver));
            }
        }
        inventory
    }

    /// How to ask for devices like `device`: a selector on its scalar attributes, and every
    /// device of the node that has them all (itself included).
    pub fn pin(&self, device: &DeviceInfo) -> Pin {
        let profile = &device.attributes;
        let devices = self
            .devices
            .iter()
            .filter(|d| profile.iter().all(|(key, value)| d.attributes.get(key) == Some(value)))
            .cloned()
            .collect();
        let terms: Vec<String> = profile
            .iter()
            .map(|((domain, id), value)| {
                let attribute =
                    format!("device.attributes[{}].{id}", serde_json::Value::String(domain.clone()));
                format!("has({attribute}) && {attribute} == {}", value.cel())
            })
            .collect();
        let selector = (!terms.is_empty()).then(|| terms.join(" && "));
        Pin { selector, devices }
    }
}

/// One device as the specs see it.
fn device_info(pool: &str, device: &Device, driver: &str) -> DeviceInfo {
    let attributes = device
        .attributes
        .iter()
        .flatten()
        .filter_map(|(name, a)| {
            let value = match (&a.string, a.int, a.bool) {
                (Some(s), _, _) => Value::Str(s.clone()),
                (_, Some(i), _) => Value::Int(i),
                (_, _, Some(b)) => Value::Bool(b),
                _ => return None,
            };
            let (domain, id) = name.rsplit_once('/').unwrap_or((driver, name));
            Some(((domain.to_owned(), id.to_owned()), value))
        })
        .collect();
    let consumes = device
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| {
            c.counters
                .iter()
                .filter_map(|(k, v)| Some(((c.counter_set.clone(), k.clone()), milli(&v.value.0).ok()?)))
        })
        .collect();
    let capacity = device
        .capacity
        .iter()
        .flatten()
        .filter_map(|(name, c)| {
            let policy = c.request_policy.as_ref();
            let smallest = policy.and_then(|p| {
                let least =
                    p.valid_values.iter().flatten().filter_map(|q| Some((q.0.clone(), milli(&q.0).ok()?)));
                let least = least.min_by_key(|(_, v)| *v);
                let min = p.valid_range.as_ref().map(|r| r.min.0.clone());
                let published =
                    least.map(|(q, _)| q).or(min).or_else(|| p.default.as_ref().map(|q| q.0.clone()))?;
                let value = milli(&published).ok()?;
                Some((published, value))
            });
            Some((
                name.clone(),
                Capacity { value: milli(&c.value.0).ok()?, has_policy: policy.is_some(), smallest },
            ))
        })
        .collect();
    let taints = device
        .taints
        .iter()
        .flatten()
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        })
        .collect();
    DeviceInfo {
        pool: pool.to_owned(),
        name: device.name.clone(),
        attributes,
        consumes,
        multiple: device.allow_multiple_allocations == Some(true),
        capacity,
        taints,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
pub(super) mod tests {
    use super::*;

    /// The driver of the fixtures.
    pub const DRIVER: &str = "example.dra-e2e.test";

    /// The slices of `devices` (JSON) on node `n1`, pool `n1`, with `counters` (JSON, a second
    /// slice when not null), as the example driver publishes them.
    pub fn slices(devices: serde_json::Value, counters: serde_json::Value) -> Vec<ResourceSlice> {
        let count = if counters.is_null() { 1 } else { 2 };
        let spec = |content: (&str, serde_json::Value)| {
            let mut spec = serde_json::json!({
                "driver": DRIVER, "nodeName": "n1",
                "pool": { "name": "n1", "generation": 1, "resourceSliceCount": count },
            });
            spec[content.0] = content.1;
            serde_json::from_value::<ResourceSlice>(
                serde_json::json!({ "metadata": { "name": "s" }, "spec": spec }),
            )
            .unwrap()
        };
        let mut out = vec![spec(("devices", devices))];
        if !counters.is_null() {
            out.push(spec(("sharedCounters", counters)));
        }
        out
    }

    /// The example driver's slices with `--optional-devices` (kubelet-plugin/examples/node_driver.rs).
    pub fn example_optional() -> Vec<ResourceSlice> {
        let kind = |k: &str| serde_json::json!({ "kind": { "string": k } });
        let partition = |i: u32| {
            serde_json::json!({
                "name": format!("partition-{i}"), "attributes": kind("partition"),
                "consumesCounters": [{ "counterSet": "shared-memory", "counters": { "memory": { "value": "4Gi" } } }],
            })
        };
        let devices = serde_json::json!([
            { "name": "device-00", "attributes": kind("plain") },
            { "name": "device-01", "attributes": kind("plain") },
            partition(0), partition(1), partition(2),
            { "name": "shared-0", "attributes": kind("shared"), "allowMultipleAllocations": true,
              "capacity": { "memory": { "value": "8Gi",
                  "requestPolicy": { "default": "1Gi", "validRange": { "min": "1Gi" } } } } },
            { "name": "tainted-0", "attributes": kind("tainted"),
              "taints": [{ "key": "example.dra-e2e.test/unhealthy", "value": "true", "effect": "NoSchedule" }] },
        ]);
        let counters =
            serde_json::json!([{ "name": "shared-memory", "counters": { "memory": { "value": "8Gi" } } }]);
        slices(devices, counters)
    }

    /// The example driver's slice without it: plain devices, no attributes.
    pub fn example_plain() -> Vec<ResourceSlice> {
        slices(serde_json::json!([{ "name": "device-00" }, { "name": "device-01" }]), serde_json::Value::Null)
    }

    #[test]
    fn the_inventory_reads_attributes_counters_capacity_and_taints() {
        let inventory = Inventory::of(&example_optional(), DRIVER, "n1");
        assert_eq!(inventory.devices.len(), 7);
        assert_eq!(
            inventory.counter_sets[&("n1".to_owned(), "shared-memory".to_owned())]["memory"],
            8_000 << 30
        );
        let shared = inventory.devices.iter().find(|d| d.name == "shared-0").unwrap();
        assert!(shared.multiple && !shared.is_plain());
        assert_eq!(shared.capacity["memory"].smallest, Some(("1Gi".to_owned(), 1_000 << 30)));
        let tainted = inventory.devices.iter().find(|d| d.name == "tainted-0").unwrap();
        assert!(tainted.taints[0].keeps_off() && !tainted.is_plain());
        assert_eq!(tainted.attributes[&(DRIVER.to_owned(), "kind".to_owned())], Value::Str("tainted".into()));
        assert!(Inventory::of(&example_optional(), DRIVER, "n2").devices.is_empty());
    }

    #[test]
    fn a_pin_selects_the_devices_that_share_the_attributes() {
        let inventory = Inventory::of(&example_optional(), DRIVER, "n1");
        let partition = inventory.devices.iter().find(|d| d.name == "partition-1").unwrap();
        let pin = inventory.pin(partition);
        assert_eq!(
            pin.selector.as_deref(),
            Some(
                r#"has(device.attributes["example.dra-e2e.test"].kind) && device.attributes["example.dra-e2e.test"].kind == "partition""#
            )
        );
        assert_eq!(
            pin.ids(),
            ["n1/partition-0", "n1/partition-1", "n1/partition-2"].map(String::from).into()
        );
        // Qualified names keep their domain; ints, bools and quoted strings are CEL literals.
        let typed = Inventory::of(
            &slices(
                serde_json::json!([{ "name": "a", "attributes": {
                    "gpu.example.com/index": { "int": 3 }, "healthy": { "bool": true },
                    "model": { "string": "say \"hi\"" }, "v": { "version": "1.0.0" } } }]),
                serde_json::Value::Null,
            ),
            DRIVER,
            "n1",
        );
        let selector = typed.pin(&typed.devices[0]).selector.unwrap();
        for term in [
            r#"device.attributes["gpu.example.com"].index == 3"#,
            r#"device.attributes["example.dra-e2e.test"].healthy == true"#,
            r#"device.attributes["example.dra-e2e.test"].model == "say \"hi\"""#,
        ] {
            assert!(selector.contains(term), "{term} not in {selector}");
        }
        assert!(!selector.contains(".v "), "a version attribute is not compared: {selector}");
        // No attribute: no selector, every device.
        let plain = Inventory::of(&example_plain(), DRIVER, "n1");
        let pin = plain.pin(&plain.devices[0]);
        assert_eq!((pin.selector, pin.devices.len()), (None, 2));
    }
}
