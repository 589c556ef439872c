//! Recording of the gRPC calls that one node's kubelet makes to the in-process
//! plugin, with fault injection.
//!
//! [`Calls`] is shared by a [`CallsLayer`] installed on both gRPC servers of a
//! plugin (registration and DRA + health). The layer is a tower `Layer`, not a
//! tonic interceptor, because interceptors cannot see which method is called.
//!
//! What it does for every call:
//! - records the full method name, the decoded request and response (as JSON),
//!   the final status, start and end time ([`CallRecord`]); streams
//!   (`NodeWatchResources`) are recorded with their start, end, status and
//!   the number of messages sent;
//! - applies faults chosen by the test, per method and optionally per claim:
//!   fail every call or the next N calls with a chosen status, delay, and
//!   block until released ([`Calls::block`]). Injected failures are recorded
//!   with [`CallRecord::injected`] set and count like any other call.
//!
//! Each call waits only for the faults that match it; there is no global lock
//! around handlers, so a blocked `NodePrepareResources` for one claim does not
//! hold up calls for other claims or other methods.
//!
//! ```no_run
//! # async fn f(calls: harness::calls::Calls) -> Result<(), harness::calls::CallsError> {
//! use std::time::Duration;
//! use harness::calls::Method;
//! calls.fail_next(Method::NodePrepareResources, 1, tonic::Status::unavailable("try again"));
//! calls
//!     .eventually(|c| c.count(Method::NodePrepareResources) >= 2, Duration::from_secs(30))
//!     .await?;
//! # Ok(()) }
//! ```

mod decode;
mod layer;

use std::{
    fmt,
    panic::Location,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use serde::Serialize;
use tokio::sync::watch;

pub use layer::{CallsLayer, CallsService};

/// A gRPC method of the kubelet plugin APIs, or one exact full method name.
///
/// The named variants match every API version: [`Method::NodePrepareResources`]
/// matches `/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources` and
/// the `v1beta1` one alike.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `pluginregistration.Registration/GetInfo`.
    GetInfo,
    /// `pluginregistration.Registration/NotifyRegistrationStatus`.
    NotifyRegistrationStatus,
    /// `DRAPlugin/NodePrepareResources`, any version.
    NodePrepareResources,
    /// `DRAPlugin/NodeUnprepareResources`, any version.
    NodeUnprepareResources,
    /// `DRAResourceHealth/NodeWatchResources`, any version.
    NodeWatchResources,
    /// Exactly this full method name, e.g.
    /// `/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources`.
    Exact(String),
}

impl Method {
    /// Matches exactly one full method name (`/package.Service/Method`).
    pub fn exact(full_method: impl Into<String>) -> Self {
        Method::Exact(full_method.into())
    }

    /// The method name without package and service, or the full name for
    /// [`Method::Exact`].
    pub fn name(&self) -> &str {
        match self {
            Method::GetInfo => "GetInfo",
            Method::NotifyRegistrationStatus => "NotifyRegistrationStatus",
            Method::NodePrepareResources => "NodePrepareResources",
            Method::NodeUnprepareResources => "NodeUnprepareResources",
            Method::NodeWatchResources => "NodeWatchResources",
            Method::Exact(full) => full,
        }
    }

    /// Whether a full method name (`/package.Service/Method`) is this method.
    pub fn matches(&self, full_method: &str) -> bool {
        match self {
            Method::Exact(full) => full == full_method,
            named => {
                let Some((service, method)) = full_method.rsplit_once('/') else {
                    return false;
                };
                if method != named.name() {
                    return false;
                }
                let service = service.trim_start_matches('/');
                match named {
                    Method::GetInfo | Method::NotifyRegistrationStatus => {
                        service == "pluginregistration.Registration"
                    }
                    Method::NodePrepareResources | Method::NodeUnprepareResources => {
                        service.ends_with(".DRAPlugin")
                    }
                    _ => service.ends_with("DRAResourceHealth"),
                }
            }
        }
    }

    /// Restricts this method to calls whose request names a claim with this UID.
    pub fn for_claim_uid(self, uid: impl Into<String>) -> CallFilter {
        CallFilter { method: self, claim: Some(ClaimSelector::Uid(uid.into())) }
    }

