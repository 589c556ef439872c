//! `cargo xtask test`: the project's own tests, what CI runs. Unit and protocol tests first, then
//! the local cluster comes up (with its registry, as `cluster up --registry`) and the cluster
//! tests and the e2e suites run against it, then the cluster goes down and must leave nothing
//! behind; then the kind lane ([`kind_lane`]) does the same on a kind cluster. Every step runs (a
//! failure does not hide the others' results) and a table of steps, outcomes and durations closes
//! the run. With `--partition M/N` ([`partition`]) a machine runs its share of those steps only,
//! with the set-up its share needs.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{e2e, local, progress::human, usage::UsageError};

mod background;
mod budget;
mod cluster_tests;
mod disk;
mod doc_table;
mod driver_lane;
pub(crate) mod host_skips;
pub(crate) mod kind_lane;
pub(crate) mod lane_run;
mod local_lanes;
pub(crate) mod partition;
pub(crate) mod report;
mod restart_exceptions;
mod restarts;
pub(crate) mod steps;
mod table;

pub use budget::StepStart;

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
    /// Run only this machine's share of a run split over machines (`--partition M/N`).
    pub partition: Option<partition::Partition>,
}

/// `text` cut to at most `max` bytes (on a character boundary), marked where it was cut.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}… ({} bytes more)", &text[..end], text.len() - end)
}

/// Refuses options that do not go together, each with one sentence.
fn check(args: &TestOptions) -> Result<(), UsageError> {
    if args.lane == TestLane::Kind && (args.no_cluster || args.keep_cluster) {
        return Err(UsageError::new(
            "--lane kind runs the kind lane only, whose cluster is always deleted: leave out --no-cluster and --keep-cluster",
        ));
    }
    if args.lane == TestLane::Driver && args.no_cluster {
        return Err(UsageError::new(
            "--lane driver runs the driver lane on the local cluster: leave out --no-cluster",
        ));
    }
    if args.partition.is_some() && (args.lane != TestLane::All || args.no_cluster) {
        return Err(UsageError::new(
            "--partition splits the whole run (every lane) over machines: leave out --lane and --no-cluster",
        ));
    }
    Ok(())
}

/// Runs the steps and prints the summary; the exit code is 130 after Ctrl-C, else 1 when a step
/// failed.
pub async fn run(args: TestOptions) -> Result<ExitCode> {
    check(&args)?;
    let share = partition::this_machine(args.partition);
    let repo = crate::repo::repo_root();
    let stop = steps::Stop::on_ctrl_c();
    let disk = disk::DiskWatch::start(&disk::paths(&repo), disk::FLOOR, stop.any.clone());
    eprintln!("==> {}", disk.describe());
    let mut steps = steps::Steps::new(stop, Some(disk));
    let local_lanes = !args.no_cluster && args.lane != TestLane::Kind && !share.local_lanes().is_empty();
    let kind_lane =
        !args.no_cluster && matches!(args.lane, TestLane::All | TestLane::Kind) && share.needs_kind();
    // `--lane driver`: the local cluster and the driver lane, nothing else.
    let only_driver = args.lane == TestLane::Driver;
    let lanes: Vec<local_lanes::Lane> = if only_driver {
        Vec::new()
    } else {
        local_lanes::lanes(&repo)
            .into_iter()
            .filter(|lane| share.local_lanes().contains(&lane.lane))
            .collect()
    };
    let mut kind = None;
    let mut background = None;
    // Everything the run builds for its clusters (the local cluster first, the kind node image
    // last) builds from the start, in the background at the least CPU priority: beside the unit
    // tests, then beside the lanes before the one that needs it, which mostly wait on the
    // cluster. The kind lane's engine starts first: the image is imported into it.
    if local_lanes || (kind_lane && args.partition.is_some()) {
        if args.lane == TestLane::All && kind_lane {
            kind = Some(kind_lane::prepare(&mut steps).await);
        }
        let image = kind.as_ref().is_some_and(kind_lane::KindLane::builds_image);
        let builds: Vec<_> =
            background_builds(&share, &lanes, image).into_iter().map(local_lanes::background_build).collect();
        let t = StepStart::now();
        let started = background::Background::start(&repo, builds);
        let ok = started.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}"));
        background = started.ok();
        steps.record("background builds started (SCHED_IDLE, least CPU weight)", ok, t);
    }
    if !matches!(args.lane, TestLane::Kind | TestLane::Driver) {
        if share.runs(partition::Unit::CargoTests) {
            steps
                .run("unit and protocol tests (cargo test --workspace)", async {
                    cargo(&repo, &["test", "--workspace"], &[])
                })
                .await;
        } else {
            // Beside the builds, before the first step that would compile it.
            steps
                .run(
                    "the workspace built for this machine's steps (cargo test --workspace --no-run)",
                    async { cargo(&repo, &["test", "--workspace", "--no-run"], &[]) },
                )
                .await;
        }
    }
    if local_lanes {
        on_local_cluster(&repo, &args, &share, lanes, background.as_mut(), &mut steps).await?;
    }
    // After the local cluster is down: two clusters at once do not fit two cores.
    if kind_lane {
        let lane = match kind {
            Some(lane) => Some(lane),
            None if steps.go_on() => Some(kind_lane::prepare(&mut steps).await),
            None => None,
        };
        match lane {
            Some(lane) => lane.run(&repo, &share, background.as_mut(), &mut steps).await,
            None => kind_lane::not_run(&mut steps),
        }
    }
    drop(background); // stops a build still running (after an interrupt)
    Ok(steps.finish())
}

