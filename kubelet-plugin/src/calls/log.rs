//! What was recorded: one [`CallRecord`] per gRPC call, and [`CallLog`], a snapshot of a node's
//! calls with the counts and expectations specs make on it.

use std::{
    fmt,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use super::{CallFilter, CallsError};

/// A claim named in a DRA request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ClaimRef {
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// UID of the claim.
    pub uid: String,
}

/// The final gRPC status of a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallStatus {
    /// The gRPC status code.
    #[serde(serialize_with = "serialize_code")]
    pub code: tonic::Code,
    /// The status message (empty on success).
    pub message: String,
}

fn serialize_code<S: serde::Serializer>(code: &tonic::Code, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{code:?}"))
}

impl CallStatus {
    /// Whether the code is `OK`.
    pub fn is_ok(&self) -> bool {
        self.code == tonic::Code::Ok
    }
}

impl From<&tonic::Status> for CallStatus {
    fn from(status: &tonic::Status) -> Self {
        CallStatus { code: status.code(), message: status.message().to_string() }
    }
}

/// One recorded gRPC call.
#[derive(Clone, Debug, Serialize)]
pub struct CallRecord {
    /// Sequence number, unique per [`super::Calls`], increasing in start order.
    pub id: u64,
    /// Full method path, e.g. `/pluginregistration.Registration/GetInfo`.
    pub method: String,
    /// Claims named in the request (DRA prepare/unprepare only).
    pub claims: Vec<ClaimRef>,
    /// The decoded request, if the method is known.
    pub request: Option<serde_json::Value>,
    /// The decoded response; for streams the last message sent.
    pub response: Option<serde_json::Value>,
    /// Number of response messages sent (1 for a successful unary call).
    pub responses: u64,
    /// The final status; `None` while the call is in progress.
    pub status: Option<CallStatus>,
    /// The call was failed by an injected fault without reaching the handler.
    pub injected: bool,
    /// UIDs of the claims whose answer carries an injected per-claim error
    /// ([`super::Calls::fail_claim`]); the call itself went on.
    pub injected_claims: Vec<String>,
    /// The call is currently held by a [`super::Calls::block`].
    pub blocked: bool,
    /// When the call arrived.
    #[serde(serialize_with = "serialize_time")]
    pub started: SystemTime,
    /// When the response (or stream) ended.
    #[serde(serialize_with = "serialize_opt_time")]
    pub finished: Option<SystemTime>,
}

fn unix_seconds(t: &SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

fn serialize_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(unix_seconds(t))
}

fn serialize_opt_time<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_f64(unix_seconds(t)),
        None => s.serialize_none(),
    }
}

impl CallRecord {
    /// Whether the call has finished.
    pub fn is_finished(&self) -> bool {
        self.status.is_some()
    }

    /// Whether the call finished with status `OK`.
    pub fn succeeded(&self) -> bool {
        self.status.as_ref().is_some_and(CallStatus::is_ok)
    }

    /// Whether the call finished with a status other than `OK`.
    pub fn failed(&self) -> bool {
        self.status.as_ref().is_some_and(|s| !s.is_ok())
    }

    /// How long the call took, if finished.
    pub fn duration(&self) -> Option<Duration> {
        self.finished.and_then(|f| f.duration_since(self.started).ok())
    }

    /// One line of text describing the call, with times relative to `base`.
    pub fn describe(&self, base: SystemTime) -> String {
        let start = self.started.duration_since(base).unwrap_or_default().as_secs_f64();
        let mut line = format!("#{} +{start:.3}s {}", self.id, self.method);
        match (&self.status, self.duration()) {
            (Some(status), duration) => {
                let took =
                    duration.map(|d| format!(" in {:.1}ms", d.as_secs_f64() * 1000.0)).unwrap_or_default();
                if status.is_ok() {
                    line.push_str(&format!(" -> OK{took}"));
                } else {
                    line.push_str(&format!(" -> {:?} {:?}{took}", status.code, status.message));
                }
            }
            (None, _) if self.blocked => line.push_str(" -> (blocked)"),
            (None, _) => line.push_str(" -> (in progress)"),
        }
        if self.injected {
            line.push_str(" [injected]");
        }
        if !self.injected_claims.is_empty() {
            line.push_str(&format!(" [injected for claim UID(s) {}]", self.injected_claims.join(", ")));
        }
        if let Some(request) = &self.request {
            line.push_str(&format!(" request={request}"));
        }
        if let Some(response) = &self.response {
            if self.responses > 1 {
                line.push_str(&format!(" responses={} last={response}", self.responses));
            } else {
                line.push_str(&format!(" response={response}"));
            }
        }
        line
    }
}

/// A snapshot of one node's recorded calls, as returned by [`super::Calls::log`] and passed to
/// the conditions of the waits. Its `expect_*` methods fail with the whole log in the error.
#[derive(Clone, Debug, Serialize)]
pub struct CallLog {
    /// Whose calls these are, e.g. `the kubelet of node n1 (driver d.k8s.io)`; empty when unnamed.
    pub scope: String,
    /// Time the [`super::Calls`] was created; log lines show times relative to it.
    #[serde(serialize_with = "serialize_time")]
    pub base: SystemTime,
    /// The calls in start order.
    pub records: Vec<CallRecord>,
}

