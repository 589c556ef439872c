//! `cluster build --provider kind`: a kind node image built on this machine from the same Go
//! builds the local cluster runs, with every image kubeadm and the suites need preloaded, so no
//! node ever pulls.
//!
//! 1. The local cluster's binaries plus kubeadm, kube-proxy, CoreDNS, crictl and the CNI plugins
//!    ([`mod@crate::common::build`], `Wanted::Kind`).
//! 2. A root filesystem ([`rootfs`]): Debian bookworm from debootstrap, kind's base files from the
//!    `sigs.k8s.io/kind` module, our binaries; written as one tar.
//! 3. Image archives: kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and etcd
//!    share one layer, the node's own root filesystem (the multi-call binary answers to each
//!    component's name, kube-proxy finds iptables there); CoreDNS alone with its binary; the four
//!    images of [`crate::common::images::test_archives`].
//! 4. `docker import` of the tar, a container from it in which containerd imports every archive
//!    into its `k8s.io` namespace (content only, pinned, as `kind build node-image` does), then
//!    `docker commit` with kind's entrypoint, environment and stop signal.
//!
//! The tag is `dra-e2e/kind-node:<version>-<hash>`; the hash covers the binaries' cache key,
//! kind's base files, the package list and this builder's own source, so an image with that tag
//! is current and is not built again.

pub mod rootfs;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};
use tracing::info;

use super::{Cmd, host::Tools};
use crate::{
    common::{
        build::{self, Versions, Wanted},
        images::{self, SharedLayerImage},
        kube_version::KubeVersion,
        layout::Layout,
    },
    progress::Step,
};

/// The repository of the images this builder tags.
pub const REPOSITORY: &str = "dra-e2e/kind-node";
/// kind's entrypoint and init, as its base image runs them.
const ENTRYPOINT: &str = r#"ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]"#;
/// The node's environment, as kind's base image has it (Debian's PATH, `container=docker`).
const ENV: &str = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin container=docker";
const DOCKER_TIMEOUT: Duration = Duration::from_secs(10 * 60);
const QUICK: Duration = Duration::from_secs(60);
/// How long the build container's containerd may take to answer.
const CONTAINERD_READY: Duration = Duration::from_secs(60);

/// Where kind's base files are: `sigs.k8s.io/kind@<version>/images/base/files` in Go's module
/// cache (`go mod download` fetches the module if it is missing).
pub async fn kind_base_files(kind_version: &str) -> Result<PathBuf> {
    let module = format!("sigs.k8s.io/kind@{kind_version}");
    let mut cmd = tokio::process::Command::new("go");
    cmd.args(["mod", "download", "-json", &module]).env("GOFLAGS", "-mod=mod");
    let out = tokio::time::timeout(Duration::from_secs(5 * 60), cmd.kill_on_drop(true).output())
        .await
        .with_context(|| format!("`go mod download {module}` did not finish within 5 minutes"))?
        .context("run go mod download")?;
    ensure!(
        out.status.success(),
        "go mod download {module} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("go mod download -json output")?;
    let dir = info["Dir"].as_str().context("go mod download names no Dir")?;
    let files = Path::new(dir).join("images/base/files");
    ensure!(files.is_dir(), "{dir} has no images/base/files");
    Ok(files)
}

/// A node image this builder made (or found with its tag).
#[derive(Debug, Clone)]
pub struct NodeImage {
    /// `dra-e2e/kind-node:<version>-<hash>`.
    pub tag: String,
    /// The feature gates its kubelet takes (another release than the pinned one may have removed
    /// or locked some of kind.yaml's).
    pub known_gates: Vec<String>,
}

/// Which Kubernetes a node image is built from: the pinned release, another release, or a
/// checkout (as `cluster up --k8s-version` / `--k8s-source` of the local provider).
#[derive(Debug, Clone, Copy, Default)]
pub struct Kubernetes<'a> {
    /// A release tag (`v1.38.0-beta.0`).
    pub release: Option<&'a KubeVersion>,
    /// A Kubernetes checkout.
    pub source: Option<&'a Path>,
}

