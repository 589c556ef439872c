//! A DRA spec in one file, run as its own program against any cluster with DRA and the test
//! driver's proxy image on its nodes (the local cluster of `cargo xtask cluster up` has it):
//!
//! ```sh
//! cargo run -p harness --example prepare_once -- --kubeconfig /var/lib/dra-e2e/local/admin.kubeconfig
//! ```
//!
//! It takes every flag `dra-e2e` takes (`--focus`, `-p`, `--junit`, `--list`, ...). The spec:
//! a pod with an external claim runs, the kubelet prepares the claim exactly once, and after the
//! pod is deleted unprepares it exactly once, all read from the calls the in-process plugin
//! recorded.

use std::process::ExitCode;

use clap::Parser;
use harness::{framework::RunnerArgs, prelude::*};

/// The runner's flags.
#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    runner: RunnerArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| e.exit());
    harness::framework::init_tracing();
    let mut registry = Registry::new();
    harness::suite::configure(&mut registry);
    registry.describe("[dra-e2e example]", |r| {
        r.it("prepares a claim once and unprepares it once", prepare_once);
    });
    harness::framework::run(registry, cli.runner).await
}

async fn prepare_once(ctx: Ctx) -> SpecResult {
    // One node, one network-attached device, the plugin registered with the node's kubelet.
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::network(1, false))).await?;
    let b = Builder::start(&ctx, &driver, None).await?;
    let node = nodes.names()[0].clone();
    let calls = driver.calls(&node);

    let claim = b.create_claim(&b.external_claim()).await?;
    let pod = b.pod_external(&claim.name_any());
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[]).await?;
    let uid = claim.uid().unwrap_or_default();
    calls.expect_count(Method::NodePrepareResources.for_claim_uid(&uid), 1)?;
    calls.expect_none(Method::NodeUnprepareResources)?;

    b.delete_pod_and_wait(&pod).await?;
    calls.wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    calls.expect_count(Method::NodeUnprepareResources.for_claim_uid(&uid), 1)?;
    Ok(())
}
