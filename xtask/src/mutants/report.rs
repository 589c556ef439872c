//! The Markdown table of what each mutant did to the suites ([`super::verdict`]), printed and
//! written to a file; it says when no baseline ran and when the run was interrupted.

use std::fmt::Write as _;

use crate::mutants::{
    catalogue::Mutant,
    verdict::{CONFIRM_AT_MOST, Verdict},
};

/// How the run went, beside its verdicts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunNotes<'a> {
    /// No baseline ran (`--no-baseline`).
    pub no_baseline: bool,
    /// The mutant Ctrl-C stopped the run during (it has no verdict; those after it did not run).
    pub interrupted_during: Option<&'a str>,
}

/// The Markdown table of every mutant's verdict, after what `notes` says of the run.
pub fn table(results: &[(Mutant, Verdict)], notes: RunNotes) -> String {
    let mut out = String::new();
    if notes.no_baseline {
        out += "No baseline ran (`--no-baseline`): a spec's failure below is not known to pass without the mutant.\n\n";
    }
    if let Some(mutant) = notes.interrupted_during {
        let _ = writeln!(
            out,
            "Interrupted (Ctrl-C) while `{mutant}` was checked: it has no verdict, and the mutants after it did not run.\n"
        );
    }
    out += "| Mutant | Component | The bug | Lane | Caught by | First failure |\n|---|---|---|---|---|---|\n";
    for (mutant, verdict) in results {
        let (caught, first) = match verdict {
            Verdict::Caught { specs, first_run } => {
                let mut by = specs.iter().map(|s| short(&s.text)).collect::<Vec<_>>().join("<br>");
                let rerun = (*first_run).min(CONFIRM_AT_MOST);
                let _ = write!(
                    by,
                    "<br>({first_run} failed an assertion, {rerun} ran again, {} failed again)",
                    specs.len()
                );
                (by, specs.first().map(|s| escape(&s.message)).unwrap_or_default())
            }
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
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::mutants::{catalogue::MUTANTS, verdict::FailedSpec};

    #[test]
    fn the_table_names_what_caught_each_mutant_and_what_survived() {
        let caught = Verdict::Caught {
            specs: vec![FailedSpec {
                text: "[sig-node] [DRA] kubelet [Feature:X] must unprepare".to_owned(),
                message: "NodeUnprepareResources was called 0 times, want 1".to_owned(),
            }],
            first_run: 30,
        };
        let table = table(
            &[
                (MUTANTS[0], caught),
                (MUTANTS[1], Verdict::Survived { passed: 63 }),
                (MUTANTS[2], Verdict::NotChecked("the build failed: a|b".to_owned())),
            ],
            RunNotes::default(),
        );
        assert!(table.starts_with("| Mutant |"), "{table}");
        assert!(
            table.contains(
                "| kubelet | kubelet must unprepare<br>(30 failed an assertion, 8 ran again, 1 failed again) | NodeUnprepareResources was called 0 times"
            ),
            "{table}"
        );
        assert!(table.contains("**nothing** (63 passed)"), "{table}");
        assert!(table.contains("not checked | the build failed: a\\|b |"), "{table}");
    }

    #[test]
    fn the_table_says_when_no_baseline_ran_and_where_the_run_was_interrupted() {
        let notes = RunNotes { no_baseline: true, interrupted_during: Some("kubelet-never-unprepares") };
        let table = table(&[(MUTANTS[0], Verdict::Survived { passed: 1 })], notes);
        assert!(table.starts_with("No baseline ran (`--no-baseline`)"), "{table}");
        assert!(table.contains("while `kubelet-never-unprepares` was checked: it has no verdict"), "{table}");
    }
}
