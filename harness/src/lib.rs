//! dra-e2e harness: everything a spec uses to test Kubernetes Dynamic Resource Allocation.

pub mod builder;
pub mod calls;
pub mod device_plugin;
pub mod driver;
pub mod framework;
pub mod grpc;
pub mod manifests;
pub mod plugin;
pub mod podexec;
pub mod proxied;
pub mod tunnel;
pub mod wait;
