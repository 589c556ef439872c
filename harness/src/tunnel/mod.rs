//! Pre-established connections to one pod port, handed to a gRPC server as accepted connections.
//!
//! The kubelet talks to an in-process plugin through a proxy pod: `hostpathplugin
//! --proxy-endpoint=tcp://:<port>` in the pod pairs the n-th kubelet connection on its Unix socket
//! with the next connection accepted on its TCP port, by accept order, without any handshake. A
//! [`Tunnel`] keeps up to [`TunnelConfig::idle`] connections to that port established in advance
//! (the kubelet gives `GetInfo` one second) and hands each to its consumer — a plugin server's
//! [`ConnectionSender`] — as soon as it is established. A connection the kubelet starts using
//! (first byte read) or that closes is replaced.
//!
//! ```no_run
//! # async fn f(client: kube::Client, pod: harness::tunnel::PodRef) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use harness::{plugin::Listener, tunnel::{PortForwardDialer, Tunnel, TunnelConfig}};
//! let (sender, listener) = Listener::channel(64); // serve `listener` with the plugin
//! let tunnel = Tunnel::start(Arc::new(PortForwardDialer::new(client, pod, 9001)), sender, TunnelConfig::default());
//! tokio::select! {
//!     reason = tunnel.gone() => eprintln!("proxy pod gone: {reason}"),
//!     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
//! }
//! tunnel.close().await?;
//! # Ok(()) }
//! ```
//!
//! # Dead connections
//!
//! A port-forward dial succeeds once the WebSocket is up, before (and even if) the container
//! runtime manages to connect to the port inside the pod; a failure arrives later on the port's
//! error channel, and the stream ends. The tunnel does **not** hold connections back to find
//! out (that would need reading from them, consuming the kubelet's bytes, or a fixed delay):
//! it hands every connection over at once — the server sends its HTTP/2 SETTINGS, which wait in
//! the pod's socket buffer like upstream's — and watches the error channel. An error message
//! closes the connection (the server sees an error and drops it) and counts as a failed dial. A
//! connection that closes before the remote side ever sent a byte counts as failed too (e.g. the
//! proxy process was killed with connections in its backlog). A connection counts as good once
//! the remote sent a byte, or once [`TunnelConfig::settle`] passed without an error message
//! (TCP: at once, the connect itself proves the listener took it).
//!
//! Failures are retried with backoff ([`TunnelConfig::initial_backoff`] doubling up to
//! [`TunnelConfig::max_backoff`]), logged at debug level. After every
//! [`TunnelConfig::check_after_failures`] consecutive failures the dialer checks its target (the
//! pod still exists with the same UID); a dialer that reports the target gone — on such a check
//! or directly (port-forward to a pod that does not exist) — ends the tunnel, and [`Tunnel::gone`]
//! resolves with the reason.
//!
//! A good connection that the far side ends while it is unused counts as lost
//! ([`TunnelStats::lost_idle`]): a kubelet restart does that to all of them, and each stays
//! queued, dead, in the proxy; [`TunnelControl`] pauses the tunnel while the proxy restarts.
//!
//! Handed-over connections get no deadline from the tunnel. Closing ([`Tunnel::close`]) or
//! dropping the tunnel stops dialing and closes every connection, handed over or not; `close`
//! waits until every transport is torn down and every task of the tunnel has ended.

