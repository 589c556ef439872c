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
pub mod report;
pub mod verdict;

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};

use self::{
    catalogue::{Lane, Mutant},
    verdict::{FirstRun, Verdict},
};
use crate::{
    common::layout::Layout,
    e2e,
    test::{
        lane_run::{Ran, SuiteRun},
        steps::{INTERRUPTED, Stop},
    },
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
    let stop = Stop::on_ctrl_c();
    let cluster =
        Cluster { checkout: &checkout, version: version.as_deref(), runner: &runner, out: &out, stop: &stop };

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
        Verdict::Caught(specs) => format!("caught: {} spec(s) failed an assertion, twice", specs.len()),
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
    /// Set by Ctrl-C.
    stop: &'a Stop,
}

/// A lane run that Ctrl-C stopped.
struct Interrupted;

impl Cluster<'_> {
    /// The unmutated checkout's lanes: per lane the specs that passed; `None` when interrupted.
    /// A failure in one fails the command.
    async fn baseline(&self, mutants: &[Mutant]) -> Result<Option<BTreeMap<Lane, HashSet<String>>>> {
        self.up().await.context("bring the cluster up from the unmutated checkout")?;
        let lanes: std::collections::BTreeSet<Lane> = mutants.iter().map(|m| m.lane).collect();
        let mut passed = BTreeMap::new();
        for lane in lanes {
            let Ok(ran) =
                self.run(lane.selection(), &format!("baseline-{}", lane.name().replace(' ', "-"))).await?
            else {
                return Ok(None);
            };
            let failed = ran.failed();
            if !failed.is_empty() || ran.code != 0 {
                bail!(
                    "without any mutant, the {} lane fails (dra-e2e exited with {}): {}; a mutant's failures would prove nothing (fix those first, or --no-baseline)",
                    lane.name(),
                    ran.code,
                    crate::test::report::summary(&failed)
                );
            }
            passed.insert(lane, ran.specs.iter().filter(|s| s.passed()).map(|s| s.name.clone()).collect());
        }
        Ok(Some(passed))
    }

    /// Puts `mutant` in, brings the cluster up from the checkout, runs its lane and the specs
    /// that failed an assertion once more; the mutant comes out again whatever happened. `None`
    /// when Ctrl-C came: no verdict. `baseline`: the lane's specs that passed without it.
    async fn check(&self, mutant: &Mutant, baseline: Option<&HashSet<String>>) -> Option<Verdict> {
        let applied = match checkout::apply(self.checkout, mutant) {
            Ok(applied) => applied,
            Err(e) => return Some(Verdict::NotChecked(format!("{e:#}"))),
        };
        let verdict = self.judge(mutant, baseline).await;
        drop(applied);
        verdict.ok()
    }

    /// [`Cluster::check`] once the mutant is in.
    async fn judge(
        &self,
        mutant: &Mutant,
        baseline: Option<&HashSet<String>>,
    ) -> Result<Verdict, Interrupted> {
        let up = self.up().await;
        self.interrupted()?;
        if let Err(e) = up {
            return Ok(Verdict::NotChecked(format!("cluster up from the mutated checkout: {e:#}")));
        }
        let first = match self.run(mutant.lane.selection(), mutant.name).await {
            Ok(ran) => ran?,
            Err(e) => return Ok(Verdict::NotChecked(format!("{e:#}"))),
        };
        let candidates = match verdict::first_run(&first.specs, baseline) {
            FirstRun::Done(verdict) => return Ok(verdict),
            FirstRun::Confirm(candidates) => candidates,
        };
        println!(
            "==> mutant {}: {} spec(s) failed an assertion; running them again",
            mutant.name,
            candidates.len()
        );
        let focus: Vec<String> = candidates
            .iter()
            .flat_map(|c| ["--focus".to_owned(), format!("^{}$", regex::escape(&c.name))])
            .collect();
        let focus: Vec<&str> = focus.iter().map(String::as_str).collect();
        match self.run(&focus, &format!("{}-again", mutant.name)).await {
            Ok(again) => Ok(verdict::confirm(&candidates, &again?.specs)),
            Err(e) => Ok(Verdict::NotChecked(format!("running the failed specs again: {e:#}"))),
        }
    }

    /// `Err` once Ctrl-C came.
    fn interrupted(&self) -> Result<(), Interrupted> {
        if self.stop.go_on() { Ok(()) } else { Err(Interrupted) }
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

    /// Runs `selection` as the run `name` (its reports `<name>.json` and `.xml`, fresh: see
    /// [`SuiteRun`]); the inner `Err` when Ctrl-C came.
    async fn run(&self, selection: &[&str], name: &str) -> Result<Result<Ran, Interrupted>> {
        let repo = crate::repo::repo_root();
        let kubeconfig = Layout::from_env(repo.clone())?.kubeconfig();
        let artifacts = self.out.join(name).join("artifacts");
        let suite = SuiteRun::in_dir(self.out, &artifacts, selection, name, crate::test::LANE_PROCS);
        let texts = crate::test::lane_run::texts_version(&repo, &kubeconfig).await?;
        let ran = suite.run(self.runner, &kubeconfig, &texts).await;
        if self.interrupted().is_err()
            || ran.as_ref().is_ok_and(|r| i64::from(r.code) == i64::from(INTERRUPTED))
        {
            return Ok(Err(Interrupted));
        }
        Ok(Ok(ran?))
    }
}
