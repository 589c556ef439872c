//! The summary of a `--driver` run that a vendor hands on: the behaviours of the driver under
//! test (each spec's own text, below the `driver under test [DriverUnderTest]` container), each
//! PASS, FAIL or SKIP with its reason in one line (a failure's first line, the skip's reason),
//! headed by the driver, its DeviceClass, the cluster's version (the API server's, as preflight
//! read it) and whether the calls were interposed. Printed after the run's own summary
//! ([`after_run`]) and written as Markdown and JUnit ([`SummaryFiles`]).
//!
//! The rendering is pure functions of the run's report and these [`Facts`]; the JUnit report is
//! the runner's own ([`junit_report`]) of the same runs under their behaviours' names.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use harness::framework::{
    ClusterInfo, JunitError, Outcome, RunReport, SpecReport, junit_report, write_junit_report,
};
use quick_junit::{Property, Report};

use super::{LABEL, Target};

/// The heading of every summary, before the driver's name.
const TITLE: &str = "dra-e2e driver summary";

/// What the cluster's version reads as when preflight could not tell it.
const UNKNOWN_VERSION: &str = "unknown";

/// The file stem of the summary in a `--driver-summary` folder.
const DEFAULT_STEM: &str = "driver";

/// What heads a summary beside the run: the driver under test and the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The driver, its DeviceClass and whether the calls were interposed.
    pub target: &'a Target,
    /// The API server's `gitVersion`, as preflight read it.
    pub kubernetes: &'a str,
}

/// What one spec run came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It passed (also on a retry, `--flake-attempts`).
    Pass,
    /// It failed.
    Fail,
    /// It skipped, saying why.
    Skip,
}

impl Verdict {
    /// `PASS`, `FAIL` or `SKIP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        }
    }
}

/// One behaviour of the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The spec's own text (with the attempt when the run repeated, `--repeat`).
    pub behaviour: String,
    /// What it came to.
    pub verdict: Verdict,
    /// One line: the failure's first line, the skip's reason, or empty for a pass.
    pub reason: String,
}

/// The behaviour a spec checks: its full text after the `driver under test [DriverUnderTest]`
/// container, or the full text of a spec not below it.
pub fn behaviour(full_text: &str) -> &str {
    let container = format!("driver under test [{LABEL}] ");
    full_text.split_once(&container).map_or(full_text, |(_, behaviour)| behaviour)
}

/// The rows of the run, in its order (attempt, then registration).
pub fn rows(report: &RunReport) -> Vec<Row> {
    report.specs.iter().map(|spec| row(spec, report.repeat)).collect()
}

fn row(spec: &SpecReport, repeat: u32) -> Row {
    let (verdict, reason) = match &spec.outcome {
        Outcome::Passed if spec.is_flaky() => (Verdict::Pass, format!("flaky: passed on try {}", spec.tries)),
        Outcome::Passed => (Verdict::Pass, String::new()),
        Outcome::Skipped { reason } => (Verdict::Skip, one_line(reason)),
        Outcome::Failed { message, .. } => {
            (Verdict::Fail, message.lines().next().unwrap_or("").trim().to_owned())
        }
    };
    Row { behaviour: attempt_name(behaviour(&spec.full_text), spec.attempt, repeat), verdict, reason }
}

/// `name (attempt i/N)` when the run repeated, as the runner's JUnit report names attempts.
fn attempt_name(name: &str, attempt: u32, repeat: u32) -> String {
    if repeat > 1 { format!("{name} (attempt {attempt}/{repeat})") } else { name.to_owned() }
}

/// `text` on one line, its lines joined by a space.
fn one_line(text: &str) -> String {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// A Markdown table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// `yes` or `no`, with the flag that decides it.
fn interposed(target: &Target) -> &'static str {
    if target.interpose { "yes (--interpose)" } else { "no (without --interpose)" }
}

