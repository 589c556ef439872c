//! How a [`Tunnel`](super::Tunnel) reaches the pod port: port-forward through the API server in
//! production, a plain TCP connect in tests.

use std::{fmt, net::SocketAddr, time::Duration};

use async_trait::async_trait;
use futures::{FutureExt as _, future::BoxFuture};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Portforwarder};
use tokio::net::TcpStream;

use super::pod::{PodRef, check_pod};
use crate::plugin::BoxedConnection;

/// One connection established by a [`Dialer`].
pub struct Dialed {
    /// The byte stream to the pod port.
    pub connection: BoxedConnection,
    /// For transports where establishing the stream does not prove that the remote port
    /// accepted it (port-forward: the in-pod connect happens asynchronously): resolves with the
    /// remote side's error message when the connection failed (e.g. "connection refused"), or
    /// with `None` when the transport ended without one. `None` (no future) means the dial
    /// itself proved the remote end accepted the connection (TCP connect).
    pub failure: Option<BoxFuture<'static, Option<String>>>,
    /// Tears the transport down after the connection was dropped (port-forward: waits for the
    /// WebSocket to finish closing, aborts it when this future is dropped). The tunnel bounds
    /// it with [`TunnelConfig::close_grace`](super::TunnelConfig::close_grace).
    pub teardown: Option<BoxFuture<'static, ()>>,
}

impl fmt::Debug for Dialed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dialed")
            .field("failure", &self.failure.is_some())
            .field("teardown", &self.teardown.is_some())
            .finish_non_exhaustive()
    }
}

impl Dialed {
    /// A connection that needs no failure watch and no teardown (e.g. a TCP stream).
    pub fn plain(connection: impl crate::plugin::Connection) -> Self {
        Dialed { connection: Box::new(connection), failure: None, teardown: None }
    }
}

/// A failed dial.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DialError {
    /// Worth retrying (nothing listening yet, pod not running yet, API server hiccup).
    #[error("{0}")]
    Retry(String),
    /// The target is gone for good (pod deleted or replaced); the tunnel stops.
    #[error("target gone: {0}")]
    Gone(String),
}

/// Establishes connections to one pod port.
#[async_trait]
pub trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// Establishes one connection.
    async fn dial(&self) -> Result<Dialed, DialError>;

    /// Called after repeated failures: `Err(reason)` when the target is gone for good (the
    /// tunnel then stops and reports it), `Ok` to keep retrying. The default never gives up.
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// What this dials, for logs and errors.
    fn target(&self) -> String;
}

/// Dials a TCP address: the tunnel chain without a cluster, e.g. against a `hostpathplugin
/// --proxy-endpoint=tcp://127.0.0.1:<port>` running on this machine.
#[derive(Clone, Debug)]
pub struct TcpDialer {
    addr: SocketAddr,
}

impl TcpDialer {
    /// Dials `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        TcpDialer { addr }
    }
}

#[async_trait]
impl Dialer for TcpDialer {
    async fn dial(&self) -> Result<Dialed, DialError> {
        let stream = TcpStream::connect(self.addr).await.map_err(|e| DialError::Retry(e.to_string()))?;
        // gRPC sends small frames; don't let Nagle delay them.
        stream.set_nodelay(true).map_err(|e| DialError::Retry(format!("set TCP_NODELAY: {e}")))?;
        Ok(Dialed::plain(stream))
    }

    fn target(&self) -> String {
        format!("tcp://{}", self.addr)
    }
}

/// Dials a pod port through the API server's port-forward (kube's WebSocket port-forward: one
/// upgrade per connection, pod side connected by the container runtime to `localhost:<port>` in
/// the pod's network namespace).
///
/// A dial succeeds as soon as the WebSocket is up, even when nothing listens in the pod; that
/// failure arrives asynchronously on the port's error channel and the stream then ends. The
/// returned [`Dialed::failure`] reports it, so the tunnel can count it and back off without
/// reading any byte of the connection.
#[derive(Clone)]
pub struct PortForwardDialer {
    pods: Api<Pod>,
    pod: PodRef,
    port: u16,
    timeout: Duration,
}

impl fmt::Debug for PortForwardDialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortForwardDialer").field("pod", &self.pod).field("port", &self.port).finish()
    }
}

/// The kube client for port-forward tunnels and exec: its connections set `TCP_NODELAY` (see
/// [`spec_runner::nodelay_client`]).
pub use spec_runner::nodelay_client as tunnel_client;

/// How long one port-forward upgrade may take by default.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

impl PortForwardDialer {
    /// Dials `port` of `pod` (its UID, when known, is checked after repeated failures).
    pub fn new(client: kube::Client, pod: PodRef, port: u16) -> Self {
        PortForwardDialer {
            pods: Api::namespaced(client, &pod.namespace),
            pod,
            port,
            timeout: DEFAULT_DIAL_TIMEOUT,
        }
    }

    /// Limits one upgrade to `timeout` (default [`DEFAULT_DIAL_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Aborts the port-forward's background task when dropped: nothing of a connection outlives its
/// teardown, even if the API server never answers the WebSocket close.
struct AbortOnDrop(Portforwarder);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait]
impl Dialer for PortForwardDialer {
    async fn dial(&self) -> Result<Dialed, DialError> {
        let dialed =
            tokio::time::timeout(self.timeout, self.pods.portforward(&self.pod.name, &[self.port])).await;
        let mut forwarder = match dialed {
            Err(_) => {
                return Err(DialError::Retry(format!(
                    "port-forward upgrade did not complete within {:?}",
                    self.timeout
                )));
            }
            // A 404 comes from the API server (no such pod) or from the node's kubelet, which
            // answers "pod does not exist" for a pod it has not synced yet, e.g. right after it
            // restarted: the stored pod decides.
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                return Err(match check_pod(&self.pods, &self.pod).await {
                    Err(gone) => DialError::Gone(format!("{gone}: {}", status.message)),
                    Ok(()) => DialError::Retry(format!(
                        "port-forward to pod {}/{} answered 404 ({}) while the pod exists: its kubelet does not know it (yet)",
                        self.pod.namespace, self.pod.name, status.message
                    )),
                });
            }
            Ok(Err(e)) => return Err(DialError::Retry(e.to_string())),
            Ok(Ok(forwarder)) => forwarder,
        };
        let (Some(stream), Some(error)) = (forwarder.take_stream(self.port), forwarder.take_error(self.port))
        else {
            forwarder.abort();
            return Err(DialError::Retry(format!("port-forward returned no stream for port {}", self.port)));
        };
        // Resolves with the error message, or with None once the forwarding loop ended (its
        // error sender is dropped then): also the signal that the WebSocket is closed.
        let failure = error.boxed().shared();
        let guard = AbortOnDrop(forwarder);
        let ended = failure.clone();
        Ok(Dialed {
            connection: Box::new(stream),
            failure: Some(failure.boxed()),
            teardown: Some(
                async move {
                    let _abort_when_done = guard;
                    ended.await;
                }
                .boxed(),
            ),
        })
    }

    async fn check(&self) -> Result<(), String> {
        check_pod(&self.pods, &self.pod).await
    }

    fn target(&self) -> String {
        format!("{}/{}:{} (port-forward)", self.pod.namespace, self.pod.name, self.port)
    }
}
