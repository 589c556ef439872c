//! The local cluster built from a Kubernetes checkout with one mutant in, and the lane runs that
//! judge it ([`super::verdict`]): the baseline's, a mutant's, and the second run of the specs
//! that caught it. Ctrl-C (seen through [`Stop`]) ends a check with no verdict; the mutant comes
//! out of the checkout whatever happened.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use super::{
    catalogue::{Lane, Mutant},
    checkout,
    verdict::{self, FirstRun, Verdict},
};
use crate::test::{
    lane_run::{NoReport, Ran, SuiteRun},
    steps::{INTERRUPTED, Stop},
};

/// This xtask, as a child: `cluster up` and `cluster build` run through it.
pub(super) const THIS_XTASK: &str = "/proc/self/exe";

/// This xtask (a child, so that `KUBE_GIT_VERSION` can be given to it alone: an assembled
/// checkout has no git tags to tell its version).
pub(super) fn xtask_command(
    xtask: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    version: Option<&str>,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(xtask);
    cmd.args(args).kill_on_drop(true);
    if let Some(version) = version {
        cmd.env("KUBE_GIT_VERSION", version);
    }
    cmd
}

/// The local cluster built from the checkout, and the suites run against it.
pub(super) struct Cluster<'a> {
    /// The Kubernetes checkout the mutants go into.
    pub checkout: &'a Path,
    /// `KUBE_GIT_VERSION` for an assembled checkout (it has no git tags).
    pub version: Option<&'a str>,
    /// dra-e2e.
    pub runner: &'a Path,
    /// Where the runs' reports and artifacts go.
    pub out: &'a Path,
    /// Set by Ctrl-C.
    pub stop: &'a Stop,
    /// The xtask that brings the cluster up ([`THIS_XTASK`]).
    pub xtask: &'a Path,
    /// The cluster's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The spec texts of the cluster's version, asked once it is up.
    pub texts: tokio::sync::OnceCell<String>,
}

/// A lane run that Ctrl-C stopped.
#[derive(Debug)]
pub(super) struct Interrupted;

