//! `cargo xtask test --partition M/N`: the run spread over N machines (a CI's parallel jobs),
//! machine M running its [`Share`]. Every machine computes the same plan from the measured step
//! costs ([`costs`], [`plan`]), so that together they run every step that tests something once:
//! whole lanes where that balances, a lane's specs split over machines (`dra-e2e --partition
//! slice:k/n`) where one lane would dominate. A machine brings up only the clusters its share
//! needs and builds only what those need (no kind node image without the kind lane, no
//! next-release build without the next-release lanes).

use std::fmt;

use crate::usage::UsageError;

pub(crate) mod costs;
#[cfg(test)]
mod docs_tests;
pub(crate) mod plan;

/// The most machines a run is split over: beyond six, the clusters' set-up on every machine
/// (builds, cluster up) outweighs what the steps left to each take.
pub(crate) const MAX_MACHINES: u32 = 6;

/// `--partition M/N`: this machine is M of N (1-based, as GitLab's `CI_NODE_INDEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// This machine, 1 ..= `machines`.
    pub machine: u32,
    /// How many machines share the run.
    pub machines: u32,
}

impl Partition {
    /// `M/N`, or the one sentence that says what is wrong with `text`.
    pub fn parse(text: &str) -> Result<Self, UsageError> {
        let wrong = || {
            UsageError::new(format!(
                "--partition takes M/N, this machine's number M of N machines with 1 <= M <= N <= {MAX_MACHINES} (e.g. 2/3), not {text:?}"
            ))
        };
        let (machine, machines) = text.split_once('/').ok_or_else(wrong)?;
        let number = |s: &str| s.parse::<u32>().ok().filter(|_| s.bytes().all(|b| b.is_ascii_digit()));
        let (Some(machine), Some(machines)) = (number(machine), number(machines)) else {
            return Err(wrong());
        };
        if machine == 0 || machine > machines || machines > MAX_MACHINES {
            return Err(wrong());
        }
        Ok(Self { machine, machines })
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.machine, self.machines)
    }
}

/// This machine's share: everything without `--partition`; else its share of the plan, which it
/// prints first with every other machine's, so that each machine's log shows the whole split.
pub(crate) fn this_machine(partition: Option<Partition>) -> Share {
    let Some(partition) = partition else { return Share::everything() };
    let plan = plan::plan(partition.machines);
    eprintln!(
        "==> --partition {partition}: the plan every machine computes alike (times planned from the cold run of {} in docs/results.md):",
        costs::FIGURES_OF
    );
    for (i, (share, time)) in plan.shares.iter().zip(plan.times()).enumerate() {
        let this = if i + 1 == partition.machine as usize { "  <- this machine" } else { "" };
        eprintln!(
            "    {}/{}: {}; clusters {}; builds {}; planned {}{this}",
            i + 1,
            partition.machines,
            share.describe_units(),
            plan::describe_clusters(share),
            plan::describe_builds(share),
            crate::progress::human(time)
        );
    }
    eprintln!("    the longest machine is planned at {}", crate::progress::human(plan.longest()));
    plan.shares.get(partition.machine as usize - 1).cloned().unwrap_or_else(|| Share::of(Vec::new()))
}

/// Slice `index` of `total` of one dra-e2e run's specs (`dra-e2e --partition slice:k/n`): its
/// specs in even shares, the others reported as skipped `in shard j of n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Slice {
    /// This slice, 1 ..= `total`.
    pub index: u32,
    /// How many slices the run has.
    pub total: u32,
}

impl Slice {
    /// dra-e2e's `--partition` value of the slice.
    pub(crate) fn flag(&self) -> String {
        format!("slice:{}/{}", self.index, self.total)
    }

