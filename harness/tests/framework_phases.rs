//! Requirements decided before any object exists, and per-spec phase timing, without a cluster:
//! in-memory specs on a backend that counts the namespaces the runner asks for.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{sync::Arc, time::Duration};

use harness::framework::{
    ClusterAccess, Ctx, FailureKind, Outcome, Output, Precheck, Registry, RunOptions, RunReport, Selection,
    Skip, SpecResult, Verbosity, init_tracing, run_with_backend,
};
use tokio_util::sync::CancellationToken;

mod fake_cluster;
use fake_cluster::FakeCluster;

async fn run(registry: Registry, backend: FakeCluster, verbosity: Verbosity) -> (RunReport, String) {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (output, buffer) = Output::capture();
    let options = RunOptions {
        procs: 2,
        default_timeout: Duration::from_secs(30),
        artifacts: dir.path().join("artifacts"),
        output,
        seed: Some(1),
        verbosity,
        ..RunOptions::default()
    };
    let report =
        run_with_backend(registry, &Selection::all(), options, Arc::new(backend), CancellationToken::new())
            .await;
    (report, buffer.contents())
}

fn outcome<'a>(report: &'a RunReport, name: &str) -> &'a Outcome {
    let spec = report
        .specs
        .iter()
        .find(|s| s.full_text.ends_with(name) || s.full_text.contains(&format!(" {name} [")));
    let spec = spec.unwrap_or_else(|| panic!("no spec {name:?}: {:?} {:?}", report.error, report.specs));
    &spec.outcome
}

