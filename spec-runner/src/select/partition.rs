//! `--partition KIND:M/N`: the share of the selection this run (shard M of N) runs, so that N
//! machines together run every selected spec exactly once. It applies after `--focus`, `--skip`
//! and `--label-filter`, and only depends on the selected specs (and, for `time`, on the
//! `--timings` report and `-p`), so every machine given the same flags computes the same split:
//!
//! - `hash`: a spec's shard is a hash of its full text (SHA-256), so it never moves when other
//!   specs are added or removed; the shards' sizes are only even on average.
//! - `slice`: the selected specs in registration order, dealt out in turn, the specs that run
//!   alone first: the shards' sizes, and their counts of such specs, differ by at most one.
//! - `time`: balanced by the durations of an earlier report ([`balance`](crate::select::balance)).
//!
//! `--partition ci` (or `KIND:ci`; `ci` alone is `slice:ci`) takes M and N from the
//! environment, `CI_NODE_INDEX` and `CI_NODE_TOTAL` as GitLab's `parallel:` sets them, and only
//! then: `CI_NODE_INDEX` counts from 1 there, as M does, and that is the convention taken.
//!
//! The specs of other shards are reported as skipped, `in shard K of N`
//! ([`elsewhere_reason`]), so that each shard's report lists the whole selection and a merge of
//! the reports can tell a spec that ran nowhere from one that was never selected.

use std::{fmt, str::FromStr};

use sha2::{Digest as _, Sha256};

use crate::{select::balance::Timings, spec::info::SpecInfo};

/// The variable `--partition ci` takes the shard's number from (1-based, as GitLab sets it).
pub const CI_NODE_INDEX: &str = "CI_NODE_INDEX";
/// The variable `--partition ci` takes the number of shards from.
pub const CI_NODE_TOTAL: &str = "CI_NODE_TOTAL";

/// How the selection is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    /// By a hash of each spec's full text: stable when specs are added.
    Hash,
    /// Dealt out in registration order: even sizes.
    Slice,
    /// Balanced by the durations of an earlier report (`--timings`).
    Time,
}

impl PartitionKind {
    /// `hash`, `slice` or `time`, as the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hash => "hash",
            Self::Slice => "slice",
            Self::Time => "time",
        }
    }
}

/// Shard `index` of `total`, counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    /// Which shard, 1 to `total`.
    pub index: u32,
    /// How many there are.
    pub total: u32,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.total)
    }
}

/// `--partition`'s value: the kind, and the shard or `None` when it comes from the CI's
/// variables (`ci`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionFlag {
    /// How the selection is split.
    pub kind: PartitionKind,
    /// The shard given (`M/N`), or `None` for `ci`.
    pub shard: Option<Shard>,
}

impl FromStr for PartitionFlag {
    type Err = String;

    /// `hash:M/N`, `slice:M/N`, `time:M/N`, `KIND:ci`, or `ci` (`slice:ci`).
    fn from_str(text: &str) -> Result<Self, String> {
        let wrong = |why: &str| {
            format!("{text:?} {why}; use KIND:M/N (KIND hash, slice or time; 1 <= M <= N), KIND:ci or ci")
        };
        let (kind, shard) = match text.split_once(':') {
            Some((kind, shard)) => (kind, shard),
            None if text == "ci" => ("slice", "ci"),
            None => return Err(wrong("names no kind")),
        };
        let kind = match kind {
            "hash" => PartitionKind::Hash,
            "slice" => PartitionKind::Slice,
            "time" => PartitionKind::Time,
            _ => return Err(wrong(&format!("has the unknown kind {kind:?}"))),
        };
        if shard == "ci" {
            return Ok(Self { kind, shard: None });
        }
        let parsed =
            shard.split_once('/').and_then(|(m, n)| Some((m.parse::<u32>().ok()?, n.parse::<u32>().ok()?)));
        match parsed {
            Some((index, total)) if (1..=total).contains(&index) => {
                Ok(Self { kind, shard: Some(Shard { index, total }) })
            }
            Some(_) => Err(wrong("has M outside 1..=N")),
            None => Err(wrong("has no M/N of whole numbers")),
        }
    }
}

