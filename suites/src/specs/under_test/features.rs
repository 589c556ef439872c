//! Which optional DRA features the driver under test shows in its ResourceSlices on the node
//! under test, and how a spec uses each: partitionable devices ([`partitions`]), consumable
//! capacity ([`sharing`]), device taints ([`taints`]), and the plain devices the admin-access
//! spec asks for ([`plain`]). Each returns the plan of its spec, or the one sentence its spec
//! skips with, naming what the slices lack. Admin access itself is a claim feature, decided by
//! the cluster (see [`admin`](super::admin)).
//!
//! The decisions are pure functions of the [`Inventory`]; [`require`] makes one a spec's
//! requirement, decided before anything is created.

use std::collections::BTreeSet;

use harness::framework::{ClusterAccess, SpecError, SpecResult};

use super::{
    Target,
    inventory::{DeviceInfo, Inventory, Pin, Taint},
    session::{Session, driver_slices, served_nodes},
};

/// The inventory of the node under test (the first node, by name, that the driver serves);
/// `None` when it serves none (the spec's own set-up then fails saying so).
pub async fn inventory(from: &impl ClusterAccess, target: &Target) -> anyhow::Result<Option<Inventory>> {
    let nodes = served_nodes(from, &target.driver).await?;
    let Some(node) = nodes.first() else { return Ok(None) };
    let slices = driver_slices(from, &target.driver).await?;
    Ok(Some(Inventory::of(&slices, &target.driver, node)))
}

/// The inventory of the session's node under test, now.
pub async fn of_session(s: &Session) -> anyhow::Result<Inventory> {
    let slices = driver_slices(&s.ctx, &s.target.driver).await?;
    Ok(Inventory::of(&slices, &s.target.driver, &s.node))
}

/// Skips unless `plan` finds what its spec needs in the node's slices.
pub async fn require<T>(
    from: &impl ClusterAccess,
    target: &Target,
    plan: fn(&Inventory) -> Result<T, String>,
) -> SpecResult {
    match inventory(from, target).await? {
        Some(inventory) => plan(&inventory).map(drop).map_err(SpecError::skip),
        None => Ok(()),
    }
}

/// The plan of the partitionable-devices spec: a kind of partition of which `fit` fit the
/// counter set at once and more exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPlan {
    /// How a claim asks for one of these partitions.
    pub pin: Pin,
    /// Their counter set, `pool/name`.
    pub counter_set: String,
    /// How many fit the counter set at once (at least 2, fewer than the partitions).
    pub fit: usize,
}

/// How many devices like `device` fit its counter set at once; `None` when it consumes from
/// more than one set, or from counters its pool does not publish.
fn how_many_fit(inventory: &Inventory, device: &DeviceInfo) -> Option<usize> {
    let sets: BTreeSet<&String> = device.consumes.keys().map(|(set, _)| set).collect();
    let [set] = sets.into_iter().collect::<Vec<_>>()[..] else { return None };
    let counters = inventory.counter_sets.get(&(device.pool.clone(), set.clone()))?;
    device
        .consumes
        .iter()
        .filter(|(_, amount)| **amount > 0)
        .map(|((_, counter), amount)| {
            counters.get(counter).map(|have| usize::try_from(have / amount).unwrap_or(0))
        })
        .collect::<Option<Vec<usize>>>()?
        .into_iter()
        .min()
}

/// Partitionable devices: a kind of device (same attributes) whose devices all consume the same
/// counters of one counter set, two or more of them fit it at once, and more exist than fit.
pub fn partitions(inventory: &Inventory) -> Result<PartitionPlan, String> {
    let node = &inventory.node;
    let partitions: Vec<&DeviceInfo> = inventory.devices.iter().filter(|d| !d.consumes.is_empty()).collect();
    if partitions.is_empty() {
        return Err(format!(
            "the driver's slices on node {node} publish no device with sharedCounters/consumesCounters"
        ));
    }
    for device in partitions {
        let pin = inventory.pin(device);
        let alike = pin.devices.iter().all(|d| d.consumes == device.consumes);
        let Some(fit) = how_many_fit(inventory, device) else { continue };
        if alike && fit >= 2 && pin.devices.len() > fit {
            let (set, _) = device.consumes.keys().next().cloned().unwrap_or_default();
            return Ok(PartitionPlan { pin, counter_set: format!("{}/{set}", device.pool), fit });
        }
    }
    Err(format!(
        "the driver's slices on node {node} publish devices with consumesCounters, but no kind of them (devices \
         with the same attributes, consuming the same counters of one counter set) of which at least two fit \
         the counter set at once and more exist than fit"
    ))
}

/// The plan of the consumable-capacity spec: one device that allows multiple allocations, a
/// capacity of it with a request policy, and an amount of which two fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePlan {
    /// How a claim asks for this device (it alone matches).
    pub pin: Pin,
    /// The device, `pool/name`.
    pub device: String,
    /// The capacity's name, as published.
    pub capacity: String,
    /// What each claim requests, as published (the policy's smallest).
    pub amount: String,
    /// The same in thousandths.
    pub amount_milli: i128,
}