    /// Whether `reason` is the skip reason dra-e2e gives a spec of another slice of the same
    /// run (spec-runner's `elsewhere_reason`: `in shard 2 of 3`).
    pub(crate) fn is_elsewhere(&self, reason: &str) -> bool {
        let Some((index, total)) = reason.strip_prefix("in shard ").and_then(|r| r.split_once(" of ")) else {
            return false;
        };
        match (index.parse::<u32>(), total.parse::<u32>()) {
            (Ok(index), Ok(total)) => {
                total == self.total && index != self.index && (1..=total).contains(&index)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.total)
    }
}

/// A lane of the local cluster: the cluster's flags its steps need. In the order a run
/// restarts the cluster into them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum LocalLane {
    /// kind.yaml's cluster, as `cluster up` starts it.
    Default,
    /// The workload lane's gates and API.
    Workload,
    /// kind-worker's kubelet at the oldest supported minor.
    Skew,
    /// The next Kubernetes release.
    NextRelease,
    /// The next release with the workload lane's gates and API.
    NextReleaseWorkload,
}

impl LocalLane {
    /// Every lane, in the run's order.
    pub(crate) const ALL: [LocalLane; 5] =
        [Self::Default, Self::Workload, Self::Skew, Self::NextRelease, Self::NextReleaseWorkload];

    /// The builds its cluster needs, in the order they are made.
    pub(crate) fn builds(self) -> &'static [ClusterBuild] {
        match self {
            Self::Default | Self::Workload => &[ClusterBuild::LocalCluster],
            Self::Skew => &[ClusterBuild::LocalCluster, ClusterBuild::SkewKubelet],
            Self::NextRelease | Self::NextReleaseWorkload => &[ClusterBuild::NextRelease],
        }
    }

    /// Its name in the docs' table of machines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Workload => "workload",
            Self::Skew => "skew",
            Self::NextRelease => "next-release",
            Self::NextReleaseWorkload => "next-release-workload",
        }
    }
}

/// A background build that clusters need (`cargo xtask cluster build …`, [`super::background`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ClusterBuild {
    /// The local cluster's binaries at the pinned release.
    LocalCluster,
    /// The skew lane's old kubelet.
    SkewKubelet,
    /// The next release's binaries.
    NextRelease,
    /// The kind node image (its Kubernetes binaries are the local cluster's, built first).
    KindImage,
}

impl ClusterBuild {
    /// Every build, in the order a run makes them.
    pub(crate) const ALL: [ClusterBuild; 4] =
        [Self::LocalCluster, Self::SkewKubelet, Self::NextRelease, Self::KindImage];

    /// The key a step waits for it by; also names its log (`background-<key>.log`).
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::LocalCluster => "local-cluster",
            Self::SkewKubelet => "skew-kubelet",
            Self::NextRelease => "next-release",
            Self::KindImage => "kind-node-image",
        }
    }
}

/// Where a unit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Setting {
    /// On no cluster.
    NoCluster,
    /// On the local cluster with a lane's flags.
    Local(LocalLane),
    /// On the kind cluster.
    Kind,
}

/// What a split run spreads over its machines: the steps of `cargo xtask test` that test
/// something, each run by exactly one machine (or, for a suite run, each slice of it). The
/// steps that set clusters up and take them down are each machine's own, as its share needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Unit {
    /// The unit and protocol tests.
    CargoTests,
    /// The cluster tests side by side on the default cluster.
    ClusterTests,
    /// Every spec but the workload lane's on the default cluster (`suites`).
    Suites,
    /// The restart cluster test.
    RestartTest,
    /// The kubelet suites across a kubelet restart.
    RestartKubelet,
    /// The control plane suites across an API server restart.
    RestartApiserver,
    /// The driver lane (its six steps in order).
    Driver,
    /// The workload lane's specs.
    Workload,
    /// The skew cluster tests.
    SkewTests,
    /// The skew lane's specs.
    Skew,
    /// The next release lane's specs.
    NextRelease,
    /// The next release's workload lane's specs.
    NextReleaseWorkload,
    /// The kind lane's cluster tests.
    KindTests,
    /// The kind lane's specs.
    Kind,
}

