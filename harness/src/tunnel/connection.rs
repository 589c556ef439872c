//! The connection a tunnel hands over: the dialed stream plus the bookkeeping that lets the
//! tunnel notice first use and close it at any time.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::oneshot,
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::Shared;
use crate::plugin::BoxedConnection;

/// The dialed stream, shared between the handed-over [`TunnelConnection`] and the tunnel's
/// per-connection supervisor, so either can close it.
pub(super) type SharedIo = Arc<Mutex<Option<BoxedConnection>>>;

pub(super) fn lock(io: &SharedIo) -> MutexGuard<'_, Option<BoxedConnection>> {
    io.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A pre-established tunnel connection as its consumer sees it. I/O fails once the tunnel
/// closes it; the first byte read from the remote side marks it used (the kubelet speaks first
/// in gRPC), which makes the tunnel establish a replacement.
pub(super) struct TunnelConnection {
    pub(super) io: SharedIo,
    pub(super) killed: Pin<Box<WaitForCancellationFutureOwned>>,
    pub(super) used: Arc<AtomicBool>,
    pub(super) shared: Arc<Shared>,
    /// Dropped with the connection: tells the supervisor.
    pub(super) _dropped: oneshot::Sender<()>,
}

impl TunnelConnection {
    pub(super) fn new(
        io: SharedIo,
        kill: &CancellationToken,
        used: Arc<AtomicBool>,
        shared: Arc<Shared>,
        dropped: oneshot::Sender<()>,
    ) -> Self {
        TunnelConnection {
            io,
            killed: Box::pin(kill.clone().cancelled_owned()),
            used,
            shared,
            _dropped: dropped,
        }
    }

    /// Fails when the tunnel closed this connection; registers for that wake-up otherwise.
    fn check_killed(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.killed.as_mut().poll(cx) {
            Poll::Ready(()) => {
                drop(lock(&self.io).take());
                Err(closed())
            }
            Poll::Pending => Ok(()),
        }
    }

    fn with_io<T>(
        &mut self,
        cx: &mut Context<'_>,
        f: impl FnOnce(Pin<&mut BoxedConnection>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Err(e) = self.check_killed(cx) {
            return Poll::Ready(Err(e));
        }
        let mut io = lock(&self.io);
        match io.as_mut() {
            Some(io) => f(Pin::new(io), cx),
            None => Poll::Ready(Err(closed())),
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the tunnel closed this connection")
}

impl AsyncRead for TunnelConnection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = this.with_io(cx, |io, cx| io.poll_read(cx, buf));
        if matches!(result, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && !this.used.swap(true, Ordering::AcqRel)
        {
            this.shared.mark_used();
        }
        result
    }
}

impl AsyncWrite for TunnelConnection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().with_io(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().with_io(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        lock(&self.io).as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().with_io(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut io = lock(&self.io);
        match io.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl Drop for TunnelConnection {
    fn drop(&mut self) {
        // Close the stream now; the supervisor (woken by `_dropped`) tears the transport down.
        drop(lock(&self.io).take());
    }
}
