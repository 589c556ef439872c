//! What a spec is: its registration ([`registry`]), its description ([`info`]), what its body gets
//! ([`ctx`]) and returns ([`error`]), its labels and feature gates, and the requirements decided
//! before it creates anything.

pub(crate) mod ctx;
pub(crate) mod error;
pub(crate) mod gate;
pub(crate) mod info;
pub(crate) mod label;
pub(crate) mod registry;
pub(crate) mod requirements;
