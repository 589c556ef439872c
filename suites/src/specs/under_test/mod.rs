//! `[sig-node] [DRA] driver under test [DriverUnderTest] ...`: specs that check ANY DRA driver
//! already installed in the cluster (`dra-e2e --driver NAME`), not the harness's own test driver.
//! They are registered only with `--driver`, and then alone (the harness's own specs need its
//! in-process driver).
//!
//! Each spec picks the node under test: the first node, by name, with a ResourceSlice of the
//! driver. Its claims ask for one device of the DeviceClass (`--device-class`, default the first
//! class whose CEL selectors require `device.driver == "NAME"`, see [`class_selector`]). What a
//! spec asserts is what the API and the node show (claims, pods and their status, the node's CDI
//! spec files in `/etc/cdi` and `/var/run/cdi`, read by a busybox pod on the node); with
//! `--interpose` ([`harness::interposer`]) also the driver's gRPC calls, with exact counts, and a
//! failure message then ends with the node's call log. A spec passes only on evidence it can
//! name, and skips, naming `--interpose`, where there is none ([`evidence`]).
//!
//! | contract point | module |
//! |---|---|
//! | a. valid ResourceSlices for every node served | [`slices`] |
//! | b. a pod's claim is allocated, prepared once, its CDI devices defined and their env in the container | [`pods`] |
//! | c. the claim is unprepared once when the pod is deleted, its CDI devices gone | [`pods`] |
//! | d. a claim shared by two pods: prepared once, unprepared once after the last pod | [`claims`] |
//! | e. a force-deleted pod's claim is unprepared | [`pods`] |
//! | f. a pod whose claim is not reserved for it never runs, the claim is never prepared | [`claims`] |
//! | g. the health stream's first snapshot (interposed, when the driver serves DRAResourceHealth) | [`health`] |
//! | h. the kubelet registered the driver's plugin (its plugin manager, its client of the driver) and prepare reaches it | [`registration`] |
//! | i. a device is used again by a new claim of a second pod once the first pod and claim are gone | [`reuse`] |
//! | j. two claims in one pod, one with two devices: each claim its own CDI devices, each container its own env | [`several`] |
//! | k. N rounds of create, run, delete leave nothing (CDI devices, pods, claims), interposed the calls add up | [`churn`] |
//! | l. a per-claim prepare error (interposed) keeps the pod from running, the kubelet retries | [`retry`] |
//! | m. partitions are allocated until their shared counters are used up, and again once freed | [`partitions`] |
//! | n. claims share a device that allows multiple allocations, each consuming its capacity | [`sharing`] |
//! | o. a tainted device goes only to a claim that tolerates its taint | [`taints`] |
//! | p. a claim with admin access gets a device another claim holds | [`admin`] |
//!
//! m to o are optional features a driver shows in its ResourceSlices ([`features`], from the
//! node's [`inventory`]); without them in the slices of the node under test each of those specs
//! skips, naming what the slices lack. Admin access (p) is a feature of claims, which the
//! cluster decides: refused, the spec skips quoting the API server.
//!
//! The specs that run pods run alone, one at a time: interposed, because the kubelet uses the
//! newest registration of a driver on a node (two interposers would take it from each other);
//! without it, because the CDI devices a claim got are told apart from others by what appeared
//! on the node while its pod started, and because a real driver may have few devices.
//!
//! After the run, [`summary`] prints the behaviours' table a vendor hands on, and writes it as
//! Markdown and JUnit.

mod admin;
mod args;
mod cdi;
mod checks;
mod churn;
mod claims;
mod class_selector;
mod evidence;
mod features;
mod health;
mod inventory;
mod partitions;
mod pods;
mod registration;
mod retry;
mod reuse;
mod session;
mod several;
mod sharing;
mod slices;
pub mod summary;
mod taints;

use std::{future::Future, sync::Arc};

pub use args::{Target, UnderTestArgs};
use futures::future::BoxFuture;
use harness::framework::{Ctx, Precheck, Registry, SpecResult};
use inventory::Inventory;