/// Builds the node image unless an image with its tag exists.
pub async fn ensure(
    tools: &Tools,
    layout: &Layout,
    kind_version: &str,
    k8s: Kubernetes<'_>,
) -> Result<NodeImage> {
    let versions = {
        let (layout, release, source) = (layout.clone(), k8s.release.cloned(), k8s.source.map(PathBuf::from));
        tokio::task::spawn_blocking(move || {
            Versions::for_cluster(&layout, release.as_ref(), source.as_deref())
        })
        .await
        .context("the module thread panicked")??
    };
    let bins = {
        let (layout, versions) = (layout.clone(), versions.clone());
        tokio::task::spawn_blocking(move || build::ensure_wanted(&layout, &versions, Wanted::Kind))
            .await
            .context("the build thread panicked")??
    };
    let kind_files = kind_base_files(kind_version).await?;
    let tag = format!("{REPOSITORY}:{}-{}", versions.kubernetes, input_hash(&bins.dir, &kind_files)?);
    let image = NodeImage { tag: tag.clone(), known_gates: build::known_gates(&bins)? };
    if tools.output(&super::image_present_cmd(&tag), QUICK).await.is_ok() {
        Step::start(format!("kind node image {tag}")).finish("cached");
        return Ok(image);
    }
    let started = Instant::now();
    let cache = layout.cache.join("kind-image");
    std::fs::create_dir_all(&cache).with_context(|| format!("create {}", cache.display()))?;
    let work = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(&cache)
        .with_context(|| format!("create a build directory in {}", cache.display()))?;

    let step = Step::start(format!("debootstrap {} (cold: a few minutes)", rootfs::SUITE));
    let base = rootfs::debootstrap(&cache).await?;
    step.done();
    let step = Step::start("assemble the node's root filesystem");
    let staging = work.path().join("rootfs");
    let kubernetes = versions.kubernetes.to_string();
    rootfs::assemble(&base, &staging, &kind_files, &bins, &kubernetes).await?;
    let rootfs_tar = work.path().join("rootfs.tar");
    let mut tar = tokio::process::Command::new("tar");
    tar.arg("-C").arg(&staging).args(["--numeric-owner", "-cf"]).arg(&rootfs_tar).arg(".");
    run_logged(tar, "tar the root filesystem", DOCKER_TIMEOUT).await?;
    rootfs::remove_tree(&staging)?;
    step.done();

    let step = Step::start("write the images kubeadm and the suites need");
    let archives_dir = work.path().join("images");
    let archives = write_archives(&bins, &kubernetes, &rootfs_tar, &archives_dir).await?;
    step.done();

    let step = Step::start(format!("docker import, preload the images, docker commit {tag}"));
    let base_tag = format!("{REPOSITORY}-base:{}", tag.rsplit(':').next().unwrap_or("latest"));
    tools.run(&import_cmd(&rootfs_tar, &base_tag), DOCKER_TIMEOUT).await?;
    let result = preload_and_commit(tools, &base_tag, &archives_dir, &archives, &tag).await;
    let untag = tools.output(&Cmd::new("docker", ["image", "rm", base_tag.as_str()]), QUICK).await;
    result?;
    untag.with_context(|| format!("remove the intermediate image {base_tag}"))?;
    step.done();
    eprintln!("==> kind node image {tag} built in {}", crate::progress::human(started.elapsed()));
    Ok(image)
}

/// The image archives of the node, as (file name in `dir`, what it holds).
async fn write_archives(
    bins: &build::Binaries,
    version: &str,
    rootfs_tar: &Path,
    dir: &Path,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let wanted = kubeadm_images(bins, version).await?;
    let mut shared = Vec::new();
    let mut coredns = None;
    for image in &wanted {
        let repo = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
        match repo.rsplit('/').next().unwrap_or(repo) {
            "kube-apiserver" | "kube-controller-manager" | "kube-scheduler" | "etcd" => {
                shared.push(SharedLayerImage { name: image.clone(), entrypoint: vec![] })
            }
            "kube-proxy" => shared.push(SharedLayerImage {
                name: image.clone(),
                entrypoint: vec!["/usr/local/bin/kube-proxy".into()],
            }),
            "coredns" => coredns = Some(image.clone()),
            "pause" if image == images::PAUSE => {}
            other => bail!("kubeadm wants {image} ({other}), which this builder does not make"),
        }
    }
    ensure!(shared.len() == 5, "kubeadm names {} control-plane images, not 5: {wanted:?}", shared.len());
    let coredns = coredns.context("kubeadm names no CoreDNS image")?;
    let mut names = vec!["kube.tar".to_string(), "coredns.tar".to_string()];
    let (layer, kube_archive) = (rootfs_tar.to_path_buf(), dir.join("kube.tar"));
    tokio::task::spawn_blocking(move || images::write_shared_layer_archive(&kube_archive, &layer, &shared))
        .await
        .context("the archive thread panicked")??;
    images::write_binary_image(&coredns, &bins.coredns(), "/coredns", &dir.join("coredns.tar"))?;
    for (archive, _) in images::test_archives(bins, dir)? {
        names.push(archive.file_name().context("archive without name")?.to_string_lossy().into_owned());
    }
    Ok(names)
}

