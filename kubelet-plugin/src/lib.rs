//! The DRA kubelet plugin that dra-e2e serves in the test process, with its gRPC APIs and the
//! recording of every call the kubelet makes.
//!
//! - [`grpc`]: the kubelet plugin APIs (DRA v1 and v1beta1, device health v1alpha1 and v1,
//!   plugin registration), generated from `proto/` (written from the wire tables).
//! - [`plugin`]: registration, `NodePrepareResources` / `NodeUnprepareResources` with CDI specs,
//!   device health streams, served on any connection stream.
//! - [`calls`]: the tower layer that records each call and injects faults, and the one API to
//!   count, assert on and wait for the recorded calls.
//! - [`progress`]: the hook through which a test runner names the waits of [`calls`].
//!
//! The plugin knows nothing of clusters or proxies: it reads claims through a [`plugin::ClaimSource`]
//! source and writes CDI files through [`plugin::FileOps`]; `harness` connects it to a proxy pod.

pub mod calls;
pub mod grpc;
pub mod plugin;
pub mod progress;
