//! The DRA specs, registered explicitly, grouped as upstream's test/e2e/dra groups them.

/// `ensure!` for spec bodies: returns a failure (anyhow error, converted into the caller's error
/// type) unless the condition holds.
macro_rules! expect {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(anyhow::anyhow!($($arg)+).into());
        }
    };
}

/// `bail!` for spec bodies.
macro_rules! fail {
    ($($arg:tt)+) => {
        return Err(anyhow::anyhow!($($arg)+).into())
    };
}

mod compatibility_groups;
mod control_plane;
mod crud;
mod extended_resource;
#[cfg(test)]
mod guide;
mod health;
mod kubelet;
mod kubelet_drivers;
mod kubelet_metrics;
mod metadata;
mod node_allocatable;
#[cfg(test)]
mod prechecked;
mod resource_quota;
mod slice_controller;
pub mod under_test;

use harness::framework::Registry;

/// The label of upstream's `feature.DynamicResourceAllocation` on every `kubelet` context.
const FEATURE_DRA: &str = "Feature:DynamicResourceAllocation";

/// The priority of the specs whose driver runs kubelet plugins: each ends with a deferred check
/// that waits for the kubelet to wipe the driver's ResourceSlices, 30 s after its plugin left.
/// Started before the specs that leave nothing to wait for, those 30 s pass while the others
/// run instead of at the end of the run.
pub(crate) const PLUGIN_PRIORITY: i32 = 1;

/// The priority of the specs that take longest from start to their last deferred check (about
/// 50 s or more): started first, so that the last one to start is a short one.
pub(crate) const LONG_PRIORITY: i32 = 2;

/// Registers every spec.
pub fn register(registry: &mut Registry) {
    crud::register(registry);
    control_plane::register(registry);
    registry.with_priority(PLUGIN_PRIORITY, |registry| {
        kubelet::register(registry);
        kubelet_drivers::register(registry);
        metadata::register(registry);
        health::register(registry);
        compatibility_groups::register(registry);
    });
    registry.with_priority(LONG_PRIORITY, slice_controller::register);
    extended_resource::register(registry);
    node_allocatable::register(registry);
    resource_quota::register(registry);
}

/// The full texts `register` registers, after the registry's own validation (for the
/// per-module spec-text tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
pub(crate) fn registered_texts(register: impl FnOnce(&mut Registry)) -> Vec<String> {
    let mut registry = Registry::for_version(crate::versions::DEFAULT);
    register(&mut registry);
    registry.validate().unwrap();
    registry.specs().map(|s| s.full_text().to_owned()).collect()
}

/// Fails unless `registered` (a module's full texts) are exactly `expected`, in any order,
/// naming every text registered but not expected (a new spec: add its full text to the module's
/// `full_texts_match_upstream`; one of our own also goes into every
/// `suites/upstream/parity-V.txt`, see suites/README.md) and every text expected but not
/// registered.
#[cfg(test)]
pub(crate) fn expect_texts(registered: &[String], expected: &[String]) {
    let unexpected: Vec<&String> = registered.iter().filter(|t| !expected.contains(t)).collect();
    let missing: Vec<&String> = expected.iter().filter(|t| !registered.contains(t)).collect();
    assert!(
        unexpected.is_empty() && missing.is_empty() && registered.len() == expected.len(),
        "registered but not in the test's list: {unexpected:#?}\nin the list but not registered: {missing:#?}\n\
         ({} registered, {} listed)",
        registered.len(),
        expected.len()
    );
}
