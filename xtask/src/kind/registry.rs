//! `cluster up --provider kind --registry`: the CNCF distribution registry beside a kind cluster,
//! as kubevirtci's kind providers run one. Images pushed to `localhost:PORT` on the host are
//! pulled by every node as `localhost:PORT/…`.
//!
//! - The registry is a container, `<cluster>-registry`, on kind's Docker network, publishing
//!   `127.0.0.1:PORT` (kubevirtci's port rule: 5000 for kind's default cluster name, 5001 for any
//!   other). Its image is built here from the registry binary the local provider's `--registry`
//!   runs (no registry image is pulled); its configuration and storage are in
//!   `.e2e/kind-<cluster>-registry/`.
//! - Every node's containerd reads `/etc/containerd/certs.d` (a `config_path` patch in the derived
//!   kind configuration, so the cluster must be created with `--registry`), where
//!   `localhost:PORT/hosts.toml` sends pulls to the registry's address on kind's network. The
//!   address, not the container's name: the run's own Docker engine runs without iptables, and
//!   Docker's embedded DNS inside the node containers needs its iptables redirect.
//! - `cluster down` removes the container, its image and its directory.

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{Cmd, host::Tools};
use crate::{
    common::{
        build::{self, Versions, Wanted},
        images,
        layout::Layout,
        registry as shared_registry,
    },
    wait::{Probe, poll_until},
};

/// The port the registry listens on inside its container.
const CONTAINER_PORT: u16 = 5000;
/// Where its configuration is mounted in the container.
const CONFIG_IN_CONTAINER: &str = "/etc/dra-e2e-registry/config.yml";
/// Where its storage is mounted in the container.
const STORAGE_IN_CONTAINER: &str = "/var/lib/registry";
/// The repository of the registry image built here.
const IMAGE_REPOSITORY: &str = "dra-e2e/registry";
/// The label that marks the registry container of a cluster.
const LABEL: &str = "io.dra-e2e.kind-registry";
/// Where the nodes' containerd looks for registry host configurations.
pub const CERTS_DIR: &str = "/etc/containerd/certs.d";
/// containerd's patch that makes it read [`CERTS_DIR`] (kind's own configuration does not).
pub const CONTAINERD_PATCH: &str =
    "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n";
const QUICK: Duration = Duration::from_secs(60);

/// The registry container of kind cluster `cluster` (kubevirtci's name).
pub fn container_name(cluster: &str) -> String {
    format!("{cluster}-registry")
}

/// The host port of the registry of kind cluster `cluster` (kubevirtci's rule).
pub fn port(cluster: &str) -> u16 {
    shared_registry::port_for(cluster)
}

/// The registry's directory (configuration and storage) for kind cluster `cluster`.
pub fn dir(repo: &Path, cluster: &str) -> PathBuf {
    repo.join(".e2e").join(format!("kind-{cluster}-registry"))
}

