//! Reading `cargo xtask`'s command line: clap, and for the commands that run `dra-e2e` what clap
//! cannot check alone ([`runner`]), so that every error comes before anything is built or started.

use std::ffi::OsString;

use clap::{CommandFactory, Parser, error::ErrorKind};

use super::{Cli, Command, runner, runner::BenchAction};

/// This process's command line: kubectl's verbatim, every other through [`parse`]. A bad one ends
/// the process with clap's error (exit code 2), `--help` and `--version` with their text (0).
pub fn from_env() -> Cli {
    let argv = std::env::args_os().map(OsString::into_string).collect::<Result<Vec<_>, _>>();
    let argv = argv.unwrap_or_else(|arg| {
        let message = format!("invalid UTF-8 was detected in an argument: {}", arg.to_string_lossy());
        clap::Error::raw(ErrorKind::InvalidUtf8, message).with_cmd(&Cli::command()).exit()
    });
    Cli::kubectl_verbatim(argv.clone()).map_or_else(|| parse(argv), Ok).unwrap_or_else(|err| err.exit())
}

/// Parses `argv` (the program name first), with what clap cannot check alone for the commands
/// that run `dra-e2e` ([`runner::finish_e2e`], [`runner::finish_suites`]): every error comes
/// before anything is built or started. `-v` after `e2e` or `bench suites` is the runner's
/// (`--verbose` of its flags), before it xtask's.
pub fn parse(argv: Vec<String>) -> Result<Cli, clap::Error> {
    let mut cli = Cli::try_parse_from(&argv)?;
    let path: &[&str] = match cli.command {
        Command::E2e(_) => &["e2e"],
        Command::Bench { .. } => &["bench", "suites"],
        _ => return Ok(cli),
    };
    let mut subcommand = Cli::command();
    subcommand.build();
    for name in path {
        subcommand = subcommand.find_subcommand(name).cloned().unwrap_or(subcommand);
    }
    let Some((before, tail)) = split_after(&argv, path) else {
        let message = format!("cannot find `{}` on the command line", path.join(" "));
        return Err(clap::Error::raw(ErrorKind::InvalidSubcommand, message).format(&mut subcommand));
    };
    // clap shares the runner's `-v` with xtask's global one in both directions: xtask's is what
    // stands before the subcommand, the runner's what its line holds.
    cli.verbose = Cli::try_parse_from(before)?.verbose;
    let finished = match &mut cli.command {
        Command::E2e(args) => runner::finish_e2e(args, tail),
        Command::Bench { action: BenchAction::Suites(args) } => runner::finish_suites(args, tail),
        _ => Ok(()),
    };
    finished.map_err(|err| err.format(&mut subcommand))?;
    Ok(cli)
}