/// The label of every driver-under-test spec (`--label-filter DriverUnderTest`).
pub const LABEL: &str = "DriverUnderTest";

/// Why the pod specs run alone.
const ALONE: &str = "it runs pods on the node under test: the kubelet talks to the newest registration of the \
                     driver there (the interposer's), and the CDI devices of a claim are told apart by what \
                     appeared on the node while its pod started";

/// A spec body with the target.
fn with<F, Fut>(target: &Arc<Target>, body: F) -> impl Fn(Ctx) -> Fut + Send + Sync + 'static
where
    F: Fn(Ctx, Arc<Target>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = SpecResult> + Send + 'static,
{
    let target = target.clone();
    move |ctx| body(ctx, target.clone())
}

/// The requirement that the slices of the node under test show what `plan` needs (else a skip
/// with its reason, before anything is created).
fn showing<T: Send + 'static>(
    target: &Arc<Target>,
    plan: fn(&Inventory) -> Result<T, String>,
) -> impl Fn(Precheck) -> BoxFuture<'static, SpecResult> + Send + Sync + 'static {
    let target = target.clone();
    move |pre| {
        let target = target.clone();
        Box::pin(async move { features::require(&pre, &target, plan).await })
    }
}

/// Registers the driver-under-test specs for `target` (the summary of their run is
/// [`summary::after_run`]'s).
pub fn register(registry: &mut Registry, target: Target) {
    let target = Arc::new(target);
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("driver under test", [LABEL], |r| {
            r.it("publishes valid ResourceSlices for every node it serves", with(&target, slices::valid)).description(
                "Every ResourceSlice of the driver names it and a pool; each node-local one names an existing Node; \
                 every pool's current generation has as many slices as its resourceSliceCount, all for one node, \
                 and non-empty, uniquely named devices; at least one node is served.",
            );
            r.it("prepares the claim of a pod and its CDI devices reach the container", with(&target, pods::prepares))
                .runs_alone(ALONE)
                .description(
                    "A pod with a claim from the class, on the node under test, runs; the claim is allocated devices \
                     of the driver only and reserved for the pod; the CDI devices prepared for it (interposed: of \
                     its one successful NodePrepareResources; else those the kubelet lists in the pod status and \
                     those that appeared on the node) are defined in /etc/cdi or /var/run/cdi of the node and their \
                     env edits are in the container's env. Skipped when they cannot be told (needs --interpose).",
                );
            r.it("unprepares the claim once when its pod is deleted", with(&target, pods::unprepares))
                .runs_alone(ALONE)
                .description(
                    "After the pod of a prepared claim is deleted, the kubelet removes it (which it does only once \
                     NodeUnprepareResources succeeded; interposed: exactly one, successful), the CDI devices written \
                     for the claim are no longer defined on the node and the claim is reserved for nobody.",
                );
            r.it("prepares a claim shared by two pods once and unprepares it after the last pod", with(&target, claims::shared))
                .runs_alone(ALONE)
                .description(
                    "Two pods share one claim, the second created once the first runs: both run with its CDI devices; \
                     interposed, one NodePrepareResources; after the first pod is gone the claim stays prepared \
                     (interposed: no NodeUnprepareResources; the CDI devices written for it still defined); after the \
                     second it is unprepared (interposed: once) and those devices are gone. Without --interpose, \
                     skipped when no CDI device was written for the claim.",
                );
            r.it("unprepares the claim of a force-deleted pod", with(&target, pods::force_deleted))
                .runs_alone(ALONE)
                .description(
                    "A running pod deleted with grace period 0 still gets its claim unprepared (interposed: exactly \
                     once) and the CDI devices written for it removed from the node. Without --interpose, skipped \
                     when no CDI device was written for the claim (nothing else shows the unprepare).",
                );
            r.it("must not run a pod whose claim is not reserved for it", with(&target, claims::not_reserved))
                .runs_alone(ALONE)
                .description(
                    "Upstream's 'must not run a pod if a claim is not ready': a pod bound to the node past the \
                     scheduler, whose claim nobody allocates or reserves, stays Pending for 20s and (interposed) the \
                     driver is never called for the claim.",
                );
            r.it("sends the first health snapshot", with(&target, health::first_snapshot)).runs_alone(ALONE).description(
                "Interposed only: if the kubelet opens a NodeWatchResources stream (the driver serves \
                 DRAResourceHealth), the driver's first snapshot arrives within 60s; skipped, saying why, otherwise.",
            );
            r.it("registers its kubelet plugin on the node", with(&target, registration::registered))
                .runs_alone(ALONE)
                .description(
                    "The kubelet of the node under test shows the driver registered: its plugin manager registered a \
                     socket of /var/lib/kubelet/plugins_registry (plugin_manager_total_plugins in its /metrics), and \
                     while a pod with a claim of the class starts, its own client of the driver counts a successful \
                     NodePrepareResources (dra_grpc_operations_duration_seconds_count{driver_name=NAME}); the kubelet \
                     has such a client only for a registered driver. Interposed, exactly one NodePrepareResources of \
                     the claim reached the driver through the interposer. Skipped when the kubelet's /metrics cannot \
                     be read through the API server's node proxy.",
                );
            r.it(
                "reuses a device for a second pod with a new claim after the first is gone",
                with(&target, reuse::reuses),
            )
            .runs_alone(ALONE)
            .description(
                "Pod 1 with claim 1 runs, is deleted (its claim unprepared, as in 'unprepares the claim once') and \
                 claim 1 is deleted; then pod 2 with a new claim 2 runs on the same node with its CDI devices. When \
                 the driver's slices offer one device on the node, claim 2 must get the device claim 1 had; with \
                 more, any device of the driver (the step says whether it was the same). Interposed, claim 1 was \
                 unprepared once before claim 2 was first prepared.",
            );
            r.it(
                "gives each claim of a pod and each device of a claim its CDI devices, each container only its own",
                with(&target, several::several),
            )
            .runs_alone(ALONE)
            .requires({
                let target = target.clone();
                move |pre| {
                    let target = target.clone();
                    async move { several::require_devices(&pre, &target).await }
                }
            })
            .description(
                "A pod with two containers, each using its own claim: one for one device, one for two (count 2). \
                 Both claims are allocated three distinct devices of the driver; interposed, each is prepared once \
                 and the answer lists every allocated device; the two claims' CDI devices (interposed: from the \
                 answer; else from the pod status) share none; each container has the env of its own claim's CDI \
                 devices and none that only the other claim's set. Skipped when the node offers fewer than three \
                 devices of the driver, and without --interpose when the pod status lists no CDI devices.",
            );
            r.it("leaves nothing behind after N rounds of create, run and delete", with(&target, churn::churn))
                .runs_alone(ALONE)
                .timeout(churn::timeout(target.churn_rounds))
                .priority(crate::specs::LONG_PRIORITY)
                .description(
                    "N rounds (--churn-rounds, default 10) of: a claim and a pod using it, the pod runs with its CDI \
                     devices, the pod is deleted gracefully and the claim is deleted. Afterwards no CDI device written \
                     for any round's claim (nor any CDI spec file named after its UID) is defined on the node within \
                     10s, no pod with a claim and no claim is left; interposed, each claim was prepared once and \
                     unprepared once, N successful prepares and N successful unprepares in all, none failed. A \
                     failure names each round whose CDI devices are left, with the files.",
                );
            r.it(
                "keeps a pod from running while the driver fails to prepare its claim, and retries",
                with(&target, retry::retried),
            )
            .runs_alone(ALONE)
            .timeout(retry::TIMEOUT)
            .requires({
                let interpose = target.interpose;
                move |pre| retry::require_interposer(pre, interpose)
            })
            .description(
                "Interposed only: the interposer answers the claim's first NodePrepareResources with a per-claim \
                 error in place of the driver; the kubelet reports FailedPrepareDynamicResources naming the claim \
                 and the error, no container of the pod starts before the claim is prepared, the kubelet prepares \
                 again (exactly one more call, which reaches the driver and succeeds) and the pod runs with the \
                 claim's CDI devices. Skipped without --interpose.",
            );
            register_optional(r, &target);
        });
    });
}