impl Cluster<'_> {
    /// The unmutated checkout's lanes: per lane the specs that passed; `None` when interrupted.
    /// A failure in one fails the command.
    pub(super) async fn baseline(
        &self,
        mutants: &[Mutant],
    ) -> Result<Option<BTreeMap<Lane, HashSet<String>>>> {
        self.up().await.context("bring the cluster up from the unmutated checkout")?;
        let lanes: BTreeSet<Lane> = mutants.iter().map(|m| m.lane).collect();
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
    pub(super) async fn check(&self, mutant: &Mutant, baseline: Option<&HashSet<String>>) -> Option<Verdict> {
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
        let rerun = verdict::to_confirm(&candidates);
        println!(
            "==> mutant {}: {} spec(s) failed an assertion; running {} of them again",
            mutant.name,
            candidates.len(),
            rerun.len()
        );
        let focus: Vec<String> = rerun
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
        let mut cmd = xtask_command(
            self.xtask,
            &["cluster", "up", "--provider", "local", "--k8s-source"],
            self.version,
        );
        let status = cmd.arg(self.checkout).status().await.context("run cargo xtask cluster up")?;
        if !status.success() {
            bail!("cargo xtask cluster up --k8s-source {} failed ({status})", self.checkout.display());
        }
        Ok(())
    }

    /// `cluster up` at the pinned release.
    pub(super) async fn back_to_release(&self) -> Result<()> {
        let status =
            xtask_command(self.xtask, &["cluster", "up", "--provider", "local"], None).status().await?;
        if !status.success() {
            bail!("cargo xtask cluster up failed ({status})");
        }
        Ok(())
    }

    /// Runs `selection` as the run `name` (its reports `<name>.json` and `.xml`, fresh: see
    /// [`SuiteRun`]); the inner `Err` when Ctrl-C came.
    async fn run(&self, selection: &[&str], name: &str) -> Result<Result<Ran, Interrupted>> {
        let artifacts = self.out.join(name).join("artifacts");
        let suite = SuiteRun::in_dir(self.out, &artifacts, selection, name, crate::test::LANE_PROCS);
        let repo = crate::repo::repo_root();
        let texts = self
            .texts
            .get_or_try_init(|| crate::test::lane_run::texts_version(&repo, &self.kubeconfig))
            .await?;
        let ran = suite.run(self.runner, &self.kubeconfig, texts).await;
        // A run that ended as Ctrl-C ends it (exit 130), even before this process saw the signal.
        let code = match &ran {
            Ok(ran) => Some(ran.code),
            Err(e) => e.downcast_ref::<NoReport>().map(|no| no.code),
        };
        if self.interrupted().is_err() || code == Some(i32::from(INTERRUPTED)) {
            return Ok(Err(Interrupted));
        }
        Ok(Ok(ran?))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt as _};

    use super::*;
    use crate::{
        common::own_process::{Process, in_own_process},
        mutants::checkout::tests::MUTANT,
        test::lane_run::tests::report_of,
    };

    const SPEC: &str = "[sig-node] kubelet must unprepare";

    /// A checkout, a stand-in xtask (`cluster up` passes) and a stand-in dra-e2e, real processes:
    /// the runner lists `list-<phase>.txt`, writes `report-<phase>.json` and exits with
    /// `code-<phase>` (phase `again` for the second run of a mutant's failed specs, else
    /// `first`), or, when `interrupt` exists, sends SIGINT to the test process (Ctrl-C) and
    /// exits 130 with no report. Every run's arguments go to `args.log`.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            fs::create_dir_all(d.join("checkout/pkg")).unwrap();
            fs::write(d.join("checkout/pkg/a.go"), "if x > 1 {}\n").unwrap();
            let runner = format!(
                "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\" >> {d}/args.log; done\necho --- >> {d}/args.log\n\
                 json=; list=no\nwhile [ $# -gt 0 ]; do case \"$1\" in --list) list=yes;; --json-report) json=\"$2\"; shift;; esac; shift; done\n\
                 case \"$json\" in *-again.json) phase=again;; *) phase=first;; esac\n\
                 if [ $list = yes ]; then cat {d}/list-$phase.txt; exit 0; fi\n\
                 if [ -f {d}/interrupt ]; then kill -INT $PPID; exit 130; fi\n\
                 cp {d}/report-$phase.json \"$json\"; exit $(cat {d}/code-$phase)\n",
                d = d.display()
            );
            for (name, script) in [("xtask", "#!/bin/sh\nexit 0\n".to_owned()), ("dra-e2e", runner)] {
                fs::write(d.join(name), script).unwrap();
                fs::set_permissions(d.join(name), fs::Permissions::from_mode(0o755)).unwrap();
            }
            Self { dir }
        }

        fn phase(&self, phase: &str, specs: &[(&str, &str, &str)], code: i32) {
            let d = self.dir.path();
            let list: String = specs.iter().map(|(name, _, _)| format!("{name}\n")).collect();
            fs::write(d.join(format!("list-{phase}.txt")), list).unwrap();
            fs::write(d.join(format!("report-{phase}.json")), report_of(specs).to_string()).unwrap();
            fs::write(d.join(format!("code-{phase}")), code.to_string()).unwrap();
        }

        async fn check(&self, stop: &Stop, baseline: Option<&HashSet<String>>) -> Option<Verdict> {
            let d = self.dir.path();
            let (checkout, runner, xtask) = (d.join("checkout"), d.join("dra-e2e"), d.join("xtask"));
            let cluster = Cluster {
                checkout: &checkout,
                version: None,
                runner: &runner,
                out: d,
                stop,
                xtask: &xtask,
                kubeconfig: d.join("kubeconfig"),
                texts: tokio::sync::OnceCell::new_with(Some("v1.37.2".to_owned())),
            };
            cluster.check(&MUTANT, baseline).await
        }

        fn checkout_is_unmutated(&self) {
            let pkg = self.dir.path().join("checkout/pkg");
            assert_eq!(fs::read_to_string(pkg.join("a.go")).unwrap(), "if x > 1 {}\n");
            assert_eq!(fs::read_dir(&pkg).unwrap().count(), 1, "nothing left beside it");
        }
    }

    #[tokio::test]
    async fn a_mutant_is_caught_by_an_assertion_that_repeats_when_its_spec_runs_again() {
        let fixture = Fixture::new();
        fixture.phase(
            "first",
            &[(SPEC, "failed", "called 0 times, want 1"), ("b", "timedout", "timed out")],
            1,
        );
        fixture.phase("again", &[(SPEC, "failed", "called 0 times, want 1")], 1);
        let baseline: HashSet<String> = [SPEC, "b"].map(String::from).into();
        let verdict = fixture.check(&Stop::default(), Some(&baseline)).await;
        let Some(Verdict::Caught { specs, .. }) = verdict else { panic!("{verdict:?}") };
        assert_eq!(specs.iter().map(|s| s.text.as_str()).collect::<Vec<_>>(), [SPEC]);
        // The second run selected exactly that spec.
        let args = fs::read_to_string(fixture.dir.path().join("args.log")).unwrap();
        assert!(args.contains("--focus\n^\\[sig\\-node\\] kubelet must unprepare$\n"), "{args}");
        fixture.checkout_is_unmutated();
    }

    #[tokio::test]
    async fn an_assertion_that_does_not_repeat_is_a_flake_not_a_catch() {
        let fixture = Fixture::new();
        fixture.phase("first", &[(SPEC, "failed", "called 0 times, want 1")], 1);
        fixture.phase("again", &[(SPEC, "passed", "")], 0);
        let verdict = fixture.check(&Stop::default(), None).await;
        let Some(Verdict::NotChecked(why)) = verdict else { panic!("{verdict:?}") };
        assert!(why.contains("did not repeat"), "{why}");
        fixture.checkout_is_unmutated();
    }

    #[tokio::test]
    async fn ctrl_c_during_a_lane_run_gives_no_verdict_and_puts_the_checkout_back() {
        // The old command judged the interrupted run's failures a catch and went on. The SIGINT
        // to this process would reach every other test's stand-in dra-e2e: a process of its own.
        let test = "ctrl_c_during_a_lane_run_gives_no_verdict_and_puts_the_checkout_back";
        let Process::Own = in_own_process(module_path!(), test) else { return };
        let fixture = Fixture::new();
        fixture.phase("first", &[(SPEC, "interrupted", "interrupted (Ctrl-C) while running")], 130);
        fs::write(fixture.dir.path().join("interrupt"), "").unwrap();
        let stop = Stop::on_ctrl_c();
        let verdict = fixture.check(&stop, None).await;
        assert_eq!(verdict, None);
        fixture.checkout_is_unmutated();
        // The signal reached this process too (the run's stop is what ends the command).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while stop.go_on() {
            assert!(tokio::time::Instant::now() < deadline, "SIGINT never reached the command");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
