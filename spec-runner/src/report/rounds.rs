//! The soak table of a `--repeat N` run: each round's outcome and wall time, and each spec's
//! outcomes and time spread over the rounds.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use crate::{
    duration,
    report::outcome::{Outcome, RunReport, SpecReport},
};

/// Per round and per spec, for a run with more than one round; empty otherwise.
pub(crate) fn table(report: &RunReport) -> String {
    if report.repeat < 2 {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(out, "\nRounds (--repeat {}):", report.repeat);
    let _ = writeln!(out, "  round  passed  failed  skipped  wall time");
    for (i, wall) in report.round_times.iter().enumerate() {
        let round = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let runs: Vec<&SpecReport> = report.specs.iter().filter(|s| s.attempt == round).collect();
        let count = counts(&runs);
        let _ = writeln!(
            out,
            "  {round:>5}  {:>6}  {:>6}  {:>7}  {}",
            count.passed,
            count.failed,
            count.skipped,
            duration::display(*wall)
        );
    }
    let mut by_spec: BTreeMap<usize, Vec<&SpecReport>> = BTreeMap::new();
    for spec in &report.specs {
        by_spec.entry(spec.index).or_default().push(spec);
    }
    let mut rows: Vec<SpecRow<'_>> = by_spec.values().map(|runs| SpecRow::of(runs)).collect();
    rows.sort_by(|a, b| b.slowest.cmp(&a.slowest).then_with(|| a.text.cmp(b.text)));
    let _ = writeln!(
        out,
        "Each spec over the rounds (passed/failed/skipped; time on its worker slot: fastest, median, slowest), slowest first:"
    );
    for row in rows {
        let times = if row.ran == 0 {
            "-".to_owned()
        } else {
            format!(
                "{} / {} / {}",
                duration::display(row.fastest),
                duration::display(row.median),
                duration::display(row.slowest)
            )
        };
        let _ = writeln!(
            out,
            "  {}/{}/{}  {times:<22}  {}",
            row.count.passed, row.count.failed, row.count.skipped, row.text
        );
    }
    out
}

/// How many runs passed, failed and were skipped.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    passed: usize,
    failed: usize,
    skipped: usize,
}

fn counts(runs: &[&SpecReport]) -> Counts {
    let mut count = Counts::default();
    for run in runs {
        match run.outcome {
            Outcome::Passed => count.passed += 1,
            Outcome::Skipped { .. } => count.skipped += 1,
            _ if run.outcome.is_failed() => count.failed += 1,
            _ => {}
        }
    }
    count
}

/// One spec's line: outcomes and the spread of the times of the rounds it was not skipped in.
struct SpecRow<'a> {
    text: &'a str,
    count: Counts,
    ran: usize,
    fastest: Duration,
    median: Duration,
    slowest: Duration,
}

impl<'a> SpecRow<'a> {
    fn of(runs: &[&'a SpecReport]) -> Self {
        let mut times: Vec<Duration> = runs
            .iter()
            .filter(|r| !matches!(r.outcome, Outcome::Skipped { .. }))
            .map(|r| r.duration)
            .collect();
        times.sort();
        let at = |i: usize| times.get(i).copied().unwrap_or_default();
        Self {
            text: runs.first().map_or("", |r| r.full_text.as_str()),
            count: counts(runs),
            ran: times.len(),
            fastest: at(0),
            median: at(times.len() / 2),
            slowest: times.last().copied().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn run(index: usize, attempt: u32, outcome: Outcome, secs: u64) -> SpecReport {
        SpecReport {
            full_text: format!("spec {index}"),
            labels: Vec::new(),
            index,
            attempt,
            outcome,
            started: SystemTime::UNIX_EPOCH,
            duration: Duration::from_secs(secs),
            log: String::new(),
            artifacts: None,
            tries: 1,
            earlier_failures: Vec::new(),
            phases: Default::default(),
            waits: Vec::new(),
            deferred: Vec::new(),
        }
    }

    #[test]
    fn one_round_prints_nothing() {
        let report =
            RunReport { specs: vec![run(0, 1, Outcome::Passed, 3)], repeat: 1, ..RunReport::default() };
        assert_eq!(table(&report), "");
    }

    #[test]
    fn rounds_and_specs_show_outcomes_and_spread() {
        let skipped = || Outcome::Skipped { reason: "no GPU".to_owned() };
        let failed = Outcome::failed(crate::report::outcome::FailureKind::Error, "boom");
        let report = RunReport {
            specs: vec![
                run(0, 1, Outcome::Passed, 3),
                run(1, 1, skipped(), 0),
                run(0, 2, failed, 9),
                run(1, 2, skipped(), 0),
                run(0, 3, Outcome::Passed, 5),
                run(1, 3, skipped(), 0),
            ],
            repeat: 3,
            round_times: vec![Duration::from_secs(61), Duration::from_secs(70), Duration::from_secs(65)],
            ..RunReport::default()
        };
        let table = table(&report);
        assert!(table.contains("      1       1       0        1  1m1s"), "{table}");
        assert!(table.contains("      2       0       1        1  1m10s"), "{table}");
        assert!(table.contains("  2/1/0  3s / 5s / 9s            spec 0"), "{table}");
        assert!(table.contains("  0/0/3  -                       spec 1"), "{table}");
        let spec0 = table.find("spec 0").unwrap_or(usize::MAX);
        assert!(spec0 < table.find("spec 1").unwrap_or(0), "slowest first: {table}");
    }
}
