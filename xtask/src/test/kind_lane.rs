//! The kind lane of `cargo xtask test` (also alone: `cargo xtask test --lane kind`, what the
//! e2e-kind workflow runs): a four-node kind cluster from kind.yaml, with the node image built here
//! (or `KIND_NODE_IMAGE`), the cluster tests that do not depend on the provider, every kubelet spec
//! (`--focus kubelet`, `-p 4` as on the local cluster), then the cluster deleted, and nothing of it may be left: no container, no
//! `kind` network, no kubeconfig. The run's own Docker engine is started unless `DOCKER_HOST`
//! names one, and stopped again if this lane started it.
//!
//! In CI's run the lane is prepared as soon as the local cluster is up: the engine starts and the
//! node image is built in the background ([`Prebuild`], at the lowest CPU priority) while the
//! local cluster's lanes run, which mostly wait on the cluster; on a cold machine that takes the
//! image build (~15 min) off the run's critical path.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process_group};

use super::{cargo, run_suite, suite_args};
use crate::{
    kind::{self, engine::Engine},
    provider::Provider,
};

/// The kind cluster the lane creates: the kind provider's default name.
pub const CLUSTER: &str = "dra-e2e";

/// What the lane runs of the suites: every kubelet spec, as upstream's `--focus kubelet` selects
/// them (the PodGroup specs among them skip and say which cluster flags they need).
pub const FOCUS: &str = "kubelet";

/// The name of the lane's JUnit report, `<target>/e2e/kind.xml`.
pub const JUNIT: &str = "kind";

/// How long the lane waits for the background image build (cold on two cores beside the local
/// lanes: ~15–30 min).
const PREBUILD_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The kind cluster of the lane: kind.yaml, `KIND_NODE_IMAGE` if set (GitHub's runners pull
/// kind's own image) else the node image built here, `KIND_VERSION` if set.
fn kind_args() -> kind::KindArgs {
    kind::KindArgs {
        name: CLUSTER.into(),
        image: std::env::var("KIND_NODE_IMAGE").ok().filter(|s| !s.is_empty()),
        kind_version: std::env::var("KIND_VERSION").ok().filter(|s| !s.is_empty()),
        kind_from_path: false,
    }
}

/// The lane once its engine was started (and its image build, if in the background).
pub struct KindLane {
    /// Whether the engine answers (the lane's steps run only then).
    engine_ok: bool,
    /// Whether this lane started the engine (and so stops it).
    engine_started: bool,
    /// The node image build running in the background, if any.
    prebuild: Option<Prebuild>,
}

/// Starts the lane's engine (unless `DOCKER_HOST` names one) and, with `background`, the node
/// image build beside whatever runs next (not when `KIND_NODE_IMAGE` names an image).
pub async fn prepare(
    repo: &Path,
    background: bool,
    step: &mut dyn FnMut(&str, Result<()>, Instant),
) -> KindLane {
    let t = Instant::now();
    let engine = if std::env::var_os("DOCKER_HOST").is_some() {
        Ok(None)
    } else {
        Engine::from_env().start(kind::engine::CapShim::Auto).await.map(Some)
    };
    let engine_started = matches!(&engine, Ok(Some(running)) if running.started);
    let engine_ok = engine.is_ok();
    step("kind lane: the run's own Docker engine (unless DOCKER_HOST names one)", engine.map(drop), t);
    let mut prebuild = None;
    if engine_ok && background && kind_args().image.is_none() {
        let t = Instant::now();
        let started = Prebuild::start(repo);
        let ok = started.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}"));
        prebuild = started.ok();
        step("kind lane: node image build started in the background (nice 19)", ok, t);
    }
    KindLane { engine_ok, engine_started, prebuild }
}

impl KindLane {
    /// Runs the lane's steps through `step` (name, result, start), then stops the engine if the
    /// lane started it. After an interrupt (`interrupted`) only the clean-up runs: the
    /// background build is stopped, the cluster taken down, the engine stopped.
    pub async fn run(
        mut self,
        repo: &Path,
        interrupted: &AtomicBool,
        step: &mut dyn FnMut(&str, Result<()>, Instant),
    ) {
        let go_on = || !interrupted.load(Ordering::SeqCst);
        if let Some(prebuild) = self.prebuild.take().filter(|_| go_on()) {
            let t = prebuild.started;
            step(
                "kind node image (built in the background during the local lanes)",
                prebuild.finish().await,
                t,
            );
        }
        if self.engine_ok {
            on_cluster(repo, &go_on, step).await;
        }
        if self.engine_started {
            let t = Instant::now();
            step("kind lane: the run's own Docker engine stopped", Engine::from_env().stop(false).await, t);
        }
    }
}

