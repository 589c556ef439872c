//! Where the plugin's gRPC servers get their connections from.
//!
//! A [`Listener`] is either a Unix socket path (a stale file is replaced, the
//! file is removed when the plugin stops) or any stream of already
//! established connections, e.g. port-forward tunnels (`tokio::io::DuplexStream`)
//! handed over through a [`ConnectionSender`]. Served connections get no
//! handshake or idle timeouts: a pre-established tunnel may wait idle for a
//! long time before the kubelet uses it.
//!
//! Every served connection is wrapped so that stopping the plugin closes it
//! (a hard stop after a short grace period, like upstream's `grpc.Server.Stop`),
//! and so that an HTTP/2 `:authority` h2 would reject is replaced (see
//! [`NormalizeAuthority`]). Once the plugin stops, a connection reads as closed
//! as soon as every stream its client started has been answered on the wire
//! ([`super::open_streams`]) and flushed: one whose peer has not sent a byte (the
//! HTTP/2 server would otherwise wait for its preface until the hard stop, as a
//! tunnel's pre-established connection does), and one whose client would answer
//! the server's GOAWAY only by closing it (the kubelet), which a port-forward
//! passes on late. A request still unread then is not taken on, as with
//! upstream's `grpc.Server.Stop`.

use std::{
    io,
    path::{Path, PathBuf},
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt as _};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::UnixListener,
    sync::mpsc,
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{authority::NormalizeAuthority, open_streams::OpenStreams};

/// Anything a gRPC server can talk over.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// A type-erased connection.
pub type BoxedConnection = Box<dyn Connection>;

/// A stream of established connections.
pub type ConnectionStream = Pin<Box<dyn Stream<Item = io::Result<BoxedConnection>> + Send>>;

/// Where one gRPC server gets its connections.
pub enum Listener {
    /// Listen on this Unix socket path. A file already there is removed first;
    /// the socket file is removed when the plugin stops.
    Unix(PathBuf),
    /// Serve each connection of this stream; the server stops accepting when
    /// the stream ends.
    Connections(ConnectionStream),
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Unix(path) => f.debug_tuple("Unix").field(path).finish(),
            Listener::Connections(_) => f.write_str("Connections(..)"),
        }
    }
}

impl Listener {
    /// A Unix socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Listener::Unix(path.into())
    }

    /// Serves the connections of `stream`.
    pub fn connections<S, C>(stream: S) -> Self
    where
        S: Stream<Item = io::Result<C>> + Send + 'static,
        C: Connection,
    {
        Listener::Connections(Box::pin(stream.map(|c| c.map(|c| Box::new(c) as BoxedConnection))))
    }

    /// A listener fed through the returned sender (for connections that are
    /// established elsewhere, e.g. port-forward tunnels). The server stops
    /// accepting when all senders are dropped.
    pub fn channel(capacity: usize) -> (ConnectionSender, Listener) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) });
        (ConnectionSender { tx }, Listener::Connections(Box::pin(stream)))
    }

    /// The socket path, for Unix listeners.
    pub fn unix_path(&self) -> Option<&Path> {
        match self {
            Listener::Unix(path) => Some(path),
            Listener::Connections(_) => None,
        }
    }
}

/// Hands established connections to a [`Listener::channel`] listener.
#[derive(Clone, Debug)]
pub struct ConnectionSender {
    tx: mpsc::Sender<BoxedConnection>,
}

/// The server behind a [`ConnectionSender`] is gone (plugin stopped).
#[derive(Debug, thiserror::Error)]
#[error("the plugin server no longer accepts connections (stopped)")]
pub struct ServerGone;

impl ConnectionSender {
    /// Hands one connection to the server; waits while the channel is full.
    pub async fn send<C: Connection>(&self, connection: C) -> Result<(), ServerGone> {
        self.tx.send(Box::new(connection)).await.map_err(|_| ServerGone)
    }