/// The partition cannot be used as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// `ci` without a variable.
    #[error(
        "--partition ci reads {CI_NODE_INDEX} and {CI_NODE_TOTAL}, but {0} is not set: set both (the index counts from 1, as in GitLab's parallel jobs) or give --partition KIND:M/N"
    )]
    CiUnset(&'static str),
    /// `ci` with a variable that is no number.
    #[error(
        "--partition ci: {name}={value:?} is not a whole number; set it to the shard's number (from 1) or count"
    )]
    CiNotANumber {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// `ci` with an index outside the total.
    #[error(
        "--partition ci: {CI_NODE_INDEX}={index} is not between 1 and {CI_NODE_TOTAL}={total}: the index counts from 1, as in GitLab's parallel jobs (a CI that counts from 0 must add 1)"
    )]
    CiOutOfRange {
        /// `CI_NODE_INDEX`.
        index: u32,
        /// `CI_NODE_TOTAL`.
        total: u32,
    },
    /// `time` without `--timings`.
    #[error(
        "--partition time needs --timings FILE, the JSON report of an earlier run (--json-report) whose spec durations balance the shards"
    )]
    TimeWithoutTimings,
    /// `--timings` with another kind.
    #[error("--timings only serves --partition time:M/N (or time:ci); leave it out or use time")]
    TimingsWithoutTime,
}

/// A run's partition: its shard, how the selection is split and where the shard came from.
#[derive(Debug, Clone)]
pub struct Partition {
    kind: PartitionKind,
    shard: Shard,
    /// Where the shard came from, for the run's first lines.
    origin: String,
    timings: Option<Timings>,
    procs: usize,
}

impl Partition {
    /// The partition `flag` stands for: its shard from the flag, or from `env`'s
    /// `CI_NODE_INDEX`/`CI_NODE_TOTAL` for `ci`; `time` balances with `timings` for `procs`
    /// specs at a time.
    pub fn resolve(
        flag: PartitionFlag,
        env: impl Fn(&str) -> Option<String>,
        timings: Option<Timings>,
        procs: usize,
    ) -> Result<Self, PartitionError> {
        match (flag.kind, &timings) {
            (PartitionKind::Time, None) => return Err(PartitionError::TimeWithoutTimings),
            (PartitionKind::Hash | PartitionKind::Slice, Some(_)) => {
                return Err(PartitionError::TimingsWithoutTime);
            }
            _ => {}
        }
        let (shard, origin) = match flag.shard {
            Some(shard) => (shard, format!("--partition {}:{shard}", flag.kind.name())),
            None => {
                let shard = ci_shard(&env)?;
                let origin = format!(
                    "--partition {}:ci: {CI_NODE_INDEX}={} and {CI_NODE_TOTAL}={}, the index counted from 1",
                    flag.kind.name(),
                    shard.index,
                    shard.total
                );
                (shard, origin)
            }
        };
        Ok(Self { kind: flag.kind, shard, origin, timings, procs: procs.max(1) })
    }

    /// This run's shard.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// How the selection is split.
    pub fn kind(&self) -> PartitionKind {
        self.kind
    }

    /// `shard 1 of 2 by slice (--partition slice:1/2)`, with what `time` balanced by.
    pub fn describe(&self) -> String {
        let by = match (&self.timings, self.kind) {
            (Some(timings), PartitionKind::Time) => format!(
                "; balanced for -p {} by the durations of {}, {}",
                self.procs,
                timings.source().display(),
                timings.describe()
            ),
            _ => String::new(),
        };
        format!(
            "shard {} of {} by {} ({}{by})",
            self.shard.index,
            self.shard.total,
            self.kind.name(),
            self.origin
        )
    }

    /// The shard (1 to N) of each of `specs`, the whole selection in registration order.
    pub fn assign(&self, specs: &[&SpecInfo]) -> Vec<u32> {
        let total = self.shard.total;
        match (self.kind, &self.timings) {
            (PartitionKind::Hash, _) => specs.iter().map(|s| hash_shard(s.full_text(), total)).collect(),
            (PartitionKind::Time, Some(timings)) => {
                crate::select::balance::assign(specs, timings, self.procs, total)
            }
            (PartitionKind::Slice | PartitionKind::Time, _) => slice(specs, total),
        }
    }

    /// The wall time of each shard (1 to N) under `time`'s model (the select module's `balance`)
    /// for `specs`, the whole selection; `None` for the other kinds, which know no durations.
    pub fn estimated_walls(&self, specs: &[&SpecInfo]) -> Option<Vec<std::time::Duration>> {
        let timings = self.timings.as_ref().filter(|_| self.kind == PartitionKind::Time)?;
        let shards = self.assign(specs);
        let loads = crate::select::balance::loads(specs, &shards, timings, self.shard.total);
        Some(loads.iter().map(|load| load.wall(self.procs)).collect())
    }
}

