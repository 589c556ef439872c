//! `[sig-node] DRA Node Allocatable Resources ...`: upstream's
//! test/e2e/common/node/dra_node_allocatable_resources.go (Kubernetes v1.37; from v1.38 in
//! test/e2e/dra as `[sig-node] [DRA] Node Allocatable Resources ...`). A driver publishes
//! devices whose `nodeAllocatableResources` map to CPU, memory or hugepages (per device, or as
//! per-pod and per-container overhead); a pod with claims on them runs, and the kubelet must
//! inflate the pod's and the containers' cgroups and the containers' OOM score adjustment by
//! what the claims bring. Five specs then resize the running pod in place (container or pod
//! level) and check the cgroups and the pod status again.
//!
//! As upstream: 1 to 4 nodes with the driver, the devices on the first; one external claim per
//! pod claim; pod `tester-1` whose first container mounts the node's `/sys/fs/cgroup`; cgroup
//! values read through exec (the pod's cgroup found by its UID), with upstream's expected
//! values (the tables in [`cases`]). Beyond upstream: the kubelet's recorded calls must show
//! every claim of the pod prepared with its allocated devices before the pod runs, a resize
//! must neither prepare nor unprepare anything, and every claim must be unprepared once the pod
//! is gone; containers that use claims must see the claims' CDI environment, and the pod status
//! (`nodeAllocatableResourceClaimStatuses`) must name the containers using each claim.
//!
//! What these machines cannot do is a skip with the reason, never a weaker check, decided before
//! anything is deployed where the nodes' allocatable CPU and hugepages tell ([`fits`]): pods whose
//! CPU or memory (with what the claims add) no node can fit (nodes with 2 CPUs, as the local
//! cluster's with `--node-cpus 0`: upstream's own specs never get their pods scheduled there; a
//! pod is only skipped so when no other pod on the node requests CPU or memory), resizes the API server refuses because the node cannot
//! fit them, a resize whose CFS quota the node's cgroup v1 hierarchy refuses (the kubelet then
//! retries forever), and nodes without `hugepages-2Mi` (as upstream skips).

mod cases;
pub(crate) mod cgroups;
mod fits;
mod run;

use harness::framework::{Label, Registry};

use cases::{cgroup_cases, resize_cases};

/// Upstream's `feature.DynamicResourceAllocation`.
const FEATURE: Label = Label::new("Feature:DynamicResourceAllocation");
/// `framework.WithFeatureGate(features.DRANodeAllocatableResources)`.
const ALLOCATABLE_GATE: Label = Label::gate("DRANodeAllocatableResources");
/// `framework.WithFeatureGate(features.InPlacePodLevelResourcesVerticalScaling)`.
const RESIZE_GATE: Label = Label::gate("InPlacePodLevelResourcesVerticalScaling");

/// Registers the Node Allocatable Resources specs, in upstream's order and structure: up to
/// v1.37 `[sig-node] DRA Node Allocatable Resources`, `[Serial]`, both gates on the `Describe`
/// (test/e2e/common/node); from v1.38 `[sig-node] [DRA] Node Allocatable Resources` in
/// test/e2e/dra, not serial, the resize specs in a `resize` context with the resize gate.
pub fn register(registry: &mut Registry) {
    if registry.targets_at_least(1, 38) {
        registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
            r.context_with_labels("Node Allocatable Resources", [FEATURE, ALLOCATABLE_GATE], |r| {
                register_cgroup_specs(r);
                r.context_with_labels("resize", [RESIZE_GATE], register_resize_specs);
            });
        });
    } else {
        let labels = [FEATURE, ALLOCATABLE_GATE, RESIZE_GATE, Label::trailing("Serial")];
        registry.describe("[sig-node]", |r| {
            r.context_with_labels("DRA Node Allocatable Resources", labels, |r| {
                register_cgroup_specs(r);
                register_resize_specs(r);
            });
        });
    }
}

/// Why these specs run alone at every release (`[Serial]` up to v1.37, not from v1.38): each asks
/// for most of a node's allocatable CPU and memory, which other specs' pods would hold, and the
/// scheduler would refuse it ("Insufficient cpu") where it should wait.
const NEEDS_THE_NODE: &str =
    "most of a node's allocatable CPU and memory, which other specs' pods would hold";

fn register_cgroup_specs(r: &mut Registry) {
    for case in cgroup_cases() {
        let name = format!("verifies cgroup inflation and container OOM adjustment with {}", case.name);
        let needs = case.clone();
        r.it(&name, move |ctx| run::cgroup_spec(ctx, case.clone()))
            .requires(move |pre| fits::cgroup_case_fits(pre, needs.clone()))
            .runs_alone(NEEDS_THE_NODE);
    }
}

fn register_resize_specs(r: &mut Registry) {
    for case in resize_cases() {
        let name = format!("verifies cgroup settings and pod status after resize with {}", case.name);
        let needs = case.clone();
        r.it(&name, move |ctx| run::resize_spec(ctx, case.clone()))
            .requires(move |pre| fits::resize_case_fits(pre, needs.clone()))
            .runs_alone(NEEDS_THE_NODE);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// The full texts as upstream renders them (ginkgo `--dry-run -v` of v1.37.2).
    #[test]
    fn full_texts_match_upstream() {
        let texts = crate::specs::registered_texts(register);
        assert_eq!(texts.len(), cgroup_cases().len() + resize_cases().len());
        let head = "[sig-node] DRA Node Allocatable Resources [Feature:DynamicResourceAllocation] \
                    [FeatureGate:DRANodeAllocatableResources] [FeatureGate:InPlacePodLevelResourcesVerticalScaling]";
        let tail = "[Alpha] [Beta] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation] \
                    [FeatureGate:InPlacePodVerticalScaling] [FeatureGate:NodeDeclaredFeatures] \
                    [FeatureGate:PodLevelResources] [Serial]";
        for name in [
            "verifies cgroup inflation and container OOM adjustment with direct mappings",
            "verifies cgroup inflation and container OOM adjustment with container-level CPU/Memory limits omitted (Burstable)",
            "verifies cgroup inflation and container OOM adjustment with direct mapping multiple claims",
            "verifies cgroup settings and pod status after resize with Pod level resize, container level request/limit present",
            "verifies cgroup settings and pod status after resize with direct mappings with resize",
        ] {
            let want = format!("{head} {name} {tail}");
            assert!(texts.contains(&want), "missing {want}\nhave {texts:#?}");
        }
    }
}