    /// Whether the server has stopped accepting.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Waits until the server stops accepting.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

#[cfg(test)]
impl ConnectionSender {
    /// A client channel whose every connection is an in-memory pipe handed to this server.
    pub(crate) fn channel(&self) -> tonic::transport::Channel {
        let server = self.clone();
        tonic::transport::Endpoint::from_static("http://localhost").connect_with_connector_lazy(
            tower::service_fn(move |_: http::Uri| {
                let server = server.clone();
                async move {
                    let (client, served) = tokio::io::duplex(1 << 16);
                    server.send(served).await?;
                    Ok::<_, ServerGone>(hyper_util::rt::TokioIo::new(client))
                }
            }),
        )
    }
}

/// A served connection that fails all I/O once `kill` is cancelled, so the
/// connection task ends even while the peer keeps the connection open, and
/// that reads as closed once `shutdown` is cancelled and every stream is
/// answered and flushed (a peer that had sent no byte by then has none; what it
/// sends later is not read).
pub(crate) struct ServedConnection {
    io: BoxedConnection,
    authority: NormalizeAuthority,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
    stopping: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Whether the peer has sent a byte.
    used: bool,
    streams: OpenStreams,
    /// Stopping, every stream answered, and all of it flushed since.
    answered_and_flushed: bool,
}

impl ServedConnection {
    /// Wraps `io`; the client's HTTP/2 `:authority` is normalised on the way
    /// in (see [`NormalizeAuthority`]).
    pub(crate) fn new(io: BoxedConnection, shutdown: &CancellationToken, kill: &CancellationToken) -> Self {
        ServedConnection {
            io,
            authority: NormalizeAuthority::new(),
            killed: Box::pin(kill.clone().cancelled_owned()),
            stopping: Box::pin(shutdown.clone().cancelled_owned()),
            used: false,
            streams: OpenStreams::default(),
            answered_and_flushed: false,
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        self.streams.server_sent(bytes);
        self.answered_and_flushed = false;
    }

    fn check_killed(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.killed.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "plugin stopped")),
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for ServedConnection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_killed(cx)?;
        // Stopping: a peer that had sent nothing is a new client (the kubelet reconnecting once
        // the stop ended its health stream), which a stopping plugin does not take on; a peer
        // whose every stream is answered and flushed gets nothing more. Either way the
        // connection is at its end. Until the flush, nothing more is read (the flush wakes).
        if this.stopping.as_mut().poll(cx).is_ready() {
            if !this.used || this.answered_and_flushed {
                return Poll::Ready(Ok(()));
            }
            if this.streams.none_open() {
                return Poll::Pending;
            }
        }
        let before = buf.filled().len();
        let read = this.authority.poll_read(Pin::new(&mut this.io), cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.used = true;
            this.streams.client_sent(&buf.filled()[before..]);
            this.answered_and_flushed = false;
        }
        read
    }
}

impl AsyncWrite for ServedConnection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_killed(cx)?;
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.wrote(&buf[..n]);
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_killed(cx)?;
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(())))
            && this.stopping.as_mut().poll(cx).is_ready()
            && this.used
            && this.streams.none_open()
            && !this.answered_and_flushed
        {
            // The reader (the same connection task) ends the connection now.
            this.answered_and_flushed = true;
            cx.waker().wake_by_ref();
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_killed(cx)?;
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = written {
            for buf in bufs {
                let take = n.min(buf.len());
                this.wrote(&buf[..take]);
                n -= take;
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for ServedConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// A bound listener, ready to be served.
pub(crate) struct Bound {
    pub incoming: ConnectionStream,
    /// The socket file this plugin created, removed on stop.
    pub socket: Option<PathBuf>,
}

/// Binds a Unix listener (replacing a stale socket file) or takes the stream.
pub(crate) fn bind(listener: Listener) -> io::Result<Bound> {
    match listener {
        Listener::Connections(incoming) => Ok(Bound { incoming, socket: None }),
        Listener::Unix(path) => {
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} is a directory, not a socket", path.display()),
                    ));
                }
                Ok(_) => {
                    tracing::debug!(path = %path.display(), "removing stale socket file");
                    std::fs::remove_file(&path)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let listener = UnixListener::bind(&path)?;
            let incoming = futures::stream::unfold(listener, |listener| async move {
                let accepted = listener.accept().await.map(|(stream, _)| Box::new(stream) as BoxedConnection);
                Some((accepted, listener))
            });
            Ok(Bound { incoming: Box::pin(incoming), socket: Some(path) })
        }
    }
}

