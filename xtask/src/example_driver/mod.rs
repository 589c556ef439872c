//! `cargo xtask example-driver deploy|remove`: the crate's example DRA driver
//! (`kubelet-plugin/examples/node_driver.rs`) as a DaemonSet on the local cluster's workers,
//! working or broken on purpose (`--break`), with a CDI spec per claim or static CDI devices
//! (`--static-cdi`), for the driver lane of `cargo xtask test`.
//!
//! [`deploy`] builds the binary and its image ([`image`](mod@image)), imports it into every node,
//! applies `manifests/example-driver.yaml` ([`manifest`]) and waits until the driver runs,
//! is registered and has published its slices ([`readiness`]); [`remove`] deletes it all and
//! waits until it is gone. [`wait_republished`] waits for a node's slice after a kubelet restart.

mod image;
mod manifest;
mod readiness;

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use k8s_openapi::api::{core::v1::Node, discovery::v1::EndpointSlice};
use kube::{Api, Client, api::ListParams};

use crate::{kube_api, progress::Step, repo::repo_root, usage::UsageError};

/// The driver's name: its ResourceSlices' `spec.driver`.
pub const DRIVER_NAME: &str = "example.dra-e2e.test";
/// The DeviceClass of the driver's devices (`device.driver == DRIVER_NAME`).
pub const DEVICE_CLASS: &str = "example.dra-e2e.test";
/// The namespace of the DaemonSet.
pub const NAMESPACE: &str = "dra-example-driver";
/// The DaemonSet.
pub const DAEMONSET: &str = "example-driver";
/// The driver's image, built here and imported into every node (never pulled).
pub const IMAGE: &str = "dra-e2e.local/example-driver:dev";

/// How long the driver's pods have to become ready.
const PODS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the drivers have to register and publish once their pods are ready.
const SLICES_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `remove` waits for each of pods, slices and namespace to be gone.
const GONE_TIMEOUT: Duration = Duration::from_secs(120);
/// The bound of the first request, which tells whether there is a cluster at all.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

/// How the driver is broken on purpose (`--break`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// `NodeUnprepareResources` answers OK but leaves the claim's CDI spec file in place.
    SkipUnprepare,
    /// `NodeUnprepareResources` fails with an error.
    FailUnprepare,
}

impl Break {
    /// The value of the driver's `--break` flag.
    pub fn as_str(self) -> &'static str {
        match self {
            Break::SkipUnprepare => "skip-unprepare",
            Break::FailUnprepare => "fail-unprepare",
        }
    }
}

/// How one deployment of the driver behaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Broken on purpose (`--break`), or working.
    pub brk: Option<Break>,
    /// Static CDI devices (`--static-cdi`): one spec for all of a node's devices, written when
    /// the driver starts, none per claim.
    pub static_cdi: bool,
}

/// The name of `node`'s ResourceSlice, as the driver names it (`<node>-<driver with - for .>`).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{}", DRIVER_NAME.replace('.', "-"))
}

/// A client for `kubeconfig` whose cluster answers; otherwise a usage error in one sentence.
async fn reachable_client(kubeconfig: &Path) -> Result<Client> {
    if !kubeconfig.is_file() {
        return Err(UsageError::new(format!(
            "there is no kubeconfig at {} (is the local cluster up? `cargo xtask cluster up`)",
            kubeconfig.display()
        ))
        .into());
    }
    let client = kube_api::client_for(kubeconfig).await.map_err(|e| UsageError::new(format!("{e:#}")))?;
    let nodes: Api<Node> = Api::all(client.clone());
    match tokio::time::timeout(REACH_TIMEOUT, nodes.list(&ListParams::default().limit(1))).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => {
            Err(UsageError::new(format!("the cluster of {} does not answer: {e}", kubeconfig.display()))
                .into())
        }
        Err(_) => Err(UsageError::new(format!(
            "the cluster of {} does not answer within {REACH_TIMEOUT:?}",
            kubeconfig.display()
        ))
        .into()),
    }
}

/// The API server's address for pods on the host network: the `kubernetes` EndpointSlice's.
async fn api_server(client: &Client) -> Result<(String, u16)> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let list = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .context("read the kubernetes EndpointSlice")?;
    list.items
        .iter()
        .find_map(|slice| {
            let address = slice.endpoints.as_ref()?.first()?.addresses.first()?.clone();
            let ports = slice.ports.as_ref()?;
            let port = ports.iter().find(|p| p.name.as_deref() == Some("https")).or(ports.first())?.port?;
            Some((address, u16::try_from(port).ok()?))
        })
        .context("the kubernetes EndpointSlice in default names no API server address")
}

