//! `cargo xtask upstream-driver deploy|remove`: upstream's own DRA test driver
//! (k8s.io/kubernetes test/e2e/dra/test-driver, the driver kubernetes/enhancements#5970 validates
//! its conformance suite against) as a DaemonSet on the local cluster's workers, for the driver
//! lane of `cargo xtask test`: dra-e2e's `--driver` specs proven against a driver nobody here
//! wrote.
//!
//! [`deploy`] builds the driver at the cluster's version from the cluster's own Go module
//! ([`build`](mod@build)), packs the static binary into an image and imports it into every node,
//! applies upstream's plugin permissions and our DaemonSet and DeviceClass ([`manifest`]), and
//! waits until every worker runs it, its ResourceSlices are published and each kubelet
//! registered it ([`registration`]); [`remove`] deletes it all and waits until it is gone.
//! What it shares with the example driver is [`crate::deployed_driver`].

mod build;
mod manifest;
mod registration;

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};

use crate::{
    common::{build::Versions, images, kube_version::KubeVersion, layout::Layout},
    deployed_driver::{
        self, Deployed,
        readiness::{self, Published},
    },
    gomod,
    progress::Step,
    repo::repo_root,
    usage::UsageError,
};

/// The driver's name: upstream's default (`--drivername`), its ResourceSlices' `spec.driver`.
pub const DRIVER_NAME: &str = "test-driver.cdi.k8s.io";
/// The DeviceClass of its devices (`device.driver == DRIVER_NAME`).
pub const DEVICE_CLASS: &str = "test-driver.cdi.k8s.io";
/// The namespace of the DaemonSet and upstream's ServiceAccount.
pub const NAMESPACE: &str = "dra-upstream-test-driver";
/// The DaemonSet's container.
const CONTAINER: &str = "kubelet-plugin";
/// The driver's image, built here and imported into every node (never pulled); its tag is the
/// cluster's Kubernetes version.
const IMAGE_REPOSITORY: &str = "dra-e2e.local/dra-test-driver";
/// The driver as its waits and its removal see it.
pub const DEPLOYED: Deployed = Deployed {
    what: "upstream's test driver",
    driver: DRIVER_NAME,
    namespace: NAMESPACE,
    daemonset: "upstream-test-driver",
    pod_selector: "app.kubernetes.io/name=upstream-test-driver",
};

/// How long the driver's pods have to become ready.
const PODS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the drivers have to publish their slices once their pods are ready.
const SLICES_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the kubelets have to register the drivers once they published.
const REGISTERED_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `remove` waits for each of pods, slices and namespace to be gone.
const GONE_TIMEOUT: Duration = Duration::from_secs(120);

/// The Kubernetes version the cluster's API server reports, as a release of the Go module.
async fn cluster_version(client: &kube::Client) -> Result<KubeVersion> {
    let info = client.apiserver_version().await.context("read the cluster's /version")?;
    Ok(module_version(&info.git_version)?)
}

/// The k8s.io/kubernetes module version of a cluster whose `/version` says `git_version`; a
/// build of a checkout (build metadata, `-dirty`) is a usage error in one sentence.
fn module_version(git_version: &str) -> Result<KubeVersion, UsageError> {
    KubeVersion::parse_tag(git_version).map_err(|e| {
        UsageError::new(format!(
            "the cluster runs Kubernetes {git_version} ({e}); upstream's test driver is built from a released k8s.io/kubernetes module of the cluster's version"
        ))
    })
}

/// The driver's image for `versions`, written as a Docker archive.
#[derive(Debug, Clone)]
pub struct Image {
    /// Its name, `dra-e2e.local/dra-test-driver:<version>`.
    pub name: String,
    /// The Docker archive.
    pub archive: std::path::PathBuf,
    /// The archive's sha256 (the pods' image annotation).
    pub digest: String,
}

/// The image name of the driver built at `version`.
pub fn image_name(version: &KubeVersion) -> String {
    format!("{IMAGE_REPOSITORY}:{version}")
}

/// Builds the driver for `versions` (or takes it from the cache) and writes its image archive.
fn build_image(layout: &Layout, versions: &Versions) -> Result<Image> {
    let binary = build::ensure(layout, versions)?;
    let dir = layout.images();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let archive = dir.join("dra-test-driver.tar");
    let name = image_name(&versions.kubernetes);
    let entrypoint = format!("/{}", build::BINARY);
    images::write_binary_image(&name, &binary, &entrypoint, &archive)?;
    let digest = deployed_driver::archive_digest(&archive)?;
    Ok(Image { name, archive, digest })
}

