//! The table of steps that closes `cargo xtask test`: per step its wall time, CPU time, the
//! background builds' share, the time it waited for one and the lowest free disk space during it.

use std::time::Duration;

use super::budget;
use crate::progress::human;

/// How a step ended.
#[derive(Debug)]
pub(super) enum StepResult {
    /// As it should; what it counted, if it says.
    Passed(Option<String>),
    /// It failed.
    Failed(anyhow::Error),
    /// It was running when Ctrl-C came (with its failure, if it failed).
    Interrupted(Option<anyhow::Error>),
    /// It did not start: the run was stopped before.
    NotRun,
}

/// The table's word for `result`.
pub(super) fn result_word(result: &StepResult) -> &'static str {
    match result {
        StepResult::Passed(_) => "ok",
        StepResult::Failed(_) => "FAILED",
        StepResult::Interrupted(_) => "INTERRUPTED",
        StepResult::NotRun => "not run",
    }
}

/// One step's outcome.
pub(super) struct Outcome {
    /// The step's name.
    pub name: String,
    /// How it ended.
    pub result: StepResult,
    /// What it cost.
    pub cost: budget::StepCost,
    /// The lowest free space of the run's filesystems during the step ([`super::disk`]).
    pub lowest_free: Option<u64>,
}

/// The closing table: per step its wall time, the machine's CPU time over it (the background
/// builds' share apart, in `bg cpu`), the time it waited for a background build, the lowest free
/// disk space during it (`min free`), its result (with what it counted, if it says); and the
/// totals.
pub(super) fn step_table(outcomes: &[Outcome]) -> String {
    let opt = |d: Option<Duration>| d.map(human).unwrap_or_else(|| "-".into());
    let wait = |d: Duration| if d.is_zero() { String::new() } else { human(d) };
    let free = |b: Option<u64>| b.map(super::disk::gib).unwrap_or_else(|| "-".into());
    let mut table = format!(
        "{:<62} {:>8} {:>8} {:>8} {:>8} {:>9}  result\n",
        "step", "time", "cpu", "bg cpu", "waited", "min free"
    );
    for o in outcomes {
        let result = match &o.result {
            StepResult::Passed(Some(note)) => format!("ok: {note}"),
            other => result_word(other).to_owned(),
        };
        let c = &o.cost;
        table += &format!(
            "{:<62} {:>8} {:>8} {:>8} {:>8} {:>9}  {result}\n",
            o.name,
            human(c.elapsed),
            opt(c.cpu),
            opt(c.background),
            wait(c.waited),
            free(o.lowest_free)
        );
    }
    let sum = |f: fn(&budget::StepCost) -> Option<Duration>| outcomes.iter().filter_map(|o| f(&o.cost)).sum();
    let elapsed: Duration = sum(|c| Some(c.elapsed));
    table += &format!(
        "{:<62} {:>8} {:>8} {:>8} {:>8} {:>9}\n",
        "all steps",
        human(elapsed),
        human(sum(|c| c.cpu)),
        human(sum(|c| c.background)),
        wait(sum(|c| Some(c.waited))),
        free(outcomes.iter().filter_map(|o| o.lowest_free).min())
    );
    table
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn the_step_table_shows_cpu_and_waits_and_sums_them() {
        let secs = Duration::from_secs;
        let outcome = |name: &str, ok: bool, cost, lowest_free| Outcome {
            name: name.into(),
            result: if ok {
                StepResult::Passed(Some("2 passed of 2 selected".into()))
            } else {
                StepResult::Failed(anyhow::anyhow!("broke"))
            },
            cost,
            lowest_free,
        };
        let outcomes = [
            outcome(
                "restart",
                true,
                budget::StepCost {
                    elapsed: secs(100),
                    cpu: Some(secs(30)),
                    background: Some(secs(50)),
                    waited: secs(40),
                },
                Some(3 << 30),
            ),
            outcome(
                "lane",
                false,
                budget::StepCost { elapsed: secs(20), cpu: None, ..Default::default() },
                None,
            ),
        ];
        let table = step_table(&outcomes);
        let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[0], ["step", "time", "cpu", "bg", "cpu", "waited", "min", "free", "result"]);
        assert_eq!(
            rows[1],
            [
                "restart", "1m40s", "30.0s", "50.0s", "40.0s", "3.0", "GiB", "ok:", "2", "passed", "of", "2",
                "selected"
            ]
        );
        assert_eq!(rows[2], ["lane", "20.0s", "-", "-", "-", "FAILED"]);
        assert_eq!(rows[3], ["all", "steps", "2m00s", "30.0s", "50.0s", "40.0s", "3.0", "GiB"]);
    }
}