    /// Restricts this method to calls whose request names a claim with this name.
    pub fn for_claim_name(self, name: impl Into<String>) -> CallFilter {
        CallFilter { method: self, claim: Some(ClaimSelector::Name(name.into())) }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which claim a [`CallFilter`] requires in the request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClaimSelector {
    /// A claim with this UID.
    Uid(String),
    /// A claim with this name (any namespace).
    Name(String),
}

/// Selects calls: a [`Method`], optionally narrowed to requests that name a
/// given claim (only DRA prepare/unprepare requests name claims). Every API
/// that takes a filter also takes a plain [`Method`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallFilter {
    /// The method.
    pub method: Method,
    /// The claim the request must name, if any.
    pub claim: Option<ClaimSelector>,
}

impl CallFilter {
    /// Whether a call with this full method name and these request claims matches.
    pub fn matches(&self, full_method: &str, claims: &[ClaimRef]) -> bool {
        if !self.method.matches(full_method) {
            return false;
        }
        match &self.claim {
            None => true,
            Some(ClaimSelector::Uid(uid)) => claims.iter().any(|c| &c.uid == uid),
            Some(ClaimSelector::Name(name)) => claims.iter().any(|c| &c.name == name),
        }
    }

    /// Whether a recorded call matches.
    pub fn matches_record(&self, record: &CallRecord) -> bool {
        self.matches(&record.method, &record.claims)
    }
}

impl From<Method> for CallFilter {
    fn from(method: Method) -> Self {
        CallFilter { method, claim: None }
    }
}

impl fmt::Display for CallFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.method)?;
        match &self.claim {
            None => Ok(()),
            Some(ClaimSelector::Uid(uid)) => write!(f, " for claim UID {uid}"),
            Some(ClaimSelector::Name(name)) => write!(f, " for claim {name}"),
        }
    }
}

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
    /// Sequence number, unique per [`Calls`], increasing in start order.
    pub id: u64,
    /// Full method name, e.g. `/pluginregistration.Registration/GetInfo`.
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
    /// The call is currently held by a [`Calls::block`].
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

/// A snapshot of the recorded calls, as returned by [`Calls::log`] and passed
/// to the conditions of [`Calls::eventually`].
#[derive(Clone, Debug, Serialize)]
pub struct CallLog {
    /// Time the [`Calls`] was created; log lines show times relative to it.
    #[serde(serialize_with = "serialize_time")]
    pub base: SystemTime,
    /// The calls in start order.
    pub records: Vec<CallRecord>,
}

impl CallLog {
    /// Calls that match the filter.
    pub fn matching(&self, filter: impl Into<CallFilter>) -> Vec<&CallRecord> {
        let filter = filter.into();
        self.records.iter().filter(|r| filter.matches_record(r)).collect()
    }

    /// Number of calls that match (started, including in progress, failed and injected).
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

    /// Number of matching calls failed by an injected fault.
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

    /// The last matching call.
    pub fn last(&self, filter: impl Into<CallFilter>) -> Option<&CallRecord> {
        let filter = filter.into();
        self.records.iter().rev().find(|r| filter.matches_record(r))
    }

    /// The full method names in start order.
    pub fn methods(&self) -> Vec<&str> {
        self.records.iter().map(|r| r.method.as_str()).collect()
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

/// Errors of [`Calls`].
#[derive(Debug, thiserror::Error)]
pub enum CallsError {
    /// A wait ran out of time.
    #[error(
        "timed out after {timeout:?} waiting for {what}\ncall log ({} calls):\n{log}",
        log.records.len()
    )]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        timeout: Duration,
        /// All calls recorded when the wait gave up.
        log: CallLog,
    },
}

/// What an injected fault does.
#[derive(Clone, Debug)]
enum FaultKind {
    /// Fail with this status; `remaining` calls (None = every call).
    Fail { status: tonic::Status, remaining: Option<u64> },
    /// Sleep before handling.
    Delay(Duration),
}

#[derive(Debug)]
struct Fault {
    filter: CallFilter,
    kind: FaultKind,
}

