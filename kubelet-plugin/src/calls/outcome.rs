//! How a recorded call ended, for the call as a whole or for one claim it named: the outcome
//! part of a [`CallFilter`](super::CallFilter) (`Method::NodePrepareResources.succeeded()`), and
//! what [`ClaimCall`](super::ClaimCall) says about each call of a claim. One definition serves
//! both, so a count, an expectation, a wait and a claim's history agree on what "succeeded",
//! "failed" and "injected" mean.

use std::fmt;

use super::CallRecord;

/// The outcome a [`CallFilter`](super::CallFilter) selects. When the filter names a claim
/// (`for_claim_uid`, `for_claim_name`), `Succeeded`, `Failed` and `Injected` are about that
/// claim: a call that succeeds as a whole can still fail for one of its claims (the per-claim
/// `error` of the answer, e.g. from [`Calls::fail_claim`](super::Calls::fail_claim)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// Finished with `OK`; for a claim: and the answer for the claim carries no error.
    Succeeded,
    /// Finished with an error status (injected or not); for a claim: or the answer for the claim
    /// carries an error (or has no entry for it).
    Failed,
    /// Carries an injected fault: the whole call was failed by one ([`Calls::fail`](super::Calls::fail),
    /// [`Calls::fail_next`](super::Calls::fail_next)), or the answer for a claim the filter names
    /// (any claim, when it names none) carries an injected per-claim error.
    Injected,
    /// Not finished yet (blocked ones included).
    InProgress,
    /// Held by a [`Calls::block`](super::Calls::block) now.
    Blocked,
}

impl CallOutcome {
    /// Whether `record` has this outcome; for the claim with UID `claim` when given.
    pub fn holds(self, record: &CallRecord, claim: Option<&str>) -> bool {
        match (self, claim) {
            (CallOutcome::InProgress, _) => !record.is_finished(),
            (CallOutcome::Blocked, _) => record.blocked,
            (CallOutcome::Succeeded, None) => record.succeeded(),
            (CallOutcome::Failed, None) => record.failed(),
            (CallOutcome::Injected, None) => record.injected || !record.injected_claims.is_empty(),
            (CallOutcome::Succeeded, Some(uid)) => claim_outcome(record, uid).0 == ClaimOutcome::Succeeded,
            (CallOutcome::Failed, Some(uid)) => {
                matches!(
                    claim_outcome(record, uid).0,
                    ClaimOutcome::CallFailed(_) | ClaimOutcome::ClaimFailed(_)
                )
            }
            (CallOutcome::Injected, Some(uid)) => {
                record.injected || record.injected_claims.iter().any(|u| u == uid)
            }
        }
    }
}

impl fmt::Display for CallOutcome {
    /// The words after a filter: `NodePrepareResources that succeeded`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CallOutcome::Succeeded => "that succeeded",
            CallOutcome::Failed => "that failed",
            CallOutcome::Injected => "with an injected fault",
            CallOutcome::InProgress => "still in progress",
            CallOutcome::Blocked => "held by a block",
        })
    }
}

/// How one recorded call ended for one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The call has not finished yet (or is blocked).
    InProgress,
    /// The whole call failed with this gRPC status (code and message).
    CallFailed(String),
    /// The call succeeded but its response has an error for the claim (or no entry for it).
    ClaimFailed(String),
    /// The call succeeded for the claim.
    Succeeded,
}

impl fmt::Display for ClaimOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimOutcome::InProgress => f.write_str("in progress"),
            ClaimOutcome::CallFailed(s) => write!(f, "call failed ({s})"),
            ClaimOutcome::ClaimFailed(s) => write!(f, "failed for the claim ({s})"),
            ClaimOutcome::Succeeded => f.write_str("OK"),
        }
    }
}

/// A device a prepare returned for a claim: `(pool, device, CDI IDs)`.
pub type PreparedDevice = (String, String, Vec<String>);

fn str_field<'a>(value: &'a serde_json::Value, key: &str) -> &'a str {
    value.get(key).and_then(serde_json::Value::as_str).unwrap_or_default()
}

