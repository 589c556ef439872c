//! The DRA specs, registered explicitly, grouped as upstream's test/e2e/dra groups them.

use harness::framework::Registry;

/// Registers every spec.
pub fn register(_registry: &mut Registry) {}
