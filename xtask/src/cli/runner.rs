//! The command lines that run `dra-e2e`: `cargo xtask e2e` and `cargo xtask bench suites`. Each
//! flattens spec-runner's [`RunnerArgs`], so clap checks every flag of the runner (its name, its
//! value, its conflicts) before anything is built or started, and `--help` lists them with the
//! runner's own help.
//!
//! What clap cannot check alone, [`finish_e2e`] and [`finish_suites`] do: the `--focus`/`--skip`
//! regexes and the label filter, the place of `cleanup`, the bench's own report. They also cut
//! out the runner's command line: the tokens after the subcommand as they were given, without
//! xtask's own flags and `--kubeconfig` (xtask passes that itself). Passing on what was typed,
//! rather than printing the parsed struct back into flags, keeps `dra-e2e`'s command line what it
//! was before xtask parsed its flags with clap: the same tokens in the same order and spelling
//! (`--timeout 90s` stays `90s`), no defaults made explicit, and a runner flag added later passes
//! on with nothing to change here. That line is parsed again as `dra-e2e` parses it, and the
//! result is the `runner` field.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, error::ErrorKind};
use spec_runner::{CleanupArgs, RunnerArgs};

use super::values::ProviderArg;
use crate::{bench, e2e};

/// The flag of the runner that xtask passes itself (the cluster it brought up or was given).
const KUBECONFIG: &str = "kubeconfig";

/// xtask's own flags of `cargo xtask e2e`; global, so that they may follow `cleanup` too.
#[derive(Debug, Args)]
pub struct E2eOwnArgs {
    /// The cluster to bring up when there is no --kubeconfig.
    #[arg(long, value_enum, default_value_t, global = true)]
    pub provider: ProviderArg,
    /// Leave the cluster brought up running after the run.
    #[arg(long, global = true)]
    pub keep_cluster: bool,
    /// Name of the kind cluster (--provider kind; default: KIND_CLUSTER_NAME, else dra-e2e).
    #[arg(long, value_name = "NAME", global = true)]
    pub name: Option<String>,
    /// Node image of the kind cluster (--provider kind; default: KIND_NODE_IMAGE, else the image
    /// `cluster build --provider kind` builds).
    #[arg(long, value_name = "IMAGE", global = true)]
    pub image: Option<String>,
}

/// `dra-e2e`'s flags of a driver-under-test run (suites' `UnderTestArgs`, which xtask cannot
/// import: `suites` is a binary): declared here with the same names, values and requirements, so
/// that clap accepts and checks them; they pass on to `dra-e2e` in the runner's line as typed.
#[derive(Debug, Default, Args)]
pub struct DriverUnderTestArgs {
    /// Test the DRA driver NAME installed in the cluster: only the driver-under-test specs run.
    #[arg(long, value_name = "NAME")]
    pub driver: Option<String>,
    /// The DeviceClass the driver-under-test specs' claims ask for (default: the DeviceClass whose
    /// selector names the driver).
    #[arg(long, value_name = "CLASS", requires = "driver")]
    pub device_class: Option<String>,
    /// Stand between the kubelet and the driver under test and assert its gRPC calls too.
    #[arg(long, requires = "driver")]
    pub interpose: bool,
    /// How many rounds of create, run and delete the churn spec makes (dra-e2e's default: 10).
    #[arg(long, value_name = "N", requires = "driver", value_parser = clap::value_parser!(u32).range(1..))]
    pub churn_rounds: Option<u32>,
}

