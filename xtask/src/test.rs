//! `cargo xtask test`: the project's own tests, what CI runs. Unit and protocol tests first, then
//! the local cluster comes up (with its registry, as `cluster up --registry`) and the cluster
//! tests and the e2e suites run against it, then the cluster goes down and must leave nothing
//! behind; then the kind lane ([`kind_lane`]) does the same on a kind cluster. Every step runs (a
//! failure does not hide the others' results) and a table of steps, outcomes and durations closes
//! the run.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};

use crate::{e2e, local, overrides::OverrideArgs, progress::human};

mod background;
mod budget;
mod cluster_tests;
mod disk;
mod doc_table;
mod driver_lane;
pub(crate) mod host_skips;
pub(crate) mod kind_lane;
pub(crate) mod lane_run;
pub(crate) mod partition;
pub(crate) mod report;
mod restart_exceptions;
mod restarts;
pub(crate) mod steps;
mod table;

pub use budget::StepStart;

/// The workload lane: the cluster restarted with what PodGroups need (beta gates off by default
/// and a beta API, which kind.yaml leaves off because they change how every pod is scheduled),
/// running the specs that need them. The skip message of those specs names the same flags
/// (suites/src/specs/kubelet/pod_groups.rs, `LANE_FLAGS`; a unit test keeps them equal).
/// `--feature-gates` of the workload lane.
const WORKLOAD_GATES: &str = "GenericWorkload=true,DRAWorkloadResourceClaims=true";
/// `--runtime-config` of the workload lane.
const WORKLOAD_APIS: &str = "scheduling.k8s.io/v1beta1=true";
/// What the workload lane runs (and the other kubelet lane skips).
const WORKLOAD_FOCUS: &str = "GenericWorkload";

/// The skew lane: the cluster restarted with kind-worker's kubelet at the oldest supported minor
/// (built from its own module, see xtask/src/local/old_kubelet.rs) beside v1.37.2 workers.
/// Specs without `KubeletMinVersion` get kind-worker first (nodes are chosen by name), so every
/// one-node kubelet spec runs against the old kubelet; newer-only specs run on the other workers
/// or are skipped with the reason.
const SKEW_KUBELETS: &str = "v1.34.4";
/// What the skew lane runs: the kubelet suites but the slow specs and the workload lane's.
const SKEW_FOCUS: &str = "kubelet";
/// What the skew lane leaves out (Slow: bounded time; GenericWorkload: needs its own lane's gates).
const SKEW_SKIP: &str = "Slow|GenericWorkload";

/// The next release lane: the cluster restarted at the next Kubernetes release (built from its
/// own module, see xtask/src/common/kube_module.rs), every spec but the workload lane's, with the
/// spec texts of that release (dra-e2e reads the cluster's version); then again with the
/// workload lane's gates for those.
const NEXT_RELEASE: &str = "v1.38.0-beta.0";

