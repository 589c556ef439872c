//! Byte streams to Unix sockets on a node: `/dra-e2e-dial <socket>` exec'd in a proxy pod, its
//! stdin and stdout joined into one connection, and gRPC channels over such connections.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess};
use tokio::io::{AsyncRead, AsyncWrite, Join, ReadBuf, ReadHalf, SimplexStream, WriteHalf};
use tonic::transport::{Channel, Endpoint};

use super::InterposerError;
use crate::tunnel::PodRef;

/// The dialer in the proxy image.
pub const DIAL_BINARY: &str = "/dra-e2e-dial";
/// The exec stream's buffer per direction (kube's default is 1 KiB).
const BUFFER: usize = 64 * 1024;

/// One connection to a socket in a pod: the exec'd dialer's stdout and stdin. Dropping it ends
/// the exec stream; the dialer exits when its stdin or the socket closes.
pub struct ExecStream {
    io: Join<ReadHalf<SimplexStream>, WriteHalf<SimplexStream>>,
    /// Keeps the exec stream open (dropping it aborts the stream's task).
    _process: AttachedProcess,
}

impl AsyncRead for ExecStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ExecStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Connects to `socket` (a path inside `pod`, mounted from the node) through exec.
pub async fn dial(client: &kube::Client, pod: &PodRef, socket: &str) -> Result<ExecStream, InterposerError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let mut params = AttachParams::default().container(&pod.container).stdin(true).stdout(true).stderr(false);
    params.max_stdin_buf_size = Some(BUFFER);
    params.max_stdout_buf_size = Some(BUFFER);
    let error = |reason: String| InterposerError::Dial {
        socket: socket.to_owned(),
        pod: format!("{}/{}", pod.namespace, pod.name),
        reason,
    };
    let mut process =
        api.exec(&pod.name, [DIAL_BINARY, socket], &params).await.map_err(|e| error(format!("exec: {e}")))?;
    let (Some(stdout), Some(stdin)) = (process.stdout(), process.stdin()) else {
        return Err(error("the exec stream has no stdin or stdout".to_owned()));
    };
    Ok(ExecStream { io: tokio::io::join(stdout, stdin), _process: process })
}

/// A gRPC channel to `socket` in `pod`: connects on first use, and again (a new exec) after
/// the connection broke. The requests' `:authority` is `localhost`, as the kubelet's is.
pub fn channel(client: kube::Client, pod: PodRef, socket: String) -> Channel {
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(
        move |_: http::Uri| {
            let (client, pod, socket) = (client.clone(), pod.clone(), socket.clone());
            async move { dial(&client, &pod, &socket).await.map(TokioIo::new) }
        },
    ))
}
