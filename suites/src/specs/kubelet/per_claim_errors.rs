//! Specs of our own (no upstream counterpart): what the kubelet does when the driver fails one
//! claim of a `NodePrepareResources` / `NodeUnprepareResources` call that itself succeeds (the
//! per-claim `error` of the answer, injected with [`Driver::fail_claim`]). One node, ten
//! network-attached devices, one pod with two claims of the driver, so that every call names both
//! claims (the kubelet batches a pod's claims per driver: pkg/kubelet/cm/dra/manager.go:402-409
//! and 712-718 of v1.37.2) and only one of them fails.
//!
//! What the kubelet (v1.37.2, pkg/kubelet) does with a per-claim error:
//! - prepare: `prepareResources` returns `NodePrepareResources failed for ResourceClaim <name>:
//!   <error>` (cm/dra/manager.go:435-436) before it marks any claim of the pod prepared
//!   (manager.go:474-481, so the retry sends every claim again); `SyncPod` records the event
//!   `FailedPrepareDynamicResources` and does not create the sandbox
//!   (kuberuntime/kuberuntime_manager.go:1720-1728); that is not a sync error, so the pod is
//!   synced again at its next resync, `syncFrequency` plus up to 50 % (pod_workers.go:1529-1531).
//! - unprepare: `unprepareResources` returns `NodeUnprepareResources failed for ResourceClaim
//!   <name>: <error>` (manager.go:749-750) before it deletes the pod's claims from its cache and
//!   checkpoint (manager.go:761-778), so every claim of the call stays and is sent again;
//!   `SyncTerminatedPod` fails (kubelet.go:2443-2445) and the pod worker retries after its
//!   back-off, 10 s plus up to 50 % (pod_workers.go:1536-1547, kubelet.go:223). While the claims
//!   are cached the pod "could have running containers" (kubelet_pods.go:1130), so the kubelet
//!   neither reports a terminal phase (status/status_manager.go:1504-1509) nor deletes the pod
//!   (status_manager.go:1340), and the claims stay reserved for it (the resource claim
//!   controller releases them when the pod is terminal or gone:
//!   pkg/controller/resourceclaim/controller.go:1810-1814). No event: the failed sync is only
//!   logged (pod_workers.go:1336-1338).

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{Builder, allocation_env, phase},
    calls::{CallLog, ClaimCalls, Method, UNPREPARE_TIMEOUT},
    driver::{Driver, DriverConfig, INJECTED_CLAIM_ERROR, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    plugin::ClaimId,
    wait::{self, Verdict},
};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{ResourceExt as _, api::DeleteParams, runtime::watcher};

use super::checks::{self, POD_DELETE_TIMEOUT, POD_START_TIMEOUT, only_node, started, wait_event};

/// The kubelet's event reason when preparing a pod's claims fails.
const FAILED_PREPARE: &str = "FailedPrepareDynamicResources";
/// How many prepares of the failing claim fail before it may succeed.
const FAILED_PREPARES: u64 = 2;
/// How many failed unprepares of the failing claim the spec waits for before lifting the fault.
const FAILED_UNPREPARES: usize = 2;
/// The longest the kubelet waits before it syncs a pod again after a failed prepare: the default
/// `syncFrequency` (1 min) plus 50 % jitter (the local cluster's 10 s takes less).
const PREPARE_RETRY: Duration = Duration::from_secs(90);
/// The longest the kubelet's pod worker backs off after a failed `SyncTerminatedPod`: 10 s plus
/// 50 % jitter.
const UNPREPARE_RETRY: Duration = Duration::from_secs(15);

/// Registers the specs (inside the `kubelet` context).
pub fn register(r: &mut Registry) {
    r.it("must not start a pod before the claim that failed to prepare is prepared", prepare_retried)
        .timeout(Duration::from_secs(15 * 60));
    r.it(
        "must unprepare a claim again after its unprepare failed while the other claims succeeded",
        unprepare_retried,
    );
}

/// One node, ten network-attached devices, a driver registered with the node's kubelet, two
/// claims and a pod whose container uses both (not created yet). Returns the claims as created.
async fn setup(ctx: &Ctx) -> SpecResult<(Driver, Builder, String, [ResourceClaim; 2], Pod)> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let driver = Driver::start(ctx, &nodes, DriverConfig::kubelet(resources::network(10, false))).await?;
    let b = Builder::start(ctx, &driver, None).await?;
    let node = only_node(&driver)?;
    let (first, second) = (b.external_claim(), b.external_claim());
    let (pod, _) =
        b.pod_with_claims().claim("claim-0", &first.name_any()).claim("claim-1", &second.name_any()).build();
    let claims = [b.create_claim(&first).await?, b.create_claim(&second).await?];
    Ok((driver, b, node, claims, pod))
}

