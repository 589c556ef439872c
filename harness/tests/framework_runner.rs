//! The runner core without a cluster: in-memory specs through
//! `run_with_backend` with a backend that records what the runner asks of it.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use harness::framework::{
    ArtifactRequest, ArtifactSource, ClusterBackend, ClusterError, ClusterInfo, Ctx, FailureKind,
    NamespaceRequest, NodeInfo, Outcome, Output, OutputBuffer, PreflightError, Registry, RunOptions,
    RunReport, Selection, Skip, SpecNamespace, SpecReport, init_tracing, run_with_backend,
};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

/// Everything that happened, in order, across specs.
#[derive(Default, Clone)]
struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }
    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    fn position(&self, entry: &str) -> usize {
        self.entries()
            .iter()
            .position(|e| e == entry)
            .unwrap_or_else(|| panic!("{entry:?} not in {:?}", self.entries()))
    }
}

/// A cluster that exists only in memory: namespaces are names in a journal.
struct FakeCluster {
    journal: Journal,
    created: AtomicUsize,
    unreachable: bool,
    refuse_namespaces: bool,
}

impl FakeCluster {
    fn new(journal: &Journal) -> Self {
        Self {
            journal: journal.clone(),
            created: AtomicUsize::new(0),
            unreachable: false,
            refuse_namespaces: false,
        }
    }
}

#[async_trait]
impl ClusterBackend for FakeCluster {
    async fn preflight(&self) -> Result<ClusterInfo, PreflightError> {
        if self.unreachable {
            return Err(PreflightError::Unreachable {
                server: "https://127.0.0.1:1".into(),
                reason: "Connection refused (os error 111)".into(),
            });
        }
        Ok(ClusterInfo {
            server: "https://fake".into(),
            server_version: "v1.37.2".into(),
            api_versions: ["v1".to_owned(), "resource.k8s.io/v1".to_owned()].into(),
            nodes: vec![NodeInfo {
                name: "127.0.0.1".into(),
                kubelet_version: "v1.37.2".into(),
                ready: true,
                schedulable: true,
            }],
            api_server_gates: None,
        })
    }

    fn client(&self) -> kube::Client {
        // Every request fails: these specs never talk to an API server.
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            Err::<http::Response<http_body_util::Empty<bytes::Bytes>>, _>(std::io::Error::other(
                "no cluster in this test",
            ))
        });
        kube::Client::new(service, "default")
    }

    async fn create_namespace(&self, request: &NamespaceRequest) -> Result<SpecNamespace, ClusterError> {
        if self.refuse_namespaces {
            return Err(ClusterError::Other("namespaces are forbidden here".into()));
        }
        let n = self.created.fetch_add(1, Ordering::SeqCst);
        let name = format!("{}{n}", request.generate_name);
        self.journal.push(format!("create {name}"));
        Ok(SpecNamespace { name, uid: format!("uid-{n}") })
    }

    async fn delete_namespace(&self, namespace: &SpecNamespace) -> Result<(), ClusterError> {
        self.journal.push(format!("delete {}", namespace.name));
        Ok(())
    }

    async fn wait_namespace_gone(
        &self,
        namespace: &SpecNamespace,
        _timeout: Duration,
    ) -> Result<(), ClusterError> {
        self.journal.push(format!("gone {}", namespace.name));
        Ok(())
    }

    async fn wait_namespace_pods_gone(
        &self,
        namespace: &SpecNamespace,
        _: Duration,
    ) -> Result<(), ClusterError> {
        self.journal.push(format!("pods gone {}", namespace.name));
        Ok(())
    }

    async fn collect_artifacts(&self, request: ArtifactRequest<'_>) -> Vec<String> {
        self.journal.push(format!("collect {}", request.namespace));
        std::fs::write(request.dir.join("events.yaml"), "items: []\n").unwrap();
        vec![]
    }
}

struct Notes(Journal);

#[async_trait]
impl ArtifactSource for Notes {
    fn name(&self) -> &str {
        "recorded calls"
    }
    async fn collect(&self, dir: &Path) -> anyhow::Result<()> {
        self.0.push("collect source");
        tokio::fs::write(dir.join("calls.yaml"), "calls: []\n").await?;
        Ok(())
    }
}

struct Run {
    report: RunReport,
    output: OutputBuffer,
    dir: tempfile::TempDir,
}