/// Registers the specs of the optional features (m to p).
fn register_optional(r: &mut Registry, target: &Arc<Target>) {
    r.it(
        "allocates partitions until their shared counters are used up, and again once they are freed",
        with(target, partitions::fill),
    )
    .runs_alone(ALONE)
    .requires(showing(target, features::partitions))
    .description(
        "Partitionable devices (sharedCounters, consumesCounters): of a kind of partition (same attributes, \
         asked for by a CEL selector on them) of which N >= 2 fit their counter set at once and more are \
         published, a claim for one and a claim for N-1 run with their CDI devices, N distinct partitions \
         in all; a third claim for one stays unallocated while partitions of the kind are free (its pod \
         unschedulable, the scheduler's message in the step; interposed, never prepared); once the first pod \
         and claim are gone it is allocated a partition of the kind and its pod runs (interposed: prepared \
         after the first claim was unprepared). Skipped when the slices of the node show no such partitions.",
    );
    r.it("shares a device between claims that consume its capacity", with(target, sharing::share_capacity))
        .runs_alone(ALONE)
        .requires(showing(target, features::sharing))
        .description(
            "Consumable capacity: a device with allowMultipleAllocations that its attributes single out, with a \
             capacity that has a requestPolicy; two claims each request the policy's smallest amount of it \
             (capacity.requests) and both pods run at once with their CDI devices; each allocation is that \
             device, with consumedCapacity of at least the amount and a shareID of its own. Skipped when the \
             slices of the node show no such device.",
        );
    r.it("allocates a tainted device only to a claim that tolerates its taint", with(target, taints::tolerated))
        .runs_alone(ALONE)
        .requires(showing(target, features::taints))
        .description(
            "Device taints: for devices with a NoSchedule or NoExecute taint (a kind of them asked for by their \
             attributes, or all devices when every one is tainted), a claim without a toleration stays \
             unallocated (its pod unschedulable; interposed, never prepared), and a claim that tolerates each \
             taint is allocated one of them, the allocation carries the tolerations, and its pod runs with its \
             CDI devices. Skipped when the slices of the node show no tainted device.",
        );
    r.it("gives a claim with admin access a device that another claim holds", with(target, admin::in_use))
        .runs_alone(ALONE)
        .requires(showing(target, features::plain))
        .description(
            "Admin access: in a namespace labelled resource.kubernetes.io/admin-access=true, a claim with \
             adminAccess is created first (refused naming adminAccess, or stripped, by the API server: skipped, quoting it; refused otherwise: failed); a claim \
             takes every plain device of the node (allocationMode All) and its pod runs; then the admin claim's \
             pod runs, its claim allocated one of those devices with adminAccess in the allocation result, and \
             both pods have their claims' CDI devices (interposed: each prepared once, OK).",
        );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn every_spec_is_named_for_the_driver_under_test_and_says_what_it_asserts() {
        let target =
            Target { driver: "d.example.com".into(), class: "c".into(), interpose: false, churn_rounds: 1 };
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry, target);
        registry.validate().unwrap();
        assert_eq!(registry.len(), 16);
        for spec in registry.specs() {
            assert!(
                spec.full_text().starts_with("[sig-node] [DRA] driver under test [DriverUnderTest] "),
                "{}",
                spec.full_text()
            );
            assert!(spec.description().is_some_and(|d| !d.is_empty()), "{}", spec.full_text());
            assert_eq!(
                spec.runs_alone(),
                spec.name() != "publishes valid ResourceSlices for every node it serves"
            );
        }
    }
}
