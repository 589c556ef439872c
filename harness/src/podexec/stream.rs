//! Reading an exec stream to its end, also when it breaks.
//!
//! kube 5's [`AttachedProcess`] hands out its stdout and stderr as halves of tokio simplex pipes.
//! When its WebSocket ends with an error (the connection reset without a close frame: every exec
//! stream through a node's kubelet ends so when the kubelet restarts), its message loop returns
//! the error without shutting those pipes, and the halves of a simplex pipe do not close when
//! dropped: a reader then waits for an end of file that never comes (seen on v1.37.2: a proxy's
//! exec stream stayed silent, never ended, until a heartbeat timeout noticed it; `kubectl exec`
//! on the same node ended at once with "close 1006 (abnormal closure)"). So the functions here
//! end with the message loop instead: its status channel resolves when the loop sends the
//! command's status or stops, and then the loop's own result says whether the pipes were shut
//! (the output is complete) or the stream broke (the output is what arrived).

use std::future::Future;

use futures::FutureExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachedProcess;
use tokio::io::{AsyncReadExt as _, ReadHalf, SimplexStream};

use super::{OnLine, log_lines};

/// One output pipe of an exec stream (`None` when not requested).
pub(super) type Pipe = Option<ReadHalf<SimplexStream>>;

/// What an exec stream delivered.
#[derive(Debug)]
pub struct Collected {
    /// Standard output, as far as it arrived.
    pub stdout: Vec<u8>,
    /// Standard error, as far as it arrived.
    pub stderr: Vec<u8>,
    /// The command's status, or why the stream ended without one (it broke, or closed early).
    pub status: Result<Status, String>,
}

/// Reads stdout and stderr of `process` until its stream ends: with the command's status, or at
/// once when the stream breaks (kube 5 leaves a broken stream's pipes open, so this ends with the
/// stream's message loop, not with the pipes' end of file).
/// Does not time out by itself: bound it.
pub async fn collect(process: AttachedProcess) -> Collected {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (out, err) = (&mut stdout, &mut stderr);
    let status = until_end(process, move |o, e| async move {
        tokio::join!(read_into(o, out), read_into(e, err));
    })
    .await;
    Collected { stdout, stderr, status }
}

/// Passes every output line of `process` to `on_line` (logged at debug level as `name` unless
/// `on_line` says not to) until its stream ends; the command's status, or why there is none.
pub(super) async fn follow(process: AttachedProcess, name: &str, on_line: &OnLine) -> Result<Status, String> {
    until_end(process, |o, e| async move {
        tokio::join!(log_lines(o, name, "stdout", on_line), log_lines(e, name, "stderr", on_line));
    })
    .await
}

/// Runs `consume` on the process's pipes until the stream ends; the status, or why there is none.
async fn until_end<F>(
    mut process: AttachedProcess,
    consume: impl FnOnce(Pipe, Pipe) -> F,
) -> Result<Status, String>
where
    F: Future<Output = ()>,
{
    let (stdout, stderr) = (process.stdout(), process.stderr());
    let Some(status) = process.take_status() else {
        return Err("the exec stream has no status channel".to_owned());
    };
    let consuming = consume(stdout, stderr);
    tokio::pin!(consuming, status);
    let mut consumed = false;
    // The status resolves when the loop sent it (the loop then shuts the pipes) or stopped.
    let status = tokio::select! {
        () = &mut consuming => {
            consumed = true;
            status.await
        }
        status = &mut status => status,
    };
    if let Some(status) = status {
        if !consumed {
            consuming.await;
        }
        return Ok(status);
    }
    // The loop is over: `join` returns at once, with how it ended.
    match process.join().await {
        Ok(()) => {
            if !consumed {
                consuming.await;
            }
            Err("the stream ended without an exit status".to_owned())
        }
        Err(e) => {
            if !consumed {
                // What already arrived; the pipes never end (see the module docs).
                let _ = tokio::task::unconstrained(consuming.as_mut()).now_or_never();
            }
            Err(format!("the stream broke: {e}"))
        }
    }
}

