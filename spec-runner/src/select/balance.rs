//! `--partition time:M/N`: shards balanced by the spec durations of an earlier run's JSON report
//! (`--timings FILE`).
//!
//! The model of a shard's wall time: the specs that run alone (`[Serial]`) run one after
//! another before the others, so they add up (the serial chain); the others share `-p` worker
//! slots, so they take their sum over `-p`, or the longest of them when that is longer:
//!
//! ```text
//! wall ≈ Σ serial + max(Σ parallel / procs, longest parallel)
//! ```
//!
//! The serial specs are spread first, longest first, each to the shard whose serial chain is
//! shortest, so that no shard's chain is much longer than another's; then the others, longest
//! first, each to the shard whose wall time it raises least. Ties go to the shard with fewer
//! specs, then the lower number, and equal durations are ordered by full text, so the split only
//! depends on the selection, the report and `-p`. A spec the report does not know (or only as
//! skipped in another shard) counts the median of the durations it knows.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    duration,
    report::ginkgo_json::{self, ReadError, ReportFile},
    spec::info::SpecInfo,
};

/// What a spec of unknown duration counts when the report knows none at all.
const NOMINAL: Duration = Duration::from_secs(1);

/// The spec durations of an earlier report: each spec's time on its worker slot (`RunTime`),
/// the median of its runs when it ran several times.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    source: PathBuf,
    known: HashMap<String, Duration>,
    median: Duration,
}

impl Timings {
    /// Reads a JSON report (`--json-report`, or a `report merge` of the shards).
    pub fn read(path: &Path) -> Result<Self, ReadError> {
        Ok(Self::of_report(&ginkgo_json::read(path)?))
    }

    /// The durations of the specs `file` shows started (a spec of another shard, or one a run
    /// never started, has none).
    pub fn of_report(file: &ReportFile) -> Self {
        let mut runs: HashMap<String, Vec<Duration>> = HashMap::new();
        for spec in file.specs.iter().filter(|s| s.attempts > 0) {
            runs.entry(spec.full_text.clone()).or_default().push(spec.run_time);
        }
        let known: HashMap<String, Duration> =
            runs.into_iter().map(|(text, times)| (text, median(times))).collect();
        let median = if known.is_empty() { NOMINAL } else { self::median(known.values().copied().collect()) };
        Self { source: file.path.clone(), known, median }
    }

    /// The report they were read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// How long `full_text` took, or the median.
    pub fn of(&self, full_text: &str) -> Duration {
        self.known.get(full_text).copied().unwrap_or(self.median)
    }

    /// Whether the report knows the spec's duration.
    pub fn knows(&self, full_text: &str) -> bool {
        self.known.contains_key(full_text)
    }

    /// `150 specs known, the others count the median 12.3s`.
    pub fn describe(&self) -> String {
        format!(
            "{} specs known, the others count the median {}",
            self.known.len(),
            duration::display(self.median)
        )
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// A shard's load under the model.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    /// The specs that run alone, added up.
    pub serial: Duration,
    /// The others, added up.
    pub parallel: Duration,
    /// The longest of the others.
    pub longest: Duration,
    /// How many specs.
    pub specs: usize,
}

impl Load {
    /// The wall time the model gives with `procs` slots.
    pub fn wall(&self, procs: usize) -> Duration {
        let shared = self.parallel / u32::try_from(procs.max(1)).unwrap_or(u32::MAX);
        self.serial + shared.max(self.longest)
    }