#[derive(Debug)]
struct Block {
    id: u64,
    filter: CallFilter,
    /// Dropped on release; held calls wait for the channel to close.
    release: watch::Sender<()>,
}

#[derive(Debug, Default)]
struct State {
    next_call: u64,
    next_block: u64,
    records: Vec<CallRecord>,
    faults: Vec<Fault>,
    blocks: Vec<Block>,
}

impl State {
    fn record_mut(&mut self, id: u64) -> Option<&mut CallRecord> {
        // Records are appended in id order; reset() only removes.
        let index = self.records.binary_search_by_key(&id, |r| r.id).ok()?;
        self.records.get_mut(index)
    }
}

#[derive(Debug)]
struct Inner {
    base: SystemTime,
    state: Mutex<State>,
    /// Bumped after every change of the log, for waits.
    changed: watch::Sender<u64>,
}

/// The call log and fault injection of one plugin (one node). Cheap to clone;
/// clones share everything.
#[derive(Clone, Debug)]
pub struct Calls {
    inner: Arc<Inner>,
}

impl Default for Calls {
    fn default() -> Self {
        Self::new()
    }
}

/// What the layer must do with a call before running the handler.
pub(crate) struct Admission {
    /// Held calls wait until all of these are closed.
    pub blocks: Vec<watch::Receiver<()>>,
    /// Total delay.
    pub delay: Duration,
}

impl Calls {
    /// An empty call log without faults.
    pub fn new() -> Self {
        Calls {
            inner: Arc::new(Inner {
                base: SystemTime::now(),
                state: Mutex::new(State::default()),
                changed: watch::Sender::new(0),
            }),
        }
    }

