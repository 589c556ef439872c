//! Which specs run: `--focus`, `--skip` and `--label-filter`.

pub(crate) mod label_filter;
pub(crate) mod selection;
