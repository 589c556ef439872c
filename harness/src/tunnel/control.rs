//! Pausing a tunnel while the proxy behind it restarts (see [`TunnelControl`]).

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio_util::sync::CancellationToken;

use super::{Shared, TunnelStats};

/// Pauses and resumes a [`Tunnel`](super::Tunnel), and follows its [`TunnelStats::lost_idle`]: for resetting
/// the proxy behind it. A proxy (`hostpathplugin`) accepts its TCP connections in the order they
/// were made, and only when a kubelet connection arrives to pair with one; the connections the
/// tunnel made in advance wait in its listen queue. When something between the tunnel and the
/// pod closes them (the node's kubelet restarts: every port-forward through it ends, and the
/// runtime closes their pod side), they stay queued, dead, in front of the good ones made
/// afterwards: the next kubelet connections each get one of them and fail at once (seen on
/// v1.37.2: a restarted kubelet's first registrations of a plugin failed with "write: broken
/// pipe", then backed off; a NodePrepareResources sent then fails). Only a new listener drops
/// them: [`pause`](Self::pause) the tunnel (its own idle connections closed, no new ones made),
/// restart the proxy, [`resume`](Self::resume).
#[derive(Clone, Debug)]
pub struct TunnelControl {
    pub(super) shared: Arc<Shared>,
}

impl TunnelControl {
    /// The current counters.
    pub fn stats(&self) -> TunnelStats {
        self.shared.state.borrow().stats.clone()
    }

    /// Stops dialing and closes every connection that is not in use (they count neither as
    /// failures nor as lost) until [`TunnelControl::resume`].
    pub fn pause(&self) {
        self.shared.update(|s| s.stats.paused = true);
        let idle: Vec<CancellationToken> = lock_registry(&self.shared)
            .iter()
            .filter(|c| !c.used.load(Ordering::Acquire))
            .map(|c| {
                c.by_pause.store(true, Ordering::Release);
                c.kill.clone()
            })
            .collect();
        tracing::debug!(target = %self.shared.target, closing = idle.len(), "tunnel paused");
        idle.iter().for_each(CancellationToken::cancel);
    }

    /// Dials again, at once, after [`TunnelControl::pause`].
    pub fn resume(&self) {
        self.shared.update(|s| {
            s.stats.paused = false;
            self.shared.reset_backoff(s);
        });
        tracing::debug!(target = %self.shared.target, "tunnel resumed");
    }

    /// Resolves with [`TunnelStats::lost_idle`] once it is above `seen`; `None` once the tunnel
    /// stopped dialing.
    pub fn lost_idle_above(&self, seen: u64) -> impl Future<Output = Option<u64>> + Send + 'static {
        let mut rx = self.shared.state.subscribe();
        async move {
            let state = rx.wait_for(|s| s.stats.lost_idle > seen || s.end.is_some()).await.ok()?;
            (state.end.is_none()).then_some(state.stats.lost_idle)
        }
    }
}

/// An open connection of a tunnel, for [`TunnelControl::pause`].
#[derive(Debug)]
pub(super) struct Registered {
    pub(super) id: u64,
    pub(super) kill: CancellationToken,
    pub(super) used: Arc<AtomicBool>,
    /// Set when [`TunnelControl::pause`] closes it: its end is no failure.
    pub(super) by_pause: Arc<AtomicBool>,
}

/// The open connections of a tunnel.
pub(super) fn lock_registry(shared: &Shared) -> std::sync::MutexGuard<'_, Vec<Registered>> {
    shared.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
