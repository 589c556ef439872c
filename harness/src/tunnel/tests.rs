//! The tunnel's bookkeeping against a scripted in-memory dialer (paused time: backoff delays
//! cost nothing and are exact).
#![allow(clippy::unwrap_used)]

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use futures::{FutureExt as _, StreamExt as _};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream},
    sync::oneshot,
    time::Instant,
};

use super::*;
use crate::plugin::{ConnectionStream, Listener};

/// What one dial does.
enum Outcome {
    Retry,
    Gone(&'static str),
    /// A connection whose failure report comes when the sender fires (or never, if dropped
    /// without sending... then `None`).
    Failing(oneshot::Receiver<String>),
    /// A connection whose teardown never finishes by itself; the flag is set when it is dropped.
    SlowTeardown(Arc<AtomicBool>),
    /// A dial that returns a connection once the sender fires.
    Gated(oneshot::Receiver<()>),
}

#[derive(Debug, Default)]
struct FakeDialer {
    script: Mutex<VecDeque<Outcome>>,
    /// The remote ends, in dial order.
    peers: Mutex<Vec<DuplexStream>>,
    checks: AtomicUsize,
    /// `check` reports the target gone from this check on (1-based).
    gone_at_check: Option<usize>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Outcome")
    }
}

impl FakeDialer {
    fn with(script: impl IntoIterator<Item = Outcome>) -> Self {
        FakeDialer { script: Mutex::new(script.into_iter().collect()), ..Default::default() }
    }

    fn peer(&self, i: usize) -> DuplexStream {
        let mut peers = self.peers.lock().unwrap();
        let (placeholder, _) = tokio::io::duplex(1);
        std::mem::replace(&mut peers[i], placeholder)
    }
}

#[async_trait]
impl Dialer for FakeDialer {
    async fn dial(&self) -> Result<Dialed, DialError> {
        let mut outcome = self.script.lock().unwrap().pop_front();
        if let Some(Outcome::Gated(gate)) = outcome.take_if(|o| matches!(o, Outcome::Gated(_))) {
            let _ = gate.await;
        }
        let (local, remote) = tokio::io::duplex(1024);
        let mut dialed = Dialed::plain(local);
        match outcome {
            Some(Outcome::Retry) => return Err(DialError::Retry("connection refused".into())),
            Some(Outcome::Gone(reason)) => return Err(DialError::Gone(reason.into())),
            Some(Outcome::Failing(rx)) => dialed.failure = Some(rx.map(Result::ok).boxed()),
            Some(Outcome::SlowTeardown(dropped)) => {
                struct SetOnDrop(Arc<AtomicBool>);
                impl Drop for SetOnDrop {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::SeqCst);
                    }
                }
                let guard = SetOnDrop(dropped);
                dialed.teardown = Some(
                    async move {
                        let _guard = guard;
                        std::future::pending::<()>().await;
                    }
                    .boxed(),
                );
            }
            Some(Outcome::Gated(_)) | None => {}
        }
        self.peers.lock().unwrap().push(remote);
        Ok(dialed)
    }

    async fn check(&self) -> Result<(), String> {
        let n = self.checks.fetch_add(1, Ordering::SeqCst) + 1;
        match self.gone_at_check {
            Some(at) if n >= at => Err("pod ns/proxy was deleted".into()),
            _ => Ok(()),
        }
    }

    fn target(&self) -> String {
        "fake".into()
    }
}

fn config(idle: usize) -> TunnelConfig {
    TunnelConfig { idle, ..TunnelConfig::default() }
}

fn start(dialer: &Arc<FakeDialer>, config: TunnelConfig) -> (Tunnel, ConnectionStream) {
    let (sender, listener) = Listener::channel(64);
    let Listener::Connections(incoming) = listener else { unreachable!() };
    (Tunnel::start(dialer.clone(), sender, config), incoming)
}