/// Appends everything `pipe` delivers to `buf`, up to its end or an error.
async fn read_into(pipe: Pipe, buf: &mut Vec<u8>) {
    let Some(mut pipe) = pipe else { return };
    loop {
        match pipe.read_buf(buf).await {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "cannot read command output");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::SinkExt as _;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, AttachParams};
    use tokio::io::AsyncReadExt as _;
    use tokio_tungstenite::tungstenite::{
        Message,
        handshake::server::{ErrorResponse, Request, Response},
        http::HeaderValue,
    };

    use super::*;

    /// Upper bound for a stream to end; what ends does so at once.
    const T: Duration = Duration::from_secs(10);

    /// How the peer ends the stream after its stdout.
    #[derive(Clone, Copy)]
    enum End {
        /// The exit status, then a close frame.
        Status,
        /// The TCP connection drops without a close frame (a kubelet restart).
        Break,
    }

    /// An API server's exec endpoint on 127.0.0.1 that speaks `v5.channel.k8s.io`: it sends
    /// `stdout` and then ends as `end` says. A client of it.
    async fn peer(stdout: &'static [u8], end: End) -> (kube::Client, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_hdr_async(tcp, v5).await.unwrap();
            ws.send(Message::binary([&[1u8][..], stdout].concat())).await.unwrap();
            if let End::Status = end {
                let status = br#"{"metadata":{},"status":"Success"}"#;
                ws.send(Message::binary([&[3u8][..], status].concat())).await.unwrap();
                ws.close(None).await.unwrap();
            }
            // Dropping the stream closes the TCP connection; no close frame for `Break`.
        });
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        (kube::Client::try_from(config).unwrap(), served)
    }

    /// Answers the upgrade with kube's preferred subprotocol.
    #[allow(clippy::result_large_err)] // tungstenite's callback signature
    fn v5(_: &Request, mut response: Response) -> Result<Response, ErrorResponse> {
        let v5 = HeaderValue::from_static("v5.channel.k8s.io");
        response.headers_mut().insert("Sec-WebSocket-Protocol", v5);
        Ok(response)
    }

    async fn exec(client: kube::Client) -> AttachedProcess {
        let params = AttachParams::default().stdin(false).stdout(true).stderr(true);
        Api::<Pod>::namespaced(client, "ns").exec("pod", ["cmd"], &params).await.unwrap()
    }

    #[tokio::test]
    async fn a_stream_that_ends_with_a_status_is_read_to_its_end() {
        let (client, served) = peer(b"all of it\n", End::Status).await;
        let collected = tokio::time::timeout(T, collect(exec(client).await)).await.unwrap();
        served.await.unwrap();
        assert_eq!(collected.stdout, b"all of it\n");
        assert_eq!(collected.status.unwrap().status.as_deref(), Some("Success"));
    }

    #[tokio::test]
    async fn a_stream_that_breaks_ends_at_once_with_what_arrived() {
        let (client, served) = peer(b"partial", End::Break).await;
        let collected = tokio::time::timeout(T, collect(exec(client).await))
            .await
            .expect("a broken stream must end, not wait for pipes that never close");
        served.await.unwrap();
        assert_eq!(collected.stdout, b"partial");
        let reason = collected.status.unwrap_err();
        assert!(reason.starts_with("the stream broke:"), "{reason}");
    }

    /// Why [`collect`] exists: kube 5 leaves the pipes of a broken stream open. When a kube
    /// release closes them, this fails, and `collect` may read to the end again.
    #[tokio::test]
    async fn kube_leaves_the_pipes_of_a_broken_stream_open() {
        let (client, served) = peer(b"partial", End::Break).await;
        let mut process = exec(client).await;
        let mut stdout = process.stdout().unwrap();
        served.await.unwrap();
        let mut read = Vec::new();
        let waited = tokio::time::timeout(Duration::from_secs(1), stdout.read_to_end(&mut read)).await;
        assert!(waited.is_err(), "stdout ended ({waited:?}): kube closes broken streams' pipes now");
        assert_eq!(read, b"partial");
        assert!(process.join().await.is_err());
    }
}
