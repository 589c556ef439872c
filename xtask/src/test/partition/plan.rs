//! The plan of a split run: which machine runs which units, computed alike on every machine from
//! the measured costs ([`super::costs`]) alone, so that the machines agree without talking.
//!
//! A machine's time is modelled as `cargo xtask test` runs: its background builds start at
//! once, one after another; in the foreground it starts the kind engine (if it has the kind
//! lane), runs the unit tests or else compiles the workspace, brings the local cluster up in its
//! first lane once that lane's builds are done, runs that lane's units, restarts the cluster
//! into each further lane (again once its builds are done), takes it down, then the kind lane
//! once its node image is built. A slice k of n of a suite run is taken to cost 1/n of the
//! whole run (its spec counts are even; how its serial specs fall is not modelled).
//!
//! The plan minimises the longest machine (then the next longest, …): for each way of
//! splitting the suite runs into at most three slices each, the units (largest first) go where
//! they make the machine's time least, then single moves and swaps between machines are made
//! while they shorten the plan. Ties go to the fewer slices, then to the first found; nothing
//! depends on hashing or the clock.

use std::time::Duration;

use super::{ClusterBuild, LocalLane, Setting, Share, Slice, Unit, costs};

/// The most slices a suite run is split into.
const MAX_SLICES: u32 = 3;

/// Which machine runs what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Machine `i + 1`'s share.
    pub shares: Vec<Share>,
}

impl Plan {
    /// Each machine's planned time, in machine order.
    pub(crate) fn times(&self) -> Vec<Duration> {
        self.shares.iter().map(planned).collect()
    }

    /// The longest machine's planned time.
    pub(crate) fn longest(&self) -> Duration {
        self.times().into_iter().max().unwrap_or_default()
    }
}

/// The plan for `machines` machines (1 ..= [`super::MAX_MACHINES`]).
pub(crate) fn plan(machines: u32) -> Plan {
    let machines = machines.max(1) as usize;
    let splittable: Vec<Unit> = Unit::ALL.into_iter().filter(|u| u.splittable()).collect();
    let most = (machines as u32).min(MAX_SLICES);
    let mut best: Option<(Vec<Duration>, u32, Vec<Vec<Item>>)> = None;
    for counts in slice_counts(splittable.len(), most) {
        let items = items(&splittable, &counts);
        let assignment = improve(greedy(&items, machines));
        let key = (objective(&assignment), counts.iter().sum::<u32>());
        if best.as_ref().is_none_or(|(o, s, _)| key < (o.clone(), *s)) {
            best = Some((key.0, key.1, assignment));
        }
    }
    let mut shares: Vec<Share> = best
        .map(|(_, _, assignment)| assignment.into_iter().map(|items| share(&items)).collect())
        .unwrap_or_default();
    // Machine 1 runs the run's first unit, and so on.
    shares.sort_by(|a, b| a.units().first().cmp(&b.units().first()));
    Plan { shares }
}

/// A unit, whole or one slice: what the search places.
type Item = (Unit, Option<Slice>);

/// Every combination of slice counts (1 ..= `most`) for `n` splittable units.
fn slice_counts(n: usize, most: u32) -> Vec<Vec<u32>> {
    let mut all = vec![Vec::new()];
    for _ in 0..n {
        all = all.into_iter().flat_map(|c| (1..=most).map(move |k| [c.clone(), vec![k]].concat())).collect();
    }
    all
}

/// The items of every unit, the splittable ones in `counts[i]` slices.
fn items(splittable: &[Unit], counts: &[u32]) -> Vec<Item> {
    let mut items = Vec::new();
    for unit in Unit::ALL {
        let total = splittable.iter().position(|u| *u == unit).map_or(1, |i| counts[i]);
        if total == 1 {
            items.push((unit, None));
        } else {
            items.extend((1..=total).map(|index| (unit, Some(Slice { index, total }))));
        }
    }
    items
}

fn share(items: &[Item]) -> Share {
    Share::of(items.to_vec())
}

fn cost(item: &Item) -> Duration {
    let whole = costs::unit(item.0);
    item.1.map_or(whole, |slice| whole / slice.total)
}

/// Whether `item` may join `items`: one slice of a unit per machine.
fn fits(items: &[Item], item: &Item) -> bool {
    !items.iter().any(|(unit, _)| *unit == item.0)
}

/// Each item, largest first, to the machine where it makes that machine's time least.
fn greedy(items: &[Item], machines: usize) -> Vec<Vec<Item>> {
    let mut order = items.to_vec();
    order.sort_by(|a, b| cost(b).cmp(&cost(a)).then(a.cmp(b)));
    let mut assignment: Vec<Vec<Item>> = vec![Vec::new(); machines];
    for item in order {
        let mut best: Option<(Duration, usize)> = None;
        for (i, items) in assignment.iter().enumerate() {
            if !fits(items, &item) {
                continue;
            }
            let time = planned(&share(&[items.as_slice(), &[item]].concat()));
            if best.is_none_or(|(t, _)| time < t) {
                best = Some((time, i));
            }
        }
        // More slices than machines cannot happen: a unit has at most min(machines, 3) slices.
        if let Some((_, i)) = best {
            assignment[i].push(item);
        }
    }
    assignment
}