/// Consumable capacity: a device with `allowMultipleAllocations` that its attributes single out,
/// with a capacity that has a request policy and holds two of its smallest request.
pub fn sharing(inventory: &Inventory) -> Result<SharePlan, String> {
    let node = &inventory.node;
    let shared: Vec<&DeviceInfo> = inventory.devices.iter().filter(|d| d.multiple).collect();
    if shared.is_empty() {
        return Err(format!(
            "the driver's slices on node {node} publish no device with allowMultipleAllocations"
        ));
    }
    let mut with_policy = false;
    for device in shared {
        let pin = inventory.pin(device);
        for (name, capacity) in device.capacity.iter().filter(|(_, c)| c.has_policy) {
            with_policy = true;
            let Some((amount, milli)) = capacity.smallest.clone() else { continue };
            if pin.devices.len() == 1 && milli > 0 && 2 * milli <= capacity.value {
                let (device, capacity) = (device.id(), name.clone());
                return Ok(SharePlan { pin, device, capacity, amount, amount_milli: milli });
            }
        }
    }
    if !with_policy {
        return Err(format!(
            "the driver's slices on node {node} publish devices with allowMultipleAllocations, but none with a \
             capacity that has a requestPolicy"
        ));
    }
    Err(format!(
        "the driver's slices on node {node} publish devices with allowMultipleAllocations and a capacity request \
         policy, but none that its attributes single out and whose capacity holds two of its smallest request"
    ))
}

/// The plan of the taints spec: tainted devices a claim can ask for without getting an
/// untainted one, and the tolerations that let it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintPlan {
    /// How a claim asks for them.
    pub pin: Pin,
    /// Their taints that keep claims off (one toleration each: key and effect, `Exists`).
    pub taints: Vec<Taint>,
}

impl TaintPlan {
    /// The tolerations of a request that tolerates every taint of the plan.
    pub fn tolerations(&self) -> serde_json::Value {
        let keys: BTreeSet<(&str, &str)> =
            self.taints.iter().map(|t| (t.key.as_str(), t.effect.as_str())).collect();
        keys.into_iter()
            .map(|(key, effect)| serde_json::json!({ "key": key, "operator": "Exists", "effect": effect }))
            .collect()
    }
}

/// Device taints: a kind of device (same attributes) whose devices all carry a `NoSchedule` or
/// `NoExecute` taint; when every device of the node is tainted, all of them.
pub fn taints(inventory: &Inventory) -> Result<TaintPlan, String> {
    let node = &inventory.node;
    let keeps_off = |d: &DeviceInfo| d.taints.iter().any(Taint::keeps_off);
    let tainted: Vec<&DeviceInfo> = inventory.devices.iter().filter(|d| keeps_off(d)).collect();
    if tainted.is_empty() {
        return Err(format!(
            "the driver's slices on node {node} publish no device with taints (effect NoSchedule or NoExecute)"
        ));
    }
    let plan = |pin: Pin| {
        let taints =
            pin.devices.iter().flat_map(|d| d.taints.iter().filter(|t| t.keeps_off()).cloned()).collect();
        TaintPlan { pin, taints }
    };
    if let Some(pin) = tainted.iter().map(|d| inventory.pin(d)).find(|p| p.devices.iter().all(keeps_off)) {
        return Ok(plan(pin));
    }
    if inventory.devices.iter().all(keeps_off) {
        return Ok(plan(Pin { selector: None, devices: inventory.devices.clone() }));
    }
    Err(format!(
        "the driver's slices on node {node} publish tainted devices, but each shares its attributes with an \
         untainted device, so no claim can ask for tainted devices only"
    ))
}

