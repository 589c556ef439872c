//! The bugs `cargo xtask mutants` puts into Kubernetes, one at a time: each a small textual change
//! of the DRA code of the kubelet (its DRA manager), the scheduler (its DRA plugin) or the
//! resourceclaim controller, written against the sources of the pinned release (v1.37.2). A
//! mutant whose original text a checkout does not hold exactly once is refused before anything
//! is built.

/// Which selection of the suites a mutant is checked with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    /// The kubelet suites (`--focus kubelet --skip GenericWorkload`).
    Kubelet,
    /// Everything outside the kubelet contexts (`--skip kubelet --skip GenericWorkload`).
    ControlPlane,
}

impl Lane {
    /// The lane's dra-e2e selection flags.
    pub fn selection(self) -> &'static [&'static str] {
        match self {
            Self::Kubelet => &["--focus", "kubelet", "--skip", "GenericWorkload"],
            Self::ControlPlane => &["--skip", "kubelet", "--skip", "GenericWorkload"],
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kubelet => "kubelet",
            Self::ControlPlane => "control plane",
        }
    }
}

/// One bug: where it goes and what it changes.
#[derive(Debug, Clone, Copy)]
pub struct Mutant {
    /// Its name (`--only NAME`).
    pub name: &'static str,
    /// The component it breaks.
    pub component: &'static str,
    /// The file, relative to the checkout.
    pub file: &'static str,
    /// The text it replaces (exactly once in the file).
    pub original: &'static str,
    /// What it puts there.
    pub mutated: &'static str,
    /// What the broken component then does, in one sentence.
    pub bug: &'static str,
    /// The lane that should catch it.
    pub lane: Lane,
}

const KUBELET_MANAGER: &str = "pkg/kubelet/cm/dra/manager.go";
const KUBELET_CLAIM_INFO: &str = "pkg/kubelet/cm/dra/claiminfo.go";
const CLAIM_CONTROLLER: &str = "pkg/controller/resourceclaim/controller.go";
const SCHEDULER_PLUGIN: &str = "pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go";

/// Every mutant, in the order they run.
pub const MUTANTS: &[Mutant] = &[
    Mutant {
        name: "kubelet-unprepares-shared-claim-early",
        component: "kubelet DRA manager",
        file: KUBELET_MANAGER,
        original: "if len(claimInfo.PodUIDs) > 1 {",
        mutated: "if len(claimInfo.PodUIDs) > 2 {",
        bug: "a claim that two pods use is unprepared when the first of them goes, while the other still runs",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "kubelet-prepares-prepared-claim-again",
        component: "kubelet DRA manager",
        file: KUBELET_MANAGER,
        original: "if claimInfo.isPrepared() {",
        mutated: "if claimInfo.isPrepared() && false {",
        bug: "a claim that is already prepared is prepared again for every further pod that uses it",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "kubelet-never-unprepares",
        component: "kubelet DRA manager",
        file: KUBELET_MANAGER,
        original: "batches[driverName] = append(batches[driverName], claim)",
        mutated: "_ = claim",
        bug: "NodeUnprepareResources is never called: the claim is forgotten when its last pod goes",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "kubelet-ignores-reserved-for",
        component: "kubelet DRA manager",
        file: KUBELET_MANAGER,
        original: "if !resourceclaim.IsReservedForPod(pod, resourceClaim, m.podGroupResourceClaimsEnabled()) {",
        mutated: "if false && !resourceclaim.IsReservedForPod(pod, resourceClaim, m.podGroupResourceClaimsEnabled()) {",
        bug: "a pod runs with a claim that is not reserved for it",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "kubelet-drops-cdi-devices",
        component: "kubelet DRA manager",
        file: KUBELET_CLAIM_INFO,
        original: "cdiDevices = append(cdiDevices, kubecontainer.CDIDevice{Name: cdiDeviceID})",
        mutated: "_ = cdiDeviceID",
        bug: "the CDI devices a driver returned never reach the container runtime",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "controller-keeps-reservations",
        component: "resourceclaim controller",
        file: CLAIM_CONTROLLER,
        original: "if len(remaining) < len(claim.Status.ReservedFor) {",
        mutated: "if false && len(remaining) < len(claim.Status.ReservedFor) {",
        bug: "a claim stays reserved for (and allocated to) pods that are done or gone",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "controller-keeps-claims-of-done-pods",
        component: "resourceclaim controller",
        file: CLAIM_CONTROLLER,
        original: "if pod.UID != podUID || isPodDone(pod) {",
        mutated: "if pod.UID != podUID {",
        bug: "a claim generated for a pod that is done is not deleted until the pod is",
        lane: Lane::Kubelet,
    },
    Mutant {
        name: "scheduler-ignores-allocation-node-selector",
        component: "scheduler DRA plugin",
        file: SCHEDULER_PLUGIN,
        original: "nodeSelector != nil && !nodeSelector.Match(node) {",
        mutated: "nodeSelector != nil && false {",
        bug: "a pod whose claim is already allocated may be scheduled to a node the allocation does not reach",
        lane: Lane::ControlPlane,
    },
];

/// The mutants named in `only` (all when empty); an unknown name is an error naming the known ones.
pub fn select(only: &[String]) -> Result<Vec<Mutant>, String> {
    if only.is_empty() {
        return Ok(MUTANTS.to_vec());
    }
    only.iter()
        .map(|name| {
            MUTANTS.iter().find(|m| m.name == name).copied().ok_or_else(|| {
                let known: Vec<&str> = MUTANTS.iter().map(|m| m.name).collect();
                format!("no mutant is called {name:?}; the mutants are: {}", known.join(", "))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_mutant_changes_its_text() {
        let mut names: Vec<&str> = MUTANTS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MUTANTS.len());
        assert!(MUTANTS.iter().all(|m| m.original != m.mutated && !m.original.is_empty()));
    }

    #[test]
    fn only_selects_by_name_and_refuses_unknown_names() {
        assert_eq!(select(&[]).unwrap().len(), MUTANTS.len());
        let one = select(&["kubelet-never-unprepares".to_owned()]).unwrap();
        assert_eq!(one.len(), 1);
        let err = select(&["nope".to_owned()]).unwrap_err();
        assert!(err.contains("\"nope\"") && err.contains("kubelet-never-unprepares"), "{err}");
    }
}