/// `cargo xtask upstream-driver build`: the driver and its image at the local cluster's
/// configured Kubernetes version, without a cluster (what `deploy` does before it imports).
pub fn build() -> Result<Image> {
    let layout = Layout::from_env(repo_root())?;
    let versions = Versions::read(&layout)?;
    let image = build_image(&layout, &versions)?;
    println!("{} {} sha256:{}", image.name, image.archive.display(), image.digest);
    Ok(image)
}

/// Builds upstream's driver at the cluster's version and imports its image; returns the image
/// and upstream's permissions text of that version.
async fn image(client: &kube::Client) -> Result<(Image, String)> {
    let layout = Layout::from_env(repo_root())?;
    let version = cluster_version(client).await?;
    let versions = Versions::for_cluster(&layout, Some(&version), None)?;
    let image = build_image(&layout, &versions)?;
    let module = gomod::download(&versions.kubernetes)
        .with_context(|| format!("find k8s.io/kubernetes@{} in the Go module cache", versions.kubernetes))?;
    let permissions = manifest::read_permissions(&module.dir)?;
    deployed_driver::load(&image.archive).await?;
    Ok((image, permissions))
}

/// Builds and imports the driver's image, applies upstream's permissions and our manifest, and
/// waits until the DaemonSet's pods of this deployment are all ready, every served node has a
/// ResourceSlice of the driver, and every kubelet registered it. On a failed wait, everything
/// is removed again.
pub async fn deploy(kubeconfig: &Path) -> Result<()> {
    let client = deployed_driver::reachable_client(kubeconfig).await?;
    let (image, permissions) = image(&client).await?;
    let digest = image.digest.as_str();
    let mut objects = manifest::objects(&permissions)?;
    let api_server = deployed_driver::api_server(&client).await?;
    manifest::customize(&mut objects.daemonset, &image.name, digest, &api_server)?;
    let args = deployed_driver::container_args(&objects.daemonset);
    let step = Step::start(format!("deploy upstream's test driver ({})", image.name));
    let ready = async {
        manifest::apply_all(&client, &objects).await?;
        let served = readiness::daemonset_ready(&client, &DEPLOYED, &args, digest, PODS_TIMEOUT).await?;
        readiness::slices_published(&client, &DEPLOYED, &served, Published::Any, SLICES_TIMEOUT).await?;
        registration::registered(&client, &served, REGISTERED_TIMEOUT).await?;
        anyhow::Ok(served)
    };
    match ready.await {
        Ok(served) => {
            let nodes: Vec<&str> = served.iter().map(|s| s.node.as_str()).collect();
            step.finish(&format!("{DRIVER_NAME} registered and published on {}", nodes.join(", ")));
            Ok(())
        }
        Err(e) => {
            eprintln!("upstream's test driver did not come up; removing it");
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
    let step = Step::start("remove upstream's test driver");
    remove_with(&client).await?;
    step.done();
    Ok(())
}

async fn remove_with(client: &kube::Client) -> Result<()> {
    manifest::delete_driver(client).await?;
    readiness::pods_gone(client, &DEPLOYED, GONE_TIMEOUT).await?;
    readiness::slices_gone(client, &DEPLOYED, GONE_TIMEOUT).await?;
    manifest::delete_rest(client).await?;
    readiness::namespace_gone(client, &DEPLOYED, GONE_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_version_is_the_cluster_s_release() {
        assert_eq!(module_version("v1.37.2").unwrap().to_string(), "v1.37.2");
        assert_eq!(module_version("v1.38.0-beta.0").unwrap().to_string(), "v1.38.0-beta.0");
        let err = module_version("v1.37.2+abc123").unwrap_err().to_string();
        assert!(err.starts_with("the cluster runs Kubernetes v1.37.2+abc123 ("), "{err}");
        assert!(err.ends_with("a released k8s.io/kubernetes module of the cluster's version"), "{err}");
        assert!(module_version("garbage").is_err());
        assert_eq!(image_name(&module_version("v1.37.2").unwrap()), "dra-e2e.local/dra-test-driver:v1.37.2");
    }
}
