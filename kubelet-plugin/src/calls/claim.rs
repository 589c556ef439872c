//! What the kubelet did with one ResourceClaim, read from a node's recorded gRPC calls: which
//! `NodePrepareResources` / `NodeUnprepareResources` calls named the claim, and how each ended
//! for it — the call can fail as a whole (gRPC status, e.g. an injected fault) or succeed with a
//! per-claim error in the response.
//!
//! ```
//! use kubelet_plugin::calls::{Calls, ClaimCalls};
//! let calls = Calls::new();
//! let history = calls.claim("claim-uid");
//! assert_eq!(history.prepared(), 0);
//! assert!(history.first_prepared().is_none());
//! ```

use std::fmt;

use super::{CallLog, CallRecord, Method};

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

/// One recorded call that named the claim.
#[derive(Clone, Debug)]
pub struct ClaimCall {
    /// The call's sequence number in the node's log ([`CallRecord::id`]).
    pub id: u64,
    /// [`Method::NodePrepareResources`] or [`Method::NodeUnprepareResources`] (any version).
    pub prepare: bool,
    /// The full method name.
    pub method: String,
    /// How it ended for the claim.
    pub outcome: ClaimOutcome,
    /// The call as a whole, or its answer for this claim, was failed by an injected fault.
    pub injected: bool,
    /// For a successful prepare: the devices returned for the claim as `(pool, device, CDI IDs)`.
    pub devices: Vec<(String, String, Vec<String>)>,
    /// The whole record (times, request, response).
    pub record: CallRecord,
}

impl ClaimCall {
    /// Whether the call succeeded for the claim.
    pub fn succeeded(&self) -> bool {
        self.outcome == ClaimOutcome::Succeeded
    }

    /// Whether the call ended and did not succeed for the claim.
    pub fn failed(&self) -> bool {
        matches!(self.outcome, ClaimOutcome::CallFailed(_) | ClaimOutcome::ClaimFailed(_))
    }
}

/// The prepare and unprepare calls of one node that named a claim (by UID), in call order.
#[derive(Clone, Debug, Default)]
pub struct ClaimCalls {
    /// The claim UID.
    pub uid: String,
    /// The calls, in start order.
    pub calls: Vec<ClaimCall>,
}

fn str_field<'a>(value: &'a serde_json::Value, key: &str) -> &'a str {
    value.get(key).and_then(serde_json::Value::as_str).unwrap_or_default()
}

