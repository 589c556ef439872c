//! What the planner knows of each step's cost: the step table of the last cold run of
//! `.ci/run` in docs/results.md ([`FIGURES_OF`]: a fresh 2-core machine, every cache cold), one
//! row per step with its wall time, the time it waited for a background build, and what it is
//! to the plan ([`Part`]: a unit of work, or a machine's own set-up). A test keeps every row
//! equal to that table. The builds' own times are not rows of it; they are derived from it
//! ([`build`]), as is the workspace's compile ([`compile`]).

use std::time::Duration;

use super::{ClusterBuild, LocalLane, Unit};

/// The section of docs/results.md whose step table these are (its heading's start).
pub(crate) const FIGURES_OF: &str = "2026-12-07, night";

/// What a step is to the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// Part of a unit of work, run by one machine.
    Work(Unit),
    /// The kind lane's own Docker engine started or stopped.
    KindEngine,
    /// The background builds started.
    BuildsStarted,
    /// The local cluster's first `cluster up` (with its registry), including its wait for the
    /// build.
    LocalUp,
    /// The local cluster restarted into a lane.
    Restart(LocalLane),
    /// The local cluster taken down.
    LocalDown,
    /// The wait for the kind node image.
    KindImageWait,
    /// The kind cluster up.
    KindUp,
    /// The kind cluster down.
    KindDown,
}

/// One row of the measured step table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    /// The step's name as the table prints it, or its start where the rest counts what ran.
    #[cfg_attr(not(test), allow(dead_code, reason = "the test that keeps the rows true reads it"))]
    pub step: &'static str,
    /// Its wall time, in milliseconds (as printed: tenths of a second below a minute).
    pub millis: u64,
    /// How long of it the step waited for a background build, in milliseconds.
    pub waited_millis: u64,
    /// What it is to the plan.
    pub part: Part,
}

const fn row(step: &'static str, millis: u64, waited_millis: u64, part: Part) -> Measured {
    Measured { step, millis, waited_millis, part }
}

use LocalLane as L;
use Part::Work;
use Unit as U;

/// The step table of [`FIGURES_OF`], in its order.
#[rustfmt::skip]
pub(crate) const STEPS: [Measured; 31] = [
    row("kind lane: the run's own Docker engine (unless DOCKER_HOST names one)", 600, 0, Part::KindEngine),
    row("background builds started (SCHED_IDLE, least CPU weight)", 0, 0, Part::BuildsStarted),
    row("unit and protocol tests (cargo test --workspace)", 275_000, 0, Work(U::CargoTests)),
    row("local cluster up", 580_000, 488_000, Part::LocalUp),
    row("cluster tests side by side", 141_000, 0, Work(U::ClusterTests)),
    row("e2e: every spec but the workload lane's", 251_000, 0, Work(U::Suites)),
    row("restart cluster test", 69_000, 0, Work(U::RestartTest)),
    row("e2e: kubelet suites, kind-worker's kubelet restarted 50 s in", 158_000, 0, Work(U::RestartKubelet)),
    row("e2e: control plane suites, the API server killed and restarted 5 s in", 19_900, 0, Work(U::RestartApiserver)),
    row("driver lane: the example driver deployed as a DaemonSet", 5_100, 0, Work(U::Driver)),
    row("e2e: driver lane, the example driver as a vendor runs it (--driver)", 53_500, 0, Work(U::Driver)),
    row("e2e: driver lane, interposed (--driver --interpose)", 65_000, 0, Work(U::Driver)),
    row("e2e: driver lane, after kind-worker's kubelet restarted", 13_300, 0, Work(U::Driver)),
    row("e2e: driver lane, a driver that skips unprepare is caught", 25_200, 0, Work(U::Driver)),
    row("driver lane: the example driver removed", 8_100, 0, Work(U::Driver)),
    row("local cluster restarted for the workload lane (GenericWorkload)", 13_900, 0, Part::Restart(L::Workload)),
    row("e2e: workload lane (PodGroup specs)", 35_700, 0, Work(U::Workload)),
    row("local cluster restarted for the skew lane (kind-worker's kubelet v1.34.4)", 11_800, 0, Part::Restart(L::Skew)),
    row("skew cluster tests (harness/tests/cluster/skew.rs)", 40_100, 0, Work(U::SkewTests)),
    row("e2e: skew lane (kubelet suites, kind-worker at v1.34.4)", 143_000, 0, Work(U::Skew)),
    row("local cluster restarted at Kubernetes v1.38.0-beta.0 (the next release)", 15_600, 2_500, Part::Restart(L::NextRelease)),
    row("e2e: v1.38.0-beta.0 lane (every spec but the workload lane's)", 267_000, 0, Work(U::NextRelease)),
    row("local cluster restarted at v1.38.0-beta.0 for its workload lane", 12_100, 0, Part::Restart(L::NextReleaseWorkload)),
    row("e2e: v1.38.0-beta.0 workload lane (PodGroup specs)", 36_200, 0, Work(U::NextReleaseWorkload)),
    row("local cluster down leaves nothing behind", 1_500, 0, Part::LocalDown),
    row("the kind node image built in the background in", 118_000, 118_000, Part::KindImageWait),
    row("kind cluster up (kind.yaml; the node image built here unless KIND_NODE_IMAGE)", 74_000, 0, Part::KindUp),
    row("kind: cluster tests side by side", 139_000, 0, Work(U::KindTests)),
    row("e2e on kind: every kubelet spec (--focus kubelet)", 224_000, 0, Work(U::Kind)),
    row("kind cluster down leaves no container, network or kubeconfig", 4_900, 0, Part::KindDown),
    row("kind lane: the run's own Docker engine stopped", 1_100, 0, Part::KindEngine),
];

