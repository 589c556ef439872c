//! The run's own Docker engine: a dockerd that `cargo xtask` starts, with its own data root, exec
//! root, pidfile and socket, for the kind provider on machines without a usable Docker.
//!
//! `cargo xtask docker up` (or [`Engine::start`]) finds dockerd (as root on Debian it installs
//! `docker.io` with apt-get if there is none, and says so), cleans up after an earlier engine that
//! was killed, starts dockerd detached with the paths of [`EngineLayout`] and no changes to the
//! host's network, waits until `docker info` answers on its socket and records its PID. Where root
//! lacks a capability a privileged container asks for, containers run through the capability
//! shim ([`shim`]). docker and kind reach the engine through `DOCKER_HOST=unix://<socket>`, which
//! the kind provider sets by itself while the engine runs ([`Engine::running_docker_host`]).
//! `docker down` (or [`Engine::stop`]) stops dockerd by its recorded PID (SIGTERM, SIGKILL after a
//! grace period) and removes every process, mount, cgroup, bridge and socket it left
//! ([`cleanup`]); the data root (images) stays unless purged.

pub mod caps;
pub mod cleanup;
pub mod install;
pub mod layout;
pub mod shim;

use std::{fs, io::Write, os::fd::AsFd, path::Path, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};
pub use layout::EngineLayout;
use tracing::{info, warn};

use crate::{
    common::process::{ProcessSpec, Supervisor, is_alive},
    progress::Step,
    usage::UsageError,
    wait::{Probe, poll_until},
};

/// The name of dockerd's PID record and log.
const DOCKERD: &str = "dockerd";
/// How long dockerd may take until `docker info` answers (a first start initialises the data root).
pub const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long dockerd gets after SIGTERM (it stops its containers first, within its 15 s shutdown timeout)
/// before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(45);
/// How long a command waits for another one holding the engine's lock.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// `docker info` and other quick questions to the daemon.
const QUICK_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether containers run through the capability shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapShim {
    /// Only where root lacks a capability that privileged containers ask for.
    #[default]
    Auto,
    /// Never (privileged containers then fail where root lacks a capability).
    Off,
}

/// `cargo xtask docker …`: what to do with the run's own engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DockerAction {
    /// Start the run's own dockerd (idempotent) and print its DOCKER_HOST.
    Up {
        /// Whether containers run through the capability shim (`--cap-shim`).
        cap_shim: CapShim,
    },
    /// Stop it by its recorded PID and remove every process, mount and socket it left.
    Down {
        /// Also remove the data root, logs and shim (`--purge`).
        purge: bool,
    },
    /// Say whether it runs, and what an engine that died left behind.
    Status,
}

/// An engine that answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// dockerd's PID.
    pub pid: i32,
    /// What docker and kind get as `DOCKER_HOST`.
    pub docker_host: String,
    /// dockerd's version.
    pub version: String,
    /// Whether this call started it (false: it was already running).
    pub started: bool,
}

/// The run's own Docker engine, at one [`EngineLayout`].
#[derive(Debug, Clone)]
pub struct Engine {
    layout: EngineLayout,
    sup: Supervisor,
}

impl Engine {
    /// The engine at the layout the environment asks for.
    pub fn from_env() -> Self {
        Self::new(EngineLayout::from_env())
    }

    /// The engine at `layout`.
    pub fn new(layout: EngineLayout) -> Self {
        let sup = Supervisor::new(layout.pids(), layout.logs());
        Self { layout, sup }
    }

    /// `DOCKER_HOST` for the engine if its recorded dockerd runs, else None (the kind provider
    /// then uses whatever Docker the environment names).
    pub fn running_docker_host(&self) -> Option<String> {
        (self.sup.is_running(DOCKERD) && self.layout.socket().exists()).then(|| self.layout.docker_host())
    }

