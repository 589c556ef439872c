//! `--partition` on the real registry: for every Kubernetes version the suites have texts for,
//! the shards of every kind, for 1 to 8 machines, cover the selection exactly once; a `hash`
//! shard does not move when specs join the selection; `slice` shards differ by one spec at most;
//! `time` shards of the default selection (`--skip GenericWorkload`) are within 15% of each
//! other under the runner's model, with the durations of a recorded run of it
//! ([`TIMINGS`]).

use std::{collections::BTreeMap, path::Path, sync::OnceLock, time::Duration};

use harness::framework::{Partition, PartitionFlag, Registry, Selection, SpecInfo, Timings};

use crate::versions::TABLES;

/// The spec durations of a recorded run of the default selection on the local cluster (v1.37.2),
/// as a JSON report cut to what `--timings` reads: each spec's `RunTime` from the JUnit of the
/// lanes of 2026-12-02 (docs/results.md); the one spec that run did not have counts the median.
const TIMINGS: &str = "tests/data/timings-v1.37.2.json";

/// The kinds of partition.
const KINDS: [&str; 3] = ["hash", "slice", "time"];

/// The machines CI splits a run over, at most.
const MOST_SHARDS: u32 = 8;

fn timings() -> Timings {
    static TIMINGS_READ: OnceLock<Timings> = OnceLock::new();
    TIMINGS_READ
        .get_or_init(|| Timings::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(TIMINGS)).unwrap())
        .clone()
}

fn partition(kind: &str, index: u32, total: u32) -> Partition {
    let flag: PartitionFlag = format!("{kind}:{index}/{total}").parse().unwrap();
    Partition::resolve(flag, |_| None, (kind == "time").then(timings), 4).unwrap()
}

fn default_selection() -> Selection {
    Selection::new(&[], &["GenericWorkload".to_owned()], None).unwrap()
}

/// Each selected spec's full text and the shards that run it, the selected specs of `registry`
/// split as each shard's run splits them.
fn shards_of(
    registry: &Registry,
    selection: &Selection,
    kind: &str,
    total: u32,
) -> BTreeMap<String, Vec<u32>> {
    let selected: Vec<&SpecInfo> = registry.specs().filter(|s| selection.matches(s)).collect();
    let mut runs: BTreeMap<String, Vec<u32>> =
        selected.iter().map(|s| (s.full_text().to_owned(), Vec::new())).collect();
    for index in 1..=total {
        let shard = selection.clone().with_partition(partition(kind, index, total));
        let (here, elsewhere) = shard.split(selected.clone(), |s| s);
        assert_eq!(here.len() + elsewhere.len(), selected.len());
        for spec in here {
            runs.get_mut(spec.full_text()).unwrap().push(index);
        }
    }
    runs
}

#[test]
fn every_kind_covers_each_versions_selection_exactly_once() {
    for table in TABLES {
        let registry = crate::registry(table, None);
        for (name, selection) in [("every spec", Selection::all()), ("the default", default_selection())] {
            for kind in KINDS {
                for total in 1..=MOST_SHARDS {
                    let runs = shards_of(&registry, &selection, kind, total);
                    assert!(runs.len() > 100, "{} {name}: {} specs", table.version, runs.len());
                    let wrong: Vec<_> = runs.iter().filter(|(_, shards)| shards.len() != 1).collect();
                    assert!(wrong.is_empty(), "{} {name} {kind}:M/{total}: {wrong:?}", table.version);
                }
            }
        }
    }
}

#[test]
fn slices_differ_by_one_spec_at_most() {
    let registry = crate::registry(&TABLES[0], None);
    for total in 1..=MOST_SHARDS {
        let mut sizes = vec![0; total as usize];
        for shards in shards_of(&registry, &default_selection(), "slice", total).values() {
            sizes[shards[0] as usize - 1] += 1;
        }
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{total}: {sizes:?}");
    }
}

#[test]
fn a_hash_shard_stays_when_specs_join_the_selection() {
    for table in TABLES {
        let registry = crate::registry(table, None);
        for total in 2..=MOST_SHARDS {
            let before = shards_of(&registry, &default_selection(), "hash", total);
            let after = shards_of(&registry, &Selection::all(), "hash", total);
            assert!(after.len() > before.len(), "the GenericWorkload specs join");
            for (text, shards) in &before {
                assert_eq!(&after[text], shards, "{} {total}: {text}", table.version);
            }
        }
    }
}

#[test]
fn time_shards_of_the_default_selection_are_within_15_percent() {
    let registry = crate::registry(&TABLES[0], None);
    let selection = default_selection();
    let selected: Vec<&SpecInfo> = registry.specs().filter(|s| selection.matches(s)).collect();
    let known = selected.iter().filter(|s| timings().knows(s.full_text())).count();
    assert!(known * 10 >= selected.len() * 9, "the recorded run knows {known} of {} specs", selected.len());
    // Up to 7 machines (8 give 89 s to 113 s: a shard would get 96 s, and the longest spec
    // alone takes 98 s).
    for total in 2..=7 {
        let walls = partition("time", 1, total).estimated_walls(&selected).unwrap();
        let (least, most) = (walls.iter().min().unwrap(), walls.iter().max().unwrap());
        assert!(
            (most.as_secs_f64() - least.as_secs_f64()) <= 0.15 * most.as_secs_f64(),
            "{total} shards: {:?}",
            walls.iter().map(|w| format!("{:.0}s", w.as_secs_f64())).collect::<Vec<_>>()
        );
        assert!(*least > Duration::ZERO);
    }
}
