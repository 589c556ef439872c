//! p: admin access. A claim whose request sets `adminAccess: true` (allowed only in a namespace
//! labelled `resource.kubernetes.io/admin-access: "true"`) is allocated devices whether or not
//! other claims hold them, as monitoring tools need. Admin access is a feature of claims, not of
//! slices: the cluster decides it. The spec labels its namespace and creates the admin claim
//! first; when the API server refuses it naming `adminAccess` (for [`REFUSED_FOR`]: admission
//! sees a new label late) or drops `adminAccess` from it, the spec skips, quoting the API server;
//! any other refusal fails it.
//!
//! The devices are the node's plain devices ([`features::plain`]: no counters, no multiple
//! allocations, no taints): a first claim takes every one of them (`allocationMode: All`) and
//! its pod runs; then the admin claim's pod runs too, its claim allocated one of those very
//! devices with `adminAccess: true` in the allocation result, and both pods have their claims'
//! CDI devices (interposed: the admin claim prepared once, OK).

use std::{sync::Arc, time::Duration};

use harness::{
    builder::allocation_results,
    framework::{Ctx, Skip, SpecError, SpecResult, step},
    wait::{self, Attempt},
};
use k8s_openapi::api::{core::v1::Namespace, resource::v1::ResourceClaim};
use kube::{
    Api, ResourceExt as _,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{
    Target, features,
    inventory::Pin,
    pods::{cdi_known, run_with_claim},
    session::{Session, allocated_ids as got},
};

/// The namespace label without which the API server refuses admin access.
pub const ADMIN_ACCESS_LABEL: &str = "resource.kubernetes.io/admin-access";
/// How long a refusal of the admin claim is retried after the namespace was labelled.
const REFUSED_FOR: Duration = Duration::from_secs(30);
/// How often it is retried meanwhile.
const RETRY_EVERY: Duration = Duration::from_secs(2);

/// Labels the spec's namespace for admin access and creates the admin claim for a device of
/// `pin`; a skip, quoting the API server, when it refuses the claim or drops `adminAccess`.
async fn create_admin_claim(s: &Session, pin: &Pin) -> SpecResult<ResourceClaim> {
    let namespaces: Api<Namespace> = Api::all(s.ctx.client().clone());
    let label = json!({ "metadata": { "labels": { ADMIN_ACCESS_LABEL: "true" } } });
    namespaces.patch(s.ctx.namespace(), &PatchParams::default(), &Patch::Merge(&label)).await?;
    let request = json!({ "selectors": pin.selectors(), "adminAccess": true });
    let what = "the API server to accept a claim with adminAccess";
    let created = wait::poll(what, REFUSED_FOR, RETRY_EVERY, || async {
        match s.create_claim_with(request.clone()).await {
            Ok(claim) => Attempt::Done(claim),
            Err(e) => Attempt::Retry(format!("{e:#}")),
        }
    })
    .await;
    let claim = created.map_err(|e| refused(&e.to_string()))?;
    if !requests_admin_access(&claim) {
        return Err(Skip::because(
            "the API server dropped adminAccess from the claim's request (feature gate DRAAdminAccess is off)",
        ));
    }
    Ok(claim)
}

/// The spec's end when the API server kept refusing the admin claim: a skip when the refusal
/// names `adminAccess` (the feature is off or not allowed here), else an error (the spec's or
/// the cluster's, no missing feature).
fn refused(message: &str) -> SpecError {
    if message.contains("adminAccess") {
        Skip::because(format!(
            "the cluster refuses adminAccess on a request in a namespace labelled {ADMIN_ACCESS_LABEL}=true: {message}"
        ))
    } else {
        SpecError::fail(format!("creating the admin-access claim: {message}"))
    }
}

/// Whether the claim's first request asks for admin access.
fn requests_admin_access(claim: &ResourceClaim) -> bool {
    let devices = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
    let request = devices.and_then(|d| d.requests.as_ref()).and_then(|r| r.first());
    request.and_then(|r| r.exactly.as_ref()).and_then(|e| e.admin_access) == Some(true)
}

/// p: see the module documentation.
pub async fn in_use(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    let s = Session::start(&ctx, &target).await?;
    let pin = features::plain(&features::of_session(&s).await?).map_err(Skip::because)?;
    let admin = create_admin_claim(&s, &pin).await?;
    let kind = pin.ids();
    let all = s.create_claim_with(json!({ "selectors": pin.selectors(), "allocationMode": "All" })).await?;
    let holder = run_with_claim(&s, &all).await?;
    let held = got(&holder.claim);
    expect!(held == kind, "claim {} asked for all of {kind:?} and got {held:?}", holder.claim.name_any());
    step(format!("claim {} holds every plain device {held:?}", holder.claim.name_any()));

    let monitor = run_with_claim(&s, &admin).await?;
    let name = monitor.claim.name_any();
    let devices = got(&monitor.claim);
    expect!(
        devices.len() == 1 && devices.is_subset(&held),
        "the admin-access claim {name} got {devices:?}, not one of {held:?} that claim {} holds",
        holder.claim.name_any()
    );
    let results = allocation_results(&monitor.claim);
    expect!(
        results.iter().all(|r| r.admin_access == Some(true)),
        "the allocation of claim {name} does not say adminAccess: {results:?}"
    );
    step(format!(
        "the admin-access claim {name} got {devices:?}, held by claim {} too",
        holder.claim.name_any()
    ));
    cdi_known(&s, &[&holder, &monitor])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn a_claim_asks_for_admin_access_only_when_its_request_says_so() {
        let claim = |exactly: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(json!({
                "metadata": { "name": "c" },
                "spec": { "devices": { "requests": [{ "name": "device", "exactly": exactly }] } },
            }))
            .unwrap()
        };
        assert!(requests_admin_access(&claim(json!({ "deviceClassName": "x", "adminAccess": true }))));
        assert!(!requests_admin_access(&claim(json!({ "deviceClassName": "x" }))));
    }

    #[test]
    fn only_a_refusal_that_names_admin_access_is_a_skip() {
        let forbidden = "ResourceClaim.resource.k8s.io \"claim-1\" is forbidden: admin access to devices requires the \
            `resource.kubernetes.io/admin-access: true` label on the containing namespace: spec.devices.requests[0].exactly.adminAccess";
        assert!(refused(forbidden).is_skip());
        let other = "ResourceClaim.resource.k8s.io \"claim-1\" is invalid: spec.devices.requests[0].exactly.deviceClassName: Required value";
        assert!(!refused(other).is_skip());
    }
}
