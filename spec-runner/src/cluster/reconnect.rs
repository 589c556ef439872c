//! The run's client: it waits out an API server that is restarting, and refuses at once what
//! waiting cannot mend.
//!
//! - A request that never reached the API server (no connection could be made) is sent again
//!   every [`RETRY_EVERY`], for at most the client's budget ([`RECONNECT_BUDGET`] for the run's).
//! - A request whose connection broke after it was (or may have been) sent is sent again the same
//!   way when that is safe, and made safe first where it needs to be: a create is looked up before
//!   it is sent again, a conflict or a `404` to a second update or delete is checked. What is safe
//!   for each verb is [`super::resend`]'s table.
//! - Until the client has had one answer from the API server (any status), nothing is sent again:
//!   the first request of a run to an API server that cannot be reached fails at once with its
//!   reason (a wrong port, a cluster that is down), as bad input must.
//! - TLS failures (a server certificate the kubeconfig does not trust, a client certificate the
//!   server refuses) are never sent again: they are not transient. Answers, errors such as `401`
//!   and `403` included, are the caller's (kube's own retry layer, below this one, already sends
//!   again those that answer 429, 503 or 504).
//!
//! The run's own client is wrapped ([`super::kube_backend::KubeBackend::connect`]), and so every
//! client derived from it (the run identity's stamping, the plugins' impersonating clients): specs
//! in flight and their clean-ups wait for the API server instead of failing at once or leaving
//! objects behind. The port-forward and exec client is not (a tunnel decides itself when to dial
//! again), nor the client that probes the API server for disruptions.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use http_body_util::BodyExt as _;
use kube::{Client, client::Body};
use tokio::time::Instant;

use crate::cluster::{
    resend::Resendable,
    transport::{self, Failure},
};

/// How long a request that could not reach the API server waits before it is sent again.
pub(crate) const RETRY_EVERY: Duration = Duration::from_millis(500);

/// How long the run's client keeps sending a request that cannot reach the API server: longer
/// than the local cluster's API server takes to restart.
pub(crate) const RECONNECT_BUDGET: Duration = Duration::from_secs(60);

/// `client`, sending again (see the module docs) the requests that got no answer, for at most
/// `budget` after the first try, once it has had an answer from the API server.
pub fn reconnecting(client: Client, budget: Duration) -> Client {
    let default_namespace = client.default_namespace().to_owned();
    let answered = Arc::new(AtomicBool::new(false));
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let inner = client.clone();
        let answered = Arc::clone(&answered);
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await?.to_bytes();
            send(&inner, &answered, &Resendable::new(parts, bytes), budget).await
        }
    });
    Client::new(service, &default_namespace)
}

