//! Cluster tests of the harness (`#[ignore]`d; `cargo xtask test` runs them against the local
//! cluster with `DRA_E2E_KUBECONFIG`): the runner against a real API server, the tunnel through
//! real proxy pods and port-forwards, the Driver end to end.

#[path = "../common/mod.rs"]
mod common;
#[path = "../tunnel_support/mod.rs"]
mod tunnel_support;

mod cargo_env;
mod connection_cuts;
mod driver;
mod faults;
mod framework;
mod interposer;
/// The example driver of `kubelet-plugin`, the real driver the interposer tests stand between.
#[path = "../../../kubelet-plugin/examples/node_driver.rs"]
#[allow(dead_code)]
mod node_driver;
mod restart;
mod run;
mod skew;
mod tunnel;
