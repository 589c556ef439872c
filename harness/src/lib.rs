//! dra-e2e harness: everything a spec uses to test Kubernetes Dynamic Resource Allocation.

pub mod calls;
pub mod framework;
pub mod grpc;
pub mod plugin;
pub mod proxied;