impl Unit {
    /// Every unit, in the run's order.
    pub(crate) const ALL: [Unit; 14] = [
        Self::CargoTests,
        Self::ClusterTests,
        Self::Suites,
        Self::RestartTest,
        Self::RestartKubelet,
        Self::RestartApiserver,
        Self::Driver,
        Self::Workload,
        Self::SkewTests,
        Self::Skew,
        Self::NextRelease,
        Self::NextReleaseWorkload,
        Self::KindTests,
        Self::Kind,
    ];

    /// Where it runs.
    pub(crate) fn setting(self) -> Setting {
        use LocalLane as L;
        match self {
            Self::CargoTests => Setting::NoCluster,
            Self::ClusterTests
            | Self::Suites
            | Self::RestartTest
            | Self::RestartKubelet
            | Self::RestartApiserver
            | Self::Driver => Setting::Local(L::Default),
            Self::Workload => Setting::Local(L::Workload),
            Self::SkewTests | Self::Skew => Setting::Local(L::Skew),
            Self::NextRelease => Setting::Local(L::NextRelease),
            Self::NextReleaseWorkload => Setting::Local(L::NextReleaseWorkload),
            Self::KindTests | Self::Kind => Setting::Kind,
        }
    }

    /// Whether its specs may be split over machines: the suite runs of more than a handful of
    /// specs.
    pub(crate) fn splittable(self) -> bool {
        matches!(self, Self::Suites | Self::Skew | Self::NextRelease | Self::Kind)
    }

    /// Its name in the docs' table of machines: a suite run's report stem, else what it is.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::CargoTests => "unit-tests",
            Self::ClusterTests => "cluster-tests",
            Self::Suites => "suites",
            Self::RestartTest => "restart-test",
            Self::RestartKubelet => "restart-kubelet",
            Self::RestartApiserver => "restart-apiserver",
            Self::Driver => "driver",
            Self::Workload => "workload",
            Self::SkewTests => "skew-tests",
            Self::Skew => "skew",
            Self::NextRelease => "next-release",
            Self::NextReleaseWorkload => "next-release-workload",
            Self::KindTests => "kind-tests",
            Self::Kind => "kind",
        }
    }
}

/// What one machine runs: units, each whole or one slice of its specs, in the run's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Share {
    units: Vec<(Unit, Option<Slice>)>,
}

impl Share {
    /// Every unit whole: what `cargo xtask test` runs without `--partition`.
    pub(crate) fn everything() -> Self {
        Self::of(Unit::ALL.iter().map(|&u| (u, None)).collect())
    }

    /// The share of `units` (put in the run's order).
    pub(crate) fn of(mut units: Vec<(Unit, Option<Slice>)>) -> Self {
        units.sort();
        Self { units }
    }

    /// Its units.
    pub(crate) fn units(&self) -> &[(Unit, Option<Slice>)] {
        &self.units
    }

    /// Whether it runs `unit` (whole or a slice).
    pub(crate) fn runs(&self, unit: Unit) -> bool {
        self.units.iter().any(|(u, _)| *u == unit)
    }

    /// The slice of `unit` it runs, if it runs a slice.
    pub(crate) fn slice(&self, unit: Unit) -> Option<Slice> {
        self.units.iter().find(|(u, _)| *u == unit).and_then(|(_, slice)| *slice)
    }

    /// The local cluster's lanes its units need, in the run's order.
    pub(crate) fn local_lanes(&self) -> Vec<LocalLane> {
        LocalLane::ALL
            .into_iter()
            .filter(|lane| self.units.iter().any(|(u, _)| u.setting() == Setting::Local(*lane)))
            .collect()
    }

    /// Whether it needs the kind cluster.
    pub(crate) fn needs_kind(&self) -> bool {
        self.units.iter().any(|(u, _)| u.setting() == Setting::Kind)
    }