fn uid(claim: &ResourceClaim) -> String {
    claim.uid().unwrap_or_default()
}

/// Fails unless `other` was named in exactly the prepare (or unprepare) calls that named
/// `failing`, and succeeded in each that has finished.
fn expect_named_alike(failing: &ClaimCalls, other: &ClaimCalls, prepare: bool, log: &CallLog) -> SpecResult {
    let ids = |history: &ClaimCalls| -> Vec<u64> {
        history.calls.iter().filter(|c| c.prepare == prepare).map(|c| c.id).collect()
    };
    let mut finished = other.calls.iter().filter(|c| c.prepare == prepare && c.record.is_finished());
    expect!(
        ids(failing) == ids(other) && finished.all(|c| c.succeeded() && !c.injected()),
        "the other claim {} must be named, and succeed, in exactly the calls that named the failing \
         claim {}: {other}\ncall log:\n{log}",
        other.uid,
        failing.uid
    );
    Ok(())
}

/// A per-claim prepare error keeps the pod from starting (kuberuntime_manager.go:1720-1728), and
/// the kubelet prepares again (all of the pod's claims: the one that succeeded is not marked
/// prepared either, manager.go:474-481) until the claim is prepared, then starts the pod with the
/// devices of both claims.
async fn prepare_retried(ctx: Ctx) -> SpecResult {
    let (driver, b, node, [failing, other], pod) = setup(&ctx).await?;
    let calls = driver.calls(&node).clone();
    let (failing_uid, other_uid) = (uid(&failing), uid(&other));
    let _fault = driver.fail_claim_next(
        &node,
        Method::NodePrepareResources.for_claim_uid(&failing_uid),
        FAILED_PREPARES,
    );
    b.create_pod(&pod).await?;

    // The kubelet quotes the per-claim error in the pod's event (manager.go:436,
    // kuberuntime_manager.go:1726).
    let message = format!(
        "NodePrepareResources failed for ResourceClaim {}: {INJECTED_CLAIM_ERROR}",
        failing.name_any()
    );
    wait_event(&ctx, &pod.name_any(), FAILED_PREPARE, &message, POD_START_TIMEOUT).await?;

    // No container of the pod starts before the failing claim is prepared: every state of the
    // pod seen until it runs is checked against the call log read after it.
    let name = pod.name_any();
    let watched = calls.clone();
    let history = move || watched.claim(&failing_uid);
    wait::objects(
        &checks::pods(&ctx),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
        format!("pod {name} to run, not before claim {} is prepared", failing.name_any()),
        POD_START_TIMEOUT + PREPARE_RETRY * FAILED_PREPARES as u32,
        |pods: &[Pod]| {
            let Some(p) = pods.first() else { return Verdict::Fail(format!("pod {name} is gone")) };
            let history = history();
            if started(p) && history.prepared() == 0 {
                return Verdict::Fail(format!("pod {name} started before its claim was prepared: {history}"));
            }
            match phase(p) {
                "Running" => Verdict::Done,
                "Succeeded" | "Failed" => Verdict::Fail(format!("pod {name} terminated: {}", phase(p))),
                _ => Verdict::Pending,
            }
        },
    )
    .await?;
    // Both claims prepared with their allocated devices, and their env in the container.
    let running = b.test_pod(&pod, &[]).await?;
    let mut env = Vec::new();
    for claim in [&failing, &other] {
        let stored = checks::claims(&ctx).get(&claim.name_any()).await?;
        env.extend(allocation_env(b.driver_name(), &stored).map_err(anyhow::Error::msg)?);
    }
    env.sort();
    env.dedup();
    let env: Vec<(&str, &str)> = env.iter().filter_map(|line| line.split_once('=')).collect();
    let container =
        running.spec.as_ref().and_then(|s| s.containers.first()).context("pod without container")?;
    b.expect_env_exact(&running, &container.name, &env).await?;

    // Exactly: the injected failures, then one successful prepare, the last; the kubelet does not
    // prepare a prepared claim again (manager.go:386-390). The other claim went along in every
    // call.
    let log = calls.log();
    let failing_prepare = Method::NodePrepareResources.for_claim_uid(uid(&failing));
    log.expect_count(failing_prepare.clone().injected(), FAILED_PREPARES as usize)?;
    log.expect_count(failing_prepare.clone(), FAILED_PREPARES as usize + 1)?;
    log.expect_last(failing_prepare.succeeded())?;
    let failing_history = log.claim(&uid(&failing));
    failing_history.expect_prepared_once()?;
    expect_named_alike(&failing_history, &log.claim(&other_uid), true, &log)?;
    tracing::info!(claim = %failing.name_any(), calls = %failing_history, "prepared after per-claim errors");
    calls.expect_none(Method::NodeUnprepareResources).context("the pod runs")?;
    Ok(())
}