/// What a machine builds in the background, in order: the local cluster's binaries when its
/// share's local lanes need them or the kind node image is built here (its Kubernetes binaries
/// are those), what the `lanes` it restarts into need, the kind node image when its kind lane
/// builds one here (not with `KIND_NODE_IMAGE`).
fn background_builds(
    share: &partition::Share,
    lanes: &[local_lanes::Lane],
    kind_image: bool,
) -> Vec<partition::ClusterBuild> {
    partition::ClusterBuild::ALL
        .into_iter()
        .filter(|build| match build {
            partition::ClusterBuild::LocalCluster => {
                kind_image || share.local_lanes().iter().any(|lane| lane.builds().contains(build))
            }
            partition::ClusterBuild::KindImage => kind_image,
            lane_build => lanes.iter().any(|lane| lane.lane.builds().contains(lane_build)),
        })
        .collect()
}

/// The local cluster's steps: up (as kind.yaml says, or straight into the share's first lane),
/// its cluster tests and lanes, down (also after a failure or an interrupt, unless
/// `--keep-cluster`).
async fn on_local_cluster(
    repo: &Path,
    args: &TestOptions,
    share: &partition::Share,
    lanes: Vec<local_lanes::Lane>,
    mut background: Option<&mut background::Background>,
    steps: &mut steps::Steps,
) -> Result<()> {
    let only_driver = args.lane == TestLane::Driver;
    // kind.yaml's nodes and settings, also when a kept cluster runs the workload lane.
    let cluster = local::LocalCluster::new(Some(local::default_node_count()?))?
        .with_overrides(Some(crate::overrides::Overrides::default()));
    let default = share.local_lanes().first() == Some(&partition::LocalLane::Default);
    let mut lanes = lanes.into_iter();
    let first = if default { None } else { lanes.next() };
    let up_step = first.as_ref().map_or("local cluster up", |lane| lane.up);
    // Stopped before: every step on it is listed as not run (each records itself so).
    let stopped = steps.skipped(up_step);
    if !stopped {
        let first_lane = first.as_ref().map_or(partition::LocalLane::Default, |lane| lane.lane);
        let t = wait_for_builds(background.as_deref_mut(), first_lane.builds(), steps).await;
        let up = match first.as_ref().map(local_lanes::Lane::overrides).transpose() {
            Ok(overrides) => {
                let up_cluster = cluster.clone().with_overrides(overrides);
                up_cluster.up(true).await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        let up_ok = up.is_ok();
        steps.record(up_step, up, t);
        if !up_ok {
            return down_unless_kept(&cluster, args, steps).await;
        }
    }
    let kubeconfig = cluster.kubeconfig();
    if default && !only_driver {
        default_lane(repo, share, &cluster, steps).await;
    }
    if default && share.runs(partition::Unit::Driver) {
        driver_lane::run(repo, &cluster, steps).await;
    }
    if let Some(lane) = first {
        lane_steps(repo, &lane, share, &kubeconfig, steps).await;
    }
    for lane in lanes {
        restarted_lane(repo, &cluster, lane, share, background.as_deref_mut(), &kubeconfig, steps).await;
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

/// On the cluster as `cluster up` starts it, what of it `share` runs: the cluster tests side by
/// side, every spec but the workload lane's, then the restart steps.
async fn default_lane(
    repo: &Path,
    share: &partition::Share,
    cluster: &local::LocalCluster,
    steps: &mut steps::Steps,
) {
    let kubeconfig = cluster.kubeconfig();
    if share.runs(partition::Unit::ClusterTests) {
        let tests = cluster_tests::cluster_tests();
        cluster_tests_step(repo, &tests.iter().collect::<Vec<_>>(), &kubeconfig, "", steps).await;
    }
    if share.runs(partition::Unit::Suites) {
        let (name, suite) = local_lanes::suite_run(repo);
        let slice = share.slice(partition::Unit::Suites);
        steps.run(&sliced(name, slice), run_suite(repo, &kubeconfig, &suite.sliced(slice))).await;
    }
    if share.runs(partition::Unit::RestartTest) {
        let restart_test = restarts::cluster_test();
        cluster_tests_step(repo, &[&restart_test], &kubeconfig, "", steps).await;
    }
    for run in restarts::restart_runs().iter().filter(|run| share.runs(run.unit)) {
        steps.run(run.name, restarts::run_with_restart(repo, cluster, run)).await;
    }
}

/// A suite run's step name, with the slice of its specs it runs if it runs one.
fn sliced(name: &str, slice: Option<partition::Slice>) -> String {
    match slice {
        Some(slice) => format!("{name}, slice {slice} of its specs"),
        None => name.to_owned(),
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

/// A lane after the default one: the cluster restarted with its overrides (once its builds are
/// done), then its steps.
async fn restarted_lane(
    repo: &Path,
    cluster: &local::LocalCluster,
    lane: local_lanes::Lane,
    share: &partition::Share,
    background: Option<&mut background::Background>,
    kubeconfig: &Path,
    steps: &mut steps::Steps,
) {
    if steps.skipped(lane.restart) {
        lane_not_run(&lane, share, steps);
        return;
    }
    let t = wait_for_builds(background, lane.lane.builds(), steps).await;
    let up = match lane.overrides() {
        Ok(overrides) => cluster.clone().with_overrides(Some(overrides)).up(false).await.map(|_| ()),
        Err(e) => Err(e),
    };
    let up_ok = up.is_ok();
    steps.record(lane.restart, up, t);
    if !up_ok {
        lane_not_run(&lane, share, steps);
        return;
    }
    lane_steps(repo, &lane, share, kubeconfig, steps).await;
}

/// Records the steps of `lane` that `share` runs as not run: the run was stopped, or the
/// cluster's restart into the lane failed.
fn lane_not_run(lane: &local_lanes::Lane, share: &partition::Share, steps: &mut steps::Steps) {
    if let Some((unit, test)) = &lane.cluster_tests
        && share.runs(*unit)
    {
        steps.not_run(test.name);
    }
    let (unit, name, _) = &lane.suite;
    if share.runs(*unit) {
        steps.not_run(&sliced(name, share.slice(*unit)));
    }
}

/// What of a lane after the default one `share` runs, on its cluster: its cluster tests, its
/// suite run.
async fn lane_steps(
    repo: &Path,
    lane: &local_lanes::Lane,
    share: &partition::Share,
    kubeconfig: &Path,
    steps: &mut steps::Steps,
) {
    if let Some((unit, test)) = &lane.cluster_tests
        && share.runs(*unit)
    {
        cluster_tests_step(repo, &[test], kubeconfig, "", steps).await;
    }
    let (unit, name, suite) = &lane.suite;
    if share.runs(*unit) {
        let slice = share.slice(*unit);
        let suite = suite.clone().sliced(slice);
        steps.run(&sliced(name, slice), run_suite(repo, kubeconfig, &suite)).await;
    }
}

/// Waits for the background builds `builds` (those that were queued and not waited for yet) and
/// returns the start of the step that needed them, carrying the wait (the step table's
/// `waited`). A failed build is a failed step of its own (with its log's tail); the step after
/// it then builds in the foreground.
async fn wait_for_builds(
    mut background: Option<&mut background::Background>,
    builds: &[partition::ClusterBuild],
    steps: &mut steps::Steps,
) -> StepStart {
    let t = StepStart::now();
    let mut total = Duration::ZERO;
    for build in builds {
        let Some(waited) = (match background.as_deref_mut() {
            Some(background) => background.wait(build.key()).await,
            None => None,
        }) else {
            continue;
        };
        match waited.result {
            Ok(()) => eprintln!("==> {} (waited {})", waited.name, human(waited.waited)),
            Err(e) => steps.record::<()>(&waited.name, Err(e), StepStart::now()),
        }
        total += waited.waited;
    }
    t.waited(total)
}

/// How many specs a lane on the local cluster runs at once. Its specs mostly wait on the
/// cluster: on 2 cores, warm, the kubelet lane took 3 min 45 s at 4 (the machine 50-60% busy)
/// and 2 min 45 s at 8 (70% busy), the other specs' lane 3 min 39 s and 3 min 15 s
/// (docs/spec-time.md).
pub(crate) const LANE_PROCS: &str = "8";

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
    let status = crate::repo::cargo_command(repo)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.to_string(), PathBuf::from(v))))
        .status()
        .with_context(|| format!("run {} {}", crate::repo::cargo_program(), args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{
        partition::{ClusterBuild, Partition, Share, Slice, Unit},
        *,
    };

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
    fn a_partition_goes_with_the_whole_run_only() {
        let partition = Some(Partition { machine: 1, machines: 2 });
        check(&TestOptions { partition, ..TestOptions::default() }).unwrap();
        check(&TestOptions { partition, keep_cluster: true, ..TestOptions::default() }).unwrap();
        for refused in [
            TestOptions { partition, lane: TestLane::Local, ..TestOptions::default() },
            TestOptions { partition, lane: TestLane::Kind, ..TestOptions::default() },
            TestOptions { partition, no_cluster: true, ..TestOptions::default() },
        ] {
            let err = check(&refused).unwrap_err().to_string();
            assert_eq!(
                err,
                "--partition splits the whole run (every lane) over machines: leave out --lane and --no-cluster"
            );
        }
    }

    #[test]
    fn a_machine_builds_what_its_share_needs_only() {
        let repo = Path::new("/repo");
        let lanes = |share: &Share| -> Vec<local_lanes::Lane> {
            local_lanes::lanes(repo).into_iter().filter(|l| share.local_lanes().contains(&l.lane)).collect()
        };
        // Unsplit: everything, in the order the lanes need it; the driver lane alone: the
        // local cluster's binaries.
        let everything = Share::everything();
        assert_eq!(background_builds(&everything, &lanes(&everything), true), ClusterBuild::ALL);
        assert_eq!(background_builds(&everything, &[], false), [ClusterBuild::LocalCluster]);
        for machines in 1..=partition::MAX_MACHINES {
            for share in partition::plan::plan(machines).shares {
                let builds = background_builds(&share, &lanes(&share), share.needs_kind());
                assert_eq!(builds, share.builds(), "{}", share.describe_units());
                // A kind node image pulled (KIND_NODE_IMAGE): no build of it or for it.
                let pulled = background_builds(&share, &lanes(&share), false);
                assert!(!pulled.contains(&ClusterBuild::KindImage));
                let local =
                    share.local_lanes().iter().any(|l| l.builds().contains(&ClusterBuild::LocalCluster));
                assert_eq!(pulled.contains(&ClusterBuild::LocalCluster), local, "{}", share.describe_units());
                assert_eq!(builds.contains(&ClusterBuild::KindImage), share.needs_kind());
                let next = share.runs(Unit::NextRelease) || share.runs(Unit::NextReleaseWorkload);
                assert_eq!(builds.contains(&ClusterBuild::NextRelease), next, "{}", share.describe_units());
            }
        }
    }

    #[test]
    fn a_sliced_step_says_its_slice() {
        assert_eq!(sliced("e2e: x", None), "e2e: x");
        assert_eq!(sliced("e2e: x", Some(Slice { index: 2, total: 3 })), "e2e: x, slice 2/3 of its specs");
    }

    #[test]
    fn every_host_skip_names_a_lane_of_the_run() {
        let repo = crate::repo::repo_root();
        let mut stems: Vec<String> =
            local_lanes::lanes(&repo).into_iter().map(|lane| lane.suite.2.stem).collect();
        stems.extend([local_lanes::suite_run(&repo).1.stem, kind_lane::JUNIT.to_owned()]);
        stems.extend(restarts::restart_runs().iter().map(|run| run.report.to_owned()));
        stems.extend(driver_lane::STEMS.map(String::from));
        stems.extend(driver_lane::UPSTREAM_STEMS.map(String::from));
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