impl CallLog {
    /// An empty log (e.g. of a node without a plugin).
    pub fn empty(scope: impl Into<String>) -> Self {
        CallLog { scope: scope.into(), base: SystemTime::now(), records: Vec::new() }
    }

    /// Calls that match the filter.
    pub fn matching(&self, filter: impl Into<CallFilter>) -> Vec<&CallRecord> {
        let filter = filter.into();
        self.records.iter().filter(|r| filter.matches_record(r)).collect()
    }

    /// Number of calls that match (started, including in progress, failed and injected):
    /// upstream's `CallCount`.
    pub fn count(&self, filter: impl Into<CallFilter>) -> usize {
        let filter = filter.into();
        self.records.iter().filter(|r| filter.matches_record(r)).count()
    }

    /// Number of matching calls that finished with `OK`.
    pub fn succeeded(&self, filter: impl Into<CallFilter>) -> usize {
        self.count_where(filter, CallRecord::succeeded)
    }

    /// Number of matching calls that finished with an error status (injected or not).
    pub fn failed(&self, filter: impl Into<CallFilter>) -> usize {
        self.count_where(filter, CallRecord::failed)
    }

    /// Number of matching calls failed as a whole by an injected fault (an injected per-claim
    /// error does not fail its call: see [`super::Calls::claim`]).
    pub fn injected(&self, filter: impl Into<CallFilter>) -> usize {
        self.count_where(filter, |r| r.injected)
    }

    /// Number of matching calls that have not finished yet.
    pub fn in_progress(&self, filter: impl Into<CallFilter>) -> usize {
        self.count_where(filter, |r| !r.is_finished())
    }

    /// Number of matching calls currently held by a block.
    pub fn blocked(&self, filter: impl Into<CallFilter>) -> usize {
        self.count_where(filter, |r| r.blocked)
    }

    /// Number of matching calls for which `pred` holds.
    pub fn count_where(&self, filter: impl Into<CallFilter>, pred: impl Fn(&CallRecord) -> bool) -> usize {
        let filter = filter.into();
        self.records.iter().filter(|r| filter.matches_record(r) && pred(r)).count()
    }

    /// The first matching call.
    pub fn first(&self, filter: impl Into<CallFilter>) -> Option<&CallRecord> {
        let filter = filter.into();
        self.records.iter().find(|r| filter.matches_record(r))
    }

    /// The last matching call.
    pub fn last(&self, filter: impl Into<CallFilter>) -> Option<&CallRecord> {
        let filter = filter.into();
        self.records.iter().rev().find(|r| filter.matches_record(r))
    }

    /// The full method paths in start order.
    pub fn methods(&self) -> Vec<&str> {
        self.records.iter().map(|r| r.method.as_str()).collect()
    }

    /// The UID of the first claim with this name that a request named (for generated claims
    /// that may already be gone); an error with the log when no request named it.
    pub fn claim_uid(&self, claim_name: &str) -> Result<String, CallsError> {
        match self.records.iter().flat_map(|r| r.claims.iter()).find(|c| c.name == claim_name) {
            Some(claim) => Ok(claim.uid.clone()),
            None => Err(CallsError::Unexpected {
                expected: format!("a call that names claim {claim_name}"),
                actual: 0,
                log: self.clone(),
            }),
        }
    }

    /// Fails unless exactly `n` calls match.
    pub fn expect_count(&self, filter: impl Into<CallFilter>, n: usize) -> Result<(), CallsError> {
        let filter = filter.into();
        let actual = self.count(filter.clone());
        self.check(actual == n, || format!("exactly {n} call(s) of {filter}"), actual)
    }

    /// Fails unless at least `n` calls match.
    pub fn expect_at_least(&self, filter: impl Into<CallFilter>, n: usize) -> Result<(), CallsError> {
        let filter = filter.into();
        let actual = self.count(filter.clone());
        self.check(actual >= n, || format!("at least {n} call(s) of {filter}"), actual)
    }

    /// Fails if any call matches.
    pub fn expect_none(&self, filter: impl Into<CallFilter>) -> Result<(), CallsError> {
        let filter = filter.into();
        let actual = self.count(filter.clone());
        self.check(actual == 0, || format!("no call of {filter}"), actual)
    }

    fn check(&self, ok: bool, expected: impl FnOnce() -> String, actual: usize) -> Result<(), CallsError> {
        if ok {
            return Ok(());
        }
        Err(CallsError::Unexpected { expected: expected(), actual, log: self.clone() })
    }
}

impl fmt::Display for CallLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.records.is_empty() {
            return writeln!(f, "  (no calls)");
        }
        for record in &self.records {
            writeln!(f, "  {}", record.describe(self.base))?;
        }
        Ok(())
    }
}