    /// Starts the engine, or returns the one that runs. See the module documentation.
    pub async fn start(&self, cap_shim: CapShim) -> Result<Running> {
        let dockerd = install::ensure_dockerd().await?;
        require_root("docker up")?;
        let docker = install::find("docker").context(
            "dockerd is installed but the docker command is not (Debian: apt-get install docker.io)",
        )?;
        let runc = install::find("runc")
            .context("dockerd is installed but runc is not (Debian: apt-get install runc)")?;
        let _lock = self.lock().await?;

        if let Some(record) = self.sup.record(DOCKERD).filter(|r| is_alive(*r)) {
            let version = self.wait_answering(&docker).await.map_err(|err| {
                UsageError::new(format!(
                    "the engine's dockerd (pid {}) runs but does not answer on {} ({err:#}): stop it with `cargo xtask \
                     docker down` and start it again.",
                    record.pid,
                    self.layout.docker_host()
                ))
            })?;
            info!("the engine already runs (dockerd pid {}, {})", record.pid, self.layout.docker_host());
            return Ok(Running {
                pid: record.pid,
                docker_host: self.layout.docker_host(),
                version,
                started: false,
            });
        }
        let stale = cleanup::leftovers(&self.layout);
        if !stale.is_empty() || self.sup.record(DOCKERD).is_some() {
            warn!("an earlier engine is gone but left: {}; cleaning up", describe(&stale));
            let problems = cleanup::remove(&self.layout, Some(&runc)).await;
            self.sup.stop(DOCKERD, Duration::ZERO).context("remove the stale PID record")?;
            if !problems.is_empty() {
                bail!("cannot clean up after the earlier engine: {}", problems.join("; "));
            }
        }

        let missing = match cap_shim {
            CapShim::Auto => caps::missing()?,
            CapShim::Off => Vec::new(),
        };
        let shim_path = if missing.is_empty() {
            None
        } else {
            info!(
                "root lacks {}, which privileged containers ask for: containers run through the capability shim",
                missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            );
            Some(shim::install(&self.layout.shim_dir(), &runc, &missing)?)
        };
        for dir in [&self.layout.state, &self.layout.run] {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        // Our own configuration file, so that /etc/docker/daemon.json (if any) is not read.
        fs::write(self.layout.config_file(), layout::daemon_json(&self.layout))
            .with_context(|| format!("write {}", self.layout.config_file().display()))?;

        let step = Step::start(format!("start dockerd ({})", self.layout.docker_host()));
        let spec = ProcessSpec {
            name: DOCKERD.into(),
            program: dockerd,
            args: layout::dockerd_args(&self.layout, shim_path.as_deref())
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            env: vec![("PATH".into(), install::search_path().to_string_lossy().into_owned())],
        };
        let record = self.sup.start(&spec)?;
        match self.wait_answering(&docker).await {
            Ok(version) => {
                step.done();
                Ok(Running {
                    pid: record.pid,
                    docker_host: self.layout.docker_host(),
                    version,
                    started: true,
                })
            }
            Err(err) => {
                step.finish("failed");
                let failure = self.sup.failure(DOCKERD, "did not answer `docker info`");
                let _ = self.stop_locked(&runc).await;
                Err(failure.context(format!("{err:#}")))
            }
        }
    }

    /// Stops the engine and removes what it left; with `purge`, its state too. Nothing to stop is
    /// fine; anything that could not be removed is an error listing it.
    pub async fn stop(&self, purge: bool) -> Result<()> {
        require_root("docker down")?;
        let runc = install::find("runc");
        let _lock = self.lock().await?;
        let mut problems = self.stop_locked_opt(runc.as_deref()).await;
        if purge && problems.is_empty() {
            match fs::remove_dir_all(&self.layout.state) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => problems.push(format!("remove {}: {err}", self.layout.state.display())),
            }
        }
        if !problems.is_empty() {
            bail!("the engine could not be removed completely:\n  {}", problems.join("\n  "));
        }
        Ok(())
    }

    async fn stop_locked(&self, runc: &Path) -> Vec<String> {
        self.stop_locked_opt(Some(runc)).await
    }