/// What `kubeadm config images list` of the built kubeadm names for `version`.
async fn kubeadm_images(bins: &build::Binaries, version: &str) -> Result<Vec<String>> {
    let mut cmd = tokio::process::Command::new(bins.kubeadm());
    cmd.args(["config", "images", "list", "--kubernetes-version", version]).kill_on_drop(true);
    let out = tokio::time::timeout(QUICK, cmd.output())
        .await
        .context("`kubeadm config images list` did not finish within 60 s")?
        .context("run kubeadm config images list")?;
    ensure!(
        out.status.success(),
        "kubeadm config images list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Runs a container from `base`, imports every archive into its containerd, stops containerd
/// and commits the container as `tag`; the container is removed whatever happens.
async fn preload_and_commit(
    tools: &Tools,
    base: &str,
    dir: &Path,
    archives: &[String],
    tag: &str,
) -> Result<()> {
    let name = format!("dra-e2e-kind-build-{}", std::process::id());
    let mount = format!("{}:/dra-e2e-images:ro", dir.display());
    // The container's stop signal goes into the committed image (neither `docker import` nor
    // `docker commit` takes a STOPSIGNAL change): systemd stops on SIGRTMIN+3.
    let run = Cmd::new(
        "docker",
        [
            "run",
            "-d",
            "--name",
            &name,
            "--entrypoint",
            "sleep",
            "--stop-signal",
            "SIGRTMIN+3",
            "--security-opt",
            "seccomp=unconfined",
            "--volume",
            &mount,
            base,
            "infinity",
        ],
    );
    let result = async {
        tools.output(&run, QUICK).await?;
        preload(tools, &name, archives).await?;
        let commit = Cmd::new(
            "docker",
            ["commit", "--change", ENTRYPOINT, "--change", "CMD []", "--change", ENV, &name, tag],
        );
        tools.output(&commit, DOCKER_TIMEOUT).await.map(drop)
    }
    .await;
    let removed = tools.output(&Cmd::new("docker", ["rm", "-f", "-v", name.as_str()]), QUICK).await;
    result?;
    removed.with_context(|| format!("remove the build container {name}"))?;
    Ok(())
}

async fn preload(tools: &Tools, container: &str, archives: &[String]) -> Result<()> {
    let exec = |args: &[&str]| {
        let mut all = vec!["exec", container];
        all.extend_from_slice(args);
        Cmd::new("docker", all)
    };
    tools.output(&Cmd::new("docker", ["exec", "-d", container, "containerd"]), QUICK).await?;
    crate::wait::poll_until(
        "the build container's containerd to answer",
        CONTAINERD_READY,
        Duration::from_millis(500),
        || async {
            Ok(match tools.output(&exec(&["ctr", "version"]), QUICK).await {
                Ok(_) => crate::wait::Probe::Done(()),
                Err(e) => crate::wait::Probe::Pending(format!("{e:#}")),
            })
        },
    )
    .await?;
    for archive in archives {
        let path = format!("/dra-e2e-images/{archive}");
        let import = exec(&[
            "ctr",
            "--namespace=k8s.io",
            "images",
            "import",
            "--label=io.cri-containerd.pinned=pinned",
            "--all-platforms",
            "--no-unpack",
            "--digests",
            &path,
        ]);
        tools.output(&import, DOCKER_TIMEOUT).await.with_context(|| format!("preload {archive}"))?;
    }
    let listed = tools.output(&exec(&["ctr", "--namespace=k8s.io", "images", "list", "-q"]), QUICK).await?;
    info!("images in the node image:\n{listed}");
    tools.output(&exec(&["pkill", "-x", "containerd"]), QUICK).await?;
    crate::wait::poll_until(
        "the build container's containerd to exit",
        CONTAINERD_READY,
        Duration::from_millis(500),
        || async {
            Ok(match tools.output(&exec(&["pgrep", "-x", "containerd"]), QUICK).await {
                Err(_) => crate::wait::Probe::Done(()),
                Ok(pid) => crate::wait::Probe::Pending(format!("containerd still runs as {}", pid.trim())),
            })
        },
    )
    .await?;
    Ok(())
}

/// `docker import` of the root filesystem with kind's entrypoint and environment.
fn import_cmd(rootfs_tar: &Path, tag: &str) -> Cmd {
    let mut args: Vec<std::ffi::OsString> = vec!["import".into()];
    for change in [ENTRYPOINT, ENV] {
        args.extend(["--change".into(), change.into()]);
    }
    args.extend([rootfs_tar.as_os_str().to_owned(), tag.into()]);
    Cmd::new("docker", args)
}

/// The hash of everything the image is made of.
fn input_hash(bins_dir: &Path, kind_files: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(bins_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    hasher.update(rootfs::PACKAGES.join(","));
    hasher.update(include_str!("mod.rs"));
    hasher.update(include_str!("rootfs.rs"));
    hasher.update(include_str!("../../common/images.rs"));
    let mut files = Vec::new();
    collect_files(kind_files, &mut files)?;
    files.sort();
    for file in files {
        hasher.update(file.strip_prefix(kind_files).unwrap_or(&file).to_string_lossy().as_bytes());
        hasher.update(std::fs::read(&file).with_context(|| format!("read {}", file.display()))?);
    }
    Ok(hex::encode(&hasher.finalize()[..6]))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Runs a long command with its output on our stderr, within `timeout` (killed after it).
pub(crate) async fn run_logged(
    mut cmd: tokio::process::Command,
    what: &str,
    timeout: Duration,
) -> Result<()> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn().with_context(|| format!("cannot start {what}"))?;
    let status = tokio::time::timeout(timeout, child.wait())
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not finish within {timeout:?}; stopped it"))?
        .with_context(|| format!("waiting for {what}"))?;
    ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}
