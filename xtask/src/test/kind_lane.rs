//! The kind lane of `cargo xtask test` (also alone: `cargo xtask test --lane kind`, what the
//! e2e-kind workflow runs): a four-node kind cluster from kind.yaml, with the node image built here
//! (or `KIND_NODE_IMAGE`), the cluster tests that do not depend on the provider, every kubelet spec
//! (`--focus kubelet`, `-p 4`; the local cluster's lanes run 8 at once), then the cluster deleted,
//! and nothing of it may be left: no container, no `kind` network, no kubeconfig. The run's own
//! Docker engine is started unless `DOCKER_HOST` names one, and stopped again if this lane
//! started it.
//!
//! In CI's run the lane is prepared as soon as the local cluster is up: the engine starts and the
//! node image is one of the run's background builds ([`super::background`], at the lowest CPU
//! priority) while the local cluster's lanes run, which mostly wait on the cluster; on a cold
//! machine that takes the image build off the run's critical path.

use std::path::Path;

use anyhow::bail;

use super::{
    StepStart,
    background::Background,
    lane_run::SuiteRun,
    partition::{ClusterBuild, Share, Unit},
    run_suite, sliced,
    steps::Steps,
};
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

/// How many specs the kind lane runs at once: its nodes are containers with their own
/// containerd and systemd, heavier than the local cluster's, and it was only measured at 4.
const KIND_PROCS: &str = "4";

/// The kind cluster of the lane: kind.yaml, `KIND_NODE_IMAGE` if set (GitHub's runners pull
/// kind's own image) else the node image built here, `KIND_VERSION` if set.
fn kind_args() -> kind::KindOptions {
    kind::KindOptions {
        name: CLUSTER.into(),
        image: std::env::var("KIND_NODE_IMAGE").ok().filter(|s| !s.is_empty()),
        kind_version: std::env::var("KIND_VERSION").ok().filter(|s| !s.is_empty()),
        kind_from_path: false,
    }
}

/// The lane once its engine was started.
pub struct KindLane {
    /// Whether the engine answers (the lane's steps run only then).
    engine_ok: bool,
    /// Whether this lane started the engine (and so stops it).
    engine_started: bool,
}

/// The step names of the lane's engine and cluster.
const ENGINE_STEP: &str = "kind lane: the run's own Docker engine (unless DOCKER_HOST names one)";
const UP_STEP: &str = "kind cluster up (kind.yaml; the node image built here unless KIND_NODE_IMAGE)";
const SUITE_STEP: &str = "e2e on kind: every kubelet spec (--focus kubelet)";

/// The lane's run of the suites.
fn suite(repo: &Path) -> SuiteRun {
    SuiteRun::new(repo, &["--focus", FOCUS], JUNIT, KIND_PROCS)
}

/// Records the lane's steps as not run (the run was stopped before it).
pub(crate) fn not_run(steps: &mut Steps) {
    for name in [ENGINE_STEP, UP_STEP, SUITE_STEP] {
        steps.skipped(name);
    }
}

/// Starts the lane's engine (unless `DOCKER_HOST` names one).
pub(crate) async fn prepare(steps: &mut Steps) -> KindLane {
    let t = StepStart::now();
    let engine = if std::env::var_os("DOCKER_HOST").is_some() {
        Ok(None)
    } else {
        Engine::from_env().start(kind::engine::CapShim::Auto).await.map(Some)
    };
    let engine_started = matches!(&engine, Ok(Some(running)) if running.started);
    let engine_ok = engine.is_ok();
    steps.record(ENGINE_STEP, engine.map(drop), t);
    KindLane { engine_ok, engine_started }
}

impl KindLane {
    /// Whether the node image is to be built in the background (the engine must answer: the
    /// image is imported into it): not when `KIND_NODE_IMAGE` names an image.
    pub fn builds_image(&self) -> bool {
        self.engine_ok && kind_args().image.is_none()
    }

    /// Runs the lane's steps that `share` has, then stops the engine if the lane started it;
    /// first waits for the node image if it builds in `background`. After an interrupt only the
    /// clean-up runs: the cluster taken down, the engine stopped.
    pub(crate) async fn run(
        self,
        repo: &Path,
        share: &Share,
        background: Option<&mut Background>,
        steps: &mut Steps,
    ) {
        if let Some(background) = background.filter(|_| steps.go_on()) {
            let t = StepStart::now();
            if let Some(waited) = background.wait(ClusterBuild::KindImage.key()).await {
                steps.record(&waited.name, waited.result, t.waited(waited.waited));
            }
        }
        if self.engine_ok {
            on_cluster(repo, share, steps).await;
        }
        if self.engine_started {
            let t = StepStart::now();
            steps.record(
                "kind lane: the run's own Docker engine stopped",
                Engine::from_env().stop(false).await,
                t,
            );
        }
    }
}

/// Cluster up, the tests on it that `share` has, cluster down (also after a failure) and the
/// leftovers check. After a failure the nodes' and pods' logs are exported first, to
/// `<target>/e2e/artifacts/kind-logs`.
async fn on_cluster(repo: &Path, share: &Share, steps: &mut Steps) {
    let suite_step = sliced(SUITE_STEP, share.slice(Unit::Kind));
    let args = kind_args();
    let mut failed = false;
    let mut kubeconfig = None;
    if !steps.skipped(UP_STEP) {
        let t = StepStart::now();
        let up = Provider::Kind.up(&args, None, None, false, false).await;
        kubeconfig = up.as_ref().ok().cloned();
        failed |= up.is_err();
        steps.record(UP_STEP, up.map(drop), t);
    }
    match kubeconfig {
        Some(kubeconfig) => {
            let tests = super::cluster_tests::cluster_tests();
            let any: Vec<_> = tests.iter().filter(|test| test.any_provider).collect();
            let before = steps.failed();
            if share.runs(Unit::KindTests) {
                super::cluster_tests_step(repo, &any, &kubeconfig, "kind: ", steps).await;
            }
            if share.runs(Unit::Kind) {
                let suite = suite(repo).sliced(share.slice(Unit::Kind));
                steps.run(&suite_step, run_suite(repo, &kubeconfig, &suite)).await;
            }
            failed |= steps.failed() > before;
        }
        // Stopped, or the cluster did not come up: the suite did not run.
        None if share.runs(Unit::Kind) => steps.not_run(&suite_step),
        None => {}
    }
    if failed {
        let dir = crate::e2e::target_dir(repo).join("e2e/artifacts/kind-logs");
        match kind::export_logs(&args, &dir).await {
            Ok(()) => eprintln!("==> the kind cluster's logs: {}", dir.display()),
            Err(e) => eprintln!("==> could not export the kind cluster's logs: {e:#}"),
        }
    }
    let t = StepStart::now();
    let down = async {
        Provider::Kind.down(&args, false).await?;
        let left = kind::leftovers(&args).await?;
        if !left.is_empty() {
            bail!("left after cluster down: {}", left.join(", "));
        }
        Ok(())
    }
    .await;
    steps.record("kind cluster down leaves no container, network or kubeconfig", down, t);
}
