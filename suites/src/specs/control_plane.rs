//! `[sig-node] [DRA] control plane ...`: the specs of upstream's test/e2e/dra/dra.go (Kubernetes
//! v1.37) that need only the API server, scheduler and controllers. The test driver publishes
//! ResourceSlices but registers with no kubelet, so pods are only expected to be scheduled; a
//! spec checks instead that each claim of a scheduled pod is allocated with the driver's devices,
//! reserved for the pod, and carries the configuration the driver would turn into the expected
//! env (`admin_x=y`, `user_a=b`).
//!
//! | upstream context (dra.go) | module | specs |
//! |---|---|---|
//! | `singleNodeTests(false)` | [`single_node`] | 13, one node, one device |
//! | `multiNodeTests(false)` | [`multi_node`] | 2, need 2 to 8 nodes (skipped on one) |
//! | `control plane` with `NetworkResources(10)` | [`network`] | admin access, claim name truncation, quota, device status |
//! | `control plane` with `DriverResources(1)` on 1-4 nodes | [`permissions`] | per-node ResourceSlice permissions, device status |
//! | `control plane` / `control plane views` with FG `DRAResourcePoolStatus` | [`pool_status`] | 5 on one node, 7 on two nodes (skipped on one) |
//!
//! Every spec has its own namespace, driver (`<namespace>.k8s.io`) and DeviceClass, so they run
//! in parallel.

pub(crate) mod multi_node;
mod network;
mod permissions;
mod pool_status;
pub(crate) mod single_node;

use harness::framework::{Label, Registry};

/// Upstream's `f.WithFeatureGate(features.DRAResourceClaimDeviceStatus)`.
pub(crate) const FG_DEVICE_STATUS: Label = Label::gate("DRAResourceClaimDeviceStatus");

/// Registers the control-plane specs under `[sig-node] [DRA]`, in upstream's order.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        pool_status::register_single_node(r);
        r.context("control plane", single_node::register);
        r.context("control plane", multi_node::register);
        r.context("control plane", network::register);
        r.context("control plane", permissions::register);
        pool_status::register_two_nodes(r);
    });
}