/// The summary as Markdown: a heading with the driver, a table of the facts, the run's counts
/// (and its error, when it had one), and the table of behaviours.
pub fn markdown(report: &RunReport, facts: &Facts<'_>) -> String {
    let target = facts.target;
    let mut out = format!("## {TITLE}: {}\n\n", target.driver);
    out.push_str("| Driver | DeviceClass | Kubernetes | Calls interposed |\n|---|---|---|---|\n");
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} |\n",
        cell(&target.driver),
        cell(&target.class),
        cell(version(facts)),
        interposed(target)
    );
    let _ = write!(out, "{}", report.summary_line());
    if let Some(started) = report.started {
        let _ = write!(out, ", started {}", humantime::format_rfc3339_seconds(started));
    }
    out.push_str(".\n");
    if let Some(error) = &report.error {
        let _ = writeln!(out, "\n**Run error:** {}", one_line(error));
    }
    if report.interrupted {
        out.push_str("\n**Interrupted** (Ctrl-C): the behaviours not started are SKIP.\n");
    }
    out.push_str("\n| Behaviour | Result | Reason |\n|---|---|---|\n");
    for row in rows(report) {
        let _ =
            writeln!(out, "| {} | {} | {} |", cell(&row.behaviour), row.verdict.as_str(), cell(&row.reason));
    }
    out
}

fn version<'a>(facts: &Facts<'a>) -> &'a str {
    if facts.kubernetes.is_empty() { UNKNOWN_VERSION } else { facts.kubernetes }
}

/// The summary as JUnit: the runner's report of the same runs ([`junit_report`]), one test case
/// per behaviour named by it (without the spec logs, which `--junit`'s report has), its suite
/// carrying the properties `driver`, `deviceClass`, `kubernetesVersion`, `interposed` (`true`
/// or `false`) and, when the run had one, `runError`.
pub fn junit(report: &RunReport, facts: &Facts<'_>) -> Report {
    let mut renamed = report.clone();
    for spec in &mut renamed.specs {
        spec.full_text = behaviour(&spec.full_text).to_owned();
    }
    let mut junit = junit_report(&renamed);
    let name = format!("{TITLE}: {}", facts.target.driver);
    junit.name = Some(name.clone().into());
    let mut properties = vec![
        Property::new("driver", facts.target.driver.as_str()),
        Property::new("deviceClass", facts.target.class.as_str()),
        Property::new("kubernetesVersion", version(facts)),
        Property::new("interposed", facts.target.interpose.to_string()),
    ];
    if let Some(error) = &report.error {
        properties.push(Property::new("runError", one_line(error)));
    }
    for suite in &mut junit.test_suites {
        suite.name = name.clone().into();
        suite.add_properties(properties.clone());
        for case in &mut suite.test_cases {
            case.system_out = None;
        }
    }
    junit
}

/// Where a run's summary is written: a Markdown and a JUnit file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryFiles {
    /// The Markdown file (`…-summary.md`).
    pub markdown: PathBuf,
    /// The JUnit file (`…-summary.xml`).
    pub junit: PathBuf,
}

/// The summary could not be written (the run exits with 2).
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// A file or its folder could not be written.
    #[error(
        "cannot write the driver summary {path}: {source}; give --driver-summary a folder you can write to"
    )]
    Write {
        /// The file or folder.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The JUnit summary could not be written.
    #[error("cannot write the driver summary: {0}")]
    Junit(#[from] JunitError),
}

impl SummaryFiles {
    /// `DIR/driver-summary.{md,xml}` for `--driver-summary DIR`; else next to the JUnit report
    /// (`--junit out/x.xml`: `out/x-summary.{md,xml}`), else next to the JSON report; else none
    /// (the summary is only printed).
    pub fn resolve(dir: Option<&Path>, junit: Option<&Path>, json: Option<&Path>) -> Option<Self> {
        let (folder, stem) = match (dir, junit.or(json)) {
            (Some(dir), _) => (dir.to_owned(), DEFAULT_STEM.to_owned()),
            (None, Some(report)) => {
                let stem =
                    report.file_stem().map_or(DEFAULT_STEM.into(), |s| s.to_string_lossy().into_owned());
                (report.parent().map(Path::to_owned).unwrap_or_default(), stem)
            }
            (None, None) => return None,
        };
        let file = |ext: &str| folder.join(format!("{stem}-summary.{ext}"));
        Some(Self { markdown: file("md"), junit: file("xml") })
    }

    /// Writes both files, making their folder when it does not exist.
    pub fn write(&self, markdown: &str, junit: &Report) -> Result<(), SummaryError> {
        let write_error = |path: &Path| {
            let path = path.display().to_string();
            move |source| SummaryError::Write { path, source }
        };
        if let Some(folder) = self.markdown.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(folder).map_err(write_error(folder))?;
        }
        std::fs::write(&self.markdown, markdown).map_err(write_error(&self.markdown))?;
        write_junit_report(junit, &self.junit)?;
        Ok(())
    }
}

