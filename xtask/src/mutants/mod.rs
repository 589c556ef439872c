//! `cargo xtask mutants`: how many kubelet, scheduler and controller bugs the suites catch. Puts
//! one small bug at a time ([`catalogue`]) into a Kubernetes checkout's DRA code ([`checkout`]),
//! brings the local cluster up from it (`cluster up --k8s-source`, which rebuilds what the bug
//! touched), runs the lane that should catch it and reports which specs caught it ([`verdict`]:
//! only an assertion that passed on the baseline and fails again when run once more counts) in a
//! table ([`report`]). The unmutated checkout runs first (a lane that fails without a bug proves
//! nothing); afterwards the cluster is brought back to the pinned release. Ctrl-C stops the
//! command: the mutant in progress gets no verdict and comes out of the checkout, the table of
//! those before it is written, and it exits 130.

pub mod catalogue;
pub mod checkout;
mod cluster;
pub mod report;
pub mod verdict;

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context, Result, bail};

use self::verdict::Verdict;
use crate::{
    common::layout::Layout,
    e2e,
    test::steps::{INTERRUPTED, Stop},
    usage::UsageError,
};

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
        let mut cmd = cluster::xtask_command(
            cluster::THIS_XTASK,
            &["cluster", "build", "--provider", "local", "--k8s-source"],
            version.as_deref(),
        );
        let status = cmd.arg(&checkout).status().await.context("run cargo xtask cluster build")?;
        if !status.success() {
            bail!("cargo xtask cluster build --k8s-source {} failed ({status})", checkout.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let runner = e2e::build_runner(&repo, e2e::Build::Binary)?;
    let out = e2e::target_dir(&repo).join("e2e").join("mutants");
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let stop = Stop::on_ctrl_c();
    let cluster = cluster::Cluster {
        checkout: &checkout,
        version: version.as_deref(),
        runner: &runner,
        out: &out,
        stop: &stop,
        xtask: std::path::Path::new(cluster::THIS_XTASK),
        kubeconfig: layout.kubeconfig(),
        texts: tokio::sync::OnceCell::new(),
    };

    let baseline = match options.no_baseline {
        true => None,
        false => match cluster.baseline(&mutants).await? {
            Some(passed) => Some(passed),
            None => {
                eprintln!("interrupted (Ctrl-C) during the baseline: no mutant ran");
                return Ok(ExitCode::from(INTERRUPTED));
            }
        },
    };

    let mut results = Vec::new();
    let mut interrupted_during = None;
    for mutant in &mutants {
        let passed = baseline.as_ref().map(|b| b.get(&mutant.lane).cloned().unwrap_or_default());
        let Some(verdict) = cluster.check(mutant, passed.as_ref()).await else {
            interrupted_during = Some(mutant.name);
            break;
        };
        println!("==> mutant {}: {}", mutant.name, describe(&verdict));
        results.push((*mutant, verdict));
    }
    let notes = report::RunNotes { no_baseline: options.no_baseline, interrupted_during };
    if let Some(mutant) = interrupted_during {
        eprintln!(
            "interrupted (Ctrl-C) while {mutant} was checked: no verdict for it, its checkout put back; \
             the cluster still runs what it was last built from: `cargo xtask cluster up --provider local` brings back the pinned release"
        );
    } else if let Err(e) = cluster.back_to_release().await {
        // Back to the pinned release: nobody should meet a mutated cluster by surprise.
        eprintln!("warning: could not bring the cluster back to the pinned release: {e:#}");
    }

    let table = report::table(&results, notes);
    let output = options.output.clone().unwrap_or_else(|| out.with_extension("md"));
    std::fs::write(&output, &table).with_context(|| format!("write {}", output.display()))?;
    println!("\n{table}\n(written to {})", output.display());
    if interrupted_during.is_some() {
        return Ok(ExitCode::from(INTERRUPTED));
    }
    let missed = results.iter().filter(|(_, v)| !matches!(v, Verdict::Caught { .. })).count();
    if missed > 0 {
        println!("{missed} of {} mutants were not caught", results.len());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line: how many specs caught it, or why not.
fn describe(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Caught { specs, first_run } => format!(
            "caught: {first_run} spec(s) failed an assertion; {} of the {} run again failed again",
            specs.len(),
            first_run.min(&verdict::CONFIRM_AT_MOST)
        ),
        Verdict::Survived { passed } => format!("SURVIVED: all {passed} specs passed"),
        Verdict::NotChecked(why) => format!("not checked: {why}"),
    }
}
