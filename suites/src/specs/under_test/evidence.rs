//! What shows that the driver under test acted, and what a spec does when nothing can: a check
//! that cannot be made skips, naming `--interpose`, and never passes.
//!
//! - Which CDI devices the driver prepared for a claim: interposed, its `NodePrepareResources`
//!   response; otherwise the kubelet's pod status (`allocatedResourcesStatus`, with
//!   `ResourceHealthStatus` on: the first CDI device ID of each prepared device, or
//!   `<driver>/<pool>/<device>` for a device without one); without it, the IDs that appeared on
//!   the node while the pod started (which may include other pods' devices). With none of them (a driver whose CDI specs are static, or that
//!   writes none, on a kubelet without `allocatedResourcesStatus`) nobody can tell.
//! - Which of those were written for the claim: the ones not defined on the node before its pod
//!   started. Only these must go when the claim is unprepared; a static spec stays.
//! - That the driver unprepared the claim: interposed, its calls. Otherwise the kubelet: it
//!   removes a gracefully deleted pod from the API only once `NodeUnprepareResources` succeeded
//!   for the claims its pod was the last to use (pkg/kubelet: the pod is finished only after
//!   `UnprepareDynamicResources` returned without error). A force-deleted pod is gone at once, so
//!   then only the claim's own CDI devices going away show it.

use std::collections::BTreeSet;

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};

use super::cdi::{CdiDevices, new_ids};

/// How the CDI devices of a claim were learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// The driver's `NodePrepareResources` response, through the interposer.
    Interposer,
    /// The kubelet's pod status (`allocatedResourcesStatus`).
    PodStatus,
    /// The CDI devices that appeared on the node while the pod started.
    Appeared,
    /// Nothing tells them.
    Unknown,
}

/// The CDI devices of a prepared claim, as far as they can be known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The CDI device IDs prepared for the claim (empty with [`IdSource::Unknown`]).
    pub ids: Vec<String>,
    /// Of `ids`, those not defined on the node before the pod started: written for the claim.
    pub per_claim: Vec<String>,
    /// Where `ids` come from.
    pub source: IdSource,
}

impl Prepared {
    /// The IDs the driver returned (`interposed`: its response), else those of the pod `status`,
    /// else those that appeared between `before` and `now`; which of them are per claim.
    pub fn new(
        interposed: Option<Vec<String>>,
        status: Option<Vec<String>>,
        before: &CdiDevices,
        now: &CdiDevices,
    ) -> Self {
        let appeared = new_ids(before, now);
        let (ids, source): (BTreeSet<String>, IdSource) = match (interposed, status) {
            (Some(returned), _) => (returned.into_iter().collect(), IdSource::Interposer),
            // Not with what appeared: other pods on the node (other runs) add CDI files too.
            (None, Some(listed)) => (listed.into_iter().collect(), IdSource::PodStatus),
            (None, None) if !appeared.is_empty() => (appeared, IdSource::Appeared),
            (None, None) => (BTreeSet::new(), IdSource::Unknown),
        };
        let per_claim = ids.iter().filter(|id| !before.contains_key(*id)).cloned().collect();
        Prepared { ids: ids.into_iter().collect(), per_claim, source }
    }

    /// Whether the prepared CDI devices are known.
    pub fn is_known(&self) -> bool {
        self.source != IdSource::Unknown
    }

    /// Why the CDI devices prepared for `claim` are not known, for a skip; `None` when they are.
    pub fn unknown_because(&self, driver: &str, claim: &str, node: &str) -> Option<String> {
        (!self.is_known()).then(|| {
            format!(
                "needs --interpose: which CDI devices driver {driver} prepared for claim {claim} cannot be told otherwise: \
                 none appeared on node {node} while its pod started (its CDI specs are static, or it writes none) and the \
                 kubelet's pod status lists none (allocatedResourcesStatus, with feature gate ResourceHealthStatus); \
                 the pod runs, so the kubelet's NodePrepareResources succeeded"
            )
        })
    }
}

