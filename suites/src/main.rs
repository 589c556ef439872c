//! `dra-e2e`: runs the DRA specs against a cluster.
fn main() {}
