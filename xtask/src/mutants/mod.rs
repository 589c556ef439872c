//! `cargo xtask mutants`: how many kubelet, scheduler and controller bugs the suites catch. Puts
//! one small bug at a time ([`catalogue`]) into a Kubernetes checkout's DRA code ([`checkout`]),
//! brings the local cluster up from it (`cluster up --k8s-source`, which rebuilds what the bug
//! touched), runs the lane that should catch it and reports which specs failed and why
//! ([`report`]). The unmutated checkout runs first (a lane that fails without a bug proves
//! nothing); afterwards the cluster is brought back to the pinned release.

pub mod catalogue;
pub mod checkout;
pub mod report;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};

use self::{
    catalogue::{Lane, Mutant},
    report::Verdict,
};
use crate::{common::layout::Layout, e2e, usage::UsageError};

/// What `cargo xtask mutants` was asked.
#[derive(Debug, Clone, Default)]
pub struct MutantsOptions {
    /// The checkout (`--k8s-source`); `None`: one assembled from Go's module cache.
    pub k8s_source: Option<PathBuf>,
    /// The release an assembled checkout is of (`--k8s-version`); `None`: the pinned one.
    pub k8s_version: Option<String>,
    /// Only these mutants (`--only`, repeatable); empty: all.
    pub only: Vec<String>,
    /// Skip the run of the unmutated checkout (`--no-baseline`).
    pub no_baseline: bool,
    /// Print the mutants and exit (`--list`).
    pub list: bool,
    /// Assemble the checkout and build the cluster's binaries from it, start nothing
    /// (`--build-only`: a cache warmed ahead of a run).
    pub build_only: bool,
    /// Where the Markdown table goes (`--output`); default `target/e2e/mutants.md`.
    pub output: Option<PathBuf>,
}

