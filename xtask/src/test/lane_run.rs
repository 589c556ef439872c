//! One dra-e2e run of a lane, and what it must have run. Before the run its reports are
//! deleted (a run that writes none is never judged on an earlier run's) and its expected
//! selection is listed from the registry: `dra-e2e --list` with the lane's arguments and the spec
//! texts of the cluster's version (both runs get that `--k8s-version`, so the list and the run
//! are of one registry). After it, the lane passes only when every listed spec is in the report,
//! none that is not listed is, none failed, every skip is one of the lane's documented host skips
//! ([`super::host_skips`]), and dra-e2e exited 0. A selection that lists no spec fails at once.
//!
//! A lane split over machines (`cargo xtask test --partition`) runs one slice of its specs
//! (`dra-e2e --partition slice:k/n`, in the list and in the run alike, so the list is the
//! slice's): its report also has the other slices' specs, each skipped `in shard j of n`. Those
//! skips, of specs the list does not have, are the only thing it accepts beyond an unsplit
//! lane.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    host_skips::HostSkips,
    partition::Slice,
    report::{self, ReportedSpec},
};
use crate::e2e;

/// How long `dra-e2e --list` may take (it builds the registry and prints it, nothing more).
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// A lane's dra-e2e run: its arguments and reports.
#[derive(Debug, Clone)]
pub(crate) struct SuiteRun {
    /// Its reports' stem (`<stem>.json`, `<stem>.xml`), also its name in docs/lanes.md's host
    /// skips: `suites`, `workload`, `kind`, …
    pub stem: String,
    /// Its selection (`--focus`, `--skip`, `--driver`, …).
    pub selection: Vec<String>,
    /// dra-e2e's arguments: the selection, how many specs at once, the reports, the artifacts.
    pub args: Vec<String>,
    /// The JSON report.
    pub json: PathBuf,
    /// The JUnit report.
    pub junit: PathBuf,
    /// The slice of the specs it runs, when its lane is split over machines.
    pub slice: Option<Slice>,
}

impl SuiteRun {
    /// The run of `selection` with `procs` specs at once, its reports `<target>/e2e/<stem>.*`
    /// and the artifacts under `<target>/e2e/artifacts`.
    pub(crate) fn new(repo: &Path, selection: &[&str], stem: &str, procs: &str) -> Self {
        let out = e2e::target_dir(repo).join("e2e");
        Self::in_dir(&out, &out.join("artifacts"), selection, stem, procs)
    }

    /// [`SuiteRun::new`] with its reports in `out` and its artifacts in `artifacts`.
    pub(crate) fn in_dir(out: &Path, artifacts: &Path, selection: &[&str], stem: &str, procs: &str) -> Self {
        let (json, junit) = (out.join(format!("{stem}.json")), out.join(format!("{stem}.xml")));
        let selection: Vec<String> = selection.iter().map(|s| s.to_string()).collect();
        let mut args = selection.clone();
        args.extend(["-p", procs, "--junit"].map(String::from));
        args.push(junit.display().to_string());
        args.push(report::FLAG.to_owned());
        args.push(json.display().to_string());
        args.push("--artifacts".to_owned());
        args.push(artifacts.display().to_string());
        Self { stem: stem.to_owned(), selection, args, json, junit, slice: None }
    }

    /// The same run of only `slice` of its specs (`--partition slice:k/n` in its selection);
    /// unchanged without one.
    pub(crate) fn sliced(mut self, slice: Option<Slice>) -> Self {
        if let Some(slice) = slice {
            let flag = ["--partition".to_owned(), slice.flag()];
            self.selection.extend(flag.clone());
            self.args.splice(0..0, flag);
            self.slice = Some(slice);
        }
        self
    }

    /// Deletes the reports, lists the selection with the texts of Kubernetes `texts`, runs it
    /// with `runner` against `kubeconfig` and reads its fresh JSON report.
    pub(crate) async fn run(&self, runner: &Path, kubeconfig: &Path, texts: &str) -> Result<Ran> {
        for file in [&self.json, &self.junit] {
            match std::fs::remove_file(file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("delete the earlier report {}", file.display()));
                }
                _ => {}
            }
        }
        let mut args = vec!["--k8s-version".to_owned(), texts.to_owned()];
        args.extend(self.args.iter().cloned());
        let expected = list(runner, kubeconfig, &args).await?;
        if expected.is_empty() {
            bail!(
                "the selection `{}` lists no spec (texts of {texts}): the lane would test nothing",
                self.selection.join(" ")
            );
        }
        eprintln!("==> {}: {} spec(s) selected (texts of Kubernetes {texts})", self.stem, expected.len());
        let code = e2e::run_runner(runner, kubeconfig, &args).await?;
        if !self.json.exists() {
            return Err(NoReport { code, path: self.json.clone() }.into());
        }
        let specs = report::specs(&report::read(&self.json)?);
        Ok(Ran { stem: self.stem.clone(), expected, code, specs, slice: self.slice })
    }
}