/// How `record` ended for claim `uid`, and the devices it returned for it.
pub(super) fn claim_outcome(record: &CallRecord, uid: &str) -> (ClaimOutcome, Vec<PreparedDevice>) {
    let Some(status) = &record.status else { return (ClaimOutcome::InProgress, Vec::new()) };
    if !status.is_ok() {
        return (ClaimOutcome::CallFailed(format!("{:?}: {}", status.code, status.message)), Vec::new());
    }
    let Some(result) = record.response.as_ref().and_then(|r| r.get("claims")).and_then(|c| c.get(uid)) else {
        return (
            ClaimOutcome::ClaimFailed("the response has no result for the claim".to_owned()),
            Vec::new(),
        );
    };
    let error = str_field(result, "error");
    if !error.is_empty() {
        return (ClaimOutcome::ClaimFailed(error.to_owned()), Vec::new());
    }
    let devices = result
        .get("devices")
        .and_then(serde_json::Value::as_array)
        .map(|devices| {
            devices
                .iter()
                .map(|d| {
                    let cdi = d
                        .get("cdi_device_ids")
                        .and_then(serde_json::Value::as_array)
                        .map(|ids| ids.iter().filter_map(|id| id.as_str().map(str::to_owned)).collect())
                        .unwrap_or_default();
                    (str_field(d, "pool_name").to_owned(), str_field(d, "device_name").to_owned(), cdi)
                })
                .collect()
        })
        .unwrap_or_default();
    (ClaimOutcome::Succeeded, devices)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use serde_json::json;

    use super::*;
    use crate::calls::{CallStatus, ClaimRef};

    fn record(status: Option<tonic::Code>, response: serde_json::Value) -> CallRecord {
        CallRecord {
            id: 1,
            method: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources".into(),
            claims: ["a", "b"]
                .map(|uid| ClaimRef { namespace: "ns".into(), name: uid.into(), uid: uid.into() })
                .to_vec(),
            request: None,
            response: Some(response),
            responses: 1,
            status: status.map(|code| CallStatus { code, message: "boom".into() }),
            injected: false,
            injected_claims: Vec::new(),
            blocked: false,
            started: SystemTime::now(),
            finished: None,
        }
    }

    /// The outcome of a call for one claim, for the call as a whole, and what an injection is.
    #[test]
    fn outcomes_of_the_call_and_of_each_claim() {
        use CallOutcome::*;
        let answer =
            json!({"claims": {"a": {"devices": [], "error": ""}, "b": {"devices": [], "error": "full"}}});
        let mut ok = record(Some(tonic::Code::Ok), answer);
        assert!(Succeeded.holds(&ok, None) && !Failed.holds(&ok, None));
        assert!(Succeeded.holds(&ok, Some("a")) && !Failed.holds(&ok, Some("a")));
        assert!(Failed.holds(&ok, Some("b")) && !Succeeded.holds(&ok, Some("b")), "a per-claim error");
        assert!(Failed.holds(&ok, Some("c")), "no entry for the claim");
        assert!(!Injected.holds(&ok, None));
        ok.injected_claims.push("b".into());
        assert!(
            Injected.holds(&ok, None) && Injected.holds(&ok, Some("b")) && !Injected.holds(&ok, Some("a"))
        );

        let mut failed = record(Some(tonic::Code::Unknown), json!(null));
        assert!(Failed.holds(&failed, None) && Failed.holds(&failed, Some("a")));
        assert!(!Injected.holds(&failed, Some("a")));
        failed.injected = true;
        assert!(Injected.holds(&failed, None) && Injected.holds(&failed, Some("a")));

        let mut running = record(None, json!(null));
        assert!(InProgress.holds(&running, None) && !Blocked.holds(&running, None));
        assert!(!Succeeded.holds(&running, Some("a")) && !Failed.holds(&running, Some("a")));
        running.blocked = true;
        assert!(Blocked.holds(&running, Some("a")));
    }
}