/// A restart of the cluster with overrides, and what runs on it afterwards.
struct Lane {
    /// The step name of the restart.
    restart: &'static str,
    /// `cluster up`'s flags.
    args: OverrideArgs,
    /// What the restart needs built beyond the default cluster, built in the background while
    /// the lanes before it run ([`background`]).
    build: Option<background::Build>,
    /// Cluster tests run first.
    cluster_tests: Vec<cluster_tests::ClusterTest>,
    /// The suite run: step name and the run.
    suite: (&'static str, lane_run::SuiteRun),
}

fn lane_overrides(lane: &Lane) -> Result<crate::overrides::Overrides> {
    Ok(lane.args.parse()?.unwrap_or_default())
}

/// The lanes after the default one, in order.
fn lanes(repo: &Path) -> Vec<Lane> {
    vec![
        Lane {
            restart: "local cluster restarted for the workload lane (GenericWorkload)",
            args: OverrideArgs {
                feature_gates: Some(WORKLOAD_GATES.to_owned()),
                runtime_config: Some(WORKLOAD_APIS.to_owned()),
                ..OverrideArgs::default()
            },
            build: None,
            cluster_tests: vec![],
            suite: workload_run(repo),
        },
        Lane {
            restart: "local cluster restarted for the skew lane (kind-worker's kubelet v1.34.4)",
            args: OverrideArgs { kubelet_version: Some(SKEW_KUBELETS.to_owned()), ..OverrideArgs::default() },
            build: Some(background::Build {
                key: "skew-kubelet",
                what: format!("kubelet {SKEW_KUBELETS}"),
                args: vec!["--kubelet-version".into(), SKEW_KUBELETS.into()],
            }),
            cluster_tests: vec![cluster_tests::skew_test()],
            suite: (
                "e2e: skew lane (kubelet suites, kind-worker at v1.34.4)",
                lane_suite(repo, &["--focus", SKEW_FOCUS, "--skip", SKEW_SKIP], "skew"),
            ),
        },
        Lane {
            restart: "local cluster restarted at Kubernetes v1.38.0-beta.0 (the next release)",
            args: OverrideArgs { k8s_version: Some(NEXT_RELEASE.to_owned()), ..OverrideArgs::default() },
            build: Some(background::Build {
                key: "next-release",
                what: format!("Kubernetes {NEXT_RELEASE}"),
                args: vec!["--k8s-version".into(), NEXT_RELEASE.into()],
            }),
            cluster_tests: vec![],
            suite: (
                "e2e: v1.38.0-beta.0 lane (every spec but the workload lane's)",
                lane_suite(repo, &["--skip", WORKLOAD_FOCUS], "next-release"),
            ),
        },
        Lane {
            restart: "local cluster restarted at v1.38.0-beta.0 for its workload lane",
            args: OverrideArgs {
                feature_gates: Some(WORKLOAD_GATES.to_owned()),
                runtime_config: Some(WORKLOAD_APIS.to_owned()),
                k8s_version: Some(NEXT_RELEASE.to_owned()),
                ..OverrideArgs::default()
            },
            build: None, // the lane before built it
            cluster_tests: vec![],
            suite: (
                "e2e: v1.38.0-beta.0 workload lane (PodGroup specs)",
                lane_suite(repo, &["--focus", WORKLOAD_FOCUS], "next-release-workload"),
            ),
        },
    ]
}

/// Which clusters `cargo xtask test` runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TestLane {
    /// The unit and protocol tests, the local cluster's tests and lanes, then the kind lane
    /// (what CI runs).
    #[default]
    All,
    /// The unit and protocol tests and the local cluster's tests and lanes.
    Local,
    /// Only the kind lane (what the e2e-kind workflow runs): root, or a Docker engine in
    /// `DOCKER_HOST`; the node image is built first if missing.
    Kind,
    /// Only the driver lane on the local cluster ([`driver_lane`]): the example driver as a
    /// DaemonSet, tested as a real driver.
    Driver,
}

/// Options of `cargo xtask test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TestOptions {
    /// Run only the tests that need no cluster (`--no-cluster`).
    pub no_cluster: bool,
    /// What to run (`--lane`).
    pub lane: TestLane,
    /// Leave the local cluster running afterwards (`--keep-cluster`).
    pub keep_cluster: bool,
}

/// `text` cut to at most `max` bytes (on a character boundary), marked where it was cut.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}… ({} bytes more)", &text[..end], text.len() - end)
}

