//! The host the kind provider runs on: where it finds docker and kind, and running their
//! commands with timeouts; and the wait for the cluster's nodes.

use super::*;
use crate::usage::UsageError;

/// The sentence for a Docker daemon that does not answer at `address`; `said` is what `docker
/// info` wrote (its first sentence is quoted).
pub fn dead_daemon_sentence(address: &str, said: &str) -> String {
    let line = said.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no answer");
    let first = line.split(". ").next().unwrap_or(line).trim_end_matches('.');
    let said = format!("docker info: {first}");
    format!(
        "the Docker daemon at {address} does not answer ({said}): start it (or, for the run's own engine, \
         `cargo xtask docker down` and `cargo xtask docker up` as root), or point DOCKER_HOST at one that runs."
    )
}

/// Whether every node in `expected` is listed and Ready, and a one-line account of each.
pub fn readiness(listed: &[Node], expected: &[String]) -> (bool, String) {
    let mut all_ready = true;
    let states: Vec<String> = expected
        .iter()
        .map(|name| {
            let state = match listed.iter().find(|node| node.metadata.name.as_deref() == Some(name.as_str()))
            {
                None => "not registered",
                Some(node) if node_is_ready(node) => "Ready",
                Some(_) => "NotReady",
            };
            all_ready &= state == "Ready";
            format!("{name} {state}")
        })
        .collect();
    (all_ready, states.join(", "))
}

/// Waits until every node in `nodes` is registered and Ready.
pub async fn wait_nodes_ready(kubeconfig: &Path, nodes: &[String], timeout: Duration) -> anyhow::Result<()> {
    ensure!(!nodes.is_empty(), "no nodes to wait for");
    let api: Api<Node> = Api::all(client_for(kubeconfig).await?);
    let what = format!("nodes {} to be Ready", nodes.join(", "));
    poll_until(&what, timeout, Duration::from_secs(2), || {
        let api = api.clone();
        async move {
            let listed = api.list(&ListParams::default()).await.context("listing nodes")?;
            Ok(match readiness(&listed.items, nodes) {
                (true, _) => Probe::Done(()),
                (false, seen) => Probe::Pending(seen),
            })
        }
    })
    .await
}

/// Where the provider looks for its tools and files; the tests substitute all of it.
#[derive(Debug, Clone)]
pub(super) struct Host {
    /// The PATH to search for docker, kind and go (and to give them).
    pub(super) path: Option<OsString>,
    /// The repository root (.e2e/ is under it).
    pub(super) repo: PathBuf,
    /// The kind configuration, normally `<repo>/kind.yaml`.
    pub(super) kind_yaml: PathBuf,
    /// dra-e2e's cache, where kind is installed when PATH lacks the wanted version.
    pub(super) cache: PathBuf,
    /// `DOCKER_HOST` for docker and kind: the run's own engine while it runs and the environment
    /// names no other; None leaves the environment's.
    pub(super) docker_host: Option<String>,
}

/// docker and kind, as found on PATH (kind possibly installed into the cache).
#[derive(Debug)]
pub(super) struct Tools {
    pub(super) docker: PathBuf,
    pub(super) kind: PathBuf,
    pub(super) path: Option<OsString>,
    pub(super) docker_host: Option<String>,
    /// The daemon's identity (`ID|DockerRootDir`, from `docker info`).
    pub(super) daemon: String,
}

/// What to install when docker is missing.
const DOCKER: &str = "Docker Engine (https://docs.docker.com/engine/install/)";

impl Host {
    pub(super) fn current() -> Host {
        let repo = crate::repo::repo_root();
        let cache = crate::common::layout::Layout::from_env(repo.clone())
            .map(|layout| layout.cache)
            .unwrap_or_else(|_| repo.join("target").join("dra-e2e-cache"));
        let docker_host = match std::env::var_os("DOCKER_HOST") {
            Some(_) => None,
            None => engine::Engine::from_env().running_docker_host(),
        };
        Host {
            path: std::env::var_os("PATH"),
            kind_yaml: cluster_config::default_path(),
            repo,
            cache,
            docker_host,
        }
    }

    /// Finds docker on PATH, checks that its daemon answers, and finds the kind binary to run
    /// (see [`super::binary`]); a missing docker or a daemon that does not answer is a
    /// [`UsageError`] saying what to do.
    pub(super) async fn tools(
        &self,
        kind_version: Option<&str>,
        kind_from_path: bool,
    ) -> anyhow::Result<Tools> {
        let Some(docker) = find_program("docker", self.path.as_deref()) else {
            return Err(UsageError::new(format!(
                "docker was not found on PATH: the kind provider runs its nodes as Docker containers, so install \
                 {DOCKER}, start the run's own engine with `cargo xtask docker up` (as root on Debian), or use \
                 `--provider local`, which needs no Docker."
            ))
            .into());
        };
        if let Some(host) = &self.docker_host {
            info!("using the run's own Docker engine ({host})");
        }
        let mut tools = Tools {
            docker,
            kind: PathBuf::from("kind"),
            path: self.path.clone(),
            docker_host: self.docker_host.clone(),
            daemon: String::new(),
        };
        tools.daemon = tools.check_docker_daemon().await?;
        tools.kind = binary::resolve(self, kind_version, kind_from_path).await?;
        Ok(tools)
    }
}

