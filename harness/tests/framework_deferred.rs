//! Deferred checks without a cluster: they run after the spec released its worker slot, fail
//! the spec that registered them (saying which check, after how long), and run also after Ctrl-C.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use harness::framework::{Ctx, FailureKind, Outcome, Registry, RunReport};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

mod fake_cluster;
use fake_cluster::{Journal, run_recorded};

async fn run(reg: Registry, journal: &Journal, procs: usize, interrupt: CancellationToken) -> RunReport {
    run_recorded(reg, journal, procs, interrupt).await
}

/// The bodies that started, and a way to wait for a set of them.
#[derive(Default, Clone)]
struct Started(Arc<(Mutex<BTreeSet<String>>, Notify)>);

impl Started {
    fn add(&self, name: &str) {
        self.0.0.lock().unwrap().insert(name.to_owned());
        self.0.1.notify_waiters();
    }
    async fn wait_for(&self, names: &[&str]) {
        loop {
            let notified = self.0.1.notified();
            if names.iter().all(|n| self.0.0.lock().unwrap().contains(*n)) {
                return;
            }
            notified.await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_check_runs_after_the_slot_is_released() {
    // With -p 1 each spec's check waits until the other spec's body has started: both can hold
    // only if a spec's slot is released before its deferred checks run.
    let (journal, started) = (Journal::default(), Started::default());
    let mut reg = Registry::new();
    for name in ["first", "second"] {
        let (started, j) = (started.clone(), journal.clone());
        reg.it(name, move |ctx: Ctx| {
            let (started, j) = (started.clone(), j.clone());
            async move {
                started.add(name);
                ctx.defer_check(format!("{name}: both bodies started"), Duration::from_secs(5), async move {
                    started.wait_for(&["first", "second"]).await;
                    j.push(format!("check {name} held"));
                    Ok(())
                });
                Ok(())
            }
        });
    }
    let report = run(reg, &journal, 1, CancellationToken::new()).await;
    assert_eq!((report.passed(), report.failed()), (2, 0), "{:?}", report.specs);
    for spec in &report.specs {
        let checks: Vec<_> = spec.deferred.iter().map(|c| (c.what.as_str(), c.error.is_none())).collect();
        let name = spec.full_text.as_str();
        assert_eq!(
            checks,
            [
                (format!("{name}: both bodies started").as_str(), true),
                (&*format!("the pods of namespace dra-{name}-x to be gone"), true),
                (&*format!("namespace dra-{name}-x to be gone"), true)
            ],
        );
    }
    let entries = journal.entries();
    assert!(entries.contains(&"check first held".to_owned()), "{entries:?}");
    assert!(entries.contains(&"check second held".to_owned()), "{entries:?}");
    assert!(entries.contains(&"gone dra-first-x".to_owned()), "{entries:?}");
    assert!(entries.contains(&"gone dra-second-x".to_owned()), "{entries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_specs_run_first_on_a_quiet_cluster_and_their_checks_overlap_the_parallel_specs() {
    // "parallel" is registered first but starts last. The second serial spec starts only after
    // the first one's deferred check ended; the parallel spec's body and the last serial spec's
    // check each wait for the other to have started, so both hold only if they overlap.
    let (journal, started) = (Journal::default(), Started::default());
    let mut reg = Registry::new();
    let s = started.clone();
    reg.it("parallel", move |_ctx: Ctx| {
        let s = s.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), s.wait_for(&["serial two: checking"]))
                .await
                .map_err(|_| anyhow::anyhow!("the last serial spec's check did not run meanwhile"))?;
            s.add("parallel");
            Ok(())
        }
    });
    let s = started.clone();
    reg.it("serial one", move |ctx: Ctx| {
        let s = s.clone();
        async move {
            ctx.defer_check("serial one: a slow check", Duration::from_secs(5), async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                s.add("serial one: check");
                Ok(())
            });
            Ok(())
        }
    })
    .label("Serial");
    let s = started.clone();
    reg.it("serial two", move |ctx: Ctx| {
        let s = s.clone();
        async move {
            if !s.0.0.lock().unwrap().contains("serial one: check") {
                return Err(anyhow::anyhow!("started before the first serial spec's check ended").into());
            }
            ctx.defer_check("serial two: the parallel spec started", Duration::from_secs(5), async move {
                s.add("serial two: checking");
                s.wait_for(&["parallel"]).await;
                Ok(())
            });
            Ok(())
        }
    })
    .label("Serial");
    let report = run(reg, &journal, 2, CancellationToken::new()).await;
    assert_eq!((report.passed(), report.failed()), (3, 0), "{:?}", report.specs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_spec_waits_for_settling_checks_before_it_but_not_for_observations() {
    // Two serial specs, in either order: the second fails if it starts before the first one's
    // settling check ended, and the first one's observation holds only if the second starts
    // while it still runs.
    let (journal, started) = (Journal::default(), Started::default());
    let mut reg = Registry::new();
    for (spec, name, other) in [("serial one", "one", "two"), ("serial two", "two", "one")] {
        let s = started.clone();
        reg.it(spec, move |ctx: Ctx| {
            let s = s.clone();
            async move {
                let seen = s.0.0.lock().unwrap().clone();
                if seen.contains(other) && !seen.contains(&format!("{other}: settled")) {
                    return Err(
                        anyhow::anyhow!("started before serial {other}'s settling check ended").into()
                    );
                }
                s.add(name);
                let settling = s.clone();
                ctx.defer_check(format!("{name}: its objects gone"), Duration::from_secs(5), async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    settling.add(&format!("{name}: settled"));
                    Ok(())
                });
                ctx.defer_observation(
                    format!("{name}: the other spec starts meanwhile"),
                    Duration::from_secs(5),
                    async move {
                        s.wait_for(&[other]).await;
                        Ok(())
                    },
                );
                Ok(())
            }
        })
        .label("Serial");
    }
    let report = run(reg, &journal, 2, CancellationToken::new()).await;
    assert_eq!((report.passed(), report.failed()), (2, 0), "{:?}", report.specs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_observation_fails_its_spec_and_the_run_waits_for_it() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    let j = journal.clone();
    reg.it("observed", move |ctx: Ctx| {
        let j = j.clone();
        async move {
            ctx.defer_observation("the slices to be gone", Duration::from_secs(5), async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                j.push("observation ended".to_owned());
                Err(anyhow::anyhow!("2 slices left"))
            });
            Ok(())
        }
    });
    let report = run(reg, &journal, 2, CancellationToken::new()).await;
    assert!(journal.entries().contains(&"observation ended".to_owned()), "the run did not wait for it");
    let observed = report.specs.iter().find(|s| s.full_text == "observed").unwrap();
    let Outcome::Failed { message, .. } = &observed.outcome else { panic!("{:?}", observed.outcome) };
    assert!(message.contains("the slices to be gone") && message.contains("2 slices left"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_deferred_check_fails_its_spec_saying_which_and_after_how_long() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    reg.it("times out", async |ctx: Ctx| {
        ctx.defer_check("pod x to be gone", Duration::from_millis(200), std::future::pending());
        Ok(())
    });
    reg.it("fails from a cleanup", async |ctx: Ctx| {
        let c = ctx.clone();
        // A cleanup that deletes something registers the wait for it to be gone.
        ctx.defer("delete thing y", async move {
            c.defer_check("thing y to be gone", Duration::from_secs(5), async {
                Err(anyhow::anyhow!("thing y still has a finalizer"))
            });
            Ok(())
        });
        Ok(())
    });
    let report = run(reg, &journal, 2, CancellationToken::new()).await;
    assert_eq!((report.passed(), report.failed()), (0, 2));
    let spec = |text: &str| report.specs.iter().find(|s| s.full_text == text).unwrap();

    let timed_out = spec("times out");
    let Outcome::Failed { kind: FailureKind::Cleanup, message, .. } = &timed_out.outcome else {
        panic!("{:?}", timed_out.outcome)
    };
    assert!(
        message.starts_with("deferred check \"pod x to be gone\" failed after 2")
            && message.ends_with(": did not hold within 200ms"),
        "{message}"
    );
    let check = &timed_out.deferred[0];
    assert!(check.duration >= Duration::from_millis(200), "{check:?}");
    assert_eq!(check.error.as_deref(), Some("did not hold within 200ms"));
    assert!(timed_out.duration < check.duration + Duration::from_secs(1), "the slot time excludes the check");

    let failed = spec("fails from a cleanup");
    let Outcome::Failed { kind: FailureKind::Cleanup, message, .. } = &failed.outcome else {
        panic!("{:?}", failed.outcome)
    };
    assert!(
        message.starts_with("deferred check \"thing y to be gone\" failed after ")
            && message.ends_with(": thing y still has a finalizer"),
        "{message}"
    );
    // The namespace's own check ran too, and held.
    assert!(
        journal.entries().contains(&"gone dra-fails-from-a-cleanup-x".to_owned()),
        "{:?}",
        journal.entries()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_ctrl_c_cleanups_and_deferred_checks_still_run() {
    let journal = Journal::default();
    let interrupt = CancellationToken::new();
    let mut reg = Registry::new();
    let (j, trigger) = (journal.clone(), interrupt.clone());
    reg.it("interrupted", move |ctx: Ctx| {
        let (j, trigger) = (j.clone(), trigger.clone());
        async move {
            ctx.defer_check("slices to be gone", Duration::from_secs(5), async move {
                j.push("check ran");
                Ok(())
            });
            trigger.cancel();
            ctx.cancelled().await;
            Ok(())
        }
    });
    let report = run(reg, &journal, 1, interrupt).await;
    assert!(report.interrupted);
    let spec = &report.specs[0];
    assert!(
        matches!(spec.outcome, Outcome::Failed { kind: FailureKind::Interrupted, .. }),
        "{:?}",
        spec.outcome
    );
    assert_eq!(spec.deferred.len(), 3, "{:?}", spec.deferred);
    let entries = journal.entries();
    for e in
        ["delete dra-interrupted-x", "check ran", "pods gone dra-interrupted-x", "gone dra-interrupted-x"]
    {
        assert!(entries.contains(&e.to_owned()), "{e} in {entries:?}");
    }
}
