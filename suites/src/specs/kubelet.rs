//! `[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] ...`: the specs of upstream's
//! test/e2e/dra/dra.go (Kubernetes v1.37) in which the test driver registers with the kubelet
//! through the proxy pods and pods really run.
//!
//! Beyond what upstream checks (pod phase, env inside containers), every spec checks what the
//! kubelet did, from the gRPC calls the in-process plugin recorded per node: which
//! `NodePrepareResources` / `NodeUnprepareResources` calls named which claim (by UID), whether
//! they succeeded for it, and in which order. [`harness::builder::Builder::test_pod`] checks for
//! every claim of a running pod that the kubelet prepared it (see
//! [`harness::builder::Builder::expect_prepared`]); the specs add what is specific to them.
//!
//! | upstream context (dra.go) | module | specs |
//! |---|---|---|
//! | `kubelet` with `NetworkResources(10)`, one node | [`network`] | 8 |
//! | `kubelet` with `DriverResources(1)`, 1-4 nodes | [`node_local`] | 5 |
//! | `kubelet` with `ReconcilePoolWithName` (an all-nodes pool, privileged client) | [`reconcile_pool`] | 1 |
//! | `kubelet` with individual driver lifecycles | [`lifecycle`] | 5 (rolling, failed and sequential updates: two instances of one driver) |
//! | `kubelet ... on single node` (`singleNodeTests(true)`) | `control_plane::single_node` | 14 (the extended-resources one `Serial`, with upstream's sample device plugin) |
//! | `kubelet ... on single node with multiple claims allocation` | [`multiple_claims`] | 1 |
//! | `kubelet ... on multiple nodes` (`multiNodeTests(true)`) | `control_plane::multi_node` | 2, need 2 to 8 nodes |
//! | `kubelet [FeatureGate:GenericWorkload] [FeatureGate:DRAWorkloadResourceClaims]`, `DriverResources(1)` | [`pod_groups`] | 2 (workload lane) |
//! | `kubelet [FeatureGate:DRAOptionalNodeOperations]`, `DriverResources(1)` with `skipNodeOperations` | [`optional_node_ops`] | 5 (3 without plugin, 2 with) |
//! | `kubelet [FeatureGate:DRADeviceTaints]`, `NetworkResources(10)`, all devices tainted | [`device_taints`] | 8: `NoSchedule` (3), `NoExecute` (2), the 3 PodGroup ones (workload lane) |
//! | ours: `kubelet per-claim errors`, `NetworkResources(10)`, a pod with two claims | [`per_claim_errors`] | 2: a claim's prepare, a claim's unprepare failed in a successful call |
//!
//! Every spec has its own namespace, driver (`<namespace>.k8s.io`) and DeviceClass, so they run
//! in parallel.

pub(crate) mod checks;
mod device_taints;
mod lifecycle;
mod multiple_claims;
mod network;
mod node_local;
mod optional_node_ops;
mod per_claim_errors;
mod pod_groups;
mod reconcile_pool;

use harness::framework::{Label, Registry};

use super::{
    FEATURE_DRA,
    control_plane::{multi_node, single_node},
};

