//! The JUnit XML report: one test suite, one test case per spec run.
//!
//! With `--repeat N` (N > 1) every attempt is its own test case, named
//! `<full text> (attempt i/N)` and carrying an `attempt` property, so a report
//! shows which attempt failed.

use std::path::Path;

use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestRerun, TestSuite};

use crate::report::outcome::{Outcome, RunReport};

/// The name of the report and its test suite.
pub const SUITE_NAME: &str = "dra-e2e";

/// Builds the report.
pub fn report(run: &RunReport) -> Report {
    let mut suite = TestSuite::new(SUITE_NAME);
    suite.set_time(run.wall_time);
    for spec in &run.specs {
        let status = match &spec.outcome {
            // A flaky spec passes, with its earlier tries as `flakyFailure`s (as surefire and
            // nextest write them); ginkgo also reports it as passed.
            Outcome::Passed if spec.is_flaky() => TestCaseStatus::Success {
                flaky_runs: spec
                    .earlier_failures
                    .iter()
                    .map(|failure| {
                        let mut rerun = TestRerun::new(NonSuccessKind::Failure);
                        rerun.set_message(failure.as_str());
                        rerun
                    })
                    .collect(),
            },
            Outcome::Passed => TestCaseStatus::success(),
            Outcome::Skipped { reason } => {
                let mut s = TestCaseStatus::skipped();
                s.set_message(reason.as_str());
                s
            }
            Outcome::Failed { kind, message, details } => {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(message.as_str()).set_type(kind.as_str()).set_description(details.as_str());
                s
            }
        };
        let name = if run.repeat > 1 {
            format!("{} (attempt {}/{})", spec.full_text, spec.attempt, run.repeat)
        } else {
            spec.full_text.clone()
        };
        let mut case = TestCase::new(name, status);
        case.set_classname(SUITE_NAME).set_time(spec.duration).set_system_out_lossy(spec.log.as_bytes());
        if run.repeat > 1 {
            case.add_property(Property::new("attempt", spec.attempt.to_string()));
        }
        if spec.tries > 1 {
            case.add_property(Property::new("tries", spec.tries.to_string()));
        }
        for (name, d) in spec.phases.entries() {
            case.add_property(Property::new(format!("phase:{name}"), format!("{:.3}", d.as_secs_f64())));
        }
        if let Some(dir) = &spec.artifacts {
            case.add_property(Property::new("artifacts", dir.display().to_string()));
        }
        suite.add_test_case(case);
    }
    let mut report = Report::new(SUITE_NAME);
    report.set_time(run.wall_time);
    report.add_test_suite(suite);
    report
}

/// Writes the report atomically (a temporary file next to it, then rename).
pub fn write(run: &RunReport, path: &Path) -> Result<(), JunitError> {
    write_report(&report(run), path)
}

/// Writes a JUnit report atomically (a temporary file next to it, then rename): [`report`]'s,
/// or one a suite made from it.
pub fn write_report(report: &Report, path: &Path) -> Result<(), JunitError> {
    let xml = report.to_string().map_err(|e| JunitError::Serialize(e.to_string()))?;
    let tmp = path.with_extension("xml.tmp");
    std::fs::write(&tmp, xml)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| JunitError::Write { path: path.display().to_string(), source })
}