/// Sends `request` through `inner` until it has an answer, sending it again as the module docs
/// say; `answered`: whether this client ever had an answer.
async fn send(
    inner: &Client,
    answered: &AtomicBool,
    request: &Resendable,
    budget: Duration,
) -> Result<http::Response<Body>, kube::Error> {
    let deadline = Instant::now() + budget;
    let mut answer_lost = false;
    loop {
        let sent = if answer_lost { request.resend(inner).await } else { request.send(inner).await };
        let error = match sent {
            Ok(response) => {
                answered.store(true, Ordering::Relaxed);
                return Ok(response);
            }
            Err(error) => error,
        };
        let failure = transport::failure(&error);
        let again = match failure {
            Failure::NotSent => true,
            Failure::AnswerLost => request.after_lost_answer(),
            Failure::Tls(_) | Failure::Other => false,
        };
        if !again || !answered.load(Ordering::Relaxed) || Instant::now() + RETRY_EVERY >= deadline {
            return Err(error);
        }
        answer_lost |= failure == Failure::AnswerLost;
        tracing::debug!(method = %request.method(), uri = %request.uri(), error = %error, answer_lost, "the API server did not answer; sending the request again");
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use std::{
        net::SocketAddr,
        sync::{Arc, atomic::AtomicUsize},
    };

    use k8s_openapi::api::core::v1::Namespace;
    use kube::{Api, api::PostParams};

    use super::*;

    /// A client of `addr` over plain HTTP, as the run's client is built.
    fn client_of(addr: SocketAddr) -> Client {
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.connect_timeout = Some(Duration::from_secs(1));
        Client::try_from(config).unwrap()
    }

    /// A port nothing listens on (yet).
    fn free_addr() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    /// A server on `addr` that answers every request with `status` and a namespace, and counts
    /// the POSTs it got in `posts`. Its connections close when it is dropped.
    struct Server(tokio::task::JoinHandle<()>);

    impl Server {
        async fn start(addr: SocketAddr, status: u16, posts: Arc<AtomicUsize>) -> Self {
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            Server(tokio::spawn(async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((stream, _)) = listener.accept().await {
                    let posts = Arc::clone(&posts);
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            if request.method() == http::Method::POST {
                                posts.fetch_add(1, Ordering::SeqCst);
                            }
                            let body = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n"}}"#;
                            async move {
                                http::Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json")
                                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                            }
                        });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    connections.spawn(async move {
                        let _ =
                            hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                    });
                }
            }))
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.0.abort();
        }
    }

    /// Waits until nothing accepts connections on `addr` any more (an aborted server's listener
    /// is closed when its task is dropped).
    async fn closed(addr: SocketAddr) {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn before_its_first_answer_nothing_is_sent_again() {
        let api: Api<Namespace> = Api::all(reconnecting(client_of(free_addr()), Duration::from_secs(3600)));
        let answer = tokio::time::timeout(Duration::from_secs(60), api.get("n")).await;
        let error = answer.expect("refused at once, not waited for").expect_err("nothing listens");
        assert_eq!(transport::failure(&error), Failure::NotSent, "{error}");
    }

    #[tokio::test]
    async fn once_answered_a_create_waits_for_a_server_that_takes_connections_again() {
        let addr = free_addr();
        let posts = Arc::new(AtomicUsize::new(0));
        let api: Api<Namespace> = Api::all(reconnecting(client_of(addr), Duration::from_secs(60)));
        let server = Server::start(addr, 200, Arc::clone(&posts)).await;
        api.get("n").await.unwrap();
        drop(server);
        closed(addr).await;
        let restarted = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Server::start(addr, 201, Arc::clone(&posts)).await
        };
        let (params, namespace) = (PostParams::default(), Namespace::default());
        let (created, _server) = tokio::join!(api.create(&params, &namespace), restarted);
        assert_eq!(created.unwrap().metadata.name.as_deref(), Some("n"));
        assert_eq!(posts.load(Ordering::SeqCst), 1, "the create reached the server once");
    }

    #[tokio::test]
    async fn gives_up_after_its_budget() {
        let addr = free_addr();
        let api: Api<Namespace> = Api::all(reconnecting(client_of(addr), Duration::from_secs(1)));
        let server = Server::start(addr, 200, Arc::default()).await;
        api.get("n").await.unwrap();
        drop(server);
        closed(addr).await;
        let answer = tokio::time::timeout(Duration::from_secs(30), api.get("n")).await;
        let error = answer.expect("gave up within 30 s").expect_err("nothing listens");
        assert_eq!(transport::failure(&error), Failure::NotSent, "{error}");
    }

    #[tokio::test]
    async fn a_tls_refusal_is_never_sent_again() {
        // Answers the first request; refuses every later one as a server of an unknown CA does.
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&sent);
        let inner = Client::new(
            tower::service_fn(move |_request: http::Request<Body>| {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        let namespace = br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n"}}"#;
                        return Ok(http::Response::builder()
                            .status(200)
                            .body(Body::from(namespace.to_vec()))
                            .unwrap());
                    }
                    let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
                    let io = std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
                    Err::<http::Response<Body>, _>(Box::new(io) as Box<dyn std::error::Error + Send + Sync>)
                }
            }),
            "default",
        );
        let api: Api<Namespace> = Api::all(reconnecting(inner, Duration::from_secs(3600)));
        api.get("n").await.unwrap();
        let error = tokio::time::timeout(Duration::from_secs(60), api.get("n")).await.unwrap().unwrap_err();
        assert!(matches!(transport::failure(&error), Failure::Tls(_)), "{error}");
        assert_eq!(sent.load(Ordering::SeqCst), 2, "not sent again");
    }

    #[tokio::test]
    async fn answers_are_the_caller_s_even_errors() {
        let addr = free_addr();
        let posts = Arc::new(AtomicUsize::new(0));
        let _server = Server::start(addr, 500, Arc::clone(&posts)).await;
        let api: Api<Namespace> = Api::all(reconnecting(client_of(addr), Duration::from_secs(10)));
        api.create(&PostParams::default(), &Namespace::default())
            .await
            .expect_err("a 500 is the caller's error");
        assert_eq!(posts.load(Ordering::SeqCst), 1, "not sent again");
    }
}