    /// A [`CallsLayer`] that records into this log; install it on gRPC servers
    /// with `tonic::transport::Server::builder().layer(..)`.
    pub fn layer(&self) -> CallsLayer {
        CallsLayer::new(self.clone())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state inconsistent
        // in a way that matters for a test log, so recover from poisoning.
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A snapshot of all recorded calls.
    pub fn log(&self) -> CallLog {
        CallLog { base: self.inner.base, records: self.state().records.clone() }
    }

    /// Number of calls that match (started, including in progress, failed and injected).
    pub fn count(&self, filter: impl Into<CallFilter>) -> usize {
        let filter = filter.into();
        self.state().records.iter().filter(|r| filter.matches_record(r)).count()
    }

    /// Forgets all recorded calls (counts start from zero again). Faults and
    /// blocks stay.
    pub fn reset(&self) {
        self.state().records.clear();
        self.notify();
    }

    /// Fails every matching call with `status` until [`Calls::clear`].
    pub fn fail(&self, filter: impl Into<CallFilter>, status: tonic::Status) {
        self.add_fault(filter.into(), FaultKind::Fail { status, remaining: None });
    }

    /// Fails the next `n` matching calls with `status`.
    pub fn fail_next(&self, filter: impl Into<CallFilter>, n: u64, status: tonic::Status) {
        if n > 0 {
            self.add_fault(filter.into(), FaultKind::Fail { status, remaining: Some(n) });
        }
    }

    /// Delays every matching call by `delay` before it is handled, until
    /// [`Calls::clear`].
    pub fn delay(&self, filter: impl Into<CallFilter>, delay: Duration) {
        self.add_fault(filter.into(), FaultKind::Delay(delay));
    }

    fn add_fault(&self, filter: CallFilter, kind: FaultKind) {
        tracing::debug!(%filter, ?kind, "injecting fault");
        self.state().faults.push(Fault { filter, kind });
    }

    /// Removes the failures and delays that were added with exactly this
    /// filter (blocks are released through their guard).
    pub fn clear(&self, filter: impl Into<CallFilter>) {
        let filter = filter.into();
        self.state().faults.retain(|f| f.filter != filter);
    }

    /// Removes all failures and delays.
    pub fn clear_all(&self) {
        self.state().faults.clear();
    }

    /// Holds every matching call that arrives from now on before its handler
    /// runs, until the returned guard is released or dropped. Other calls are
    /// not affected.
    #[must_use = "dropping the guard releases the block at once"]
    pub fn block(&self, filter: impl Into<CallFilter>) -> BlockGuard {
        let filter = filter.into();
        let mut state = self.state();
        state.next_block += 1;
        let id = state.next_block;
        tracing::debug!(%filter, "blocking calls");
        state.blocks.push(Block { id, filter, release: watch::Sender::new(()) });
        BlockGuard { calls: self.clone(), id: Some(id) }
    }

    fn release_block(&self, id: u64) {
        let removed = {
            let mut state = self.state();
            let before = state.blocks.len();
            state.blocks.retain(|b| b.id != id);
            before != state.blocks.len()
        };
        if removed {
            self.notify();
        }
    }

    /// Waits until `condition` holds for the call log, for at most `timeout`.
    /// On timeout the error names the caller's source location and contains
    /// the whole call log. The condition is checked again after every change.
    #[track_caller]
    pub fn eventually<F>(
        &self,
        condition: F,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), CallsError>> + Send + 'static
    where
        F: Fn(&CallLog) -> bool + Send + 'static,
    {
        let location = Location::caller();
        let what = format!("the condition at {}:{}", location.file(), location.line());
        self.clone().wait_until(what, condition, timeout)
    }

    /// Like [`Calls::eventually`], with a description of what is awaited for
    /// the timeout error.
    pub async fn wait_for<F>(
        &self,
        what: impl Into<String>,
        condition: F,
        timeout: Duration,
    ) -> Result<(), CallsError>
    where
        F: Fn(&CallLog) -> bool + Send + 'static,
    {
        self.clone().wait_until(what.into(), condition, timeout).await
    }

    /// Waits until at least `n` matching calls have been made.
    pub async fn wait_count(
        &self,
        filter: impl Into<CallFilter>,
        n: usize,
        timeout: Duration,
    ) -> Result<(), CallsError> {
        let filter = filter.into();
        let what = format!("at least {n} call(s) of {filter}");
        self.clone().wait_until(what, move |log| log.count(filter.clone()) >= n, timeout).await
    }

    async fn wait_until<F>(self, what: String, condition: F, timeout: Duration) -> Result<(), CallsError>
    where
        F: Fn(&CallLog) -> bool + Send + 'static,
    {
        let mut changed = self.inner.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changed.borrow_and_update();
            if condition(&self.log()) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `self`, so it cannot be closed; treat it as
                // a timeout anyway rather than spin.
                Ok(Err(_)) | Err(_) => {
                    let log = self.log();
                    if condition(&log) {
                        return Ok(());
                    }
                    return Err(CallsError::Timeout { what, timeout, log });
                }
            }
        }
    }

    // ---- used by the layer ----

    /// Records the start of a call and returns its id.
    pub(crate) fn start_call(
        &self,
        method: &str,
        claims: Vec<ClaimRef>,
        request: Option<serde_json::Value>,
    ) -> u64 {
        let id = {
            let mut state = self.state();
            state.next_call += 1;
            let id = state.next_call;
            state.records.push(CallRecord {
                id,
                method: method.to_string(),
                claims,
                request,
                response: None,
                responses: 0,
                status: None,
                injected: false,
                blocked: false,
                started: SystemTime::now(),
                finished: None,
            });
            id
        };
        self.notify();
        id
    }

    /// Blocks and delays that apply to a call.
    pub(crate) fn admission(&self, method: &str, claims: &[ClaimRef]) -> Admission {
        let state = self.state();
        let blocks = state
            .blocks
            .iter()
            .filter(|b| b.filter.matches(method, claims))
            .map(|b| b.release.subscribe())
            .collect();
        let delay = state
            .faults
            .iter()
            .filter(|f| f.filter.matches(method, claims))
            .filter_map(|f| match f.kind {
                FaultKind::Delay(d) => Some(d),
                FaultKind::Fail { .. } => None,
            })
            .sum();
        Admission { blocks, delay }
    }

    /// The injected failure for a call, if any (consumes one of "fail next N").
    pub(crate) fn take_failure(&self, method: &str, claims: &[ClaimRef]) -> Option<tonic::Status> {
        let mut state = self.state();
        let index = state
            .faults
            .iter()
            .position(|f| f.filter.matches(method, claims) && matches!(f.kind, FaultKind::Fail { .. }))?;
        let fault = state.faults.get_mut(index)?;
        let FaultKind::Fail { status, remaining } = &mut fault.kind else {
            return None;
        };
        let status = status.clone();
        if let Some(n) = remaining {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.faults.remove(index);
            }
        }
        Some(status)
    }

    pub(crate) fn update_call(&self, id: u64, update: impl FnOnce(&mut CallRecord)) {
        let found = {
            let mut state = self.state();
            match state.record_mut(id) {
                Some(record) => {
                    update(record);
                    true
                }
                None => false,
            }
        };
        if found {
            self.notify();
        }
    }

    pub(crate) fn finish_call(&self, id: u64, status: CallStatus, injected: bool) {
        self.update_call(id, |record| {
            if record.status.is_none() {
                record.status = Some(status);
                record.finished = Some(SystemTime::now());
                record.injected = injected;
                record.blocked = false;
            }
        });
    }
}

