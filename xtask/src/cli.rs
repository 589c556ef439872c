//! The command line of `cargo xtask` and the dispatch to each subcommand.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

use crate::{e2e, kind, local, overrides::OverrideArgs, provider::Provider, test};

/// cargo xtask: clusters, e2e runs and the project's tests for dra-e2e.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", version, about)]
pub struct Cli {
    /// Log at debug level (RUST_LOG overrides).
    #[arg(long, short, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bring a cluster up or down, or say what runs.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Build a kind node image from a Kubernetes source tree (`kind build node-image`).
    BuildNodeImage(kind::BuildNodeImageArgs),
    /// Run the DRA suites: `cargo xtask e2e [--provider local|kind] [--kubeconfig PATH]
    /// [--keep-cluster] [dra-e2e flags: --focus, --skip, --label-filter, -p, --junit, ...]`.
    #[command(disable_help_flag = true)]
    E2e {
        /// Own flags (--provider, --kubeconfig, --keep-cluster, --name, --image) and dra-e2e's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The project's own tests (what CI runs): unit, protocol and cluster tests, and the suites.
    Test(test::TestArgs),
    /// Internal: forward a host TCP address into a network namespace (the local cluster's
    /// apiserver forwarder, started and stopped by `cluster up`/`down`).
    #[command(hide = true)]
    NetnsForward {
        /// The network namespace file (e.g. /run/netns/dra-e2e-kind-control-plane).
        #[arg(long)]
        netns: PathBuf,
        /// Where to listen, in the host's namespace.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// Where to connect, inside the namespace.
        #[arg(long)]
        connect: std::net::SocketAddr,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterAction {
    /// Create the cluster (idempotent) and print its kubeconfig path.
    Up(ClusterArgs),
    /// Stop the cluster and remove everything it created.
    Down(ClusterArgs),
    /// Say what runs.
    Status(ClusterArgs),
}

/// Options shared by `cluster up`, `down` and `status`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The cluster provider.
    #[arg(long, value_enum, default_value_t)]
    pub provider: Provider,
    #[command(flatten)]
    pub kind: kind::KindArgs,
    /// Print the commands instead of running them (kind provider).
    #[arg(long)]
    pub dry_run: bool,
    /// Number of nodes of the local cluster (`up`): one control plane and N-1 workers; default:
    /// the nodes kind.yaml lists.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Gates and API versions on top of kind.yaml's (`up`), as upstream's CI lanes add them.
    #[command(flatten)]
    pub overrides: OverrideArgs,
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Cluster { action } => match action {
            ClusterAction::Up(args) => {
                let overrides = args.overrides.parse()?;
                args.provider
                    .up(&args.kind, args.nodes, overrides, args.dry_run)
                    .await
                    .map(|_| ExitCode::SUCCESS)
            }
            ClusterAction::Down(args) => {
                args.provider.down(&args.kind, args.dry_run).await.map(|()| ExitCode::SUCCESS)
            }
            ClusterAction::Status(args) => args.provider.status(&args.kind).await.map(exit_code),
        },
        Command::BuildNodeImage(args) => kind::build_node_image(&args).await.map(|_| ExitCode::SUCCESS),
        Command::E2e { args } => e2e::run(args).await,
        Command::Test(args) => test::run(args).await,
        Command::NetnsForward { netns, listen, connect } => {
            local::forward_command(netns, listen, connect).await.map(|_| ExitCode::SUCCESS)
        }
    }
}

/// Exit code 0 when `ok`, else 1.
fn exit_code(ok: bool) -> ExitCode {
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
