//! Restarting one of the local cluster's components while the cluster runs
//! (`cargo xtask cluster restart COMPONENT`): what a node reboot or an upgrade does to a kubelet,
//! or a control-plane upgrade to the API server, so that a run can be tried against it. The
//! component is stopped (SIGTERM, then SIGKILL after the grace; or killed at once, as a crash
//! does: `--kill`, [`Stop::Kill`]) and started again as it was
//! started; the command returns once it serves again: a kubelet once it renewed its node's Lease
//! after the old one was gone and the node is Ready without a not-ready taint, the API server
//! once `/readyz` says ok.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::{api::coordination::v1::Lease, api::core::v1::Node, jiff::Timestamp};
use kube::{Api, Client};

use super::{LocalCluster, probes, start::node_untainted_ready, wait};
use crate::progress::Step;

/// How long a restarted component gets to serve again.
const SERVE_AGAIN: Duration = Duration::from_secs(120);
/// How long a component gets to stop on SIGTERM before it is killed.
const GRACE: Duration = Duration::from_secs(15);

/// How a restarted component is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM, SIGKILL after the grace period (an upgrade, a reboot).
    Graceful,
    /// SIGKILL at once (a crash, an OOM kill): no connection is closed cleanly.
    Kill,
}

impl LocalCluster {
    /// Restarts the supervised component `name` (`kubelet-kind-worker`, `kube-apiserver`,
    /// `containerd-kind-worker`…), stopped as `stop` says, and waits until it serves again.
    pub async fn restart(&self, name: &str, stop: Stop) -> Result<()> {
        let spec = self.sup.spec(name)?;
        let node = self.nodes.iter().find(|n| n.kubelet() == name);
        let how = if stop == Stop::Kill { " (killed)" } else { "" };
        let step = Step::start(format!("restart {name}{how}"));
        self.sup.stop(name, if stop == Stop::Kill { Duration::ZERO } else { GRACE })?;
        // The old process is gone: a Lease renewed from now on is the new one's.
        let stopped = Timestamp::now();
        self.sup.start(&spec)?;
        if let Some(node) = node {
            let client = self.admin_client().await?;
            wait::until(
                &format!(
                    "the restarted kubelet to renew node {}'s Lease, and the node Ready without a not-ready taint",
                    node.name
                ),
                SERVE_AGAIN,
                Some((&self.sup, name)),
                || kubelet_back(client.clone(), node.name.clone(), stopped),
            )
            .await?;
        } else if name == "kube-apiserver" {
            let kubeconfig = self.kubeconfig();
            wait::until("ready (/readyz)", SERVE_AGAIN, Some((&self.sup, name)), || {
                probes::readyz(kubeconfig.clone())
            })
            .await?;
        }
        step.done();
        Ok(())
    }
}

/// Whether node `name`'s kubelet renewed its Lease after `stopped` (microseconds, unlike the
/// node's heartbeat times) and the node is Ready without a not-ready taint.
async fn kubelet_back(client: Client, name: String, stopped: Timestamp) -> Result<bool> {
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .get_opt(&name)
        .await
        .with_context(|| format!("read the Lease of node {name}"))?;
    let renewed = lease.and_then(|l| l.spec?.renew_time).is_some_and(|t| t.0 > stopped);
    if !renewed {
        return Ok(false);
    }
    let node = Api::<Node>::all(client).get_opt(&name).await.with_context(|| format!("read node {name}"))?;
    Ok(node.is_some_and(|n| node_untainted_ready(&n)))
}

/// `cluster restart COMPONENT --provider local`.
pub async fn restart(name: &str, stop: Stop) -> Result<()> {
    let cluster = LocalCluster::new(None)?;
    // A component that died is restarted too: only a cluster that was never started (or was
    // taken down) has nothing to restart.
    if cluster.sup.recorded().is_empty() {
        anyhow::bail!("the local cluster does not run: start it with `cargo xtask cluster up`");
    }
    cluster.restart(name, stop).await
}
