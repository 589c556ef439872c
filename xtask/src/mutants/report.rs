//! What each mutant did to the suites: read from the run's ginkgo JSON report, printed and
//! written as a Markdown table.

use std::{fmt::Write as _, path::Path};

use anyhow::{Context, Result};

use crate::mutants::catalogue::Mutant;

/// One spec that failed under a mutant: its full text and the first line of its failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedSpec {
    /// The spec's full text.
    pub text: String,
    /// The first line of its failure message.
    pub message: String,
}

/// How the lane did with one mutant in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Specs failed: the suites caught the bug.
    Caught(Vec<FailedSpec>),
    /// Every spec passed (or skipped): the bug went unnoticed.
    Survived {
        /// Specs that passed.
        passed: usize,
    },
    /// The mutant could not be checked (the build or the cluster failed).
    NotChecked(String),
}

/// The verdict of a run from its JSON report (`[]types.Report`, ginkgo's schema).
pub fn verdict_from_json(path: &Path) -> Result<Verdict> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    verdict_from_json_text(&text).with_context(|| format!("read the JSON report {}", path.display()))
}

fn verdict_from_json_text(text: &str) -> Result<Verdict> {
    let reports: serde_json::Value = serde_json::from_str(text)?;
    let failed: Vec<FailedSpec> = crate::test::report::failed_specs(&reports)
        .into_iter()
        .map(|spec| FailedSpec {
            text: spec.name,
            message: spec.message.lines().next().unwrap_or_default().to_owned(),
        })
        .collect();
    Ok(if failed.is_empty() {
        Verdict::Survived { passed: crate::test::report::passed_count(&reports) }
    } else {
        Verdict::Caught(failed)
    })
}

/// The Markdown table of every mutant's verdict.
pub fn table(results: &[(Mutant, Verdict)]) -> String {
    let mut out = String::from(
        "| Mutant | Component | The bug | Lane | Caught by | First failure |\n|---|---|---|---|---|---|\n",
    );
    for (mutant, verdict) in results {
        let (caught, first) = match verdict {
            Verdict::Caught(specs) => (
                specs.iter().map(|s| short(&s.text)).collect::<Vec<_>>().join("<br>"),
                specs.first().map(|s| escape(&s.message)).unwrap_or_default(),
            ),
            Verdict::Survived { passed } => (format!("**nothing** ({passed} passed)"), String::new()),
            Verdict::NotChecked(why) => ("not checked".to_owned(), escape(why)),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            mutant.name,
            mutant.component,
            mutant.bug,
            mutant.lane.name(),
            caught,
            first
        );
    }
    out
}

/// A spec's text without the labels' brackets, which make the table unreadable.
fn short(text: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    escape(&out.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn escape(text: &str) -> String {
    let text: String = text.chars().take(300).collect();
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutants::catalogue::MUTANTS;

    const REPORT: &str = r#"[{"SpecReports": [
        {"ContainerHierarchyTexts": [], "LeafNodeText": "[sig-node] [DRA] kubelet [Feature:X] must unprepare", "State": "failed",
         "Failure": {"Message": "NodeUnprepareResources was called 0 times, want 1\nmore"}},
        {"ContainerHierarchyTexts": [], "LeafNodeText": "passes", "State": "passed"},
        {"ContainerHierarchyTexts": [], "LeafNodeText": "skips", "State": "skipped"}
    ]}]"#;

    #[test]
    fn failed_specs_are_read_with_their_first_message_line() {
        let verdict = verdict_from_json_text(REPORT).unwrap();
        assert_eq!(
            verdict,
            Verdict::Caught(vec![FailedSpec {
                text: "[sig-node] [DRA] kubelet [Feature:X] must unprepare".to_owned(),
                message: "NodeUnprepareResources was called 0 times, want 1".to_owned(),
            }])
        );
        let passing = REPORT.replace("\"failed\"", "\"passed\"");
        assert_eq!(verdict_from_json_text(&passing).unwrap(), Verdict::Survived { passed: 2 });
    }

    #[test]
    fn the_table_names_what_caught_each_mutant_and_what_survived() {
        let caught = verdict_from_json_text(REPORT).unwrap();
        let table = table(&[
            (MUTANTS[0], caught),
            (MUTANTS[1], Verdict::Survived { passed: 63 }),
            (MUTANTS[2], Verdict::NotChecked("the build failed: a|b".to_owned())),
        ]);
        assert!(
            table.contains("| kubelet | kubelet must unprepare | NodeUnprepareResources was called 0 times"),
            "{table}"
        );
        assert!(table.contains("**nothing** (63 passed)"), "{table}");
        assert!(table.contains("not checked | the build failed: a\\|b |"), "{table}");
    }
}
