//! When a mutant counts as caught. A spec catches a bug only by failing an assertion of its body
//! (ginkgo's state `failed` in the `It`, from the run's JSON report) that it passed on the
//! baseline (the unmutated cluster), and failing it again when run once more with the mutant
//! still in (a flake does not repeat). A timeout, an interrupt, a panic, a set-up failure (the
//! spec's namespace not created) or a clean-up that failed alone say the cluster was slow or the
//! harness broke, not that the spec saw the bug: with only such failures the mutant is "not
//! checked", with the reason. At most [`CONFIRM_AT_MOST`] of the first run's assertion failures run
//! again: one that repeats is enough.

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
    Caught {
        /// The specs that failed an assertion again when run once more.
        specs: Vec<FailedSpec>,
        /// How many specs failed an assertion in the first run (at most [`CONFIRM_AT_MOST`] of
        /// them ran again).
        first_run: usize,
    },
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

/// The most first-run assertion failures of a mutant that run again: one round of a lane's 8
/// procs. One that repeats is enough to call the bug caught, and a bug that fails 50 specs, each
/// waiting out a 5-minute timeout, would otherwise take another half hour.
pub const CONFIRM_AT_MOST: usize = 8;

/// The first run's assertion failures that run again: the first [`CONFIRM_AT_MOST`], in the
/// report's order.
pub fn to_confirm(candidates: &[ReportedSpec]) -> &[ReportedSpec] {
    &candidates[..candidates.len().min(CONFIRM_AT_MOST)]
}

/// The verdict once the [`to_confirm`] share of `candidates` (the first run's assertion
/// failures) ran again with the mutant in: caught by those that failed an assertion again
/// (`again`: the second run's specs).
pub fn confirm(candidates: &[ReportedSpec], again: &[ReportedSpec]) -> Verdict {
    let rerun = to_confirm(candidates);
    let repeated: Vec<FailedSpec> = rerun
        .iter()
        .filter(|c| again.iter().any(|a| a.name == c.name && a.failed_an_assertion()))
        .map(|c| FailedSpec { text: c.name.clone(), message: c.first_line().to_owned() })
        .collect();
    if repeated.is_empty() {
        let first =
            rerun.first().map(|s| format!(" (first: {}: {})", s.name, s.first_line())).unwrap_or_default();
        let of = match candidates.len() - rerun.len() {
            0 => String::new(),
            more => format!(" ({more} more not run again)"),
        };
        return Verdict::NotChecked(format!(
            "the {} assertion failure(s) did not repeat when those specs ran again{of}: flakes{first}",
            rerun.len()
        ));
    }
    Verdict::Caught { specs: repeated, first_run: candidates.len() }
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
            Verdict::Caught {
                specs: vec![FailedSpec { text: "a".into(), message: "expected 1 call, saw 2".into() }],
                first_run: 2,
            }
        );
        let flaky = [spec("a", "timedout", "It", "timed out"), spec("b", "passed", "", "")];
        let Verdict::NotChecked(why) = confirm(&candidates, &flaky) else { panic!() };
        assert!(why.starts_with("the 2 assertion failure(s) did not repeat"), "{why}");
    }

    #[test]
    fn at_most_eight_failures_run_again_and_one_that_repeats_catches() {
        let names: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
        let candidates: Vec<ReportedSpec> = names.iter().map(|n| spec(n, "failed", "It", "saw 0")).collect();
        let rerun = to_confirm(&candidates);
        assert_eq!(rerun.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), &names[..8]);
        // Only the rerun ones count: a repeat of one that did not run again is no evidence.
        let again = [spec("s03", "failed", "It", "saw 0"), spec("s12", "failed", "It", "saw 0")];
        let Verdict::Caught { specs, first_run } = confirm(&candidates, &again) else { panic!() };
        assert_eq!((specs.len(), specs[0].text.as_str(), first_run), (1, "s03", 20));
        let Verdict::NotChecked(why) = confirm(&candidates, &[spec("s12", "failed", "It", "saw 0")]) else {
            panic!()
        };
        assert!(
            why.starts_with(
                "the 8 assertion failure(s) did not repeat when those specs ran again (12 more not run again)"
            ),
            "{why}"
        );
        assert_eq!(to_confirm(&candidates[..3]).len(), 3);
    }

    #[test]
    fn a_run_without_failures_survives() {
        let specs = [spec("a", "passed", "", ""), spec("b", "skipped", "It", "needs 2 nodes")];
        assert_eq!(first_run(&specs, None), FirstRun::Done(Verdict::Survived { passed: 1 }));
    }
}
