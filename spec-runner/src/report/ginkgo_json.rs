//! Reading ginkgo JSON reports (`[]types.Report`, ours from `--json-report` or ginkgo's own):
//! what `report merge`, `--rerun-failed` and `--timings` need of each spec, beside the spec's
//! JSON as it was, so that a merged report keeps every field it had.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde::Deserialize;
use serde_json::Value;

use crate::{
    report::outcome::{FailureKind, Outcome, SpecReport},
    run::phases::Phases,
};

/// ginkgo's states that count as failures (`types.SpecStateFailureStates`).
const FAILURE_STATES: [&str; 5] = ["failed", "aborted", "panicked", "interrupted", "timedout"];

/// A report file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It cannot be read.
    #[error("cannot read the report {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a ginkgo JSON report.
    #[error(
        "{path} is not a ginkgo JSON report (what --json-report writes: an array of reports with SpecReports): {reason}"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, from the JSON decoder.
        reason: String,
    },
}

/// One report file: its top-level reports and every spec in them, in the file's order.
#[derive(Debug, Clone)]
pub struct ReportFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Each `types.Report` of the array as it was (with its `SpecReports`).
    pub reports: Vec<Value>,
    /// The specs (`LeafNodeType` `It`) of every report, in order.
    pub specs: Vec<ReadSpec>,
    /// The entries that are not specs (suite nodes such as `BeforeSuite`), as they were.
    pub suite_nodes: Vec<Value>,
}

/// What the readers need of one spec entry.
#[derive(Debug, Clone)]
pub struct ReadSpec {
    /// The full text: the container texts and the leaf text, joined by spaces (ginkgo's
    /// `FullText()`; ours carry it all in the leaf text).
    pub full_text: String,
    /// ginkgo's state: `passed`, `skipped`, `failed`, `timedout`, …
    pub state: String,
    /// The failure's (or skip's) message; empty when there is none.
    pub message: String,
    /// `RunTime`: the spec's time on its worker slot.
    pub run_time: Duration,
    /// `NumAttempts`: 0 for a spec that never started.
    pub attempts: u32,
    /// The report entries' names and representations (`phase:body`, `shard`, …).
    pub entries: Vec<(String, String)>,
    /// `LeafNodeLabels`.
    pub labels: Vec<String>,
    /// `CapturedGinkgoWriterOutput`: the spec's log.
    pub log: String,
    /// `StartTime`, as written.
    pub start_time: String,
    /// `Failure.FailureNodeType`: where a failure happened (`It`, `BeforeEach`, …).
    pub failure_node: String,
    /// The entry as it was.
    pub raw: Value,
}

impl ReadSpec {
    /// Whether ginkgo counts it as failed (failed, aborted, panicked, interrupted, timed out).
    pub fn is_failure(&self) -> bool {
        FAILURE_STATES.contains(&self.state.as_str())
    }

    /// Whether it was skipped.
    pub fn is_skipped(&self) -> bool {
        self.state == "skipped" || self.state == "pending"
    }

    /// The representation of the report entry `name`, if it has one.
    pub fn entry(&self, name: &str) -> Option<&str> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// What it was as the runner reports it: `ginkgo`'s state as an [`Outcome`].
    pub fn outcome(&self) -> Outcome {
        let kind = match (self.state.as_str(), self.failure_node.as_str()) {
            ("passed", _) => return Outcome::Passed,
            ("skipped" | "pending", _) => return Outcome::Skipped { reason: self.message.clone() },
            ("timedout", _) => FailureKind::Timeout,
            ("interrupted", _) => FailureKind::Interrupted,
            ("panicked", _) => FailureKind::Panic,
            (_, "BeforeEach") => FailureKind::Setup,
            (_, node) if node.starts_with("DeferCleanup") => FailureKind::Cleanup,
            _ => FailureKind::Error,
        };
        Outcome::failed(kind, self.message.clone())
    }

