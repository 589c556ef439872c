//! dra-e2e harness: everything a spec uses to test Kubernetes Dynamic Resource Allocation.
//!
//! The DRA test driver (proxy pods, tunnels, in-process plugins per node: [`driver`]), the
//! object builder ([`builder`]) and the waits ([`wait`]), over two focused crates it re-exports:
//! `kubelet-plugin` ([`calls`], [`grpc`], [`plugin`]: the plugin and the call-assertion API) and
//! `spec-runner` ([`framework`]: registry, selection, parallel runner, reports).
//! [`prelude`] holds what a spec needs in one import; `suites/README.md` shows how to write one.

pub mod builder;
pub use kubelet_plugin::{calls, grpc, plugin};
pub use spec_runner as framework;
pub mod device_plugin;
pub mod driver;
pub mod interposer;
pub mod manifests;
pub mod podexec;
pub mod prelude;
pub mod proxied;
pub mod slice_controller;
pub mod suite;
pub mod tunnel;
pub mod wait;
