//! What the kubelet did, read from the gRPC calls a driver's plugin recorded on one node: which
//! API version it chose, which claims it prepared and unprepared, which health stream it opened.
//!
//! Every check returns an error that says what was expected and holds the node's call log.

use std::{collections::BTreeSet, fmt};

use anyhow::{Context as _, bail, ensure};
use harness::calls::{CallLog, CallRecord, Calls, Method, UNPREPARE_TIMEOUT};
pub(crate) use harness::calls::{DraApi, HealthApi};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt as _;

/// A claim as the kubelet names it in DRA requests.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ClaimKey {
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
}

impl ClaimKey {
    /// The key of a stored claim.
    pub(crate) fn of(claim: &ResourceClaim) -> anyhow::Result<Self> {
        let uid = claim.uid().with_context(|| format!("claim {} has no UID", claim.name_any()))?;
        Ok(ClaimKey { name: claim.name_any(), uid })
    }
}

impl fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.uid)
    }
}

/// `supported_versions` of the last successful `GetInfo`, as the plugin advertised it.
pub(crate) fn advertised(log: &CallLog) -> Option<Vec<String>> {
    log.matching(Method::GetInfo)
        .into_iter()
        .rev()
        .filter(|r| r.succeeded())
        .find_map(|r| r.response.as_ref()?.get("supported_versions")?.as_array().cloned())
        .map(|versions| versions.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
}

/// Checks that the plugin advertised exactly `expected` (in this order).
pub(crate) fn check_advertised(log: &CallLog, expected: &[&str]) -> anyhow::Result<()> {
    let advertised = advertised(log).context("no successful GetInfo in the call log")?;
    ensure!(
        advertised == expected,
        "the plugin advertised supported_versions {advertised:?}, expected {expected:?}\ncall log:\n{log}"
    );
    Ok(())
}

/// UIDs of the claims named in the requests of the calls of `method`.
fn named_claims(log: &CallLog, method: &Method) -> BTreeSet<String> {
    log.matching(method.clone()).iter().flat_map(|r| r.claims.iter().map(|c| c.uid.clone())).collect()
}

/// Whether a finished call's response reports success for the claim with `uid` (present in the
/// response's `claims` map with an empty `error`).
fn claim_succeeded(record: &CallRecord, uid: &str) -> bool {
    record.succeeded()
        && record
            .response
            .as_ref()
            .and_then(|r| r.get("claims"))
            .and_then(|c| c.get(uid))
            .is_some_and(|c| c.get("error").and_then(|e| e.as_str()).unwrap_or_default().is_empty())
}

/// Whether some call of `method` succeeded for the claim with `uid`.
fn succeeded_for(log: &CallLog, method: &Method, uid: &str) -> bool {
    log.matching(method.clone()).iter().any(|r| claim_succeeded(r, uid))
}

fn uids(claims: &[ClaimKey]) -> BTreeSet<String> {
    claims.iter().map(|c| c.uid.clone()).collect()
}

/// Checks that the kubelet used no method of the other DRA version.
fn check_not_used(log: &CallLog, api: DraApi) -> anyhow::Result<()> {
    let other = api.other();
    let why = || format!("the kubelet must use only {api}");
    log.expect_none(other.prepare()).with_context(why)?;
    log.expect_none(other.unprepare()).with_context(why)?;
    Ok(())
}

/// Checks that the kubelet prepared exactly `claims` through `api`, that each of them was
/// prepared successfully, and that it never called the other DRA version. Returns a summary.
pub(crate) fn check_prepared(log: &CallLog, api: DraApi, claims: &[ClaimKey]) -> anyhow::Result<String> {
    check_not_used(log, api)?;
    let method = api.prepare();
    let named = named_claims(log, &method);
    let expected = uids(claims);
    ensure!(
        named == expected,
        "NodePrepareResources on {api} named claims {named:?}, expected exactly {claims:?}\ncall log:\n{log}"
    );
    for claim in claims {
        ensure!(
            succeeded_for(log, &method, &claim.uid),
            "no successful {method} for claim {claim}\ncall log:\n{log}"
        );
    }
    Ok(format!("{method} x{} for {}", log.count(method.clone()), names(claims)))
}

/// Checks that no call of `method` named `claim`.
pub(crate) fn check_not_named(log: &CallLog, method: &Method, claim: &ClaimKey) -> anyhow::Result<()> {
    log.expect_none(method.clone().for_claim_uid(claim.uid.clone()))
        .with_context(|| format!("claim {claim}"))?;
    Ok(())
}

/// Waits until the kubelet has unprepared each of `claims` successfully through `api`, then checks
/// that it never called the other version. Returns a summary.
pub(crate) async fn wait_unprepared(
    calls: &Calls,
    api: DraApi,
    claims: &[ClaimKey],
) -> anyhow::Result<String> {
    let method = api.unprepare();
    let wanted = uids(claims);
    let what = format!("successful {method} for claims {}", names(claims));
    {
        let method = method.clone();
        calls
            .wait_for(
                what,
                move |log| wanted.iter().all(|uid| succeeded_for(log, &method, uid)),
                UNPREPARE_TIMEOUT,
            )
            .await?;
    }
    let log = calls.log();
    check_not_used(&log, api)?;
    Ok(format!("{method} x{} for {}", log.count(method.clone()), names(claims)))
}

/// The first call of `method` that named `claim`.
pub(crate) fn first_call_for<'a>(
    log: &'a CallLog,
    method: &Method,
    claim: &ClaimKey,
) -> anyhow::Result<&'a CallRecord> {
    let Some(record) = log.matching(method.clone().for_claim_uid(claim.uid.clone())).into_iter().next()
    else {
        bail!("no call of {method} named claim {claim}\ncall log:\n{log}");
    };
    Ok(record)
}

/// Checks that the kubelet watches device health on `api` only: at least one call of its
/// `NodeWatchResources`, none of the other version's. Returns a summary.
pub(crate) fn check_watch(log: &CallLog, api: HealthApi) -> anyhow::Result<String> {
    let method = api.watch();
    let other = api.other().watch();
    log.expect_at_least(method.clone(), 1)?;
    log.expect_none(other.clone())?;
    Ok(format!("{method} x{}, {other} x0", log.count(method.clone())))
}

fn names(claims: &[ClaimKey]) -> String {
    claims.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_log_has_no_evidence() {
        let log = Calls::new().log();
        assert!(advertised(&log).is_none());
        assert!(check_prepared(&log, DraApi::V1, &[]).is_ok());
        let claim = ClaimKey { name: "c".into(), uid: "u".into() };
        assert!(check_prepared(&log, DraApi::V1, std::slice::from_ref(&claim)).is_err());
        assert!(check_not_named(&log, &DraApi::V1.prepare(), &claim).is_ok());
        assert!(check_watch(&log, HealthApi::V1).is_err());
    }
}
