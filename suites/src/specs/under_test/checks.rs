//! The checks the pod specs share: the devices a claim got, the CDI devices the driver prepared
//! for it ([`Prepared`]) and their env in the container, and that unprepare happened
//! (interposed: once) and removed the CDI devices written for the claim.

use std::{collections::BTreeMap, time::Duration};

use harness::{
    builder::parse_env,
    calls::{Calls, ClaimCalls, UNPREPARE_TIMEOUT},
    framework::step,
    wait::{self, Attempt},
};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::ResourceExt as _;

use super::{
    cdi::{CdiDevices, still_defined},
    evidence::{Prepared, pod_status_ids},
    session::{CONTAINER, POD_CLAIM, Session, allocated_devices, allocated_ids, reserved_for},
};

/// How often the node's CDI files are read while waiting.
const READ_EVERY: Duration = Duration::from_secs(2);

/// Interposed, how long the CDI devices may still be defined after the driver answered
/// NodeUnprepareResources OK: it is done by then, so this only covers reading the node's files
/// (several reads). Not interposed the wait is also for the kubelet's unprepare, which the spec
/// cannot see: [`UNPREPARE_TIMEOUT`].
const REMOVED_AFTER_ANSWER: Duration = Duration::from_secs(10);

/// The claim is allocated devices of the driver only, and reserved for `pod`.
pub fn expect_allocated_for(session: &Session, claim: &ResourceClaim, pod: &Pod) -> anyhow::Result<()> {
    let devices = allocated_devices(claim);
    let driver = &session.target.driver;
    anyhow::ensure!(
        !devices.is_empty(),
        "claim {} of pod {} has no allocated device",
        claim.name_any(),
        pod.name_any()
    );
    let foreign: Vec<_> = devices.iter().filter(|(d, _, _)| d != driver).collect();
    anyhow::ensure!(
        foreign.is_empty(),
        "claim {} got devices of other drivers than {driver}: {foreign:?}",
        claim.name_any()
    );
    let reserved = reserved_for(claim);
    anyhow::ensure!(
        reserved.contains(&pod.name_any()),
        "claim {} is reserved for {reserved:?}, not for pod {}",
        claim.name_any(),
        pod.name_any()
    );
    Ok(())
}

/// The claim's calls so far, when interposed.
pub fn claim_calls(session: &Session, uid: &str) -> Option<ClaimCalls> {
    session.calls().map(|calls| calls.claim(uid))
}

/// The CDI devices prepared for the claim of `pod` (running): interposed, those of its one
/// successful `NodePrepareResources` (which must be its only prepare call); otherwise those the
/// kubelet lists in the pod status and those the node's CDI files define `now` and did not
/// `before` (see [`evidence`](super::evidence)).
pub fn prepared(
    session: &Session,
    uid: &str,
    pod: &Pod,
    before: &CdiDevices,
    now: &CdiDevices,
) -> anyhow::Result<Prepared> {
    prepared_as(session, uid, pod, POD_CLAIM, before, now)
}

/// [`prepared`] for the claim the pod names `pod_claim`.
pub fn prepared_as(
    session: &Session,
    uid: &str,
    pod: &Pod,
    pod_claim: &str,
    before: &CdiDevices,
    now: &CdiDevices,
) -> anyhow::Result<Prepared> {
    let Some(history) = claim_calls(session, uid) else {
        return Ok(Prepared::new(None, pod_status_ids(pod, pod_claim), before, now));
    };
    if history.prepared() != 1
        || history.prepare_failures() != 0
        || history.calls.iter().filter(|c| c.prepare).count() != 1
    {
        anyhow::bail!(
            "claim UID {uid}: expected exactly one NodePrepareResources, successful, got {} successful and {} failed:\n{history}{}",
            history.prepared(),
            history.prepare_failures(),
            session.call_log()
        );
    }
    let returned = history.first_prepared().map(|c| c.devices.clone()).unwrap_or_default();
    Ok(Prepared::new(Some(returned.into_iter().flat_map(|(_, _, ids)| ids).collect()), None, before, now))
}

/// Every ID is defined by a CDI spec file on the node, and the container's `env` has each env
/// edit of those devices.
pub async fn expect_cdi_visible(
    session: &Session,
    pod: &Pod,
    ids: &[String],
    now: &CdiDevices,
) -> anyhow::Result<()> {
    expect_cdi_in(session, pod, CONTAINER, ids, now).await.map(|_| ())
}

/// [`expect_cdi_visible`] for `container`; returns its env.
pub async fn expect_cdi_in(
    session: &Session,
    pod: &Pod,
    container: &str,
    ids: &[String],
    now: &CdiDevices,
) -> anyhow::Result<BTreeMap<String, String>> {
    let missing: Vec<&String> = ids.iter().filter(|id| !now.contains_key(*id)).collect();
    anyhow::ensure!(
        missing.is_empty(),
        "the CDI devices {missing:?} prepared for pod {} are defined in no CDI spec file of node {} (/etc/cdi, /var/run/cdi); defined: {:?}{}",
        pod.name_any(),
        session.node,
        now.keys().collect::<Vec<_>>(),
        session.call_log()
    );
    let env_output = session.container_env(pod, container).await?;
    let env = parse_env(&env_output);
    for id in ids {
        let Some(device) = now.get(id) else { continue };
        for edit in &device.env {
            let (key, value) = edit.split_once('=').unwrap_or((edit.as_str(), ""));
            anyhow::ensure!(
                env.get(key).map(String::as_str) == Some(value),
                "the env edit {edit} of CDI device {id} ({}) is not in the env of container {container} of pod {}:\n{env_output}",
                device.file,
                pod.name_any()
            );
        }
    }
    if ids.is_empty() {
        step("no CDI device was prepared for the claim: nothing to check in the container");
    } else {
        step(format!(
            "the CDI devices {ids:?} are defined on node {} and their env is in container {container}",
            session.node
        ));
    }
    Ok(env)
}

