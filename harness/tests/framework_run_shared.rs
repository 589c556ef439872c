//! What the specs of a run share, without a cluster: one value per run, made by the first spec
//! that asks, and run-end clean-ups that run once no spec can run a body or a clean-up any more
//! (beside the last deferred checks), whose failure fails the run.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use harness::framework::{Ctx, Registry, RunReport};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

mod fake_cluster;
use fake_cluster::{Journal, run_recorded};

async fn run(reg: Registry, journal: &Journal, procs: usize) -> RunReport {
    run_recorded(reg, journal, procs, CancellationToken::new()).await
}

/// A run's shared value: how many specs used it, and whether its run-end clean-up is registered.
#[derive(Default)]
struct Shared {
    users: AtomicUsize,
    registered: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_share_one_value_whose_clean_up_runs_beside_the_last_deferred_checks() {
    let journal = Journal::default();
    let ended = Arc::new(Notify::new());
    let mut reg = Registry::new();
    for name in ["first", "second", "third"] {
        let (j, ended) = (journal.clone(), ended.clone());
        reg.it(name, move |ctx: Ctx| {
            let (j, ended) = (j.clone(), ended.clone());
            async move {
                let shared = ctx.run_shared::<Shared>();
                shared.users.fetch_add(1, Ordering::SeqCst);
                if shared.registered.fetch_add(1, Ordering::SeqCst) == 0 {
                    let (j, ended) = (j.clone(), ended.clone());
                    ctx.defer_to_run_end("remove the shared value", Duration::from_secs(5), async move {
                        j.push("run end".to_owned());
                        ended.notify_one();
                        Ok(())
                    });
                }
                let jc = j.clone();
                ctx.defer(format!("{name}: clean up"), async move {
                    jc.push(format!("cleanup {name}"));
                    Ok(())
                });
                // Holds until the run-end clean-up ran: only if that runs beside the deferred
                // checks does this end before its timeout.
                if name == "third" {
                    let jc = j.clone();
                    ctx.defer_observation("the run end to happen", Duration::from_secs(5), async move {
                        ended.notified().await;
                        jc.push("observation saw the run end".to_owned());
                        Ok(())
                    });
                }
                Ok(())
            }
        });
    }
    let report = run(reg, &journal, 2).await;
    assert_eq!((report.passed(), report.failed()), (3, 0), "{:?}", report.specs);
    assert_eq!(report.error, None);
    let entries = journal.entries();
    let at = |what: &str| {
        entries.iter().position(|e| e == what).unwrap_or_else(|| panic!("no {what}: {entries:?}"))
    };
    let run_end = at("run end");
    for name in ["first", "second", "third"] {
        assert!(at(&format!("cleanup {name}")) < run_end, "{entries:?}");
    }
    assert!(run_end < at("observation saw the run end"), "{entries:?}");
    assert_eq!(entries.iter().filter(|e| *e == "run end").count(), 1, "{entries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_run_end_clean_up_fails_the_run_and_says_which() {
    let journal = Journal::default();
    let mut reg = Registry::new();
    reg.it("leaves something", |ctx: Ctx| async move {
        ctx.defer_to_run_end("remove what the run shares", Duration::from_secs(5), async {
            anyhow::bail!("it would not go")
        });
        Ok(())
    });
    let report = run(reg, &journal, 1).await;
    assert_eq!(report.passed(), 1, "{:?}", report.specs);
    let error = report.error.unwrap();
    assert!(
        error.contains("run-end clean-up \"remove what the run shares\" failed: it would not go"),
        "{error}"
    );
}
