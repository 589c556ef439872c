//! j: several claims in one pod and several devices in one claim. One pod, two containers:
//! `first` uses a claim for one device, `second` a claim for two devices (one request, count 2),
//! so the node needs three devices of the driver (fewer: skipped before anything is created).
//!
//! Both claims are allocated devices of the driver only, three distinct devices; each claim's
//! CDI devices are its own (none shared with the other claim); interposed, each claim is prepared
//! once and the answer lists every allocated device of the claim; each container has the env of
//! its own claim's CDI devices and none of the env only the other claim's devices set.
//!
//! The CDI devices of each claim are known interposed (its NodePrepareResources answer) or from
//! the kubelet's pod status (`allocatedResourcesStatus`, per pod claim); the IDs that appeared on
//! the node cannot be told apart by claim, so without either the spec skips naming `--interpose`.
//! The two devices of one claim need not have different CDI devices: upstream's test driver gives
//! every device of a request the same one (`claim-<uid>-<request>`).

use std::{collections::BTreeSet, sync::Arc};

use harness::framework::{ClusterAccess, Ctx, Skip, SpecError, SpecResult, step};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt as _;

use super::{
    Target,
    cdi::CdiDevices,
    checks::{claim_calls, expect_allocated_for, expect_cdi_in, prepared_as},
    evidence::{IdSource, Prepared},
    session::{Session, allocated_devices, node_devices, served_nodes},
};

/// The containers (and pod claims) and how many devices each one's claim asks for.
const USES: [(&str, u32); 2] = [("first", 1), ("second", 2)];

/// How many devices of the driver the node under test needs.
fn needed() -> usize {
    USES.iter().map(|(_, count)| *count as usize).sum()
}

/// Skips unless the node under test has [`needed`] devices of the driver.
pub async fn require_devices(from: &impl ClusterAccess, target: &Target) -> SpecResult {
    let nodes = served_nodes(from, &target.driver).await?;
    let Some(node) = nodes.first() else { return Ok(()) };
    let offered = node_devices(from, &target.driver, node).await?;
    if offered.len() < needed() {
        return Err(SpecError::skip(format!(
            "needs {} devices of driver {} on node {node}, its ResourceSlices offer {}",
            needed(),
            target.driver,
            offered.len()
        )));
    }
    Ok(())
}

/// One claim of the pod: its container, the claim and its CDI devices.
struct Use {
    container: &'static str,
    claim: ResourceClaim,
    prepared: Prepared,
}

