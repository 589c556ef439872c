//! An HTTP proxy on 127.0.0.1 in front of an API server (any `kube::Client`: a real cluster's
//! admin client, an in-memory fake) that breaks its client's connection in the middle of a
//! chosen request: before forwarding it (the API server never sees it), or after the API server
//! answered it (the API server did it; its answer is dropped). The connection is closed without
//! an answer, as when the API server is killed. The client reaches it over plain HTTP with a
//! kubeconfig of no credentials ([`CutProxy::kubeconfig`]); the upstream client adds its own.
//! Shared by spec-runner's protocol tests and harness's cluster tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http::{Method, header};
use http_body_util::BodyExt as _;
use tokio_util::task::AbortOnDropHandle;

/// Where a request's connection is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Before the request is forwarded: the API server never sees it.
    BeforeForwarding,
    /// After the API server answered it: it was done, the answer never arrives.
    AfterForwarding,
}

/// The proxy; it stops when dropped.
pub struct CutProxy {
    addr: SocketAddr,
    state: Arc<State>,
    _task: AbortOnDropHandle<()>,
}

struct State {
    upstream: kube::Client,
    /// The cuts to make, each at the next request of its method.
    cuts: Mutex<Vec<(Method, Cut)>>,
    /// `METHOD path?query` of each request forwarded, in order.
    forwarded: Mutex<Vec<String>>,
    /// `METHOD path?query` and the cut of each request whose connection was cut.
    cut: Mutex<Vec<(String, Cut)>>,
}

impl CutProxy {
    /// Starts a proxy to `upstream` on a free port of 127.0.0.1.
    pub async fn start(upstream: kube::Client) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            cuts: Mutex::default(),
            forwarded: Mutex::default(),
            cut: Mutex::default(),
        });
        let serving = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let state = Arc::clone(&serving);
                let service = hyper::service::service_fn(move |request| Arc::clone(&state).handle(request));
                let io = hyper_util::rt::TokioIo::new(stream);
                connections.spawn(async move {
                    // An error is a cut connection: the socket is closed without an answer.
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Self { addr, state, _task: AbortOnDropHandle::new(task) }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig of the proxy (no credentials) into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("cut-proxy.kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: {}\nusers:\n- name: none\n  user: {{}}\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: none\ncurrent-context: proxy\n",
            self.url()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Cuts the connection of the next `method` request at `cut` (once).
    pub fn cut_next(&self, method: Method, cut: Cut) {
        self.state.cuts.lock().unwrap().push((method, cut));
    }

    /// The requests of `method` forwarded so far, as `path?query`.
    pub fn forwarded(&self, method: &Method) -> Vec<String> {
        let prefix = format!("{method} ");
        let forwarded = self.state.forwarded.lock().unwrap();
        forwarded.iter().filter_map(|r| r.strip_prefix(&prefix)).map(str::to_owned).collect()
    }

    /// The requests whose connection was cut, as `METHOD path?query`, and where.
    pub fn cut(&self) -> Vec<(String, Cut)> {
        self.state.cut.lock().unwrap().clone()
    }
}

impl State {
    async fn handle(
        self: Arc<Self>,
        request: http::Request<hyper::body::Incoming>,
    ) -> Result<http::Response<kube::client::Body>, Box<dyn std::error::Error + Send + Sync>> {
        let (mut parts, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let what = format!("{} {}", parts.method, parts.uri.path_and_query().map_or("/", |p| p.as_str()));
        let cut = {
            let mut cuts = self.cuts.lock().unwrap();
            let next = cuts.iter().position(|(method, _)| *method == parts.method);
            next.map(|i| cuts.remove(i).1)
        };
        if cut == Some(Cut::BeforeForwarding) {
            self.cut.lock().unwrap().push((what, Cut::BeforeForwarding));
            return Err("cut before forwarding".into());
        }
        for hop in [header::HOST, header::CONNECTION, header::TRANSFER_ENCODING, header::CONTENT_LENGTH] {
            parts.headers.remove(hop);
        }
        parts.uri = parts.uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
        let forward = http::Request::from_parts(parts, kube::client::Body::from(body.to_vec()));
        let answer = self.upstream.send(forward).await?;
        self.forwarded.lock().unwrap().push(what.clone());
        if cut == Some(Cut::AfterForwarding) {
            // The whole answer was read: the API server is done with the request.
            let _: Bytes = answer.into_body().collect().await?.to_bytes();
            self.cut.lock().unwrap().push((what, Cut::AfterForwarding));
            return Err("cut after forwarding".into());
        }
        let (mut parts, body) = answer.into_parts();
        parts.headers.remove(header::TRANSFER_ENCODING);
        parts.headers.remove(header::CONNECTION);
        Ok(http::Response::from_parts(parts, body))
    }
}