impl Run {
    fn spec(&self, name: &str) -> &SpecReport {
        let found: Vec<_> = self
            .report
            .specs
            .iter()
            .filter(|s| {
                s.full_text == name
                    || s.full_text.ends_with(&format!(" {name}"))
                    || s.full_text.contains(&format!(" {name} ["))
            })
            .collect();
        assert_eq!(found.len(), 1, "{name:?} in {:?}", self.report.specs);
        found[0]
    }
    fn artifacts(&self) -> PathBuf {
        self.dir.path().join("artifacts")
    }
}

fn options(dir: &Path, output: Output) -> RunOptions {
    RunOptions {
        procs: 4,
        default_timeout: Duration::from_secs(30),
        artifacts: dir.join("artifacts"),
        junit: Some(dir.join("out/junit.xml")),
        cancel_grace: Duration::from_secs(5),
        output,
        seed: Some(1),
        ..RunOptions::default()
    }
}

async fn run_with(
    registry: Registry,
    selection: &Selection,
    backend: FakeCluster,
    configure: impl FnOnce(&mut RunOptions),
    interrupt: CancellationToken,
) -> Run {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (output, buffer) = Output::capture();
    let mut opts = options(dir.path(), output);
    configure(&mut opts);
    let report = run_with_backend(registry, selection, opts, Arc::new(backend), interrupt).await;
    Run { report, output: buffer, dir }
}

