//! The cluster behind a run: the backend trait and its kube-rs implementation, what preflight
//! found, the run's client that outlasts an API server restart, the run's identity and Lease,
//! and the sweep of gone runs' leftovers.

pub(crate) mod artifact_files;
pub(crate) mod backend;
pub(crate) mod credentials;
pub(crate) mod disruptions;
pub(crate) mod holder;
pub(crate) mod kube_backend;
pub(crate) mod leftovers;
pub(crate) mod preflight;
pub(crate) mod reconnect;
pub(crate) mod refusal;
pub(crate) mod resend;
pub(crate) mod run_guard;
pub(crate) mod run_identity;
pub(crate) mod transport;
