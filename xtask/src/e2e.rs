//! `cargo xtask e2e`: builds the `dra-e2e` binary and runs the suites against a cluster with the
//! runner's flags as they were given (the command line, checked by clap in `cli::runner`, arrives
//! here as [`E2eOptions`]). Without `--kubeconfig` it brings a cluster up first (the embedded local
//! one by default) and takes it down afterwards unless `--keep-cluster` (or unless the cluster was
//! already running).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};

use crate::{kind, local, overrides::Overrides, provider::Provider};

/// What `cargo xtask e2e` runs: the cluster to use or bring up, and `dra-e2e`'s flags.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct E2eOptions {
    /// The cluster provider when no kubeconfig is given.
    pub provider: Provider,
    /// An existing cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Leave the cluster running after the run.
    pub keep_cluster: bool,
    /// The kind cluster name (`--name`).
    pub kind_name: Option<String>,
    /// The kind node image (`--image`).
    pub kind_image: Option<String>,
    /// The Kubernetes release of the cluster brought up (`--k8s-version`; it is in
    /// [`runner_args`](Self::runner_args) too: `dra-e2e`'s spec texts follow it).
    pub k8s_version: Option<String>,
    /// `dra-e2e`'s command line as given, without `--kubeconfig` (passed by [`run_runner`]); a
    /// leading `cleanup` is its subcommand.
    pub runner_args: Vec<String>,
}

/// How to build `dra-e2e`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// Only the binary (for users).
    Binary,
    /// With the features the workspace's tests unify to, so that `cargo xtask test` reuses the
    /// artifacts of `cargo test --workspace` instead of compiling the dependencies again.
    SameAsTests,
}

/// Builds `dra-e2e` and returns its path.
pub fn build_runner(repo: &Path, build: Build) -> Result<PathBuf> {
    let args: &[&str] = match build {
        Build::Binary => &["build", "--quiet", "--package", "suites", "--bin", "dra-e2e"],
        Build::SameAsTests => &["build", "--quiet", "--workspace", "--all-targets"],
    };
    let status =
        crate::repo::cargo_command(repo).args(args).status().context("run cargo build for dra-e2e")?;
    if !status.success() {
        bail!("building dra-e2e failed");
    }
    Ok(target_dir(repo).join("debug").join("dra-e2e"))
}

/// The cargo target directory of the workspace.
pub fn target_dir(repo: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo.join("target"))
}

/// Runs `dra-e2e` with `args` against `kubeconfig`; returns its exit code. Ctrl-C reaches the
/// runner too (same process group); we wait for it to finish its clean-up.
pub async fn run_runner(runner: &Path, kubeconfig: &Path, args: &[String]) -> Result<i32> {
    let (subcommand, args) = split_subcommand(args);
    let mut child = tokio::process::Command::new(runner)
        .args(subcommand)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .spawn()
        .with_context(|| format!("start {}", runner.display()))?;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                return Ok(status.code().unwrap_or(1));
            }
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: waiting for dra-e2e to clean up");
            }
        }
    }
}

/// A leading `cleanup` (`cargo xtask e2e --kubeconfig K cleanup`) is `dra-e2e`'s subcommand: it
/// goes before `--kubeconfig`, the rest after it.
fn split_subcommand(args: &[String]) -> (&[String], &[String]) {
    match args.first() {
        Some(first) if first == "cleanup" => args.split_at(1),
        _ => (&[], args),
    }
}

/// `cargo xtask e2e ...`: exits with dra-e2e's exit code.
pub async fn run(args: E2eOptions) -> Result<ExitCode> {
    let code = run_with_code(&args).await?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// `cargo xtask e2e ...`, returning dra-e2e's exit code.
async fn run_with_code(args: &E2eOptions) -> Result<i32> {
    // The release of a cluster to bring up, checked before anything is built.
    if let (None, Some(version)) = (&args.kubeconfig, &args.k8s_version) {
        local::parse_k8s_version(version)?;
    }
    let repo = crate::repo::repo_root();
    let runner = build_runner(&repo, Build::Binary)?;
    let (kubeconfig, teardown) = match (&args.kubeconfig, args.provider) {
        (Some(path), _) => (path.clone(), None),
        (None, Provider::Local) => {
            // A running cluster is used with whatever node count and settings it has, unless
            // it runs another release than --k8s-version asks for.
            let mut cluster = local::LocalCluster::new(None)?;
            if let Some(version) = &args.k8s_version {
                let version = local::parse_k8s_version(version)?;
                let overrides = Overrides { k8s_version: Some(version), ..cluster.overrides().clone() };
                cluster = cluster.with_overrides(Some(overrides));
            }
            let was_running = cluster.is_up().await;
            let path = cluster.up(false).await?;
            let teardown = (!args.keep_cluster && !was_running).then_some(Provider::Local);
            if was_running {
                eprintln!("note: the local cluster was already running; it stays up after the run");
            }
            (path, teardown)
        }
        (None, Provider::Kind) => {
            // --k8s-version: the node image is built here from that release.
            let overrides = match &args.k8s_version {
                Some(version) => {
                    let version = local::parse_k8s_version(version)?;
                    Some(Overrides { k8s_version: Some(version), ..Overrides::default() })
                }
                None => None,
            };
            let path = Provider::Kind.up(&kind_args(args), None, overrides, false, false).await?;
            (path, (!args.keep_cluster).then_some(Provider::Kind))
        }
    };
    let code = run_runner(&runner, &kubeconfig, &args.runner_args).await;
    if let Some(provider) = teardown {
        provider.down(&kind_args(args), false).await?;
    }
    code
}

/// The kind cluster of the run: `--name` and `--image`, else the `KIND_*` variables'.
fn kind_args(args: &E2eOptions) -> kind::KindOptions {
    kind::KindOptions {
        name: args
            .kind_name
            .clone()
            .or_else(|| std::env::var("KIND_CLUSTER_NAME").ok())
            .unwrap_or_else(|| "dra-e2e".into()),
        image: args.kind_image.clone().or_else(|| std::env::var("KIND_NODE_IMAGE").ok()),
        kind_version: std::env::var("KIND_VERSION").ok(),
        kind_from_path: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_leading_cleanup_is_the_runners_subcommand() {
        let run = strings(&["--focus", "DRA", "-p", "4"]);
        assert_eq!(split_subcommand(&run), (&[][..], &run[..]));
        let cleanup = strings(&["cleanup", "--keep-leftovers"]);
        assert_eq!(split_subcommand(&cleanup), (&cleanup[..1], &cleanup[1..]));
    }
}
