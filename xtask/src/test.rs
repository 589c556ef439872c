//! `cargo xtask test`: the project's own tests, what CI runs. Unit and protocol tests first, then
//! the local cluster comes up (with its registry, as `cluster up --registry`) and the cluster
//! tests and the e2e suites run against it, then the cluster goes down and must leave nothing
//! behind; then the kind lane ([`kind_lane`]) does the same on a kind cluster. Every step runs (a
//! failure does not hide the others' results) and a table of steps, outcomes and durations closes
//! the run.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use anyhow::{Context, Result, bail};

use crate::{e2e, local, overrides::OverrideArgs, progress::human};

mod background;
mod budget;
mod cluster_tests;
mod disk;
mod driver_lane;
pub(crate) mod kind_lane;
pub(crate) mod report;
mod restarts;
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
    /// Cluster tests (cargo test arguments) run first.
    cluster_tests: Vec<(&'static str, Vec<&'static str>)>,
    /// The suite run: step name and dra-e2e arguments.
    suite: (&'static str, Vec<String>),
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
            cluster_tests: vec![(
                "skew cluster tests (harness/tests/cluster/skew.rs)",
                vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "skew::"],
            )],
            suite: (
                "e2e: skew lane (kubelet suites, kind-worker at v1.34.4)",
                suite_args(repo, &["--focus", SKEW_FOCUS, "--skip", SKEW_SKIP], "skew"),
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
                suite_args(repo, &["--skip", WORKLOAD_FOCUS], "next-release"),
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
                suite_args(repo, &["--focus", WORKLOAD_FOCUS], "next-release-workload"),
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

/// Runs the steps and prints the summary.
pub async fn run(args: TestOptions) -> Result<ExitCode> {
    let repo = crate::repo::repo_root();
    let interrupted = interrupt_flag();
    let disk = disk::DiskWatch::start(&disk::paths(&repo), disk::FLOOR, interrupted.clone());
    let mut outcomes = Vec::new();
    let mut step = |name: &str, result: Result<()>, started: StepStart| {
        if let Err(e) = &result {
            eprintln!("==> step failed: {name}: {e:#}");
        }
        let (cost, lowest_free) = (started.cost(), disk.take_lowest());
        outcomes.push(table::Outcome { name: name.to_string(), result, cost, lowest_free });
    };

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
    eprintln!("==> {}", disk.describe());
    let go_on = || !interrupted.load(Ordering::SeqCst);
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
            kind = Some(kind_lane::prepare(&mut step).await);
        }
        let builds: Vec<_> = std::iter::once(local_cluster_build())
            .chain(lanes.iter().filter_map(|lane| lane.build.clone()))
            .chain(kind.as_ref().and_then(kind_lane::KindLane::image_build))
            .collect();
        let t = StepStart::now();
        let started = background::Background::start(&repo, builds);
        let ok = started.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}"));
        background = started.ok();
        step("background builds started (SCHED_IDLE, least CPU weight)", ok, t);
    }
    if !matches!(args.lane, TestLane::Kind | TestLane::Driver) {
        let t = StepStart::now();
        step(
            "unit and protocol tests (cargo test --workspace)",
            cargo(&repo, &["test", "--workspace"], &[]),
            t,
        );
    }

    if local_lanes && go_on() {
        let t = wait_for_build(background.as_mut(), LOCAL_CLUSTER_BUILD, &mut step).await;
        // kind.yaml's nodes and settings, also when a kept cluster runs the workload lane.
        let cluster = local::LocalCluster::new(Some(local::default_node_count()?))?
            .with_overrides(Some(crate::overrides::Overrides::default()));
        let up = cluster.up(true).await.map(|_| ());
        let up_ok = up.is_ok();
        step("local cluster up", up, t);
        if up_ok {
            let kubeconfig = cluster.kubeconfig();
            if go_on() && !only_driver {
                let t = StepStart::now();
                let tests = cluster_tests::cluster_tests();
                let (name, result) =
                    cluster_tests::run_side_by_side(&repo, &tests.iter().collect::<Vec<_>>(), &kubeconfig)
                        .await;
                step(&name, result, t);
            }
            if go_on() && !only_driver {
                let (name, suite_args) = suite_run(&repo);
                let t = StepStart::now();
                step(name, run_suite(&repo, &kubeconfig, &suite_args).await, t);
            }
            if go_on() && !only_driver {
                let t = StepStart::now();
                let (cmd, restart) = restarts::cluster_test();
                let result = cargo(
                    &repo,
                    &cmd,
                    &[
                        ("DRA_E2E_KUBECONFIG", kubeconfig.as_path()),
                        ("DRA_E2E_RESTART_KUBELET", Path::new(&restart)),
                    ],
                );
                step(
                    "restart cluster test: a kubelet restarted under a running pod (harness/tests/cluster/restart.rs)",
                    result,
                    t,
                );
            }
            let restart_runs = if only_driver { Vec::new() } else { restarts::restart_runs() };
            for run in restart_runs.iter().take_while(|_| go_on()) {
                let t = StepStart::now();
                step(run.name, restarts::run_with_restart(&repo, &cluster, run).await, t);
            }
            if go_on() {
                driver_lane::run(&repo, &cluster, &mut step).await;
            }
            for lane in lanes.into_iter().take_while(|_| go_on()) {
                let t = match &lane.build {
                    Some(build) => wait_for_build(background.as_mut(), build.key, &mut step).await,
                    None => StepStart::now(),
                };
                let up = match lane_overrides(&lane) {
                    Ok(overrides) => {
                        cluster.clone().with_overrides(Some(overrides)).up(false).await.map(|_| ())
                    }
                    Err(e) => Err(e),
                };
                let up_ok = up.is_ok();
                step(lane.restart, up, t);
                if !up_ok {
                    continue;
                }
                for (name, cmd) in lane.cluster_tests.iter().take_while(|_| go_on()) {
                    let t = StepStart::now();
                    let result = cargo(&repo, cmd, &[("DRA_E2E_KUBECONFIG", kubeconfig.as_path())]);
                    step(name, result, t);
                }
                if !go_on() {
                    break;
                }
                let t = StepStart::now();
                let (name, suite_args) = &lane.suite;
                step(name, run_suite(&repo, &kubeconfig, suite_args).await, t);
            }
        }
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
            step("local cluster down leaves nothing behind", down, t);
        }
    }
    // After the local cluster is down: two clusters at once do not fit two cores.
    if !args.no_cluster && matches!(args.lane, TestLane::All | TestLane::Kind) && (kind.is_some() || go_on())
    {
        let lane = match kind {
            Some(lane) => lane,
            None => kind_lane::prepare(&mut step).await,
        };
        lane.run(&repo, &interrupted, background.as_mut(), &mut step).await;
    }
    drop(background); // stops a build still running (after an interrupt)
    if let Some(why) = disk.fell_below_floor() {
        step("the disk kept its floor of free space", Err(anyhow::anyhow!("{why}")), StepStart::now());
    }
    if !go_on() {
        eprintln!("==> interrupted: the steps after the one that was running did not run");
    }

    eprint!("\n{}", table::step_table(&outcomes));
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    eprintln!("{} steps, {failed} failed", outcomes.len());
    // Again after the table: CI's log keeps the end of the output, where the reason belongs.
    for outcome in &outcomes {
        if let Err(e) = &outcome.result {
            eprintln!("failed: {}: {}", outcome.name, clip(&format!("{e:#}"), 2000));
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
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
    step: &mut impl FnMut(&str, Result<()>, StepStart),
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
        Err(e) => step(&waited.name, Err(e), StepStart::now()),
    }
    t.waited(waited.waited)
}

