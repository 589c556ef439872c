//! The JSON report every dra-e2e run of `cargo xtask test` writes (ginkgo's `[]types.Report`
//! schema, beside its JUnit file): where it goes, and the specs that failed in it. A failed
//! run's step names its failed specs and the first line of each failure, so the step table at
//! the end of a CI log says why, even when the log itself is cut.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::e2e;

/// The flag that names the report in dra-e2e's arguments.
pub(crate) const FLAG: &str = "--json-report";

/// How many failed specs a step's error names.
const NAMED: usize = 3;
/// How long one failure's first line may be in a step's error.
const LINE: usize = 300;

/// The JSON report of the run whose JUnit stem is `stem`.
pub(crate) fn path(repo: &Path, stem: &str) -> PathBuf {
    e2e::target_dir(repo).join("e2e").join(format!("{stem}.json"))
}

/// The report dra-e2e's `args` name, if any.
pub(crate) fn named_in(args: &[String]) -> Option<PathBuf> {
    args.iter().position(|a| a == FLAG).and_then(|i| args.get(i + 1)).map(PathBuf::from)
}

/// The report at `path`, parsed.
pub(crate) fn read(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// A spec of a dra-e2e JSON report that neither passed nor was skipped.
pub(crate) struct FailedSpec {
    /// Its full text (its containers' texts, if any, and its leaf text).
    pub name: String,
    /// Its state (`failed`, `timedout`, …).
    pub state: String,
    /// Its failure message.
    pub message: String,
}

/// The spec reports of a dra-e2e JSON report (an array of ginkgo-style reports).
fn spec_reports(reports: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    reports.as_array().into_iter().flatten().flat_map(|r| r["SpecReports"].as_array().into_iter().flatten())
}

/// How many specs of a dra-e2e JSON report passed.
pub(crate) fn passed_count(reports: &serde_json::Value) -> usize {
    spec_reports(reports).filter(|spec| spec["State"].as_str() == Some("passed")).count()
}

/// The specs of a dra-e2e JSON report that failed (neither passed, skipped nor pending).
pub(crate) fn failed_specs(reports: &serde_json::Value) -> Vec<FailedSpec> {
    spec_reports(reports)
        .filter_map(|spec| {
            let state = spec["State"].as_str().unwrap_or_default();
            if matches!(state, "passed" | "skipped" | "pending") {
                return None;
            }
            let containers = spec["ContainerHierarchyTexts"].as_array().into_iter().flatten();
            let mut text: Vec<&str> = containers.filter_map(|t| t.as_str()).collect();
            text.push(spec["LeafNodeText"].as_str().unwrap_or("(unnamed spec)"));
            Some(FailedSpec {
                name: text.join(" "),
                state: state.to_owned(),
                message: spec["Failure"]["Message"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// One line naming the first [`NAMED`] failed specs with the first line of each failure:
/// `2 failed: a (failed): expected …; b (timedout): …`.
pub(crate) fn summary(failed: &[FailedSpec]) -> String {
    let named: Vec<String> = failed
        .iter()
        .take(NAMED)
        .map(|spec| {
            let first = spec.message.lines().find(|l| !l.trim().is_empty()).unwrap_or("(no message)");
            format!("{} ({}): {}", spec.name, spec.state, super::clip(first.trim(), LINE))
        })
        .collect();
    let more = failed.len().saturating_sub(NAMED);
    let more = if more > 0 { format!("; and {more} more") } else { String::new() };
    format!("{} failed: {}{more}", failed.len(), named.join("; "))
}

/// What a failed run's report says, for its step's error: [`summary`], or why it cannot be read.
pub(crate) fn why_failed(path: &Path) -> String {
    match read(path) {
        Ok(reports) => {
            let failed = failed_specs(&reports);
            if failed.is_empty() {
                format!("no spec failed in {} (the run itself failed: see its output)", path.display())
            } else {
                summary(&failed)
            }
        }
        Err(e) => format!("{e:#}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_failed_specs_with_the_first_line_of_each() {
        let reports = serde_json::json!([{ "SpecReports": [
            { "State": "passed", "LeafNodeText": "a" },
            { "State": "failed", "LeafNodeText": "b", "Failure": { "Message": "\nexpected 1 call, saw 2\ncall log:\n  x" } },
            { "State": "skipped", "LeafNodeText": "c" },
            { "State": "timedout", "LeafNodeText": "d", "Failure": { "Message": "timed out" } },
            { "State": "failed", "LeafNodeText": "e", "Failure": {} },
            { "State": "panicked", "LeafNodeText": "f", "Failure": { "Message": "boom" } },
        ]}]);
        let failed = failed_specs(&reports);
        assert_eq!(failed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["b", "d", "e", "f"]);
        assert_eq!(passed_count(&reports), 1);
        assert_eq!(
            summary(&failed),
            "4 failed: b (failed): expected 1 call, saw 2; d (timedout): timed out; e (failed): (no message); and 1 more"
        );
    }

    #[test]
    fn a_failed_spec_is_named_by_its_containers_and_its_leaf() {
        let reports = serde_json::json!([{ "SpecReports": [
            { "State": "failed", "ContainerHierarchyTexts": ["[sig-node]", "kubelet"], "LeafNodeText": "x" },
        ]}]);
        assert_eq!(failed_specs(&reports)[0].name, "[sig-node] kubelet x");
    }

    #[test]
    fn the_report_is_found_in_the_arguments() {
        let args: Vec<String> = ["--focus", "x", FLAG, "/t/r.json", "-p", "8"].map(String::from).to_vec();
        assert_eq!(named_in(&args), Some(PathBuf::from("/t/r.json")));
        assert_eq!(named_in(&args[..3]), None);
        assert_eq!(named_in(&args[..2]), None);
    }

    #[test]
    fn an_unreadable_report_says_so() {
        let why = why_failed(Path::new("/nonexistent/dra-e2e-report.json"));
        assert!(why.contains("read /nonexistent/dra-e2e-report.json"), "{why}");
    }
}