/// The run's total as the table's `all steps` row printed it.
#[cfg(test)]
pub(crate) const ALL_STEPS_MILLIS: u64 = 2_808_000;

/// How long the kind node image took in the background, as its row's name says.
pub(crate) const KIND_IMAGE_BUILD_MILLIS: u64 = 448_000;

/// The unit and protocol tests warm (docs/results.md, 2026-12-06, night: 1m24s): what of the
/// cold step is the tests' own time rather than the workspace's compile.
pub(crate) const UNIT_TESTS_WARM_MILLIS: u64 = 84_000;

/// The old kubelet's and the next release's builds, each in the background on a cold machine
/// (docs/results.md, 2026-12-04, later: 5m29s and 9m50s): how the two share the time the cold
/// run's table gives them together.
pub(crate) const SKEW_AND_NEXT_RELEASE_RATIO: (u64, u64) = (329, 590);

fn millis(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// The sum of the rows `part` matches.
fn sum(part: impl Fn(Part) -> bool) -> Duration {
    STEPS.iter().filter(|r| part(r.part)).map(|r| millis(r.millis)).sum()
}

/// The sum of the rows `part` matches, without their waits for a background build.
fn sum_unwaited(part: impl Fn(Part) -> bool) -> Duration {
    STEPS.iter().filter(|r| part(r.part)).map(|r| millis(r.millis - r.waited_millis)).sum()
}

/// When the row `part` matches first started, counted from the run's start (the steps run one
/// after another, in the table's order), and how long it waited.
fn start_of(part: Part) -> (Duration, Duration) {
    let at = STEPS.iter().position(|r| r.part == part).unwrap_or(STEPS.len());
    let start = STEPS[..at].iter().map(|r| millis(r.millis)).sum();
    (start, STEPS.get(at).map(|r| millis(r.waited_millis)).unwrap_or_default())
}

/// A unit's wall time (all its rows), whole.
pub(crate) fn unit(unit: Unit) -> Duration {
    sum(|p| p == Part::Work(unit))
}

/// The workspace's compile before a machine's first step that builds with cargo: the cold unit
/// tests' step less the tests' own time.
pub(crate) fn compile() -> Duration {
    unit(Unit::CargoTests).saturating_sub(millis(UNIT_TESTS_WARM_MILLIS))
}

/// The first `cluster up` of a machine's local cluster, without its wait for the build.
pub(crate) fn local_up() -> Duration {
    sum_unwaited(|p| p == Part::LocalUp)
}

/// The local cluster restarted into `lane`, without a wait for its build.
pub(crate) fn restart(lane: LocalLane) -> Duration {
    sum_unwaited(|p| p == Part::Restart(lane))
}

/// The local cluster taken down.
pub(crate) fn local_down() -> Duration {
    sum(|p| p == Part::LocalDown)
}

/// The kind lane's own set-up and tear-down: its engine started and stopped, its cluster up and
/// down (its node image's wait apart).
pub(crate) fn kind_fixed() -> Duration {
    sum(|p| matches!(p, Part::KindEngine | Part::KindUp | Part::KindDown))
}

/// A build's wall time in the background, derived from the cold run: the local cluster's
/// binaries from the builds' start until the first `cluster up` stopped waiting for them; the
/// old kubelet and the next release together from then until the next release's restart
/// stopped waiting, shared as [`SKEW_AND_NEXT_RELEASE_RATIO`]; the kind node image as its row
/// says.
pub(crate) fn build(build: ClusterBuild) -> Duration {
    let (builds_started, _) = start_of(Part::BuildsStarted);
    let (up, up_waited) = start_of(Part::LocalUp);
    let local = (up + up_waited).saturating_sub(builds_started);
    let (next_restart, next_waited) = start_of(Part::Restart(LocalLane::NextRelease));
    let both = (next_restart + next_waited).saturating_sub(builds_started + local);
    let (skew, next) = SKEW_AND_NEXT_RELEASE_RATIO;
    let share = |part: u64| both.mul_f64(part as f64 / (skew + next) as f64);
    match build {
        ClusterBuild::LocalCluster => local,
        ClusterBuild::SkewKubelet => share(skew),
        ClusterBuild::NextRelease => share(next),
        ClusterBuild::KindImage => millis(KIND_IMAGE_BUILD_MILLIS),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::progress::human;

    /// The step table of the section of docs/results.md that starts with `heading`: per line,
    /// the step (name and counts) and the columns after it.
    fn results_table(heading: &str) -> Vec<String> {
        let results = std::fs::read_to_string(crate::repo::repo_root().join("docs/results.md")).unwrap();
        let section = results
            .split("\n## ")
            .find(|s| s.starts_with(heading))
            .unwrap_or_else(|| panic!("docs/results.md has no section \"## {heading}…\""));
        let block = section.split("```text\n").nth(1).and_then(|b| b.split("```").next());
        let block = block.unwrap_or_else(|| panic!("the section {heading} has no ```text step table"));
        block.lines().skip(1).map(String::from).collect()
    }

    /// A table line's `time` and `waited` columns (`{:>8} {:>8} {:>8} {:>8} {:>9}` after the
    /// step, then `  result` but on the totals' line).
    fn columns(line: &str) -> (String, String) {
        let body = match line.rsplit_once("  ") {
            Some((body, _result)) if !line.starts_with("all steps") => body,
            _ => line,
        };
        let at =
            |from: usize, width: usize| body[body.len() - from..body.len() - from + width].trim().to_owned();
        (at(46, 9), at(19, 9))
    }

    #[test]
    fn every_figure_is_the_cold_run_s_in_docs_results_md() {
        let lines = results_table(FIGURES_OF);
        let steps: Vec<&String> =
            lines.iter().filter(|l| !l.starts_with("all steps") && !l.contains(" steps, ")).collect();
        assert_eq!(steps.len(), STEPS.len(), "the table has {} steps: {steps:#?}", steps.len());
        for (line, row) in steps.iter().zip(STEPS) {
            assert!(line.starts_with(row.step), "the table's step {line:?} is not {:?}", row.step);
            let (time, waited) = columns(line);
            assert_eq!(time, human(millis(row.millis)), "{}", row.step);
            let waited_here = if row.waited_millis == 0 && waited.is_empty() {
                String::new()
            } else {
                human(millis(row.waited_millis))
            };
            assert_eq!(waited, waited_here, "{}", row.step);
        }
        let image = STEPS.iter().find(|r| r.part == Part::KindImageWait).unwrap();
        let line = steps.iter().find(|l| l.starts_with(image.step)).unwrap();
        assert!(
            line.starts_with(&format!("{} {} ", image.step, human(millis(KIND_IMAGE_BUILD_MILLIS)))),
            "{line}"
        );
        let all = lines.iter().find(|l| l.starts_with("all steps")).unwrap();
        assert_eq!(columns(all).0, human(millis(ALL_STEPS_MILLIS)));
        // The rows add up to the run's total but for the moments between steps (5.4 s less
        // here), and each is printed to the second or the tenth.
        let total: u64 = STEPS.iter().map(|r| r.millis).sum();
        assert!(
            total <= ALL_STEPS_MILLIS && ALL_STEPS_MILLIS - total < 10_000,
            "the rows add up to {total} ms"
        );
    }

    #[test]
    fn every_unit_has_measured_steps() {
        for unit in Unit::ALL {
            assert!(self::unit(unit) > Duration::ZERO, "{unit:?} has no row");
        }
        for lane in &LocalLane::ALL[1..] {
            assert!(restart(*lane) > Duration::ZERO, "{lane:?} has no restart row");
        }
    }

    #[test]
    fn the_builds_are_derived_from_the_cold_run() {
        // The local cluster's build ran from the run's start beside the unit tests until the
        // first `cluster up` stopped waiting: 0.6 + 275 + 488 s.
        assert_eq!(build(ClusterBuild::LocalCluster), millis(763_000));
        let both = build(ClusterBuild::SkewKubelet) + build(ClusterBuild::NextRelease);
        assert!(build(ClusterBuild::SkewKubelet) < build(ClusterBuild::NextRelease));
        // From the local build's end until the v1.38 restart (1909.2 s in) stopped waiting (2.5 s).
        assert_eq!(both.as_millis(), 1_909_200 + 2_500 - 763_600);
        assert_eq!(compile(), millis(191_000));
        assert_eq!(local_up(), millis(92_000));
    }
}