    /// The builds its clusters need, in the order a run makes them.
    pub(crate) fn builds(&self) -> Vec<ClusterBuild> {
        let mut needed: Vec<ClusterBuild> =
            self.local_lanes().into_iter().flat_map(|lane| lane.builds().iter().copied()).collect();
        if self.needs_kind() {
            needed.extend([ClusterBuild::LocalCluster, ClusterBuild::KindImage]);
        }
        ClusterBuild::ALL.into_iter().filter(|b| needed.contains(b)).collect()
    }

    /// `suites 1/2, skew, kind`: its units as the docs' table lists them.
    pub(crate) fn describe_units(&self) -> String {
        let named: Vec<String> = self
            .units
            .iter()
            .map(|(unit, slice)| match slice {
                Some(slice) => format!("`{}` {slice}", unit.name()),
                None => format!("`{}`", unit.name()),
            })
            .collect();
        named.join(", ")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_m_of_n_machines() {
        assert_eq!(Partition::parse("2/3").unwrap(), Partition { machine: 2, machines: 3 });
        assert_eq!(Partition::parse("1/1").unwrap().to_string(), "1/1");
        assert_eq!(Partition::parse("6/6").unwrap(), Partition { machine: 6, machines: 6 });
        for bad in ["0/3", "4/3", "3", "", "/3", "1/", "a/b", "1/7", "+1/3", "1/3/3", " 1/3", "-1/3"] {
            let err = Partition::parse(bad).unwrap_err().to_string();
            assert!(
                err.starts_with(
                    "--partition takes M/N, this machine's number M of N machines with 1 <= M <= N <= 6"
                ),
                "{bad:?}: {err}"
            );
            assert!(err.ends_with(&format!("not {bad:?}")), "{err}");
            assert!(!err.contains('\n'), "one sentence: {err}");
        }
    }

    #[test]
    fn a_slice_accepts_only_the_other_slices_of_its_own_split() {
        let slice = Slice { index: 1, total: 2 };
        assert_eq!(slice.flag(), "slice:1/2");
        assert!(slice.is_elsewhere("in shard 2 of 2"));
        for not in [
            "in shard 1 of 2",
            "in shard 3 of 2",
            "in shard 0 of 2",
            "in shard 2 of 3",
            "in shard 2 of 2 ",
            "needs 2 nodes",
            "in shard x of 2",
            "",
        ] {
            assert!(!slice.is_elsewhere(not), "{not:?}");
        }
    }

    #[test]
    fn a_share_needs_the_clusters_and_builds_of_its_units_only() {
        let everything = Share::everything();
        assert_eq!(everything.local_lanes(), LocalLane::ALL);
        assert!(everything.needs_kind());
        assert_eq!(everything.builds(), ClusterBuild::ALL);
        let next = Share::of(vec![(Unit::NextReleaseWorkload, None), (Unit::CargoTests, None)]);
        assert_eq!(next.units()[0].0, Unit::CargoTests, "in the run's order");
        assert_eq!(next.local_lanes(), [LocalLane::NextReleaseWorkload]);
        assert_eq!(next.builds(), [ClusterBuild::NextRelease], "no v1.37.2 build, no kind image");
        let kind = Share::of(vec![(Unit::Kind, Some(Slice { index: 2, total: 2 }))]);
        assert!(kind.local_lanes().is_empty());
        assert_eq!(kind.builds(), [ClusterBuild::LocalCluster, ClusterBuild::KindImage]);
        assert_eq!(kind.slice(Unit::Kind), Some(Slice { index: 2, total: 2 }));
        assert_eq!(kind.describe_units(), "`kind` 2/2");
        let skew = Share::of(vec![(Unit::Skew, None)]);
        assert_eq!(skew.builds(), [ClusterBuild::LocalCluster, ClusterBuild::SkewKubelet]);
        assert!(!skew.needs_kind() && !skew.runs(Unit::CargoTests));
    }
}