mod connection;
mod control;
mod dialer;
mod pod;
mod supervise;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::{sync::watch, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub use control::TunnelControl;
pub use dialer::{
    DEFAULT_DIAL_TIMEOUT, DialError, Dialed, Dialer, PortForwardDialer, TcpDialer, tunnel_client,
};
pub(crate) use pod::check_pod;
pub use pod::{InvalidPod, PodRef, PodWatch};

use crate::plugin::ConnectionSender;
use control::Registered;
use supervise::adopt;

/// Tuning of a [`Tunnel`].
#[derive(Clone, Debug)]
pub struct TunnelConfig {
    /// Connections to keep established and unused (default 10, as upstream).
    pub idle: usize,
    /// Upper bound on open connections, used or not (default 64).
    pub max_open: usize,
    /// Limit for one dial (default 10 s).
    pub dial_timeout: Duration,
    /// First delay after a failure (default 100 ms).
    pub initial_backoff: Duration,
    /// Longest delay between retries (default 1 s).
    pub max_backoff: Duration,
    /// A connection whose transport may fail asynchronously counts as good after this long
    /// without a failure report (default 250 ms).
    pub settle: Duration,
    /// Ask the dialer whether the target still exists after this many consecutive failures
    /// (default 5).
    pub check_after_failures: u32,
    /// How long closing one transport may take before it is aborted (default 2 s).
    pub close_grace: Duration,
}

impl Default for TunnelConfig {
    fn default() -> Self {
        TunnelConfig {
            idle: 10,
            max_open: 64,
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            settle: Duration::from_millis(250),
            check_after_failures: 5,
            close_grace: Duration::from_secs(2),
        }
    }
}

/// Counters of a [`Tunnel`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelStats {
    /// Dials attempted.
    pub dials: u64,
    /// Failures: dial errors and connections that ended before the remote side sent anything.
    pub failures: u64,
    /// Connections handed to the consumer.
    pub handed_over: u64,
    /// Connections the remote side started using.
    pub used: u64,
    /// Connections whose transport is not torn down yet (handed over or not, used or not).
    pub open: usize,
    /// Open connections the remote side has not used yet.
    pub idle: usize,
    /// Connections that proved good and then ended unused, closed from the far side (also
    /// counted in [`TunnelStats::failures`]): what a restart of the node's kubelet or of the API
    /// server does to every connection through it. Each leaves a dead connection queued in the
    /// proxy, which pairs it with a kubelet connection later (see [`TunnelControl`]).
    pub lost_idle: u64,
    /// Whether dialing is paused ([`TunnelControl::pause`]).
    pub paused: bool,
}

/// Why a tunnel stopped dialing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TunnelEnd {
    /// [`Tunnel::close`] was called or the tunnel was dropped.
    Closed,
    /// The consumer stopped accepting connections (the plugin server stopped).
    ConsumerGone,
    /// The dialer reported its target gone (pod deleted or replaced).
    TargetGone(String),
}

/// Errors of a tunnel.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// A wait ran out of time.
    #[error("timed out after {timeout:?} waiting for {what} on tunnel {target} (stats: {stats:?})")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The tunnel's target.
        target: String,
        /// How long it waited.
        timeout: Duration,
        /// The counters at that time.
        stats: TunnelStats,
    },
    /// The tunnel stopped while waiting.
    #[error("tunnel {target} stopped ({end:?}) while waiting for {what}")]
    Ended {
        /// What was awaited.
        what: String,
        /// The tunnel's target.
        target: String,
        /// Why it stopped.
        end: TunnelEnd,
    },
}

#[derive(Debug)]
struct State {
    stats: TunnelStats,
    consecutive_failures: u32,
    backoff: Duration,
    retry_at: Option<Instant>,
    /// Consecutive failures at which the target is checked next.
    next_check: u32,
    end: Option<TunnelEnd>,
}

/// What the tunnel's tasks and its connections share.
#[derive(Debug)]
pub(crate) struct Shared {
    target: String,
    config: TunnelConfig,
    state: watch::Sender<State>,
    /// Stops dialing and closes every connection.
    stop: CancellationToken,
    tracker: TaskTracker,
    /// The open connections (see [`TunnelControl::pause`]), and the next one's id.
    open: std::sync::Mutex<Vec<Registered>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut State)) {
        self.state.send_modify(f);
    }

    fn reset_backoff(&self, state: &mut State) {
        state.consecutive_failures = 0;
        state.backoff = self.config.initial_backoff;
        state.retry_at = None;
        state.next_check = self.config.check_after_failures.max(1);
    }

    /// Counts a failure and schedules the next dial; returns the consecutive count.
    fn failed(&self, state: &mut State) -> u32 {
        state.stats.failures += 1;
        state.consecutive_failures += 1;
        state.retry_at = Some(Instant::now() + state.backoff);
        state.backoff = (state.backoff * 2).min(self.config.max_backoff);
        state.consecutive_failures
    }

    /// The remote side sent the first byte on a connection.
    fn mark_used(&self) {
        self.update(|s| {
            s.stats.used += 1;
            s.stats.idle = s.stats.idle.saturating_sub(1);
            self.reset_backoff(s);
        });
    }

    fn confirmed(&self) {
        self.update(|s| self.reset_backoff(s));
    }
}

/// Pre-established connections to one pod port; see the [module docs](self).
#[derive(Debug)]
pub struct Tunnel {
    shared: Arc<Shared>,
}

