//! `dra-e2e`: runs the DRA specs against a cluster.

mod kubelet_plugin_cmd;

use clap::{Parser, Subcommand};

/// End-to-end tests for Kubernetes Dynamic Resource Allocation.
#[derive(Debug, Parser)]
#[command(name = "dra-e2e", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the test DRA kubelet plugin on local sockets until Ctrl-C.
    KubeletPlugin(kubelet_plugin_cmd::KubeletPluginArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Some(Command::KubeletPlugin(args)) => kubelet_plugin_cmd::run(args).await,
        // The spec runner (top-level flags) comes here.
        None => Ok(()),
    }
}