/// Runs the steps and prints the summary; the exit code is 130 after Ctrl-C, else 1 when a step
/// failed.
pub async fn run(args: TestOptions) -> Result<ExitCode> {
    if args.lane == TestLane::Kind && (args.no_cluster || args.keep_cluster) {
        return Err(crate::usage::UsageError::new(
            "--lane kind runs the kind lane only, whose cluster is always deleted: leave out --no-cluster and --keep-cluster",
        )
        .into());
    }
    if args.lane == TestLane::Driver && args.no_cluster {
        return Err(crate::usage::UsageError::new(
            "--lane driver runs the driver lane on the local cluster: leave out --no-cluster",
        )
        .into());
    }
    let repo = crate::repo::repo_root();
    let stop = steps::Stop::on_ctrl_c();
    let disk = disk::DiskWatch::start(&disk::paths(&repo), disk::FLOOR, stop.any.clone());
    eprintln!("==> {}", disk.describe());
    let mut steps = steps::Steps::new(stop, Some(disk));
    let local_lanes = !args.no_cluster && args.lane != TestLane::Kind;
    // `--lane driver`: the local cluster and the driver lane, nothing else.
    let only_driver = args.lane == TestLane::Driver;
    let lanes = if only_driver { Vec::new() } else { lanes(&repo) };
    let mut kind = None;
    let mut background = None;
    // Everything the run builds for its clusters (the local cluster first, the kind node image
    // last) builds from the start, in the background at the least CPU priority: beside the unit
    // tests, then beside the lanes before the one that needs it, which mostly wait on the
    // cluster. The kind lane's engine starts first: the image is imported into it.
    if local_lanes {
        if args.lane == TestLane::All {
            kind = Some(kind_lane::prepare(&mut steps).await);
        }
        let builds: Vec<_> = std::iter::once(local_cluster_build())
            .chain(lanes.iter().filter_map(|lane| lane.build.clone()))
            .chain(kind.as_ref().and_then(kind_lane::KindLane::image_build))
            .collect();
        let t = StepStart::now();
        let started = background::Background::start(&repo, builds);
        let ok = started.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}"));
        background = started.ok();
        steps.record("background builds started (SCHED_IDLE, least CPU weight)", ok, t);
    }
    if !matches!(args.lane, TestLane::Kind | TestLane::Driver) {
        steps
            .run("unit and protocol tests (cargo test --workspace)", async {
                cargo(&repo, &["test", "--workspace"], &[])
            })
            .await;
    }
    if local_lanes {
        on_local_cluster(&repo, &args, lanes, background.as_mut(), &mut steps).await?;
    }
    // After the local cluster is down: two clusters at once do not fit two cores.
    if !args.no_cluster && matches!(args.lane, TestLane::All | TestLane::Kind) {
        let lane = match kind {
            Some(lane) => Some(lane),
            None if steps.go_on() => Some(kind_lane::prepare(&mut steps).await),
            None => None,
        };
        match lane {
            Some(lane) => lane.run(&repo, background.as_mut(), &mut steps).await,
            None => kind_lane::not_run(&mut steps),
        }
    }
    drop(background); // stops a build still running (after an interrupt)
    Ok(steps.finish())
}

/// The local cluster's steps: up, its cluster tests and lanes, down (also after a failure or an
/// interrupt, unless `--keep-cluster`).
async fn on_local_cluster(
    repo: &Path,
    args: &TestOptions,
    lanes: Vec<Lane>,
    mut background: Option<&mut background::Background>,
    steps: &mut steps::Steps,
) -> Result<()> {
    let only_driver = args.lane == TestLane::Driver;
    // kind.yaml's nodes and settings, also when a kept cluster runs the workload lane.
    let cluster = local::LocalCluster::new(Some(local::default_node_count()?))?
        .with_overrides(Some(crate::overrides::Overrides::default()));
    // Stopped before: every step on it is listed as not run (each records itself so).
    let stopped = steps.skipped("local cluster up");
    if !stopped {
        let t = wait_for_build(background.as_deref_mut(), LOCAL_CLUSTER_BUILD, steps).await;
        let up = cluster.up(true).await.map(|_| ());
        let up_ok = up.is_ok();
        steps.record("local cluster up", up, t);
        if !up_ok {
            return down_unless_kept(&cluster, args, steps).await;
        }
    }
    let kubeconfig = cluster.kubeconfig();
    if !only_driver {
        default_lane(repo, &cluster, steps).await;
    }
    driver_lane::run(repo, &cluster, steps).await;
    for lane in lanes {
        restarted_lane(repo, &cluster, lane, background.as_deref_mut(), &kubeconfig, steps).await;
    }
    if stopped {
        return Ok(());
    }
    down_unless_kept(&cluster, args, steps).await
}

