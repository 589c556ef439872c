//! Guards of injected faults: a fault lasts until its guard is cleared or dropped, so a spec
//! that fails or returns early never leaves a fault behind.

use super::Calls;

/// Keeps a failure or delay from [`Calls::fail`], [`Calls::fail_next`], [`Calls::fail_claim`],
/// [`Calls::fail_claim_next`] or [`Calls::delay`] in effect; [`FaultGuard::clear`] or dropping it
/// removes the fault.
#[derive(Debug)]
pub struct FaultGuard {
    calls: Calls,
    id: Option<u64>,
}

impl FaultGuard {
    pub(crate) fn new(calls: Calls, id: u64) -> Self {
        FaultGuard { calls, id: Some(id) }
    }

    /// A guard of no fault (e.g. "fail the next 0 calls").
    pub(crate) fn none(calls: Calls) -> Self {
        FaultGuard { calls, id: None }
    }

    /// Removes the fault: matching calls from now on are handled normally.
    pub fn clear(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        if let Some(id) = self.id.take() {
            self.calls.remove_fault(id);
        }
    }
}

impl Drop for FaultGuard {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Holds the calls matched by [`Calls::block`] until released or dropped.
#[derive(Debug)]
pub struct BlockGuard {
    calls: Calls,
    id: Option<u64>,
}

impl BlockGuard {
    pub(crate) fn new(calls: Calls, id: u64) -> Self {
        BlockGuard { calls, id: Some(id) }
    }

    /// Lets the held calls (and later ones) proceed.
    pub fn release(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        if let Some(id) = self.id.take() {
            self.calls.release_block(id);
        }
    }
}

impl Drop for BlockGuard {
    fn drop(&mut self) {
        self.remove();
    }
}
