//! Requirements decided before a spec creates anything: what a spec (or its container) declares
//! with [`SpecHandle::requires`](crate::SpecHandle::requires) or
//! [`Registry::requires`](crate::Registry::requires), and what its labels say
//! (`KubeletMinVersion:1.34`, upstream's `WithKubeletMinVersion`). The runner checks them before
//! the spec's namespace exists, so a spec the cluster cannot run is skipped in well under a
//! second instead of creating and deleting a namespace (about 5 s). Helpers that a requirement
//! and a spec's body both need (node selection, reading feature gates) take a
//! [`ClusterAccess`], which both a [`Precheck`] and a [`Ctx`](crate::Ctx) are.

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;

use crate::{
    cluster::preflight::{ClusterInfo, kubelet_min_version},
    report::outcome::{FailureKind, Outcome},
    run::monitor,
    spec::error::{SpecError, SpecResult},
    spec::info::SpecInfo,
};

/// How long a spec's requirements may take to decide.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// What a requirement can look at: the admin client (read what you need, create nothing), what
/// preflight found, and the spec's labels.
#[derive(Clone)]
pub struct Precheck {
    client: kube::Client,
    cluster: Arc<ClusterInfo>,
    labels: Arc<[String]>,
}

/// What a spec's body ([`Ctx`](crate::Ctx)) and its requirements ([`Precheck`]) can both read,
/// so that one helper (node selection, a feature gate's state) serves both.
pub trait ClusterAccess {
    /// The admin client, for reads.
    fn client(&self) -> &kube::Client;
    /// What preflight found: API versions, nodes, kubelet and server versions.
    fn cluster(&self) -> &ClusterInfo;
    /// The spec's labels (inherited ones included).
    fn labels(&self) -> &[String];
}

impl ClusterAccess for Precheck {
    fn client(&self) -> &kube::Client {
        Precheck::client(self)
    }

    fn cluster(&self) -> &ClusterInfo {
        Precheck::cluster(self)
    }

    fn labels(&self) -> &[String] {
        Precheck::labels(self)
    }
}

impl Precheck {
    pub(crate) fn new(client: kube::Client, cluster: Arc<ClusterInfo>, labels: &[String]) -> Self {
        Self { client, cluster, labels: labels.into() }
    }

    /// The admin client, for reads (nodes' allocatable resources, feature gates, ...).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// What preflight found: API versions, nodes, kubelet and server versions.
    pub fn cluster(&self) -> &ClusterInfo {
        &self.cluster
    }

    /// The spec's labels (inherited ones included), as [`Ctx::labels`](crate::Ctx::labels) has
    /// them: what decides `KubeletMinVersion` for node selection.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }
}

/// A requirement: `Ok` to run the spec, a skip ([`SpecError::skip`]) to skip it with that
/// reason, any other error fails it (as a set-up failure) without running its body.
pub(crate) type Requirement = Arc<dyn Fn(Precheck) -> BoxFuture<'static, SpecResult> + Send + Sync>;

/// What the labels require: the highest `KubeletMinVersion:X` (upstream's
/// `WithKubeletMinVersion`) met by some ready schedulable node, which node selection then picks.
fn label_requirements(info: &SpecInfo, cluster: &ClusterInfo) -> SpecResult {
    match kubelet_min_version(info.labels()).and_then(|min| cluster.kubelet_min_version_skip(min)) {
        Some(reason) => Err(SpecError::skip(reason)),
        None => Ok(()),
    }
}

/// Checks a spec's requirements: `None` to run it, else its outcome (skipped, or failed when a
/// requirement could not be decided).
pub(crate) async fn check(info: &SpecInfo, requirements: &[Requirement], pre: Precheck) -> Option<Outcome> {
    let result = async {
        label_requirements(info, pre.cluster())?;
        for requirement in requirements {
            let _waiting = monitor::waiting("the spec's requirements to be decided", Some(CHECK_TIMEOUT));
            match tokio::time::timeout(CHECK_TIMEOUT, requirement(pre.clone())).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(SpecError::fail(format!(
                        "deciding the spec's requirements took longer than {}",
                        crate::duration::display(CHECK_TIMEOUT)
                    )));
                }
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => None,
        Err(e) => match e.skip_reason() {
            Some(reason) => Some(Outcome::Skipped { reason: reason.to_owned() }),
            None => Some(Outcome::failed(
                FailureKind::Setup,
                format!("cannot decide the spec's requirements: {e}"),
            )),
        },
    }
}