/// A run that wrote no report: nothing of it can be judged.
#[derive(Debug)]
pub(crate) struct NoReport {
    /// dra-e2e's exit code.
    pub code: i32,
    /// The report it should have written.
    pub path: PathBuf,
}

impl std::fmt::Display for NoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dra-e2e exited with {} and wrote no report {}", self.code, self.path.display())
    }
}

impl std::error::Error for NoReport {}

/// The full texts of the specs `dra-e2e --list` selects with `args`.
async fn list(runner: &Path, kubeconfig: &Path, args: &[String]) -> Result<Vec<String>> {
    let mut cmd = tokio::process::Command::new(runner);
    cmd.arg("--kubeconfig").arg(kubeconfig).arg("--list").args(args).kill_on_drop(true);
    let out = tokio::time::timeout(LIST_TIMEOUT, cmd.output())
        .await
        .with_context(|| {
            format!("dra-e2e --list did not end within {}", crate::progress::human(LIST_TIMEOUT))
        })?
        .with_context(|| format!("run {} --list", runner.display()))?;
    if !out.status.success() {
        bail!(
            "dra-e2e --list {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // One full text a line; with -v a description follows, indented.
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with(char::is_whitespace))
        .map(String::from)
        .collect())
}

/// A run that ended and wrote its report.
#[derive(Debug, Clone)]
pub(crate) struct Ran {
    /// The run's stem.
    pub stem: String,
    /// The specs its selection listed.
    pub expected: Vec<String>,
    /// dra-e2e's exit code.
    pub code: i32,
    /// The specs of its report.
    pub specs: Vec<ReportedSpec>,
    /// The slice it ran, when its lane is split over machines.
    pub slice: Option<Slice>,
}

impl Ran {
    /// Its failed specs.
    pub(crate) fn failed(&self) -> Vec<&ReportedSpec> {
        self.specs.iter().filter(|s| s.failed()).collect()
    }

    /// The specs of its report that are another slice's: not listed, skipped `in shard j of n`
    /// (none when its lane is not split).
    fn other_slices(&self) -> HashSet<&str> {
        let listed: HashSet<&str> = self.expected.iter().map(String::as_str).collect();
        let Some(slice) = self.slice else { return HashSet::new() };
        self.specs
            .iter()
            .filter(|s| s.skipped() && slice.is_elsewhere(&s.message) && !listed.contains(s.name.as_str()))
            .map(|s| s.name.as_str())
            .collect()
    }

    /// Fails when a listed spec is not in the report, when the report has a spec the selection
    /// does not list (but another slice's, skipped as such, when the lane is split), or when a
    /// spec skipped for a reason `skips` does not document for the lane.
    pub(crate) fn check_selection_ran(&self, skips: &HostSkips) -> Result<()> {
        let reported: HashSet<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
        let missing: Vec<&str> =
            self.expected.iter().map(String::as_str).filter(|name| !reported.contains(name)).collect();
        if !missing.is_empty() {
            bail!(
                "{} of the {} specs selected did not run (they are not in the report): {}",
                missing.len(),
                self.expected.len(),
                missing.iter().take(5).copied().collect::<Vec<_>>().join("; ")
            );
        }
        let listed: HashSet<&str> = self.expected.iter().map(String::as_str).collect();
        let elsewhere = self.other_slices();
        let unlisted: Vec<&str> = self
            .specs
            .iter()
            .map(|s| s.name.as_str())
            .filter(|name| !listed.contains(name) && !elsewhere.contains(name))
            .collect();
        if !unlisted.is_empty() {
            bail!(
                "the run ran {} spec(s) that its selection does not list (another version's texts?): {}",
                unlisted.len(),
                unlisted.iter().take(5).copied().collect::<Vec<_>>().join("; ")
            );
        }
        let undocumented: Vec<&ReportedSpec> = self
            .specs
            .iter()
            .filter(|s| {
                s.skipped()
                    && !elsewhere.contains(s.name.as_str())
                    && !skips.documents(&self.stem, &s.name, &s.message)
            })
            .collect();
        if !undocumented.is_empty() {
            bail!(
                "{} spec(s) skipped for a reason {} does not document for lane `{}`: {}",
                undocumented.len(),
                skips.source.display(),
                self.stem,
                report::named(&undocumented, |_| "skipped".to_owned())
            );
        }
        Ok(())
    }

