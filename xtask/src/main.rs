//! `cargo xtask`: brings clusters up and down, runs the e2e suites and the project's own tests.
//!
//! Data flows one way: xtask makes a cluster and hands its kubeconfig to the `dra-e2e` binary; the
//! harness never knows which provider made the cluster.

mod bench;
mod cli;
mod cluster_config;
mod common;
mod deployed_driver;
#[cfg(test)]
mod docs_check;
mod e2e;
mod example_driver;
mod gomod;
mod host_cleanup;
mod image_archive;
#[cfg(test)]
mod import_cycles;
mod kind;
mod kube_api;
mod kubectl;
mod local;
mod mutants;
mod overrides;
mod progress;
mod provider;
mod repo;
mod skew;
mod test;
mod upstream_driver;
mod upstream_specs;
mod usage;
mod wait;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The engine's runc shim runs before anything else (no logging, no runtime).
    if let Some(code) = cli::shim::main_if_invoked() {
        return code;
    }
    let cli = cli::parse::from_env();
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(err) if err.downcast_ref::<usage::UsageError>().is_some() => {
            eprintln!("error: {err}");
            ExitCode::from(usage::USAGE_EXIT)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `RUST_LOG` overrides the default level.
fn init_tracing(verbose: bool) {
    // kube's client logs every failed poll of a component that is still starting at ERROR;
    // our waits report what matters, with context, so it stays quiet unless RUST_LOG asks.
    let default = if verbose { "debug" } else { "info,kube_client=off" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}
