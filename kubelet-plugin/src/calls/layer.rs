//! The tower layer that records calls and applies faults.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt as _, Full};
use tonic::body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::{
    CallStatus, Calls, ClaimFaults,
    decode::{MethodCodec, claims_of, codec_for, drain_frames},
};

/// Records every call passing through it into a [`Calls`] and applies its
/// faults. Install it with `Server::builder().layer(calls.layer())`.
#[derive(Clone, Debug)]
pub struct CallsLayer {
    calls: Calls,
}

impl CallsLayer {
    /// A layer recording into `calls`.
    pub fn new(calls: Calls) -> Self {
        CallsLayer { calls }
    }
}

impl<S> Layer<S> for CallsLayer {
    type Service = CallsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallsService { inner, calls: self.calls.clone() }
    }
}

/// The service produced by [`CallsLayer`].
#[derive(Clone, Debug)]
pub struct CallsService<S> {
    inner: S,
    calls: Calls,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> Service<http::Request<Body>> for CallsService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The ready service is the one we were polled for; keep a fresh clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let calls = self.calls.clone();
        Box::pin(handle(calls, inner, req))
    }
}

/// Marks a call as cancelled if the request future is dropped before the
/// handler returned (client went away, connection killed).
struct PendingCall {
    calls: Calls,
    id: u64,
    armed: bool,
}

impl PendingCall {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if self.armed {
            self.calls.finish_call(
                self.id,
                CallStatus {
                    code: tonic::Code::Cancelled,
                    message:
                        "call abandoned before the handler returned (client went away or plugin stopped)"
                            .into(),
                },
                false,
            );
        }
    }
}

async fn handle<S>(
    calls: Calls,
    mut inner: S,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
{
    let path = req.uri().path().to_string();
    let codec = codec_for(&path);

    // Known methods have a single request message: buffer it so it can be
    // recorded, then hand the same bytes to the handler. Unknown methods
    // are passed through untouched (the router answers UNIMPLEMENTED).
    let (req, request_json) = match codec {
        Some(codec) => {
            let (parts, body) = req.into_parts();
            match body.collect().await {
                Ok(collected) => {
                    let bytes = collected.to_bytes();
                    let mut buf = BytesMut::from(&bytes[..]);
                    let decoded = drain_frames(&mut buf, codec.request).into_iter().next();
                    let body = Body::new(Full::new(bytes));
                    (http::Request::from_parts(parts, body), decoded)
                }
                Err(status) => {
                    let id = calls.start_call(&path, Vec::new(), None);
                    let status =
                        tonic::Status::cancelled(format!("reading the request failed: {}", status.message()));
                    calls.finish_call(id, (&status).into(), false);
                    return Ok(status.into_http());
                }
            }
        }
        None => (req, None),
    };

    let claims = request_json.as_ref().map(claims_of).unwrap_or_default();
    let id = calls.start_call(&path, claims.clone(), request_json);
    let mut pending = PendingCall { calls: calls.clone(), id, armed: true };

    let admission = calls.admission(&path, &claims);
    if !admission.blocks.is_empty() {
        calls.update_call(id, |r| r.blocked = true);
        tracing::debug!(method = %path, "call held by a block");
        for mut release in admission.blocks {
            // Nothing is ever sent; this returns once the guard dropped the sender.
            while release.changed().await.is_ok() {}
        }
        calls.update_call(id, |r| r.blocked = false);
    }
    if !admission.delay.is_zero() {
        tokio::time::sleep(admission.delay).await;
    }
    if let Some(status) = calls.take_failure(&path, &claims) {
        tracing::debug!(method = %path, %status, "injecting failure");
        calls.finish_call(id, (&status).into(), true);
        pending.disarm();
        return Ok(status.into_http());
    }

    // The handler applies the per-claim faults where it builds its answer.
    let mut req = req;
    req.extensions_mut().insert(ClaimFaults::new(calls.clone(), id, path));
    let response = inner.call(req).await?;
    pending.disarm();
    let (parts, body) = response.into_parts();
    if let Some(status) = tonic::Status::from_header_map(&parts.headers) {
        // "Trailers-only" response: the status is in the headers, no body.
        calls.finish_call(id, (&status).into(), false);
        return Ok(http::Response::from_parts(parts, body));
    }
    let body = RecordingBody { inner: body, calls, id, codec, buf: BytesMut::new(), done: false };
    Ok(http::Response::from_parts(parts, Body::new(body)))
}

/// Wraps a response body: records every message sent and the final status
/// from the trailers, without buffering (streams pass through as they come).
struct RecordingBody {
    inner: Body,
    calls: Calls,
    id: u64,
    codec: Option<MethodCodec>,
    buf: BytesMut,
    done: bool,
}

impl RecordingBody {
    fn finish(&mut self, status: CallStatus) {
        if !self.done {
            self.done = true;
            self.calls.finish_call(self.id, status, false);
        }
    }

    fn record_data(&mut self, data: &Bytes) {
        let Some(codec) = self.codec else {
            return;
        };
        self.buf.extend_from_slice(data);
        let messages = drain_frames(&mut self.buf, codec.response);
        if messages.is_empty() {
            return;
        }
        self.calls.update_call(self.id, |record| {
            for message in messages {
                record.responses += 1;
                record.response = Some(message);
            }
        });
    }
}

impl http_body::Body for RecordingBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.record_data(data);
                } else if let Some(trailers) = frame.trailers_ref() {
                    let status = tonic::Status::from_header_map(trailers)
                        .map(|s| CallStatus::from(&s))
                        .unwrap_or(CallStatus {
                            code: tonic::Code::Unknown,
                            message: "trailers without grpc-status".into(),
                        });
                    this.finish(status);
                }
            }
            Poll::Ready(Some(Err(status))) => this.finish(status.into()),
            Poll::Ready(None) => this.finish(CallStatus {
                code: tonic::Code::Unknown,
                message: "response ended without grpc-status".into(),
            }),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RecordingBody {
    fn drop(&mut self) {
        self.finish(CallStatus {
            code: tonic::Code::Cancelled,
            message: "response abandoned before it ended (client went away or plugin stopped)".into(),
        });
    }
}
