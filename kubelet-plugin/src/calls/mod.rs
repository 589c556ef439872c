//! The one way to look at, assert on and interfere with the gRPC calls one node's kubelet makes
//! to the in-process plugin.
//!
//! [`Calls`] is shared by a [`CallsLayer`] installed on both gRPC servers of a plugin
//! (registration and DRA + health); a spec reaches it as `driver.calls(node)`. The layer is a
//! tower `Layer`, not a tonic interceptor, because interceptors cannot see which method is called.
//!
//! - **Which calls**: a [`Method`] matches every API version ([`Method::NodePrepareResources`]),
//!   [`DraApi`] / [`HealthApi`] give exactly one version (`DraApi::V1.prepare()`), and
//!   [`Method::for_claim_uid`] narrows any of them to one claim ([`CallFilter`]).
//! - **Counting and asserting**: [`Calls::count`] (upstream's `CallCount`), and
//!   [`Calls::expect_count`], [`Calls::expect_at_least`], [`Calls::expect_none`], whose errors
//!   carry the node's whole call log; the same on a snapshot ([`CallLog`]). Per claim:
//!   [`Calls::claim`] says how each prepare/unprepare call that named the claim ended for it.
//! - **Waiting**: [`Calls::eventually`], [`Calls::wait_for`], [`Calls::wait_at_least`],
//!   [`Calls::wait_unprepared`]; each re-checks after every change and fails with the log.
//! - **Faults**: [`Calls::fail`], [`Calls::fail_next`], [`Calls::delay`] and [`Calls::block`]
//!   return a guard; the fault lasts until the guard is cleared or dropped. Injected failures are
//!   recorded ([`CallRecord::injected`]) and count like any other call. [`Calls::fail_claim`] and
//!   [`Calls::fail_claim_next`] fail single claims of a call that succeeds (the per-claim `error`
//!   of the answer), with the same guards; recorded per claim ([`CallRecord::injected_claims`],
//!   [`ClaimCall::injected`]). The Driver also clears whatever is still injected when the spec's
//!   cleanup starts.
//!
//! Each call waits only for the faults that match it; there is no global lock around handlers,
//! so a blocked `NodePrepareResources` for one claim does not hold up calls for other claims or
//! other methods.
//!
//! ```no_run
//! # async fn f(calls: kubelet_plugin::calls::Calls) -> Result<(), kubelet_plugin::calls::CallsError> {
//! use std::time::Duration;
//! use kubelet_plugin::calls::Method;
//! let failing = calls.fail(Method::NodePrepareResources, tonic::Status::unavailable("try again"));
//! calls.wait_at_least(Method::NodePrepareResources, 1, Duration::from_secs(60)).await?;
//! failing.clear();
//! calls.expect_none(Method::NodeUnprepareResources)?;
//! # Ok(()) }
//! ```

mod claim;
mod decode;
mod faults;
mod guard;
mod layer;
mod log;
mod method;

use std::{
    fmt,
    panic::Location,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use faults::{Block, Fault};
use tokio::sync::watch;

pub use claim::{ClaimCall, ClaimCalls, ClaimOutcome};
pub use faults::ClaimFaults;
pub use guard::{BlockGuard, FaultGuard};
pub use layer::{CallsLayer, CallsService};
pub use log::{CallLog, CallRecord, CallStatus, ClaimRef};
pub use method::{CallFilter, ClaimSelector, DraApi, HealthApi, Method};

/// How long the kubelet may take to unprepare a claim after its pod is gone (upstream waits one
/// minute for the plugin's prepared set to become empty).
pub const UNPREPARE_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the call assertions and waits; each carries the whole call log.
#[derive(Debug)]
pub enum CallsError {
    /// A wait ran out of time.
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        timeout: Duration,
        /// All calls recorded when the wait gave up.
        log: CallLog,
    },
    /// An expectation on the calls did not hold.
    Unexpected {
        /// What was expected, e.g. `exactly 2 call(s) of NodePrepareResources`.
        expected: String,
        /// How many calls matched.
        actual: usize,
        /// The calls the expectation was checked on.
        log: CallLog,
    },
}

impl CallsError {
    /// The call log the error carries.
    pub fn log(&self) -> &CallLog {
        match self {
            CallsError::Timeout { log, .. } | CallsError::Unexpected { log, .. } => log,
        }
    }
}

impl fmt::Display for CallsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.log();
        if !log.scope.is_empty() {
            write!(f, "{}: ", log.scope)?;
        }
        match self {
            CallsError::Timeout { what, timeout, .. } => {
                write!(f, "timed out after {timeout:?} waiting for {what}")?
            }
            CallsError::Unexpected { expected, actual, .. } => {
                write!(f, "expected {expected}, got {actual}")?
            }
        }
        write!(f, "\ncall log ({} calls):\n{log}", log.records.len())
    }
}

impl std::error::Error for CallsError {}

#[derive(Debug, Default)]
struct State {
    next_call: u64,
    next_fault: u64,
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
    scope: String,
    base: SystemTime,
    state: Mutex<State>,
    /// Bumped after every change of the log, for waits.
    changed: watch::Sender<u64>,
}