/// The machines' times, longest first: what the search makes least, in this order.
fn objective(assignment: &[Vec<Item>]) -> Vec<Duration> {
    let mut times: Vec<Duration> = assignment.iter().map(|items| planned(&share(items))).collect();
    times.sort_by(|a, b| b.cmp(a));
    times
}

/// Moves one item, or swaps two, between machines while that shortens the plan; a machine is
/// never left empty.
fn improve(mut assignment: Vec<Vec<Item>>) -> Vec<Vec<Item>> {
    let mut current = objective(&assignment);
    while let Some(better) = better_neighbour(&assignment, &current) {
        assignment = better;
        current = objective(&assignment);
    }
    assignment
}

/// The first move or swap that makes the plan shorter than `current`.
fn better_neighbour(assignment: &[Vec<Item>], current: &[Duration]) -> Option<Vec<Vec<Item>>> {
    let machines = assignment.len();
    for from in 0..machines {
        for at in 0..assignment[from].len() {
            for to in (0..machines).filter(|&to| to != from) {
                let item = assignment[from][at];
                if assignment[from].len() == 1 || !fits(&assignment[to], &item) {
                    continue;
                }
                let mut moved = assignment.to_vec();
                moved[from].remove(at);
                moved[to].push(item);
                if objective(&moved).as_slice() < current {
                    return Some(moved);
                }
            }
        }
    }
    for a in 0..machines {
        for b in a + 1..machines {
            for i in 0..assignment[a].len() {
                for j in 0..assignment[b].len() {
                    let (x, y) = (assignment[a][i], assignment[b][j]);
                    let mut swapped = assignment.to_vec();
                    swapped[a].remove(i);
                    swapped[b].remove(j);
                    if !fits(&swapped[a], &y) || !fits(&swapped[b], &x) {
                        continue;
                    }
                    swapped[a].push(y);
                    swapped[b].push(x);
                    if objective(&swapped).as_slice() < current {
                        return Some(swapped);
                    }
                }
            }
        }
    }
    None
}

/// A machine's planned wall time for `share` (the model of the module's docs).
pub(crate) fn planned(share: &Share) -> Duration {
    if share.units().is_empty() {
        return Duration::ZERO;
    }
    let mut built = Vec::new();
    let mut clock = Duration::ZERO;
    for build in share.builds() {
        clock += costs::build(build);
        built.push((build, clock));
    }
    let done = |builds: &[ClusterBuild]| {
        builds.iter().filter_map(|b| built.iter().find(|(x, _)| x == b).map(|(_, at)| *at)).max()
    };
    let work = |setting: Setting| -> Duration {
        share.units().iter().filter(|(u, _)| u.setting() == setting).map(cost).sum()
    };
    let mut t = Duration::ZERO;
    if share.runs(Unit::CargoTests) {
        t += costs::unit(Unit::CargoTests);
    } else {
        t += costs::compile();
    }
    let lanes = share.local_lanes();
    for (i, lane) in lanes.iter().enumerate() {
        t = t.max(done(lane.builds()).unwrap_or_default());
        t += if i == 0 { costs::local_up() } else { costs::restart(*lane) };
        t += work(Setting::Local(*lane));
    }
    if !lanes.is_empty() {
        t += costs::local_down();
    }
    if share.needs_kind() {
        t = t.max(done(&[ClusterBuild::KindImage]).unwrap_or_default());
        t += costs::kind_fixed() + work(Setting::Kind);
    }
    t
}

/// `local default, workload; kind`: the clusters a share brings up, for the docs' table.
pub(crate) fn describe_clusters(share: &Share) -> String {
    let lanes: Vec<&str> = share.local_lanes().into_iter().map(LocalLane::name).collect();
    let mut clusters = Vec::new();
    if !lanes.is_empty() {
        clusters.push(format!("local: {}", lanes.join(", ")));
    }
    if share.needs_kind() {
        clusters.push("kind".to_owned());
    }
    if clusters.is_empty() { "none".to_owned() } else { clusters.join("; ") }
}