async fn run(registry: Registry, journal: Journal, configure: impl FnOnce(&mut RunOptions)) -> Run {
    let backend = FakeCluster::new(&journal);
    run_with(registry, &Selection::all(), backend, configure, CancellationToken::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_every_outcome_and_always_cleans_up() {
    let journal = Journal::default();
    let observed_cancel = Arc::new(AtomicBool::new(false));
    let mut reg = Registry::new();
    let j = journal.clone();
    reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
        let j1 = j.clone();
        r.it("passes", move |ctx: Ctx| {
            let j = j1.clone();
            async move {
                tracing::info!(namespace = ctx.namespace(), "passing body ran");
                ctx.defer("note pass", async move {
                    j.push("cleanup pass");
                    Ok(())
                });
                Ok(())
            }
        });
        let j2 = j.clone();
        r.it("fails", move |ctx: Ctx| {
            let j = j2.clone();
            async move {
                let j_first = j.clone();
                ctx.defer("first", async move {
                    j_first.push("cleanup fail first");
                    Ok(())
                });
                ctx.artifact_source(Box::new(Notes(j.clone())));
                ctx.defer("second", async move {
                    j.push("cleanup fail second");
                    Ok(())
                });
                tracing::info!("about to fail");
                use anyhow::Context as _;
                Err(std::io::Error::other("device busy")).context("prepare claim")?;
                Ok(())
            }
        })
        .labels(["Slow"]);
        r.it("skips", async |ctx: Ctx| {
            ctx.cluster().require_nodes(2)?;
            Ok(())
        });
        r.it("skips explicitly", async |_ctx| Err(Skip::because("needs a GPU")));
        let j3 = j.clone();
        r.it("panics", move |ctx: Ctx| {
            let j = j3.clone();
            async move {
                ctx.defer("after panic", async move {
                    j.push("cleanup panic");
                    Ok(())
                });
                if !ctx.namespace().is_empty() {
                    panic!("index out of range");
                }
                Ok(())
            }
        });
        let (j4, flag) = (j.clone(), observed_cancel.clone());
        r.it("times out", move |ctx: Ctx| {
            let (j, flag) = (j4.clone(), flag.clone());
            async move {
                ctx.defer("after timeout", async move {
                    j.push("cleanup timeout");
                    Ok(())
                });
                ctx.cancelled().await;
                flag.store(true, Ordering::SeqCst);
                Ok(())
            }
        })
        .timeout(Duration::from_millis(300));
        r.it("has a failing cleanup", async |ctx: Ctx| {
            ctx.defer("delete DeviceClass x", async { Err(anyhow::anyhow!("forbidden")) });
            Ok(())
        });
    });
    let run = run(reg, journal.clone(), |_| {}).await;
    let r = &run.report;

    // outcomes
    assert_eq!(run.spec("passes").outcome, Outcome::Passed);
    assert!(matches!(&run.spec("fails").outcome,
        Outcome::Failed { kind: FailureKind::Error, message, .. } if message == "prepare claim: device busy"));
    assert_eq!(
        run.spec("skips").outcome,
        Outcome::Skipped { reason: "needs 2 ready nodes, the cluster has 1".into() }
    );
    assert_eq!(run.spec("skips explicitly").outcome, Outcome::Skipped { reason: "needs a GPU".into() });
    assert!(matches!(&run.spec("panics").outcome,
        Outcome::Failed { kind: FailureKind::Panic, message, .. } if message == "panicked: index out of range"));
    assert!(matches!(&run.spec("times out").outcome,
        Outcome::Failed { kind: FailureKind::Timeout, message, .. } if message == "timed out after 300ms"));
    assert!(observed_cancel.load(Ordering::SeqCst), "the timed-out body saw its token cancelled");
    assert!(matches!(&run.spec("failing cleanup").outcome,
        Outcome::Failed { kind: FailureKind::Cleanup, message, .. }
            if message == "cleanup \"delete DeviceClass x\" failed: forbidden"));
    assert_eq!((r.passed(), r.failed(), r.skipped()), (1, 4, 2));
    assert_eq!(r.exit_code(), 1);
    assert!(!r.interrupted);
    assert!(r.error.is_none());

    // cleanups: all ran, in reverse order, the namespace last; artifacts before cleanups
    let entries = journal.entries();
    for c in ["cleanup pass", "cleanup panic", "cleanup timeout"] {
        assert!(entries.contains(&c.to_owned()), "{c} in {entries:?}");
    }
    let creates: Vec<_> = entries.iter().filter(|e| e.starts_with("create ")).collect();
    let deletes: Vec<_> = entries.iter().filter(|e| e.starts_with("delete ")).collect();
    assert_eq!(creates.len(), 7);
    assert_eq!(deletes.len(), 7, "every namespace is deleted: {entries:?}");
    let fail_ns =
        entries.iter().find(|e| e.starts_with("create dra-fails-")).unwrap()["create ".len()..].to_owned();
    let order = [
        format!("collect {fail_ns}"),
        "collect source".to_owned(),
        "cleanup fail second".to_owned(),
        "cleanup fail first".to_owned(),
        format!("delete {fail_ns}"),
        format!("gone {fail_ns}"),
    ];
    let positions: Vec<_> = order.iter().map(|e| journal.position(e)).collect();
    assert!(positions.is_sorted(), "{order:?} at {positions:?} in {entries:?}");

    // captured logs: in the report, and printed with the failure
    assert!(
        run.spec("passes").log.contains("passing body ran namespace=dra-passes-"),
        "{}",
        run.spec("passes").log
    );
    let fail_log = &run.spec("fails").log;
    assert!(fail_log.contains("about to fail"), "{fail_log}");
    assert!(fail_log.contains("cleanup{what=second}: running cleanup"), "{fail_log}");
    let out = run.output.contents();
    assert!(out.contains("PASS ["), "{out}");
    assert!(out.contains("] [sig-node] [DRA] fails [Slow]\n  error failure:\n    prepare claim\n"), "{out}");
    assert!(out.contains("---- captured log ----"), "{out}");
    assert!(out.contains("about to fail"), "{out}");
    assert!(out.contains("SKIP ["), "{out}");
    assert!(out.contains("[sig-node] [DRA] skips explicitly -- needs a GPU"), "{out}");
    assert!(!out.contains("passing body ran"), "passing specs' logs are not printed: {out}");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("1 passed, 4 failed, 2 skipped in "), "{last}");

    // artifacts of failed specs only
    let fail_dir = run.artifacts().join("sig-node_DRA_fails_Slow");
    assert_eq!(run.spec("fails").artifacts.as_deref(), Some(fail_dir.as_path()));
    let failure = std::fs::read_to_string(fail_dir.join("failure.txt")).unwrap();
    assert!(failure.contains("prepare claim") && failure.contains("Caused by"), "{failure}");
    assert!(std::fs::read_to_string(fail_dir.join("spec.log")).unwrap().contains("about to fail"));
    assert!(fail_dir.join("events.yaml").exists());
    assert!(fail_dir.join("recorded_calls/calls.yaml").exists());
    assert!(run.artifacts().join("sig-node_DRA_times_out/failure.txt").exists());
    assert!(run.artifacts().join("sig-node_DRA_panics/spec.log").exists());
    let cleanup_failure =
        std::fs::read_to_string(run.artifacts().join("sig-node_DRA_has_a_failing_cleanup/failure.txt"))
            .unwrap();
    assert!(cleanup_failure.contains("forbidden"), "{cleanup_failure}");
    assert!(!run.artifacts().join("sig-node_DRA_passes").exists());
    assert!(run.spec("passes").artifacts.is_none());

    // JUnit
    let xml = std::fs::read_to_string(run.dir.path().join("out/junit.xml")).unwrap();
    let parsed = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    assert_eq!((parsed.tests, parsed.failures, parsed.skipped), (7, 4, 2));
    let case = parsed.test_suites[0]
        .test_cases
        .iter()
        .find(|c| c.name.as_str() == "[sig-node] [DRA] fails [Slow]")
        .unwrap();
    assert!(case.system_out.as_ref().unwrap().as_str().contains("about to fail"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_specs_concurrently_and_serial_specs_alone() {
    let barrier = Arc::new(Barrier::new(4));
    let running = Arc::new(AtomicUsize::new(0));
    // Never decremented: how many parallel bodies have started so far.
    let started = Arc::new(AtomicUsize::new(0));
    let mut reg = Registry::new();
    for i in 0..4 {
        let (barrier, running, started) = (barrier.clone(), running.clone(), started.clone());
        reg.it(&format!("parallel {i}"), move |_ctx| {
            let (barrier, running, started) = (barrier.clone(), running.clone(), started.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                running.fetch_add(1, Ordering::SeqCst);
                // Only passes if all four bodies run at the same time.
                tokio::time::timeout(Duration::from_secs(20), barrier.wait()).await.map_err(|_| {
                    anyhow::anyhow!("timed out waiting for the 3 other specs to run at the same time")
                })?;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        });
    }
    let (r, s) = (running.clone(), started.clone());
    reg.it("alone", move |_ctx| {
        let (running, started) = (r.clone(), s.clone());
        async move {
            let others = running.load(Ordering::SeqCst);
            if others != 0 {
                return Err(anyhow::anyhow!("{others} specs run next to a Serial spec").into());
            }
            // The serial spec runs first, although it was registered last. (Its PASS line may
            // still come after theirs: it is printed after its deferred checks, and the
            // parallel specs start as soon as its slot is free.)
            let before = started.load(Ordering::SeqCst);
            if before != 0 {
                return Err(anyhow::anyhow!("the Serial spec started after {before} parallel specs").into());
            }
            Ok(())
        }
    })
    .label("Serial");
    let run = run(reg, Journal::default(), |o| o.procs = 4).await;
    assert_eq!(run.report.passed(), 5, "{}", run.output.contents());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_one_at_a_time_with_one_proc() {
    let running = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let mut reg = Registry::new();
    for i in 0..4 {
        let (running, max) = (running.clone(), max.clone());
        reg.it(&format!("spec {i}"), move |_ctx| {
            let (running, max) = (running.clone(), max.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        });
    }
    let run = run(reg, Journal::default(), |o| o.procs = 1).await;
    assert_eq!(run.report.passed(), 4);
    assert_eq!(max.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_cancels_running_specs_runs_cleanups_and_skips_the_rest() {
    let journal = Journal::default();
    let started = Arc::new(Barrier::new(3));
    let mut reg = Registry::new();
    for i in 0..2 {
        let (j, started) = (journal.clone(), started.clone());
        reg.it(&format!("waits {i}"), move |ctx: Ctx| {
            let (j, started) = (j.clone(), started.clone());
            async move {
                ctx.defer("note", async move {
                    j.push(format!("cleanup {i}"));
                    Ok(())
                });
                started.wait().await;
                ctx.cancelled().await;
                Ok(())
            }
        });
    }
    reg.it("never starts", async |_ctx| Ok(()));
    let interrupt = CancellationToken::new();
    let trigger = interrupt.clone();
    tokio::spawn(async move {
        started.wait().await;
        trigger.cancel();
    });
    let backend = FakeCluster::new(&journal);
    let run = run_with(reg, &Selection::all(), backend, |o| o.procs = 2, interrupt).await;
    let r = &run.report;
    assert!(r.interrupted);
    assert_eq!(r.exit_code(), 130);
    for i in 0..2 {
        assert!(matches!(
            run.spec(&format!("waits {i}")).outcome,
            Outcome::Failed { kind: FailureKind::Interrupted, .. }
        ));
        assert!(journal.entries().contains(&format!("cleanup {i}")));
    }
    assert_eq!(
        run.spec("never starts").outcome,
        Outcome::Skipped { reason: "not run: the run was interrupted".into() }
    );
    assert_eq!(journal.entries().iter().filter(|e| e.starts_with("delete ")).count(), 2);
    assert!(run.dir.path().join("out/junit.xml").exists());
    let out = run.output.contents();
    assert!(out.contains("Interrupted: 1 spec run(s) did not start."), "{out}");
    assert!(out.trim_end().lines().last().unwrap().starts_with("0 passed, 2 failed, 1 skipped in "), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_ignores_cancellation_is_aborted_and_cleaned_up() {
    let journal = Journal::default();
    let j = journal.clone();
    let mut reg = Registry::new();
    reg.it("hangs", move |ctx: Ctx| {
        let j = j.clone();
        async move {
            ctx.defer("after hang", async move {
                j.push("cleanup hang");
                Ok(())
            });
            std::future::pending::<()>().await;
            Ok(())
        }
    })
    .timeout(Duration::from_millis(100));
    let run = run(reg, journal.clone(), |o| o.cancel_grace = Duration::from_millis(100)).await;
    assert!(matches!(run.spec("hangs").outcome, Outcome::Failed { kind: FailureKind::Timeout, .. }));
    assert!(run.spec("hangs").log.contains("did not return within 100ms of being cancelled; aborting it"));
    assert!(journal.entries().contains(&"cleanup hang".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selection_picks_specs() {
    let mut reg = Registry::new();
    reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context("control plane", |r| {
            r.it("a", async |_| Ok(()));
            r.it("slow", async |_| Ok(())).label("Slow");
        });
        r.context_with_labels("kubelet", ["Feature:DynamicResourceAllocation"], |r| {
            r.it("b", async |_| Ok(()));
            r.it("alpha", async |_| Ok(())).labels(["Feature:OffByDefault"]);
        });
    });
    let journal = Journal::default();
    let selection = Selection::new(
        &[],
        &["control plane a$".to_owned()],
        Some("DRA && Feature: isSubsetOf { DynamicResourceAllocation } && !Slow"),
    )
    .unwrap();
    let backend = FakeCluster::new(&journal);
    let run = run_with(reg, &selection, backend, |_| {}, CancellationToken::new()).await;
    let ran: Vec<_> = run.report.specs.iter().map(|s| s.full_text.as_str()).collect();
    assert_eq!(ran, ["[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] b"]);
    assert!(run.output.contents().starts_with(
        "Random Seed: 1\nRunning 1 of 4 specs, 4 in parallel, against https://fake (v1.37.2, 1 ready node)"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_names_the_failing_attempt() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut reg = Registry::new();
    let a = attempts.clone();
    reg.it("flaky", move |ctx: Ctx| {
        let a = a.clone();
        async move {
            a.fetch_add(1, Ordering::SeqCst);
            if ctx.attempt() == 2 {
                return Err(anyhow::anyhow!("flaked").into());
            }
            Ok(())
        }
    });
    let run = run(reg, Journal::default(), |o| o.repeat = 3).await;
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let outcomes: Vec<_> = run.report.specs.iter().map(|s| (s.attempt, s.outcome.is_failed())).collect();
    assert_eq!(outcomes, [(1, false), (2, true), (3, false)]);
    assert!(run.artifacts().join("flaky-attempt-2/failure.txt").exists());
    let out = run.output.contents();
    assert!(out.contains("FAIL [") && out.contains("] flaky (attempt 2/3)\n"), "{out}");
    assert!(out.contains("  FAIL flaky (attempt 2/3) [error]: flaked"), "{out}");
    let xml = std::fs::read_to_string(run.dir.path().join("out/junit.xml")).unwrap();
    assert!(xml.contains("name=\"flaky (attempt 2/3)\""), "{xml}");
    assert_eq!(run.report.exit_code(), 1);
}

#[tokio::test]
async fn preflight_failure_is_a_configuration_error() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    reg.it("never runs", async |_| Ok(()));
    let backend = FakeCluster { unreachable: true, ..FakeCluster::new(&journal) };
    let run = run_with(reg, &Selection::all(), backend, |_| {}, CancellationToken::new()).await;
    assert_eq!(run.report.exit_code(), 2);
    let error = run.report.error.as_deref().unwrap();
    assert!(
        error.starts_with("cannot reach the API server at https://127.0.0.1:1: Connection refused"),
        "{error}"
    );
    assert!(run.report.specs.is_empty());
    assert!(journal.entries().is_empty());
}

/// A spec that fails its first `failures` runs, then passes.
fn flaky_spec(reg: &mut Registry, name: &str, failures: usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    reg.it(name, move |_| {
        let runs = runs.clone();
        async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if run <= failures {
                return Err(anyhow::anyhow!("failure {run}").into());
            }
            Ok(())
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flake_attempts_retry_failures_and_report_flaky_specs() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    flaky_spec(&mut reg, "flakes twice", 2);
    flaky_spec(&mut reg, "always fails", usize::MAX);
    flaky_spec(&mut reg, "passes", 0);
    let run = run(reg, journal.clone(), |o| o.flake_attempts = 3).await;
    let out = run.output.contents();
    let by_name = |name: &str| run.report.specs.iter().find(|s| s.full_text == name).unwrap();
    let flaky = by_name("flakes twice");
    assert!(flaky.is_flaky() && flaky.tries == 3, "{out}");
    assert_eq!(flaky.earlier_failures.len(), 2, "{:?}", flaky.earlier_failures);
    assert!(flaky.earlier_failures[0].starts_with("try 1: failure 1"), "{:?}", flaky.earlier_failures);
    let failing = by_name("always fails");
    assert!(failing.outcome.is_failed() && failing.tries == 3, "{out}");
    assert_eq!(by_name("passes").tries, 1);
    assert_eq!((run.report.passed(), run.report.failed(), run.report.flaky()), (2, 1, 1));
    assert!(
        out.contains("PASS ") && out.contains("flakes twice [FLAKEY TEST - TOOK 3 ATTEMPTS TO PASS]"),
        "{out}"
    );
    assert!(out.contains("(try 1 of 3, retrying)"), "{out}");
    assert!(out.contains("1 flaky (passed on a retry):"), "{out}");
    assert!(out.contains("2 passed, 1 failed, 0 skipped in"), "{out}");
    // Each failed try has its own artifact folder.
    assert!(run.dir.path().join("artifacts/flakes_twice").exists());
    assert!(run.dir.path().join("artifacts/flakes_twice-try-2").exists());
    let xml = std::fs::read_to_string(run.dir.path().join("out/junit.xml")).unwrap();
    assert!(xml.contains("flakyFailure"), "{xml}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_starts_no_new_spec_after_a_failure() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    reg.describe("suite", |r| {
        r.it("fails", async |_| Err(anyhow::anyhow!("boom").into()));
        for name in ["second", "third"] {
            let j = journal.clone();
            r.it(name, move |_| {
                let j = j.clone();
                async move {
                    j.push(format!("ran {name}"));
                    Ok(())
                }
            });
        }
    });
    let run = run(reg, journal.clone(), |o| {
        o.procs = 1;
        o.fail_fast = true;
    })
    .await;
    let out = run.output.contents();
    assert_eq!(run.report.exit_code(), 1, "{out}");
    assert!(!journal.entries().iter().any(|e| e.starts_with("ran ")), "{:?}", journal.entries());
    let skipped: Vec<_> = run
        .report
        .specs
        .iter()
        .filter(|s| matches!(&s.outcome, Outcome::Skipped { reason } if reason.contains("--fail-fast")))
        .collect();
    assert_eq!(skipped.len(), 2, "{out}");
    assert!(out.contains("--fail-fast: 2 spec run(s) did not start after a failure."), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_starts_specs_in_the_same_order() {
    async fn start_order(seed: u64) -> Vec<String> {
        let journal = Journal::default();
        let mut reg = Registry::new();
        for c in ["a", "b", "c", "d", "e"] {
            let j = journal.clone();
            reg.describe(c, move |r| {
                for s in ["1", "2"] {
                    let j = j.clone();
                    r.it(s, move |ctx: Ctx| {
                        let j = j.clone();
                        async move {
                            j.push(format!("started {}", ctx.full_text()));
                            Ok(())
                        }
                    });
                }
            });
        }
        let run = run(reg, journal.clone(), |o| {
            o.procs = 1;
            o.seed = Some(seed);
        })
        .await;
        assert!(run.output.contents().starts_with(&format!("Random Seed: {seed}\n")));
        journal.entries().into_iter().filter(|e| e.starts_with("started ")).collect()
    }
    let first = start_order(7).await;
    assert_eq!(first.len(), 10);
    assert_eq!(first, start_order(7).await, "one seed, two orders");
    let mut others = Vec::new();
    for seed in 0..8 {
        others.push(start_order(seed).await);
    }
    assert!(others.iter().any(|o| o != &first), "eight other seeds all gave seed 7's order");
}

#[tokio::test]
async fn a_required_api_the_cluster_lacks_stops_the_run_before_any_spec() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    reg.require_api("resource.k8s.io/v1", "unused");
    reg.require_api("example.io/v1", "the example specs need example.io/v1");
    reg.it("never runs", async |_| Ok(()));
    let run = run(reg, journal.clone(), |_| {}).await;
    assert_eq!(run.report.exit_code(), 2);
    let error = run.report.error.as_deref().unwrap();
    assert_eq!(
        error,
        "the cluster at https://fake does not serve example.io/v1 (no version of example.io is served); the example specs need example.io/v1"
    );
    assert!(journal.entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_each_hooks_run_for_every_spec_before_its_body() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    let j = journal.clone();
    reg.before_each(move |ctx| j.push(format!("hook {}", ctx.full_text())));
    for name in ["a", "b"] {
        let j = journal.clone();
        reg.it(name, move |ctx: Ctx| {
            let j = j.clone();
            async move {
                j.push(format!("body {}", ctx.full_text()));
                Ok(())
            }
        });
    }
    let run = run(reg, journal.clone(), |o| o.procs = 1).await;
    assert_eq!(run.report.exit_code(), 0, "{}", run.output.contents());
    for name in ["a", "b"] {
        assert!(journal.position(&format!("hook {name}")) < journal.position(&format!("body {name}")));
    }
}

#[tokio::test]
async fn namespace_failure_fails_the_spec_without_running_it() {
    let journal = Journal::default();
    let ran = Arc::new(AtomicBool::new(false));
    let mut reg = Registry::new();
    let r = ran.clone();
    reg.it("needs a namespace", move |_| {
        let r = r.clone();
        async move {
            r.store(true, Ordering::SeqCst);
            Ok(())
        }
    });
    let backend = FakeCluster { refuse_namespaces: true, ..FakeCluster::new(&journal) };
    let run = run_with(reg, &Selection::all(), backend, |_| {}, CancellationToken::new()).await;
    assert!(matches!(&run.spec("needs a namespace").outcome,
        Outcome::Failed { kind: FailureKind::Setup, message, .. }
            if message == "cannot create the spec's namespace: namespaces are forbidden here"));
    assert!(!ran.load(Ordering::SeqCst));
    assert!(run.artifacts().join("needs_a_namespace/failure.txt").exists());
}

#[tokio::test]
async fn invalid_registry_is_a_configuration_error() {
    let mut reg = Registry::new();
    reg.it("twice", async |_| Ok(()));
    reg.it("twice", async |_| Ok(()));
    let run = run(reg, Journal::default(), |_| {}).await;
    assert_eq!(run.report.exit_code(), 2);
    assert_eq!(run.report.error.as_deref(), Some("invalid spec registration: two specs are named \"twice\""));
}

/// Upstream's `WithKubeletMinVersion`: a spec whose `KubeletMinVersion` (its own or its
/// context's) no schedulable node's kubelet meets is skipped with the reason before its
/// namespace is created; one that a node meets runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_min_version_no_node_meets_skips_before_the_namespace() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("new kubelets", ["KubeletMinVersion:1.38"], |r| {
            r.it("needs 1.38", async |_ctx| Ok(()));
        });
        r.it("needs 1.37", async |_ctx| Ok(())).label("KubeletMinVersion:1.37");
    });
    let run = run(reg, journal.clone(), |_| {}).await;
    assert_eq!(
        run.spec("needs 1.38").outcome,
        Outcome::Skipped {
            reason: "needs kubelet v1.38 or newer (KubeletMinVersion:1.38), but 127.0.0.1 has v1.37.2".into()
        }
    );
    assert_eq!(run.spec("needs 1.37").outcome, Outcome::Passed);
    let created: Vec<String> = journal.entries().into_iter().filter(|e| e.starts_with("create ")).collect();
    assert_eq!(created.len(), 1, "only the spec that runs gets a namespace: {created:?}");
}