/// Set once Ctrl-C (SIGINT) reaches the run. The step that is running gets it too (same process
/// group) and ends; no further step starts, and the clusters the run made are taken down.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("==> interrupted: finishing the running step, then taking the clusters down");
            set.store(true, Ordering::SeqCst);
        }
    });
    flag
}

/// The e2e suite run against the local cluster as `cluster up` starts it (kind.yaml's gates):
/// every registered spec but the workload lane's, in one run, so the parallel specs of every
/// context fill the slots around the `[Serial]` specs' chain and the run ends with one tail of
/// deferred observations instead of one per context (measured in docs/spec-time.md).
fn suite_run(repo: &Path) -> (&'static str, Vec<String>) {
    (
        "e2e: every spec but the workload lane's (control plane, CRUD, kubelet, Node Allocatable, ...)",
        suite_args(repo, &["--skip", WORKLOAD_FOCUS], "suites"),
    )
}

/// The workload lane's run: the specs that need PodGroups.
fn workload_run(repo: &Path) -> (&'static str, Vec<String>) {
    ("e2e: workload lane (PodGroup specs)", suite_args(repo, &["--focus", WORKLOAD_FOCUS], "workload"))
}

/// How many specs a lane on the local cluster runs at once. Its specs mostly wait on the
/// cluster: on 2 cores, warm, the kubelet lane took 3 min 45 s at 4 (the machine 50-60% busy)
/// and 2 min 45 s at 8 (70% busy), the other specs' lane 3 min 39 s and 3 min 15 s
/// (docs/spec-time.md).
pub(crate) const LANE_PROCS: &str = "8";