/// The call log and fault injection of one plugin (one node). Cheap to clone; clones share
/// everything.
#[derive(Clone, Debug)]
pub struct Calls {
    inner: Arc<Inner>,
}

impl Default for Calls {
    fn default() -> Self {
        Self::new()
    }
}

impl Calls {
    /// An empty, unnamed call log without faults.
    pub fn new() -> Self {
        Self::named("")
    }

    /// An empty call log whose errors name `scope`, e.g. `the kubelet of node n1 (driver d)`.
    pub fn named(scope: impl Into<String>) -> Self {
        Calls {
            inner: Arc::new(Inner {
                scope: scope.into(),
                base: SystemTime::now(),
                state: Mutex::new(State::default()),
                changed: watch::Sender::new(0),
            }),
        }
    }

    /// A [`CallsLayer`] that records into this log; install it on gRPC servers with
    /// `tonic::transport::Server::builder().layer(..)`.
    pub fn layer(&self) -> CallsLayer {
        CallsLayer::new(self.clone())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state inconsistent in a way that
        // matters for a test log, so recover from poisoning.
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A snapshot of all recorded calls.
    pub fn log(&self) -> CallLog {
        CallLog {
            scope: self.inner.scope.clone(),
            base: self.inner.base,
            records: self.state().records.clone(),
        }
    }

    /// Number of calls that match (started, including in progress, failed and injected):
    /// upstream's `CallCount`.
    pub fn count(&self, filter: impl Into<CallFilter>) -> usize {
        let filter = filter.into();
        self.state().records.iter().filter(|r| filter.matches_record(r)).count()
    }

    /// Fails unless exactly `n` calls match (the error carries the call log).
    pub fn expect_count(&self, filter: impl Into<CallFilter>, n: usize) -> Result<(), CallsError> {
        self.log().expect_count(filter, n)
    }

    /// Fails unless at least `n` calls match.
    pub fn expect_at_least(&self, filter: impl Into<CallFilter>, n: usize) -> Result<(), CallsError> {
        self.log().expect_at_least(filter, n)
    }

    /// Fails if any call matches.
    pub fn expect_none(&self, filter: impl Into<CallFilter>) -> Result<(), CallsError> {
        self.log().expect_none(filter)
    }

    /// The prepare and unprepare calls that named the claim with this UID, and how each ended
    /// for it.
    pub fn claim(&self, uid: &str) -> ClaimCalls {
        ClaimCalls::of(&self.log(), uid)
    }

    /// Forgets all recorded calls (counts start from zero again). Faults and blocks stay.
    pub fn reset(&self) {
        self.state().records.clear();
        self.notify();
    }

    /// Waits until `condition` holds for the call log, for at most `timeout`. On timeout the
    /// error names the caller's source location and contains the whole call log. The condition
    /// is checked again after every change.
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

    /// Like [`Calls::eventually`], with a description of what is awaited for the timeout error.
    pub async fn wait_for<F>(
        &self,
        what: impl Into<String>,
        condition: F,
        timeout: Duration,
    ) -> Result<CallLog, CallsError>
    where
        F: Fn(&CallLog) -> bool + Send + 'static,
    {
        self.clone().wait_until(what.into(), condition, timeout).await?;
        Ok(self.log())
    }

    /// Waits until at least `n` matching calls have been made; returns the log then.
    pub async fn wait_at_least(
        &self,
        filter: impl Into<CallFilter>,
        n: usize,
        timeout: Duration,
    ) -> Result<CallLog, CallsError> {
        let filter = filter.into();
        let what = format!("at least {n} call(s) of {filter}");
        self.wait_for(what, move |log| log.count(filter.clone()) >= n, timeout).await
    }

    /// Waits until the kubelet has unprepared the claim with this UID: its last successful
    /// prepare/unprepare call is a `NodeUnprepareResources`. Returns the claim's calls.
    pub async fn wait_unprepared(&self, uid: &str, timeout: Duration) -> Result<ClaimCalls, CallsError> {
        let owned = uid.to_owned();
        let what = format!("a successful NodeUnprepareResources for claim UID {uid}");
        let log = self
            .wait_for(
                what,
                move |log| {
                    let history = ClaimCalls::of(log, &owned);
                    history.unprepared() > 0 && !history.is_prepared()
                },
                timeout,
            )
            .await?;
        Ok(ClaimCalls::of(&log, uid))
    }

    async fn wait_until<F>(self, what: String, condition: F, timeout: Duration) -> Result<(), CallsError>
    where
        F: Fn(&CallLog) -> bool + Send + 'static,
    {
        // Progress reports (of a runner that installed a reporter) name this wait.
        let _waiting = crate::progress::waiting(|| format!("the kubelet's calls: {what}"), Some(timeout));
        let mut changed = self.inner.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changed.borrow_and_update();
            if condition(&self.log()) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `self`, so it cannot be closed; treat it as a timeout
                // anyway rather than spin.
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
                injected_claims: Vec::new(),
                blocked: false,
                started: SystemTime::now(),
                finished: None,
            });
            id
        };
        self.notify();
        id
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

#[cfg(test)]
mod tests;