    /// The spec as a [`SpecReport`] of `attempt` (its round in a `--repeat` run), for the
    /// reports written from read ones (JUnit): its texts, outcome, times, log and phases.
    pub fn spec_report(&self, index: usize, attempt: u32) -> SpecReport {
        let mut phases = Phases::default();
        for (name, value) in &self.entries {
            let Some(seconds) = name.strip_prefix("phase:").and_then(|_| value.parse::<f64>().ok()) else {
                continue;
            };
            let d = Some(Duration::try_from_secs_f64(seconds).unwrap_or_default());
            match &name["phase:".len()..] {
                "queued" => phases.queued = d,
                "setup" => phases.setup = d,
                "body" => phases.body = d,
                "cleanup" => phases.cleanup = d,
                "deferred" => phases.deferred = d,
                _ => {}
            }
        }
        SpecReport {
            full_text: self.full_text.clone(),
            labels: self.labels.clone(),
            index,
            attempt,
            outcome: self.outcome(),
            started: humantime::parse_rfc3339_weak(&self.start_time).unwrap_or(SystemTime::UNIX_EPOCH),
            duration: self.run_time,
            log: self.log.clone(),
            artifacts: None,
            tries: self.attempts,
            earlier_failures: Vec::new(),
            phases,
            waits: Vec::new(),
            deferred: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecView {
    #[serde(default)]
    container_hierarchy_texts: Vec<String>,
    #[serde(default)]
    leaf_node_type: String,
    #[serde(default)]
    leaf_node_text: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    run_time: u64,
    #[serde(default)]
    num_attempts: u32,
    #[serde(default)]
    failure: Option<FailureView>,
    #[serde(default)]
    report_entries: Vec<EntryView>,
    #[serde(default)]
    leaf_node_labels: Vec<String>,
    #[serde(default)]
    captured_ginkgo_writer_output: String,
    #[serde(default)]
    start_time: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FailureView {
    #[serde(default)]
    message: String,
    #[serde(default)]
    failure_node_type: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct EntryView {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: Option<EntryValueView>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct EntryValueView {
    #[serde(default)]
    representation: String,
}

/// Reads a report file.
pub fn read(path: &Path) -> Result<ReportFile, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io { path: path.into(), source })?;
    parse(path, &text)
}

/// Parses a report's text (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<ReportFile, ReadError> {
    let format = |reason: String| ReadError::Format { path: path.into(), reason };
    let reports: Vec<Value> = serde_json::from_str(text).map_err(|e| format(e.to_string()))?;
    let mut file =
        ReportFile { path: path.into(), reports: Vec::new(), specs: Vec::new(), suite_nodes: Vec::new() };
    for report in reports {
        let Some(entries) = report.get("SpecReports") else {
            return Err(format("a report has no SpecReports".to_owned()));
        };
        let entries = match entries {
            Value::Null => Vec::new(),
            Value::Array(entries) => entries.clone(),
            _ => return Err(format("SpecReports is not an array".to_owned())),
        };
        for raw in entries {
            let view: SpecView = serde_json::from_value(raw.clone()).map_err(|e| format(e.to_string()))?;
            if !matches!(view.leaf_node_type.as_str(), "It" | "") {
                file.suite_nodes.push(raw);
                continue;
            }
            file.specs.push(read_spec(view, raw));
        }
        file.reports.push(report);
    }
    Ok(file)
}

fn read_spec(view: SpecView, raw: Value) -> ReadSpec {
    let mut texts = view.container_hierarchy_texts;
    texts.push(view.leaf_node_text);
    let (message, failure_node) = view.failure.map(|f| (f.message, f.failure_node_type)).unwrap_or_default();
    ReadSpec {
        full_text: texts.into_iter().filter(|t| !t.is_empty()).collect::<Vec<_>>().join(" "),
        state: view.state,
        message,
        failure_node,
        labels: view.leaf_node_labels,
        log: view.captured_ginkgo_writer_output,
        start_time: view.start_time,
        run_time: Duration::from_nanos(view.run_time),
        attempts: view.num_attempts,
        entries: view
            .report_entries
            .into_iter()
            .map(|e| (e.name, e.value.map(|v| v.representation).unwrap_or_default()))
            .collect(),
        raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ours_and_ginkgos_with_containers_and_suite_nodes() {
        let text = r#"[{"SuiteDescription":"s","SpecReports":[
            {"LeafNodeType":"BeforeSuite","State":"passed"},
            {"ContainerHierarchyTexts":["[sig-node]","kubelet"],"LeafNodeType":"It","LeafNodeText":"works",
             "State":"timedout","RunTime":1500000000,"NumAttempts":2,"Failure":{"Message":"timed out"},
             "ReportEntries":[{"Name":"shard","Value":{"AsJSON":"\"1/2\"","Representation":"1/2"}}]},
            {"LeafNodeType":"It","LeafNodeText":"[sig-node] skipped","State":"skipped","NumAttempts":0,
             "Failure":{"Message":"in shard 2 of 2"}}
        ]}]"#;
        let file = parse(Path::new("r.json"), text).unwrap();
        assert_eq!(file.suite_nodes.len(), 1);
        let [first, second] = &file.specs[..] else { panic!("{:?}", file.specs) };
        assert_eq!(first.full_text, "[sig-node] kubelet works");
        assert!(first.is_failure() && !first.is_skipped());
        assert_eq!((first.run_time, first.attempts), (Duration::from_millis(1500), 2));
        assert_eq!((first.message.as_str(), first.entry("shard")), ("timed out", Some("1/2")));
        assert!(second.is_skipped() && !second.is_failure());
        assert_eq!(second.message, "in shard 2 of 2");
    }

    #[test]
    fn what_is_not_a_report_says_so() {
        for text in ["{}", "[{\"SuiteDescription\":\"s\"}]", "[{\"SpecReports\":3}]", "not json"] {
            let err = parse(Path::new("r.json"), text).unwrap_err().to_string();
            assert!(err.starts_with("r.json is not a ginkgo JSON report"), "{err}");
        }
        let err = read(Path::new("/nonexistent/r.json")).unwrap_err().to_string();
        assert!(err.starts_with("cannot read the report /nonexistent/r.json: "), "{err}");
    }
}
