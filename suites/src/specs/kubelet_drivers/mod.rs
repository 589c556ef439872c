//! `[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] ...`: specs of upstream's
//! test/e2e/dra/dra.go (Kubernetes v1.37) about how the kubelet talks to drivers, and about
//! objects written through the beta APIs, run with drivers registered with the kubelet.
//!
//! | upstream context (dra.go) | module | specs |
//! |---|---|---|
//! | `with multiple drivers` (`multipleDriversContext`) | [`multiple_drivers`] | 3: only v1beta1, only v1, both |
//! | `with v1beta1 API` / `with v1beta2 API` | [`api_versions`] | 2 each: simple claim, requests with alternatives |
//! | `[FeatureGate:DRAPartitionableDevices]` | [`partitionable`] | must consume and free up counters |
//!
//! Unlike upstream, every spec checks what the kubelet did through the gRPC calls the plugin
//! recorded ([`evidence`]): the exact full method names (so the API version it chose), the claims
//! it named, and that it unprepared them after the pod was deleted.
//!
//! Full texts are rendered as ginkgo renders upstream's: a feature gate's `[FeatureGate:X]` in
//! place, its stability (`[Beta]`) and its dependencies (`[FeatureGate:DynamicResourceAllocation]`)
//! at the end of the spec name.

mod api_versions;
pub(crate) mod evidence;
pub(crate) mod gates;
mod multiple_drivers;
mod partitionable;

use harness::framework::Registry;

use super::FEATURE_DRA;

/// Registers the specs under `[sig-node] [DRA]`.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("kubelet", [FEATURE_DRA], api_versions::register);
        r.context_with_labels(
            "kubelet",
            [FEATURE_DRA, "FeatureGate:DRAPartitionableDevices"],
            partitionable::register,
        );
        r.context_with_labels("kubelet", [FEATURE_DRA], multiple_drivers::register);
    });
}