/// `local-cluster, kind-node-image`: the builds of a share, for the docs' table.
pub(crate) fn describe_builds(share: &Share) -> String {
    let builds: Vec<&str> = share.builds().into_iter().map(ClusterBuild::key).collect();
    if builds.is_empty() { "none".to_owned() } else { builds.join(", ") }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::progress::human;

    /// Every item of `plan`: (unit, slice, machine).
    fn placed(plan: &Plan) -> Vec<(Unit, Option<Slice>, usize)> {
        let mut all: Vec<_> = plan
            .shares
            .iter()
            .enumerate()
            .flat_map(|(m, share)| share.units().iter().map(move |(u, s)| (*u, *s, m + 1)))
            .collect();
        all.sort();
        all
    }

    #[test]
    fn every_unit_lands_on_exactly_one_machine_or_each_of_its_slices_does() {
        for machines in 1..=super::super::MAX_MACHINES {
            let plan = plan(machines);
            assert_eq!(plan.shares.len(), machines as usize);
            for (m, share) in plan.shares.iter().enumerate() {
                assert!(!share.units().is_empty(), "N = {machines}: machine {} runs nothing", m + 1);
            }
            let placed = placed(&plan);
            for unit in Unit::ALL {
                let of: Vec<_> = placed.iter().filter(|(u, _, _)| *u == unit).collect();
                match of.as_slice() {
                    [(_, None, _)] => {}
                    slices => {
                        let total = slices[0].1.map(|s| s.total).unwrap();
                        let indices: Vec<u32> = slices.iter().map(|(_, s, _)| s.unwrap().index).collect();
                        assert_eq!(
                            indices,
                            (1..=total).collect::<Vec<_>>(),
                            "N = {machines}: {unit:?}: {slices:?}"
                        );
                        assert!(slices.iter().all(|(_, s, _)| s.unwrap().total == total), "{slices:?}");
                        assert!(unit.splittable(), "N = {machines}: {unit:?} is not splittable");
                        let mut machines_of: Vec<usize> = slices.iter().map(|(_, _, m)| *m).collect();
                        machines_of.dedup();
                        assert_eq!(machines_of.len(), slices.len(), "two slices of {unit:?} on one machine");
                    }
                }
            }
        }
    }

    #[test]
    fn one_machine_runs_everything_whole_and_the_model_is_the_cold_run() {
        let one = plan(1);
        assert_eq!(one.shares, [Share::everything()]);
        // The model of one machine is the cold run it was measured on.
        let modelled = planned(&Share::everything()).as_millis() as i64;
        let measured = costs::ALL_STEPS_MILLIS as i64;
        assert!(
            (modelled - measured).abs() * 100 < measured,
            "modelled {modelled} ms, measured {measured} ms"
        );
    }

    #[test]
    fn three_machines_leave_the_longest_at_most_45_percent_of_the_three_together() {
        let plan = plan(3);
        let times = plan.times();
        let whole: Duration = times.iter().sum();
        let longest = plan.longest();
        let shares: Vec<String> = plan.shares.iter().map(Share::describe_units).collect();
        assert!(
            longest.as_secs_f64() <= 0.45 * whole.as_secs_f64(),
            "the longest {} of {} together: {times:?} {shares:#?}",
            human(longest),
            human(whole)
        );
        // And it is shorter than one machine by more than the time each machine sets up twice.
        assert!(longest < planned(&Share::everything()).mul_f64(0.6), "{}", human(longest));
    }

    #[test]
    fn a_lane_that_dominates_is_split_and_the_next_release_gets_its_own_machine() {
        let plan = plan(3);
        assert!(
            plan.shares.iter().any(|s| s.units().iter().any(|(_, slice)| slice.is_some())),
            "no lane is split: {plan:#?}"
        );
        // The v1.38 build is on one machine only, and that machine builds nothing of v1.37.2.
        let next: Vec<&Share> =
            plan.shares.iter().filter(|s| s.builds().contains(&ClusterBuild::NextRelease)).collect();
        assert_eq!(next.len(), 1, "{plan:#?}");
        assert!(!next[0].builds().contains(&ClusterBuild::LocalCluster), "{plan:#?}");
        assert_eq!(plan.shares.iter().filter(|s| s.needs_kind()).count(), 1, "{plan:#?}");
    }

    #[test]
    fn more_machines_never_make_the_longest_longer() {
        let longest: Vec<Duration> = (1..=super::super::MAX_MACHINES).map(|n| plan(n).longest()).collect();
        for pair in longest.windows(2) {
            assert!(pair[1] <= pair[0], "{longest:?}");
        }
    }

    #[test]
    fn a_machine_waits_for_its_builds() {
        // The next release alone: its build, then cluster up, its specs, down.
        let next = Share::of(vec![(Unit::NextRelease, None)]);
        let expected = costs::build(ClusterBuild::NextRelease)
            + costs::local_up()
            + costs::unit(Unit::NextRelease)
            + costs::local_down();
        assert_eq!(planned(&next), expected);
        // The kind lane alone waits for the local cluster's binaries and its image.
        let kind = Share::of(vec![(Unit::Kind, Some(Slice { index: 1, total: 2 }))]);
        let expected = costs::build(ClusterBuild::LocalCluster)
            + costs::build(ClusterBuild::KindImage)
            + costs::kind_fixed()
            + costs::unit(Unit::Kind) / 2;
        assert_eq!(planned(&kind), expected);
        assert_eq!(planned(&Share::of(vec![])), Duration::ZERO);
    }
}
