//! dra-e2e harness: everything a spec uses to test Kubernetes Dynamic Resource Allocation.

pub mod builder;
pub use kubelet_plugin::{calls, grpc, plugin};
pub use spec_runner as framework;
pub mod device_plugin;
pub mod driver;
pub mod manifests;
pub mod podexec;
pub mod proxied;
pub mod slice_controller;
pub mod suite;
pub mod tunnel;
pub mod wait;
