//! The claim state that the instances of one driver on one node share while they run at the
//! same time (a rolling update), in place of upstream's file lock and on-disk driver state.
//!
//! Upstream's helper serializes all prepare and unprepare calls of the instances of a driver
//! with a file lock when rolling updates are on, and expects the driver to keep its state where
//! every instance finds it, because the kubelet may prepare a claim through one instance and
//! unprepare it through the other. Here the instances live in one process, so they share one
//! [`ClaimState`]: prepared claims with their devices, and a lock per claim, so that two
//! instances never work on the same claim at once (calls for different claims still run in
//! parallel, see the design's "do not serialize all calls").
//!
//! The state is handed out by (driver name, node name) as [`Lease`]s; it lives as long as one
//! instance holds a lease. Only the last instance to stop may remove CDI files of claims that
//! are still prepared: the others leave them to the instance that remains.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock, PoisonError},
};

use crate::plugin::ClaimState;

type Key = (String, String);

/// Live states with the number of leases on each.
fn registry() -> &'static Mutex<HashMap<Key, (ClaimState, usize)>> {
    static REGISTRY: OnceLock<Mutex<HashMap<Key, (ClaimState, usize)>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// One instance's share of the claim state of a driver on a node. Give it back with
/// [`Lease::release`]; dropping it releases it too.
#[derive(Debug)]
pub(crate) struct Lease {
    key: Option<Key>,
    state: ClaimState,
}

impl Lease {
    /// The state of `driver` on `node`: the one other running instances use, else a new one.
    pub(crate) fn acquire(driver: &str, node: &str) -> Lease {
        let key = (driver.to_owned(), node.to_owned());
        let mut map = registry().lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(key.clone()).or_insert_with(|| (ClaimState::default(), 0));
        entry.1 += 1;
        Lease { key: Some(key), state: entry.0.clone() }
    }

    /// The shared state.
    pub(crate) fn state(&self) -> &ClaimState {
        &self.state
    }

    /// Gives the lease back. Returns whether this was the last instance using the state (which
    /// is then forgotten: an instance started later begins with a new one).
    pub(crate) fn release(mut self) -> bool {
        self.release_inner()
    }

    fn release_inner(&mut self) -> bool {
        let Some(key) = self.key.take() else { return false };
        let mut map = registry().lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(&key) {
            Some(entry) if entry.1 > 1 => {
                entry.1 -= 1;
                false
            }
            Some(_) => {
                map.remove(&key);
                true
            }
            None => true,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_running_together_share_the_state_and_the_last_one_knows() {
        let old = Lease::acquire("shared-claims-test.k8s.io", "node-a");
        let new = Lease::acquire("shared-claims-test.k8s.io", "node-a");
        let other_node = Lease::acquire("shared-claims-test.k8s.io", "node-b");
        let other_driver = Lease::acquire("shared-claims-test-2.k8s.io", "node-a");
        assert!(old.state().same_as(new.state()));
        assert!(!old.state().same_as(other_node.state()));
        assert!(!old.state().same_as(other_driver.state()));

        assert!(!old.release(), "the new instance still uses the state");
        let remembered = new.state().clone();
        assert!(new.release(), "the last instance");

        // A later instance (a sequential update) starts afresh.
        let later = Lease::acquire("shared-claims-test.k8s.io", "node-a");
        assert!(!later.state().same_as(&remembered));
        drop(later);
        // Dropping released it: the next one is alone again.
        let next = Lease::acquire("shared-claims-test.k8s.io", "node-a");
        assert!(next.release());
        assert!(other_node.release());
        assert!(other_driver.release());
    }
}
