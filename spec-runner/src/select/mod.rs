//! Which specs run: `--focus`, `--skip`, `--label-filter`, `--rerun-failed`, and the share of
//! `--partition`.

pub(crate) mod balance;
pub(crate) mod label_filter;
pub(crate) mod partition;
pub(crate) mod rerun;
pub(crate) mod selection;
