//! `report merge FILE…`: the JSON reports of one run's shards (`--partition`) as one report.
//!
//! The selection is every spec the files list. Each file ran the specs it does not list as
//! skipped `in shard K of N`; a spec that ran in two files is an overlap, one that ran in none
//! (every file that lists it skipped it for another shard) is a gap. The same spec several times
//! in one file is a `--repeat` run's rounds, not an overlap. The merged JSON report holds each
//! file's spec entries as they were (the other shards' skips left out, but a gap's kept), the
//! merged JUnit report one test case per spec run. Exit code: 0 when the files cover the
//! selection exactly and nothing failed, 1 when a spec failed or the cover is not exact (saying
//! which specs), 2 when a file cannot be used.

use std::{
    collections::HashMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, SystemTime},
};

use serde_json::{Value, json};

use crate::{
    duration,
    report::ginkgo_json::{self, ReadSpec, ReportFile},
    report::json_report::{SHARD_ENTRY, rfc3339},
    report::junit,
    report::outcome::{Outcome, RunReport},
    select::partition::{Shard, elsewhere_shard},
};

/// `report merge`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct MergeArgs {
    /// The JSON reports (--json-report) of the shards of one run, in any order.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Write the merged report in the schema of ginkgo's JSON report to this file.
    #[arg(long, value_name = "FILE")]
    pub json_report: Option<PathBuf>,

    /// Write the merged JUnit XML report to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

/// The files cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A file cannot be read or is no ginkgo JSON report.
    #[error(transparent)]
    Read(#[from] ginkgo_json::ReadError),
    /// A file holds no report.
    #[error("{0} holds no report (an empty array); give the --json-report of a run")]
    Empty(PathBuf),
    /// The files are of different suites.
    #[error(
        "{first} is a report of the suite {first_suite:?} and {other} of {other_suite:?}: merge the reports of one suite"
    )]
    Suites {
        /// The first file.
        first: PathBuf,
        /// Its suite.
        first_suite: String,
        /// A file of another suite.
        other: PathBuf,
        /// That suite.
        other_suite: String,
    },
    /// An output cannot be written.
    #[error("{0}")]
    Write(String),
}

/// One spec of the selection: where it ran.
#[derive(Debug)]
struct Cover {
    text: String,
    /// The files that ran it (indices into the files).
    ran_in: Vec<usize>,
    /// The shard the first file that skipped it for another shard named.
    elsewhere: Option<Shard>,
    /// A spec entry that skipped it for another shard: the merged report's, if it ran nowhere.
    skipped_entry: Option<ReadSpec>,
}

/// The merge of some shards' reports.
#[derive(Debug)]
pub struct Merged {
    files: Vec<ReportFile>,
    /// Each file's shard, from its specs' `shard` entries.
    shards: Vec<Option<String>>,
    covers: Vec<Cover>,
}

fn is_elsewhere(spec: &ReadSpec) -> Option<Shard> {
    spec.is_skipped().then(|| elsewhere_shard(&spec.message)).flatten()
}

impl Merged {
    /// Reads and merges `paths`.
    pub fn read(paths: &[PathBuf]) -> Result<Self, MergeError> {
        let files = paths.iter().map(|p| ginkgo_json::read(p)).collect::<Result<Vec<_>, _>>()?;
        Self::of(files)
    }

    /// Merges read reports.
    pub fn of(files: Vec<ReportFile>) -> Result<Self, MergeError> {
        let mut first_suite: Option<(&Path, String)> = None;
        for file in &files {
            if file.reports.is_empty() {
                return Err(MergeError::Empty(file.path.clone()));
            }
            for report in &file.reports {
                let suite =
                    report.get("SuiteDescription").and_then(Value::as_str).unwrap_or_default().to_owned();
                match &first_suite {
                    None => first_suite = Some((&file.path, suite)),
                    Some((first, first_suite)) if *first_suite != suite => {
                        return Err(MergeError::Suites {
                            first: first.to_path_buf(),
                            first_suite: first_suite.clone(),
                            other: file.path.clone(),
                            other_suite: suite,
                        });
                    }
                    Some(_) => {}
                }
            }
        }
        let mut covers: Vec<Cover> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for (i, file) in files.iter().enumerate() {
            for spec in &file.specs {
                let index = *at.entry(spec.full_text.clone()).or_insert_with(|| {
                    covers.push(Cover {
                        text: spec.full_text.clone(),
                        ran_in: Vec::new(),
                        elsewhere: None,
                        skipped_entry: None,
                    });
                    covers.len() - 1
                });
                let cover = &mut covers[index];
                match is_elsewhere(spec) {
                    Some(shard) => {
                        cover.elsewhere.get_or_insert(shard);
                        cover.skipped_entry.get_or_insert_with(|| spec.clone());
                    }
                    None if !cover.ran_in.contains(&i) => cover.ran_in.push(i),
                    None => {}
                }
            }
        }
        let shards = files
            .iter()
            .map(|f| f.specs.iter().find_map(|s| s.entry(SHARD_ENTRY)).map(str::to_owned))
            .collect();
        Ok(Self { files, shards, covers })
    }