/// `cargo xtask e2e`: xtask's own flags, the runner's, and the runner's `cleanup`.
#[derive(Debug, Args)]
pub struct E2eArgs {
    /// xtask's own flags.
    #[command(flatten)]
    pub own: E2eOwnArgs,
    /// The runner's flags: after [`finish_e2e`], what `dra-e2e` parses from
    /// [`runner_line`](Self::runner_line), with the `--kubeconfig` given here.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// `dra-e2e`'s driver-under-test flags (passed on in [`runner_line`](Self::runner_line)).
    #[command(flatten)]
    pub under_test: DriverUnderTestArgs,
    /// The runner's subcommand.
    #[command(subcommand)]
    pub action: Option<E2eAction>,
    /// `dra-e2e`'s command line as given, without xtask's flags and `--kubeconfig` (filled in by
    /// [`finish_e2e`]).
    #[arg(skip)]
    pub runner_line: Vec<String>,
}

/// The subcommand of `cargo xtask e2e`: `dra-e2e`'s own.
#[derive(Debug, Subcommand)]
pub enum E2eAction {
    /// Remove the objects of runs that are gone (their Lease expired: killed runs) and exit
    /// (`dra-e2e cleanup`); objects of live runs and objects without a run identity are never
    /// touched. Before it go only --kubeconfig and xtask's own flags.
    #[command(mut_arg(KUBECONFIG, e2e_kubeconfig))]
    Cleanup(CleanupArgs),
}

/// `cargo xtask bench …`.
#[derive(Debug, Subcommand)]
pub enum BenchAction {
    /// Run a selection of the suites against a running cluster (with the runner's --json-report),
    /// then print the wall time, the phase sums (set-up, body, cleanup, deferred checks), the
    /// slowest specs with their longest waits, the driver set-up p50/p99 and how long the skipped
    /// specs took.
    #[command(mut_arg(KUBECONFIG, bench_kubeconfig), mut_arg("json_report", bench_json_report))]
    Suites(SuitesArgs),
}

/// `cargo xtask bench suites`: the runner's flags.
#[derive(Debug, Args)]
pub struct SuitesArgs {
    /// The runner's flags: after [`finish_suites`], what `dra-e2e` parses from
    /// [`runner_line`](Self::runner_line), with the `--kubeconfig` given here.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// `dra-e2e`'s command line as given, without `--kubeconfig` (filled in by [`finish_suites`]).
    #[arg(skip)]
    pub runner_line: Vec<String>,
}

/// The help of `--kubeconfig` in `cargo xtask e2e`, which brings a cluster up without it.
pub fn e2e_kubeconfig(arg: clap::Arg) -> clap::Arg {
    arg.help(
        "Kubeconfig of an existing cluster; nothing is brought up or down (default: bring up the \
         --provider's cluster)",
    )
}

/// The help of `--k8s-version` in `cargo xtask e2e`, which also picks the release it brings up.
pub fn e2e_k8s_version(arg: clap::Arg) -> clap::Arg {
    arg.help(
        "The Kubernetes release, e.g. v1.38.0-beta.0, of the cluster brought up (local provider; \
         kind builds its node image from it) and of the spec texts dra-e2e uses. Default: the \
         pinned release, and the texts of the cluster's version",
    )
}

/// The help of `--kubeconfig` in `cargo xtask bench suites`, which needs a running cluster.
fn bench_kubeconfig(arg: clap::Arg) -> clap::Arg {
    arg.help("Kubeconfig of the running cluster (default: KUBECONFIG)")
}

/// The help of `--json-report` in `cargo xtask bench suites`, which writes its own.
fn bench_json_report(arg: clap::Arg) -> clap::Arg {
    arg.hide(true)
}

impl From<E2eArgs> for e2e::E2eOptions {
    fn from(args: E2eArgs) -> Self {
        let E2eArgs { own, runner, action, runner_line, .. } = args;
        let cleanup_kubeconfig = match action {
            Some(E2eAction::Cleanup(cleanup)) => cleanup.kubeconfig,
            None => None,
        };
        Self {
            provider: own.provider.into(),
            kubeconfig: cleanup_kubeconfig.or(runner.kubeconfig),
            keep_cluster: own.keep_cluster,
            kind_name: own.name,
            kind_image: own.image,
            k8s_version: runner.k8s_version,
            runner_args: runner_line,
        }
    }
}

