//! The JSON report every dra-e2e run of `cargo xtask test` and `cargo xtask mutants` writes
//! (ginkgo's `[]types.Report` schema, beside its JUnit file): where it goes, and what each spec
//! in it did: its state and, for a failure, where it happened (ginkgo's `FailureNodeType`: the
//! body's `It`, the set-up's `BeforeEach`, a clean-up's `DeferCleanup`). A failed run's step
//! names its failed specs and the first line of each failure, so the step table at the end of a
//! CI log says why, even when the log itself is cut.

use std::path::Path;

use anyhow::{Context, Result};

/// The flag that names the report in dra-e2e's arguments.
pub(crate) const FLAG: &str = "--json-report";

/// How many specs a step's error names.
const NAMED: usize = 3;
/// How long one failure's first line may be in a step's error.
const LINE: usize = 300;

/// The report at `path`, parsed.
pub(crate) fn read(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// A spec of a dra-e2e JSON report and what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReportedSpec {
    /// Its full text (its containers' texts, if any, and its leaf text).
    pub name: String,
    /// Its state (`passed`, `skipped`, `failed`, `timedout`, `interrupted`, `panicked`, …).
    pub state: String,
    /// Its failure message, or its skip's reason; empty when it passed.
    pub message: String,
    /// Where it failed (ginkgo's `FailureNodeType`: `It`, `BeforeEach`, `DeferCleanup (Each)`,
    /// …); empty when the report does not say.
    pub node: String,
}

impl ReportedSpec {
    /// Whether it passed.
    pub(crate) fn passed(&self) -> bool {
        self.state == "passed"
    }

    /// Whether it was skipped.
    pub(crate) fn skipped(&self) -> bool {
        self.state == "skipped"
    }

    /// Whether it failed (neither passed, skipped nor pending).
    pub(crate) fn failed(&self) -> bool {
        !matches!(self.state.as_str(), "passed" | "skipped" | "pending")
    }

    /// Whether its body failed an assertion: state `failed` in its `It`. Not a timeout, an
    /// interrupt, a panic, its set-up or a clean-up alone.
    pub(crate) fn failed_an_assertion(&self) -> bool {
        self.state == "failed" && self.node == "It"
    }

    /// `failed in It`, `timedout in It`, `failed in DeferCleanup (Each)`, or the state alone.
    pub(crate) fn how(&self) -> String {
        if self.node.is_empty() { self.state.clone() } else { format!("{} in {}", self.state, self.node) }
    }

    /// Its message's first line that is not blank.
    pub(crate) fn first_line(&self) -> &str {
        self.message.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("(no message)")
    }
}

/// Every spec of a dra-e2e JSON report (an array of ginkgo-style reports), in its order.
pub(crate) fn specs(reports: &serde_json::Value) -> Vec<ReportedSpec> {
    let spec_reports = reports
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["SpecReports"].as_array().into_iter().flatten());
    spec_reports
        .map(|spec| {
            let containers = spec["ContainerHierarchyTexts"].as_array().into_iter().flatten();
            let mut text: Vec<&str> = containers.filter_map(|t| t.as_str()).collect();
            text.push(spec["LeafNodeText"].as_str().unwrap_or("(unnamed spec)"));
            let failure = &spec["Failure"];
            ReportedSpec {
                name: text.join(" "),
                state: spec["State"].as_str().unwrap_or_default().to_owned(),
                message: failure["Message"].as_str().unwrap_or_default().to_owned(),
                node: failure["FailureNodeType"].as_str().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

/// One line naming the first [`NAMED`] failed specs with the first line of each failure:
/// `2 failed: a (failed in It): expected …; b (timedout in It): …`.
pub(crate) fn summary(failed: &[&ReportedSpec]) -> String {
    format!("{} failed: {}", failed.len(), named(failed, |spec| format!("({})", spec.how())))
}

/// The first [`NAMED`] of `specs`, each `name <what>: first line`, and how many more.
pub(crate) fn named(specs: &[&ReportedSpec], what: impl Fn(&ReportedSpec) -> String) -> String {
    let named: Vec<String> = specs
        .iter()
        .take(NAMED)
        .map(|spec| format!("{} {}: {}", spec.name, what(spec), super::clip(spec.first_line(), LINE)))
        .collect();
    let more = specs.len().saturating_sub(NAMED);
    let more = if more > 0 { format!("; and {more} more") } else { String::new() };
    format!("{}{more}", named.join("; "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_failed_specs_with_where_and_the_first_line_of_each() {
        let reports = serde_json::json!([{ "SpecReports": [
            { "State": "passed", "LeafNodeText": "a" },
            { "State": "failed", "LeafNodeText": "b", "Failure": { "Message": "\nexpected 1 call, saw 2\ncall log:\n  x", "FailureNodeType": "It" } },
            { "State": "skipped", "LeafNodeText": "c" },
            { "State": "timedout", "LeafNodeText": "d", "Failure": { "Message": "timed out", "FailureNodeType": "It" } },
            { "State": "failed", "LeafNodeText": "e", "Failure": {} },
            { "State": "panicked", "LeafNodeText": "f", "Failure": { "Message": "boom" } },
        ]}]);
        let all = specs(&reports);
        let failed: Vec<&ReportedSpec> = all.iter().filter(|s| s.failed()).collect();
        assert_eq!(failed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["b", "d", "e", "f"]);
        assert_eq!(specs(&reports).iter().filter(|s| s.passed()).count(), 1);
        assert_eq!(
            summary(&failed),
            "4 failed: b (failed in It): expected 1 call, saw 2; d (timedout in It): timed out; e (failed): (no message); and 1 more"
        );
    }

    #[test]
    fn only_a_failure_in_the_body_that_is_not_a_timeout_is_an_assertion() {
        let spec = |state: &str, node: &str| ReportedSpec {
            name: "s".into(),
            state: state.into(),
            message: "m".into(),
            node: node.into(),
        };
        assert!(spec("failed", "It").failed_an_assertion());
        for (state, node) in [
            ("timedout", "It"),
            ("interrupted", "It"),
            ("panicked", "It"),
            ("failed", "BeforeEach"),
            ("failed", "DeferCleanup (Each)"),
            ("failed", ""),
            ("passed", ""),
        ] {
            assert!(!spec(state, node).failed_an_assertion(), "{state} in {node}");
        }
    }

    #[test]
    fn a_failed_spec_is_named_by_its_containers_and_its_leaf() {
        let reports = serde_json::json!([{ "SpecReports": [
            { "State": "failed", "ContainerHierarchyTexts": ["[sig-node]", "kubelet"], "LeafNodeText": "x" },
        ]}]);
        assert_eq!(specs(&reports)[0].name, "[sig-node] kubelet x");
    }

    #[test]
    fn an_unreadable_report_says_so() {
        let why = format!("{:#}", read(Path::new("/nonexistent/dra-e2e-report.json")).unwrap_err());
        assert!(why.contains("read /nonexistent/dra-e2e-report.json"), "{why}");
    }
}