    /// The specs that ran in more than one file, with those files.
    fn overlaps(&self) -> impl Iterator<Item = &Cover> {
        self.covers.iter().filter(|c| c.ran_in.len() > 1)
    }

    /// The specs that ran in no file.
    fn gaps(&self) -> impl Iterator<Item = &Cover> {
        self.covers.iter().filter(|c| c.ran_in.is_empty())
    }

    /// `shard 1/2 (a.json)`, or the file alone when its report names no shard.
    fn file_name(&self, i: usize) -> String {
        let path = self.files[i].path.display();
        match &self.shards[i] {
            Some(shard) => format!("shard {shard} ({path})"),
            None => path.to_string(),
        }
    }

    /// What is wrong with the cover, one sentence per problem.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let overlaps: Vec<String> = self
            .overlaps()
            .map(|c| {
                let files: Vec<String> = c.ran_in.iter().map(|&i| self.file_name(i)).collect();
                format!("{:?} ({})", c.text, files.join(", "))
            })
            .collect();
        if !overlaps.is_empty() {
            problems.push(format!(
                "{} specs ran in more than one shard: {}",
                overlaps.len(),
                overlaps.join("; ")
            ));
        }
        let gaps: Vec<String> = self
            .gaps()
            .map(|c| match c.elsewhere {
                Some(shard) => format!("{:?} (in shard {} of {})", c.text, shard.index, shard.total),
                None => format!("{:?}", c.text),
            })
            .collect();
        if !gaps.is_empty() {
            problems.push(format!(
                "{} specs of the selection ran in no shard (every report lists them as another shard's; is a shard's report missing?): {}",
                gaps.len(),
                gaps.join("; ")
            ));
        }
        problems
    }

    /// The merged entries: each file's specs that it ran (rounds in order), then the gaps'
    /// skips; with each its file and round.
    fn entries(&self) -> Vec<(usize, u32, &ReadSpec)> {
        let mut entries = Vec::new();
        for (i, file) in self.files.iter().enumerate() {
            let mut rounds: HashMap<&str, u32> = HashMap::new();
            for spec in file.specs.iter().filter(|s| is_elsewhere(s).is_none()) {
                let round = rounds.entry(spec.full_text.as_str()).or_default();
                *round += 1;
                entries.push((i, *round, spec));
            }
        }
        for cover in self.gaps() {
            if let Some(skipped) = &cover.skipped_entry {
                entries.push((usize::MAX, 1, skipped));
            }
        }
        entries
    }

    /// Whether every file's run succeeded as a suite (no run error).
    fn run_errors(&self) -> Vec<String> {
        let mut errors = Vec::new();
        for file in &self.files {
            for report in &file.reports {
                let reasons = report.get("SpecialSuiteFailureReasons").and_then(Value::as_array);
                for reason in reasons.into_iter().flatten().filter_map(Value::as_str) {
                    errors.push(format!("{}: {reason}", file.path.display()));
                }
            }
        }
        errors
    }

    /// The merged run, for the JUnit report.
    pub fn run_report(&self) -> RunReport {
        let specs: Vec<_> = self
            .entries()
            .into_iter()
            .enumerate()
            .map(|(index, (_, round, spec))| spec.spec_report(index, round))
            .collect();
        let (start, end) = self.span();
        RunReport {
            repeat: specs.iter().map(|s| s.attempt).max().unwrap_or(1),
            specs,
            wall_time: end.duration_since(start).unwrap_or_default(),
            started: Some(start),
            error: self.run_errors().into_iter().next(),
            ..RunReport::default()
        }
    }

    /// From the earliest start to the latest end of the files' reports.
    fn span(&self) -> (SystemTime, SystemTime) {
        let times = |field: &str| {
            self.files
                .iter()
                .flat_map(|f| &f.reports)
                .filter_map(|r| humantime::parse_rfc3339_weak(r.get(field)?.as_str()?).ok())
                .collect::<Vec<_>>()
        };
        let start = times("StartTime").into_iter().min().unwrap_or(SystemTime::UNIX_EPOCH);
        let end = times("EndTime").into_iter().max().unwrap_or(start);
        (start, end.max(start))
    }

    /// Whether the merged run succeeded: an exact cover, no failed spec, no run error.
    pub fn succeeded(&self) -> bool {
        self.problems().is_empty()
            && self.run_errors().is_empty()
            && !self.entries().iter().any(|(_, _, s)| s.is_failure())
    }

    /// The merged report in ginkgo's JSON schema: the first file's report with every file's
    /// spec entries, its times the span of all.
    pub fn json(&self) -> Value {
        let mut report =
            self.files.first().and_then(|f| f.reports.first()).cloned().unwrap_or_else(|| json!({}));
        let entries = self.entries();
        let nodes = self.files.iter().flat_map(|f| f.suite_nodes.iter().cloned());
        let specs: Vec<Value> = nodes.chain(entries.iter().map(|(_, _, s)| s.raw.clone())).collect();
        let total = self
            .files
            .iter()
            .flat_map(|f| &f.reports)
            .filter_map(|r| r.pointer("/PreRunStats/TotalSpecs")?.as_u64())
            .max()
            .unwrap_or(0);
        let will_run = entries.iter().filter(|(_, _, s)| s.attempts > 0).count();
        let reasons: Vec<String> = self.run_errors().into_iter().chain(self.problems()).collect();
        let (start, end) = self.span();
        if let Some(object) = report.as_object_mut() {
            object.insert("SuiteSucceeded".into(), self.succeeded().into());
            object.insert("SpecialSuiteFailureReasons".into(), json!(reasons));
            object.insert("PreRunStats".into(), json!({"TotalSpecs": total, "SpecsThatWillRun": will_run}));
            object.insert("StartTime".into(), rfc3339(start).into());
            object.insert("EndTime".into(), rfc3339(end).into());
            let nanos = end.duration_since(start).unwrap_or_default().as_nanos();
            object.insert("RunTime".into(), u64::try_from(nanos).unwrap_or(u64::MAX).into());
            object.insert("SpecReports".into(), Value::Array(specs));
        }
        Value::Array(vec![report])
    }

    /// What the merge prints: each file's shard and counts, which shard ran which spec, what
    /// is wrong with the cover, the failures and the totals.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Merged {} reports; the selection is the {} specs they list.",
            self.files.len(),
            self.covers.len()
        );
        for (i, file) in self.files.iter().enumerate() {
            let ran: Vec<&ReadSpec> = file.specs.iter().filter(|s| is_elsewhere(s).is_none()).collect();
            let wall = file.reports.iter().filter_map(|r| r.get("RunTime")?.as_u64()).max().unwrap_or(0);
            let _ = writeln!(
                out,
                "  {}: ran {} ({}) in {}",
                self.file_name(i),
                ran.len(),
                counts(ran.iter().copied()),
                duration::display(Duration::from_nanos(wall))
            );
        }
        let _ = writeln!(out, "Which shard ran which spec:");
        for cover in &self.covers {
            let places: Vec<String> = cover
                .ran_in
                .iter()
                .map(|&i| {
                    let states: Vec<&str> = self.files[i]
                        .specs
                        .iter()
                        .filter(|s| s.full_text == cover.text && is_elsewhere(s).is_none())
                        .map(|s| s.state.as_str())
                        .collect();
                    format!(
                        "{} {}",
                        self.shards[i].clone().unwrap_or_else(|| format!("file {}", i + 1)),
                        states.join(",")
                    )
                })
                .collect();
            let place = if places.is_empty() { "none".to_owned() } else { places.join(" + ") };
            let _ = writeln!(out, "  {place:<14} {}", cover.text);
        }
        let problems = self.problems();
        if problems.is_empty() {
            let _ = writeln!(out, "Every spec of the selection ran in exactly one shard.");
        }
        for problem in problems {
            let _ = writeln!(out, "Not merged cleanly: {problem}.");
        }
        for error in self.run_errors() {
            let _ = writeln!(out, "A shard's run did not succeed: {error}");
        }
        let entries = self.entries();
        let failed: Vec<&ReadSpec> = entries.iter().map(|(_, _, s)| *s).filter(|s| s.is_failure()).collect();
        if !failed.is_empty() {
            let _ = writeln!(out, "Summarizing {} failed spec runs:", failed.len());
            for spec in failed {
                let _ = writeln!(out, "  FAIL {} [{}]: {}", spec.full_text, spec.state, spec.message);
            }
        }
        let (start, end) = self.span();
        let _ = writeln!(
            out,
            "{} in {} from the first shard's start to the last one's end",
            counts(entries.iter().map(|(_, _, s)| *s)),
            duration::display(end.duration_since(start).unwrap_or_default())
        );
        out
    }

    /// Writes the outputs asked for.
    pub fn write(&self, json_report: Option<&Path>, junit_report: Option<&Path>) -> Result<(), MergeError> {
        if let Some(path) = json_report {
            let text = serde_json::to_string_pretty(&self.json())
                .map_err(|e| MergeError::Write(format!("cannot serialize the merged JSON report: {e}")))?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| {
                MergeError::Write(format!("cannot write the merged JSON report {}: {e}", path.display()))
            })?;
        }
        if let Some(path) = junit_report {
            junit::write(&self.run_report(), path).map_err(|e| MergeError::Write(e.to_string()))?;
        }
        Ok(())
    }
}