const T: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn keeps_idle_connections_and_replaces_used_ones() {
    let dialer = Arc::new(FakeDialer::default());
    let (tunnel, mut incoming) = start(&dialer, config(3));
    tunnel.wait_for("3 handed over", T, |s| s.idle == 3 && s.handed_over == 3).await.unwrap();
    let mut first = incoming.next().await.unwrap().unwrap();

    // The remote side speaks first: the connection is used and replaced.
    let mut peer = dialer.peer(0);
    peer.write_all(b"PRI").await.unwrap();
    let mut buf = [0; 3];
    first.read_exact(&mut buf).await.unwrap();
    let stats = tunnel.wait_for("a replacement", T, |s| s.dials == 4 && s.idle == 3).await.unwrap();
    assert_eq!((stats.used, stats.open, stats.failures), (1, 4, 0), "{stats:?}");

    // Closing a used connection is no failure; idle ones stay.
    drop(first);
    let stats = tunnel.wait_for("3 open", T, |s| s.open == 3).await.unwrap();
    assert_eq!((stats.idle, stats.failures, stats.dials), (3, 0, 4), "{stats:?}");
    let mut buf = Vec::new();
    assert_eq!(peer.read_to_end(&mut buf).await.unwrap(), 0, "the remote side sees EOF");

    let stats = tunnel.close().await.unwrap();
    assert_eq!((stats.open, stats.idle), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn failed_dials_back_off_and_end_when_the_target_is_gone() {
    let dialer = Arc::new(FakeDialer {
        gone_at_check: Some(2),
        ..FakeDialer::with(std::iter::repeat_with(|| Outcome::Retry).take(20))
    });
    let began = Instant::now();
    let (tunnel, _incoming) = start(&dialer, config(3));
    let reason = tokio::time::timeout(T, tunnel.gone()).await.unwrap();
    assert_eq!(reason, "pod ns/proxy was deleted");
    assert_eq!(tunnel.end(), Some(TunnelEnd::TargetGone(reason)));
    // Checks after 5 and 10 consecutive failures; delays 0.1, 0.2, 0.4, 0.8, then 1 s each.
    assert_eq!(dialer.checks.load(Ordering::SeqCst), 2);
    assert_eq!(tunnel.stats().failures, 10);
    assert_eq!(began.elapsed(), Duration::from_millis(100 + 200 + 400 + 800 + 5 * 1000));
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dialer_can_report_the_target_gone_directly() {
    let dialer = Arc::new(FakeDialer::with([Outcome::Retry, Outcome::Gone("pod ns/proxy not found")]));
    let (tunnel, _incoming) = start(&dialer, config(3));
    assert_eq!(tokio::time::timeout(T, tunnel.gone()).await.unwrap(), "pod ns/proxy not found");
    assert_eq!(tunnel.stats().dials, 2);
}

#[tokio::test(start_paused = true)]
async fn a_reported_failure_closes_the_connection_and_counts() {
    let (fail, failed) = oneshot::channel();
    let dialer = Arc::new(FakeDialer::with([Outcome::Failing(failed)]));
    let (tunnel, mut incoming) = start(&dialer, config(1));
    let mut connection = incoming.next().await.unwrap().unwrap();
    fail.send("error forwarding port 9001: connection refused".into()).unwrap();
    let mut buf = [0; 1];
    let err = connection.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionAborted);
    drop(connection);
    // Counted, then replaced after the backoff.
    let stats = tunnel.wait_for("a replacement", T, |s| s.dials == 2 && s.idle == 1).await.unwrap();
    assert_eq!(stats.failures, 1, "{stats:?}");
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unused_connection_that_ends_counts_as_failure() {
    let dialer = Arc::new(FakeDialer::default());
    let (tunnel, mut incoming) = start(&dialer, config(1));
    let connection = incoming.next().await.unwrap().unwrap();
    // The remote side closes before sending anything (e.g. the proxy process was killed).
    drop(dialer.peer(0));
    drop(connection);
    let stats = tunnel.wait_for("a replacement", T, |s| s.dials == 2 && s.idle == 1).await.unwrap();
    assert_eq!((stats.failures, stats.used), (1, 0), "{stats:?}");
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn close_closes_handed_over_connections_and_bounds_teardown() {
    let torn_down = Arc::new(AtomicBool::new(false));
    let dialer = Arc::new(FakeDialer::with([Outcome::SlowTeardown(torn_down.clone())]));
    let (tunnel, mut incoming) = start(&dialer, config(2));
    tunnel.wait_for("2 handed over", T, |s| s.handed_over == 2).await.unwrap();
    let mut held = incoming.next().await.unwrap().unwrap();
    let mut peer = dialer.peer(0);
    let began = Instant::now();
    let stats = tunnel.close().await.unwrap();
    assert_eq!((stats.open, stats.idle, stats.failures), (0, 0, 0), "{stats:?}");
    // The slow teardown was cut off after the grace period.
    assert!(torn_down.load(Ordering::SeqCst));
    assert_eq!(began.elapsed(), TunnelConfig::default().close_grace);
    // The consumer still holds the connection, but it is closed on both sides.
    let mut buf = [0; 1];
    assert!(held.read(&mut buf).await.is_err());
    assert_eq!(peer.read(&mut buf).await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_gone_consumer_stops_dialing() {
    let dialer = Arc::new(FakeDialer::default());
    let (tunnel, incoming) = start(&dialer, config(2));
    tunnel.wait_for("2 idle", T, |s| s.idle == 2).await.unwrap();
    drop(incoming);
    let err = tunnel.wait_for("never", T, |_| false).await.unwrap_err();
    assert!(matches!(err, TunnelError::Ended { end: TunnelEnd::ConsumerGone, .. }), "{err}");
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn retry_now_skips_the_backoff() {
    let dialer = Arc::new(FakeDialer::with([Outcome::Retry, Outcome::Retry, Outcome::Retry, Outcome::Retry]));
    let (tunnel, _incoming) =
        start(&dialer, TunnelConfig { max_backoff: Duration::from_secs(30), ..config(1) });
    tunnel.wait_for("4 failures", T, |s| s.failures == 4).await.unwrap();
    // The next dial would come after 0.8 s; retry_now makes it come at once.
    let began = Instant::now();
    tunnel.retry_now();
    tunnel.wait_for("a connection", T, |s| s.idle == 1).await.unwrap();
    assert_eq!(began.elapsed(), Duration::ZERO);
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn idle_connections_the_far_side_closes_count_as_lost() {
    let dialer = Arc::new(FakeDialer::default());
    let (tunnel, mut incoming) = start(&dialer, config(2));
    tunnel.wait_for("2 idle", T, |s| s.idle == 2).await.unwrap();
    let lost = tunnel.control().lost_idle_above(0);
    // The far side ends both (a kubelet restart ends every port-forward through it); the
    // consumer reads the end and drops them.
    drop((dialer.peer(0), dialer.peer(1)));
    for _ in 0..2 {
        let mut connection = incoming.next().await.unwrap().unwrap();
        assert_eq!(connection.read(&mut [0; 1]).await.unwrap(), 0);
    }
    assert!(tokio::time::timeout(T, lost).await.unwrap().unwrap() >= 1);
    let stats = tunnel.wait_for("both lost, replaced", T, |s| s.lost_idle == 2 && s.idle == 2).await.unwrap();
    assert_eq!((stats.failures, stats.used), (2, 0), "{stats:?}");

    // A used connection that ends is neither a failure nor lost.
    let mut used = incoming.next().await.unwrap().unwrap();
    let mut peer = dialer.peer(2);
    peer.write_all(b"x").await.unwrap();
    used.read_exact(&mut [0; 1]).await.unwrap();
    drop(peer);
    assert_eq!(used.read(&mut [0; 1]).await.unwrap(), 0);
    drop(used);
    let stats = tunnel.wait_for("a replacement", T, |s| s.used == 1 && s.open == 2).await.unwrap();
    assert_eq!((stats.failures, stats.lost_idle), (2, 2), "{stats:?}");
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_proved_good_is_not_lost() {
    // A port-forward whose transport ended before the settle time, without a message.
    let (ended, failed) = oneshot::channel::<String>();
    let dialer = Arc::new(FakeDialer::with([Outcome::Failing(failed)]));
    let (tunnel, mut incoming) = start(&dialer, config(1));
    let mut connection = incoming.next().await.unwrap().unwrap();
    drop(ended);
    drop(dialer.peer(0));
    assert_eq!(connection.read(&mut [0; 1]).await.unwrap(), 0);
    drop(connection);
    let stats = tunnel.wait_for("a replacement", T, |s| s.dials == 2 && s.idle == 1).await.unwrap();
    assert_eq!((stats.failures, stats.lost_idle), (1, 0), "{stats:?}");
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn pause_closes_the_unused_connections_uncounted_and_dials_nothing_until_resumed() {
    let dialer = Arc::new(FakeDialer::default());
    let (tunnel, mut incoming) = start(&dialer, config(2));
    tunnel.wait_for("2 idle", T, |s| s.idle == 2).await.unwrap();
    let mut used = incoming.next().await.unwrap().unwrap();
    let mut peer = dialer.peer(0);
    peer.write_all(b"x").await.unwrap();
    used.read_exact(&mut [0; 1]).await.unwrap();
    tunnel.wait_for("a replacement", T, |s| s.idle == 2 && s.open == 3).await.unwrap();

    let control = tunnel.control();
    control.pause();
    let stats = tunnel.wait_for("the unused ones closed", T, |s| s.open == 1).await.unwrap();
    assert_eq!((stats.idle, stats.failures, stats.lost_idle, stats.paused), (0, 0, 0, true), "{stats:?}");
    // Their far side sees them end; nothing is dialed while paused.
    assert_eq!(dialer.peer(1).read(&mut [0; 1]).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(tunnel.stats().dials, 3);
    // The connection in use goes on.
    peer.write_all(b"y").await.unwrap();
    used.read_exact(&mut [0; 1]).await.unwrap();

    let began = Instant::now();
    control.resume();
    let stats = tunnel.wait_for("2 idle again", T, |s| s.idle == 2).await.unwrap();
    assert_eq!((stats.dials, stats.failures, stats.paused), (5, 0, false), "{stats:?}");
    assert_eq!(began.elapsed(), Duration::ZERO, "resumed without a backoff");
    drop(used);
    tunnel.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dial_in_flight_when_paused_ends_uncounted() {
    let (open_gate, gate) = oneshot::channel();
    let dialer = Arc::new(FakeDialer::with([Outcome::Gated(gate)]));
    let (tunnel, _incoming) = start(&dialer, config(1));
    tunnel.wait_for("the dial in flight", T, |s| s.dials == 1).await.unwrap();
    let control = tunnel.control();
    control.pause();
    open_gate.send(()).unwrap();
    // It arrives while paused: closed at once, neither a failure nor lost.
    assert_eq!(dialer_peer_eof(&dialer).await, 0);
    let stats = tunnel.wait_for("nothing open", T, |s| s.open == 0).await.unwrap();
    assert_eq!((stats.idle, stats.failures, stats.lost_idle, stats.dials), (0, 0, 0, 1), "{stats:?}");
    control.resume();
    let stats = tunnel.wait_for("1 idle again", T, |s| s.idle == 1).await.unwrap();
    assert_eq!((stats.dials, stats.lost_idle), (2, 0), "{stats:?}");
    tunnel.close().await.unwrap();
}

/// Reads the far side of the first dialed connection once it exists: 0 at its end.
async fn dialer_peer_eof(dialer: &FakeDialer) -> usize {
    while dialer.peers.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    tokio::time::timeout(T, dialer.peer(0).read(&mut [0; 1])).await.unwrap().unwrap()
}
