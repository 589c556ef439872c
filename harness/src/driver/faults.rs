//! The faults a spec injects into a node's plugin, with the error built for it: whole calls fail
//! with `Unknown: injected error` ([`INJECTED_CALL_ERROR`], upstream's `Fail`), single claims of
//! an answer with [`INJECTED_CLAIM_ERROR`]. Each returns the guard of
//! [`Calls`](crate::calls::Calls): the fault lasts until the guard is cleared or dropped, and
//! whatever is still injected when the spec's cleanup starts is cleared. A status of the spec's
//! own choosing, delays and blocks: `driver.calls(node).fail(filter, GrpcStatus::…)`,
//! `.fail_next(..)`, `.fail_claim(filter, "error")`, `.delay(..)`, `.block(..)`.
//!
//! ```no_run
//! # fn f(driver: harness::driver::Driver) {
//! use harness::calls::Method;
//! let node = &driver.node_names()[0];
//! let _first_fails = driver.fail_next(node, Method::NodePrepareResources, 1);
//! let _claim_fails = driver.fail_claim(node, Method::NodeUnprepareResources.for_claim_uid("uid"));
//! # }
//! ```

use super::Driver;
use crate::calls::{CallFilter, FaultGuard, GrpcStatus};

/// The message of the `Unknown` status of [`Driver::fail`] and [`Driver::fail_next`].
pub const INJECTED_CALL_ERROR: &str = "injected error";
/// The per-claim error of [`Driver::fail_claim`] and [`Driver::fail_claim_next`]; the kubelet
/// quotes it in its errors and events.
pub const INJECTED_CLAIM_ERROR: &str = "injected per-claim error";

fn injected_status() -> GrpcStatus {
    GrpcStatus::unknown(INJECTED_CALL_ERROR)
}

impl Driver {
    /// Fails every call on `node` that `filter` matches with `Unknown: injected error`
    /// (upstream's `Fail(method, true)`) until the guard is cleared or dropped.
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail(&self, node: &str, filter: impl Into<CallFilter>) -> FaultGuard {
        self.calls(node).fail(filter, injected_status())
    }

    /// Fails the next `n` calls on `node` that `filter` matches with `Unknown: injected error`
    /// (fewer if the guard goes first).
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_next(&self, node: &str, filter: impl Into<CallFilter>, n: u64) -> FaultGuard {
        self.calls(node).fail_next(filter, n, injected_status())
    }

    /// Fails the claims `filter` matches (usually one: `Method::NodePrepareResources
    /// .for_claim_uid(uid)`) in every prepare or unprepare call on `node`, with the per-claim
    /// error [`INJECTED_CLAIM_ERROR`] in an answer that otherwise succeeds, until the guard is
    /// cleared or dropped.
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_claim(&self, node: &str, filter: impl Into<CallFilter>) -> FaultGuard {
        self.calls(node).fail_claim(filter, INJECTED_CLAIM_ERROR)
    }

    /// Like [`Driver::fail_claim`], for the next `n` matching claim answers only.
    #[must_use = "dropping the guard stops the failures at once"]
    pub fn fail_claim_next(&self, node: &str, filter: impl Into<CallFilter>, n: u64) -> FaultGuard {
        self.calls(node).fail_claim_next(filter, n, INJECTED_CLAIM_ERROR)
    }
}