/// j: see the module documentation.
pub async fn several(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let mut claims = Vec::new();
    for (container, count) in USES {
        claims.push((container, s.create_claim_for(count).await?.name_any()));
    }
    let before = s.cdi.devices().await?;
    let names: Vec<(&str, &str)> = claims.iter().map(|(c, n)| (*c, n.as_str())).collect();
    let pod = s.create_pod_with_claims(&names).await?;
    let pod = s.wait_running(&pod).await?;
    let now = s.cdi.devices().await?;

    let mut uses = Vec::new();
    let mut devices = BTreeSet::new();
    for ((container, name), (_, count)) in claims.iter().zip(USES) {
        let claim = s.claim(name).await?;
        expect_allocated_for(&s, &claim, &pod)?;
        let allocated = allocated_devices(&claim);
        expect!(
            allocated.len() == count as usize,
            "claim {name} asks for {count} device(s) and got {allocated:?}"
        );
        devices.extend(allocated);
        let uid = claim.uid().unwrap_or_default();
        let prepared = prepared_as(&s, &uid, &pod, container, &before, &now)?;
        if !matches!(prepared.source, IdSource::Interposer | IdSource::PodStatus) {
            return Err(Skip::because(format!(
                "needs --interpose: which CDI devices driver {} prepared for each claim of pod {} cannot be told \
                 otherwise: the kubelet's pod status lists none (allocatedResourcesStatus, with feature gate \
                 ResourceHealthStatus) and the IDs that appeared on node {} do not say whose they are",
                target.driver,
                pod.name_any(),
                s.node
            )));
        }
        expect_every_device_answered(&s, &claim, &uid)?;
        uses.push(Use { container, claim, prepared });
    }
    expect!(devices.len() == needed(), "the claims of pod {} share devices: {devices:?}", pod.name_any());
    let [one, two] = &uses[..] else { fail!("internal error: {} claims, not 2", uses.len()) };
    let shared: Vec<&String> = one.prepared.ids.iter().filter(|id| two.prepared.ids.contains(id)).collect();
    expect!(
        shared.is_empty(),
        "claims {} and {} of pod {} got the same CDI devices {shared:?}{}",
        one.claim.name_any(),
        two.claim.name_any(),
        pod.name_any(),
        s.call_log()
    );
    for (own, other) in [(one, two), (two, one)] {
        let env = expect_cdi_in(&s, &pod, own.container, &own.prepared.ids, &now).await?;
        let foreign = foreign_env(&now, &own.prepared.ids, &other.prepared.ids);
        let leaked: Vec<&String> = foreign
            .iter()
            .filter(|edit| edit.split_once('=').is_some_and(|(k, v)| env.get(k).is_some_and(|x| x == v)))
            .collect();
        expect!(
            leaked.is_empty(),
            "container {} of pod {} has the env {leaked:?} of the CDI devices of claim {} (of container {})",
            own.container,
            pod.name_any(),
            other.claim.name_any(),
            other.container
        );
    }
    step(format!(
        "claims {} (1 device) and {} (2 devices) got their own CDI devices ({:?}, {:?}), each in its own container",
        one.claim.name_any(),
        two.claim.name_any(),
        one.prepared.ids,
        two.prepared.ids
    ));
    Ok(())
}

/// Interposed: the claim's successful NodePrepareResources answered every allocated device.
fn expect_every_device_answered(s: &Session, claim: &ResourceClaim, uid: &str) -> SpecResult {
    let Some(history) = claim_calls(s, uid) else { return Ok(()) };
    let answered: BTreeSet<(String, String)> = history
        .first_prepared()
        .map(|c| c.devices.iter().map(|(pool, device, _)| (pool.clone(), device.clone())).collect())
        .unwrap_or_default();
    let missing: Vec<(String, String)> = allocated_devices(claim)
        .into_iter()
        .map(|(_, pool, device)| (pool, device))
        .filter(|d| !answered.contains(d))
        .collect();
    expect!(
        missing.is_empty(),
        "the driver's NodePrepareResources answer for claim {} lists no entry for its allocated devices {missing:?}:\n{history}{}",
        claim.name_any(),
        s.call_log()
    );
    Ok(())
}

/// The env edits (`KEY=value`) of the CDI devices `other` that none of `own` sets.
fn foreign_env(devices: &CdiDevices, own: &[String], other: &[String]) -> Vec<String> {
    let edits = |ids: &[String]| -> BTreeSet<String> {
        ids.iter().filter_map(|id| devices.get(id)).flat_map(|d| d.env.iter().cloned()).collect()
    };
    let mine = edits(own);
    edits(other).into_iter().filter(|edit| !mine.contains(edit)).collect()
}

#[cfg(test)]
mod tests {
    use super::{super::cdi::CdiDevice, *};

    #[test]
    fn foreign_env_is_what_only_the_other_claims_devices_set() {
        let device =
            |env: &[&str]| CdiDevice { file: "f".into(), env: env.iter().map(|e| (*e).to_owned()).collect() };
        let devices: CdiDevices = [
            ("k/test=a".to_owned(), device(&["claim_a=true", "SHARED=1"])),
            ("k/test=b".to_owned(), device(&["claim_b=true", "SHARED=1"])),
        ]
        .into();
        let (a, b) = (["k/test=a".to_owned()], ["k/test=b".to_owned()]);
        assert_eq!(foreign_env(&devices, &a, &b), ["claim_b=true"]);
        assert_eq!(foreign_env(&devices, &b, &a), ["claim_a=true"]);
        assert!(foreign_env(&devices, &a, &[]).is_empty());
        assert_eq!(needed(), 3);
    }
}
