//! The runner's output levels (`-v`, `--succinct`), progress reports (`--poll-progress-after`,
//! SIGUSR1) and interrupts (Ctrl-C's SIGINT, SIGTERM), without a cluster: in-memory specs on a
//! trivial backend, in this process and, for the signals, in a child process running the real
//! command line.
//!
//! The child is this test binary itself, started with the ignored test `child_process` and the
//! variable `FRAMEWORK_CHILD` naming the specs it registers.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{process::Stdio, sync::Arc, time::Duration};

use clap::Parser as _;
use harness::{
    framework::{
        self, Ctx, Output, OutputBuffer, Registry, RunOptions, RunnerArgs, Selection, Skip, SpecResult,
        Verbosity, init_tracing, run_with_backend,
    },
    wait::{self, Attempt},
};
use rustix::process::Signal;
use tokio::{
    io::{AsyncBufReadExt as _, BufReader, Lines},
    process::{Child, ChildStderr, ChildStdout},
    time::timeout,
};
use tokio_util::sync::CancellationToken;

mod fake_cluster;
use fake_cluster::FakeCluster;

/// Passes after two steps and a cleanup, is skipped, fails.
fn quick_specs(reg: &mut Registry) {
    reg.describe("[progress]", |r| {
        r.it("passes with steps", async |ctx: Ctx| {
            framework::step("make the thing");
            framework::step("check the thing");
            ctx.defer("remove the thing", async { Ok(()) });
            Ok(())
        });
        r.it("is skipped", async |_| Err(Skip::because("not today")));
        r.it("fails", async |_| Err(anyhow::anyhow!("it broke").into()));
    });
}

/// Waits for an answer that never comes, in `harness::wait::poll`, until it is cancelled.
async fn wait_for_nothing(ctx: &Ctx) -> SpecResult {
    framework::step("ask the void");
    let never = wait::poll(
        "an answer from the void",
        Duration::from_secs(600),
        Duration::from_millis(200),
        || async { Attempt::<()>::Retry("silence".into()) },
    );
    tokio::select! {
        waited = never => waited?,
        () = ctx.cancelled() => {}
    }
    Ok(())
}

/// A spec that waits until cancelled; with `hang`, it has a cleanup that never ends, else a
/// cleanup that takes 8s.
async fn waits(ctx: Ctx, hang: bool) -> SpecResult {
    ctx.defer("delete DeviceClass fake", async { Ok(()) });
    if hang {
        ctx.defer_with_timeout("hang", Duration::from_secs(600), std::future::pending());
    } else {
        ctx.defer("slow cleanup", async {
            tokio::time::sleep(Duration::from_secs(8)).await;
            Ok(())
        });
    }
    wait_for_nothing(&ctx).await
}

/// Two specs of [`waits`].
fn waiting_specs(reg: &mut Registry, hang: bool) {
    reg.describe("[progress]", |r| {
        for name in ["waits one", "waits two"] {
            if hang {
                r.it(name, async |ctx: Ctx| waits(ctx, true).await);
            } else {
                r.it(name, async |ctx: Ctx| waits(ctx, false).await);
            }
        }
    });
}