/// The CDI device IDs the kubelet lists in the pod status for pod claim `pod_claim`
/// (`allocatedResourcesStatus[name="claim:<pod claim>"]`, every container): `None` when it lists
/// no entry (the kubelet publishes none without `ResourceHealthStatus`). An entry without `=` is
/// `<driver>/<pool>/<device>`, a device the driver returned no CDI device for.
pub fn pod_status_ids(pod: &Pod, pod_claim: &str) -> Option<Vec<String>> {
    let name = format!("claim:{pod_claim}");
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let entries: Vec<_> = statuses
        .iter()
        .flat_map(|cs| cs.allocated_resources_status.iter().flatten())
        .filter(|rs| rs.name == name)
        .flat_map(|rs| rs.resources.iter().flatten())
        .collect();
    if entries.is_empty() {
        return None;
    }
    Some(entries.iter().map(|h| h.resource_id.clone()).filter(|id| id.contains('=')).collect())
}

/// How a claim's pod went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// With a grace period, waited until the kubelet removed it.
    Graceful,
    /// With grace period 0: gone from the API at once.
    Forced,
}

/// What shows that the driver unprepared a claim, one sentence each; a skip reason (naming
/// `--interpose`) when nothing can. `interposed`: its calls are seen; `per_claim`: the CDI
/// devices written for the claim; `skips_unprepare`: the allocation skips
/// `NodeUnprepareResources`, so the kubelet does not call it.
pub fn unprepare_evidence(
    interposed: bool,
    deletion: Deletion,
    per_claim: &[String],
    skips_unprepare: bool,
) -> Result<Vec<String>, String> {
    if skips_unprepare {
        return Err(
            "the claim's allocation skips NodeUnprepareResources (skipNodeOperations in the driver's \
                    ResourceSlices), so the kubelet does not call it and there is nothing to check"
                .to_owned(),
        );
    }
    let mut evidence = Vec::new();
    if interposed {
        evidence.push("the driver's NodeUnprepareResources calls, through the interposer".to_owned());
    }
    if deletion == Deletion::Graceful {
        evidence.push(
            "the kubelet removed the gracefully deleted pod, which it does only once NodeUnprepareResources succeeded"
                .to_owned(),
        );
    }
    if !per_claim.is_empty() {
        evidence.push(format!("the CDI devices written for the claim ({}) are gone", per_claim.join(", ")));
    }
    if evidence.is_empty() {
        return Err("needs --interpose: the pod was force-deleted, so its deletion does not wait for the kubelet's \
                    NodeUnprepareResources, and no CDI device was written for the claim (the driver's CDI specs are \
                    static, or it writes none), so nothing on the node shows the unprepare"
            .to_owned());
    }
    Ok(evidence)
}

/// What shows that a claim stays prepared while a pod still uses it; a skip reason (naming
/// `--interpose`) when nothing can.
pub fn still_prepared_evidence(interposed: bool, per_claim: &[String]) -> Result<String, String> {
    match (interposed, per_claim.is_empty()) {
        (true, _) => Ok("no NodeUnprepareResources call, through the interposer".to_owned()),
        (false, false) => Ok(format!("the CDI devices written for the claim ({}) are still defined", per_claim.join(", "))),
        (false, true) => Err("needs --interpose: no CDI device was written for the claim (the driver's CDI specs are \
                              static, or it writes none), so nothing on the node shows whether it stayed prepared \
                              after its first pod was gone"
            .to_owned()),
    }
}

