//! `dra-e2e`: runs the DRA specs against a cluster.
//!
//! ```sh
//! dra-e2e --kubeconfig ~/.kube/config --focus 'control plane' -p 4 --junit junit.xml
//! dra-e2e --list --label-filter 'DRA && !Slow'
//! dra-e2e --list --k8s-version v1.38.0-beta.0      # upstream's texts of another version
//! dra-e2e cleanup --kubeconfig ~/.kube/config   # remove what killed runs left behind
//! dra-e2e --kubeconfig K --partition slice:1/2 --json-report s1.json   # shard 1 of 2 (docs/ci.md)
//! dra-e2e report merge s1.json s2.json --json-report all.json --junit all.xml
//! dra-e2e --kubeconfig K --rerun-failed all.json   # only what failed there
//! dra-e2e --kubeconfig ~/.kube/config --driver gpu.example.com --interpose  # check an installed driver
//! dra-e2e --kubeconfig ~/.kube/config --driver gpu.example.com --driver-summary out  # its summary in out/
//! dra-e2e kubelet-plugin --driver-name D --node-name N --plugin-dir P --registry-dir R --cdi-dir C
//! ```

mod kubelet_plugin_cmd;
#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod parity;
#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod shards;
mod specs;
mod versions;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use harness::framework::{GateTable, Registry, RunnerArgs};

/// End-to-end tests for Kubernetes Dynamic Resource Allocation.
#[derive(Debug, Parser)]
#[command(name = "dra-e2e", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    runner: RunnerArgs,
    #[command(flatten)]
    under_test: specs::under_test::UnderTestArgs,
    /// Print, when each spec ends (passed or failed), the gRPC calls each node's kubelet made to
    /// the spec's drivers ($DRA_E2E_SHOW_CALLS=1 does the same, also through `cargo xtask e2e`).
    #[arg(long, env = "DRA_E2E_SHOW_CALLS", value_parser = clap::builder::BoolishValueParser::new())]
    show_calls: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the test DRA kubelet plugin on local sockets until Ctrl-C.
    KubeletPlugin(kubelet_plugin_cmd::KubeletPluginArgs),
    /// Remove the objects of runs that are gone (their Lease expired: killed runs) and exit;
    /// objects of live runs and objects without a run identity are never touched.
    Cleanup(harness::framework::CleanupArgs),
    /// The JSON reports of runs.
    #[command(subcommand)]
    Report(ReportCommand),
}

#[derive(Debug, Subcommand)]
enum ReportCommand {
    /// Merge the JSON reports of a run's shards (--partition) into one.
    ///
    /// Writes one JSON (--json-report) and one JUnit report (--junit) and says which shard ran
    /// which spec. Exit 1 when a spec failed, ran in two shards, or ran in none (every report
    /// lists it as another shard's); 2 when a file is no report (docs/ci.md).
    Merge(harness::framework::MergeArgs),
}

/// Every spec, with the texts of Kubernetes `gates.version`; with a driver under test, only the
/// specs of that driver.
fn registry(
    gates: &'static GateTable,
    target: Option<&specs::under_test::Target>,
    show_calls: bool,
) -> Registry {
    let mut registry = Registry::for_version(gates);
    harness::suite::configure(&mut registry);
    if show_calls {
        harness::suite::show_calls(&mut registry);
    }
    match target {
        Some(target) => specs::under_test::register(&mut registry, target.clone()),
        None => specs::register(&mut registry),
    }
    registry
}

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors exit with 2, as ginkgo and the runner's own configuration errors do.
    let cli = Cli::try_parse().unwrap_or_else(|e| e.exit());
    harness::framework::init_tracing();
    match cli.command {
        Some(Command::KubeletPlugin(args)) => match kubelet_plugin_cmd::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Cleanup(args)) => harness::framework::cleanup(args).await,
        Some(Command::Report(ReportCommand::Merge(args))) => harness::framework::merge_command(&args),
        None => {
            let kubeconfig = cli.runner.kubeconfig.as_deref();
            let target = match cli.under_test.target(kubeconfig, cli.runner.list).await {
                Ok(target) => target,
                Err(err) => {
                    eprintln!("error: {err}");
                    return ExitCode::from(2);
                }
            };
            let summary = specs::under_test::summary::SummaryFiles::resolve(
                cli.under_test.driver_summary.as_deref(),
                cli.runner.junit.as_deref(),
                cli.runner.json_report.as_deref(),
            );
            let registry = |gates| {
                let mut registry = registry(gates, target.as_ref(), cli.show_calls);
                if let Some(target) = &target {
                    registry
                        .after_run(specs::under_test::summary::after_run(target.clone(), summary.clone()));
                }
                registry
            };
            harness::framework::run_versioned(versions::TABLES, registry, cli.runner).await
        }
    }
}
