//! Each connection of a tunnel after its dial: handed over, followed until it ends, and counted.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{
    Dialed, Shared,
    connection::{SharedIo, TunnelConnection, lock},
    control::{Registered, lock_registry},
};

/// Wraps a dialed connection for hand-over and starts its supervisor.
pub(super) fn adopt(shared: &Arc<Shared>, dialed: Dialed) -> TunnelConnection {
    let Dialed { connection, failure, teardown } = dialed;
    let confirmed_now = failure.is_none();
    shared.update(|s| {
        s.stats.open += 1;
        s.stats.idle += 1;
        if confirmed_now {
            shared.reset_backoff(s);
        }
    });
    let io: SharedIo = Arc::new(std::sync::Mutex::new(Some(connection)));
    let kill = shared.stop.child_token();
    let used = Arc::new(AtomicBool::new(false));
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel();
    let wrapper = TunnelConnection::new(io.clone(), &kill, used.clone(), shared.clone(), dropped_tx);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let by_pause = Arc::new(AtomicBool::new(false));
    {
        // Under the registry's lock, as `pause` closes the registered ones: a dial that was in
        // flight when the tunnel paused ends here, uncounted, like those (else it would count as
        // lost when the proxy behind a paused tunnel restarts, and restart it once more).
        let mut open = lock_registry(shared);
        if shared.state.borrow().stats.paused {
            by_pause.store(true, Ordering::Release);
            kill.cancel();
        }
        open.push(Registered { id, kill: kill.clone(), used: used.clone(), by_pause: by_pause.clone() });
    }
    shared.tracker.spawn(supervise(
        shared.clone(),
        Supervised { id, io, kill, used, by_pause, dropped: dropped_rx, failure, teardown },
    ));
    wrapper
}

struct Supervised {
    id: u64,
    io: SharedIo,
    kill: CancellationToken,
    used: Arc<AtomicBool>,
    by_pause: Arc<AtomicBool>,
    dropped: tokio::sync::oneshot::Receiver<()>,
    failure: Option<BoxFuture<'static, Option<String>>>,
    teardown: Option<BoxFuture<'static, ()>>,
}

enum Event {
    Dropped,
    Killed,
    Failure(Option<String>),
    Settled,
}

/// Follows one connection until it is dropped or killed, then tears its transport down and
/// updates the counters (a connection that ends unused counts as a failure).
async fn supervise(shared: Arc<Shared>, conn: Supervised) {
    let Supervised { id, io, kill, used, by_pause, mut dropped, mut failure, teardown } = conn;
    let settle = tokio::time::sleep(shared.config.settle);
    tokio::pin!(settle);
    let mut settling = failure.is_some();
    // Whether it was ever good (established and not failed): only the end of those is news.
    let mut confirmed = failure.is_none();
    let mut failure_message = None;
    let ended = loop {
        let event = tokio::select! {
            biased;
            _ = &mut dropped => Event::Dropped,
            _ = kill.cancelled() => Event::Killed,
            message = async { match failure.as_mut() { Some(f) => f.await, None => std::future::pending().await } } => {
                Event::Failure(message)
            }
            _ = &mut settle, if settling => Event::Settled,
        };
        match event {
            Event::Dropped => break "closed (its consumer dropped it: end of stream or an error)",
            Event::Killed => break "killed",
            Event::Settled => {
                settling = false;
                confirmed = true;
                shared.confirmed();
            }
            Event::Failure(message) => {
                failure = None;
                settling = false;
                if let Some(message) = message {
                    tracing::debug!(target = %shared.target, error = %message, "tunnel connection failed");
                    failure_message = Some(message);
                    // Make the consumer drop it now rather than on a later EOF.
                    kill.cancel();
                }
            }
        }
    };
    kill.cancel();
    drop(lock(&io).take());
    if let Some(teardown) = teardown
        && tokio::time::timeout(shared.config.close_grace, teardown).await.is_err()
    {
        tracing::debug!(target = %shared.target, grace = ?shared.config.close_grace, "transport did not close in time; aborted");
    }
    lock_registry(&shared).retain(|c| c.id != id);
    let was_used = used.load(Ordering::Acquire);
    let stopping = shared.stop.is_cancelled() && failure_message.is_none();
    let mut consecutive = 0;
    let paused = by_pause.load(Ordering::Acquire);
    shared.update(|s| {
        s.stats.open = s.stats.open.saturating_sub(1);
        if !was_used {
            s.stats.idle = s.stats.idle.saturating_sub(1);
            if !stopping && !paused {
                consecutive = shared.failed(s);
                if confirmed {
                    s.stats.lost_idle += 1;
                }
            }
        }
    });
    if paused && !was_used {
        return;
    }
    if !stopping {
        // The dial loop replaces it (with backoff after failures): say why it went.
        let cause = failure_message.as_deref().unwrap_or(ended);
        if was_used {
            tracing::info!(target = %shared.target, %cause, "tunnel connection ended after use; it is replaced");
        } else if confirmed {
            tracing::info!(target = %shared.target, %cause, consecutive, "idle tunnel connection ended; it is replaced");
        } else {
            tracing::debug!(target = %shared.target, %cause, consecutive, "tunnel connection ended before it was used");
        }
    }
}