/// Whether the claim's allocation skips `operation` for a device (`skipNodeOperations`).
pub fn skips(claim: &ResourceClaim, operation: &str) -> bool {
    harness::builder::allocation_results(claim)
        .iter()
        .any(|r| r.skip_node_operations.iter().flatten().any(|s| s == operation || s == "*"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::specs::under_test::cdi::CdiDevice;

    fn devices(ids: &[&str]) -> CdiDevices {
        ids.iter().map(|id| ((*id).to_owned(), CdiDevice { file: "f".into(), env: vec![] })).collect()
    }

    const STATIC: &str = "example.dra-e2e.test/device=device-00";
    const CLAIM: &str = "example.dra-e2e.test/test=claim-uid-device";

    #[test]
    fn the_prepared_ids_come_from_what_can_be_seen_and_only_new_ones_are_per_claim() {
        let static_only = devices(&[STATIC, "other/x=y"]);
        let with_claim = devices(&[STATIC, "other/x=y", CLAIM]);
        // Interposed: the response, whatever appeared.
        let p = Prepared::new(Some(vec![STATIC.into()]), None, &static_only, &static_only);
        assert_eq!(
            (p.ids.clone(), p.per_claim.clone(), p.source),
            (vec![STATIC.to_owned()], vec![], IdSource::Interposer)
        );
        // The pod status names a static device: known, nothing per claim, and another pod's
        // device that appeared meanwhile is not taken for the claim's.
        let p = Prepared::new(None, Some(vec![STATIC.into()]), &static_only, &with_claim);
        assert_eq!(
            (p.ids.clone(), p.per_claim.is_empty(), p.source),
            (vec![STATIC.to_owned()], true, IdSource::PodStatus)
        );
        // A per-claim device appeared.
        let p = Prepared::new(None, None, &static_only, &with_claim);
        assert_eq!(
            (p.ids.clone(), p.per_claim.clone(), p.source),
            (vec![CLAIM.to_owned()], vec![CLAIM.to_owned()], IdSource::Appeared)
        );
        assert_eq!(p.unknown_because("d", "c", "n"), None);
        // Static specs, no pod status, no interposer: unknown, and a skip that names --interpose.
        let p = Prepared::new(None, None, &static_only, &static_only);
        assert_eq!(p.source, IdSource::Unknown);
        assert!(p.unknown_because("d", "c", "n").unwrap().starts_with("needs --interpose"));
    }

    /// The loophole of issue 47: a force-deleted pod of a driver with static CDI specs, not
    /// interposed, passed with nothing checked; now it skips naming `--interpose`.
    #[test]
    fn a_forced_deletion_without_interposer_or_per_claim_devices_skips() {
        let skip = unprepare_evidence(false, Deletion::Forced, &[], false).unwrap_err();
        assert!(skip.starts_with("needs --interpose"), "{skip}");
        assert_eq!(unprepare_evidence(true, Deletion::Forced, &[], false).unwrap().len(), 1);
        let cdi = unprepare_evidence(false, Deletion::Forced, &[CLAIM.to_owned()], false).unwrap();
        assert!(cdi[0].contains(CLAIM), "{cdi:?}");
        let graceful = unprepare_evidence(false, Deletion::Graceful, &[], false).unwrap();
        assert!(graceful[0].contains("gracefully deleted pod"), "{graceful:?}");
        let skipped = unprepare_evidence(true, Deletion::Graceful, &[CLAIM.to_owned()], true).unwrap_err();
        assert!(skipped.contains("skips NodeUnprepareResources"), "{skipped}");
    }

    #[test]
    fn staying_prepared_needs_the_interposer_or_per_claim_devices() {
        assert!(still_prepared_evidence(true, &[]).is_ok());
        assert!(still_prepared_evidence(false, &[CLAIM.to_owned()]).unwrap().contains(CLAIM));
        assert!(still_prepared_evidence(false, &[]).unwrap_err().starts_with("needs --interpose"));
    }

    #[test]
    fn the_pod_status_lists_cdi_ids_of_its_claim_only() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "status": { "containerStatuses": [{
                "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [
                    { "name": "claim:device", "resources": [
                        { "resourceID": STATIC, "health": "Unknown" },
                        { "resourceID": "example.dra-e2e.test/pool/device-01", "health": "Unknown" },
                    ] },
                    { "name": "claim:other", "resources": [{ "resourceID": "x/y=z", "health": "Unknown" }] },
                ],
            }] },
        }))
        .unwrap();
        assert_eq!(pod_status_ids(&pod, "device"), Some(vec![STATIC.to_owned()]));
        assert_eq!(pod_status_ids(&pod, "none"), None);
    }
}