/// The shard of a spec with this full text among `total`: the first 8 bytes of its SHA-256.
fn hash_shard(full_text: &str, total: u32) -> u32 {
    let digest = Sha256::digest(full_text.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let at = u64::from_be_bytes(first) % u64::from(total.max(1));
    u32::try_from(at).unwrap_or(0) + 1
}

/// Dealt out in turn in registration order, the specs that run alone first and the others
/// continuing the turn.
fn slice(specs: &[&SpecInfo], total: u32) -> Vec<u32> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| (!specs[i].runs_alone(), specs[i].index()));
    let mut shards = vec![1; specs.len()];
    for (turn, i) in order.into_iter().enumerate() {
        shards[i] = u32::try_from(turn % total.max(1) as usize).unwrap_or(0) + 1;
    }
    shards
}

fn ci_shard(env: &impl Fn(&str) -> Option<String>) -> Result<Shard, PartitionError> {
    let number = |name: &'static str| {
        let value = env(name).ok_or(PartitionError::CiUnset(name))?;
        value.trim().parse::<u32>().map_err(|_| PartitionError::CiNotANumber { name, value })
    };
    let (index, total) = (number(CI_NODE_INDEX)?, number(CI_NODE_TOTAL)?);
    if !(1..=total).contains(&index) {
        return Err(PartitionError::CiOutOfRange { index, total });
    }
    Ok(Shard { index, total })
}

/// `in shard 2 of 3`: why a spec of another shard is reported as skipped.
pub fn elsewhere_reason(shard: u32, total: u32) -> String {
    format!("in shard {shard} of {total}")
}