/// `3 passed, 1 failed, 2 skipped`.
fn counts<'a>(specs: impl Iterator<Item = &'a ReadSpec>) -> String {
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for spec in specs {
        match spec.outcome() {
            Outcome::Passed => passed += 1,
            Outcome::Skipped { .. } => skipped += 1,
            Outcome::Failed { .. } => failed += 1,
        }
    }
    format!("{passed} passed, {failed} failed, {skipped} skipped")
}

/// `report merge`: merges the files, prints the summary, writes the outputs; the exit code as
/// the module says.
pub fn merge_command(args: &MergeArgs) -> ExitCode {
    let merged = match Merged::read(&args.files) {
        Ok(merged) => merged,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", merged.summary());
    if let Err(e) = merged.write(args.json_report.as_deref(), args.junit.as_deref()) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    if merged.succeeded() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

#[cfg(test)]
mod tests {
    use std::{process::Command, time::Duration};

    use super::*;
    use crate::{
        report::json_report::{self, JsonConfig, tests::checker},
        report::outcome::{FailureKind, SpecReport},
        select::partition::elsewhere_reason,
    };

    fn spec(text: &str, attempt: u32, outcome: Outcome) -> SpecReport {
        let ran = !matches!(&outcome, Outcome::Skipped { reason } if elsewhere_shard(reason).is_some());
        SpecReport {
            full_text: text.into(),
            labels: vec!["DRA".into()],
            index: 0,
            attempt,
            outcome,
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            duration: Duration::from_secs(if ran { 3 } else { 0 }),
            log: String::new(),
            artifacts: None,
            tries: u32::from(ran),
            earlier_failures: vec![],
            phases: Default::default(),
            waits: Vec::new(),
            deferred: vec![],
        }
    }

    /// Shard `index` of 2 of the specs `a`, `b` (shard 1) and `c` (shard 2), `b` failing, in
    /// `rounds` rounds.
    fn shard_file(dir: &Path, index: u32, rounds: u32) -> ReportFile {
        let mut specs = Vec::new();
        for round in 1..=rounds {
            for (text, shard) in [("a", 1), ("b", 1), ("c", 2)] {
                let outcome = match (shard == index, text) {
                    (false, _) => Outcome::Skipped { reason: elsewhere_reason(shard, 2) },
                    (true, "b") => Outcome::failed(FailureKind::Timeout, "timed out after 1s"),
                    (true, _) => Outcome::Passed,
                };
                specs.push(spec(text, round, outcome));
            }
        }
        let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + u64::from(index) * 10);
        let run = RunReport {
            specs,
            repeat: rounds,
            wall_time: Duration::from_secs(60),
            started: Some(started),
            ..RunReport::default()
        };
        let config = JsonConfig { shard: Some(Shard { index, total: 2 }), ..JsonConfig::default() };
        let path = dir.join(format!("shard-{index}.json"));
        json_report::write(&run, 3, &config, &path).unwrap();
        ginkgo_json::read(&path).unwrap()
    }

    #[test]
    fn the_merged_report_is_ginkgos_and_each_spec_is_in_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let merged = Merged::of(vec![shard_file(dir.path(), 2, 1), shard_file(dir.path(), 1, 1)]).unwrap();
        assert!(merged.problems().is_empty(), "{:?}", merged.problems());
        assert!(!merged.succeeded(), "b failed");
        let (json, junit) = (dir.path().join("all.json"), dir.path().join("all.xml"));
        merged.write(Some(&json), Some(&junit)).unwrap();
        let output = Command::new(checker()).arg(&json).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let got: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let states: Vec<(&str, &str)> = got["Specs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["FullText"].as_str().unwrap(), s["State"].as_str().unwrap()))
            .collect();
        assert_eq!(states, [("c", "passed"), ("a", "passed"), ("b", "timedout")]);
        assert_eq!((got["Succeeded"].as_bool(), got["SpecsWillRun"].as_u64()), (Some(false), Some(3)));
        // From the first shard's start to the last one's end.
        assert_eq!(got["RunTimeNs"], 70_000_000_000u64);
        let entries = &got["Specs"][0]["Entries"];
        assert_eq!(entries, &serde_json::json!(["shard=2/2 (always)"]));
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(xml.contains(r#"<testcase name="b" classname="dra-e2e" time="3.000">"#), "{xml}");
        assert!(xml.contains(r#"type="timeout""#), "{xml}");
        let summary = merged.summary();
        assert!(summary.contains("  shard 2/2 ("), "{summary}");
        assert!(summary.contains("ran 1 (1 passed, 0 failed, 0 skipped) in 1m\n"), "{summary}");
        assert!(summary.contains("  1/2 timedout   b\n"), "{summary}");
        assert!(summary.contains("2 passed, 1 failed, 0 skipped in 1m10s from"), "{summary}");
    }

    #[test]
    fn rounds_of_one_run_are_no_overlap_but_two_runs_are() {
        let dir = tempfile::tempdir().unwrap();
        let rounds = Merged::of(vec![shard_file(dir.path(), 1, 3), shard_file(dir.path(), 2, 3)]).unwrap();
        assert!(rounds.problems().is_empty(), "{:?}", rounds.problems());
        let run = rounds.run_report();
        assert_eq!((run.repeat, run.specs.len()), (3, 9));
        assert!(rounds.summary().contains("  1/2 timedout,timedout,timedout b\n"), "{}", rounds.summary());
        let twice = Merged::of(vec![shard_file(dir.path(), 1, 1), shard_file(dir.path(), 1, 1)]).unwrap();
        let problems = twice.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("2 specs ran in more than one shard: \"a\" (shard 1/2 ("),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("1 specs of the selection ran in no shard")
                && problems[1].ends_with(": \"c\" (in shard 2 of 2)"),
            "{problems:?}"
        );
    }

    #[test]
    fn files_that_cannot_be_merged_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other.json");
        std::fs::write(&other, r#"[{"SuiteDescription":"other","SpecReports":[]}]"#).unwrap();
        let empty = dir.path().join("empty.json");
        std::fs::write(&empty, "[]").unwrap();
        let ours = shard_file(dir.path(), 1, 1).path;
        let err = Merged::read(&[ours.clone(), other]).unwrap_err().to_string();
        assert!(err.ends_with("of \"other\": merge the reports of one suite"), "{err}");
        let err = Merged::read(&[ours, empty]).unwrap_err().to_string();
        assert!(
            err.ends_with("empty.json holds no report (an empty array); give the --json-report of a run"),
            "{err}"
        );
    }
}
