//! Injected faults: failures (of whole calls, or of single claims in an answer), delays and
//! blocks, each kept in effect by a guard ([`FaultGuard`], [`BlockGuard`]); and what the layer and
//! a DRA handler ask before they answer ([`Admission`], [`ClaimFaults`]).

use std::time::Duration;

use tokio::sync::watch;

use super::{BlockGuard, CallFilter, Calls, ClaimRef, FaultGuard};

/// What an injected fault does.
#[derive(Clone, Debug)]
enum FaultKind {
    /// Fail `remaining` calls or claim answers (None = every one).
    Fail { failure: Failure, remaining: Option<u64> },
    /// Sleep before handling.
    Delay(Duration),
}

/// What an injected failure fails.
#[derive(Clone, Debug)]
enum Failure {
    /// The whole call, with this status, before its handler runs.
    Call(tonic::Status),
    /// The answer for one claim, with this per-claim error, where the handler builds it.
    Claim(String),
}

/// One injected failure or delay, until its guard goes.
#[derive(Debug)]
pub(super) struct Fault {
    id: u64,
    filter: CallFilter,
    kind: FaultKind,
}

/// One block of calls, until its guard goes.
#[derive(Debug)]
pub(super) struct Block {
    id: u64,
    filter: CallFilter,
    /// Dropped on release; held calls wait for the channel to close.
    release: watch::Sender<()>,
}

/// What the layer must do with a call before running the handler.
pub(crate) struct Admission {
    /// Held calls wait until all of these are closed.
    pub blocks: Vec<watch::Receiver<()>>,
    /// Total delay.
    pub delay: Duration,
}

/// The per-claim faults of one call, as the handler that answers it sees them: the
/// [`CallsLayer`](super::CallsLayer) puts one in every request's extensions, and a DRA handler
/// asks it, claim by claim, whether to answer with an injected per-claim error instead of doing
/// the work ([`Calls::fail_claim`]). Requests that did not come through the layer have none.
#[derive(Clone, Debug)]
pub struct ClaimFaults {
    calls: Calls,
    id: u64,
    method: String,
}

impl ClaimFaults {
    pub(crate) fn new(calls: Calls, id: u64, method: String) -> Self {
        ClaimFaults { calls, id, method }
    }

    /// The faults of a request that came through the layer.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&ClaimFaults> {
        request.extensions().get::<ClaimFaults>()
    }

    /// The per-claim error to answer for this claim, if an injected fault matches it (consumes
    /// one of [`Calls::fail_claim_next`]); recorded on the call
    /// ([`CallRecord::injected_claims`](super::CallRecord::injected_claims)).
    pub fn take(&self, claim: &ClaimRef) -> Option<String> {
        self.calls.take_claim_failure(self.id, &self.method, claim)
    }
}

impl Calls {
    /// Fails every matching call with `status` until the guard is cleared or dropped (upstream's
    /// `Fail(method, true)` … `Fail(method, false)`).
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail(&self, filter: impl Into<CallFilter>, status: tonic::Status) -> FaultGuard {
        self.add_failure(filter.into(), Failure::Call(status), None)
    }

    /// Fails the next `n` matching calls with `status` (fewer if the guard goes first).
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_next(&self, filter: impl Into<CallFilter>, n: u64, status: tonic::Status) -> FaultGuard {
        self.add_failure(filter.into(), Failure::Call(status), Some(n))
    }

    /// Fails claims, not calls: every matching `NodePrepareResources` / `NodeUnprepareResources`
    /// call succeeds, but its answer for each claim the filter matches (every claim of the call
    /// when the filter names none) carries `error` as the claim's per-claim `error`, and the
    /// plugin leaves that claim as it was (not prepared, or not unprepared). Lasts until the
    /// guard is cleared or dropped. Each injected claim error is recorded
    /// ([`CallRecord::injected_claims`](super::CallRecord::injected_claims),
    /// [`ClaimCall::injected`](super::ClaimCall::injected)).
    ///
    /// The plugin's own DRA service applies it where it builds its answer; a plugin in forward
    /// mode answers the matching claims itself and forwards only the call's other claims.
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_claim(&self, filter: impl Into<CallFilter>, error: impl Into<String>) -> FaultGuard {
        self.add_failure(filter.into(), Failure::Claim(error.into()), None)
    }

