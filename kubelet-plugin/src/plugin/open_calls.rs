//! Which served connections carry a call, so that a stopping plugin can end a connection as
//! soon as no call is open on it.
//!
//! A graceful HTTP/2 stop sends GOAWAY and a PING and waits for the PING's answer before it
//! closes the connection. The kubelet (grpc-go) does not answer: it closes a connection that gets
//! a GOAWAY while no stream is open. Over a Unix socket the server reads that close at once;
//! through a proxy pod's port-forward it arrives only when the container runtime gives up the
//! forwarded connection (containerd waits a second for the other direction), so every stop
//! waited out its whole grace. A call still open when the stop begins keeps its connection
//! until it ends (or the hard stop).
//!
//! [`OpenCallsLayer`] counts, per connection, the calls whose request reached the plugin and
//! whose response has not ended (a streamed response is open until its last frame, a call whose
//! client went away until its handler is dropped). The connection's [`ConnectionCalls`] comes
//! from the request's extensions, where tonic puts each connection's `ConnectInfo`.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use futures::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tower_layer::Layer;
use tower_service::Service;

/// The calls open on one served connection.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectionCalls(Arc<Counter>);

#[derive(Debug, Default)]
struct Counter {
    open: AtomicUsize,
    /// The connection's reader, woken when the last open call ends.
    idle: AtomicWaker,
}

impl ConnectionCalls {
    /// Ready once no call is open; else `cx` is woken when the last one ends.
    pub(crate) fn poll_idle(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.0.idle.register(cx.waker());
        if self.0.open.load(Ordering::Acquire) == 0 { Poll::Ready(()) } else { Poll::Pending }
    }

    /// Counts a call as open until the returned guard is dropped.
    pub(crate) fn begin(&self) -> OpenCall {
        self.0.open.fetch_add(1, Ordering::AcqRel);
        OpenCall(self.clone())
    }
}

/// One open call; dropping it ends the call.
#[derive(Debug)]
pub(crate) struct OpenCall(ConnectionCalls);

impl Drop for OpenCall {
    fn drop(&mut self) {
        if self.0.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.0.idle.wake();
        }
    }
}

/// Counts each request as an open call on its connection (see the module docs). Requests
/// without a [`ConnectionCalls`] pass uncounted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenCallsLayer;

impl<S> Layer<S> for OpenCallsLayer {
    type Service = OpenCallsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OpenCallsService { inner }
    }
}

/// The service produced by [`OpenCallsLayer`].
#[derive(Clone, Debug)]
pub(crate) struct OpenCallsService<S> {
    inner: S,
}

impl<S> Service<http::Request<Body>> for OpenCallsService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let open = req.extensions().get::<ConnectionCalls>().map(ConnectionCalls::begin);
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(match open {
                Some(open) => response.map(|body| Body::new(OpenBody { body, _open: open })),
                None => response,
            })
        })
    }
}

/// A response body that keeps its call open until it is dropped.
struct OpenBody {
    body: Body,
    _open: OpenCall,
}

impl http_body::Body for OpenBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use futures::task::noop_waker_ref;
    use http_body_util::BodyExt as _;

    use super::*;

    fn idle(calls: &ConnectionCalls) -> bool {
        calls.poll_idle(&mut Context::from_waker(noop_waker_ref())).is_ready()
    }

    #[tokio::test]
    async fn a_call_is_open_until_its_response_body_is_done() {
        let calls = ConnectionCalls::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rx = std::sync::Mutex::new(Some(rx));
        let inner = tower::service_fn(move |_: http::Request<Body>| {
            let rx = rx.lock().unwrap().take();
            async move {
                // The response's body streams until `tx` says so.
                let stream = futures::stream::once(async move {
                    if let Some(rx) = rx {
                        let _ = rx.await;
                    }
                    Ok::<_, tonic::Status>(Frame::data(bytes::Bytes::from_static(b"x")))
                });
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::new(
                    http_body_util::StreamBody::new(stream),
                )))
            }
        });
        let mut service = OpenCallsLayer.layer(inner);
        let mut req = http::Request::new(Body::empty());
        req.extensions_mut().insert(calls.clone());
        assert!(idle(&calls));
        let response = service.call(req).await.unwrap();
        assert!(!idle(&calls), "the response's body is still streaming");
        let collecting = tokio::spawn(response.into_body().collect());
        tx.send(()).unwrap();
        collecting.await.unwrap().unwrap();
        assert!(idle(&calls), "the body ended and was dropped");

        // A request without a connection's counter passes.
        let response = service.call(http::Request::new(Body::empty())).await.unwrap();
        assert!(idle(&calls));
        drop(response);
    }

    #[test]
    fn the_last_call_to_end_wakes_the_reader() {
        let calls = ConnectionCalls::default();
        let (first, second) = (calls.begin(), calls.begin());
        let woken = Arc::new(AtomicUsize::new(0));
        let waker = futures::task::waker(Arc::new(CountWakes(woken.clone())));
        assert!(calls.poll_idle(&mut Context::from_waker(&waker)).is_pending());
        drop(first);
        assert_eq!(woken.load(Ordering::SeqCst), 0, "a call is still open");
        drop(second);
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(idle(&calls));
    }

    struct CountWakes(Arc<AtomicUsize>);

    impl futures::task::ArcWake for CountWakes {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
