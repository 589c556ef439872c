//! The host the kind provider runs on: where it finds docker and kind, and running their
//! commands with timeouts; and the wait for the cluster's nodes.

use super::*;
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

/// Where the provider looks for its tools and files; the tests substitute both.
#[derive(Debug, Clone)]
pub(super) struct Host {
    /// The PATH to search for docker and kind (and to give them).
    pub(super) path: Option<OsString>,
    /// The repository root (.e2e/ is under it).
    pub(super) repo: PathBuf,
    /// The kind configuration, normally `<repo>/kind.yaml`.
    pub(super) kind_yaml: PathBuf,
}

/// docker and kind, as found on PATH.
#[derive(Debug)]
pub(super) struct Tools {
    pub(super) docker: PathBuf,
    pub(super) kind: PathBuf,
    pub(super) path: Option<OsString>,
}

impl Host {
    pub(super) fn current() -> Host {
        Host {
            path: std::env::var_os("PATH"),
            repo: crate::repo::repo_root(),
            kind_yaml: cluster_config::default_path(),
        }
    }

    /// Finds docker and kind on PATH; if one is missing, says in one sentence what to install.
    pub(super) fn tools(&self) -> anyhow::Result<Tools> {
        let path = self.path.as_deref();
        let docker = find_program("docker", path);
        let kind = find_program("kind", path);
        const DOCKER: &str = "Docker Engine (https://docs.docker.com/engine/install/)";
        let kind_install = format!("`go install sigs.k8s.io/kind@{KIND_VERSION}`");
        match (docker, kind) {
            (Some(docker), Some(kind)) => Ok(Tools { docker, kind, path: self.path.clone() }),
            (None, None) => bail!(
                "docker and kind were not found on PATH: install {DOCKER} and kind ({kind_install}), \
                 or use `--provider local`, which needs neither."
            ),
            (None, Some(_)) => bail!(
                "docker was not found on PATH: the kind provider runs its nodes as Docker containers, so install \
                 {DOCKER} or use `--provider local`, which needs no Docker."
            ),
            (Some(_), None) => bail!(
                "kind was not found on PATH: install it with {kind_install} (and put $(go env GOPATH)/bin on PATH) \
                 or see https://kind.sigs.k8s.io/docs/user/quick-start/#installation."
            ),
        }
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

    /// Fails with a clear sentence if the Docker daemon does not answer.
    pub(super) async fn check_docker_daemon(&self) -> anyhow::Result<()> {
        let version = self.output(&docker_info_cmd(), QUICK_TIMEOUT).await.with_context(|| {
            format!(
                "docker is installed ({}) but its daemon does not answer; start Docker and make sure your user may use it",
                self.docker.display()
            )
        })?;
        debug!("docker server version {}", version.trim());
        Ok(())
    }

    /// Checks `kind version` against `expected` (an error on mismatch) or, if unset, against
    /// [`KIND_VERSION`] (a warning).
    pub(super) async fn check_kind_version(&self, expected: Option<&str>) -> anyhow::Result<()> {
        let out = self.output(&kind_version_cmd(), QUICK_TIMEOUT).await?;
        let found = parse_kind_version(&out)
            .with_context(|| format!("cannot read the version in `kind version` output {out:?}"))?;
        match expected {
            Some(expected) if !same_version(found, expected) => bail!(
                "kind {found} is on PATH ({}) but {expected} is required (--kind-version / KIND_VERSION); \
                 install it with `go install sigs.k8s.io/kind@v{}`",
                self.kind.display(),
                expected.trim().trim_start_matches('v')
            ),
            Some(_) => {}
            None if !same_version(found, KIND_VERSION) => {
                warn!("kind {found} is on PATH; this project is tested with kind {KIND_VERSION}")
            }
            None => {}
        }
        info!("using kind {found} ({})", self.kind.display());
        Ok(())
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
