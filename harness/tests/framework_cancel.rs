//! A spec that times out or fails at once ([`Ctx::fail_now`]) stops at once: its harness waits
//! watch the spec's cancellation and end with `WaitError::Cancelled`, instead of running on
//! until the runner's cancel grace ends and it aborts the body. In memory, without a cluster.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use harness::{
    framework::{
        Ctx, FailureKind, Outcome, Output, Registry, RunOptions, RunReport, Selection, init_tracing,
        run_with_backend,
    },
    wait::{self, Attempt, WaitError},
};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio_util::sync::CancellationToken;

mod fake_cluster;
use fake_cluster::FakeCluster;

/// How each wait of a spec ended, and how long after the start.
type Ended = Arc<Mutex<Vec<(String, Duration)>>>;

async fn run(registry: Registry) -> (RunReport, Duration) {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (output, _buffer) = Output::capture();
    let options = RunOptions {
        procs: 2,
        default_timeout: Duration::from_secs(30),
        artifacts: dir.path().join("artifacts"),
        // Far longer than the specs may take: a body that ignored its cancellation would be
        // aborted only after this.
        cancel_grace: Duration::from_secs(20),
        output,
        seed: Some(1),
        ..RunOptions::default()
    };
    let started = Instant::now();
    let report = run_with_backend(
        registry,
        &Selection::all(),
        options,
        Arc::new(FakeCluster::hanging()),
        CancellationToken::new(),
    )
    .await;
    (report, started.elapsed())
}

/// A poll and a watch that never succeed, one after the other; records how each ended.
async fn wait_forever(ctx: Ctx, ended: Ended) -> harness::framework::SpecResult {
    let started = Instant::now();
    let polled = wait::poll(
        "an answer that never comes",
        Duration::from_secs(600),
        Duration::from_millis(50),
        || async { Attempt::<()>::Retry("silence".into()) },
    )
    .await;
    fn kind<T: std::fmt::Debug>(r: &Result<T, WaitError>) -> String {
        match r {
            Err(WaitError::Cancelled { .. }) => "cancelled".to_owned(),
            other => format!("{other:?}"),
        }
    }
    ended.lock().unwrap().push((format!("poll {}", kind(&polled)), started.elapsed()));
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(ctx.client().clone(), ctx.namespace());
    let watched =
        wait::object(&api, "never", "a ConfigMap that never comes", Duration::from_secs(600), |_| {
            wait::Verdict::Pending
        })
        .await;
    ended.lock().unwrap().push((format!("watch {}", kind(&watched)), started.elapsed()));
    polled?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_spec_stops_waiting_at_once() {
    let ended = Ended::default();
    let e = ended.clone();
    let mut reg = Registry::new();
    reg.it("waits forever", move |ctx: Ctx| wait_forever(ctx, e.clone())).timeout(Duration::from_millis(300));
    let (report, took) = run(reg).await;
    let spec = &report.specs[0];
    assert!(matches!(spec.outcome, Outcome::Failed { kind: FailureKind::Timeout, .. }), "{:?}", spec.outcome);
    let ended = ended.lock().unwrap().clone();
    let names: Vec<&str> = ended.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["poll cancelled", "watch cancelled"], "{ended:?}");
    assert!(ended[1].1 < Duration::from_secs(2), "{ended:?}");
    assert!(took < Duration::from_secs(5), "the run took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_now_fails_the_spec_at_once_with_its_message() {
    let ended = Ended::default();
    let e = ended.clone();
    let cleaned = Arc::new(Mutex::new(false));
    let c = cleaned.clone();
    let mut reg = Registry::new();
    reg.it("fails from the side", move |ctx: Ctx| {
        let (e, c) = (e.clone(), c.clone());
        async move {
            ctx.defer("note the cleanup", async move {
                *c.lock().unwrap() = true;
                Ok(())
            });
            let side = ctx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                side.fail_now(
                    "proxy pod p of driver d on node n was deleted at T; no replacement ready after S",
                );
                side.fail_now("a second message loses");
            });
            wait_forever(ctx, e).await
        }
    });
    let (report, took) = run(reg).await;
    let spec = &report.specs[0];
    match &spec.outcome {
        Outcome::Failed { kind: FailureKind::Error, message, .. } => {
            assert_eq!(
                message,
                "proxy pod p of driver d on node n was deleted at T; no replacement ready after S"
            )
        }
        other => panic!("{other:?}"),
    }
    let names: Vec<String> = ended.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, ["poll cancelled", "watch cancelled"]);
    assert!(*cleaned.lock().unwrap());
    assert!(took < Duration::from_secs(5), "the run took {took:?}");
}
