//! The order in which specs start, as ginkgo orders them: shuffled with a seed the run prints,
//! so that no spec can rely on another having run before it, and `--seed N` repeats an order.
//! By default the top-level containers are shuffled and the specs inside each keep their
//! registration order; `--randomize-all` shuffles every spec. Specs of a higher priority
//! ([`crate::Registry::with_priority`]) come before those of a lower one, each priority in the
//! seed's order.

use std::{collections::HashMap, sync::Arc};

use rand::{SeedableRng as _, rngs::StdRng, seq::SliceRandom as _};

use crate::spec::registry::SpecDef;

/// A seed for a run that was given none (ginkgo uses the time, too).
pub(crate) fn default_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Puts `specs` into the order this seed gives.
pub(crate) fn shuffle(specs: &mut [Arc<SpecDef>], seed: u64, randomize_all: bool) {
    shuffle_ignoring_priority(specs, seed, randomize_all);
    // Stable: the seed's order within each priority.
    specs.sort_by_key(|s| std::cmp::Reverse(s.info.priority()));
}

fn shuffle_ignoring_priority(specs: &mut [Arc<SpecDef>], seed: u64, randomize_all: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    if randomize_all {
        specs.sort_by_key(|s| s.info.index());
        specs.shuffle(&mut rng);
        return;
    }
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut sorted: Vec<&Arc<SpecDef>> = specs.iter().collect();
    sorted.sort_by_key(|s| s.info.index());
    for spec in sorted {
        let group = spec.info.shuffle_group();
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups.shuffle(&mut rng);
    let rank: HashMap<(usize, usize), usize> = groups.into_iter().enumerate().map(|(i, g)| (g, i)).collect();
    specs.sort_by_key(|s| (rank.get(&s.info.shuffle_group()).copied().unwrap_or(usize::MAX), s.info.index()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    /// Three top-level containers of three specs each, and two specs outside any container.
    fn specs() -> Vec<Arc<SpecDef>> {
        let mut reg = Registry::new();
        for c in ["a", "b", "c"] {
            reg.describe(c, |r| {
                for s in 0..3 {
                    r.it(&format!("{s}"), async |_| Ok(()));
                }
            });
        }
        reg.it("x", async |_| Ok(()));
        reg.it("y", async |_| Ok(()));
        reg.into_parts().0.into_iter().map(Arc::new).collect()
    }

    fn order(seed: u64, all: bool) -> Vec<String> {
        let mut specs = specs();
        shuffle(&mut specs, seed, all);
        specs.iter().map(|s| s.info.full_text().to_owned()).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_order_and_other_seeds_others() {
        assert_eq!(order(42, false), order(42, false));
        assert_eq!(order(42, true), order(42, true));
        let orders: std::collections::HashSet<Vec<String>> = (0..20).map(|seed| order(seed, false)).collect();
        assert!(orders.len() > 1, "20 seeds gave one order");
        let all: std::collections::HashSet<Vec<String>> = (0..20).map(|seed| order(seed, true)).collect();
        assert!(all.len() > 10, "20 seeds gave {} orders", all.len());
    }

    #[test]
    fn containers_move_as_a_whole_and_keep_their_inner_order() {
        for seed in 0..20 {
            let order = order(seed, false);
            for c in ["a", "b", "c"] {
                let at: Vec<usize> = order
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.starts_with(&format!("{c} ")))
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(at.len(), 3);
                assert!(at[1] == at[0] + 1 && at[2] == at[1] + 1, "{c} split up with seed {seed}: {order:?}");
                let names: Vec<&str> = at.iter().map(|&i| order[i].as_str()).collect();
                assert_eq!(names, [format!("{c} 0"), format!("{c} 1"), format!("{c} 2")], "seed {seed}");
            }
        }
    }

    #[test]
    fn randomize_all_splits_containers() {
        let split = (0..20).any(|seed| {
            let order = order(seed, true);
            let a: Vec<usize> =
                order.iter().enumerate().filter(|(_, t)| t.starts_with("a ")).map(|(i, _)| i).collect();
            a[2] - a[0] != 2 || order.iter().position(|t| t == "a 1") < order.iter().position(|t| t == "a 0")
        });
        assert!(split, "--randomize-all never moved a spec out of its container's order");
    }

    #[test]
    fn higher_priorities_start_first_and_each_priority_keeps_the_seeds_order() {
        // "b" (priority 2 for "b 1" alone, 1 for the rest) and "y" (1) before everything else.
        let prioritized = || {
            let mut reg = Registry::new();
            for c in ["a", "b", "c"] {
                let priority = i32::from(c == "b");
                reg.with_priority(priority, |r| {
                    r.describe(c, |r| {
                        for s in 0..3 {
                            let spec = r.it(&format!("{s}"), async |_| Ok(()));
                            if c == "b" && s == 1 {
                                spec.priority(2);
                            }
                        }
                    });
                });
            }
            reg.it("x", async |_| Ok(()));
            reg.with_priority(1, |r| {
                r.it("y", async |_| Ok(()));
            });
            reg.it("z", async |_| Ok(())).priority(-1);
            reg.into_parts().0.into_iter().map(Arc::new).collect::<Vec<_>>()
        };
        let mut seen = std::collections::HashSet::new();
        for seed in 0..20 {
            for all in [false, true] {
                let mut specs = prioritized();
                shuffle(&mut specs, seed, all);
                let order: Vec<&str> = specs.iter().map(|s| s.info.full_text()).collect();
                assert_eq!(order[0], "b 1", "seed {seed}: {order:?}");
                let mut ones = order[1..4].to_vec();
                ones.sort_unstable();
                assert_eq!(ones, ["b 0", "b 2", "y"], "seed {seed}: {order:?}");
                assert_eq!(order[order.len() - 1], "z", "seed {seed}: {order:?}");
                // Within a priority, the order is the seed's, as without priorities.
                let mut plain = specs.clone();
                shuffle_ignoring_priority(&mut plain, seed, all);
                let zeros: Vec<&str> =
                    plain.iter().filter(|s| s.info.priority() == 0).map(|s| s.info.full_text()).collect();
                assert_eq!(order[4..order.len() - 1], zeros[..], "seed {seed}");
                seen.insert(zeros.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>());
            }
        }
        assert!(seen.len() > 1, "the priority-0 specs kept one order over 20 seeds");
    }
}