/// One check for a requirement and a body alike: skips unless the spec is labelled `Fast` and
/// the cluster has a node.
fn labelled_fast(from: &impl ClusterAccess) -> SpecResult {
    if !from.labels().iter().any(|l| l == "Fast") {
        return Err(Skip::because(format!("not labelled Fast: {:?}", from.labels())));
    }
    from.cluster().require_nodes(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_whose_requirements_skip_creates_no_namespace() {
    let mut reg = Registry::new();
    reg.describe("[requirements]", |r| {
        r.it("needs a newer kubelet", async |_| panic!("the body of a skipped spec ran"))
            .labels(["KubeletMinVersion:1.99"]);
        r.it("runs on this kubelet", async |_| Ok(())).labels(["KubeletMinVersion:1.37"]);
        r.it("needs hugepages", async |_| panic!("the body of a skipped spec ran")).requires(
            async |pre: Precheck| {
                let nodes = pre.cluster().ready_nodes().count();
                Err(Skip::because(format!("none of the {nodes} nodes has hugepages-2Mi")))
            },
        );
        r.it("cannot decide", async |_| panic!("the body of an undecided spec ran"))
            .requires(async |_| Err(anyhow::anyhow!("the API server said no").into()));
        r.context("in a small cluster", |r| {
            r.requires(async |pre: Precheck| {
                pre.cluster().require_nodes(4)?;
                Ok(())
            });
            r.it("needs four nodes", async |_| panic!("the body of a skipped spec ran"));
            r.it("needs four nodes too", async |_| panic!("the body of a skipped spec ran"));
        });
        r.it("runs after the context", async |_| Ok(()));
        // The same helper decides from the spec's labels before (Precheck) and in (Ctx) the body.
        r.context_with_labels("shared", ["Shared"], |r| {
            r.requires(async |pre: Precheck| labelled_fast(&pre));
            r.it("is fast", async |ctx: Ctx| labelled_fast(&ctx)).labels(["Fast"]);
            r.it("is slow", async |_| panic!("the body of a skipped spec ran"));
        });
    });
    let backend = FakeCluster::new();
    let (report, _) = run(reg, backend.clone(), Verbosity::Normal).await;

    assert_eq!(
        outcome(&report, "needs a newer kubelet"),
        &Outcome::Skipped {
            reason: "needs kubelet v1.99 or newer (KubeletMinVersion:1.99), but node has v1.37.2".into()
        }
    );
    assert_eq!(
        outcome(&report, "needs hugepages"),
        &Outcome::Skipped { reason: "none of the 1 nodes has hugepages-2Mi".into() }
    );
    for name in ["needs four nodes", "needs four nodes too"] {
        assert_eq!(
            outcome(&report, name),
            &Outcome::Skipped { reason: "needs 4 ready nodes, the cluster has 1".into() },
            "{name}"
        );
    }
    let Outcome::Failed { kind, message, .. } = outcome(&report, "cannot decide") else {
        panic!("{:?}", report.specs)
    };
    assert_eq!(*kind, FailureKind::Setup);
    assert!(message.contains("the API server said no"), "{message}");
    assert_eq!(outcome(&report, "is fast"), &Outcome::Passed);
    assert_eq!(
        outcome(&report, "is slow"),
        &Outcome::Skipped { reason: r#"not labelled Fast: ["Shared"]"#.into() }
    );

    // Only the two specs that ran had a namespace; the others cost nothing.
    let mut journal = backend.journal();
    journal.retain(|entry| !entry.starts_with("gone ") && !entry.starts_with("pods gone "));
    journal.sort();
    assert_eq!(
        journal,
        [
            "create dra-is-fast-x",
            "create dra-runs-after-the-conte-x",
            "create dra-runs-on-this-kubelet-x",
            "delete dra-is-fast-x",
            "delete dra-runs-after-the-conte-x",
            "delete dra-runs-on-this-kubelet-x",
        ]
    );
    for s in report.specs.iter().filter(|s| matches!(s.outcome, Outcome::Skipped { .. })) {
        assert!(s.phases.is_empty(), "{:?}", s.phases);
        assert!(s.duration < Duration::from_secs(1), "{} took {:?}", s.full_text, s.duration);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phases_split_the_spec_at_the_end_of_its_set_up() {
    let mut reg = Registry::new();
    reg.describe("[phases]", |r| {
        r.it("sets up", async |ctx: Ctx| {
            ctx.defer("slow cleanup", async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(())
            });
            ctx.defer_check("slow check", Duration::from_secs(5), async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                Ok(())
            });
            tokio::time::sleep(Duration::from_millis(400)).await;
            ctx.setup_done();
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(())
        });
        r.it("has no set-up", async |_| {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(())
        });
    });
    let (report, output) = run(reg, FakeCluster::new(), Verbosity::Verbose).await;

    let spec = |name: &str| report.specs.iter().find(|s| s.full_text.ends_with(name)).unwrap();
    let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
    let sets_up = spec("sets up").phases;
    assert!(ms(sets_up.setup).is_some_and(|t| (400..1000).contains(&t)), "{sets_up:?}");
    assert!(ms(sets_up.body).is_some_and(|t| (200..800).contains(&t)), "{sets_up:?}");
    assert!(ms(sets_up.cleanup).is_some_and(|t| (300..900).contains(&t)), "{sets_up:?}");
    assert!(ms(sets_up.deferred).is_some_and(|t| (250..900).contains(&t)), "{sets_up:?}");
    let plain = spec("has no set-up").phases;
    assert_eq!(plain.setup, None);
    assert!(ms(plain.body).is_some_and(|t| t >= 100), "{plain:?}");

    // `-v` prints each spec's phases; the summary adds them up.
    let lines: Vec<&str> = output.lines().filter(|l| l.starts_with("  phases: ")).collect();
    assert_eq!(lines.len(), 2, "{output}");
    assert!(lines.iter().any(|l| l.starts_with("  phases: set-up ")), "{output}");
    assert!(lines.iter().any(|l| l.starts_with("  phases: body ")), "{output}");
    let sums = report.phase_sums();
    assert_eq!(sums.setup, sets_up.setup);
    assert_eq!(sums.body, Some(sets_up.body.unwrap() + plain.body.unwrap()));
    assert!(output.contains(&format!("Phases (summed over the spec runs): {}\n", sums.line())), "{output}");
}