/// dra-e2e's arguments for one lane: the selection, [`LANE_PROCS`] at once, its JUnit and JSON
/// reports (`<junit>.xml`, `<junit>.json`) and the artifacts.
fn suite_args(repo: &Path, selection: &[&str], junit: &str) -> Vec<String> {
    suite_args_with(repo, selection, junit, LANE_PROCS)
}

/// [`suite_args`] with `procs` specs at once.
fn suite_args_with(repo: &Path, selection: &[&str], junit: &str, procs: &str) -> Vec<String> {
    let out = e2e::target_dir(repo).join("e2e");
    let artifacts = out.join("artifacts").display().to_string();
    let json = report::path(repo, junit).display().to_string();
    let junit = out.join(format!("{junit}.xml")).display().to_string();
    let mut args: Vec<String> = selection.iter().map(|s| s.to_string()).collect();
    args.extend(
        ["-p", procs, "--junit", &junit, report::FLAG, &json, "--artifacts", &artifacts].map(String::from),
    );
    args
}

/// Runs dra-e2e with `args`; a failed run's error names its failed specs (from its JSON report).
async fn run_suite(repo: &Path, kubeconfig: &Path, args: &[String]) -> Result<()> {
    let runner = e2e::build_runner(repo, e2e::Build::SameAsTests)?;
    let code = e2e::run_runner(&runner, kubeconfig, args).await?;
    if code != 0 {
        match report::named_in(args) {
            Some(json) => bail!("dra-e2e exited with {code}: {}", report::why_failed(&json)),
            None => bail!("dra-e2e exited with {code}"),
        }
    }
    Ok(())
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
        assert!(lane.cluster_tests.iter().any(|(_, cmd)| cmd.contains(&"skew::")));
        let args = &lane.suite.1;
        assert!(args.windows(2).any(|w| w == ["--focus", SKEW_FOCUS]), "{args:?}");
        assert!(args.windows(2).any(|w| w == ["--skip", SKEW_SKIP]), "{args:?}");
    }

    #[test]
    fn the_next_release_lanes_run_every_spec_at_that_release() {
        let all = lane("v1.38.0-beta.0 (the next release)");
        let overrides = lane_overrides(&all).unwrap();
        assert_eq!(overrides.k8s_version.map(|v| v.to_string()).as_deref(), Some(NEXT_RELEASE));
        assert!(overrides.feature_gates.is_empty() && overrides.kubelet_versions.is_empty());
        assert_eq!(all.suite.1[..2], ["--skip", WORKLOAD_FOCUS]);
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
        let (_, default) = suite_run(repo);
        let (_, workload) = workload_run(repo);
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
}