/// The report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum JunitError {
    /// Serializing failed.
    #[error("cannot serialize the JUnit report: {0}")]
    Serialize(String),
    /// Writing failed.
    #[error("cannot write the JUnit report {path}: {source}")]
    Write {
        /// The report path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rstest::rstest;

    use super::*;
    use crate::report::outcome::{FailureKind, SpecReport};

    fn spec(text: &str, attempt: u32, outcome: Outcome, log: &str) -> SpecReport {
        SpecReport {
            full_text: text.into(),
            labels: vec![],
            index: 0,
            attempt,
            outcome,
            started: std::time::SystemTime::UNIX_EPOCH,
            duration: Duration::from_millis(1500),
            log: log.into(),
            artifacts: None,
            tries: 1,
            earlier_failures: vec![],
            phases: Default::default(),
            waits: Vec::new(),
            deferred: vec![],
        }
    }

    fn run(repeat: u32) -> RunReport {
        RunReport {
            seed: 7,
            started: None,
            round_times: Vec::new(),
            specs: vec![
                spec(
                    "[sig-node] [DRA] passes",
                    1,
                    Outcome::Passed,
                    "[    0.001s] INFO  x: hello <&> \"quoted\"\n",
                ),
                spec(
                    "[sig-node] [DRA] skips",
                    1,
                    Outcome::Skipped { reason: "needs 2 nodes, cluster has 1".into() },
                    "",
                ),
                spec(
                    "[sig-node] [DRA] fails <xml> & \"escapes\"",
                    repeat,
                    Outcome::Failed {
                        kind: FailureKind::Panic,
                        message: "panicked: boom".into(),
                        details: "panicked: boom\nat src/x.rs:1".into(),
                    },
                    "control \u{1b}[31m char\n",
                ),
            ],
            interrupted: false,
            wall_time: Duration::from_secs(3),
            error: None,
            repeat,
        }
    }

    #[rstest]
    #[case(1, "[sig-node] [DRA] fails <xml> & \"escapes\"")]
    #[case(3, "[sig-node] [DRA] fails <xml> & \"escapes\" (attempt 3/3)")]
    fn round_trips_through_a_junit_parser(#[case] repeat: u32, #[case] failed_name: &str) {
        let xml = report(&run(repeat)).to_string().unwrap();
        assert!(xml.starts_with("<?xml"), "{xml}");
        let parsed = Report::deserialize_from_str(&xml).unwrap();
        assert_eq!(parsed.tests, 3);
        assert_eq!(parsed.failures, 1);
        assert_eq!(parsed.skipped, 1);
        assert_eq!(parsed.test_suites.len(), 1);
        let suite = &parsed.test_suites[0];
        assert_eq!(suite.name.as_str(), SUITE_NAME);
        let cases = &suite.test_cases;
        assert!(cases[0].name.as_str().starts_with("[sig-node] [DRA] passes"));
        assert_eq!(cases[0].time, Some(Duration::from_millis(1500)));
        // the parser trims the text node's trailing newline
        assert_eq!(
            cases[0].system_out.as_ref().unwrap().as_str().trim_end(),
            "[    0.001s] INFO  x: hello <&> \"quoted\""
        );
        match &cases[1].status {
            TestCaseStatus::Skipped { message, .. } => {
                assert_eq!(message.as_ref().unwrap().as_str(), "needs 2 nodes, cluster has 1");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(cases[2].name.as_str(), failed_name);
        match &cases[2].status {
            TestCaseStatus::NonSuccess { kind, message, ty, description, .. } => {
                assert_eq!(*kind, NonSuccessKind::Failure);
                assert_eq!(message.as_ref().unwrap().as_str(), "panicked: boom");
                assert_eq!(ty.as_ref().unwrap().as_str(), "panic");
                assert!(description.as_ref().unwrap().as_str().contains("at src/x.rs:1"));
            }
            other => panic!("{other:?}"),
        }
        // the control character cannot be represented in XML 1.0 and is replaced
        assert!(cases[2].system_out.as_ref().unwrap().as_str().contains("char"));
        let attempts: Vec<_> = cases[2]
            .properties
            .iter()
            .filter(|p| p.name.as_str() == "attempt")
            .map(|p| p.value.as_str())
            .collect();
        assert_eq!(attempts, if repeat > 1 { vec!["3"] } else { vec![] });
    }

    #[test]
    fn phases_are_properties_in_seconds() {
        let mut run = run(1);
        run.specs[0].phases = crate::Phases {
            setup: Some(Duration::from_millis(2500)),
            body: Some(Duration::from_millis(1000)),
            cleanup: Some(Duration::from_millis(125)),
            deferred: None,
            queued: None,
        };
        let xml = report(&run).to_string().unwrap();
        for property in [
            r#"<property name="phase:setup" value="2.500"/>"#,
            r#"<property name="phase:body" value="1.000"/>"#,
            r#"<property name="phase:cleanup" value="0.125"/>"#,
        ] {
            assert!(xml.contains(property), "{property} missing in {xml}");
        }
        assert!(!xml.contains("phase:deferred"), "{xml}");
        assert_eq!(xml.matches("phase:").count(), 3, "only the first spec has phases: {xml}");
    }

    #[test]
    fn writes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junit.xml");
        write(&run(1), &path).unwrap();
        let xml = std::fs::read_to_string(&path).unwrap();
        assert!(Report::deserialize_from_str(&xml).is_ok());
        assert!(!dir.path().join("junit.xml.tmp").exists());
        let err = write(&run(1), &dir.path().join("missing/junit.xml")).unwrap_err();
        assert!(err.to_string().starts_with("cannot write the JUnit report"), "{err}");
    }

    #[test]
    fn a_flaky_spec_passes_with_its_earlier_failures_as_flaky_failures() {
        let mut flaky = spec("[sig-node] [DRA] flakes", 1, Outcome::Passed, "");
        flaky.tries = 3;
        flaky.earlier_failures = vec!["try 1: boom".into(), "try 2: bang".into()];
        let run = RunReport { specs: vec![flaky], repeat: 1, ..RunReport::default() };
        let xml = report(&run).to_string().unwrap();
        let parsed = Report::deserialize_from_str(&xml).unwrap();
        let case = &parsed.test_suites[0].test_cases[0];
        match &case.status {
            TestCaseStatus::Success { flaky_runs } => {
                let messages: Vec<_> =
                    flaky_runs.iter().map(|r| r.message.as_ref().unwrap().as_str()).collect();
                assert_eq!(messages, ["try 1: boom", "try 2: bang"]);
            }
            other => panic!("expected a flaky success, got {other:?}"),
        }
        assert!(case.properties.iter().any(|p| p.name.as_str() == "tries" && p.value.as_str() == "3"));
        assert_eq!(parsed.failures, 0);
    }
}