    /// Like [`Calls::fail_claim`], for the next `n` matching claim answers only (fewer if the
    /// guard goes first).
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_claim_next(
        &self,
        filter: impl Into<CallFilter>,
        n: u64,
        error: impl Into<String>,
    ) -> FaultGuard {
        self.add_failure(filter.into(), Failure::Claim(error.into()), Some(n))
    }

    fn add_failure(&self, filter: CallFilter, failure: Failure, remaining: Option<u64>) -> FaultGuard {
        if remaining == Some(0) {
            return FaultGuard::none(self.clone());
        }
        self.add_fault(filter, FaultKind::Fail { failure, remaining })
    }

    /// Delays every matching call by `delay` before it is handled, until the guard is cleared
    /// or dropped.
    #[must_use = "dropping the guard stops the delays at once"]
    pub fn delay(&self, filter: impl Into<CallFilter>, delay: Duration) -> FaultGuard {
        self.add_fault(filter.into(), FaultKind::Delay(delay))
    }

    fn add_fault(&self, filter: CallFilter, kind: FaultKind) -> FaultGuard {
        tracing::debug!(scope = %self.inner.scope, %filter, ?kind, "injecting fault");
        let mut state = self.state();
        state.next_fault += 1;
        let id = state.next_fault;
        state.faults.push(Fault { id, filter, kind });
        FaultGuard::new(self.clone(), id)
    }

    pub(crate) fn remove_fault(&self, id: u64) {
        self.state().faults.retain(|f| f.id != id);
    }

    /// Holds every matching call that arrives from now on before its handler runs, until the
    /// returned guard is released or dropped. Other calls are not affected.
    #[must_use = "dropping the guard releases the block at once"]
    pub fn block(&self, filter: impl Into<CallFilter>) -> BlockGuard {
        let filter = filter.into();
        let mut state = self.state();
        state.next_fault += 1;
        let id = state.next_fault;
        tracing::debug!(scope = %self.inner.scope, %filter, "blocking calls");
        state.blocks.push(Block { id, filter, release: watch::Sender::new(()) });
        BlockGuard::new(self.clone(), id)
    }

    pub(crate) fn release_block(&self, id: u64) {
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

    /// Removes every failure and delay and releases every block, whoever holds their guards
    /// (their guards then do nothing). The Driver does this when a spec's cleanup starts.
    pub fn clear_all(&self) {
        let released = {
            let mut state = self.state();
            state.faults.clear();
            std::mem::take(&mut state.blocks)
        };
        if !released.is_empty() {
            self.notify();
        }
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
        match self.take(method, claims, |f| matches!(f, Failure::Call(_)))? {
            Failure::Call(status) => Some(status),
            Failure::Claim(_) => None,
        }
    }

    /// The injected per-claim error for one claim of a call, if any (consumes one of "fail
    /// next N"), recorded on the call with this id.
    pub(crate) fn take_claim_failure(&self, id: u64, method: &str, claim: &ClaimRef) -> Option<String> {
        let error =
            match self.take(method, std::slice::from_ref(claim), |f| matches!(f, Failure::Claim(_)))? {
                Failure::Claim(error) => error,
                Failure::Call(_) => return None,
            };
        tracing::debug!(%method, claim = %claim.name, uid = %claim.uid, %error, "injecting per-claim failure");
        self.update_call(id, |record| record.injected_claims.push(claim.uid.clone()));
        Some(error)
    }

    /// The first failure of the kind `wanted` picks that matches the call, consumed.
    fn take(&self, method: &str, claims: &[ClaimRef], wanted: impl Fn(&Failure) -> bool) -> Option<Failure> {
        let mut state = self.state();
        let index = state.faults.iter().position(|f| {
            f.filter.matches(method, claims)
                && matches!(&f.kind, FaultKind::Fail { failure, .. } if wanted(failure))
        })?;
        let fault = state.faults.get_mut(index)?;
        let FaultKind::Fail { failure, remaining } = &mut fault.kind else {
            return None;
        };
        let failure = failure.clone();
        if let Some(n) = remaining {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.faults.remove(index);
            }
        }
        Some(failure)
    }
}
