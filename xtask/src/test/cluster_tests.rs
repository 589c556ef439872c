//! The cluster tests: `#[ignore]`d cargo tests that read the kubeconfig from
//! `DRA_E2E_KUBECONFIG`, run side by side, each in its own process (they mostly wait on the
//! cluster, and tests side by side on one cluster leave each other alone: each deletes only its
//! own proxy pods and closes only its own connections, and the runs they make in-process label
//! nothing with a run identity a sweep could take). The one exception is ordered: a test that
//! checks what a run's start sweeps ([`ClusterTest::checks_sweeps`]) starts once the tests that
//! start `dra-e2e` runs ([`ClusterTest::starts_runs`]) ended. Each test's output goes to a log
//! of its own and is printed whole once it ends, so outputs never interleave. A test passes only
//! when its filter ran at least one test (libtest's `test result:` lines count them): a filter
//! that selects nothing, a module renamed, would otherwise pass with 0 tests.

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::progress::human;

/// A cluster test: `#[ignore]`d tests that read the kubeconfig from `DRA_E2E_KUBECONFIG`.
pub(crate) struct ClusterTest {
    /// What it tests and its file.
    pub name: &'static str,
    /// Its name in the step table's row of the tests run side by side.
    pub short: &'static str,
    /// cargo's arguments. `--workspace` keeps cargo's feature unification identical to the
    /// `cargo test --workspace` build before, so nothing is compiled twice.
    pub cargo_args: Vec<&'static str>,
    /// Whether it runs on any cluster (the kind lane runs these too); the others read the local
    /// cluster's node directories on this machine or its node names.
    pub any_provider: bool,
    /// Whether it starts `dra-e2e` runs of its own (each sweeps other runs' leftovers as it
    /// starts).
    pub starts_runs: bool,
    /// Whether it checks what a run's start sweeps, which a run starting beside it would change:
    /// it starts once every test that [`ClusterTest::starts_runs`] ended.
    pub checks_sweeps: bool,
    /// Environment beside `DRA_E2E_KUBECONFIG`.
    pub env: Vec<(&'static str, String)>,
}

/// The fault test that closes every connection of its process to the API server (`ss -K`).
const CONNECTIONS_CLOSED: &str = "faults::tunnels_and_proxies_come_back_after_their_connections_are_closed";

/// The cluster tests of the default cluster, in order.
pub(crate) fn cluster_tests() -> Vec<ClusterTest> {
    let test = |name: &'static str, cargo_args: &[&'static str], any_provider| ClusterTest {
        name,
        short: name.split_whitespace().next().unwrap_or(name),
        cargo_args: cargo_args.to_vec(),
        any_provider,
        starts_runs: false,
        checks_sweeps: false,
        env: Vec::new(),
    };
    vec![
        test(
            "local cluster tests (xtask/tests/local_cluster.rs)",
            &["test", "--workspace", "--test", "local_cluster", "--", "--ignored"],
            false,
        ),
        // Its self-test binary is a runner of its own (a `dra-e2e` run).
        ClusterTest {
            starts_runs: true,
            ..test(
                "framework cluster tests (harness/tests/cluster/framework.rs)",
                &["test", "--workspace", "--test", "cluster", "--", "--ignored", "framework::"],
                true,
            )
        },
        // The kubelet-like client dials the node's sockets from this machine.
        test(
            "tunnel cluster tests (harness/tests/cluster/tunnel.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "tunnel::"],
            false,
        ),
        test(
            "driver cluster tests (harness/tests/cluster/driver.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "driver::"],
            true,
        ),
        // Each fault test waits on its own proxy pods: all at once in one process, but the one
        // that closes every connection of its process, which gets a process of its own.
        test(
            "fault cluster tests (harness/tests/cluster/faults.rs)",
            &[
                "test",
                "--workspace",
                "--test",
                "cluster",
                "--",
                "--ignored",
                "faults::",
                "--skip",
                CONNECTIONS_CLOSED,
                "--test-threads",
                "8",
            ],
            true,
        ),
        test(
            "connection fault cluster test (harness/tests/cluster/faults.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "--exact", CONNECTIONS_CLOSED],
            true,
        ),
        // A proxy in front of the API server cuts the run's connections mid-write.
        test(
            "cut connections to the API server: cluster tests (harness/tests/cluster/connection_cuts.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "connection_cuts::"],
            true,
        ),
        // Runs the example driver for a local cluster node's kubelet directory (kind-worker2)
        // from this machine, and interposes between that kubelet and it.
        test(
            "interposer cluster test (harness/tests/cluster/interposer.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "interposer::"],
            false,
        ),
        // Serves a local cluster node's kubelet directory (kind-worker3) from this machine.
        test(
            "example driver against a real kubelet (kubelet-plugin/tests/node_driver.rs)",
            &["test", "--workspace", "--test", "node_driver", "--", "--ignored"],
            false,
        ),
        ClusterTest {
            starts_runs: true,
            checks_sweeps: true,
            ..test(
                "leftovers cluster test: a SIGKILLed run, a cleaning run, a live run (suites/tests/leftovers.rs)",
                &["test", "--workspace", "--test", "leftovers", "--", "--ignored"],
                true,
            )
        },
    ]
}

