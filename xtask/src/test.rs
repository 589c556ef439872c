//! `cargo xtask test`: the project's own tests, what CI runs. Unit and protocol tests first, then
//! the local cluster comes up (with its registry, as `cluster up --registry`) and the cluster
//! tests and the e2e suites run against it, then the cluster goes down and must leave nothing
//! behind. Every step runs (a failure does not hide the
//! others' results) and a table of steps, outcomes and durations closes the run.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{e2e, local, progress::human};

/// Options of `cargo xtask test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// Run only the tests that need no cluster.
    #[arg(long)]
    pub no_cluster: bool,
    /// Leave the local cluster running afterwards.
    #[arg(long)]
    pub keep_cluster: bool,
}

/// One step's outcome.
struct Outcome {
    name: String,
    result: Result<()>,
    elapsed: Duration,
}

/// Runs the steps and prints the summary.
pub async fn run(args: TestArgs) -> Result<ExitCode> {
    let repo = crate::repo::repo_root();
    let mut outcomes = Vec::new();
    let mut step = |name: &str, result: Result<()>, started: Instant| {
        if let Err(e) = &result {
            eprintln!("==> step failed: {name}: {e:#}");
        }
        outcomes.push(Outcome { name: name.to_string(), result, elapsed: started.elapsed() });
    };

    let t = Instant::now();
    step("unit and protocol tests (cargo test --workspace)", cargo(&repo, &["test", "--workspace"], &[]), t);

    if !args.no_cluster {
        let t = Instant::now();
        let cluster = local::LocalCluster::new(Some(local::default_node_count()?))?;
        let up = cluster.up(true).await.map(|_| ());
        let up_ok = up.is_ok();
        step("local cluster up", up, t);
        if up_ok {
            let kubeconfig = cluster.kubeconfig();
            for (name, cmd) in cluster_test_commands() {
                let t = Instant::now();
                let result = cargo(&repo, &cmd, &[("DRA_E2E_KUBECONFIG", kubeconfig.as_path())]);
                step(name, result, t);
            }
            for (name, suite_args) in suite_runs(&repo) {
                let t = Instant::now();
                step(name, run_suite(&repo, &kubeconfig, &suite_args).await, t);
            }
        }
        if !args.keep_cluster {
            let t = Instant::now();
            let down = async {
                cluster.down().await?;
                let left = cluster.leftovers();
                if !left.is_empty() {
                    bail!("cluster down left: {}", left.join("; "));
                }
                Ok(())
            }
            .await;
            step("local cluster down leaves nothing behind", down, t);
        }
    }

    eprintln!("\n{:<62} {:>8}  result", "step", "time");
    for o in &outcomes {
        let result = if o.result.is_ok() { "ok" } else { "FAILED" };
        eprintln!("{:<62} {:>8}  {result}", o.name, human(o.elapsed));
    }
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    eprintln!("{} steps, {failed} failed", outcomes.len());
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The cluster tests: `#[ignore]`d tests that read the kubeconfig from `DRA_E2E_KUBECONFIG`.
/// `--workspace` keeps cargo's feature unification identical to the `cargo test --workspace`
/// build before, so nothing is compiled twice.
fn cluster_test_commands() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "local cluster tests (xtask/tests/local_cluster.rs)",
            vec!["test", "--workspace", "--test", "local_cluster", "--", "--ignored"],
        ),
        (
            "framework cluster tests (harness/tests/cluster/framework.rs)",
            vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "framework::"],
        ),
        (
            "tunnel cluster tests (harness/tests/cluster/tunnel.rs)",
            vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "tunnel::"],
        ),
        (
            "driver cluster tests (harness/tests/cluster/driver.rs)",
            vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "driver::"],
        ),
    ]
}

/// The e2e suite runs against the local cluster, each with its JUnit report: the control-plane
/// specs (API server, scheduler and controllers only), then the kubelet specs (pods run, the
/// kubelet talks to the in-process plugin through the proxy pods).
fn suite_runs(repo: &Path) -> Vec<(&'static str, Vec<String>)> {
    let out = e2e::target_dir(repo).join("e2e");
    let artifacts = out.join("artifacts").display().to_string();
    let run = |selection: [&str; 2], junit: &str| -> Vec<String> {
        let junit = out.join(format!("{junit}.xml")).display().to_string();
        let mut args = selection.map(String::from).to_vec();
        args.extend(["-p", "4", "--junit", &junit, "--artifacts", &artifacts].map(String::from));
        args
    };
    // Every registered spec runs in one of the two: the kubelet contexts, and everything else
    // (control plane, CRUD, ResourceSlice Controller, device compatibility groups, ...).
    vec![
        (
            "e2e: control plane, CRUD and the other non-kubelet suites",
            run(["--skip", "kubelet"], "control-plane"),
        ),
        ("e2e: kubelet suites", run(["--focus", "kubelet"], "kubelet")),
    ]
}

async fn run_suite(repo: &Path, kubeconfig: &Path, args: &[String]) -> Result<()> {
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let code = e2e::run_runner(&runner, kubeconfig, args).await?;
    if code != 0 {
        bail!("dra-e2e exited with {code}");
    }
    Ok(())
}

/// Runs cargo in the workspace with extra environment.
fn cargo(repo: &Path, args: &[&str], env: &[(&str, &Path)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(&cargo)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.to_string(), PathBuf::from(v))))
        .current_dir(repo)
        .status()
        .with_context(|| format!("run {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}
