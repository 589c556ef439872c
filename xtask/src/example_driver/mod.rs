//! `cargo xtask example-driver deploy|remove`: the crate's example DRA driver
//! (`kubelet-plugin/examples/node_driver.rs`) as a DaemonSet on the local cluster's workers,
//! working or broken on purpose (`--break`), with a CDI spec per claim or static CDI devices
//! (`--static-cdi`), optionally with devices of DRA's optional features (`--optional-devices`),
//! for the driver lane of `cargo xtask test`.
//!
//! [`deploy`] builds the binary and its image ([`image`](mod@image)), imports it into every node,
//! applies `manifests/example-driver.yaml` ([`manifest`]) and waits until the driver runs,
//! is registered and has published its slices ([`crate::deployed_driver::readiness`]); [`remove`]
//! deletes it all and waits until it is gone. [`wait_republished`] waits for a node's slice
//! after a kubelet restart.

mod image;
mod manifest;

use std::{path::Path, time::Duration};

use anyhow::Result;

use crate::{
    deployed_driver::{
        self, Deployed,
        readiness::{self, Published},
    },
    kube_api,
    progress::Step,
    repo::repo_root,
};

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
/// The driver as its waits and its removal see it.
pub const DEPLOYED: Deployed = Deployed {
    what: "the example driver",
    driver: DRIVER_NAME,
    namespace: NAMESPACE,
    daemonset: DAEMONSET,
    pod_selector: "app.kubernetes.io/name=example-driver",
};

/// How long the driver's pods have to become ready.
const PODS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the drivers have to register and publish once their pods are ready.
const SLICES_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `remove` waits for each of pods, slices and namespace to be gone.
const GONE_TIMEOUT: Duration = Duration::from_secs(120);

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
    /// Devices of the optional features too (`--optional-devices`): partitions of a shared
    /// counter, a device shared by capacity, a tainted device.
    pub optional_devices: bool,
}

/// [`deploy_with`] the driver working or broken (`brk`), with a CDI spec per claim.
pub async fn deploy(kubeconfig: &Path, brk: Option<Break>) -> Result<()> {
    deploy_with(kubeconfig, Options { brk, ..Options::default() }).await
}

/// Builds and imports the driver's image, applies the manifest with `options`, and waits until
/// the DaemonSet's pods of this deployment are all ready (a redeploy with other options rolls
/// them) and every served node's ResourceSlice was published after its pod started, which the
/// driver does only once the kubelet registered it. On a failed wait, everything is removed
/// again.
pub async fn deploy_with(kubeconfig: &Path, options: Options) -> Result<()> {
    let client = deployed_driver::reachable_client(kubeconfig).await?;
    let (archive, digest) = image::build(&repo_root())?;
    deployed_driver::load(&archive).await?;
    let api_server = deployed_driver::api_server(&client).await?;
    let Options { brk, static_cdi, optional_devices } = options;
    let deployment =
        manifest::Deployment { brk, static_cdi, optional_devices, image_digest: digest.clone(), api_server };
    let mut objects = manifest::objects()?;
    manifest::customize(&mut objects.daemonset, &deployment)?;
    let args = deployed_driver::container_args(&objects.daemonset);
    let flags: Vec<String> = brk
        .map(|b| format!("--break {}", b.as_str()))
        .into_iter()
        .chain(static_cdi.then(|| "--static-cdi".to_string()))
        .chain(optional_devices.then(|| "--optional-devices".to_string()))
        .collect();
    let what = match flags.as_slice() {
        [] => "deploy the example driver".to_string(),
        flags => format!("deploy the example driver with {}", flags.join(" ")),
    };
    let step = Step::start(what);
    manifest::apply_all(&client, &objects).await?;
    let ready = async {
        let served = readiness::daemonset_ready(&client, &DEPLOYED, &args, &digest, PODS_TIMEOUT).await?;
        readiness::slices_published(&client, &DEPLOYED, &served, Published::SincePodStart, SLICES_TIMEOUT)
            .await?;
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
    let client = deployed_driver::reachable_client(kubeconfig).await?;
    let step = Step::start("remove the example driver");
    remove_with(&client).await?;
    step.done();
    Ok(())
}

async fn remove_with(client: &kube::Client) -> Result<()> {
    let objects = manifest::objects()?;
    manifest::delete_all(client, &objects).await?;
    readiness::pods_gone(client, &DEPLOYED, GONE_TIMEOUT).await?;
    readiness::slices_gone(client, &DEPLOYED, GONE_TIMEOUT).await?;
    manifest::delete_rest(client, &objects).await?;
    readiness::namespace_gone(client, &DEPLOYED, GONE_TIMEOUT).await
}

/// Waits until `node` has the driver's ResourceSlice again, e.g. after its kubelet restarted
/// (a starting kubelet deletes its node's slices; the driver publishes its own again). Call it
/// once the kubelet is back: a slice that is there already counts.
pub async fn wait_republished(kubeconfig: &Path, node: &str, timeout: Duration) -> Result<()> {
    let client = kube_api::client_for(kubeconfig).await?;
    readiness::slice_back(&client, &DEPLOYED, node, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaks_are_the_driver_s_flag_values() {
        assert_eq!(Break::SkipUnprepare.as_str(), "skip-unprepare");
        assert_eq!(Break::FailUnprepare.as_str(), "fail-unprepare");
    }
}
