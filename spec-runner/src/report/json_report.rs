//! `--json-report FILE`: the run in the schema of ginkgo's JSON report (`[]types.Report` of
//! github.com/onsi/ginkgo/v2 v2.32, as `ginkgo --json-report` writes it), so tools that read
//! ginkgo reports read ours. Fields are ginkgo's names; what dra-e2e does not know (code
//! locations, progress reports, report entries) is left out, which ginkgo's own decoder accepts.
//! A spec's whole full text is its `LeafNodeText` (ginkgo's `FullText()` joins the container
//! texts and the leaf text, so it is the same string), its labels are `LeafNodeLabels`. A
//! failure says where it happened as ginkgo does (`State`, `Failure.FailureNodeType` and
//! `FailureNodeContext`: the body, the set-up before it or a clean-up after it), so a reader can
//! tell an assertion that failed from a timeout, an interrupt or a clean-up alone.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::{
    SUITE_NAME,
    report::outcome::{FailureKind, Outcome, RunReport, SpecReport},
    select::partition::{Shard, elsewhere_shard},
};

/// The report entry that names the shard (`1/2`) that ran a spec.
pub const SHARD_ENTRY: &str = "shard";

/// What the run was configured with, for ginkgo's `SuiteConfig`.
#[derive(Debug, Clone, Default)]
pub struct JsonConfig {
    /// `--procs`.
    pub procs: usize,
    /// `--randomize-all`.
    pub randomize_all: bool,
    /// `--fail-fast`.
    pub fail_fast: bool,
    /// `--flake-attempts`.
    pub flake_attempts: u32,
    /// `--timeout` (the default spec timeout).
    pub timeout: Duration,
    /// `--partition`'s shard: each spec of it gets the report entry `shard` (`1/2`).
    pub shard: Option<Shard>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Report<'a> {
    suite_path: String,
    suite_description: &'a str,
    suite_labels: Vec<String>,
    suite_succeeded: bool,
    suite_has_programmatic_focus: bool,
    special_suite_failure_reasons: Vec<String>,
    pre_run_stats: PreRunStats,
    start_time: String,
    end_time: String,
    run_time: u128,
    suite_config: SuiteConfig,
    spec_reports: Vec<Spec<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct PreRunStats {
    total_specs: usize,
    specs_that_will_run: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteConfig {
    random_seed: u64,
    randomize_all_specs: bool,
    fail_fast: bool,
    flake_attempts: u32,
    must_pass_repeatedly: u32,
    timeout: u128,
    parallel_process: u32,
    parallel_total: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Spec<'a> {
    container_hierarchy_texts: Vec<String>,
    container_hierarchy_labels: Vec<Vec<String>>,
    leaf_node_type: &'static str,
    leaf_node_labels: &'a [String],
    leaf_node_text: &'a str,
    state: &'static str,
    start_time: String,
    end_time: String,
    run_time: u128,
    parallel_process: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure: Option<Failure<'a>>,
    num_attempts: u32,
    max_flake_attempts: u32,
    max_must_pass_repeatedly: u32,
    #[serde(skip_serializing_if = "str::is_empty")]
    captured_ginkgo_writer_output: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    report_entries: Vec<Entry>,
}

/// A ginkgo `types.ReportEntry`: here the spec's phases, `phase:<name>` with seconds as value.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    visibility: &'static str,
    location: Location,
    time: String,
    timeline_location: TimelineLocation,
    name: String,
    value: EntryValue,
}

/// ginkgo's `types.CodeLocation`: dra-e2e knows none, and every field is optional.
#[derive(Serialize)]
struct Location {}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct TimelineLocation {
    time: String,
}

/// ginkgo's `types.ReportEntryValue`: the value as JSON and as text.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct EntryValue {
    #[serde(rename = "AsJSON")]
    as_json: String,
    representation: String,
}

/// The spec's phases (`phase:<name>`) and what it waited for (`wait:<what>`) as report entries
/// with seconds as values, timed at the spec's end; visible only with `-v` or on failure in
/// ginkgo's own output.
fn phase_entries(report: &SpecReport) -> Vec<Entry> {
    let at = rfc3339(report.started + report.duration);
    let phases = report.phases.entries().map(|(name, d)| (format!("phase:{name}"), d));
    let waits = report.waits.iter().map(|(what, d)| (format!("wait:{what}"), *d));
    phases
        .chain(waits)
        .map(|(name, d)| {
            let secs = format!("{:.3}", d.as_secs_f64());
            Entry {
                visibility: "failure-or-verbose",
                location: Location {},
                time: at.clone(),
                timeline_location: TimelineLocation { time: at.clone() },
                name,
                value: EntryValue { as_json: secs.clone(), representation: secs },
            }
        })
        .collect()
}