/// The skew lane's cluster tests (its cluster has kind-worker's kubelet at an older minor).
pub(crate) fn skew_test() -> ClusterTest {
    ClusterTest {
        name: "skew cluster tests (harness/tests/cluster/skew.rs)",
        short: "skew",
        cargo_args: vec!["test", "--workspace", "--test", "cluster", "--", "--ignored", "skew::"],
        any_provider: false,
        starts_runs: false,
        checks_sweeps: false,
        env: Vec::new(),
    }
}

/// Runs `tests` side by side against `kubeconfig` (those that [`ClusterTest::checks_sweeps`] one
/// by one once those that [`ClusterTest::starts_runs`] ended), each `cargo <args>` with its output in
/// `<target>/e2e/cluster-tests/<short>.log`, printed whole when it ends. Returns one line for the
/// step table (each test's time and how many tests it ran, the failed ones named) and whether
/// all passed.
pub(crate) async fn run_side_by_side(
    repo: &Path,
    tests: &[&ClusterTest],
    kubeconfig: &Path,
) -> (String, Result<()>) {
    let cargo = crate::repo::cargo_program();
    let dir = crate::e2e::target_dir(repo).join("e2e/cluster-tests");
    side_by_side(Path::new(&cargo), repo, tests, kubeconfig, &dir).await
}

/// [`run_side_by_side`] with `program` for cargo and the logs in `dir`.
async fn side_by_side(
    program: &Path,
    repo: &Path,
    tests: &[&ClusterTest],
    kubeconfig: &Path,
    dir: &Path,
) -> (String, Result<()>) {
    if let Err(e) = std::fs::create_dir_all(dir) {
        return ("cluster tests".into(), Err(e).with_context(|| format!("create {}", dir.display())));
    }
    let runs = tests.iter().map(|test| {
        let log = dir.join(format!("{}.log", test.short));
        let run = async move {
            let started = Instant::now();
            let result = run_one(program, repo, test, kubeconfig, &log).await;
            let output = std::fs::read_to_string(&log).unwrap_or_default();
            eprintln!("==> {} ({}):\n{output}", test.name, human(started.elapsed()));
            (test, started.elapsed(), result)
        };
        (test, run)
    });
    // Three groups at once: those that start runs, then after them those that check sweeps (one
    // by one); and beside both, the rest.
    let (checkers, others): (Vec<_>, Vec<_>) = runs.partition(|(test, _)| test.checks_sweeps);
    let (runners, rest): (Vec<_>, Vec<_>) = others.into_iter().partition(|(test, _)| test.starts_runs);
    let ordered = async {
        let mut ended = futures::future::join_all(runners.into_iter().map(|(_, run)| run)).await;
        for (_, run) in checkers {
            ended.push(run.await);
        }
        ended
    };
    let (mut ended, beside): (Vec<Ended>, Vec<Ended>) =
        futures::future::join(ordered, futures::future::join_all(rest.into_iter().map(|(_, run)| run))).await;
    ended.extend(beside);
    // In the given order.
    ended.sort_by_key(|(test, _, _)| tests.iter().position(|t| std::ptr::eq(*t, **test)));
    let times: Vec<String> = ended
        .iter()
        .map(|(t, took, ran)| match ran {
            Ok(n) => format!("{} {} ({n})", t.short, human(*took)),
            Err(_) => format!("{} {}", t.short, human(*took)),
        })
        .collect();
    let failed: Vec<String> =
        ended.iter().filter_map(|(t, _, r)| r.as_ref().err().map(|e| format!("{}: {e:#}", t.name))).collect();
    let name = format!("cluster tests side by side: {}", times.join(", "));
    let result = if failed.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{}", failed.join("; "))) };
    (name, result)
}

