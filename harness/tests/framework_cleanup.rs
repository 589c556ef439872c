//! The clean-up bound without a cluster: a spec whose cleanups hang ends its cleanup within the
//! bound (plus the short allowance of each cleanup left), still starts every later cleanup (the
//! namespace deletion goes out), and its failure names each cleanup given up on. In paused time,
//! so minutes of timeouts take no time.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{sync::Arc, time::Duration};

use harness::framework::{
    CLEANUP_ALLOWANCE, Ctx, FailureKind, Outcome, Output, Registry, RunOptions, Selection, init_tracing,
    run_with_backend,
};
use tokio_util::sync::CancellationToken;

mod fake_cluster;
use fake_cluster::{FakeCluster, Journal};

#[tokio::test(start_paused = true)]
async fn hanging_cleanups_are_given_up_on_after_the_bound_and_the_later_ones_still_run() {
    init_tracing();
    let journal = Journal::default();
    let mut reg = Registry::new();
    let j = journal.clone();
    reg.it("hangs in its cleanup", move |ctx: Ctx| {
        let j = j.clone();
        async move {
            ctx.defer("note the cleanup", async move {
                j.push("cleanup ran");
                Ok(())
            });
            ctx.defer("delete pod b", std::future::pending());
            ctx.defer("delete pod a", std::future::pending());
            ctx.defer("stop the driver", std::future::pending());
            Ok(())
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (output, _buffer) = Output::capture();
    let bound = Duration::from_secs(150);
    let options = RunOptions {
        procs: 1,
        artifacts: dir.path().join("artifacts"),
        cleanup_timeout: Duration::from_secs(120),
        cleanup_bound: bound,
        output,
        seed: Some(1),
        ..RunOptions::default()
    };
    let backend = Arc::new(FakeCluster::recording(&journal));
    let report = run_with_backend(reg, &Selection::all(), options, backend, CancellationToken::new()).await;
    let spec = &report.specs[0];

    // "stop the driver" used its own 2m, "delete pod a" the 30s left, "delete pod b" its
    // allowance; "note the cleanup" and the namespace deletion finished within theirs.
    let cleanup = spec.phases.cleanup.unwrap();
    assert!(cleanup <= bound + 3 * CLEANUP_ALLOWANCE, "cleanup took {cleanup:?}");
    assert!(cleanup >= bound, "cleanup took {cleanup:?}");
    let entries = journal.entries();
    for e in [
        "cleanup ran",
        "delete dra-hangs-in-its-cleanup-x",
        "pods gone dra-hangs-in-its-cleanup-x",
        "gone dra-hangs-in-its-cleanup-x",
    ] {
        assert!(entries.contains(&e.to_owned()), "{e} in {entries:?}");
    }
    let Outcome::Failed { kind: FailureKind::Cleanup, message, details } = &spec.outcome else {
        panic!("{:?}", spec.outcome)
    };
    assert_eq!(
        message,
        "cleanup \"stop the driver\" failed: did not finish within 2m; gave up on 2 cleanups after the \
         2m30s clean-up bound: \"delete pod a\" did not finish within the 30s left of the bound; \
         \"delete pod b\" did not finish within the 5s each cleanup gets once the bound is spent"
    );
    assert!(details.contains("gave up on 2 cleanups"), "{details}");
    // The deferred checks of the namespace (its pods gone, then itself gone) ran and held, after
    // the cleanups.
    let checks: Vec<_> = spec.deferred.iter().map(|c| (c.what.as_str(), c.error.is_none())).collect();
    assert_eq!(
        checks,
        [
            ("the pods of namespace dra-hangs-in-its-cleanup-x to be gone", true),
            ("namespace dra-hangs-in-its-cleanup-x to be gone", true)
        ],
    );
}