/// Removes a socket file created by [`bind`]; a missing file is fine.
pub(crate) fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed socket"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not remove socket"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use futures::FutureExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::plugin::{KubeletPlugin, PluginConfig, PluginListeners};

    /// What grpc-go sends when it dials like the kubelet's plugin watcher
    /// (see tests/data/README.md): `:authority` is the percent-encoded path.
    const VECTOR: &[u8] = include_bytes!("../../tests/data/grpc-go-1.82.1-kubelet-registration.c2s.bin");

    /// What the server side reads from a served connection when the client
    /// sends `bytes`.
    async fn served_bytes(bytes: &[u8]) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let never = CancellationToken::new();
        let mut served = ServedConnection::new(Box::new(server), &never, &never);
        client.write_all(bytes).await.unwrap();
        drop(client);
        let mut got = Vec::new();
        served.read_to_end(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn a_connection_that_never_sent_a_byte_reads_as_closed_once_the_plugin_stops() {
        let (shutdown, kill) = (CancellationToken::new(), CancellationToken::new());
        let (client, server) = tokio::io::duplex(64);
        let mut served = ServedConnection::new(Box::new(server), &shutdown, &kill);
        let mut byte = [0u8; 1];
        let read = tokio::spawn(async move { served.read(&mut byte).await.map(|n| (n, served)) });
        tokio::task::yield_now().await;
        assert!(!read.is_finished(), "an open, silent connection reads nothing until the stop");
        shutdown.cancel();
        let read = tokio::time::timeout(GUARD, read).await.expect("the read went on after the stop began");
        let (n, _served) = read.unwrap().unwrap();
        assert_eq!(n, 0, "end of stream, not an error: the HTTP/2 server just ends the connection");
        drop(client);
    }

    #[tokio::test]
    async fn a_connection_whose_first_bytes_come_after_the_stop_began_reads_as_closed() {
        let (shutdown, kill) = (CancellationToken::new(), CancellationToken::new());
        let (mut client, server) = tokio::io::duplex(64);
        let mut served = ServedConnection::new(Box::new(server), &shutdown, &kill);
        shutdown.cancel();
        // A client reconnecting through a pre-established connection: its bytes are already
        // there when the server reads.
        client.write_all(b"PRI * HTTP/2.0").await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(GUARD, served.read(&mut buf)).await.expect("the read hung").unwrap();
        assert_eq!(n, 0, "a stopping plugin takes on no new client");
    }

    #[tokio::test]
    async fn a_connection_with_a_stream_open_keeps_reading_after_the_stop_began_until_it_is_answered() {
        use super::super::open_streams::{client_start, frame, server_end};
        use tokio::io::AsyncWriteExt as _;
        let (shutdown, kill) = (CancellationToken::new(), CancellationToken::new());
        let (mut client, server) = tokio::io::duplex(1 << 12);
        let mut served = ServedConnection::new(Box::new(server), &shutdown, &kill);
        let mut buf = [0u8; 1024];
        let start = client_start(1);
        client.write_all(&start).await.unwrap();
        let mut read = 0;
        while read < start.len() {
            read += served.read(&mut buf).await.unwrap();
        }
        shutdown.cancel();
        // The client can still send (a WINDOW_UPDATE the answer waits for).
        client.write_all(b"more").await.unwrap();
        let n = tokio::time::timeout(GUARD, served.read(&mut buf)).await.expect("a read of sent bytes hung");
        assert_eq!(n.unwrap(), 4);
        // Part of the answer, flushed: the stream is still open.
        served.write_all(&frame(0x0, 0, 1, b"part")).await.unwrap();
        served.flush().await.unwrap();
        assert!(served.read(&mut buf).now_or_never().is_none(), "ended before the answer did");
        // The answer's end, not yet flushed: still not the end.
        served.write_all(&server_end(1)).await.unwrap();
        assert!(served.read(&mut buf).now_or_never().is_none(), "ended before the answer was flushed");
        served.flush().await.unwrap();
        let n = served.read(&mut buf).now_or_never().expect("the answered, flushed connection read on");
        assert_eq!(n.unwrap(), 0, "every stream answered and flushed: the connection is at its end");
        // The hard stop fails it.
        kill.cancel();
        let err = served.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        drop(client);
    }

    /// A plugin on in-memory listeners that gives in-flight calls an hour when it stops:
    /// (plugin, its DRA server, its registration server).
    async fn patient_plugin() -> (KubeletPlugin, ConnectionSender, ConnectionSender) {
        let (dra, dra_listener) = Listener::channel(1);
        let (reg, reg_listener) = Listener::channel(1);
        let config = PluginConfig::new("drv.test", "node", "/nonexistent")
            .dra_endpoint("/plugins/drv.test/dra.sock")
            .stop_grace(std::time::Duration::from_secs(3600));
        let listeners = PluginListeners { registration: reg_listener, dra: dra_listener };
        (KubeletPlugin::builder(config).start(listeners).await.unwrap(), dra, reg)
    }

    /// Hands `server` two connections; returns their client ends. The channel holds one, so
    /// the server has taken the first when this returns.
    async fn two_connections(server: &ConnectionSender) -> [tokio::io::DuplexStream; 2] {
        let (first, served) = tokio::io::duplex(1 << 16);
        server.send(served).await.unwrap();
        let (second, served) = tokio::io::duplex(1 << 16);
        server.send(served).await.unwrap();
        [first, second]
    }

    /// Guards against a hang: the plugin's grace is an hour.
    const GUARD: std::time::Duration = std::time::Duration::from_secs(60);

    #[tokio::test]
    async fn a_stop_does_not_wait_for_connections_nobody_used() {
        let (plugin, dra, reg) = patient_plugin().await;
        // Like a tunnel's pre-established connections: open, and silent.
        let _dra_clients = two_connections(&dra).await;
        let _reg_clients = two_connections(&reg).await;
        tokio::time::timeout(GUARD, plugin.stop())
            .await
            .expect("the stop waited for connections that never carried a call");
    }

    #[tokio::test]
    async fn a_stop_ends_a_used_connection_gracefully_while_its_client_lives() {
        use crate::grpc::registration::{InfoRequest, registration_client::RegistrationClient};
        let (plugin, _dra, reg) = patient_plugin().await;
        let mut client = RegistrationClient::new(reg.channel());
        let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.name, "drv.test");
        // The client keeps its connection; the server's GOAWAY ends it without the hard stop.
        tokio::time::timeout(GUARD, plugin.stop())
            .await
            .expect("the stop waited out its grace for a connection without a call in flight");
        drop(client);
    }

    /// A client channel to `server` whose one connection stops carrying the client's bytes once
    /// `cut` is cancelled, while the server's end stays open: a kubelet that closes its
    /// connection on the server's GOAWAY, behind a port-forward that passes the close on late.
    fn late_close_channel(server: &ConnectionSender, cut: &CancellationToken) -> tonic::transport::Channel {
        let (server, cut) = (server.clone(), cut.clone());
        tonic::transport::Endpoint::from_static("http://localhost").connect_with_connector_lazy(
            tower::service_fn(move |_: http::Uri| {
                let (server, cut) = (server.clone(), cut.clone());
                async move {
                    let (client, client_side) = tokio::io::duplex(1 << 16);
                    let (server_side, served) = tokio::io::duplex(1 << 16);
                    server.send(served).await?;
                    let (mut from_client, mut to_client) = tokio::io::split(client_side);
                    let (mut from_server, mut to_server) = tokio::io::split(server_side);
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = tokio::io::copy(&mut from_client, &mut to_server) => {}
                            () = cut.cancelled() => {}
                        }
                        // Never closed, never written again: the server reads neither an answer
                        // nor the end.
                        let _held_open = to_server;
                        std::future::pending::<()>().await;
                    });
                    tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
                    Ok::<_, ServerGone>(hyper_util::rt::TokioIo::new(client))
                }
            }),
        )
    }

    #[tokio::test]
    async fn a_stop_ends_a_used_connection_whose_client_no_longer_answers() {
        use crate::grpc::registration::{InfoRequest, registration_client::RegistrationClient};
        let (plugin, _dra, reg) = patient_plugin().await;
        let cut = CancellationToken::new();
        let mut client = RegistrationClient::new(late_close_channel(&reg, &cut));
        client.get_info(InfoRequest {}).await.unwrap();
        // The kubelet closes on the GOAWAY without answering its PING; the close arrives late.
        cut.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(10), plugin.stop())
            .await
            .expect("the stop waited for an answer to its GOAWAY on a connection without a call open");
        drop(client);
    }

    #[tokio::test]
    async fn a_stop_waits_for_a_call_in_flight_on_a_connection_whose_client_no_longer_answers() {
        use crate::{
            calls::Method,
            grpc::registration::{InfoRequest, registration_client::RegistrationClient},
        };
        let (plugin, _dra, reg) = patient_plugin().await;
        let cut = CancellationToken::new();
        let mut client = RegistrationClient::new(late_close_channel(&reg, &cut));
        let blocked = plugin.calls().block(Method::GetInfo);
        let call = tokio::spawn(async move { client.get_info(InfoRequest {}).await.map(|_| client) });
        plugin.calls().wait_at_least(Method::GetInfo, 1, GUARD).await.unwrap();
        cut.cancel();
        let plugin = std::sync::Arc::new(plugin);
        let stopping = tokio::spawn({
            let plugin = plugin.clone();
            async move { plugin.stop().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!stopping.is_finished(), "the stop ended a connection with a call in flight");
        drop(blocked);
        tokio::time::timeout(GUARD, stopping)
            .await
            .expect("the stop went on after the call in flight ended")
            .unwrap();
        // The answer was sent before the connection ended.
        call.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn every_served_connection_normalises_the_authority() {
        let rewritten = served_bytes(VECTOR).await;
        assert_ne!(rewritten, VECTOR);
        let has = |bytes: &[u8], what: &[u8]| bytes.windows(what.len()).any(|w| w == what);
        assert!(has(&rewritten, b"localhost"));
        assert!(!has(VECTOR, b"localhost"));
        // Not HTTP/2: untouched.
        assert_eq!(served_bytes(b"hello").await, b"hello");
    }
}
