//! The lanes of the local cluster: what each runs and, for the lanes after the default one, the
//! flags the cluster is restarted with and what those need built. A run split over machines
//! (`--partition`) may bring the cluster up straight into a later lane: each lane also has the
//! step name of that.

use std::path::Path;

use super::{
    LANE_PROCS,
    background::Build,
    cluster_tests::{self, ClusterTest},
    lane_run::SuiteRun,
    partition::{ClusterBuild, LocalLane, Unit},
};
use crate::overrides::{OverrideArgs, Overrides};

/// The workload lane: the cluster restarted with what PodGroups need (beta gates off by default
/// and a beta API, which kind.yaml leaves off because they change how every pod is scheduled),
/// running the specs that need them. The skip message of those specs names the same flags
/// (suites/src/specs/kubelet/pod_groups.rs, `LANE_FLAGS`; a unit test keeps them equal).
/// `--feature-gates` of the workload lane.
const WORKLOAD_GATES: &str = "GenericWorkload=true,DRAWorkloadResourceClaims=true";
/// `--runtime-config` of the workload lane.
const WORKLOAD_APIS: &str = "scheduling.k8s.io/v1beta1=true";
/// What the workload lane runs (and the other kubelet lane skips).
pub(crate) const WORKLOAD_FOCUS: &str = "GenericWorkload";

/// The skew lane: the cluster restarted with kind-worker's kubelet at the oldest supported minor
/// (built from its own module, see xtask/src/local/old_kubelet.rs) beside v1.37.2 workers.
/// Specs without `KubeletMinVersion` get kind-worker first (nodes are chosen by name), so every
/// one-node kubelet spec runs against the old kubelet; newer-only specs run on the other workers
/// or are skipped with the reason.
pub(crate) const SKEW_KUBELETS: &str = "v1.34.4";
/// What the skew lane runs: the kubelet suites but the slow specs and the workload lane's.
const SKEW_FOCUS: &str = "kubelet";
/// What the skew lane leaves out (Slow: bounded time; GenericWorkload: needs its own lane's gates).
const SKEW_SKIP: &str = "Slow|GenericWorkload";

/// The next release lane: the cluster restarted at the next Kubernetes release (built from its
/// own module, see xtask/src/common/kube_module.rs), every spec but the workload lane's, with the
/// spec texts of that release (dra-e2e reads the cluster's version); then again with the
/// workload lane's gates for those.
pub(crate) const NEXT_RELEASE: &str = "v1.38.0-beta.0";