/// The tokens of `argv` (the program first) after the subcommand names `path` (`["bench",
/// "suites"]`), and the command line up to and including them. Before and between the names
/// only flags can stand (xtask's `-v`), so the names are the first tokens that are not flags.
fn split_after<'a>(argv: &'a [String], path: &[&str]) -> Option<(&'a [String], &'a [String])> {
    let mut names = path.iter().peekable();
    for (i, token) in argv.iter().enumerate().skip(1).filter(|(_, token)| !token.starts_with('-')) {
        if *names.next()? != token.as_str() {
            return None;
        }
        if names.peek().is_none() {
            return Some(argv.split_at(i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use clap::Args;
    use spec_runner::RunnerArgs;

    use super::*;
    use crate::{bench, e2e, provider::Provider};

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn parsed(args: &[&str]) -> Result<Cli, clap::Error> {
        parse(strings(args))
    }

    /// The e2e command line of a parse that must succeed.
    fn e2e_args(args: &[&str]) -> runner::E2eArgs {
        let cli = parsed(args).unwrap_or_else(|err| panic!("{args:?}: {err}"));
        let Command::E2e(e2e) = cli.command else { panic!("not e2e") };
        e2e
    }

    /// The kind and text of the error of a parse that must fail.
    fn refusal(args: &[&str]) -> (ErrorKind, String) {
        let Err(err) = parsed(args) else { panic!("{args:?} parsed") };
        assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        let text = err.to_string();
        assert!(text.starts_with("error: "), "{text}");
        (err.kind(), text)
    }

    #[test]
    fn a_valid_e2e_command_line_parses_into_what_the_runner_gets() {
        let args = e2e_args(&[
            "xtask",
            "e2e",
            "--focus",
            "DRA",
            "--provider=kind",
            "--keep-cluster",
            "-p",
            "4",
            "--kubeconfig",
            "/k",
            "--skip",
            "Slow",
            "--name",
            "n",
            "--image=i",
            "--timeout",
            "90s",
            "--k8s-version",
            "v1.38.0-beta.0",
            "--junit=j.xml",
            "-v",
        ]);
        let runner = &args.runner;
        assert_eq!(
            (runner.focus.as_slice(), runner.skip.as_slice()),
            (&strings(&["DRA"])[..], &strings(&["Slow"])[..])
        );
        assert_eq!((runner.procs, runner.timeout, runner.verbose), (Some(4), Duration::from_secs(90), true));
        assert_eq!(runner.junit, Some(PathBuf::from("j.xml")));
        assert_eq!(runner.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(
            e2e::E2eOptions::from(args),
            e2e::E2eOptions {
                provider: Provider::Kind,
                kubeconfig: Some("/k".into()),
                keep_cluster: true,
                kind_name: Some("n".into()),
                kind_image: Some("i".into()),
                k8s_version: Some("v1.38.0-beta.0".into()),
                runner_args: strings(&[
                    "--focus",
                    "DRA",
                    "-p",
                    "4",
                    "--skip",
                    "Slow",
                    "--timeout",
                    "90s",
                    "--k8s-version",
                    "v1.38.0-beta.0",
                    "--junit=j.xml",
                    "-v",
                ]),
            }
        );
        let defaults = e2e::E2eOptions::from(e2e_args(&["xtask", "e2e"]));
        assert_eq!(defaults, e2e::E2eOptions::default());
    }

    #[test]
    fn v_before_the_subcommand_is_xtasks_after_it_the_runners() {
        let cli = parsed(&["xtask", "-v", "e2e", "--succinct"]).unwrap();
        let Command::E2e(args) = cli.command else { panic!("not e2e") };
        assert!(cli.verbose);
        assert!(!args.runner.verbose && args.runner.succinct);
        assert_eq!(args.runner_line, ["--succinct"]);
        let cli = parsed(&["xtask", "e2e", "--focus", "x", "-v"]).unwrap();
        let Command::E2e(args) = cli.command else { panic!("not e2e") };
        assert!(!cli.verbose);
        assert!(args.runner.verbose);
        let cli = parsed(&["xtask", "--verbose", "bench", "-v", "suites", "--verbose"]).unwrap();
        let Command::Bench { action: BenchAction::Suites(args) } = cli.command else { panic!("not bench") };
        assert!(cli.verbose && args.runner.verbose);
        assert_eq!(args.runner_line, ["--verbose"]);
    }

    #[test]
    fn cleanup_is_the_runners_with_the_kubeconfig_before_or_after_it() {
        let args = e2e_args(&[
            "xtask",
            "e2e",
            "--kubeconfig",
            "/k",
            "cleanup",
            "--keep-leftovers",
            "--provider",
            "kind",
        ]);
        let options = e2e::E2eOptions::from(args);
        assert_eq!(
            (options.kubeconfig, options.provider, options.runner_args),
            (Some("/k".into()), Provider::Kind, strings(&["cleanup", "--keep-leftovers"]))
        );
        let options = e2e::E2eOptions::from(e2e_args(&["xtask", "e2e", "cleanup", "--kubeconfig", "/k"]));
        assert_eq!((options.kubeconfig, options.runner_args), (Some("/k".into()), strings(&["cleanup"])));
        // A value that reads `cleanup` is a value.
        let args = e2e_args(&["xtask", "e2e", "--focus", "cleanup"]);
        assert!(args.action.is_none());
        assert_eq!(args.runner_line, ["--focus", "cleanup"]);

        let (kind, text) = refusal(&["xtask", "e2e", "--focus", "x", "cleanup"]);
        assert_eq!(kind, ErrorKind::ArgumentConflict);
        assert!(text.contains("cannot go with `cleanup`"), "{text}");
        assert_eq!(refusal(&["xtask", "e2e", "cleanup", "--focus", "x"]).0, ErrorKind::UnknownArgument);
    }

    #[test]
    fn the_driver_under_test_flags_pass_on_to_the_runner_as_typed() {
        let line = [
            "--driver",
            "d.example.com",
            "--device-class=c",
            "--interpose",
            "--churn-rounds",
            "3",
            "-p",
            "1",
        ];
        let argv: Vec<&str> = ["xtask", "e2e", "--kubeconfig", "/k"].into_iter().chain(line).collect();
        let options = e2e::E2eOptions::from(e2e_args(&argv));
        assert_eq!((options.kubeconfig, options.runner_args), (Some("/k".into()), strings(&line)));
        for alone in ["--interpose", "--churn-rounds=3"] {
            let (kind, text) = refusal(&["xtask", "e2e", alone]);
            assert_eq!(kind, ErrorKind::MissingRequiredArgument, "{text}");
            assert!(text.contains("--driver <NAME>"), "{text}");
        }
    }

    #[test]
    fn bad_e2e_flags_are_refused_before_anything_is_built() {
        for (args, kind, says) in [
            (&["--bogus"][..], ErrorKind::UnknownArgument, "unexpected argument '--bogus'"),
            (&["--focus", "("], ErrorKind::ValueValidation, "invalid --focus regex \"(\""),
            (&["--focus", "ok", "--skip", "a[b"], ErrorKind::ValueValidation, "invalid --skip regex"),
            (&["--label-filter", "&&"], ErrorKind::ValueValidation, "invalid --label-filter"),
            (&["-p", "0"], ErrorKind::ValueValidation, "'--procs <N>'"),
            (&["-p", "many"], ErrorKind::ValueValidation, "invalid value 'many'"),
            (&["-p"], ErrorKind::InvalidValue, "a value is required"),
            (&["--provider", "docker"], ErrorKind::InvalidValue, "invalid value 'docker'"),
            (&["--timeout", "soon"], ErrorKind::ValueValidation, "invalid value 'soon'"),
            (&["-v", "--succinct"], ErrorKind::ArgumentConflict, "cannot be used with"),
            (&["--focus", "--keep-cluster"], ErrorKind::InvalidValue, "a value is required"),
            (&["--version"], ErrorKind::UnknownArgument, "unexpected argument '--version'"),
        ] {
            let argv: Vec<&str> = ["xtask", "e2e"].into_iter().chain(args.iter().copied()).collect();
            let (got, text) = refusal(&argv);
            assert_eq!(got, kind, "{argv:?}: {text}");
            assert!(text.contains(says), "{argv:?}: {text}");
            // clap's own value errors show no usage; the others show the subcommand's.
            assert!(!text.contains("Usage:") || text.contains("Usage: cargo xtask e2e"), "{argv:?}: {text}");
        }
    }

    #[test]
    fn bench_suites_takes_the_runners_flags_but_not_its_report() {
        let cli =
            parsed(&["xtask", "bench", "suites", "--kubeconfig", "/k", "--focus", "x", "-p", "2"]).unwrap();
        let Command::Bench { action: BenchAction::Suites(args) } = cli.command else { panic!("not bench") };
        assert_eq!(
            bench::SuitesOptions::from(args),
            bench::SuitesOptions {
                kubeconfig: Some("/k".into()),
                runner_args: strings(&["--focus", "x", "-p", "2"])
            }
        );
        for report in [&["--json-report", "r.json"][..], &["--json-report=r.json"]] {
            let argv: Vec<&str> =
                ["xtask", "bench", "suites"].into_iter().chain(report.iter().copied()).collect();
            let (kind, text) = refusal(&argv);
            assert_eq!(kind, ErrorKind::ArgumentConflict, "{text}");
            assert!(text.contains("writes its own --json-report; leave it out"), "{text}");
            assert!(text.contains("Usage: cargo xtask bench suites"), "{text}");
        }
        assert_eq!(
            refusal(&["xtask", "bench", "suites", "--provider", "kind"]).0,
            ErrorKind::UnknownArgument
        );
        assert_eq!(refusal(&["xtask", "bench", "suites", "--skip", "("]).0, ErrorKind::ValueValidation);
        assert_eq!(refusal(&["xtask", "bench", "nothing"]).0, ErrorKind::InvalidSubcommand);
    }

    #[test]
    fn every_runner_flag_is_offered_with_the_runners_name_and_help() {
        let runner = RunnerArgs::augment_args(clap::Command::new("dra-e2e"));
        let mut cli = Cli::command();
        cli.build();
        for path in [&["e2e"][..], &["bench", "suites"]] {
            let command = path.iter().try_fold(&cli, |c, name| c.find_subcommand(name)).unwrap();
            for flag in runner.get_arguments() {
                let ours = command.get_arguments().find(|a| a.get_id() == flag.get_id()).unwrap();
                assert_eq!((ours.get_long(), ours.get_short()), (flag.get_long(), flag.get_short()));
                let own_help = matches!(flag.get_id().as_str(), "kubeconfig" | "k8s_version" | "json_report");
                if !own_help {
                    assert_eq!(
                        ours.get_help().map(ToString::to_string),
                        flag.get_help().map(ToString::to_string)
                    );
                }
            }
        }
        let Err(help) = parsed(&["xtask", "e2e", "--help"]) else { panic!("no help") };
        assert_eq!((help.kind(), help.exit_code()), (ErrorKind::DisplayHelp, 0));
        assert!(help.to_string().contains("--flake-attempts <N>"));
    }

    #[test]
    fn the_subcommand_is_found_after_xtasks_flags() {
        let argv = strings(&["xtask", "-v", "bench", "-v", "suites", "--focus", "x"]);
        let (before, tail) = split_after(&argv, &["bench", "suites"]).unwrap();
        assert_eq!((before.len(), tail), (5, &argv[5..]));
        let argv = strings(&["xtask", "e2e"]);
        assert_eq!(split_after(&argv, &["e2e"]), Some((&argv[..], &argv[2..])));
        assert_eq!(split_after(&argv, &["bench"]), None);
    }
}
