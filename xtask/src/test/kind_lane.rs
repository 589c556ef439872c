//! `cargo xtask test --lane kind`: the DRA suites on a kind cluster made here, as the e2e-kind
//! workflow runs them. The run's own Docker engine is started unless `DOCKER_HOST` names one (and
//! stopped again if this lane started it), then the workflow's own command runs (`cargo xtask
//! e2e --provider kind …`: the cluster from kind.yaml and the node image built here, the suites,
//! the cluster deleted), and nothing of the cluster may be left: no container, no registry, no
//! `kind` network, no kubeconfig.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::kind::{self, engine::Engine};

/// The kind cluster the lane (and the workflow) creates: kind's provider default.
pub const CLUSTER: &str = "dra-e2e";

/// `cargo xtask e2e`'s arguments in the e2e-kind workflow and in this lane (a test of the workflow
/// keeps them equal). The runner's default parallelism (2): with `-p 4` on a two-core machine the
/// Node Allocatable specs, whose pods ask for most of a 2-CPU node, waited for each other past
/// their five minutes (2026-12-04); with 2 every spec passed.
pub const E2E_ARGS: [&str; 8] = [
    "--provider",
    "kind",
    "--focus",
    "DRA",
    "--junit",
    "target/e2e/junit.xml",
    "--artifacts",
    "target/e2e/artifacts",
];

/// Runs the lane's steps through `step` (name, result, start).
pub async fn run(step: &mut dyn FnMut(&str, Result<()>, Instant)) {
    let t = Instant::now();
    let engine = if std::env::var_os("DOCKER_HOST").is_some() {
        Ok(None)
    } else {
        Engine::from_env().start(kind::engine::CapShim::Auto).await.map(Some)
    };
    let started = matches!(&engine, Ok(Some(running)) if running.started);
    let engine_ok = engine.is_ok();
    step("the run's own Docker engine (unless DOCKER_HOST names one)", engine.map(drop), t);
    if engine_ok {
        let t = Instant::now();
        let e2e = async {
            let code = crate::e2e::run_with_code(E2E_ARGS.iter().map(|s| s.to_string()).collect()).await?;
            if code != 0 {
                bail!("cargo xtask e2e {} exited with {code}", E2E_ARGS.join(" "));
            }
            Ok(())
        }
        .await;
        step(&format!("e2e on kind: cargo xtask e2e {}", E2E_ARGS.join(" ")), e2e, t);
        let t = Instant::now();
        step("kind cluster deleted, nothing of it left", leftovers().await, t);
    }
    if started {
        let t = Instant::now();
        step("the run's own Docker engine stopped", Engine::from_env().stop(false).await, t);
    }
}

/// What the cluster left (containers, kind's network, the kubeconfig), as the kind provider
/// sees its Docker engine.
async fn leftovers() -> Result<()> {
    let args =
        kind::KindArgs { name: CLUSTER.into(), image: None, kind_version: None, kind_from_path: false };
    let left = kind::leftovers(&args).await?;
    if !left.is_empty() {
        bail!("left after the run: {}", left.join(", "));
    }
    Ok(())
}