/// The shard a skip's reason names, when it is an [`elsewhere_reason`].
pub fn elsewhere_shard(reason: &str) -> Option<Shard> {
    let (index, total) = reason.strip_prefix("in shard ")?.split_once(" of ")?;
    let shard = Shard { index: index.parse().ok()?, total: total.parse().ok()? };
    (1..=shard.total).contains(&shard.index).then_some(shard)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::Registry;

    fn flag(text: &str) -> Result<PartitionFlag, String> {
        text.parse()
    }

    #[rstest]
    #[case("slice:1/2", PartitionKind::Slice, Some((1, 2)))]
    #[case("hash:8/8", PartitionKind::Hash, Some((8, 8)))]
    #[case("time:1/1", PartitionKind::Time, Some((1, 1)))]
    #[case("time:ci", PartitionKind::Time, None)]
    #[case("ci", PartitionKind::Slice, None)]
    fn flags_parse(#[case] text: &str, #[case] kind: PartitionKind, #[case] shard: Option<(u32, u32)>) {
        let shard = shard.map(|(index, total)| Shard { index, total });
        assert_eq!(flag(text), Ok(PartitionFlag { kind, shard }));
    }

    #[rstest]
    #[case("slice:0/2", "has M outside 1..=N")]
    #[case("slice:3/2", "has M outside 1..=N")]
    #[case("slice:1/0", "has M outside 1..=N")]
    #[case("slice:1", "has no M/N of whole numbers")]
    #[case("slice:a/b", "has no M/N of whole numbers")]
    #[case("count:1/2", "has the unknown kind \"count\"")]
    #[case("1/2", "names no kind")]
    fn bad_flags_say_what_is_wrong_in_one_sentence(#[case] text: &str, #[case] why: &str) {
        assert_eq!(
            flag(text),
            Err(format!(
                "{text:?} {why}; use KIND:M/N (KIND hash, slice or time; 1 <= M <= N), KIND:ci or ci"
            ))
        );
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn ci_reads_the_variables_only_when_asked_and_says_so() {
        let ci = env(&[(CI_NODE_INDEX, "2"), (CI_NODE_TOTAL, "4")]);
        let given = Partition::resolve(flag("slice:1/3").unwrap(), &ci, None, 4).unwrap();
        assert_eq!(given.shard(), Shard { index: 1, total: 3 });
        assert_eq!(given.describe(), "shard 1 of 3 by slice (--partition slice:1/3)");
        let read = Partition::resolve(flag("ci").unwrap(), &ci, None, 4).unwrap();
        assert_eq!(read.shard(), Shard { index: 2, total: 4 });
        assert_eq!(
            read.describe(),
            "shard 2 of 4 by slice (--partition slice:ci: CI_NODE_INDEX=2 and CI_NODE_TOTAL=4, the index counted from 1)"
        );
    }

    #[rstest]
    #[case(&[(CI_NODE_TOTAL, "4")], PartitionError::CiUnset(CI_NODE_INDEX))]
    #[case(&[(CI_NODE_INDEX, "1")], PartitionError::CiUnset(CI_NODE_TOTAL))]
    #[case(&[(CI_NODE_INDEX, "0"), (CI_NODE_TOTAL, "4")], PartitionError::CiOutOfRange { index: 0, total: 4 })]
    #[case(&[(CI_NODE_INDEX, "5"), (CI_NODE_TOTAL, "4")], PartitionError::CiOutOfRange { index: 5, total: 4 })]
    #[case(&[(CI_NODE_INDEX, "x"), (CI_NODE_TOTAL, "4")], PartitionError::CiNotANumber { name: CI_NODE_INDEX, value: "x".into() })]
    fn bad_ci_variables_are_refused(#[case] vars: &[(&str, &str)], #[case] error: PartitionError) {
        let got = Partition::resolve(flag("hash:ci").unwrap(), env(vars), None, 4).unwrap_err();
        assert_eq!(got, error);
        assert_eq!(got.to_string().matches(". ").count(), 0, "one sentence: {got}");
    }

    #[test]
    fn timings_go_with_time_only() {
        let none = env(&[]);
        assert_eq!(
            Partition::resolve(flag("time:1/2").unwrap(), &none, None, 4).unwrap_err(),
            PartitionError::TimeWithoutTimings
        );
        let timings = Some(Timings::default());
        assert_eq!(
            Partition::resolve(flag("slice:1/2").unwrap(), &none, timings, 4).unwrap_err(),
            PartitionError::TimingsWithoutTime
        );
    }

    /// Ten specs, every third one `[Serial]`.
    fn registry(names: impl IntoIterator<Item = String>) -> Registry {
        let mut reg = Registry::new();
        for (i, name) in names.into_iter().enumerate() {
            let spec = reg.it(&name, async |_| Ok(()));
            if i % 3 == 0 {
                spec.labels(["Serial"]);
            }
        }
        reg
    }

    fn shards(kind: &str, reg: &Registry, total: u32) -> Vec<u32> {
        let specs: Vec<&SpecInfo> = reg.specs().collect();
        let partition =
            Partition::resolve(flag(&format!("{kind}:1/{total}")).unwrap(), env(&[]), None, 4).unwrap();
        partition.assign(&specs)
    }

    #[test]
    fn slices_are_even_and_so_are_their_serial_specs() {
        let reg = registry((0..10).map(|i| format!("spec {i}")));
        for total in 1..=8 {
            let shards = shards("slice", &reg, total);
            let count = |serial: Option<bool>| {
                let mut counts = vec![0; total as usize];
                for (spec, shard) in reg.specs().zip(&shards) {
                    if serial.is_none_or(|s| s == spec.runs_alone()) {
                        counts[*shard as usize - 1] += 1;
                    }
                }
                counts.iter().max().unwrap() - counts.iter().min().unwrap()
            };
            assert!(count(None) <= 1 && count(Some(true)) <= 1, "{total} shards: {shards:?}");
        }
    }

    #[test]
    fn a_hash_shard_does_not_move_when_specs_are_added() {
        let before = registry((0..40).map(|i| format!("spec {i}")));
        let after = registry((0..40).map(|i| format!("spec {i}")).chain((0..25).map(|i| format!("new {i}"))));
        for total in 1..=8 {
            let (old, new) = (shards("hash", &before, total), shards("hash", &after, total));
            assert_eq!(old[..], new[..40], "{total} shards");
            let used: std::collections::BTreeSet<u32> = new.iter().copied().collect();
            assert_eq!(used.len(), (total as usize).min(65), "{total} shards: some shard got nothing of 65");
        }
    }

    #[test]
    fn elsewhere_reasons_read_back() {
        assert_eq!(elsewhere_reason(2, 3), "in shard 2 of 3");
        assert_eq!(elsewhere_shard("in shard 2 of 3"), Some(Shard { index: 2, total: 3 }));
        for other in ["in shard 4 of 3", "needs 2 nodes", "in shard x of 3", "in shard 0 of 3"] {
            assert_eq!(elsewhere_shard(other), None, "{other}");
        }
    }
}