/// `cluster down`, which must leave nothing behind, unless `--keep-cluster`.
async fn down_unless_kept(
    cluster: &local::LocalCluster,
    args: &TestOptions,
    steps: &mut steps::Steps,
) -> Result<()> {
    if !args.keep_cluster {
        let t = StepStart::now();
        let down = async {
            cluster.down().await?;
            let left = cluster.leftovers();
            if !left.is_empty() {
                bail!("cluster down left: {}", left.join("; "));
            }
            Ok(())
        }
        .await;
        steps.record("local cluster down leaves nothing behind", down, t);
    }
    Ok(())
}

/// On the cluster as `cluster up` starts it: the cluster tests side by side, every spec but the
/// workload lane's, then the restart steps.
async fn default_lane(repo: &Path, cluster: &local::LocalCluster, steps: &mut steps::Steps) {
    let kubeconfig = cluster.kubeconfig();
    let tests = cluster_tests::cluster_tests();
    cluster_tests_step(repo, &tests.iter().collect::<Vec<_>>(), &kubeconfig, "", steps).await;
    let (name, suite) = suite_run(repo);
    steps.run(name, run_suite(repo, &kubeconfig, &suite)).await;
    let restart_test = restarts::cluster_test();
    cluster_tests_step(repo, &[&restart_test], &kubeconfig, "", steps).await;
    for run in restarts::restart_runs() {
        steps.run(run.name, restarts::run_with_restart(repo, cluster, &run)).await;
    }
}

/// The cluster tests `tests` side by side as one step (its name says what each took), `prefix`
/// before its name.
async fn cluster_tests_step(
    repo: &Path,
    tests: &[&cluster_tests::ClusterTest],
    kubeconfig: &Path,
    prefix: &str,
    steps: &mut steps::Steps,
) {
    let names: Vec<&str> = tests.iter().map(|t| t.short).collect();
    if steps.skipped(&format!("{prefix}cluster tests: {}", names.join(", "))) {
        return;
    }
    let t = StepStart::now();
    let (name, result) = cluster_tests::run_side_by_side(repo, tests, kubeconfig).await;
    steps.record(&format!("{prefix}{name}"), result, t);
}

/// A lane after the default one: the cluster restarted with its overrides (once its build is
/// done), its cluster tests, its suite run.
async fn restarted_lane(
    repo: &Path,
    cluster: &local::LocalCluster,
    lane: Lane,
    background: Option<&mut background::Background>,
    kubeconfig: &Path,
    steps: &mut steps::Steps,
) {
    if steps.skipped(lane.restart) {
        for test in &lane.cluster_tests {
            steps.skipped(test.name);
        }
        steps.skipped(lane.suite.0);
        return;
    }
    let t = match &lane.build {
        Some(build) => wait_for_build(background, build.key, steps).await,
        None => StepStart::now(),
    };
    let up = match lane_overrides(&lane) {
        Ok(overrides) => cluster.clone().with_overrides(Some(overrides)).up(false).await.map(|_| ()),
        Err(e) => Err(e),
    };
    let up_ok = up.is_ok();
    steps.record(lane.restart, up, t);
    if !up_ok {
        return;
    }
    if !lane.cluster_tests.is_empty() {
        cluster_tests_step(repo, &lane.cluster_tests.iter().collect::<Vec<_>>(), kubeconfig, "", steps).await;
    }
    let (name, suite) = &lane.suite;
    steps.run(name, run_suite(repo, kubeconfig, suite)).await;
}

/// The background build of the local cluster's binaries (`cluster build`), which the first
/// `cluster up` waits for.
const LOCAL_CLUSTER_BUILD: &str = "local-cluster";

fn local_cluster_build() -> background::Build {
    background::Build { key: LOCAL_CLUSTER_BUILD, what: "the local cluster's binaries".into(), args: vec![] }
}

