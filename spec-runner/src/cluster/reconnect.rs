//! A client that waits out an API server that is restarting: a request that never reached it
//! (no connection taken) is sent again every [`RETRY_EVERY`], for at most the client's budget; a
//! read (GET, HEAD) or a DELETE whose connection broke before an answer is sent again the same
//! way (sending it twice does no harm: a DELETE done twice answers 404, which every clean-up
//! takes for "gone"). Answers, errors included, are the caller's (kube's own retry layer, below
//! this one, already sends again those that answer 429, 503 or 504).
//!
//! The run's own client is wrapped ([`super::kube_backend::KubeBackend::connect`]), and so every
//! client derived from it: specs in flight and their clean-ups wait for the API server instead of
//! failing at once or leaving objects behind. The port-forward and exec client is not (a tunnel
//! decides itself when to dial again).

use std::time::Duration;

use http_body_util::BodyExt as _;
use kube::{Client, client::Body};
use tokio::time::Instant;

/// How long a request that could not reach the API server waits before it is sent again.
pub(crate) const RETRY_EVERY: Duration = Duration::from_millis(500);

/// How long the run's client keeps sending a request that cannot reach the API server: longer
/// than the local cluster's API server takes to restart.
pub(crate) const RECONNECT_BUDGET: Duration = Duration::from_secs(60);

/// `client`, sending again the requests that did not reach the API server (see the module docs)
/// for at most `budget` after the first try.
pub fn reconnecting(client: Client, budget: Duration) -> Client {
    let default_namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let inner = client.clone();
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let deadline = Instant::now() + budget;
            loop {
                let mut again = http::Request::builder()
                    .method(parts.method.clone())
                    .uri(parts.uri.clone())
                    .version(parts.version);
                if let Some(headers) = again.headers_mut() {
                    headers.clone_from(&parts.headers);
                }
                let again = again.body(Body::from(bytes.clone())).map_err(kube::Error::HttpError)?;
                match inner.send(again).await {
                    Err(e)
                        if may_send_again(&parts.method, &e) && Instant::now() + RETRY_EVERY < deadline =>
                    {
                        tracing::debug!(method = %parts.method, uri = %parts.uri, error = %e, "the API server did not answer; sending the request again");
                        tokio::time::sleep(RETRY_EVERY).await;
                    }
                    other => return other,
                }
            }
        }
    });
    Client::new(service, &default_namespace)
}

/// Whether a request that failed with `error` may be sent again: it never reached the API
/// server, or sending it twice does no harm.
fn may_send_again(method: &http::Method, error: &kube::Error) -> bool {
    is_connect_error(error)
        || matches!(*method, http::Method::GET | http::Method::HEAD | http::Method::DELETE)
}

/// Whether the request failed before it was sent: no connection to the API server.
pub(crate) fn is_connect_error(error: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<hyper_util::client::legacy::Error>().is_some_and(|e| e.is_connect()) {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use k8s_openapi::api::core::v1::Namespace;
    use kube::{Api, api::PostParams};

    use super::*;

    /// A client of `addr` over plain HTTP, as the run's client is built.
    fn client_of(addr: SocketAddr) -> Client {
        let mut config = kube::Config::new(format!("http://{addr}").parse().expect("uri"));
        config.connect_timeout = Some(Duration::from_secs(1));
        Client::try_from(config).expect("client")
    }

    /// A port nothing listens on (yet).
    fn free_addr() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    }

    /// A server that answers every request with `status` and a namespace, after `delay`; it
    /// counts the requests it got.
    async fn serve_after(
        addr: SocketAddr,
        delay: Duration,
        status: u16,
        requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        tokio::time::sleep(delay).await;
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind again");
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let requests = requests.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |_request: http::Request<hyper::body::Incoming>| {
                        requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let body = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n"}}"#;
                        async move {
                            http::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    }

    #[tokio::test]
    async fn a_create_waits_for_a_server_that_takes_connections_later() {
        let addr = free_addr();
        let requests = std::sync::Arc::default();
        let server = tokio::spawn(serve_after(
            addr,
            Duration::from_millis(1500),
            201,
            std::sync::Arc::clone(&requests),
        ));
        let api: Api<Namespace> = Api::all(reconnecting(client_of(addr), Duration::from_secs(10)));
        let created = api.create(&PostParams::default(), &Namespace::default()).await;
        server.abort();
        assert_eq!(created.expect("created once the server listens").metadata.name.as_deref(), Some("n"));
        assert_eq!(
            requests.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the create reached the server once"
        );
    }

    #[tokio::test]
    async fn gives_up_after_its_budget() {
        let addr = free_addr();
        let api: Api<Namespace> = Api::all(reconnecting(client_of(addr), Duration::from_secs(1)));
        let answer = tokio::time::timeout(Duration::from_secs(30), api.get("n")).await;
        let error = answer.expect("gave up within 30 s").expect_err("nothing listens");
        assert!(is_connect_error(&error), "{error}");
    }

    #[tokio::test]
    async fn answers_are_the_caller_s_even_errors() {
        let addr = free_addr();
        let requests = std::sync::Arc::default();
        let server = tokio::spawn(serve_after(addr, Duration::ZERO, 500, std::sync::Arc::clone(&requests)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let api: Api<Namespace> = Api::all(reconnecting(client_of(addr), Duration::from_secs(10)));
        let answer = api.get("n").await;
        server.abort();
        assert!(answer.is_err(), "a 500 is an error for the caller");
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1, "not sent again");
    }
}