/// The first executable file called `name` in the directories of `path`.
pub(super) fn find_program(name: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
pub(super) fn is_executable(path: &Path) -> bool {
    path.is_file()
}

impl Tools {
    pub(super) fn command(&self, cmd: &Cmd) -> tokio::process::Command {
        let program = if cmd.program == "docker" { &self.docker } else { &self.kind };
        let mut command = tokio::process::Command::new(program);
        command.args(&cmd.args).kill_on_drop(true).stdin(Stdio::null());
        if let Some(path) = &self.path {
            command.env("PATH", path);
        }
        if let Some(host) = &self.docker_host {
            command.env("DOCKER_HOST", host);
        }
        command
    }

    /// Runs `cmd` with its output on our stderr (stdout stays for results), within `timeout`.
    pub(super) async fn run(&self, cmd: &Cmd, timeout: Duration) -> anyhow::Result<()> {
        info!("running: {cmd}");
        let mut command = self.command(cmd);
        command.stdout(Stdio::from(std::io::stderr())).stderr(Stdio::inherit());
        let mut child = command.spawn().with_context(|| format!("cannot start `{cmd}`"))?;
        let status = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => status.with_context(|| format!("waiting for `{cmd}`"))?,
            Err(_) => {
                // kill_on_drop stops it when `child` goes out of scope.
                bail!("`{cmd}` did not finish within {timeout:?}; stopped it")
            }
        };
        ensure!(status.success(), "`{cmd}` failed ({status})");
        Ok(())
    }

    /// Runs `cmd` within `timeout` and returns its stdout; its stderr goes into the error.
    pub(super) async fn output(&self, cmd: &Cmd, timeout: Duration) -> anyhow::Result<String> {
        debug!("running: {cmd}");
        let output = tokio::time::timeout(timeout, self.command(cmd).output())
            .await
            .map_err(|_| anyhow::anyhow!("`{cmd}` did not finish within {timeout:?}; stopped it"))?
            .with_context(|| format!("cannot run `{cmd}`"))?;
        ensure!(
            output.status.success(),
            "`{cmd}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The daemon's identity (`ID|DockerRootDir`), or a [`UsageError`] saying that it does not
    /// answer and what to do.
    async fn check_docker_daemon(&self) -> anyhow::Result<String> {
        let cmd = docker_info_cmd();
        debug!("running: {cmd}");
        let said = match tokio::time::timeout(QUICK_TIMEOUT, self.command(&cmd).output()).await {
            Ok(Ok(output)) if output.status.success() => {
                return Ok(String::from_utf8_lossy(&output.stdout).trim().to_string());
            }
            Ok(Ok(output)) => String::from_utf8_lossy(&output.stderr).into_owned(),
            Ok(Err(err)) => return Err(err).with_context(|| format!("cannot run `{cmd}`")),
            Err(_) => format!("no answer within {QUICK_TIMEOUT:?}"),
        };
        Err(UsageError::new(dead_daemon_sentence(&self.daemon_address(), &said)).into())
    }

    /// Where docker looks for its daemon.
    fn daemon_address(&self) -> String {
        self.docker_host
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok())
            .unwrap_or_else(|| "unix:///var/run/docker.sock (docker's default)".into())
    }

    /// Names of every container on the daemon, running or not.
    pub(super) async fn container_names(&self) -> anyhow::Result<Vec<String>> {
        let out = self.output(&container_names_cmd(), QUICK_TIMEOUT).await?;
        Ok(out.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect())
    }

    pub(super) async fn cluster_exists(&self, name: &str) -> anyhow::Result<bool> {
        let out = self.output(&get_clusters_cmd(), QUICK_TIMEOUT).await?;
        Ok(out.lines().any(|line| line.trim() == name))
    }

    pub(super) async fn nodes(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let out = self.output(&get_nodes_cmd(name), QUICK_TIMEOUT).await?;
        Ok(out.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect())
    }

    pub(super) async fn pull_if_missing(&self, image: &str) -> anyhow::Result<()> {
        if self.output(&image_present_cmd(image), QUICK_TIMEOUT).await.is_ok() {
            debug!("{image} is present locally");
            return Ok(());
        }
        self.run(&pull_cmd(image), PULL_TIMEOUT).await
    }

    /// `kind load docker-image`, falling back to a single-platform archive (see [`save_image_cmd`]).
    pub(super) async fn load_image(&self, name: &str, image: &str) -> anyhow::Result<()> {
        let Err(err) = self.run(&load_image_cmd(name, image), LOAD_TIMEOUT).await else {
            return Ok(());
        };
        let Some(platform) = docker_platform() else {
            return Err(err);
        };
        warn!("{err:#}; retrying through a {platform} image archive (kubernetes-sigs/kind#3795)");
        let dir = tempfile::tempdir().context("cannot create a temporary directory for the image archive")?;
        let archive = dir.path().join("image.tar");
        self.run(&save_image_cmd(image, platform, &archive), LOAD_TIMEOUT)
            .await
            .with_context(|| format!("loading {image} into kind cluster {name:?} failed: {err:#}"))?;
        self.run(&load_archive_cmd(name, &archive), LOAD_TIMEOUT).await
    }
}