/// Interposed: the claim was unprepared exactly once, successfully (waits for it).
pub async fn expect_unprepared_once(session: &Session, calls: &Calls, uid: &str) -> anyhow::Result<()> {
    let history = calls.wait_unprepared(uid, UNPREPARE_TIMEOUT).await?;
    if history.unprepared() != 1 || history.unprepare_failures() != 0 {
        anyhow::bail!(
            "claim UID {uid}: expected exactly one NodeUnprepareResources, successful, got {} successful and {} failed:\n{history}{}",
            history.unprepared(),
            history.unprepare_failures(),
            session.call_log()
        );
    }
    Ok(())
}

/// Interposed: claim `gone` (UID) was unprepared before claim `new` was first prepared; the
/// names are for the message. Nothing to check without the interposer.
pub fn expect_unprepared_before(
    session: &Session,
    gone: (&str, &str),
    new: (&str, &str),
) -> anyhow::Result<()> {
    let Some(calls) = session.calls() else { return Ok(()) };
    let log = calls.log();
    let (old, fresh) = (log.claim(gone.1), log.claim(new.1));
    let unprepared = old.last_unprepared().map(|c| c.id);
    let prepared = fresh.calls.iter().find(|c| c.prepare).map(|c| c.id);
    anyhow::ensure!(
        unprepared.is_some() && prepared.is_some() && unprepared < prepared,
        "claim {} must be unprepared before claim {} is prepared: {old}\n{fresh}{}",
        gone.0,
        new.0,
        session.call_log()
    );
    Ok(())
}

/// Creates a pod of claim `claim` on the node under test and checks that the scheduler cannot
/// place it: the pod is reported unschedulable, the claim stays unallocated and, interposed, the
/// driver is never called for it. `because` says why it must not be allocated, for the failure.
/// Returns the pod and the scheduler's message.
pub async fn expect_pending(session: &Session, claim: &str, because: &str) -> anyhow::Result<(Pod, String)> {
    let pod = session.create_pod(claim, false).await?;
    let why = session.wait_unschedulable(&pod).await?;
    let stored = session.claim(claim).await?;
    anyhow::ensure!(
        allocated_devices(&stored).is_empty(),
        "claim {claim} got {:?} although {because}",
        allocated_ids(&stored)
    );
    if let Some(history) = claim_calls(session, &stored.uid().unwrap_or_default()) {
        anyhow::ensure!(
            history.calls.is_empty(),
            "the driver was called for claim {claim}, which is not allocated:\n{history}{}",
            session.call_log()
        );
    }
    Ok((pod, why))
}

/// Interposed: no unprepare named the claim so far.
pub fn expect_not_unprepared(session: &Session, calls: &Calls, uid: &str, why: &str) -> anyhow::Result<()> {
    let history = calls.claim(uid);
    let unprepares = history.calls.iter().filter(|c| !c.prepare).count();
    anyhow::ensure!(
        unprepares == 0,
        "claim UID {uid} was unprepared {why}:\n{history}{}",
        session.call_log()
    );
    Ok(())
}

/// Waits until none of `per_claim` (the CDI devices written for the claim) is defined on the
/// node any more; fails naming them and their files. Interposed, call it once
/// [`expect_unprepared_once`] saw the driver's answer: the files may then outlive it by
/// [`REMOVED_AFTER_ANSWER`] at most.
pub async fn expect_cdi_removed(session: &Session, per_claim: &[String]) -> anyhow::Result<()> {
    if per_claim.is_empty() {
        // Nothing was written for the claim; what shows the unprepare is decided by the caller
        // (evidence::unprepare_evidence).
        return Ok(());
    }
    let ids = per_claim;
    let what = format!("the CDI devices {ids:?} to be no longer defined on node {}", session.node);
    // Interposed, the unprepare was seen to succeed: the driver said it was done.
    let answered = session.calls().is_some();
    let timeout = if answered { REMOVED_AFTER_ANSWER } else { UNPREPARE_TIMEOUT };
    let result = wait::poll(what, timeout, READ_EVERY, || async {
        match session.cdi.devices().await {
            Ok(devices) => {
                let left = still_defined(&devices, ids);
                if left.is_empty() { Attempt::Done(()) } else { Attempt::Retry(left.join(", ")) }
            }
            Err(e) => Attempt::Retry(e.to_string()),
        }
    })
    .await;
    if result.is_err() {
        let left = still_defined(&session.cdi.devices().await?, ids);
        let answered = if answered { "the driver answered NodeUnprepareResources OK, but " } else { "" };
        anyhow::bail!(
            "{answered}the CDI devices {} are still defined on node {} {timeout:?} after their claim was unprepared{}",
            left.join(", "),
            session.node,
            session.call_log()
        );
    }
    Ok(())
}