/// The entry `shard` (`1/2`, always visible) of a spec of the run's shard: which shard ran it,
/// for `report merge`.
fn shard_entry(report: &SpecReport, config: &JsonConfig) -> Option<Entry> {
    let elsewhere =
        matches!(&report.outcome, Outcome::Skipped { reason } if elsewhere_shard(reason).is_some());
    let shard = config.shard.filter(|_| !elsewhere)?.to_string();
    let at = rfc3339(report.started + report.duration);
    Some(Entry {
        visibility: "always",
        location: Location {},
        time: at.clone(),
        timeline_location: TimelineLocation { time: at },
        name: SHARD_ENTRY.to_owned(),
        value: EntryValue {
            as_json: serde_json::Value::from(shard.as_str()).to_string(),
            representation: shard,
        },
    })
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Failure<'a> {
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    forwarded_panic: &'a str,
    failure_node_context: &'static str,
    failure_node_type: &'static str,
}

/// Where a spec's failure happened, as ginkgo's `types.NodeType` and `types.FailureNodeContext`
/// name it: the body is the `It` (a leaf node); the namespace and the requirements are what
/// upstream's framework does in a `BeforeEach`; a failed clean-up or deferred check of a spec
/// whose body passed is a `DeferCleanup` registered by it (a spec's containers are not in the
/// report, so a node that is not the leaf is at the top level). A failure in the body that
/// clean-ups followed keeps the body's place: ginkgo's `Failure` is the first failure.
fn failure_node(kind: FailureKind) -> (&'static str, &'static str) {
    match kind {
        FailureKind::Setup => ("BeforeEach", "top-level"),
        FailureKind::Cleanup => ("DeferCleanup (Each)", "top-level"),
        FailureKind::Error | FailureKind::Panic | FailureKind::Timeout | FailureKind::Interrupted => {
            ("It", "leaf-node")
        }
    }
}

/// RFC 3339 with nanoseconds, as Go's `time.Time` marshals.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// ginkgo's state names (`types.SpecState`).
fn state(spec: &SpecReport) -> &'static str {
    match &spec.outcome {
        Outcome::Passed => "passed",
        Outcome::Skipped { .. } => "skipped",
        Outcome::Failed { kind: FailureKind::Timeout, .. } => "timedout",
        Outcome::Failed { kind: FailureKind::Interrupted, .. } => "interrupted",
        Outcome::Failed { kind: FailureKind::Panic, .. } => "panicked",
        Outcome::Failed { .. } => "failed",
    }
}

fn spec<'a>(report: &'a SpecReport, config: &JsonConfig) -> Spec<'a> {
    let failure = match &report.outcome {
        Outcome::Passed => None,
        // ginkgo keeps a skip's reason in the failure message.
        Outcome::Skipped { reason } => Some(Failure {
            message: reason,
            forwarded_panic: "",
            failure_node_context: "leaf-node",
            failure_node_type: "It",
        }),
        Outcome::Failed { kind, message, .. } => {
            let (node_type, context) = failure_node(*kind);
            Some(Failure {
                message,
                forwarded_panic: if *kind == FailureKind::Panic { message } else { "" },
                failure_node_context: context,
                failure_node_type: node_type,
            })
        }
    };
    Spec {
        container_hierarchy_texts: Vec::new(),
        container_hierarchy_labels: Vec::new(),
        leaf_node_type: "It",
        leaf_node_labels: &report.labels,
        leaf_node_text: &report.full_text,
        state: state(report),
        start_time: rfc3339(report.started),
        end_time: rfc3339(report.started + report.duration),
        run_time: report.duration.as_nanos(),
        parallel_process: 1,
        failure,
        num_attempts: report.tries,
        max_flake_attempts: config.flake_attempts,
        max_must_pass_repeatedly: 1,
        captured_ginkgo_writer_output: &report.log,
        report_entries: phase_entries(report).into_iter().chain(shard_entry(report, config)).collect(),
    }
}