impl Tunnel {
    /// Starts dialing with `dialer` and handing connections to `consumer`.
    pub fn start(dialer: Arc<dyn Dialer>, consumer: ConnectionSender, config: TunnelConfig) -> Tunnel {
        let target = dialer.target();
        let initial = config.initial_backoff;
        let first_check = config.check_after_failures.max(1);
        let shared = Arc::new(Shared {
            target,
            config,
            state: watch::Sender::new(State {
                stats: TunnelStats::default(),
                consecutive_failures: 0,
                backoff: initial,
                retry_at: None,
                next_check: first_check,
                end: None,
            }),
            stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            open: std::sync::Mutex::new(Vec::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
        });
        tracing::debug!(target = %shared.target, idle = shared.config.idle, "tunnel started");
        shared.tracker.spawn(run(shared.clone(), dialer, consumer));
        Tunnel { shared }
    }

    /// What the tunnel dials.
    pub fn target(&self) -> &str {
        &self.shared.target
    }

    /// The current counters.
    pub fn stats(&self) -> TunnelStats {
        self.shared.state.borrow().stats.clone()
    }

    /// Why the tunnel stopped dialing, if it did.
    pub fn end(&self) -> Option<TunnelEnd> {
        self.shared.state.borrow().end.clone()
    }

    /// Waits until `done` holds for the counters; `what` names the condition in errors.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&TunnelStats) -> bool,
    ) -> Result<TunnelStats, TunnelError> {
        let _waiting =
            crate::framework::waiting(format!("tunnel to {}: {what}", self.shared.target), Some(timeout));
        let mut rx = self.shared.state.subscribe();
        // Drop the `Ref` at once: a second read lock while a writer waits would deadlock.
        let waited =
            tokio::time::timeout(timeout, rx.wait_for(|s| done(&s.stats) || s.end.is_some())).await.map(drop);
        let state = self.shared.state.borrow();
        match waited {
            Ok(_) if done(&state.stats) => Ok(state.stats.clone()),
            Ok(_) => Err(TunnelError::Ended {
                what: what.to_string(),
                target: self.shared.target.clone(),
                end: state.end.clone().unwrap_or(TunnelEnd::Closed),
            }),
            Err(_) => Err(TunnelError::Timeout {
                what: what.to_string(),
                target: self.shared.target.clone(),
                timeout,
                stats: state.stats.clone(),
            }),
        }
    }

    /// Resolves with the reason when the dialer reported the target gone (pod deleted or
    /// replaced). Stays pending if the tunnel ends for another reason.
    pub fn gone(&self) -> impl Future<Output = String> + Send + 'static {
        let mut rx = self.shared.state.subscribe();
        async move {
            let reason = match rx.wait_for(|s| matches!(s.end, Some(TunnelEnd::TargetGone(_)))).await {
                Ok(state) => match &state.end {
                    Some(TunnelEnd::TargetGone(reason)) => Some(reason.clone()),
                    _ => None,
                },
                Err(_) => None,
            };
            match reason {
                Some(reason) => reason,
                None => std::future::pending().await,
            }
        }
    }

    /// Dials again now instead of waiting for the backoff (e.g. the proxy process was restarted).
    pub fn retry_now(&self) {
        self.shared.update(|s| self.shared.reset_backoff(s));
    }

    /// A handle for [`Tunnel::retry_now`] from another task.
    pub fn retry_handle(&self) -> RetryHandle {
        RetryHandle { shared: self.shared.clone() }
    }

    /// A handle that pauses and resumes the tunnel from another task (see [`TunnelControl`]).
    pub fn control(&self) -> TunnelControl {
        TunnelControl { shared: self.shared.clone() }
    }

    /// Stops dialing, closes every connection (handed over or not) and waits until every
    /// transport is torn down and every task of the tunnel has ended. Returns the final counters.
    pub async fn close(self) -> Result<TunnelStats, TunnelError> {
        let shared = self.shared.clone();
        drop(self); // cancels
        shared.tracker.close();
        let timeout = shared.config.close_grace + Duration::from_secs(1);
        let waited = tokio::time::timeout(timeout, shared.tracker.wait()).await;
        let stats = shared.state.borrow().stats.clone();
        match waited {
            Ok(()) => {
                tracing::debug!(target = %shared.target, ?stats, "tunnel closed");
                Ok(stats)
            }
            Err(_) => Err(TunnelError::Timeout {
                what: "all connections to close".into(),
                target: shared.target.clone(),
                timeout,
                stats,
            }),
        }
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.shared.stop.cancel();
        self.shared.tracker.close();
    }
}