/// A test that ended: how long it took, how many tests it ran.
type Ended<'a> = (&'a &'a ClusterTest, Duration, Result<usize>);

/// Runs one cluster test to its end, its output in `log`; how many tests ran (at least one).
async fn run_one(
    program: &Path,
    repo: &Path,
    test: &ClusterTest,
    kubeconfig: &Path,
    log: &Path,
) -> Result<usize> {
    let out = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let err = out.try_clone().with_context(|| format!("{}", log.display()))?;
    let mut cmd = tokio::process::Command::new(program);
    for name in crate::repo::run_only_cargo_vars() {
        cmd.env_remove(name);
    }
    let status = cmd
        .args(&test.cargo_args)
        .env("DRA_E2E_KUBECONFIG", kubeconfig)
        // A spec's failure without anyhow's backtrace (tokio's frames, hundreds of lines before
        // the message's end); a panic keeps RUST_BACKTRACE's.
        .env("RUST_LIB_BACKTRACE", "0")
        .envs(test.env.iter().map(|(k, v)| (k, v)))
        .current_dir(repo)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .status()
        .await
        .with_context(|| format!("run {} {}", program.display(), test.cargo_args.join(" ")))?;
    let output = std::fs::read_to_string(log).with_context(|| format!("read {}", log.display()))?;
    if !status.success() {
        let why = match panics(&output).as_slice() {
            [] => String::new(),
            panics => format!(": {}", panics.join("; ")),
        };
        bail!("cargo {} failed ({status}){why}; its output: {}", test.cargo_args.join(" "), log.display());
    }
    match tests_ran(&output) {
        0 => bail!(
            "cargo {} ran no test: its filter selects none (renamed?); its output: {}",
            test.cargo_args.join(" "),
            log.display()
        ),
        n => Ok(n),
    }
}

/// How many tests libtest's `test result: ok. 3 passed; 1 failed; 2 ignored; …` lines of
/// `output` say ran (passed and failed, over every test binary).
fn tests_ran(output: &str) -> usize {
    let count = |fields: &str, what: &str| -> usize {
        fields
            .split(';')
            .filter_map(|f| f.trim().strip_suffix(what)?.trim().rsplit(' ').next()?.parse::<usize>().ok())
            .sum()
    };
    output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("test result: "))
        .map(|fields| count(fields, "passed") + count(fields, "failed"))
        .sum()
}

/// The most lines of a failed test's panic message [`panics`] keeps.
const PANIC_LINES: usize = 3;
/// The longest line [`panics`] keeps.
const PANIC_LINE_CHARS: usize = 300;