/// Holds the calls matched by [`Calls::block`] until released or dropped.
#[derive(Debug)]
pub struct BlockGuard {
    calls: Calls,
    id: Option<u64>,
}

impl BlockGuard {
    /// Lets the held calls (and later ones) proceed.
    pub fn release(mut self) {
        if let Some(id) = self.id.take() {
            self.calls.release_block(id);
        }
    }
}

impl Drop for BlockGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.calls.release_block(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(
        Method::NodePrepareResources,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        true
    )]
    #[case(
        Method::NodePrepareResources,
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        true
    )]
    #[case(
        Method::NodePrepareResources,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        false
    )]
    #[case(
        Method::NodeUnprepareResources,
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        true
    )]
    #[case(Method::GetInfo, "/pluginregistration.Registration/GetInfo", true)]
    #[case(Method::GetInfo, "/other.Registration/GetInfo", false)]
    #[case(
        Method::NotifyRegistrationStatus,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        true
    )]
    #[case(Method::NodeWatchResources, "/v1alpha1.DRAResourceHealth/NodeWatchResources", true)]
    #[case(Method::NodeWatchResources, "/v1.DRAResourceHealth/NodeWatchResources", true)]
    #[case(
        Method::exact("/v1.DRAResourceHealth/NodeWatchResources"),
        "/v1.DRAResourceHealth/NodeWatchResources",
        true
    )]
    #[case(
        Method::exact("/v1.DRAResourceHealth/NodeWatchResources"),
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        false
    )]
    fn method_matching(#[case] method: Method, #[case] path: &str, #[case] expected: bool) {
        assert_eq!(method.matches(path), expected);
    }

    #[test]
    fn claim_filter() {
        let claims = vec![ClaimRef { namespace: "ns".into(), name: "a".into(), uid: "uid-a".into() }];
        let path = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
        assert!(Method::NodePrepareResources.for_claim_uid("uid-a").matches(path, &claims));
        assert!(!Method::NodePrepareResources.for_claim_uid("uid-b").matches(path, &claims));
        assert!(Method::NodePrepareResources.for_claim_name("a").matches(path, &claims));
        assert!(!Method::NodePrepareResources.for_claim_name("a").matches(path, &[]));
    }

    #[test]
    fn fail_next_counts_down() {
        let calls = Calls::new();
        let path = "/pluginregistration.Registration/GetInfo";
        calls.fail_next(Method::GetInfo, 2, tonic::Status::unavailable("x"));
        assert!(calls.take_failure(path, &[]).is_some());
        assert!(calls.take_failure(path, &[]).is_some());
        assert!(calls.take_failure(path, &[]).is_none());
    }

    #[tokio::test]
    async fn timeout_error_contains_log_and_location() {
        let calls = Calls::new();
        let id = calls.start_call("/pluginregistration.Registration/GetInfo", vec![], None);
        calls.finish_call(id, CallStatus { code: tonic::Code::Ok, message: String::new() }, false);
        let err =
            calls.eventually(|c| c.count(Method::GetInfo) >= 2, Duration::from_millis(20)).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("src/calls/mod.rs"), "{text}");
        assert!(text.contains("/pluginregistration.Registration/GetInfo -> OK"), "{text}");
    }
}