/// The hook that prints the summary after the run's own and writes it to `files`
/// ([`Registry::after_run`](harness::framework::Registry::after_run)).
pub fn after_run(
    target: Target,
    files: Option<SummaryFiles>,
) -> impl Fn(&RunReport, &ClusterInfo) -> anyhow::Result<String> + Send + Sync + 'static {
    move |report, cluster| {
        let facts = Facts { target: &target, kubernetes: &cluster.server_version };
        let text = markdown(report, &facts);
        let Some(files) = &files else {
            return Ok(format!(
                "\n{text}\n(--driver-summary DIR writes this summary as Markdown and JUnit.)\n"
            ));
        };
        files.write(&text, &junit(report, &facts))?;
        Ok(format!(
            "\n{text}\nThe driver summary is in {} and {}.\n",
            files.markdown.display(),
            files.junit.display()
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use std::time::{Duration, SystemTime};

    use harness::framework::FailureKind;
    use quick_junit::TestCaseStatus;

    use super::*;

    const PREFIX: &str = "[sig-node] [DRA] driver under test [DriverUnderTest] ";

    fn spec(name: &str, outcome: Outcome) -> SpecReport {
        SpecReport {
            full_text: format!("{PREFIX}{name}"),
            labels: vec!["sig-node".into(), "DRA".into(), LABEL.into()],
            index: 0,
            attempt: 1,
            outcome,
            started: SystemTime::UNIX_EPOCH,
            duration: Duration::from_secs(2),
            log: "[    0.001s] INFO  a spec's log line\n".into(),
            artifacts: None,
            tries: 1,
            earlier_failures: Vec::new(),
            phases: Default::default(),
            waits: Vec::new(),
            deferred: Vec::new(),
        }
    }

    fn failed(message: &str) -> Outcome {
        Outcome::Failed {
            kind: FailureKind::Error,
            message: message.into(),
            details: format!("{message}\ndetails"),
        }
    }

    /// A run of three behaviours: one passes, one fails with the call log after its first
    /// line, one skips.
    fn run() -> RunReport {
        RunReport {
            specs: vec![
                spec("publishes valid ResourceSlices for every node it serves", Outcome::Passed),
                spec(
                    "unprepares the claim once when its pod is deleted",
                    failed(
                        "the driver answered NodeUnprepareResources OK, but the CDI devices x|y are still defined\ncall log of node kind-worker (through the interposer):\n  #1 +0.1s GetInfo -> OK",
                    ),
                ),
                spec(
                    "sends the first health snapshot",
                    Outcome::Skipped {
                        reason: "the health stream is only seen through the interposer: run with --interpose"
                            .into(),
                    },
                ),
            ],
            wall_time: Duration::from_millis(44_600),
            repeat: 1,
            started: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_670_000)),
            ..RunReport::default()
        }
    }

    fn driver(interpose: bool) -> Target {
        Target { driver: "gpu.example.com".into(), class: "gpu".into(), interpose, churn_rounds: 10 }
    }

    #[test]
    fn a_behaviour_is_the_spec_s_text_below_the_driver_under_test_container() {
        assert_eq!(
            behaviour(&format!("{PREFIX}sends the first health snapshot")),
            "sends the first health snapshot"
        );
        assert_eq!(
            behaviour("[sig-node] [DRA] kubelet registers plugin"),
            "[sig-node] [DRA] kubelet registers plugin"
        );
    }

    #[test]
    fn the_markdown_heads_the_behaviours_with_the_driver_and_the_cluster() {
        let target = driver(true);
        let text = markdown(&run(), &Facts { target: &target, kubernetes: "v1.37.2" });
        let expected = "\
## dra-e2e driver summary: gpu.example.com

| Driver | DeviceClass | Kubernetes | Calls interposed |
|---|---|---|---|
| gpu.example.com | gpu | v1.37.2 | yes (--interpose) |

1 passed, 1 failed, 1 skipped in 44.6s, started 2026-12-07T19:00:00Z.

| Behaviour | Result | Reason |
|---|---|---|
| publishes valid ResourceSlices for every node it serves | PASS |  |
| unprepares the claim once when its pod is deleted | FAIL | the driver answered NodeUnprepareResources OK, but the CDI devices x\\|y are still defined |
| sends the first health snapshot | SKIP | the health stream is only seen through the interposer: run with --interpose |
";
        assert_eq!(text, expected);
        let plain = driver(false);
        let text = markdown(&run(), &Facts { target: &plain, kubernetes: "" });
        assert!(text.contains("| gpu.example.com | gpu | unknown | no (without --interpose) |"), "{text}");
    }

    #[test]
    fn a_failure_s_reason_is_its_first_line_and_a_skip_keeps_its_reason() {
        let mut report = run();
        report.specs[2].outcome =
            Outcome::Skipped { reason: "no CDI device was written\nfor the claim".into() };
        let rows = rows(&report);
        assert_eq!(
            rows.iter().map(|r| r.verdict).collect::<Vec<_>>(),
            [Verdict::Pass, Verdict::Fail, Verdict::Skip]
        );
        assert_eq!(rows[0].reason, "");
        assert_eq!(
            rows[1].reason,
            "the driver answered NodeUnprepareResources OK, but the CDI devices x|y are still defined"
        );
        assert_eq!(rows[2].reason, "no CDI device was written for the claim");
        // A flaky pass says so; a repeated run names the attempt, as the runner's JUnit does.
        report.specs[0].tries = 2;
        report.repeat = 2;
        report.specs[1].attempt = 2;
        let rows = super::rows(&report);
        assert_eq!(rows[0].reason, "flaky: passed on try 2");
        assert_eq!(rows[1].behaviour, "unprepares the claim once when its pod is deleted (attempt 2/2)");
    }

    #[test]
    fn the_run_s_error_is_shown() {
        let mut report = run();
        report.error = Some("cannot write the JUnit report out/driver.xml: No such file or directory".into());
        report.interrupted = true;
        let target = driver(false);
        let facts = Facts { target: &target, kubernetes: "v1.37.2" };
        let text = markdown(&report, &facts);
        assert!(
            text.contains(
                "\n**Run error:** cannot write the JUnit report out/driver.xml: No such file or directory\n"
            ),
            "{text}"
        );
        assert!(text.contains("**Interrupted**"), "{text}");
        let xml = junit(&report, &facts).to_string().unwrap();
        assert!(
            xml.contains(r#"<property name="runError" value="cannot write the JUnit report out/driver.xml"#),
            "{xml}"
        );
        assert!(!markdown(&run(), &facts).contains("Run error"));
    }

    #[test]
    fn the_junit_summary_has_one_case_per_behaviour_and_the_facts_as_properties() {
        let target = driver(true);
        let xml = junit(&run(), &Facts { target: &target, kubernetes: "v1.37.2" }).to_string().unwrap();
        let parsed = Report::deserialize_from_str(&xml).unwrap();
        assert_eq!((parsed.tests, parsed.failures, parsed.skipped), (3, 1, 1));
        let [suite] = &parsed.test_suites[..] else { panic!("{xml}") };
        assert_eq!(suite.name.as_str(), "dra-e2e driver summary: gpu.example.com");
        let properties: Vec<(&str, &str)> =
            suite.properties.iter().map(|p| (p.name.as_str(), p.value.as_str())).collect();
        assert_eq!(
            properties,
            [
                ("driver", "gpu.example.com"),
                ("deviceClass", "gpu"),
                ("kubernetesVersion", "v1.37.2"),
                ("interposed", "true")
            ]
        );
        let names: Vec<&str> = suite.test_cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "publishes valid ResourceSlices for every node it serves",
                "unprepares the claim once when its pod is deleted",
                "sends the first health snapshot"
            ]
        );
        match &suite.test_cases[1].status {
            TestCaseStatus::NonSuccess { message, description, .. } => {
                assert!(message.as_ref().unwrap().as_str().contains("call log of node kind-worker"));
                assert!(description.as_ref().unwrap().as_str().ends_with("details"));
            }
            other => panic!("{other:?}"),
        }
        match &suite.test_cases[2].status {
            TestCaseStatus::Skipped { message, .. } => {
                assert!(message.as_ref().unwrap().as_str().ends_with(": run with --interpose"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            suite.test_cases.iter().all(|c| c.system_out.is_none()),
            "the spec logs are --junit's: {xml}"
        );
    }

    #[test]
    fn the_files_go_to_the_folder_given_else_next_to_the_reports() {
        let files = |dir: Option<&str>, junit: Option<&str>, json: Option<&str>| {
            SummaryFiles::resolve(dir.map(Path::new), junit.map(Path::new), json.map(Path::new))
                .map(|f| (f.markdown.display().to_string(), f.junit.display().to_string()))
        };
        let pair = |md: &str, xml: &str| Some((md.to_owned(), xml.to_owned()));
        assert_eq!(
            files(Some("out"), Some("r/j.xml"), None),
            pair("out/driver-summary.md", "out/driver-summary.xml")
        );
        assert_eq!(files(None, Some("r/j.xml"), Some("s/k.json")), pair("r/j-summary.md", "r/j-summary.xml"));
        assert_eq!(files(None, None, Some("s/k.json")), pair("s/k-summary.md", "s/k-summary.xml"));
        assert_eq!(files(None, Some("j.xml"), None), pair("j-summary.md", "j-summary.xml"));
        assert_eq!(files(None, None, None), None);
    }

    #[test]
    fn the_hook_prints_the_table_and_writes_both_files_or_fails_in_one_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = ClusterInfo { server_version: "v1.37.2".into(), ..ClusterInfo::default() };
        let files = SummaryFiles::resolve(Some(&dir.path().join("new")), None, None).unwrap();
        let hook = after_run(driver(false), Some(files.clone()));
        let printed = hook(&run(), &cluster).unwrap();
        let written = std::fs::read_to_string(&files.markdown).unwrap();
        assert!(printed.contains(&written), "{printed}");
        assert!(
            printed.contains(&format!("The driver summary is in {}", files.markdown.display())),
            "{printed}"
        );
        let xml = std::fs::read_to_string(&files.junit).unwrap();
        assert!(xml.contains(r#"<property name="interposed" value="false"/>"#), "{xml}");

        let only_printed = after_run(driver(false), None)(&run(), &cluster).unwrap();
        assert!(only_printed.contains("| sends the first health snapshot | SKIP |"), "{only_printed}");
        assert!(only_printed.contains("--driver-summary DIR writes"), "{only_printed}");

        // A folder where a file is: one sentence, naming the path and what to do.
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, "").unwrap();
        let files = SummaryFiles::resolve(Some(&blocked), None, None).unwrap();
        let err = after_run(driver(false), Some(files))(&run(), &cluster).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot write the driver summary {}", blocked.display())), "{err}");
        assert!(err.ends_with("give --driver-summary a folder you can write to"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