/// Each failed test of libtest's `output` with the first lines of its panic message
/// (`NAME: line | line`), so that a failed step says why without its log.
fn panics(output: &str) -> Vec<String> {
    let lines: Vec<&str> = output.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("thread '") else { continue };
        let Some((name, after)) = rest.split_once('\'') else { continue };
        if !after.contains(" panicked at ") {
            continue;
        }
        let message: Vec<String> = lines[i + 1..]
            .iter()
            .take_while(|l| {
                !l.trim().is_empty() && !l.starts_with("note: ") && !l.starts_with("stack backtrace:")
            })
            .take(PANIC_LINES)
            .map(|l| l.trim().chars().take(PANIC_LINE_CHARS).collect())
            .collect();
        found.push(format!("{name}: {}", message.join(" | ")));
    }
    found
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_failed_test_is_named_with_the_start_of_its_panic_message() {
        let output = "running 2 tests\ntest a::one ... ok\ntest a::two ... FAILED\n\nfailures:\n\n---- a::two stdout ----\n\n\
                      thread 'a::two' (22868) panicked at harness/tests/cluster/a.rs:9:5:\n\
                      FAILED (error) [x] spec: no move yet\nthe run failed: clean-up\n---- the run's output ----\nRandom Seed: 1\n\n\
                      note: run with `RUST_BACKTRACE=1`\n\nthread 'other' panicked elsewhere\n";
        assert_eq!(
            panics(output),
            [
                "a::two: FAILED (error) [x] spec: no move yet | the run failed: clean-up | ---- the run's output ----"
            ]
        );
        assert!(panics("test result: ok. 2 passed; 0 failed").is_empty());
    }

    #[test]
    fn the_connection_fault_test_is_named_as_in_its_file() {
        // `--exact` with a name that no longer exists would run nothing and pass.
        let file = crate::repo::repo_root().join("harness/tests/cluster/faults.rs");
        let source = std::fs::read_to_string(&file).unwrap();
        let function = CONNECTIONS_CLOSED.rsplit("::").next().unwrap();
        assert!(source.contains(&format!("async fn {function}()")), "{} has no {function}", file.display());
    }

    #[tokio::test]
    async fn they_run_side_by_side_each_with_its_own_output_and_failures_named() {
        let dir = tempfile::tempdir().unwrap();
        let order = dir.path().join("order");
        // A stand-in for cargo: notes its start, waits, notes its end; `fail` fails.
        let program = dir.path().join("fake-cargo");
        let script = format!(
            "#!/bin/sh\necho \"start $1\" >> {o}\necho \"output of $1 with $DRA_E2E_KUBECONFIG $FAKE_ENV\"\ncase $1 in fail) sleep 3;; *) sleep 1;; esac\necho \"end $1\" >> {o}\necho \"test result: ok. 2 passed; 0 failed; 0 ignored\"\n[ \"$1\" != fail ]\n",
            o = order.display()
        );
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let test = |name, short, arg, starts_runs, checks_sweeps| ClusterTest {
            name,
            short,
            cargo_args: vec![arg],
            any_provider: true,
            starts_runs,
            checks_sweeps,
            env: vec![("FAKE_ENV", "set".to_owned())],
        };
        let tests = [
            test("sweep checking tests (c.rs)", "checker", "checker", true, true),
            test("run starting tests (a.rs)", "runner", "runner", true, false),
            test("other tests (b.rs)", "other", "fail", false, false),
        ];
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let (name, result) = side_by_side(
            &program,
            dir.path(),
            &tests.iter().collect::<Vec<_>>(),
            Path::new("/k.conf"),
            &logs,
        )
        .await;

        let lines: Vec<String> = std::fs::read_to_string(&order).unwrap().lines().map(String::from).collect();
        let at =
            |line: &str| lines.iter().position(|l| l == line).unwrap_or_else(|| panic!("{line}: {lines:?}"));
        assert!(at("start fail") < at("end runner"), "the other test did not run beside: {lines:?}");
        // The sweep checker starts once the run starter ended, beside the other test.
        assert!(at("end runner") < at("start checker"), "{lines:?}");
        assert!(at("start checker") < at("end fail"), "{lines:?}");
        // The row names each in the given order.
        assert!(name.starts_with("cluster tests side by side: checker "), "{name}");
        assert!(name.contains(", runner ") && name.contains(", other "), "{name}");
        assert!(name.contains("s (2), runner "), "each names how many tests it ran: {name}");
        let err = format!("{:#}", result.unwrap_err());
        assert!(err.contains("other tests (b.rs)") && !err.contains("run starting"), "{err}");
        let runner = std::fs::read_to_string(logs.join("runner.log")).unwrap();
        assert_eq!(
            runner,
            "output of runner with /k.conf set\ntest result: ok. 2 passed; 0 failed; 0 ignored\n"
        );
    }

    #[test]
    fn the_tests_that_ran_are_counted_over_every_test_binary() {
        let output = "running 3 tests\ntest a ... ok\n\ntest result: ok. 2 passed; 1 failed; 4 ignored; 0 measured; 9 filtered out; finished in 1.20s\n\
                      running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out; finished in 0.00s\n";
        assert_eq!(tests_ran(output), 3);
        assert_eq!(
            tests_ran(
                "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out\n"
            ),
            0
        );
        assert_eq!(tests_ran("error: no test target named `clutser`"), 0);
    }

    #[tokio::test]
    async fn a_filter_that_selects_no_test_fails() {
        // The old step judged cargo's exit code alone: `-- --ignored renamed::` passes with 0 tests.
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("fake-cargo");
        let script = "#!/bin/sh\necho 'running 0 tests'\necho\necho 'test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 31 filtered out; finished in 0.00s'\n";
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let test = ClusterTest {
            name: "renamed cluster tests (harness/tests/cluster/renamed.rs)",
            short: "renamed",
            cargo_args: vec!["test", "--test", "cluster", "--", "--ignored", "renamed::"],
            any_provider: true,
            starts_runs: false,
            checks_sweeps: false,
            env: Vec::new(),
        };
        let (_, result) =
            side_by_side(&program, dir.path(), &[&test], Path::new("/k.conf"), dir.path()).await;
        let err = format!("{:#}", result.unwrap_err());
        assert!(err.contains("ran no test: its filter selects none"), "{err}");
    }
}