    /// A lane's verdict: no spec failed, the selection ran ([`Ran::check_selection_ran`]) and
    /// dra-e2e exited 0. What ran, counted, when it passed.
    pub(crate) fn judge(&self, skips: &HostSkips) -> Result<String> {
        let failed = self.failed();
        if !failed.is_empty() {
            bail!("dra-e2e exited with {}: {}", self.code, report::summary(&failed));
        }
        self.check_selection_ran(skips)?;
        if self.code != 0 {
            bail!(
                "dra-e2e exited with {} though no spec failed: the run itself failed (a clean-up at its end, an interrupt: see its output)",
                self.code
            );
        }
        Ok(self.counts())
    }

    /// `63 passed, 5 skipped (documented) of 68 selected`, and for a slice `… of 34 selected
    /// (slice 1/2; 34 in the other slices)`.
    pub(crate) fn counts(&self) -> String {
        let elsewhere = self.other_slices();
        let passed = self.specs.iter().filter(|s| s.passed()).count();
        let skipped =
            self.specs.iter().filter(|s| s.skipped() && !elsewhere.contains(s.name.as_str())).count();
        let skipped = if skipped > 0 { format!(", {skipped} skipped (documented)") } else { String::new() };
        let slice = match self.slice {
            Some(slice) => format!(" (slice {slice}; {} in the other slices)", elsewhere.len()),
            None => String::new(),
        };
        format!("{passed} passed{skipped} of {} selected{slice}", self.expected.len())
    }
}

/// The Kubernetes version whose spec texts dra-e2e uses for the cluster of `kubeconfig`, by
/// dra-e2e's own rule ([`spec_runner::table_for_server`]) over the versions it has texts for
/// (`suites/upstream/specs-V.txt`): the cluster's, else the newest of its minor, else the oldest.
pub(crate) async fn texts_version(repo: &Path, kubeconfig: &Path) -> Result<String> {
    let client = crate::kube_api::client_for(kubeconfig).await?;
    let server = client.apiserver_version().await.context("ask the cluster its version")?;
    texts_for(&known_versions(repo)?, &server.git_version)
}

/// The versions dra-e2e has spec texts for, oldest first.
fn known_versions(repo: &Path) -> Result<Vec<String>> {
    let dir = repo.join("suites/upstream");
    let mut versions: Vec<crate::common::kube_version::KubeVersion> = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| {
            e.ok()?.file_name().to_str()?.strip_prefix("specs-")?.strip_suffix(".txt").map(String::from)
        })
        .filter_map(|v| crate::common::kube_version::KubeVersion::parse(&v).ok())
        .collect();
    versions.sort();
    Ok(versions.iter().map(ToString::to_string).collect())
}

/// The texts for a cluster at `git_version`, of `known` (oldest first).
fn texts_for(known: &[String], git_version: &str) -> Result<String> {
    // spec-runner's rule takes a process's tables; these few, made once per lane, are leaked.
    let tables: Vec<spec_runner::GateTable> = known
        .iter()
        .map(|v| spec_runner::GateTable {
            version: Box::leak(v.clone().into_boxed_str()),
            gates: &[],
            removed: &[],
        })
        .collect();
    let tables: &'static [spec_runner::GateTable] = Box::leak(tables.into_boxed_slice());
    match spec_runner::table_for_server(tables, git_version).or(tables.first()) {
        Some(table) => Ok(table.version.to_owned()),
        None => bail!("dra-e2e has spec texts for no version (suites/upstream/specs-*.txt)"),
    }
}