    async fn stop_locked_opt(&self, runc: Option<&Path>) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(record) = self.sup.record(DOCKERD).filter(|r| is_alive(*r)) {
            let step = Step::start(format!("stop dockerd (pid {})", record.pid));
            match self.sup.stop(DOCKERD, STOP_GRACE) {
                Ok(()) => {
                    step.done();
                }
                Err(err) => {
                    step.finish("failed");
                    problems.push(format!("{err:#}"));
                }
            }
        } else if let Err(err) = self.sup.stop(DOCKERD, Duration::ZERO) {
            problems.push(format!("{err:#}"));
        }
        problems.extend(cleanup::remove(&self.layout, runc).await);
        problems.extend(cleanup::leftovers(&self.layout));
        problems
    }

    /// What `docker status` prints; whether the engine runs and answers.
    pub async fn status(&self, out: &mut dyn Write) -> Result<bool> {
        let record = self.sup.record(DOCKERD);
        let mut lines = Vec::new();
        let running = match record.filter(|r| is_alive(*r)) {
            Some(record) => {
                let answer = match install::find("docker") {
                    Some(docker) => self.docker_info(&docker).await,
                    None => Err(anyhow::anyhow!("the docker command is not installed")),
                };
                match answer {
                    Ok(version) => {
                        lines.push(format!(
                            "dockerd {version}: runs (pid {}), DOCKER_HOST={}",
                            record.pid,
                            self.layout.docker_host()
                        ));
                        true
                    }
                    Err(err) => {
                        lines
                            .push(format!("dockerd: runs (pid {}) but does not answer: {err:#}", record.pid));
                        false
                    }
                }
            }
            None => {
                lines.push("dockerd: not running (start it with `cargo xtask docker up`)".into());
                false
            }
        };
        let shim = self.layout.shim_dir().join(shim::RUNTIME_NAME);
        if running && shim.exists() {
            lines.push(format!("runtime: the capability shim {}", shim.display()));
        }
        if !running {
            let left = cleanup::leftovers(&self.layout);
            if !left.is_empty() {
                lines.push(format!(
                    "left by an engine that is gone (`cargo xtask docker down` removes it): {}",
                    describe(&left)
                ));
            }
        }
        lines.push(format!("log: {}", self.sup.log_path(DOCKERD).display()));
        for line in lines {
            writeln!(out, "{line}").context("cannot write to stdout")?;
        }
        Ok(running)
    }

    /// `docker info` on the engine's socket: the server version.
    async fn docker_info(&self, docker: &Path) -> Result<String> {
        let mut command = tokio::process::Command::new(docker);
        command
            .args(["--host", &self.layout.docker_host(), "info", "--format", "{{.ServerVersion}}"])
            .env_remove("DOCKER_CONTEXT")
            .kill_on_drop(true);
        let output = tokio::time::timeout(QUICK_TIMEOUT, command.output())
            .await
            .map_err(|_| anyhow::anyhow!("`docker info` did not answer within {QUICK_TIMEOUT:?}"))?
            .with_context(|| format!("cannot run {}", docker.display()))?;
        if !output.status.success() {
            bail!("{}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// Waits until `docker info` answers; stops early if the recorded dockerd exits.
    async fn wait_answering(&self, docker: &Path) -> Result<String> {
        let what = format!("dockerd to answer `docker info` on {}", self.layout.docker_host());
        poll_until(&what, START_TIMEOUT, Duration::from_millis(500), || async move {
            if !self.sup.is_running(DOCKERD) {
                return Ok(Probe::Abort(format!(
                    "dockerd exited; see {}",
                    self.sup.log_path(DOCKERD).display()
                )));
            }
            Ok(match self.docker_info(docker).await {
                Ok(version) => Probe::Done(version),
                Err(err) => Probe::Pending(format!("{err:#}")),
            })
        })
        .await
    }

    /// The engine's lock, held until the returned file is dropped.
    async fn lock(&self) -> Result<fs::File> {
        let path = self.layout.lock_file();
        fs::create_dir_all(&self.layout.state)
            .with_context(|| format!("create {}", self.layout.state.display()))?;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        let what = format!("another `cargo xtask docker` command to release {}", path.display());
        poll_until(&what, LOCK_TIMEOUT, Duration::from_millis(200), || async {
            Ok(match rustix::fs::flock(file.as_fd(), rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => Probe::Done(()),
                Err(err) => Probe::Pending(format!("locked ({err})")),
            })
        })
        .await?;
        Ok(file)
    }
}

fn describe(items: &[String]) -> String {
    if items.is_empty() { "only its PID record".into() } else { items.join(", ") }
}

fn require_root(command: &str) -> Result<()> {
    if rustix::process::geteuid().is_root() {
        return Ok(());
    }
    Err(UsageError::new(format!(
        "the run's own Docker engine needs root: run `cargo xtask {command}` as root (for example with sudo -E), or \
         point DOCKER_HOST at a Docker daemon you may use."
    ))
    .into())
}

/// Runs `cargo xtask docker …`.
pub async fn run(action: DockerAction) -> Result<ExitCode> {
    let engine = Engine::from_env();
    match action {
        DockerAction::Up { cap_shim } => {
            let running = engine.start(cap_shim).await?;
            println!("{}", running.docker_host);
            Ok(ExitCode::SUCCESS)
        }
        DockerAction::Down { purge } => {
            engine.stop(purge).await?;
            Ok(ExitCode::SUCCESS)
        }
        DockerAction::Status => {
            let running = engine.status(&mut std::io::stdout()).await?;
            Ok(if running { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