/// A lane after the default one: the cluster's flags, and what runs on it.
pub(crate) struct Lane {
    /// Which lane.
    pub lane: LocalLane,
    /// The step name of the restart into it.
    pub restart: &'static str,
    /// The step name of a machine's first `cluster up` straight into it.
    pub up: &'static str,
    /// `cluster up`'s flags.
    pub args: OverrideArgs,
    /// Cluster tests run first, and the unit they are.
    pub cluster_tests: Option<(Unit, ClusterTest)>,
    /// The suite run: its unit, step name and the run.
    pub suite: (Unit, &'static str, SuiteRun),
}

impl Lane {
    /// Its flags, parsed.
    pub(crate) fn overrides(&self) -> anyhow::Result<Overrides> {
        Ok(self.args.parse()?.unwrap_or_default())
    }
}

/// The lanes after the default one, in order.
pub(crate) fn lanes(repo: &Path) -> Vec<Lane> {
    let workload = || OverrideArgs {
        feature_gates: Some(WORKLOAD_GATES.to_owned()),
        runtime_config: Some(WORKLOAD_APIS.to_owned()),
        ..OverrideArgs::default()
    };
    vec![
        Lane {
            lane: LocalLane::Workload,
            restart: "local cluster restarted for the workload lane (GenericWorkload)",
            up: "local cluster up for the workload lane (GenericWorkload)",
            args: workload(),
            cluster_tests: None,
            suite: workload_run(repo),
        },
        Lane {
            lane: LocalLane::Skew,
            restart: "local cluster restarted for the skew lane (kind-worker's kubelet v1.34.4)",
            up: "local cluster up for the skew lane (kind-worker's kubelet v1.34.4)",
            args: OverrideArgs { kubelet_version: Some(SKEW_KUBELETS.to_owned()), ..OverrideArgs::default() },
            cluster_tests: Some((Unit::SkewTests, cluster_tests::skew_test())),
            suite: (
                Unit::Skew,
                "e2e: skew lane (kubelet suites, kind-worker at v1.34.4)",
                lane_suite(repo, &["--focus", SKEW_FOCUS, "--skip", SKEW_SKIP], "skew"),
            ),
        },
        Lane {
            lane: LocalLane::NextRelease,
            restart: "local cluster restarted at Kubernetes v1.38.0-beta.0 (the next release)",
            up: "local cluster up at Kubernetes v1.38.0-beta.0 (the next release)",
            args: OverrideArgs { k8s_version: Some(NEXT_RELEASE.to_owned()), ..OverrideArgs::default() },
            cluster_tests: None,
            suite: (
                Unit::NextRelease,
                "e2e: v1.38.0-beta.0 lane (every spec but the workload lane's)",
                lane_suite(repo, &["--skip", WORKLOAD_FOCUS], "next-release"),
            ),
        },
        Lane {
            lane: LocalLane::NextReleaseWorkload,
            restart: "local cluster restarted at v1.38.0-beta.0 for its workload lane",
            up: "local cluster up at v1.38.0-beta.0 for its workload lane",
            args: OverrideArgs { k8s_version: Some(NEXT_RELEASE.to_owned()), ..workload() },
            cluster_tests: None,
            suite: (
                Unit::NextReleaseWorkload,
                "e2e: v1.38.0-beta.0 workload lane (PodGroup specs)",
                lane_suite(repo, &["--focus", WORKLOAD_FOCUS], "next-release-workload"),
            ),
        },
    ]
}

/// The background build of `build` (`cargo xtask cluster build …`).
pub(crate) fn background_build(build: ClusterBuild) -> Build {
    let (what, args): (String, &[&str]) = match build {
        ClusterBuild::LocalCluster => ("the local cluster's binaries".into(), &[]),
        ClusterBuild::SkewKubelet => {
            (format!("kubelet {SKEW_KUBELETS}"), &["--kubelet-version", SKEW_KUBELETS])
        }
        ClusterBuild::NextRelease => (format!("Kubernetes {NEXT_RELEASE}"), &["--k8s-version", NEXT_RELEASE]),
        ClusterBuild::KindImage => ("the kind node image".into(), &["--provider", "kind"]),
    };
    Build { key: build.key(), what, args: args.iter().map(|a| a.to_string()).collect() }
}

/// The e2e suite run against the local cluster as `cluster up` starts it (kind.yaml's gates):
/// every registered spec but the workload lane's, in one run, so the parallel specs of every
/// context fill the slots around the `[Serial]` specs' chain and the run ends with one tail of
/// deferred observations instead of one per context (measured in docs/spec-time.md).
pub(crate) fn suite_run(repo: &Path) -> (&'static str, SuiteRun) {
    (
        "e2e: every spec but the workload lane's (control plane, CRUD, kubelet, Node Allocatable, ...)",
        lane_suite(repo, &["--skip", WORKLOAD_FOCUS], "suites"),
    )
}

/// The workload lane's run: the specs that need PodGroups.
fn workload_run(repo: &Path) -> (Unit, &'static str, SuiteRun) {
    (
        Unit::Workload,
        "e2e: workload lane (PodGroup specs)",
        lane_suite(repo, &["--focus", WORKLOAD_FOCUS], "workload"),
    )
}

/// A lane's run of `selection`, [`LANE_PROCS`] at once, its reports `<stem>.xml` and
/// `<stem>.json` (`stem` also names the lane in docs/lanes.md's host skips).
fn lane_suite(repo: &Path, selection: &[&str], stem: &str) -> SuiteRun {
    SuiteRun::new(repo, selection, stem, LANE_PROCS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::test::partition::Setting;

    fn lane(prefix: &str) -> Lane {
        lanes(&crate::repo::repo_root()).into_iter().find(|l| l.restart.contains(prefix)).unwrap()
    }

    #[test]
    fn each_lane_s_units_run_on_its_cluster_and_it_needs_what_it_builds() {
        let lanes = lanes(Path::new("/repo"));
        let order: Vec<LocalLane> = lanes.iter().map(|l| l.lane).collect();
        assert_eq!(order, LocalLane::ALL[1..]);
        for lane in &lanes {
            let mut units = vec![lane.suite.0];
            units.extend(lane.cluster_tests.as_ref().map(|(unit, _)| *unit));
            for unit in units {
                assert_eq!(unit.setting(), Setting::Local(lane.lane), "{}", lane.restart);
            }
            // What its flags need built is what the plan says it needs.
            let overrides = lane.overrides().unwrap();
            let builds = lane.lane.builds();
            assert_eq!(
                overrides.k8s_version.is_some(),
                builds.contains(&ClusterBuild::NextRelease),
                "{}",
                lane.restart
            );
            assert_eq!(
                !overrides.kubelet_versions.is_empty(),
                builds.contains(&ClusterBuild::SkewKubelet),
                "{}",
                lane.restart
            );
        }
        assert_eq!(background_build(ClusterBuild::SkewKubelet).args, ["--kubelet-version", "v1.34.4"]);
        assert_eq!(background_build(ClusterBuild::NextRelease).args, ["--k8s-version", NEXT_RELEASE]);
        assert!(background_build(ClusterBuild::LocalCluster).args.is_empty());
    }

    #[test]
    fn the_skew_lane_runs_an_old_kubelet_beside_new_ones() {
        let lane = lane("skew lane");
        let overrides = lane.overrides().unwrap();
        assert_eq!(overrides.kubelet_flag(), "v1.34.4");
        assert!(overrides.feature_gates.is_empty() && overrides.runtime_config.is_empty());
        // An older minor than the cluster's, and the cluster keeps other workers at its version.
        let cluster = crate::common::kube_version::KubeVersion::new(1, 37, 2);
        let versions = crate::skew::node_versions(&cluster, 4, &[], &overrides.kubelet_versions).unwrap();
        assert!(versions[1].minor() < cluster.minor() && versions[2] == cluster && versions[3] == cluster);
        assert!(lane.cluster_tests.iter().any(|(_, test)| test.cargo_args.contains(&"skew::")));
        let args = &lane.suite.2.args;
        assert!(args.windows(2).any(|w| w == ["--focus", SKEW_FOCUS]), "{args:?}");
        assert!(args.windows(2).any(|w| w == ["--skip", SKEW_SKIP]), "{args:?}");
    }

    #[test]
    fn the_next_release_lanes_run_every_spec_at_that_release() {
        let all = lane("v1.38.0-beta.0 (the next release)");
        let overrides = all.overrides().unwrap();
        assert_eq!(overrides.k8s_version.map(|v| v.to_string()).as_deref(), Some(NEXT_RELEASE));
        assert!(overrides.feature_gates.is_empty() && overrides.kubelet_versions.is_empty());
        assert_eq!(all.suite.2.args[..2], ["--skip", WORKLOAD_FOCUS]);
        let workload = lane("v1.38.0-beta.0 for its workload lane").overrides().unwrap();
        let default_workload = lane("for the workload lane").overrides().unwrap();
        assert_eq!(
            workload,
            Overrides {
                k8s_version: Some(crate::common::kube_version::KubeVersion::parse(NEXT_RELEASE).unwrap()),
                ..default_workload
            }
        );
        // The release has committed upstream spec texts (the parity test checks them).
        let list = crate::repo::repo_root().join(format!("suites/upstream/specs-{NEXT_RELEASE}.txt"));
        assert!(list.is_file(), "{} is missing", list.display());
    }

    #[test]
    fn the_default_run_and_the_workload_lane_split_the_specs_between_them() {
        let repo = Path::new("/repo");
        let default = suite_run(repo).1.args;
        let workload = workload_run(repo).2.args;
        assert_eq!(default[..2], ["--skip", WORKLOAD_FOCUS]);
        assert_eq!(workload[..2], ["--focus", WORKLOAD_FOCUS]);
        for args in [&default, &workload] {
            assert!(!args[2..].iter().any(|a| a == "--focus" || a == "--skip"), "{args:?}");
        }
    }

    #[test]
    fn the_workload_lane_is_what_the_pod_group_specs_ask_for() {
        let lane = lane("workload lane").overrides().unwrap();
        let specs =
            std::fs::read_to_string(crate::repo::repo_root().join("suites/src/specs/kubelet/pod_groups.rs"))
                .unwrap();
        let flags = format!("{lane}");
        assert!(specs.contains(&format!("\"{flags}\"")), "pod_groups.rs must name {flags:?} as LANE_FLAGS");
        assert!(lane.feature_gates["GenericWorkload"] && lane.feature_gates["DRAWorkloadResourceClaims"]);
    }
}