/// Runs the command; exit code 1 when a mutant survived or could not be checked.
pub async fn run(options: MutantsOptions) -> Result<ExitCode> {
    let mutants = catalogue::select(&options.only).map_err(UsageError::new)?;
    if options.list {
        for m in &mutants {
            println!("{:<45} {} ({} lane): {}", m.name, m.component, m.lane.name(), m.bug);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let repo = crate::repo::repo_root();
    let layout = Layout::from_env(repo.clone())?;
    let (checkout, version) = match &options.k8s_source {
        Some(dir) => (dir.clone(), None),
        None => {
            let version = match &options.k8s_version {
                Some(v) => crate::local::parse_k8s_version(v)?,
                None => crate::common::kube_module::KubeModule::pinned(&layout)?.version,
            };
            (checkout::assemble(&layout, &version)?, Some(version.to_string()))
        }
    };
    checkout::restore_leftovers(&checkout, catalogue::MUTANTS)?;
    for mutant in &mutants {
        checkout::check(&checkout, mutant).map_err(|e| UsageError::new(format!("{e:#}")))?;
    }
    if options.build_only {
        let mut cmd =
            xtask_command(&["cluster", "build", "--provider", "local", "--k8s-source"], version.as_deref());
        let status = cmd.arg(&checkout).status().await.context("run cargo xtask cluster build")?;
        if !status.success() {
            bail!("cargo xtask cluster build --k8s-source {} failed ({status})", checkout.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let runner = e2e::build_runner(&repo, e2e::Build::Binary)?;
    let out = e2e::target_dir(&repo).join("e2e").join("mutants");
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let cluster = Cluster { checkout: &checkout, version: version.as_deref(), runner: &runner, out: &out };

    if !options.no_baseline {
        cluster.up().await.context("bring the cluster up from the unmutated checkout")?;
        let mut lanes: Vec<Lane> = mutants.iter().map(|m| m.lane).collect();
        lanes.sort();
        lanes.dedup();
        for lane in lanes {
            if let Verdict::Caught(specs) = cluster.run_lane(lane, "baseline").await? {
                let names: Vec<&str> = specs.iter().map(|s| s.text.as_str()).collect();
                bail!(
                    "without any mutant, {} spec(s) of the {} lane fail: {}; a mutant's failures would prove nothing (fix those first, or --no-baseline)",
                    specs.len(),
                    lane.name(),
                    names.join("; ")
                );
            }
        }
    }

    let mut results = Vec::new();
    for mutant in &mutants {
        let verdict = cluster.check(mutant).await;
        println!("==> mutant {}: {}", mutant.name, describe(&verdict));
        results.push((*mutant, verdict));
    }
    // Back to the pinned release: nobody should meet a mutated cluster by surprise.
    if let Err(e) = cluster.back_to_release().await {
        eprintln!("warning: could not bring the cluster back to the pinned release: {e:#}");
    }

    let table = report::table(&results);
    let output = options.output.clone().unwrap_or_else(|| out.with_extension("md"));
    std::fs::write(&output, &table).with_context(|| format!("write {}", output.display()))?;
    println!("\n{table}\n(written to {})", output.display());
    let missed = results.iter().filter(|(_, v)| !matches!(v, Verdict::Caught(_))).count();
    if missed > 0 {
        println!("{missed} of {} mutants were not caught", results.len());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// This xtask (a child, so that `KUBE_GIT_VERSION` can be given to it alone: an assembled
/// checkout has no git tags to tell its version).
fn xtask_command(args: &[&str], version: Option<&str>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.args(args).kill_on_drop(true);
    if let Some(version) = version {
        cmd.env("KUBE_GIT_VERSION", version);
    }
    cmd
}

/// One line: how many specs caught it, or why not.
fn describe(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Caught(specs) => format!("caught: {} spec(s) failed", specs.len()),
        Verdict::Survived { passed } => format!("SURVIVED: all {passed} specs passed"),
        Verdict::NotChecked(why) => format!("not checked: {why}"),
    }
}

/// The local cluster built from the checkout, and the suites run against it.
struct Cluster<'a> {
    checkout: &'a Path,
    /// `KUBE_GIT_VERSION` for an assembled checkout (it has no git tags).
    version: Option<&'a str>,
    runner: &'a Path,
    out: &'a Path,
}

impl Cluster<'_> {
    /// Puts `mutant` in, brings the cluster up from the checkout, runs its lane; the mutant
    /// comes out again whatever happened.
    async fn check(&self, mutant: &Mutant) -> Verdict {
        let applied = match checkout::apply(self.checkout, mutant) {
            Ok(applied) => applied,
            Err(e) => return Verdict::NotChecked(format!("{e:#}")),
        };
        let verdict = match self.up().await {
            Ok(()) => self
                .run_lane(mutant.lane, mutant.name)
                .await
                .unwrap_or_else(|e| Verdict::NotChecked(format!("{e:#}"))),
            Err(e) => Verdict::NotChecked(format!("cluster up from the mutated checkout: {e:#}")),
        };
        drop(applied);
        verdict
    }

    /// `cargo xtask cluster up --provider local --k8s-source CHECKOUT`.
    async fn up(&self) -> Result<()> {
        let mut cmd = xtask_command(&["cluster", "up", "--provider", "local", "--k8s-source"], self.version);
        let status = cmd.arg(self.checkout).status().await.context("run cargo xtask cluster up")?;
        if !status.success() {
            bail!("cargo xtask cluster up --k8s-source {} failed ({status})", self.checkout.display());
        }
        Ok(())
    }

    /// `cluster up` at the pinned release.
    async fn back_to_release(&self) -> Result<()> {
        let status = xtask_command(&["cluster", "up", "--provider", "local"], None).status().await?;
        if !status.success() {
            bail!("cargo xtask cluster up failed ({status})");
        }
        Ok(())
    }

    /// Runs `lane` and reads its JSON report.
    async fn run_lane(&self, lane: Lane, name: &str) -> Result<Verdict> {
        let layout = Layout::from_env(crate::repo::repo_root())?;
        let json = self.out.join(format!("{name}.json"));
        let _ = std::fs::remove_file(&json);
        let mut args: Vec<String> = lane.selection().iter().map(|s| s.to_string()).collect();
        let artifacts = self.out.join(name).join("artifacts");
        args.extend(["-p".to_owned(), crate::test::LANE_PROCS.to_owned(), "--json-report".to_owned()]);
        args.push(json.display().to_string());
        args.extend(["--artifacts".to_owned(), artifacts.display().to_string()]);
        let code = e2e::run_runner(self.runner, &layout.kubeconfig(), &args).await?;
        if code == 2 || !json.exists() {
            bail!("dra-e2e could not run the {} lane (exit code {code})", lane.name());
        }
        report::verdict_from_json(&json)
    }
}