/// A per-claim unprepare error keeps the claim prepared (cached and checkpointed by the kubelet,
/// manager.go:749-750 returns before 761-778; held by the plugin), keeps the pod from going
/// terminal or away and its claims reserved (kubelet_pods.go:1130, status_manager.go:1504-1509),
/// and the kubelet unprepares both claims again until the failing one succeeds; then the pod goes.
async fn unprepare_retried(ctx: Ctx) -> SpecResult {
    let (driver, b, node, [failing, other], pod) = setup(&ctx).await?;
    let calls = driver.calls(&node).clone();
    let (failing_uid, other_uid) = (uid(&failing), uid(&other));
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[]).await?;
    let failing_unprepare = Method::NodeUnprepareResources.for_claim_uid(&failing_uid);
    let fault = driver.fail_claim(&node, failing_unprepare.clone());
    let name = pod.name_any();
    let deleted = calls.mark();
    checks::pods(&ctx).delete(&name, &DeleteParams::default()).await?;
    let timeout = UNPREPARE_TIMEOUT + UNPREPARE_RETRY * FAILED_UNPREPARES as u32;
    let log = calls.wait_at_least(failing_unprepare.clone().injected(), FAILED_UNPREPARES, timeout).await?;

    // The other claim was unprepared in the same calls; the failing one is still prepared.
    expect_named_alike(&log.claim(&failing_uid), &log.claim(&other_uid), false, &log)?;
    let failing_id = ClaimId { name: failing.name_any(), uid: failing_uid.clone() };
    let prepared = driver.prepared_claims(&node);
    expect!(
        prepared == [failing_id],
        "only claim {} must still be prepared, prepared: {prepared:?}",
        failing.name_any()
    );
    // The kubelet holds the pod back: not terminal, not deleted, its claims reserved.
    let current = checks::pods(&ctx).get_opt(&name).await?.context(format!(
        "pod {name} was removed although the kubelet could not unprepare claim {}; call log:\n{log}",
        failing.name_any()
    ))?;
    expect!(
        current.uid() == running.uid() && !matches!(phase(&current), "Succeeded" | "Failed"),
        "pod {name} must not be terminal while its claim is not unprepared, phase {}; call log:\n{log}",
        phase(&current)
    );
    for claim in [&failing, &other] {
        let stored = checks::claims(&ctx).get(&claim.name_any()).await?;
        let reserved = stored.status.as_ref().and_then(|s| s.reserved_for.as_deref()).unwrap_or_default();
        expect!(
            reserved.iter().any(|r| Some(&r.uid) == running.uid().as_ref()),
            "claim {} must stay reserved for pod {name} until the kubelet unprepared it, reserved for {reserved:?}",
            claim.name_any()
        );
    }

    fault.clear();
    calls.wait_unprepared(&failing_uid, UNPREPARE_TIMEOUT + UNPREPARE_RETRY).await?;
    b.wait_pod_gone(&name, POD_DELETE_TIMEOUT).await?;
    // The injected failures, then exactly one successful unprepare, the last.
    let log = calls.log();
    let injected = log.count(failing_unprepare.clone().injected());
    log.expect_at_least(failing_unprepare.clone().injected(), FAILED_UNPREPARES)?;
    log.expect_count(failing_unprepare.clone(), injected + 1)?;
    log.expect_last(failing_unprepare.succeeded())?;
    let failing_history = log.claim(&failing_uid);
    failing_history.expect_unprepared_once()?;
    expect_named_alike(&failing_history, &log.claim(&other_uid), false, &log)?;
    tracing::info!(claim = %failing.name_any(), calls = %failing_history, "unprepared after per-claim errors");
    expect!(
        driver.prepared_claims(&node).is_empty(),
        "claims still prepared: {:?}",
        driver.prepared_claims(&node)
    );
    // Never prepared again after the pod was deleted.
    calls.since(deleted).expect_none(Method::NodePrepareResources).context("the pod is gone")?;
    Ok(())
}