/// The plain devices of the admin-access spec (no counters, one allocation at a time, no taint
/// that keeps claims off): a kind of them that a claim can ask for without matching others.
pub fn plain(inventory: &Inventory) -> Result<Pin, String> {
    let node = &inventory.node;
    let plain: Vec<&DeviceInfo> = inventory.devices.iter().filter(|d| d.is_plain()).collect();
    if plain.is_empty() {
        return Err(format!(
            "the driver's slices on node {node} publish no plain device (one without counters, multiple \
             allocations or taints) for a claim to hold while an admin-access claim gets it too"
        ));
    }
    plain.iter().map(|d| inventory.pin(d)).find(|p| p.devices.iter().all(DeviceInfo::is_plain)).ok_or_else(|| {
        format!(
            "the driver's slices on node {node} publish plain devices, but each shares its attributes with a \
             partition, shared or tainted device, so no claim can ask for plain devices only"
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::{
        super::inventory::tests::{DRIVER, example_optional, example_plain, slices},
        *,
    };

    fn of(slices: &[k8s_openapi::api::resource::v1::ResourceSlice]) -> Inventory {
        Inventory::of(slices, DRIVER, "n1")
    }

    #[test]
    fn the_example_driver_with_optional_devices_shows_every_feature() {
        let inventory = of(&example_optional());
        let p = partitions(&inventory).unwrap();
        assert_eq!((p.fit, p.pin.devices.len(), p.counter_set.as_str()), (2, 3, "n1/shared-memory"));
        let s = sharing(&inventory).unwrap();
        assert_eq!(
            (s.device.as_str(), s.capacity.as_str(), s.amount.as_str()),
            ("n1/shared-0", "memory", "1Gi")
        );
        let t = taints(&inventory).unwrap();
        assert_eq!(t.pin.ids(), ["n1/tainted-0".to_owned()].into());
        assert_eq!(
            t.tolerations(),
            serde_json::json!([{ "key": "example.dra-e2e.test/unhealthy", "operator": "Exists", "effect": "NoSchedule" }])
        );
        let a = plain(&inventory).unwrap();
        assert_eq!(a.ids(), ["n1/device-00".to_owned(), "n1/device-01".to_owned()].into());
    }

    #[test]
    fn without_them_each_spec_skips_naming_what_the_slices_lack() {
        let inventory = of(&example_plain());
        for (reason, lacks) in [
            (partitions(&inventory).unwrap_err(), "no device with sharedCounters/consumesCounters"),
            (sharing(&inventory).unwrap_err(), "no device with allowMultipleAllocations"),
            (taints(&inventory).unwrap_err(), "no device with taints"),
        ] {
            assert!(reason.starts_with("the driver's slices on node n1 publish "), "{reason}");
            assert!(reason.contains(lacks), "{reason}");
        }
        // Plain devices without attributes: the admin spec asks for all of them.
        assert_eq!(plain(&inventory).unwrap().selector, None);
    }

    #[test]
    fn partitions_that_all_fit_or_cannot_be_told_apart_are_no_plan() {
        let part = |name: &str, memory: &str| {
            serde_json::json!({ "name": name,
                "consumesCounters": [{ "counterSet": "c", "counters": { "memory": { "value": memory } } }] })
        };
        let counters = serde_json::json!([{ "name": "c", "counters": { "memory": { "value": "8Gi" } } }]);
        // Two of 4Gi fit 8Gi, and there are only two: nothing stays unallocated.
        let all_fit = of(&slices(serde_json::json!([part("a", "4Gi"), part("b", "4Gi")]), counters.clone()));
        assert!(partitions(&all_fit).unwrap_err().contains("at least two fit"));
        // Without attributes a 4Gi and an 8Gi partition are one kind that consumes differently.
        let mixed =
            of(&slices(serde_json::json!([part("a", "4Gi"), part("b", "4Gi"), part("c", "8Gi")]), counters));
        assert!(partitions(&mixed).is_err());
    }

    #[test]
    fn a_shared_device_needs_a_request_policy_and_room_for_two() {
        let shared = |policy: serde_json::Value| {
            of(&slices(
                serde_json::json!([{ "name": "s", "allowMultipleAllocations": true,
                    "capacity": { "memory": { "value": "8Gi", "requestPolicy": policy } } }]),
                serde_json::Value::Null,
            ))
        };
        let values = sharing(&shared(serde_json::json!({ "validValues": ["6Gi", "2Gi"] }))).unwrap();
        assert_eq!(values.amount, "2Gi");
        assert!(
            sharing(&shared(serde_json::json!({ "validRange": { "min": "5Gi" } })))
                .unwrap_err()
                .contains("holds two")
        );
        let no_policy = of(&slices(
            serde_json::json!([{ "name": "s", "allowMultipleAllocations": true, "capacity": { "memory": { "value": "8Gi" } } }]),
            serde_json::Value::Null,
        ));
        assert!(sharing(&no_policy).unwrap_err().contains("none with a capacity that has a requestPolicy"));
    }

    #[test]
    fn tainted_devices_are_asked_for_by_attributes_or_all_together() {
        let taint = serde_json::json!([{ "key": "k", "effect": "NoExecute" }]);
        let all = of(&slices(
            serde_json::json!([{ "name": "a", "taints": taint }, { "name": "b", "taints": taint }]),
            serde_json::Value::Null,
        ));
        let plan = taints(&all).unwrap();
        assert_eq!((plan.pin.selector.clone(), plan.pin.devices.len()), (None, 2));
        let mixed = of(&slices(
            serde_json::json!([{ "name": "a", "taints": taint }, { "name": "b" }]),
            serde_json::Value::Null,
        ));
        assert!(taints(&mixed).unwrap_err().contains("shares its attributes with an untainted device"));
        let effect_none = of(&slices(
            serde_json::json!([{ "name": "a", "taints": [{ "key": "k", "effect": "None" }] }]),
            serde_json::Value::Null,
        ));
        assert!(taints(&effect_none).unwrap_err().contains("no device with taints"));
    }
}