/// The report as ginkgo's JSON: an array with one `types.Report`.
pub fn render(run: &RunReport, total_specs: usize, config: &JsonConfig) -> serde_json::Result<String> {
    let started = run.started.unwrap_or(SystemTime::UNIX_EPOCH);
    let report = Report {
        suite_path: std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        suite_description: SUITE_NAME,
        suite_labels: Vec::new(),
        suite_succeeded: run.exit_code() == 0,
        suite_has_programmatic_focus: false,
        special_suite_failure_reasons: run.error.iter().cloned().collect(),
        pre_run_stats: PreRunStats {
            total_specs,
            specs_that_will_run: run.specs.iter().filter(|s| s.tries > 0).count(),
        },
        start_time: rfc3339(started),
        end_time: rfc3339(started + run.wall_time),
        run_time: run.wall_time.as_nanos(),
        suite_config: SuiteConfig {
            random_seed: run.seed,
            randomize_all_specs: config.randomize_all,
            fail_fast: config.fail_fast,
            flake_attempts: config.flake_attempts,
            must_pass_repeatedly: 1,
            timeout: config.timeout.as_nanos(),
            parallel_process: 1,
            parallel_total: config.procs,
        },
        spec_reports: run.specs.iter().map(|s| spec(s, config)).collect(),
    };
    serde_json::to_string_pretty(&[report])
}

