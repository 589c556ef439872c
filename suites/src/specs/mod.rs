//! The DRA specs, registered explicitly, grouped as upstream's test/e2e/dra groups them.

mod control_plane;
mod crud;
mod health;
mod kubelet;
mod kubelet_drivers;

use harness::framework::Registry;

/// Registers every spec.
pub fn register(registry: &mut Registry) {
    crud::register(registry);
    control_plane::register(registry);
    kubelet::register(registry);
    kubelet_drivers::register(registry);
    health::register(registry);
}