/// Waits for the background build `key` (if it was queued) and returns the start of the step
/// that needed it, carrying the wait (the step table's `waited`). A failed build is a failed step
/// of its own (with its log's tail); the step after it then builds in the foreground.
async fn wait_for_build(
    background: Option<&mut background::Background>,
    key: &str,
    steps: &mut steps::Steps,
) -> StepStart {
    let t = StepStart::now();
    let Some(waited) = (match background {
        Some(background) => background.wait(key).await,
        None => None,
    }) else {
        return t;
    };
    match waited.result {
        Ok(()) => eprintln!("==> {} (waited {})", waited.name, human(waited.waited)),
        Err(e) => steps.record::<()>(&waited.name, Err(e), StepStart::now()),
    }
    t.waited(waited.waited)
}

/// The e2e suite run against the local cluster as `cluster up` starts it (kind.yaml's gates):
/// every registered spec but the workload lane's, in one run, so the parallel specs of every
/// context fill the slots around the `[Serial]` specs' chain and the run ends with one tail of
/// deferred observations instead of one per context (measured in docs/spec-time.md).
fn suite_run(repo: &Path) -> (&'static str, lane_run::SuiteRun) {
    (
        "e2e: every spec but the workload lane's (control plane, CRUD, kubelet, Node Allocatable, ...)",
        lane_suite(repo, &["--skip", WORKLOAD_FOCUS], "suites"),
    )
}

/// The workload lane's run: the specs that need PodGroups.
fn workload_run(repo: &Path) -> (&'static str, lane_run::SuiteRun) {
    ("e2e: workload lane (PodGroup specs)", lane_suite(repo, &["--focus", WORKLOAD_FOCUS], "workload"))
}

/// How many specs a lane on the local cluster runs at once. Its specs mostly wait on the
/// cluster: on 2 cores, warm, the kubelet lane took 3 min 45 s at 4 (the machine 50-60% busy)
/// and 2 min 45 s at 8 (70% busy), the other specs' lane 3 min 39 s and 3 min 15 s
/// (docs/spec-time.md).
pub(crate) const LANE_PROCS: &str = "8";

/// A lane's run of `selection`, [`LANE_PROCS`] at once, its reports `<stem>.xml` and
/// `<stem>.json` (`stem` also names the lane in docs/lanes.md's host skips).
fn lane_suite(repo: &Path, selection: &[&str], stem: &str) -> lane_run::SuiteRun {
    lane_run::SuiteRun::new(repo, selection, stem, LANE_PROCS)
}

/// Runs `suite` against the cluster of `kubeconfig` and judges it ([`lane_run`]): what ran,
/// counted, when it passed; a failed run's error names its failed specs.
async fn run_suite(repo: &Path, kubeconfig: &Path, suite: &lane_run::SuiteRun) -> Result<String> {
    let skips = host_skips::HostSkips::load(repo)?;
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let texts = lane_run::texts_version(repo, kubeconfig).await?;
    suite.run(&runner, kubeconfig, &texts).await?.judge(&skips)
}