/// Makes a [`Tunnel`] dial at once; see [`Tunnel::retry_handle`].
#[derive(Clone, Debug)]
pub struct RetryHandle {
    shared: Arc<Shared>,
}

impl RetryHandle {
    /// Dials again now instead of waiting for the backoff.
    pub fn retry_now(&self) {
        self.shared.update(|s| self.shared.reset_backoff(s));
    }
}

enum Next {
    Dial,
    /// Ask the dialer whether the target still exists.
    Check,
    Wait,
    Delay(Instant),
}

/// The dial loop.
async fn run(shared: Arc<Shared>, dialer: Arc<dyn Dialer>, consumer: ConnectionSender) {
    let mut rx = shared.state.subscribe();
    let config = &shared.config;
    let end = loop {
        let next = {
            let state = rx.borrow_and_update();
            if state.stats.paused || state.stats.idle >= config.idle || state.stats.open >= config.max_open {
                Next::Wait
            } else {
                match state.retry_at {
                    _ if state.consecutive_failures >= state.next_check => Next::Check,
                    Some(at) if at > Instant::now() => Next::Delay(at),
                    _ => Next::Dial,
                }
            }
        };
        if matches!(next, Next::Check) {
            shared.update(|s| s.next_check = s.consecutive_failures + config.check_after_failures.max(1));
            let checked = tokio::select! {
                biased;
                _ = shared.stop.cancelled() => break TunnelEnd::Closed,
                checked = tokio::time::timeout(config.dial_timeout, dialer.check()) => checked,
            };
            match checked {
                Ok(Err(reason)) => break TunnelEnd::TargetGone(reason),
                Ok(Ok(())) => continue,
                Err(_) => {
                    tracing::debug!(target = %shared.target, timeout = ?config.dial_timeout, "target check timed out");
                    continue;
                }
            }
        }
        let deadline = match next {
            Next::Dial | Next::Check => None,
            Next::Wait => Some(None),
            Next::Delay(at) => Some(Some(at)),
        };
        if let Some(deadline) = deadline {
            let delay = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = shared.stop.cancelled() => break TunnelEnd::Closed,
                _ = consumer.closed() => break TunnelEnd::ConsumerGone,
                changed = rx.changed() => if changed.is_err() { break TunnelEnd::Closed },
                _ = delay => {}
            }
            continue;
        }

        shared.update(|s| s.stats.dials += 1);
        let dialed = tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break TunnelEnd::Closed,
            _ = consumer.closed() => break TunnelEnd::ConsumerGone,
            dialed = tokio::time::timeout(config.dial_timeout, dialer.dial()) => dialed,
        };
        let dialed = match dialed {
            Ok(Ok(dialed)) => dialed,
            Ok(Err(DialError::Gone(reason))) => break TunnelEnd::TargetGone(reason),
            Ok(Err(DialError::Retry(error))) => {
                dial_failed(&shared, &error);
                continue;
            }
            Err(_) => {
                dial_failed(&shared, &format!("dial did not complete within {:?}", config.dial_timeout));
                continue;
            }
        };
        let connection = adopt(&shared, dialed);
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break TunnelEnd::Closed,
            sent = consumer.send(connection) => match sent {
                Ok(()) => shared.update(|s| s.stats.handed_over += 1),
                Err(_) => break TunnelEnd::ConsumerGone,
            },
        }
    };
    match &end {
        TunnelEnd::TargetGone(reason) => {
            tracing::info!(target = %shared.target, %reason, "tunnel target gone; no more dials")
        }
        other => tracing::debug!(target = %shared.target, end = ?other, "tunnel stopped dialing"),
    }
    // Connections stay until their consumer closes them or the tunnel is closed: after
    // `ConsumerGone` the server is finishing in-flight calls on them.
    shared.update(|s| s.end = Some(end));
}

/// Records a failed dial.
fn dial_failed(shared: &Shared, error: &str) {
    let mut consecutive = 0;
    let mut delay = Duration::ZERO;
    shared.update(|s| {
        delay = s.backoff;
        consecutive = shared.failed(s);
    });
    tracing::debug!(target = %shared.target, consecutive, retry_in = ?delay, %error, "dial failed");
}

#[cfg(test)]
mod tests;