impl From<SuitesArgs> for bench::SuitesOptions {
    fn from(args: SuitesArgs) -> Self {
        Self { kubeconfig: args.runner.kubeconfig, runner_args: args.runner_line }
    }
}

/// `dra-e2e`'s command line without its subcommands, as the binary parses it.
#[derive(Debug, Parser)]
#[command(name = "dra-e2e")]
struct RunnerLine {
    /// The runner's flags.
    #[command(flatten)]
    runner: RunnerArgs,
    /// The driver-under-test flags.
    #[command(flatten)]
    _under_test: DriverUnderTestArgs,
}

/// Checks what clap cannot of `cargo xtask e2e` (`tail`: the tokens after `e2e`) and fills in the
/// runner's command line. The errors are clap's, unformatted (the caller formats them for the
/// subcommand).
pub fn finish_e2e(args: &mut E2eArgs, tail: &[String]) -> Result<(), clap::Error> {
    let line = runner_line(tail, &taken_flags(true));
    let flags = match args.action {
        // `dra-e2e cleanup` takes no flag of a run; xtask moves `cleanup` before --kubeconfig.
        Some(E2eAction::Cleanup(_)) if line.first().is_some_and(|first| first == "cleanup") => &[][..],
        Some(E2eAction::Cleanup(_)) => {
            return Err(clap::Error::raw(
                ErrorKind::ArgumentConflict,
                "the flags of a run cannot go with `cleanup`: before it go only --kubeconfig and \
                 xtask's own flags",
            ));
        }
        None => &line[..],
    };
    args.runner = parsed_as_the_runner(flags, args.runner.kubeconfig.take())?;
    args.runner_line = line;
    Ok(())
}

/// Checks what clap cannot of `cargo xtask bench suites` (`tail`: the tokens after `suites`) and
/// fills in the runner's command line. The errors are clap's, unformatted.
pub fn finish_suites(args: &mut SuitesArgs, tail: &[String]) -> Result<(), clap::Error> {
    if args.runner.json_report.is_some() {
        return Err(clap::Error::raw(
            ErrorKind::ArgumentConflict,
            "cargo xtask bench suites writes its own --json-report; leave it out",
        ));
    }
    let line = runner_line(tail, &taken_flags(false));
    args.runner = parsed_as_the_runner(&line, args.runner.kubeconfig.take())?;
    args.runner_line = line;
    Ok(())
}

/// `line` parsed as `dra-e2e` parses it, with `kubeconfig`; its selection (regexes, label
/// filter) must compile.
fn parsed_as_the_runner(line: &[String], kubeconfig: Option<PathBuf>) -> Result<RunnerArgs, clap::Error> {
    // clap has checked every token already; what is left after taking xtask's flags out parses
    // the same (an error here is the one dra-e2e would give).
    let parsed =
        RunnerLine::try_parse_from(std::iter::once("dra-e2e").chain(line.iter().map(String::as_str)))?;
    let runner = RunnerArgs { kubeconfig, ..parsed.runner };
    runner.selection().map_err(|err| clap::Error::raw(ErrorKind::ValueValidation, err.to_string()))?;
    Ok(runner)
}

/// The long flags that are not the runner's to get, with whether each takes a value:
/// `--kubeconfig` and, with `own`, xtask's own flags of `cargo xtask e2e`.
fn taken_flags(own: bool) -> Vec<(String, bool)> {
    let mut command = clap::Command::new("own");
    if own {
        command = E2eOwnArgs::augment_args(command);
    }
    let mut flags: Vec<(String, bool)> = command
        .get_arguments()
        .filter_map(|arg| Some((arg.get_long()?.to_owned(), arg.get_action().takes_values())))
        .collect();
    flags.push((KUBECONFIG.to_owned(), true));
    flags
}

