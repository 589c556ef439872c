//! What a spec needs, in one import: `use harness::prelude::*;`.
//!
//! The spec's context and results ([`Ctx`], [`SpecResult`], [`Skip`], [`Registry`]), the test
//! driver ([`Driver`], [`DriverConfig`], [`Nodes`], [`resources`]), the object builder
//! ([`Builder`]), the call-assertion API ([`Method`], [`DraApi`], [`HealthApi`], [`Calls`],
//! [`CallLog`], [`ClaimCalls`] with [`ClaimCall`] and [`ClaimOutcome`], the fault guards,
//! [`INJECTED_CLAIM_ERROR`], [`UNPREPARE_TIMEOUT`]) and the waits
//! ([`wait`], [`Verdict`]).
//!
//! ```
//! use harness::prelude::*;
//!
//! async fn spec(ctx: Ctx) -> SpecResult {
//!     let nodes = Nodes::select(&ctx, 1, 1).await?;
//!     let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::network(1, false))).await?;
//!     driver.calls(&nodes.names()[0]).expect_none(Method::NodePrepareResources)?;
//!     Ok(())
//! }
//! let mut registry = Registry::new();
//! registry.it("registers and prepares nothing", spec);
//! ```

pub use crate::{
    builder::{Builder, POD_DELETE_TIMEOUT, POD_START_TIMEOUT},
    calls::{
        BlockGuard, CallFilter, CallLog, Calls, CallsError, ClaimCall, ClaimCalls, ClaimOutcome, DraApi,
        FaultGuard, HealthApi, Method, UNPREPARE_TIMEOUT,
    },
    driver::{Driver, DriverConfig, INJECTED_CLAIM_ERROR, Nodes, resources},
    framework::{Ctx, Label, Registry, Skip, SpecResult},
    wait::{self, Verdict},
};