/// How `record` ended for claim `uid` and the devices it returned for it.
fn outcome(record: &CallRecord, uid: &str) -> (ClaimOutcome, Vec<(String, String, Vec<String>)>) {
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

impl ClaimCalls {
    /// The prepare and unprepare calls in `log` that named claim `uid`.
    pub fn of(log: &CallLog, uid: &str) -> Self {
        let prepare = Method::NodePrepareResources;
        let unprepare = Method::NodeUnprepareResources;
        let calls = log
            .records
            .iter()
            .filter(|r| r.claims.iter().any(|c| c.uid == uid))
            .filter_map(|r| {
                let is_prepare = prepare.matches(&r.method);
                if !is_prepare && !unprepare.matches(&r.method) {
                    return None;
                }
                let (outcome, devices) = outcome(r, uid);
                Some(ClaimCall {
                    id: r.id,
                    prepare: is_prepare,
                    method: r.method.clone(),
                    outcome,
                    injected: r.injected || r.injected_claims.iter().any(|u| u == uid),
                    devices,
                    record: r.clone(),
                })
            })
            .collect();
        ClaimCalls { uid: uid.to_owned(), calls }
    }

    /// The prepare calls.
    pub fn prepares(&self) -> impl Iterator<Item = &ClaimCall> {
        self.calls.iter().filter(|c| c.prepare)
    }

    /// The unprepare calls.
    pub fn unprepares(&self) -> impl Iterator<Item = &ClaimCall> {
        self.calls.iter().filter(|c| !c.prepare)
    }

    /// Number of prepare calls that succeeded for the claim.
    pub fn prepared(&self) -> usize {
        self.prepares().filter(|c| c.succeeded()).count()
    }

    /// Number of prepare calls that failed (whole call or for the claim).
    pub fn prepare_failures(&self) -> usize {
        self.prepares().filter(|c| c.failed()).count()
    }

    /// Number of unprepare calls that succeeded for the claim.
    pub fn unprepared(&self) -> usize {
        self.unprepares().filter(|c| c.succeeded()).count()
    }

    /// Number of unprepare calls that failed (whole call or for the claim).
    pub fn unprepare_failures(&self) -> usize {
        self.unprepares().filter(|c| c.failed()).count()
    }

    /// The first prepare call that succeeded for the claim.
    pub fn first_prepared(&self) -> Option<&ClaimCall> {
        self.prepares().find(|c| c.succeeded())
    }

    /// The last unprepare call that succeeded for the claim.
    pub fn last_unprepared(&self) -> Option<&ClaimCall> {
        self.unprepares().filter(|c| c.succeeded()).last()
    }

    /// Whether the claim's last successful call was a prepare (the kubelet considers it prepared).
    pub fn is_prepared(&self) -> bool {
        self.calls.iter().rev().find(|c| c.succeeded()).is_some_and(|c| c.prepare)
    }
}

impl fmt::Display for ClaimCalls {
    /// One line per call: `#id Method -> outcome [injected]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.calls.is_empty() {
            return write!(f, "no prepare/unprepare call named claim UID {}", self.uid);
        }
        let lines: Vec<String> = self
            .calls
            .iter()
            .map(|c| {
                let name = if c.prepare { "NodePrepareResources" } else { "NodeUnprepareResources" };
                let outcome = match &c.outcome {
                    ClaimOutcome::InProgress => "in progress".to_owned(),
                    ClaimOutcome::CallFailed(s) => format!("call failed ({s})"),
                    ClaimOutcome::ClaimFailed(s) => format!("failed for the claim ({s})"),
                    ClaimOutcome::Succeeded => "OK".to_owned(),
                };
                let injected = if c.injected { " [injected]" } else { "" };
                format!("#{} {name} -> {outcome}{injected}", c.id)
            })
            .collect();
        write!(f, "{}", lines.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use serde_json::json;

    use super::*;
    use crate::calls::{CallStatus, ClaimRef};

    fn record(
        id: u64,
        method: &str,
        uid: &str,
        status: Option<tonic::Code>,
        response: serde_json::Value,
    ) -> CallRecord {
        CallRecord {
            id,
            method: format!("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}"),
            claims: vec![ClaimRef { namespace: "ns".into(), name: "c".into(), uid: uid.into() }],
            request: None,
            response: Some(response),
            responses: 1,
            status: status.map(|code| CallStatus { code, message: "boom".into() }),
            injected: status == Some(tonic::Code::Unknown),
            injected_claims: Vec::new(),
            blocked: false,
            started: SystemTime::now(),
            finished: None,
        }
    }

    #[test]
    fn outcomes_per_claim() {
        let ok = json!({"claims": {"u1": {"devices": [
            {"request_names": ["r"], "pool_name": "p", "device_name": "d", "cdi_device_ids": ["x/test=y"]}
        ], "error": ""}}});
        let claim_error = json!({"claims": {"u1": {"devices": [], "error": "not allocated"}}});
        let log = CallLog {
            scope: String::new(),
            base: SystemTime::now(),
            records: vec![
                record(1, "NodePrepareResources", "u1", Some(tonic::Code::Unknown), json!(null)),
                record(2, "NodePrepareResources", "u1", Some(tonic::Code::Ok), claim_error),
                record(3, "NodePrepareResources", "u1", Some(tonic::Code::Ok), ok),
                record(4, "NodePrepareResources", "u2", Some(tonic::Code::Ok), json!({})),
                record(5, "NodeUnprepareResources", "u1", None, json!(null)),
            ],
        };
        let calls = ClaimCalls::of(&log, "u1");
        assert_eq!(calls.calls.len(), 4);
        assert_eq!((calls.prepared(), calls.prepare_failures()), (1, 2));
        assert_eq!((calls.unprepared(), calls.unprepare_failures()), (0, 0));
        assert!(calls.calls[0].injected);
        assert_eq!(calls.calls[1].outcome, ClaimOutcome::ClaimFailed("not allocated".into()));
        let first = calls.first_prepared().unwrap();
        assert_eq!(first.id, 3);
        assert_eq!(first.devices, [("p".to_owned(), "d".to_owned(), vec!["x/test=y".to_owned()])]);
        assert!(calls.is_prepared());
        assert_eq!(calls.calls[3].outcome, ClaimOutcome::InProgress);
        assert!(
            calls.to_string().contains("#1 NodePrepareResources -> call failed (Unknown: boom) [injected]")
        );
        let none = ClaimCalls::of(&log, "u3");
        assert!(!none.is_prepared());
        assert_eq!(none.to_string(), "no prepare/unprepare call named claim UID u3");
    }
}