/// Writes the report atomically (a temporary file next to it, then rename).
pub fn write(run: &RunReport, total_specs: usize, config: &JsonConfig, path: &Path) -> Result<(), String> {
    let json =
        render(run, total_specs, config).map_err(|e| format!("cannot serialize the JSON report: {e}"))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write the JSON report {}: {e}", path.display()))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{
        path::PathBuf,
        process::Command,
        sync::OnceLock,
        time::{Duration, SystemTime},
    };

    use super::*;
    use crate::run::phases::Phases;

    /// Builds spec-runner/ginkgo-json-check (ginkgo's own types) once per test process.
    pub(crate) fn checker() -> &'static Path {
        static BINARY: OnceLock<PathBuf> = OnceLock::new();
        BINARY.get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("ginkgo-json-check");
            let out_dir = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
            let binary = out_dir.join("ginkgo-json-check");
            let partial = out_dir.join(format!("ginkgo-json-check.{}.partial", std::process::id()));
            let status = Command::new("go")
                .args(["build", "-buildvcs=false", "-o"])
                .arg(&partial)
                .arg(".")
                .current_dir(&source)
                .status()
                .unwrap_or_else(|err| panic!("cannot run `go` ({err}): this test needs Go 1.26 on PATH"));
            assert!(status.success(), "`go build` of {} failed: {status}", source.display());
            std::fs::rename(&partial, &binary).unwrap();
            binary
        })
    }

    fn spec(text: &str, labels: &[&str], outcome: Outcome, tries: u32) -> SpecReport {
        SpecReport {
            full_text: text.into(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            index: 0,
            attempt: 1,
            outcome,
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            duration: Duration::from_millis(1500),
            log: "captured".into(),
            artifacts: None,
            tries,
            earlier_failures: vec![],
            phases: Default::default(),
            waits: Vec::new(),
            deferred: vec![],
        }
    }

    #[test]
    fn ginkgos_own_types_decode_the_report_strictly() {
        // One spec failing each way, where ginkgo would say it failed.
        let failing = [
            ("times out", FailureKind::Timeout, "timed out"),
            ("has no namespace", FailureKind::Setup, "cannot create the spec's namespace: refused"),
            ("leaves a pod", FailureKind::Cleanup, "cleanup \"delete pod x\" failed"),
            ("panics", FailureKind::Panic, "panicked: oops"),
            ("is interrupted", FailureKind::Interrupted, "interrupted (Ctrl-C) while running"),
        ]
        .map(|(text, kind, message)| {
            spec(&format!("[sig-node] [DRA] {text}"), &[], Outcome::failed(kind, message), 1)
        });
        let run = RunReport {
            specs: vec![
                SpecReport {
                    phases: Phases {
                        setup: Some(Duration::from_millis(1250)),
                        body: Some(Duration::from_millis(200)),
                        cleanup: Some(Duration::from_millis(50)),
                        deferred: None,
                        queued: None,
                    },
                    waits: vec![("pod tester-1 to run".into(), Duration::from_secs(2))],
                    ..spec("[sig-node] [DRA] kubelet passes", &["sig-node", "DRA"], Outcome::Passed, 1)
                },
                spec("[sig-node] [DRA] flakes", &["DRA"], Outcome::Passed, 2),
                spec("[sig-node] [DRA] skips", &[], Outcome::Skipped { reason: "needs 2 nodes".into() }, 1),
                spec(
                    "[sig-node] [DRA] fails",
                    &[],
                    Outcome::Failed {
                        kind: FailureKind::Error,
                        message: "boom".into(),
                        details: "boom\nmore".into(),
                    },
                    2,
                ),
            ]
            .into_iter()
            .chain(failing)
            .collect(),
            wall_time: Duration::from_secs(12),
            repeat: 1,
            seed: 4242,
            started: Some(SystemTime::now()),
            ..RunReport::default()
        };
        let config = JsonConfig {
            procs: 4,
            flake_attempts: 2,
            timeout: Duration::from_secs(600),
            ..JsonConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("report.json");
        write(&run, 9, &config, &file).unwrap();
        let output = Command::new(checker()).arg(&file).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let got: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(got["Suite"], "dra-e2e");
        assert_eq!(got["Succeeded"], false);
        assert_eq!(got["Seed"], 4242);
        assert_eq!((got["FlakeAttempts"].as_u64(), got["ParallelTotal"].as_u64()), (Some(2), Some(4)));
        assert_eq!((got["TotalSpecs"].as_u64(), got["SpecsWillRun"].as_u64()), (Some(9), Some(9)));
        assert_eq!(got["RunTimeNs"], 12_000_000_000u64);
        assert_eq!(
            (got["PassedCount"].as_u64(), got["FailedCount"].as_u64(), got["SkippedCount"].as_u64()),
            (Some(2), Some(6), Some(1))
        );
        assert_eq!(got["FlakedCount"], 1);
        let specs = got["Specs"].as_array().unwrap();
        assert_eq!(specs[0]["FullText"], "[sig-node] [DRA] kubelet passes");
        assert_eq!(specs[0]["Labels"], serde_json::json!(["sig-node", "DRA"]));
        assert_eq!(specs[0]["RunTimeNs"], 1_500_000_000u64);
        assert!(specs.iter().all(|s| s["StartBefore"] == true));
        assert_eq!(
            specs[0]["Entries"],
            serde_json::json!([
                "phase:setup=1.25 (failure-or-verbose)",
                "phase:body=0.2 (failure-or-verbose)",
                "phase:cleanup=0.05 (failure-or-verbose)",
                "wait:pod tester-1 to run=2 (failure-or-verbose)"
            ])
        );
        assert_eq!(specs[1]["Entries"], serde_json::json!([]));
        assert_eq!(specs[1]["Flaky"], true);
        assert_eq!(
            (specs[2]["State"].as_str(), specs[2]["Failure"].as_str()),
            (Some("skipped"), Some("needs 2 nodes"))
        );
        assert_eq!(
            (specs[3]["State"].as_str(), specs[3]["Failure"].as_str()),
            (Some("failed"), Some("boom"))
        );
        // Where each failure happened, in ginkgo's own names.
        let at = |i: usize| {
            let s = &specs[i];
            (
                s["State"].as_str().unwrap(),
                s["FailureNode"].as_str().unwrap(),
                s["FailureContext"].as_str().unwrap(),
            )
        };
        assert_eq!(at(0), ("passed", "", ""));
        assert_eq!(at(2), ("skipped", "It", "leaf-node"));
        assert_eq!(at(3), ("failed", "It", "leaf-node"));
        assert_eq!(at(4), ("timedout", "It", "leaf-node"));
        assert_eq!(at(5), ("failed", "BeforeEach", "top-level"));
        assert_eq!(at(6), ("failed", "DeferCleanup (Each)", "top-level"));
        assert_eq!(at(7), ("panicked", "It", "leaf-node"));
        assert_eq!(specs[7]["ForwardedPanic"], "panicked: oops");
        assert_eq!(specs[3]["ForwardedPanic"], "");
        assert_eq!(at(8), ("interrupted", "It", "leaf-node"));
    }
}