/// A node's hosts.toml for `localhost:port`: pulls go to `http://ip:5000`.
pub fn hosts_toml(port: u16, ip: &str) -> String {
    format!(
        "# Written by `cargo xtask cluster up --provider kind --registry`: localhost:{port} is the registry container.\nserver = \"http://{ip}:{CONTAINER_PORT}\"\n\n[host.\"http://{ip}:{CONTAINER_PORT}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// `docker run` of the registry container.
pub fn run_cmd(cluster: &str, image: &str, dir: &Path) -> Cmd {
    let config = format!("{}:{CONFIG_IN_CONTAINER}:ro", dir.join("config.yml").display());
    let storage = format!("{}:{STORAGE_IN_CONTAINER}", dir.join("storage").display());
    let publish = format!("127.0.0.1:{}:{CONTAINER_PORT}", port(cluster));
    let label = format!("{LABEL}={cluster}");
    let name = container_name(cluster);
    Cmd::new(
        "docker",
        [
            "run",
            "-d",
            "--name",
            name.as_str(),
            "--label",
            label.as_str(),
            "--network",
            "kind",
            "--publish",
            publish.as_str(),
            "--env",
            "OTEL_TRACES_EXPORTER=none",
            "--volume",
            config.as_str(),
            "--volume",
            storage.as_str(),
            image,
            "serve",
            CONFIG_IN_CONTAINER,
        ],
    )
}

/// `docker rm` of the registry container (with its anonymous volumes).
pub fn remove_cmd(cluster: &str) -> Cmd {
    Cmd::new("docker", ["rm", "-f", "-v", container_name(cluster).as_str()])
}

/// The command that writes `hosts.toml` into `node` (atomically: containerd reads it at every pull).
pub fn write_hosts_cmd(node: &str, port: u16, ip: &str) -> Cmd {
    let dir = format!("{CERTS_DIR}/localhost:{port}");
    let script = format!(
        "mkdir -p '{dir}' && printf '%s' \"$1\" > '{dir}/.hosts.toml.tmp' && mv '{dir}/.hosts.toml.tmp' '{dir}/hosts.toml'"
    );
    Cmd::new("docker", ["exec", node, "sh", "-c", script.as_str(), "sh", hosts_toml(port, ip).as_str()])
}

/// Starts the registry of kind cluster `cluster` (or finds it running) and points every node's
/// containerd at it.
pub async fn ensure(
    tools: &Tools,
    layout: &Layout,
    repo: &Path,
    cluster: &str,
    nodes: &[String],
) -> Result<()> {
    let port = port(cluster);
    let name = container_name(cluster);
    for node in nodes {
        let patched = Cmd::new(
            "docker",
            ["exec", node.as_str(), "grep", "-q", "config_path", "/etc/containerd/config.toml"],
        );
        if tools.output(&patched, QUICK).await.is_err() {
            bail!(
                "kind cluster {cluster:?} was created without --registry (its nodes' containerd does not read {CERTS_DIR}): delete it with `cargo xtask cluster down --provider kind --name {cluster}` and create it with --registry"
            );
        }
    }
    let running = Cmd::new("docker", ["inspect", "--format", "{{.State.Running}}", name.as_str()]);
    let is_running = tools.output(&running, QUICK).await.is_ok_and(|out| out.trim() == "true");
    if !is_running {
        // A stopped or half-made container of an earlier run is replaced.
        let _ = tools.output(&remove_cmd(cluster), QUICK).await;
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!(
                "port {port} on 127.0.0.1, which the registry of kind cluster {cluster:?} needs, is in use by another process; stop it and retry"
            );
        }
        let image = image(tools, layout).await?;
        let dir = dir(repo, cluster);
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage).with_context(|| format!("create {}", storage.display()))?;
        let config = dir.join("config.yml");
        std::fs::write(&config, shared_registry::config(Path::new(STORAGE_IN_CONTAINER), CONTAINER_PORT))
            .with_context(|| format!("write {}", config.display()))?;
        tools.output(&run_cmd(cluster, &image, &dir), QUICK).await.context("start the registry container")?;
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    poll_until(
        &format!("the registry answering GET /v2/ on {addr}"),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async move {
            Ok(match shared_registry::v2_status(addr) {
                Ok(200) => Probe::Done(()),
                Ok(status) => Probe::Pending(format!("HTTP {status}")),
                Err(e) => Probe::Pending(format!("{e:#}")),
            })
        },
    )
    .await?;
    let inspect = Cmd::new(
        "docker",
        ["inspect", "--format", "{{(index .NetworkSettings.Networks \"kind\").IPAddress}}", name.as_str()],
    );
    let ip = tools.output(&inspect, QUICK).await.context("the registry's address on kind's network")?;
    let ip = ip.trim();
    if ip.is_empty() {
        bail!("the registry container {name} has no address on kind's network");
    }
    for node in nodes {
        tools
            .output(&write_hosts_cmd(node, port, ip), QUICK)
            .await
            .with_context(|| format!("point {node}'s containerd at the registry"))?;
    }
    eprintln!(
        "==> registry up: push to localhost:{port}, pods pull localhost:{port}/… (the nodes reach {ip}:{CONTAINER_PORT})"
    );
    Ok(())
}

/// The registry image, built from the registry binary and loaded into Docker unless present.
async fn image(tools: &Tools, layout: &Layout) -> Result<String> {
    let bins = {
        let layout = layout.clone();
        tokio::task::spawn_blocking(move || {
            let versions = Versions::read(&layout)?;
            build::ensure_wanted(&layout, &versions, Wanted::Registry)
        })
        .await
        .context("the build thread panicked")??
    };
    let digest = {
        use sha2::{Digest, Sha256};
        let bytes =
            std::fs::read(bins.registry()).with_context(|| format!("read {}", bins.registry().display()))?;
        hex::encode(&Sha256::digest(&bytes)[..6])
    };
    let tag = format!("{IMAGE_REPOSITORY}:{digest}");
    if tools.output(&super::image_present_cmd(&tag), QUICK).await.is_ok() {
        return Ok(tag);
    }
    let dir = tempfile::tempdir().context("create a directory for the registry image")?;
    let archive = dir.path().join("registry.tar");
    images::write_binary_image(&tag, &bins.registry(), "/registry", &archive)?;
    let load = Cmd::new("docker", [std::ffi::OsStr::new("load"), "--input".as_ref(), archive.as_os_str()]);
    tools.output(&load, Duration::from_secs(5 * 60)).await.context("load the registry image")?;
    Ok(tag)
}

/// Removes the registry of kind cluster `cluster` (container, image, directory), if any.
pub async fn remove(tools: &Tools, repo: &Path, cluster: &str) -> Result<()> {
    let name = container_name(cluster);
    let image = Cmd::new("docker", ["inspect", "--format", "{{.Config.Image}}", name.as_str()]);
    if let Ok(image) = tools.output(&image, QUICK).await {
        tools.output(&remove_cmd(cluster), QUICK).await.with_context(|| format!("remove {name}"))?;
        let image = image.trim();
        if image.starts_with(IMAGE_REPOSITORY) {
            // Another cluster's registry may still use it.
            let _ = tools.output(&Cmd::new("docker", ["image", "rm", image]), QUICK).await;
        }
    }
    let dir = dir(repo, cluster);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("remove {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_follows_kubevirtci_s_names_and_ports() {
        assert_eq!(container_name("kind"), "kind-registry");
        assert_eq!(port("kind"), 5000);
        assert_eq!(port("dra-e2e"), 5001);
        let run = run_cmd("dra-e2e", "dra-e2e/registry:abc", Path::new("/repo/.e2e/kind-dra-e2e-registry"))
            .to_string();
        assert!(run.starts_with("docker run -d --name dra-e2e-registry "), "{run}");
        assert!(run.contains("--network kind --publish 127.0.0.1:5001:5000 "), "{run}");
        assert!(
            run.contains("--volume /repo/.e2e/kind-dra-e2e-registry/storage:/var/lib/registry "),
            "{run}"
        );
        assert!(run.ends_with(" dra-e2e/registry:abc serve /etc/dra-e2e-registry/config.yml"), "{run}");
    }

    #[test]
    fn nodes_pull_localhost_from_the_registry_s_address() {
        let toml = hosts_toml(5001, "172.18.0.9");
        assert!(toml.contains("server = \"http://172.18.0.9:5000\""), "{toml}");
        assert!(toml.contains("capabilities = [\"pull\", \"resolve\"]"), "{toml}");
        let cmd = write_hosts_cmd("n1", 5001, "172.18.0.9");
        assert_eq!(cmd.args[..3], ["exec", "n1", "sh"].map(std::ffi::OsString::from));
        assert!(cmd.to_string().contains("/etc/containerd/certs.d/localhost:5001/hosts.toml"), "{cmd}");
        assert!(CONTAINERD_PATCH.contains(CERTS_DIR));
    }
}