/// Runs cargo in the workspace with extra environment.
fn cargo(repo: &Path, args: &[&str], env: &[(&str, &Path)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(&cargo)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.to_string(), PathBuf::from(v))))
        .current_dir(repo)
        .status()
        .with_context(|| format!("run {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(prefix: &str) -> Lane {
        lanes(&crate::repo::repo_root()).into_iter().find(|l| l.restart.contains(prefix)).unwrap()
    }

    #[test]
    fn long_reasons_are_clipped_on_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééé", 3), "é… (4 bytes more)");
    }

    #[test]
    fn the_kind_lane_runs_the_cluster_tests_that_do_not_read_the_local_cluster() {
        // What ties a cluster test to the local cluster: its node directories on this machine,
        // its node names.
        let local_only = ["DRA_E2E_LOCAL_STATE", "kind-worker"];
        for test in cluster_tests::cluster_tests() {
            let file = test.name.rsplit_once('(').unwrap().1.trim_end_matches(')');
            let source = std::fs::read_to_string(crate::repo::repo_root().join(file)).unwrap();
            let ties: Vec<_> = local_only.iter().filter(|m| source.contains(*m)).collect();
            assert_eq!(
                test.any_provider,
                ties.is_empty() && !file.starts_with("xtask/"),
                "{file}: any_provider is {} but it mentions {ties:?}",
                test.any_provider
            );
        }
    }

    #[test]
    fn the_skew_lane_runs_an_old_kubelet_beside_new_ones() {
        let lane = lane("skew lane");
        let overrides = lane_overrides(&lane).unwrap();
        assert_eq!(overrides.kubelet_flag(), "v1.34.4");
        assert!(overrides.feature_gates.is_empty() && overrides.runtime_config.is_empty());
        // An older minor than the cluster's, and the cluster keeps other workers at its version.
        let cluster = crate::common::kube_version::KubeVersion::new(1, 37, 2);
        let versions = crate::skew::node_versions(&cluster, 4, &[], &overrides.kubelet_versions).unwrap();
        assert!(versions[1].minor() < cluster.minor() && versions[2] == cluster && versions[3] == cluster);
        assert!(lane.cluster_tests.iter().any(|test| test.cargo_args.contains(&"skew::")));
        let args = &lane.suite.1.args;
        assert!(args.windows(2).any(|w| w == ["--focus", SKEW_FOCUS]), "{args:?}");
        assert!(args.windows(2).any(|w| w == ["--skip", SKEW_SKIP]), "{args:?}");
    }

    #[test]
    fn the_next_release_lanes_run_every_spec_at_that_release() {
        let all = lane("v1.38.0-beta.0 (the next release)");
        let overrides = lane_overrides(&all).unwrap();
        assert_eq!(overrides.k8s_version.map(|v| v.to_string()).as_deref(), Some(NEXT_RELEASE));
        assert!(overrides.feature_gates.is_empty() && overrides.kubelet_versions.is_empty());
        assert_eq!(all.suite.1.args[..2], ["--skip", WORKLOAD_FOCUS]);
        let workload = lane_overrides(&lane("v1.38.0-beta.0 for its workload lane")).unwrap();
        let default_workload = lane_overrides(&lane("for the workload lane")).unwrap();
        assert_eq!(
            workload,
            crate::overrides::Overrides {
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
        let workload = workload_run(repo).1.args;
        assert_eq!(default[..2], ["--skip", WORKLOAD_FOCUS]);
        assert_eq!(workload[..2], ["--focus", WORKLOAD_FOCUS]);
        for args in [&default, &workload] {
            assert!(!args[2..].iter().any(|a| a == "--focus" || a == "--skip"), "{args:?}");
        }
    }

    #[test]
    fn the_workload_lane_is_what_the_pod_group_specs_ask_for() {
        let lane = lane_overrides(&lane("workload lane")).unwrap();
        let specs =
            std::fs::read_to_string(crate::repo::repo_root().join("suites/src/specs/kubelet/pod_groups.rs"))
                .unwrap();
        let flags = format!("{lane}");
        assert!(specs.contains(&format!("\"{flags}\"")), "pod_groups.rs must name {flags:?} as LANE_FLAGS");
        assert!(lane.feature_gates["GenericWorkload"] && lane.feature_gates["DRAWorkloadResourceClaims"]);
    }

    #[test]
    fn every_host_skip_names_a_lane_of_the_run() {
        let repo = crate::repo::repo_root();
        let mut stems: Vec<String> = lanes(&repo).into_iter().map(|lane| lane.suite.1.stem).collect();
        stems.extend([suite_run(&repo).1.stem, kind_lane::JUNIT.to_owned()]);
        stems.extend(restarts::restart_runs().iter().map(|run| run.report.to_owned()));
        stems.extend(driver_lane::STEMS.map(String::from));
        let skips = host_skips::HostSkips::load(&repo).unwrap();
        assert!(!skips.rows.is_empty(), "{} documents no host skip", host_skips::DOC);
        for row in &skips.rows {
            for lane in &row.lanes {
                assert!(
                    stems.contains(lane),
                    "{}: no lane is `{lane}`; the lanes: {stems:?}",
                    host_skips::DOC
                );
            }
        }
    }
}
