//! What both providers build from (the floor under `local/` and `kind/`, which never import each
//! other): the cache and state layout, process supervision, the Go builds of Kubernetes and their
//! module, the images built here (with the shared libraries a linked binary needs) and the registry's
//! helpers.

pub(crate) mod build;
pub(crate) mod go_retry;
pub(crate) mod images;
pub(crate) mod kube_module;
pub(crate) mod kube_version;
pub(crate) mod layout;
#[cfg(test)]
pub(crate) mod own_process;
pub(crate) mod process;
pub(crate) mod registry;
pub(crate) mod shared_libs;