async fn run_here(registry: Registry, configure: impl FnOnce(&mut RunOptions)) -> String {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (output, buffer): (Output, OutputBuffer) = Output::capture();
    let mut options = RunOptions {
        procs: 1,
        default_timeout: Duration::from_secs(30),
        artifacts: dir.path().join("artifacts"),
        output,
        seed: Some(1),
        ..RunOptions::default()
    };
    configure(&mut options);
    let report = run_with_backend(
        registry,
        &Selection::all(),
        options,
        Arc::new(FakeCluster::new()),
        CancellationToken::new(),
    )
    .await;
    assert!(report.error.is_none(), "{:?}", report.error);
    buffer.contents()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_prints_each_specs_start_phases_and_steps() {
    let mut reg = Registry::new();
    quick_specs(&mut reg);
    let out = run_here(reg, |o| o.verbosity = Verbosity::Verbose).await;
    let start = out.find("START [progress] passes with steps\n").expect(&out);
    let lines = [
        "  [passes with steps] created namespace dra-passes-with-steps-x\n",
        "  [passes with steps] running the body\n",
        "  [passes with steps] STEP: make the thing\n",
        "  [passes with steps] STEP: check the thing\n",
        "  [passes with steps] cleanup: remove the thing\n",
        "  [passes with steps] cleanup: delete namespace dra-passes-with-steps-x\n",
        "  [passes with steps] deferred checks: the pods of namespace dra-passes-with-steps-x to be gone, \
         namespace dra-passes-with-steps-x to be gone\n",
        "s] [progress] passes with steps\n",
    ];
    let mut at = start;
    for line in lines {
        let found = out[at..].find(line).unwrap_or_else(|| panic!("{line:?} after byte {at} in:\n{out}"));
        at += found + line.len();
    }
    assert!(out.contains("PASS ["), "{out}");
    assert!(out.contains("START [progress] is skipped\n") && out.contains("SKIP ["), "{out}");
    assert!(out.contains("START [progress] fails\n") && out.contains("FAIL ["), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn succinct_prints_one_character_per_spec_and_failures_in_full() {
    let mut reg = Registry::new();
    quick_specs(&mut reg);
    let out = run_here(reg, |o| o.verbosity = Verbosity::Succinct).await;
    assert_eq!(out.matches('•').count(), 1, "{out}");
    assert!(!out.contains("PASS [") && !out.contains("SKIP [") && !out.contains("STEP"), "{out}");
    assert!(out.contains("\nFAIL [") && out.contains("it broke"), "{out}");
    // Between the header and the summary: the characters and the failure's block.
    let body = &out[out.find("ready node)\n").expect(&out) + "ready node)\n".len()..];
    let body = &body[..body.find("\nSummarizing 1 failure").expect(body)];
    let mut singles: Vec<char> = body
        .lines()
        .filter(|l| !l.starts_with("FAIL [") && !l.starts_with("  "))
        .flat_map(str::chars)
        .collect();
    singles.sort_unstable();
    assert_eq!(singles, ['S', '•'], "{body}");
    assert!(out.contains("\n1 passed, 1 failed, 1 skipped in "), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_waiting_longer_than_poll_progress_after_reports_its_wait() {
    let mut reg = Registry::new();
    reg.describe("[progress]", |r| {
        r.it("waits a while", async |_| {
            framework::step("wait for the slow answer");
            let started = tokio::time::Instant::now();
            wait::poll(
                "the slow answer",
                Duration::from_secs(300),
                Duration::from_millis(100),
                || async move {
                    if started.elapsed() > Duration::from_millis(1500) {
                        Attempt::Done(())
                    } else {
                        Attempt::Retry("not yet".into())
                    }
                },
            )
            .await?;
            Ok(())
        });
        r.it("is quick", async |_| Ok(()));
    });
    let out = run_here(reg, |o| {
        o.poll_progress_after = Some(Duration::from_millis(400));
        o.poll_progress_interval = Duration::from_millis(500);
    })
    .await;
    let reports: Vec<&str> = out.split("Automatically polling progress:\n").skip(1).collect();
    assert!(reports.len() >= 2, "a report after 0.4s and again every 0.5s: {out}");
    let first = reports[0];
    assert!(first.starts_with("  [progress] waits a while (Spec Runtime: "), "{first}");
    assert!(first.contains("    In [It] (Node Runtime: "), "{first}");
    assert!(first.contains("    At [By Step] wait for the slow answer (Step Runtime: "), "{first}");
    assert!(first.contains(" for: the slow answer (timeout 5m)\n"), "{first}");
    assert!(!out.contains("is quick (Spec Runtime"), "a quick spec gets no report: {out}");
    assert!(out.contains("\n2 passed, 0 failed, 0 skipped in "), "{out}");
}

/// Not a test: the child process of the signal tests (see the module's doc).
#[test]
#[ignore = "the child process of the signal tests, started by them"]
fn child_process() {
    let specs =
        std::env::var("FRAMEWORK_CHILD").expect("only the signal tests start this, with FRAMEWORK_CHILD set");
    let args: Vec<String> = std::env::var("FRAMEWORK_CHILD_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        runner: RunnerArgs,
    }
    let cli = Cli::parse_from(std::iter::once("child".to_owned()).chain(args));
    let mut reg = Registry::new();
    match specs.as_str() {
        "quick" => quick_specs(&mut reg),
        "waiting" => waiting_specs(&mut reg, false),
        "hanging" => waiting_specs(&mut reg, true),
        other => panic!("unknown FRAMEWORK_CHILD {other:?}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let code = runtime.block_on(framework::run_on(reg, cli.runner, Arc::new(FakeCluster::new())));
    // The exit code is the runner's, not the test harness's.
    std::process::exit(if code == std::process::ExitCode::SUCCESS { 0 } else { exit_code(code) });
}

/// The number inside an `ExitCode` (it has no getter), via its `Debug` form.
fn exit_code(code: std::process::ExitCode) -> i32 {
    let text = format!("{code:?}");
    text.chars().filter(char::is_ascii_digit).collect::<String>().parse().unwrap_or(1)
}

struct Spawned {
    child: Child,
    /// The child's `--artifacts` folder, removed with it.
    _artifacts: tempfile::TempDir,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Lines<BufReader<ChildStderr>>,
}

fn spawn_child(specs: &str, args: &str) -> Spawned {
    let artifacts = tempfile::tempdir().unwrap();
    let args = format!("{args} --artifacts {}", artifacts.path().display());
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["child_process", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("FRAMEWORK_CHILD", specs)
        .env("FRAMEWORK_CHILD_ARGS", args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    Spawned { child, _artifacts: artifacts, stdout, stderr }
}

fn signal(child: &Child, signal: Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
}

/// Reads lines until one contains `needle`; returns every line read. Fails after `limit`.
async fn read_until<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    needle: &str,
    limit: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    let found = timeout(limit, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let hit = line.contains(needle);
            seen.push(line);
            if hit {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(found, Ok(true)), "no line with {needle:?} within {limit:?}; saw: {seen:#?}");
    seen
}

/// After the first Ctrl-C: reads stderr until the status lines show both specs of
/// [`waiting_specs`] in the cleanup `what`; returns every line read.
async fn both_in_cleanup(stderr: &mut Lines<BufReader<ChildStderr>>, what: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let wanted = ["waits one", "waits two"].map(|n| format!("  [progress] {n}: cleanup {what:?} (for "));
    let found = timeout(Duration::from_secs(30), async {
        let mut hits = [false, false];
        while let Some(line) = stderr.next_line().await.unwrap() {
            for (hit, want) in hits.iter_mut().zip(&wanted) {
                *hit |= line.starts_with(want.as_str());
            }
            seen.push(line);
            if hits == [true, true] {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(found, Ok(true)), "no status showed both specs in cleanup {what:?}: {seen:#?}");
    seen
}

/// Sends SIGUSR1 until a report shows both waiting specs in their wait; returns that report.
async fn report_with_both_waiting(spawned: &mut Spawned) -> String {
    read_until(&mut spawned.stdout, "Running 2 of 2 specs", Duration::from_secs(30)).await;
    let attempt = timeout(Duration::from_secs(30), async {
        loop {
            // Give the runner time to install its handler and the specs time to start.
            tokio::time::sleep(Duration::from_millis(300)).await;
            signal(&spawned.child, Signal::USR1);
            let report =
                read_until(&mut spawned.stdout, "Progress report (SIGUSR1)", Duration::from_secs(10)).await;
            let mut block = vec![report.last().unwrap().clone()];
            // The report is one block: read its lines (two specs, six lines each at most).
            while block.iter().filter(|l| l.contains("for: an answer from the void (timeout 10m)")).count()
                < 2
            {
                match timeout(Duration::from_millis(500), spawned.stdout.next_line()).await {
                    Ok(Ok(Some(line))) => block.push(line),
                    _ => break,
                }
            }
            if block.iter().filter(|l| l.contains("for: an answer from the void (timeout 10m)")).count() == 2
            {
                return block.join("\n");
            }
        }
    })
    .await;
    attempt.expect("no SIGUSR1 report showed both specs waiting within 30s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_prints_a_progress_report_of_every_running_spec() {
    let mut spawned = spawn_child("waiting", "-p 2 --timeout 5m");
    let report = report_with_both_waiting(&mut spawned).await;
    assert!(report.contains("Progress report (SIGUSR1): 2 spec(s) running"), "{report}");
    for name in ["waits one", "waits two"] {
        assert!(report.contains(&format!("  [progress] {name} (Spec Runtime: ")), "{report}");
    }
    assert!(report.contains("    At [By Step] ask the void (Step Runtime: "), "{report}");
    // End the run: the first Ctrl-C cancels, the slow cleanups are reported while they run.
    an_interrupt_cancels_and_cleans_up(spawned, Signal::INT, "SIGINT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_the_run_and_runs_the_cleanups_as_ctrl_c_does() {
    // SIGTERM (a CI's timeout, `timeout(1)`, `kill`) used to end the runner without a cleanup.
    let mut spawned = spawn_child("waiting", "-p 2 --timeout 5m");
    report_with_both_waiting(&mut spawned).await;
    an_interrupt_cancels_and_cleans_up(spawned, Signal::TERM, "SIGTERM").await;
}

/// Sends `first` to the run of [`waiting_specs`] (both specs waiting): the run says which signal
/// came, both specs' slow cleanups run and are reported while they do, and the run ends
/// interrupted (exit 130) with both specs failed.
async fn an_interrupt_cancels_and_cleans_up(mut spawned: Spawned, first: Signal, name: &str) {
    signal(&spawned.child, first);
    let message = format!("Interrupted ({name}): cancelling running specs and running their cleanups; ");
    read_until(&mut spawned.stderr, &message, Duration::from_secs(30)).await;
    let seen = both_in_cleanup(&mut spawned.stderr, "slow cleanup").await;
    let status = seen.join("\n");
    assert!(
        status.contains(" ago; still cleaning up 2 spec(s) (press Ctrl-C again to stop at once):"),
        "{status}"
    );
    for name in ["waits one", "waits two"] {
        let line = seen.iter().rfind(|l| l.starts_with(&format!("  [progress] {name}: "))).expect(&status);
        assert!(
            line.contains(
                "; then 2 more cleanup(s): \"delete DeviceClass fake\", \"delete namespace dra-waits-"
            ),
            "{status}"
        );
    }
    let status = timeout(Duration::from_secs(60), spawned.child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(130));
    let mut rest = Vec::new();
    while let Some(line) = spawned.stdout.next_line().await.unwrap() {
        rest.push(line);
    }
    assert!(rest.iter().any(|l| l.contains("interrupted (Ctrl-C) while running")), "{rest:#?}");
    assert!(rest.last().unwrap().starts_with("0 passed, 2 failed, 0 skipped in "), "{rest:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_lists_the_cleanups_not_done() {
    a_second_interrupt_exits_at_once((Signal::INT, "SIGINT"), (Signal::INT, "SIGINT"), 130).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_interrupt_of_either_kind_after_sigterm_exits_143_at_once() {
    a_second_interrupt_exits_at_once((Signal::TERM, "SIGTERM"), (Signal::INT, "SIGINT"), 143).await;
    a_second_interrupt_exits_at_once((Signal::TERM, "SIGTERM"), (Signal::TERM, "SIGTERM"), 143).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_after_ctrl_c_exits_130_at_once() {
    a_second_interrupt_exits_at_once((Signal::INT, "SIGINT"), (Signal::TERM, "SIGTERM"), 130).await;
}

/// Sends `first`, then once both specs of [`waiting_specs`] hang in a cleanup, `second`: the run
/// exits at once with `code`, naming both signals and listing the cleanup steps not done.
async fn a_second_interrupt_exits_at_once(first: (Signal, &str), second: (Signal, &str), code: i32) {
    let mut spawned = spawn_child("hanging", "-p 2 --timeout 5m");
    report_with_both_waiting(&mut spawned).await;
    signal(&spawned.child, first.0);
    both_in_cleanup(&mut spawned.stderr, "hang").await;
    signal(&spawned.child, second.0);
    let mut rest = Vec::new();
    timeout(Duration::from_secs(30), async {
        while let Some(line) = spawned.stderr.next_line().await.unwrap() {
            rest.push(line);
        }
    })
    .await
    .expect("the child did not close stderr after the second interrupt");
    let status = timeout(Duration::from_secs(30), spawned.child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(code), "{rest:#?}");
    let twice = format!("Interrupted twice ({}, then {}): exiting without cleanup.", first.1, second.1);
    let at = rest.iter().position(|l| *l == twice).unwrap_or_else(|| panic!("{twice:?} in {rest:#?}"));
    assert_eq!(rest[at + 1], "Cleanup steps not done:", "{rest:#?}");
    for name in ["waits one", "waits two"] {
        let line = rest
            .iter()
            .find(|l| l.starts_with(&format!("  [progress] {name}: ")))
            .unwrap_or_else(|| panic!("{rest:#?}"));
        assert!(line.contains(": \"hang\" (running for "), "{line}");
        assert!(line.contains("), \"delete DeviceClass fake\", \"delete namespace dra-waits-"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flags_choose_the_output_level() {
    for (args, wanted, unwanted) in [
        ("-v", "  [passes with steps] STEP: check the thing", "•"),
        ("--succinct", "•", "PASS ["),
        ("", "PASS [", "STEP:"),
    ] {
        let mut spawned = spawn_child("quick", args);
        let mut out = Vec::new();
        while let Some(line) =
            timeout(Duration::from_secs(30), spawned.stdout.next_line()).await.unwrap().unwrap()
        {
            out.push(line);
        }
        let status = timeout(Duration::from_secs(30), spawned.child.wait()).await.unwrap().unwrap();
        assert_eq!(status.code(), Some(1), "one spec fails: {out:#?}");
        let out = out.join("\n");
        assert!(out.contains(wanted) && !out.contains(unwanted), "{args}: {out}");
    }
    let mut both = spawn_child("quick", "-v --succinct");
    let error = read_until(&mut both.stderr, "cannot be used with", Duration::from_secs(30)).await;
    let status = timeout(Duration::from_secs(30), both.child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(2), "-v and --succinct exclude each other: {error:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_s_report_follows_the_summary_and_one_it_cannot_make_fails_the_run() {
    init_tracing();
    let mut reg = Registry::new();
    quick_specs(&mut reg);
    reg.after_run(|report, cluster| {
        Ok(format!(
            "own report: {} of {} on {}\n",
            report.failed(),
            report.specs.len(),
            cluster.server_version
        ))
    });
    reg.after_run(|_, _| Err(anyhow::anyhow!("cannot write the own report x: no space left")));
    let dir = tempfile::tempdir().unwrap();
    let (output, buffer) = Output::capture();
    let options =
        RunOptions { procs: 1, artifacts: dir.path().join("artifacts"), output, ..RunOptions::default() };
    let report = run_with_backend(
        reg,
        &Selection::all(),
        options,
        Arc::new(FakeCluster::new()),
        CancellationToken::new(),
    )
    .await;
    let out = buffer.contents();
    let summary = out.find("\n1 passed, 1 failed, 1 skipped in ").expect(&out);
    assert!(out[summary..].contains("\nown report: 1 of 3 on v1.37.2\n"), "{out}");
    assert_eq!(report.error.as_deref(), Some("cannot write the own report x: no space left"));
    assert_eq!(report.exit_code(), 2);
}