/// Cluster up, the tests on it, cluster down (also after a failure) and the leftovers check.
/// After a failure the nodes' and pods' logs are exported first, to `<target>/e2e/artifacts/kind-logs`.
async fn on_cluster(repo: &Path, go_on: &dyn Fn() -> bool, step: &mut dyn FnMut(&str, Result<()>, Instant)) {
    let args = kind_args();
    let failed = std::cell::Cell::new(false);
    let mut step = |name: &str, result: Result<()>, t: Instant| {
        failed.set(failed.get() || result.is_err());
        step(name, result, t);
    };
    let t = Instant::now();
    let mut kubeconfig = None;
    if go_on() {
        let up = Provider::Kind.up(&args, None, None, false, false).await;
        kubeconfig = up.as_ref().ok().cloned();
        step(
            "kind cluster up (kind.yaml; the node image built here unless KIND_NODE_IMAGE)",
            up.map(drop),
            t,
        );
    }
    if let Some(kubeconfig) = kubeconfig {
        for test in super::cluster_tests().iter().filter(|test| test.any_provider).take_while(|_| go_on()) {
            let t = Instant::now();
            let result = cargo(repo, &test.cargo_args, &[("DRA_E2E_KUBECONFIG", kubeconfig.as_path())]);
            step(&format!("kind: {}", test.name), result, t);
        }
        if go_on() {
            let t = Instant::now();
            let result = run_suite(repo, &kubeconfig, &suite_args(repo, &["--focus", FOCUS], JUNIT)).await;
            step("e2e on kind: every kubelet spec (--focus kubelet)", result, t);
        }
    }
    if failed.get() {
        let dir = crate::e2e::target_dir(repo).join("e2e/artifacts/kind-logs");
        match kind::export_logs(&args, &dir).await {
            Ok(()) => eprintln!("==> the kind cluster's logs: {}", dir.display()),
            Err(e) => eprintln!("==> could not export the kind cluster's logs: {e:#}"),
        }
    }
    let t = Instant::now();
    let down = async {
        Provider::Kind.down(&args, false).await?;
        let left = kind::leftovers(&args).await?;
        if !left.is_empty() {
            bail!("left after cluster down: {}", left.join(", "));
        }
        Ok(())
    }
    .await;
    step("kind cluster down leaves no container, network or kubeconfig", down, t);
}

/// `cargo xtask cluster build --provider kind` (this binary) running in the background at nice
/// 19, in its own process group, its output in `<target>/e2e/kind-node-image.log`. Dropped before
/// it finished (an interrupted run), its whole process group is stopped.
pub struct Prebuild {
    child: Option<tokio::process::Child>,
    started: Instant,
    log: PathBuf,
    /// The copy of xtask it runs, removed when it ends.
    exe: PathBuf,
}

impl Prebuild {
    /// Starts the build.
    fn start(repo: &Path) -> Result<Prebuild> {
        // A copy: `cargo test` has rebuilt (replaced) target/debug/xtask since this run began.
        let exe = crate::e2e::target_dir(repo).join("e2e/xtask-kind-node-image");
        crate::repo::copy_running_xtask(&exe)?;
        let log = crate::e2e::target_dir(repo).join("e2e/kind-node-image.log");
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let out = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let child = tokio::process::Command::new("nice")
            .args(["-n", "19"])
            .arg(&exe)
            .args(["cluster", "build", "--provider", "kind"])
            .current_dir(repo)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .context("start `nice -n 19 cargo xtask cluster build --provider kind`")?;
        eprintln!("==> the kind node image builds in the background: {}", log.display());
        Ok(Prebuild { child: Some(child), started: Instant::now(), log, exe })
    }

    /// Waits for the build (at most [`PREBUILD_TIMEOUT`]); on failure, says so with its log's tail.
    async fn finish(mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else { return Ok(()) };
        let status = tokio::time::timeout(PREBUILD_TIMEOUT, child.wait())
            .await
            .map_err(|_| {
                anyhow::anyhow!("the kind node image build did not finish within {PREBUILD_TIMEOUT:?}")
            })
            .and_then(|status| status.context("wait for the kind node image build"));
        if status.is_ok() {
            self.child = None; // exited: nothing to stop
            let _ = std::fs::remove_file(&self.exe);
        }
        let status = status?;
        if !status.success() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "the kind node image build failed ({status}); {}:\n{}",
                self.log.display(),
                tail.join("\n")
            );
        }
        Ok(())
    }
}

impl Drop for Prebuild {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else { return };
        if let (Ok(None), Some(pid)) = (child.try_wait(), child.id()) {
            // The group is the child's own (process_group(0)): nice, xtask, go, debootstrap.
            if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                let _ = kill_process_group(pid, Signal::TERM);
            }
        }
    }
}