/// The tokens of `tail` without the `taken` long flags and their values, in their order. Once
/// clap has accepted `tail`, a token spelled like a flag is that flag: clap never takes one as
/// another flag's value (that is written `--focus=--name`, a token of its own), so a taken flag
/// that takes a value is followed by it, unless it is written `--flag=value`.
fn runner_line(tail: &[String], taken: &[(String, bool)]) -> Vec<String> {
    let mut line = Vec::new();
    let mut tokens = tail.iter();
    while let Some(token) = tokens.next() {
        if token == "--" {
            line.push(token.clone());
            line.extend(tokens.by_ref().cloned());
            break;
        }
        let (name, inline) = match token.split_once('=') {
            Some((name, _)) => (name, true),
            None => (token.as_str(), false),
        };
        let flag = name.strip_prefix("--").and_then(|long| taken.iter().find(|(taken, _)| taken == long));
        match flag {
            Some((_, true)) if !inline => {
                tokens.next();
            }
            Some(_) => {}
            None => line.push(token.clone()),
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use spec_runner::{PartitionKind, Shard};

    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_flags_taken_out_are_xtasks_own_and_the_kubeconfig() {
        let names = |flags: Vec<(String, bool)>| {
            flags.into_iter().map(|(name, value)| format!("{name}:{value}")).collect::<Vec<_>>()
        };
        assert_eq!(
            names(taken_flags(true)),
            ["provider:true", "keep-cluster:false", "name:true", "image:true", "kubeconfig:true"]
        );
        assert_eq!(names(taken_flags(false)), ["kubeconfig:true"]);
    }

    #[test]
    fn partition_timings_and_rerun_pass_on_as_typed_and_are_checked_first() {
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("last.json");
        std::fs::write(
            &report,
            r#"[{"SpecReports":[{"LeafNodeText":"a","State":"failed","NumAttempts":1}]}]"#,
        )
        .unwrap();
        let report = report.to_str().unwrap();
        let tail =
            strings(&["--partition", "time:2/3", "--provider", "local", "--timings", report, "-p", "4"]);
        let line = runner_line(&tail, &taken_flags(true));
        assert_eq!(line, strings(&["--partition", "time:2/3", "--timings", report, "-p", "4"]));
        let runner = parsed_as_the_runner(&line, None).unwrap();
        assert_eq!(
            runner.partition.map(|p| (p.kind, p.shard)),
            Some((PartitionKind::Time, Some(Shard { index: 2, total: 3 })))
        );
        let rerun = strings(&["--rerun-failed", report]);
        assert_eq!(
            parsed_as_the_runner(&rerun, None).unwrap().rerun_failed.as_deref(),
            Some(Path::new(report))
        );
        // What dra-e2e would refuse, xtask refuses before it builds or brings up anything.
        for (line, says) in [
            (&["--partition", "time:1/3"][..], "--partition time needs --timings FILE"),
            (&["--partition", "slice:4/3"], "has M outside 1..=N"),
            (&["--rerun-failed", "/nonexistent/r.json"], "cannot read the report /nonexistent/r.json"),
            (&["--rerun-failed", report, "--focus", "x"], "cannot be used with"),
        ] {
            let err = parsed_as_the_runner(&strings(line), None).unwrap_err().to_string();
            assert!(err.contains(says), "{line:?}: {err}");
        }
    }

    #[test]
    fn the_runners_tokens_stay_as_given_in_their_order() {
        let tail = strings(&[
            "--focus=--name",
            "--name",
            "n",
            "-p4",
            "--image=i",
            "--keep-cluster",
            "--timeout",
            "90s",
            "--kubeconfig=/k",
            "--skip",
            "x=y",
            "--",
        ]);
        assert_eq!(
            runner_line(&tail, &taken_flags(true)),
            strings(&["--focus=--name", "-p4", "--timeout", "90s", "--skip", "x=y", "--"])
        );
        let tail = strings(&["--provider", "kind", "--kubeconfig", "/k", "-v"]);
        assert_eq!(runner_line(&tail, &taken_flags(false)), strings(&["--provider", "kind", "-v"]));
    }
}
