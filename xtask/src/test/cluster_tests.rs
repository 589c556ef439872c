//! The cluster tests: `#[ignore]`d cargo tests that read the kubeconfig from
//! `DRA_E2E_KUBECONFIG`, run side by side, each in its own process (they mostly wait on the
//! cluster, and runs side by side on one cluster leave each other alone: none of them labels its
//! objects with a run identity another run could sweep, and each deletes only its own proxy pods
//! and closes only its own connections). Each one's output goes to a log of its own and is
//! printed whole once it ends, so outputs never interleave.

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
    /// Whether it runs alone, after the others: it checks what other runs leave behind and what
    /// a run's start sweeps, which a run starting beside it would change.
    pub alone: bool,
}

/// The cluster tests of the default cluster, in order.
pub(crate) fn cluster_tests() -> Vec<ClusterTest> {
    let test = |name: &'static str, cargo_args: &[&'static str], any_provider| ClusterTest {
        name,
        short: name.split_whitespace().next().unwrap_or(name),
        cargo_args: cargo_args.to_vec(),
        any_provider,
        alone: false,
    };
    vec![
        test(
            "local cluster tests (xtask/tests/local_cluster.rs)",
            &["test", "--workspace", "--test", "local_cluster", "--", "--ignored"],
            false,
        ),
        test(
            "framework cluster tests (harness/tests/cluster/framework.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "framework::"],
            true,
        ),
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
        test(
            "fault cluster tests (harness/tests/cluster/faults.rs)",
            &["test", "--workspace", "--test", "cluster", "--", "--ignored", "faults::"],
            true,
        ),
        // Serves a local cluster node's kubelet directory (kind-worker3) from this machine.
        test(
            "example driver against a real kubelet (kubelet-plugin/tests/node_driver.rs)",
            &["test", "--workspace", "--test", "node_driver", "--", "--ignored"],
            false,
        ),
        ClusterTest {
            alone: true,
            ..test(
                "leftovers cluster test: a SIGKILLed run, a cleaning run, a live run (suites/tests/leftovers.rs)",
                &["test", "--workspace", "--test", "leftovers", "--", "--ignored"],
                true,
            )
        },
    ]
}

/// Runs `tests` side by side against `kubeconfig` (those that run [`ClusterTest::alone`] one by
/// one afterwards), each `cargo <args>` with its output in
/// `<target>/e2e/cluster-tests/<short>.log`, printed whole when it ends. Returns one line for the
/// step table (each test's time, the failed ones named) and whether all passed.
pub(crate) async fn run_side_by_side(
    repo: &Path,
    tests: &[&ClusterTest],
    kubeconfig: &Path,
) -> (String, Result<()>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
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
    let (alone, together): (Vec<_>, Vec<_>) = runs.partition(|(test, _)| test.alone);
    let mut ended: Vec<(&&ClusterTest, Duration, Result<()>)> =
        futures::future::join_all(together.into_iter().map(|(_, run)| run)).await;
    for (_, run) in alone {
        ended.push(run.await);
    }
    let times: Vec<String> =
        ended.iter().map(|(t, took, _)| format!("{} {}", t.short, human(*took))).collect();
    let failed: Vec<String> =
        ended.iter().filter_map(|(t, _, r)| r.as_ref().err().map(|e| format!("{}: {e:#}", t.name))).collect();
    let name = format!("cluster tests side by side: {}", times.join(", "));
    let result = if failed.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{}", failed.join("; "))) };
    (name, result)
}

/// Runs one cluster test to its end, its output in `log`.
async fn run_one(
    program: &Path,
    repo: &Path,
    test: &ClusterTest,
    kubeconfig: &Path,
    log: &Path,
) -> Result<()> {
    let out = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let err = out.try_clone().with_context(|| format!("{}", log.display()))?;
    let status = tokio::process::Command::new(program)
        .args(&test.cargo_args)
        .env("DRA_E2E_KUBECONFIG", kubeconfig)
        .current_dir(repo)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .status()
        .await
        .with_context(|| format!("run {} {}", program.display(), test.cargo_args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status}); its output: {}", test.cargo_args.join(" "), log.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[tokio::test]
    async fn they_run_side_by_side_each_with_its_own_output_and_failures_named() {
        let dir = tempfile::tempdir().unwrap();
        let order = dir.path().join("order");
        // A stand-in for cargo: notes its start, waits, notes its end; `fail` fails.
        let program = dir.path().join("fake-cargo");
        let script = format!(
            "#!/bin/sh\necho \"start $1\" >> {o}\necho \"output of $1 with $DRA_E2E_KUBECONFIG\"\nsleep 1\necho \"end $1\" >> {o}\n[ \"$1\" != fail ]\n",
            o = order.display()
        );
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let test = |name, short, arg, alone| ClusterTest {
            name,
            short,
            cargo_args: vec![arg],
            any_provider: true,
            alone,
        };
        let tests = [
            test("solo tests (c.rs)", "solo", "solo", true),
            test("first tests (a.rs)", "first", "pass", false),
            test("second tests (b.rs)", "second", "fail", false),
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
        assert!(lines[..2].iter().all(|l| l.starts_with("start")), "one ran after the other: {lines:?}");
        // The one that runs alone starts once the others ended.
        assert_eq!(lines[4..], ["start solo", "end solo"], "{lines:?}");
        assert!(name.starts_with("cluster tests side by side: first "), "{name}");
        assert!(name.contains(", second ") && name.contains(", solo "), "{name}");
        let err = format!("{:#}", result.unwrap_err());
        assert!(err.contains("second tests (b.rs)") && !err.contains("first tests"), "{err}");
        let first = std::fs::read_to_string(logs.join("first.log")).unwrap();
        assert_eq!(first, "output of pass with /k.conf\n");
    }
}
