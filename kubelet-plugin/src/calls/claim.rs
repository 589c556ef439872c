//! What the kubelet did with one ResourceClaim, read from a node's recorded gRPC calls: which
//! `NodePrepareResources` / `NodeUnprepareResources` calls named the claim, how each ended for
//! it — the call can fail as a whole (gRPC status, e.g. an injected fault) or succeed with a
//! per-claim error in the response ([`ClaimOutcome`]) — and the expectations on that history.
//!
//! ```
//! use kubelet_plugin::calls::Calls;
//! let calls = Calls::new();
//! let history = calls.claim("claim-uid");
//! assert!(history.first_prepared().is_none());
//! history.expect_never_unprepared().unwrap();
//! let err = history.expect_prepared_once().unwrap_err().to_string();
//! assert!(err.starts_with("expected claim UID claim-uid prepared successfully exactly once, got 0"), "{err}");
//! ```

use std::fmt;

use super::{
    CallLog, CallOutcome, CallRecord, CallsError, ClaimOutcome, Method, PreparedDevice,
    outcome::claim_outcome,
};

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
    /// For a successful prepare: the devices returned for the claim.
    pub devices: Vec<PreparedDevice>,
    /// The whole record (times, request, response).
    pub record: CallRecord,
    injected: bool,
}

impl ClaimCall {
    /// Whether the call succeeded for the claim ([`CallOutcome::Succeeded`] for the claim).
    pub fn succeeded(&self) -> bool {
        self.outcome == ClaimOutcome::Succeeded
    }

    /// Whether the call ended and did not succeed for the claim ([`CallOutcome::Failed`]).
    pub fn failed(&self) -> bool {
        matches!(self.outcome, ClaimOutcome::CallFailed(_) | ClaimOutcome::ClaimFailed(_))
    }

    /// Whether the call as a whole, or its answer for this claim, was failed by an injected
    /// fault ([`CallOutcome::Injected`] for the claim).
    pub fn injected(&self) -> bool {
        self.injected
    }
}

/// The prepare and unprepare calls of one node that named a claim (by UID), in call order, and
/// the log they were read from (which every failed expectation carries).
#[derive(Clone, Debug)]
pub struct ClaimCalls {
    /// The claim UID.
    pub uid: String,
    /// The calls, in start order.
    pub calls: Vec<ClaimCall>,
    log: CallLog,
}

impl ClaimCalls {
    /// The prepare and unprepare calls in `log` that named claim `uid` ([`CallLog::claim`]).
    pub(super) fn from_log(log: &CallLog, uid: &str) -> Self {
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
                let (outcome, devices) = claim_outcome(r, uid);
                Some(ClaimCall {
                    id: r.id,
                    prepare: is_prepare,
                    method: r.method.clone(),
                    outcome,
                    injected: CallOutcome::Injected.holds(r, Some(uid)),
                    devices,
                    record: r.clone(),
                })
            })
            .collect();
        ClaimCalls { uid: uid.to_owned(), calls, log: log.clone() }
    }

    /// The call log this history was read from.
    pub fn log(&self) -> &CallLog {
        &self.log
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

    /// The last prepare call that succeeded for the claim.
    pub fn last_prepared(&self) -> Option<&ClaimCall> {
        self.prepares().filter(|c| c.succeeded()).last()
    }

    /// The last unprepare call that succeeded for the claim.
    pub fn last_unprepared(&self) -> Option<&ClaimCall> {
        self.unprepares().filter(|c| c.succeeded()).last()
    }

    /// Whether the claim's last successful call was a prepare (the kubelet considers it prepared).
    pub fn is_prepared(&self) -> bool {
        self.calls.iter().rev().find(|c| c.succeeded()).is_some_and(|c| c.prepare)
    }

    /// Fails unless exactly one prepare call succeeded for the claim (failed ones, injected or
    /// not, may come before it).
    pub fn expect_prepared_once(&self) -> Result<(), CallsError> {
        let n = self.prepared();
        self.check(n == 1, "prepared successfully exactly once", || format!("{n}: {self}"))
    }

    /// Fails unless exactly one unprepare call succeeded for the claim and the claim is not
    /// prepared since (no successful prepare after it).
    pub fn expect_unprepared_once(&self) -> Result<(), CallsError> {
        let n = self.unprepared();
        let expected = "unprepared successfully exactly once, after its last successful prepare";
        self.check(n == 1 && !self.is_prepared(), expected, || format!("{n}: {self}"))
    }

    /// Fails if any unprepare call (whatever its outcome) named the claim; on a
    /// [`CallLog::since`] log: since the mark.
    pub fn expect_never_unprepared(&self) -> Result<(), CallsError> {
        let n = self.unprepares().count();
        self.check(n == 0, "never unprepared (no NodeUnprepareResources naming it)", || {
            format!("{n}: {self}")
        })
    }

    fn check(&self, ok: bool, expected: &str, actual: impl FnOnce() -> String) -> Result<(), CallsError> {
        if ok {
            return Ok(());
        }
        Err(self.log.unexpected(format!("claim UID {} {expected}", self.uid), actual()))
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
                let injected = if c.injected { " [injected]" } else { "" };
                format!("#{} {name} -> {}{injected}", c.id, c.outcome)
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
            since: None,
            records: vec![
                record(1, "NodePrepareResources", "u1", Some(tonic::Code::Unknown), json!(null)),
                record(2, "NodePrepareResources", "u1", Some(tonic::Code::Ok), claim_error),
                record(3, "NodePrepareResources", "u1", Some(tonic::Code::Ok), ok),
                record(4, "NodePrepareResources", "u2", Some(tonic::Code::Ok), json!({})),
                record(5, "NodeUnprepareResources", "u1", None, json!(null)),
            ],
        };
        let calls = log.claim("u1");
        assert_eq!(calls.calls.len(), 4);
        assert_eq!((calls.prepared(), calls.prepare_failures()), (1, 2));
        assert_eq!((calls.unprepared(), calls.unprepare_failures()), (0, 0));
        assert!(calls.calls[0].injected());
        assert_eq!(calls.calls[1].outcome, ClaimOutcome::ClaimFailed("not allocated".into()));
        let first = calls.first_prepared().unwrap();
        assert_eq!(first.id, 3);
        assert_eq!(first.devices, [("p".to_owned(), "d".to_owned(), vec!["x/test=y".to_owned()])]);
        assert!(calls.is_prepared());
        assert_eq!(calls.calls[3].outcome, ClaimOutcome::InProgress);
        assert!(
            calls.to_string().contains("#1 NodePrepareResources -> call failed (Unknown: boom) [injected]")
        );
        let none = log.claim("u3");
        assert!(!none.is_prepared());
        assert_eq!(none.to_string(), "no prepare/unprepare call named claim UID u3");
    }
}