/// Registers the kubelet specs under `[sig-node] [DRA]`, in upstream's order.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("kubelet", [FEATURE_DRA], network::register);
        r.context_with_labels("kubelet", [FEATURE_DRA], node_local::register);
        r.context_with_labels("kubelet", [FEATURE_DRA], reconcile_pool::register);
        r.context_with_labels("kubelet", [FEATURE_DRA], lifecycle::register);
        r.context_with_labels("kubelet", [FEATURE_DRA], |r| {
            r.context("on single node", single_node::register_kubelet);
        });
        r.context_with_labels("kubelet", [FEATURE_DRA], |r| {
            r.context("on single node with multiple claims allocation", multiple_claims::register);
        });
        r.context_with_labels("kubelet", [FEATURE_DRA], |r| {
            r.context("on multiple nodes", multi_node::register_kubelet);
        });
        let optional_ops =
            std::iter::once(Label::from(FEATURE_DRA)).chain(optional_node_ops::OPTIONAL_NODE_OPS_LABELS);
        r.context_with_labels("kubelet", pod_groups::POD_GROUP_LABELS, pod_groups::register);
        r.context_with_labels("kubelet", optional_ops, optional_node_ops::register);
        let taints = || std::iter::once(Label::from(FEATURE_DRA)).chain(device_taints::DEVICE_TAINTS_LABELS);
        r.context_with_labels("kubelet", taints(), device_taints::register_no_schedule);
        r.context_with_labels("kubelet", taints(), device_taints::register_no_execute);
        r.context_with_labels("kubelet", [FEATURE_DRA], |r| {
            r.context("per-claim errors", per_claim_errors::register);
        });
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// The full texts as upstream renders them (ginkgo `--dry-run -v` of v1.37.2 dra.go).
    #[test]
    fn full_texts_match_upstream() {
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry);
        registry.validate().unwrap();
        let texts: Vec<String> = registry.specs().map(|s| s.full_text().to_owned()).collect();
        let k = "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation]";
        for expected in [
            format!("{k} registers plugin"),
            format!("{k} must retry NodePrepareResources"),
            format!("{k} must not run a pod if a claim is not ready"),
            format!("{k} must unprepare resources for force-deleted pod"),
            format!("{k} must call NodePrepareResources even if not used by any container"),
            format!("{k} must map configs and devices to the right containers"),
            format!("{k} blocks new pod after force-delete [KubeletMinVersion:1.34]"),
            format!("{k} DaemonSet with admin access"),
            format!("{k} must manage ResourceSlices"),
            format!("{k} supports init containers with external claims"),
            format!("{k} removes reservation from claim when pod is done"),
            format!("{k} deletes generated claims when pod is done"),
            format!("{k} does not delete generated claims when pod is restarting"),
            format!("{k} reconciles ResourceSlices with ReconcilePoolWithName"),
            format!("{k} runs pod after driver starts"),
            format!("{k} rolling update [KubeletMinVersion:1.33]"),
            format!("{k} rolling update with long driver name [KubeletMinVersion:1.33]"),
            format!("{k} failed update [KubeletMinVersion:1.33]"),
            format!("{k} sequential update with pods replacing each other [KubeletMinVersion:1.33] [Slow]"),
            format!("{k} on single node supports claim and class parameters"),
            format!("{k} on single node must deallocate after use"),
            format!("{k} on single node supports extended resources together with ResourceClaim [Serial]"),
            format!(
                "{k} on single node with multiple claims allocation requests an already allocated and a new claim for a pod"
            ),
            format!(
                "{k} on multiple nodes with different ResourceSlices keeps pod pending because of CEL runtime errors"
            ),
            format!("{k} on multiple nodes with node-local resources uses all resources"),
        ] {
            assert!(texts.contains(&expected), "missing {expected:?} in {texts:#?}");
        }
        let (gate, taints) = ("[FeatureGate:DRAOptionalNodeOperations]", "[FeatureGate:DRADeviceTaints]");
        let ops = "[Alpha] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation] [FeatureGate:NodeDeclaredFeatures]";
        let (cp, std) =
            ("with control-plane only driver (no node plugin)", "with standard driver (node plugin running)");
        for expected in [
            format!("{k} {gate} {cp} bypasses node preparation when SkipNodeOperations is All {ops}"),
            format!("{k} {gate} {cp} fails node preparation when SkipNodeOperations is not set {ops}"),
            format!("{k} {gate} {cp} fails node preparation when SkipNodeOperations is UnprepareOnly {ops}"),
            format!(
                "{k} {gate} {std} bypasses node preparation and unprepare when SkipNodeOperations is All {ops}"
            ),
            format!(
                "{k} {gate} {std} bypasses node unprepare when SkipNodeOperations is UnprepareOnly {ops}"
            ),
            format!("{k} {taints} NoSchedule keeps pod pending [FeatureGate:DynamicResourceAllocation]"),
            format!("{k} {taints} NoSchedule can be tolerated [FeatureGate:DynamicResourceAllocation]"),
            format!(
                "{k} {taints} DeviceTaintRule evicts pod [FeatureGate:DRADeviceTaintRules] [FeatureGate:DynamicResourceAllocation]"
            ),
            format!("{k} {taints} NoExecute keeps pod pending [FeatureGate:DynamicResourceAllocation]"),
            format!("{k} {taints} NoExecute can be tolerated [FeatureGate:DynamicResourceAllocation]"),
        ] {
            assert!(texts.contains(&expected), "missing {expected:?} in {texts:#?}");
        }
        let (groups, tail) = (
            "[FeatureGate:DRAWorkloadResourceClaims] [FeatureGate:GenericWorkload] [KubeletMinVersion:1.36]",
            "[Beta] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation]",
        );
        let workload =
            "[FeatureGate:GenericWorkload] [FeatureGate:DRAWorkloadResourceClaims] [KubeletMinVersion:1.36]";
        for expected in [
            format!("{k} {workload} allocates devices for PodGroups {tail}"),
            format!("{k} {workload} generates claims from templates for PodGroups {tail}"),
            format!("{k} {taints} {groups} NoSchedule keeps pod with PodGroup claim pending {tail}"),
            format!("{k} {taints} {groups} NoSchedule can be tolerated for PodGroup claims {tail}"),
            format!(
                "{k} {taints} {groups} DeviceTaintRule evicts pod with PodGroup claim [FeatureGate:DRADeviceTaintRules] {tail}"
            ),
        ] {
            assert!(texts.contains(&expected), "missing {expected:?} in {texts:#?}");
        }
        // Ours (declared `ours:` in every suites/upstream/parity-V.txt).
        for expected in [
            format!(
                "{k} per-claim errors must not start a pod before the claim that failed to prepare is prepared"
            ),
            format!(
                "{k} per-claim errors must unprepare a claim again after its unprepare failed while the other claims succeeded"
            ),
        ] {
            assert!(texts.contains(&expected), "missing {expected:?} in {texts:#?}");
        }
        assert_eq!(texts.len(), 8 + 5 + 1 + 5 + 14 + 1 + 2 + 2 + 5 + 8 + 2);
        let serial: Vec<_> =
            registry.specs().filter(|s| s.is_serial()).map(|s| s.name().to_owned()).collect();
        assert_eq!(serial, ["supports extended resources together with ResourceClaim"]);
    }
}
