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

/// Reads stdout and stderr of `process` until its stream ends (see the [module docs](self)).
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
