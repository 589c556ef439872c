//! When a mutant counts as caught. A spec catches a bug only by failing an assertion of its body
//! (ginkgo's state `failed` in the `It`, from the run's JSON report) that it passed on the
//! baseline (the unmutated cluster), and failing it again when run once more with the mutant
//! still in (a flake does not repeat). A timeout, an interrupt, a panic, a set-up failure (the
//! spec's namespace not created) or a clean-up that failed alone say the cluster was slow or the
//! harness broke, not that the spec saw the bug: with only such failures the mutant is "not
//! checked", with the reason.

use std::collections::{BTreeMap, HashSet};

use crate::test::report::ReportedSpec;

/// One spec that caught a mutant: its full text and the first line of its failure.
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
    /// Specs failed an assertion, twice: the suites caught the bug.
    Caught(Vec<FailedSpec>),
    /// Every spec passed (or skipped): the bug went unnoticed.
    Survived {
        /// Specs that passed.
        passed: usize,
    },
    /// The mutant could not be checked: the build or the cluster failed, or no failure was an
    /// assertion that repeats.
    NotChecked(String),
}

/// What the lane's first run with the mutant in says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstRun {
    /// A verdict already.
    Done(Verdict),
    /// These specs failed an assertion they passed on the baseline: run them again.
    Confirm(Vec<ReportedSpec>),
}

/// Judges the first run's `specs`; `baseline` is the specs that passed without the mutant
/// (`None`: no baseline ran, `--no-baseline`).
pub fn first_run(specs: &[ReportedSpec], baseline: Option<&HashSet<String>>) -> FirstRun {
    let failed: Vec<&ReportedSpec> = specs.iter().filter(|s| s.failed()).collect();
    if failed.is_empty() {
        return FirstRun::Done(Verdict::Survived { passed: specs.iter().filter(|s| s.passed()).count() });
    }
    let passed_before = |s: &ReportedSpec| baseline.is_none_or(|b| b.contains(&s.name));
    let (candidates, others): (Vec<&ReportedSpec>, Vec<&ReportedSpec>) =
        failed.into_iter().partition(|s| s.failed_an_assertion() && passed_before(s));
    if !candidates.is_empty() {
        return FirstRun::Confirm(candidates.into_iter().cloned().collect());
    }
    // Grouped by how each failed, in a stable order.
    let mut how: BTreeMap<String, usize> = BTreeMap::new();
    for spec in &others {
        let key = if spec.failed_an_assertion() {
            "failed in It but did not pass on the baseline".to_owned()
        } else {
            spec.how()
        };
        *how.entry(key).or_default() += 1;
    }
    let how: Vec<String> = how.into_iter().map(|(how, n)| format!("{n} {how}")).collect();
    let first =
        others.first().map(|s| format!(" (first: {}: {})", s.name, s.first_line())).unwrap_or_default();
    FirstRun::Done(Verdict::NotChecked(format!("no spec failed an assertion: {}{first}", how.join(", "))))
}

/// The verdict once `candidates` ran again with the mutant in: caught by those that failed an
/// assertion again (`again`: the second run's specs).
pub fn confirm(candidates: &[ReportedSpec], again: &[ReportedSpec]) -> Verdict {
    let repeated: Vec<FailedSpec> = candidates
        .iter()
        .filter(|c| again.iter().any(|a| a.name == c.name && a.failed_an_assertion()))
        .map(|c| FailedSpec { text: c.name.clone(), message: c.first_line().to_owned() })
        .collect();
    if repeated.is_empty() {
        let first = candidates
            .first()
            .map(|s| format!(" (first: {}: {})", s.name, s.first_line()))
            .unwrap_or_default();
        return Verdict::NotChecked(format!(
            "the {} assertion failure(s) did not repeat when those specs ran again: flakes{first}",
            candidates.len()
        ));
    }
    Verdict::Caught(repeated)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn spec(name: &str, state: &str, node: &str, message: &str) -> ReportedSpec {
        ReportedSpec { name: name.into(), state: state.into(), message: message.into(), node: node.into() }
    }

    fn baseline(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_mutant_whose_only_failures_are_timeouts_interrupts_set_up_or_clean_up_is_not_checked() {
        // The old verdict counted any spec that did not pass as a kill.
        let specs = [
            spec("a", "passed", "", ""),
            spec("b", "timedout", "It", "timed out after 10m"),
            spec("c", "interrupted", "It", "interrupted (Ctrl-C) while running"),
            spec(
                "d",
                "failed",
                "BeforeEach",
                "timed out after 1m waiting for the spec's namespace to be created",
            ),
            spec("e", "failed", "DeferCleanup (Each)", "cleanup \"delete pod x\" failed"),
            spec("f", "panicked", "It", "panicked: index out of range"),
        ];
        let FirstRun::Done(Verdict::NotChecked(why)) =
            first_run(&specs, Some(&baseline(&["a", "b", "c", "d", "e", "f"])))
        else {
            panic!("{:?}", first_run(&specs, None))
        };
        assert_eq!(
            why,
            "no spec failed an assertion: 1 failed in BeforeEach, 1 failed in DeferCleanup (Each), 1 interrupted in It, 1 panicked in It, 1 timedout in It (first: b: timed out after 10m)"
        );
    }

    #[test]
    fn an_assertion_failure_counts_only_for_a_spec_that_passed_on_the_baseline() {
        let specs = [spec("a", "failed", "It", "expected 1 call, saw 2"), spec("b", "failed", "It", "saw 0")];
        let FirstRun::Confirm(candidates) = first_run(&specs, Some(&baseline(&["b"]))) else { panic!() };
        assert_eq!(candidates.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["b"]);
        let FirstRun::Done(Verdict::NotChecked(why)) = first_run(&specs[..1], Some(&baseline(&["b"]))) else {
            panic!()
        };
        assert!(why.contains("1 failed in It but did not pass on the baseline"), "{why}");
        // Without a baseline (--no-baseline) every assertion failure is a candidate.
        let FirstRun::Confirm(candidates) = first_run(&specs, None) else { panic!() };
        assert_eq!(candidates.len(), 2);
    }

    #[test]
    fn a_mutant_is_caught_only_by_failures_that_repeat() {
        let candidates =
            [spec("a", "failed", "It", "\nexpected 1 call, saw 2\nmore"), spec("b", "failed", "It", "x")];
        let again = [spec("a", "failed", "It", "expected 1 call, saw 2"), spec("b", "passed", "", "")];
        assert_eq!(
            confirm(&candidates, &again),
            Verdict::Caught(vec![FailedSpec { text: "a".into(), message: "expected 1 call, saw 2".into() }])
        );
        let flaky = [spec("a", "timedout", "It", "timed out"), spec("b", "passed", "", "")];
        let Verdict::NotChecked(why) = confirm(&candidates, &flaky) else { panic!() };
        assert!(why.starts_with("the 2 assertion failure(s) did not repeat"), "{why}");
    }

    #[test]
    fn a_run_without_failures_survives() {
        let specs = [spec("a", "passed", "", ""), spec("b", "skipped", "It", "needs 2 nodes")];
        assert_eq!(first_run(&specs, None), FirstRun::Done(Verdict::Survived { passed: 1 }));
    }
}
