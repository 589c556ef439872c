//! `[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] ...`: specs of upstream's
//! test/e2e/dra/dra.go (Kubernetes v1.37) about how the kubelet talks to drivers, and about
//! objects written through the beta APIs, run with drivers registered with the kubelet.
//!
//! | upstream context (dra.go) | module | specs |
//! |---|---|---|
//! | `with multiple drivers` (`multipleDriversContext`) | [`multiple_drivers`] | 3: only v1beta1, only v1, both |
//! | `[FeatureGate:DRAPrioritizedList]` | [`prioritized_list`] | 4: sub-requests, their configs, constraints |
//! | `[FeatureGate:DRAConsumableCapacity]` | [`consumable_capacity`] | must allow multiple allocations and consume capacity |
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
mod consumable_capacity;
pub(crate) mod evidence;
pub(crate) mod gates;
mod multiple_drivers;
mod partitionable;
mod prioritized_list;

use harness::framework::{Label, Registry};

use super::FEATURE_DRA;

/// Registers the specs under `[sig-node] [DRA]`.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels(
            "kubelet",
            [Label::new(FEATURE_DRA), Label::gate("DRAPrioritizedList")],
            prioritized_list::register,
        );
        r.context_with_labels(
            "kubelet",
            [Label::new(FEATURE_DRA), Label::gate("DRAConsumableCapacity")],
            consumable_capacity::register,
        );
        r.context_with_labels("kubelet", [FEATURE_DRA], api_versions::register);
        r.context_with_labels(
            "kubelet",
            [Label::new(FEATURE_DRA), Label::gate("DRAPartitionableDevices")],
            partitionable::register,
        );
        r.context_with_labels("kubelet", [FEATURE_DRA], multiple_drivers::register);
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// The full texts as upstream renders them (ginkgo `--dry-run -v` of v1.37.2 dra.go).
    #[test]
    fn full_texts_match_upstream() {
        let texts = crate::specs::registered_texts(register);
        let k = "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation]";
        let p = format!("{k} [FeatureGate:DRAPrioritizedList]");
        let dra = "[FeatureGate:DynamicResourceAllocation]";
        let expected = [
            format!("{p} selects the first subrequest that can be satisfied {dra}"),
            format!("{p} uses the config for the selected subrequest {dra}"),
            format!("{p} chooses the correct subrequest subject to constraints {dra}"),
            format!("{p} filters config correctly for multiple devices {dra}"),
            format!(
                "{k} [FeatureGate:DRAConsumableCapacity] must allow multiple allocations and consume capacity [KubeletMinVersion:1.34] [Beta] {dra}"
            ),
            format!("{k} with v1beta1 API supports simple ResourceClaim"),
            format!(
                "{k} with v1beta1 API supports requests with alternatives [FeatureGate:DRAPrioritizedList] {dra}"
            ),
            format!("{k} with v1beta2 API supports simple ResourceClaim"),
            format!(
                "{k} with v1beta2 API supports requests with alternatives [FeatureGate:DRAPrioritizedList] {dra}"
            ),
            format!(
                "{k} [FeatureGate:DRAPartitionableDevices] must consume and free up counters [Beta] {dra}"
            ),
            format!("{k} with multiple drivers using only drapbv1 [KubeletMinVersion:1.34] work"),
            format!("{k} with multiple drivers using only drapbv1beta1 work"),
            format!("{k} with multiple drivers using drapbv1beta1 and drapbv1 work"),
        ];
        crate::specs::expect_texts(&texts, &expected);
    }
}