    fn with(&self, cost: Duration, serial: bool) -> Self {
        let mut next = *self;
        if serial {
            next.serial += cost;
        } else {
            next.parallel += cost;
            next.longest = next.longest.max(cost);
        }
        next.specs += 1;
        next
    }
}

/// The shard (1 to `total`) of each of `specs`, balanced by `timings` for `procs` slots.
pub fn assign(specs: &[&SpecInfo], timings: &Timings, procs: usize, total: u32) -> Vec<u32> {
    let total = usize::try_from(total.max(1)).unwrap_or(1);
    let mut order: Vec<usize> = (0..specs.len()).collect();
    // Serial specs first, then the longest first; equal ones by text.
    order.sort_by(|&a, &b| {
        let key = |i: usize| (!specs[i].runs_alone(), std::cmp::Reverse(timings.of(specs[i].full_text())));
        key(a).cmp(&key(b)).then_with(|| specs[a].full_text().cmp(specs[b].full_text()))
    });
    let mut loads = vec![Load::default(); total];
    let mut shards = vec![1; specs.len()];
    for i in order {
        let (serial, cost) = (specs[i].runs_alone(), timings.of(specs[i].full_text()));
        let best = (0..total)
            .min_by_key(|&s| {
                let measure = if serial { loads[s].serial } else { loads[s].with(cost, false).wall(procs) };
                (measure, loads[s].specs, s)
            })
            .unwrap_or(0);
        loads[best] = loads[best].with(cost, serial);
        shards[i] = u32::try_from(best + 1).unwrap_or(1);
    }
    shards
}

/// Each shard's load under the model, for `shards` as [`assign`] gave them.
pub fn loads(specs: &[&SpecInfo], shards: &[u32], timings: &Timings, total: u32) -> Vec<Load> {
    let mut loads = vec![Load::default(); usize::try_from(total).unwrap_or(0)];
    for (spec, shard) in specs.iter().zip(shards) {
        if let Some(load) = loads.get_mut(usize::try_from(*shard).unwrap_or(0).wrapping_sub(1)) {
            *load = load.with(timings.of(spec.full_text()), spec.runs_alone());
        }
    }
    loads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    fn timings(known: &[(&str, u64)]) -> Timings {
        let known: HashMap<String, Duration> =
            known.iter().map(|(t, s)| ((*t).to_owned(), Duration::from_secs(*s))).collect();
        let median = median(known.values().copied().collect());
        Timings { source: PathBuf::from("t.json"), known, median }
    }

    #[test]
    fn serial_chains_are_spread_before_the_parallel_work_fills_up() {
        let mut reg = Registry::new();
        for (name, serial) in
            [("s1", true), ("s2", true), ("p1", false), ("p2", false), ("p3", false), ("p4", false)]
        {
            let spec = reg.it(name, async |_| Ok(()));
            if serial {
                spec.labels(["Serial"]);
            }
        }
        let specs: Vec<&SpecInfo> = reg.specs().collect();
        let t = timings(&[
            ("s1 [Serial]", 100),
            ("s2 [Serial]", 90),
            ("p1", 40),
            ("p2", 40),
            ("p3", 40),
            ("p4", 200),
        ]);
        let shards = assign(&specs, &t, 2, 2);
        // The serial specs apart; the 200 s spec beside the shorter chain, the rest on the other.
        assert_eq!(shards, [1, 2, 1, 1, 1, 2]);
        let walls: Vec<u64> = loads(&specs, &shards, &t, 2).iter().map(|l| l.wall(2).as_secs()).collect();
        assert_eq!(walls, [160, 290]);
    }

    #[test]
    fn unknown_specs_count_the_median_and_without_any_known_the_counts_even_out() {
        let t = timings(&[("a", 10), ("b", 20), ("c", 30)]);
        assert_eq!((t.of("b"), t.of("new")), (Duration::from_secs(20), Duration::from_secs(20)));
        assert!(t.knows("a") && !t.knows("new"));
        let mut reg = Registry::new();
        for i in 0..9 {
            reg.it(&format!("spec {i}"), async |_| Ok(()));
        }
        let specs: Vec<&SpecInfo> = reg.specs().collect();
        let empty = Timings::of_report(&ginkgo_json::parse(Path::new("e.json"), "[]").unwrap());
        assert_eq!(empty.of("x"), NOMINAL);
        let shards = assign(&specs, &empty, 4, 3);
        for shard in 1..=3 {
            assert_eq!(shards.iter().filter(|s| **s == shard).count(), 3, "{shards:?}");
        }
    }
}
