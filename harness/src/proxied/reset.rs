//! Restarting a plugin's proxies when their tunnels lost the connections queued in them.
//!
//! When the node's kubelet restarts, every port-forward through it ends, the idle tunnel
//! connections among them: their pod side stays queued, dead, in the proxy's listen queue, in
//! front of the good ones the tunnel makes afterwards (see [`TunnelControl`]). The restarted
//! kubelet then gets dead connections first: its registrations fail and back off, and a DRA call
//! sent on one fails. So after such a loss ([`TunnelStats::lost_idle`](crate::tunnel::TunnelStats))
//! the proxies get a fresh listener, in the order of a plugin's start: the registration proxy
//! held (its socket removed: the kubelet cannot register the plugin meanwhile), the DRA proxy
//! restarted, then the registration proxy started again (the kubelet registers the plugin anew and
//! finds a clean DRA socket). A socket alone that lost connections (its proxy restarted, say) is
//! restarted alone. The tunnels are paused meanwhile, so that no good connection is queued on a
//! listener that is about to go, and none dies with it. Nothing is restarted while the kubelet uses
//! a connection of the tunnel: its loss was no break of the way to the pod.

use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;

use crate::{
    podexec::{PodExecError, ProxyControl, ProxyProcess},
    tunnel::{Tunnel, TunnelControl},
};

/// How long after the first lost connection the others of the same break are counted too.
const SETTLE: Duration = Duration::from_millis(300);
/// How long one proxy may take to start again (its exec waits for the node's kubelet).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One socket of a plugin, for [`ProxyResets`]: its tunnel and its proxy.
#[derive(Clone, Debug)]
pub struct SocketControl {
    tunnel: TunnelControl,
    proxy: ProxyControl,
}

impl SocketControl {
    /// The socket whose connections `tunnel` makes to `proxy`.
    pub fn new(tunnel: &Tunnel, proxy: &ProxyProcess) -> Self {
        SocketControl { tunnel: tunnel.control(), proxy: proxy.control() }
    }

    fn lost(&self) -> u64 {
        self.tunnel.stats().lost_idle
    }

    /// Whether the kubelet uses a connection of the tunnel now.
    fn in_use(&self) -> bool {
        let stats = self.tunnel.stats();
        stats.open > stats.idle
    }
}

/// Restarts a plugin's proxies when their tunnels lost the connections queued in them (a kubelet
/// restart ended their port-forwards: dead connections queued in front of good ones), the
/// registration proxy held while the DRA proxy restarts, until a tunnel stops dialing or this is
/// dropped or stopped.
#[derive(Debug)]
pub struct ProxyResets {
    task: AbortOnDropHandle<()>,
}

impl ProxyResets {
    /// Watches the plugin's two sockets; `plugin` names it in logs. A loss counts from this
    /// call on, also one that comes before the watching task first runs.
    pub fn start(dra: SocketControl, registration: SocketControl, plugin: impl Into<String>) -> Self {
        let seen = (dra.lost(), registration.lost());
        ProxyResets {
            task: AbortOnDropHandle::new(tokio::spawn(supervise(dra, registration, seen, plugin.into()))),
        }
    }

    /// Stops watching and waits until the task ended. A restart in flight ends where it is (a
    /// tunnel may stay paused, a proxy held): for a plugin that stops.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Watches the two sockets' tunnels and restarts their proxies after a loss beyond `seen` (the
/// lost connections counted so far, DRA and registration) until a tunnel stops dialing.
async fn supervise(dra: SocketControl, registration: SocketControl, mut seen: (u64, u64), plugin: String) {
    loop {
        let lost = tokio::select! {
            lost = dra.tunnel.lost_idle_above(seen.0) => lost,
            lost = registration.tunnel.lost_idle_above(seen.1) => lost,
        };
        if lost.is_none() {
            return;
        }
        tokio::time::sleep(SETTLE).await;
        let now = (dra.lost(), registration.lost());
        let dirty = (now.0 > seen.0, now.1 > seen.1);
        if dra.in_use() || registration.in_use() {
            tracing::info!(%plugin, lost_idle = ?now, "tunnel connections lost while others are in use; not restarting the proxies");
            seen = now;
            continue;
        }
        tracing::info!(%plugin, dra = dirty.0, registration = dirty.1, "tunnel connections queued in the proxies were lost; restarting the proxies");
        if let Err(e) = reset(&dra, &registration, dirty).await {
            tracing::warn!(%plugin, error = %e, "could not restart the proxies; the kubelet may meet dead connections");
        }
        // What paused connections did is not counted; whatever else was lost meanwhile went
        // with the old listeners.
        seen = (dra.lost(), registration.lost());
    }
}

/// Restarts the proxies of the sockets that are `dirty` (DRA, registration), in a plugin's
/// start order; the tunnels run again and the proxies are let go in every case.
async fn reset(
    dra: &SocketControl,
    registration: &SocketControl,
    dirty: (bool, bool),
) -> Result<(), PodExecError> {
    let sockets: Vec<&SocketControl> = match dirty {
        (true, true) => vec![dra, registration],
        (true, false) => vec![dra],
        (false, true) => vec![registration],
        (false, false) => return Ok(()),
    };
    for socket in &sockets {
        socket.tunnel.pause();
    }
    let result = restart_in_order(&sockets).await;
    for socket in &sockets {
        socket.proxy.release();
        socket.tunnel.resume();
    }
    result
}

/// Holds every proxy but the first from the back, restarts the first, then resumes the others
/// in order, each tunnel right after its proxy started.
async fn restart_in_order(sockets: &[&SocketControl]) -> Result<(), PodExecError> {
    let Some((first, rest)) = sockets.split_first() else { return Ok(()) };
    for socket in rest.iter().rev() {
        socket.proxy.hold().await?;
    }
    first.proxy.restart(START_TIMEOUT).await?;
    first.tunnel.resume();
    for socket in rest {
        socket.proxy.resume(START_TIMEOUT).await?;
        socket.tunnel.resume();
    }
    Ok(())
}