#[cfg(test)]
mod split_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
pub(crate) mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A stand-in for dra-e2e, a real process: `--list` prints `listed`; a run writes `report`
    /// (if any) to its `--json-report` and exits with `code`.
    pub(crate) fn fake_runner(
        dir: &Path,
        listed: &[&str],
        report: Option<serde_json::Value>,
        code: i32,
    ) -> PathBuf {
        let data = dir.join("fake-report.json");
        let copy = match report {
            Some(report) => {
                std::fs::write(&data, report.to_string()).unwrap();
                format!("cp {} \"$json\"", data.display())
            }
            None => String::new(),
        };
        let list: String = listed.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.join("fake-list.txt"), list).unwrap();
        let script = format!(
            "#!/bin/sh\nlist=no; json=\nwhile [ $# -gt 0 ]; do\n  case \"$1\" in --list) list=yes;; --json-report) json=\"$2\"; shift;; esac\n  shift\ndone\n\
             if [ $list = yes ]; then cat {d}/fake-list.txt; exit 0; fi\n{copy}\nexit {code}\n",
            d = dir.display()
        );
        let program = dir.join("fake-dra-e2e");
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        program
    }

    /// A report of `specs`: (name, state, message).
    pub(crate) fn report_of(specs: &[(&str, &str, &str)]) -> serde_json::Value {
        let specs: Vec<serde_json::Value> = specs
            .iter()
            .map(|(name, state, message)| {
                serde_json::json!({ "LeafNodeText": name, "State": state,
                    "Failure": { "Message": message, "FailureNodeType": "It" } })
            })
            .collect();
        serde_json::json!([{ "SpecReports": specs }])
    }

    pub(crate) fn no_skips() -> HostSkips {
        HostSkips::parse(
            "## Host skips\n| Lanes | Spec | Skip reason | Why |\n|---|---|---|---|\n",
            "lanes.md".into(),
        )
        .unwrap()
    }

    /// A run whose reports go to `dir`, with `runner`.
    pub(crate) async fn run_in(dir: &Path, runner: &Path, stem: &str) -> Result<Ran> {
        let suite = SuiteRun::in_dir(dir, &dir.join("artifacts"), &["--focus", "x"], stem, "1");
        suite.run(runner, Path::new("/k.conf"), "v1.37.2").await
    }

    #[tokio::test]
    async fn a_lane_whose_selection_lists_no_spec_fails_before_it_runs() {
        // The old step judged dra-e2e's exit code alone: a run of nothing exits 0.
        let dir = tempfile::tempdir().unwrap();
        let runner = fake_runner(dir.path(), &[], Some(report_of(&[])), 0);
        let err = format!("{:#}", run_in(dir.path(), &runner, "lane").await.unwrap_err());
        assert!(err.contains("the selection `--focus x` lists no spec"), "{err}");
        assert!(!dir.path().join("lane.json").exists(), "it must not have run");
    }

    #[tokio::test]
    async fn a_lane_whose_specs_all_skip_fails_unless_each_skip_is_documented() {
        let dir = tempfile::tempdir().unwrap();
        let reason = "the API server runs with feature gate GenericWorkload off; a cluster with them: …";
        let report =
            report_of(&[("GenericWorkload a", "skipped", reason), ("GenericWorkload b", "skipped", reason)]);
        let runner = fake_runner(dir.path(), &["GenericWorkload a", "GenericWorkload b"], Some(report), 0);
        let ran = run_in(dir.path(), &runner, "kind").await.unwrap();
        let err = format!("{:#}", ran.judge(&no_skips()).unwrap_err());
        assert!(
            err.contains("2 spec(s) skipped for a reason lanes.md does not document for lane `kind`"),
            "{err}"
        );
        assert!(err.contains("GenericWorkload a skipped: the API server runs with feature gate"), "{err}");
        let documented = HostSkips::parse(
            "## Host skips\n| Lanes | Spec | Skip reason | Why |\n|---|---|---|---|\n| `kind` | `GenericWorkload` | `feature gate GenericWorkload off` | gates off |\n",
            "lanes.md".into(),
        )
        .unwrap();
        assert_eq!(ran.judge(&documented).unwrap(), "0 passed, 2 skipped (documented) of 2 selected");
        // The same skips on another lane are not documented.
        let elsewhere = Ran { stem: "suites".into(), ..ran };
        assert!(elsewhere.judge(&documented).is_err());
    }

    #[tokio::test]
    async fn a_run_that_writes_no_report_is_not_judged_on_an_earlier_one() {
        let dir = tempfile::tempdir().unwrap();
        // An earlier run's report, all passed.
        std::fs::write(dir.path().join("lane.json"), report_of(&[("a", "passed", "")]).to_string()).unwrap();
        std::fs::write(dir.path().join("lane.xml"), "<testsuites/>").unwrap();
        for code in [2, 0] {
            let runner = fake_runner(dir.path(), &["a"], None, code);
            let err = format!("{:#}", run_in(dir.path(), &runner, "lane").await.unwrap_err());
            assert!(err.contains(&format!("dra-e2e exited with {code} and wrote no report")), "{err}");
            assert!(!dir.path().join("lane.xml").exists(), "the earlier JUnit report is deleted too");
        }
    }

    #[tokio::test]
    async fn a_spec_that_did_not_run_or_was_not_selected_fails_the_lane() {
        let dir = tempfile::tempdir().unwrap();
        let runner = fake_runner(dir.path(), &["a", "b"], Some(report_of(&[("a", "passed", "")])), 0);
        let err = format!(
            "{:#}",
            run_in(dir.path(), &runner, "lane").await.unwrap().judge(&no_skips()).unwrap_err()
        );
        assert!(
            err.contains("1 of the 2 specs selected did not run (they are not in the report): b"),
            "{err}"
        );
        let runner =
            fake_runner(dir.path(), &["a"], Some(report_of(&[("a", "passed", ""), ("c", "passed", "")])), 0);
        let err = format!(
            "{:#}",
            run_in(dir.path(), &runner, "lane").await.unwrap().judge(&no_skips()).unwrap_err()
        );
        assert!(err.contains("ran 1 spec(s) that its selection does not list"), "{err}");
    }

    #[tokio::test]
    async fn a_run_that_failed_outside_its_specs_fails_the_lane() {
        let dir = tempfile::tempdir().unwrap();
        let runner = fake_runner(dir.path(), &["a"], Some(report_of(&[("a", "passed", "")])), 2);
        let ran = run_in(dir.path(), &runner, "lane").await.unwrap();
        let err = format!("{:#}", ran.judge(&no_skips()).unwrap_err());
        assert!(err.contains("dra-e2e exited with 2 though no spec failed"), "{err}");
        let runner = fake_runner(dir.path(), &["a"], Some(report_of(&[("a", "passed", "")])), 0);
        let ran = run_in(dir.path(), &runner, "lane").await.unwrap();
        assert_eq!(ran.judge(&no_skips()).unwrap(), "1 passed of 1 selected");
    }

    #[test]
    fn the_texts_are_the_cluster_s_else_its_minor_s_newest_else_the_oldest() {
        let known: Vec<String> = ["v1.37.2", "v1.38.0-beta.0"].map(String::from).to_vec();
        assert_eq!(texts_for(&known, "v1.37.2").unwrap(), "v1.37.2");
        assert_eq!(texts_for(&known, "v1.37.0").unwrap(), "v1.37.2");
        assert_eq!(texts_for(&known, "v1.38.0-beta.0.12+abc").unwrap(), "v1.38.0-beta.0");
        assert_eq!(texts_for(&known, "v1.30.1").unwrap(), "v1.37.2");
        assert!(texts_for(&[], "v1.37.2").is_err());
    }

    #[test]
    fn the_known_versions_are_those_of_suites_versions_rs() {
        let repo = crate::repo::repo_root();
        let source = std::fs::read_to_string(repo.join("suites/src/versions.rs")).unwrap();
        let tables: Vec<&str> = source
            .lines()
            .filter_map(|l| l.trim().strip_prefix("version: \"")?.strip_suffix("\","))
            .collect();
        assert_eq!(known_versions(&repo).unwrap(), tables);
    }

    #[test]
    fn a_recorded_run_whose_specs_all_skip_passes_only_where_docs_lanes_md_documents_it() {
        // `dra-e2e --focus GenericWorkload` on the local cluster as kind.yaml starts it (the gates
        // off): all five skip, dra-e2e exits 0.
        let repo = crate::repo::repo_root();
        let recorded = repo.join("xtask/src/test/recorded/kind-generic-workload-skipped.json");
        let specs = report::specs(&report::read(&recorded).unwrap());
        assert_eq!(specs.iter().filter(|s| s.skipped()).count(), 5);
        let expected = specs.iter().map(|s| s.name.clone()).collect();
        let skips = HostSkips::load(&repo).unwrap();
        let kind = Ran { stem: "kind".into(), expected, code: 0, specs, slice: None };
        assert_eq!(kind.judge(&skips).unwrap(), "0 passed, 5 skipped (documented) of 5 selected");
        for lane in ["workload", "next-release-workload", "suites"] {
            let other = Ran { stem: lane.into(), ..kind.clone() };
            let err = format!("{:#}", other.judge(&skips).unwrap_err());
            assert!(
                err.contains("5 spec(s) skipped for a reason") && err.contains(&format!("lane `{lane}`")),
                "{err}"
            );
        }
    }
}