/// [`deploy_with`] the driver working or broken (`brk`), with a CDI spec per claim.
pub async fn deploy(kubeconfig: &Path, brk: Option<Break>) -> Result<()> {
    deploy_with(kubeconfig, Options { brk, static_cdi: false }).await
}

/// Builds and imports the driver's image, applies the manifest with `options`, and waits until
/// the DaemonSet's pods of this deployment are all ready (a redeploy with other options rolls
/// them) and every served node's ResourceSlice was published after its pod started, which the
/// driver does only once the kubelet registered it. On a failed wait, everything is removed
/// again.
pub async fn deploy_with(kubeconfig: &Path, options: Options) -> Result<()> {
    let client = reachable_client(kubeconfig).await?;
    let (archive, digest) = image::build(&repo_root())?;
    image::load(&archive).await?;
    let Options { brk, static_cdi } = options;
    let deployment = manifest::Deployment {
        brk,
        static_cdi,
        image_digest: digest.clone(),
        api_server: api_server(&client).await?,
    };
    let mut objects = manifest::objects()?;
    manifest::customize(&mut objects.daemonset, &deployment)?;
    let args = objects
        .daemonset
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    let flags: Vec<String> = brk
        .map(|b| format!("--break {}", b.as_str()))
        .into_iter()
        .chain(static_cdi.then(|| "--static-cdi".to_string()))
        .collect();
    let what = match flags.as_slice() {
        [] => "deploy the example driver".to_string(),
        flags => format!("deploy the example driver with {}", flags.join(" ")),
    };
    let step = Step::start(what);
    manifest::apply_all(&client, &objects).await?;
    let ready = async {
        let served = readiness::daemonset_ready(&client, &args, &digest, PODS_TIMEOUT).await?;
        readiness::slices_published(&client, &served, SLICES_TIMEOUT).await?;
        anyhow::Ok(served)
    };
    match ready.await {
        Ok(served) => {
            let nodes: Vec<&str> = served.iter().map(|s| s.node.as_str()).collect();
            step.finish(&format!("{DRIVER_NAME} serves {}", nodes.join(", ")));
            Ok(())
        }
        Err(e) => {
            eprintln!("the example driver did not come up; removing it");
            if let Err(cleanup) = remove_with(&client).await {
                eprintln!("removing it failed too: {cleanup:#}");
            }
            Err(e)
        }
    }
}

/// Deletes the DaemonSet, the DeviceClass, the permissions and the namespace, and waits until the
/// driver's pods, its ResourceSlices and the namespace are gone. Nothing deployed is fine.
pub async fn remove(kubeconfig: &Path) -> Result<()> {
    let client = reachable_client(kubeconfig).await?;
    let step = Step::start("remove the example driver");
    remove_with(&client).await?;
    step.done();
    Ok(())
}

async fn remove_with(client: &Client) -> Result<()> {
    let objects = manifest::objects()?;
    manifest::delete_all(client, &objects).await?;
    readiness::pods_gone(client, GONE_TIMEOUT).await?;
    readiness::slices_gone(client, GONE_TIMEOUT).await?;
    manifest::delete_rest(client, &objects).await?;
    readiness::namespace_gone(client, GONE_TIMEOUT).await
}

/// Waits until `node` has the driver's ResourceSlice again, e.g. after its kubelet restarted
/// (a starting kubelet deletes its node's slices; the driver publishes its own again). Call it
/// once the kubelet is back: a slice that is there already counts.
pub async fn wait_republished(kubeconfig: &Path, node: &str, timeout: Duration) -> Result<()> {
    let client = kube_api::client_for(kubeconfig).await?;
    readiness::slice_back(&client, node, timeout).await
}

/// The local cluster's admin kubeconfig, the default of `--kubeconfig`.
pub fn default_kubeconfig() -> Result<std::path::PathBuf> {
    Ok(crate::common::layout::Layout::from_env(repo_root())?.kubeconfig())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_are_the_driver_s() {
        assert_eq!(slice_name("kind-worker"), "kind-worker-example-dra-e2e-test");
        assert_eq!(Break::SkipUnprepare.as_str(), "skip-unprepare");
        assert_eq!(Break::FailUnprepare.as_str(), "fail-unprepare");
    }
}
