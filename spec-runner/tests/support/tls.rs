//! Certificates (rcgen), a TLS server on 127.0.0.1 that answers every request with one status
//! (as an API server refusing a client does) and counts the connections it accepted, and
//! kubeconfigs for it.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject as _};
use tokio_util::task::AbortOnDropHandle;

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
}

/// A certificate and its key, in PEM.
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// Its key.
    pub key: String,
}

impl Ca {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self { pem: cert.pem(), der: cert.der().clone(), issuer: Issuer::new(params, key) }
    }

    /// The CA certificate in PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A serving certificate for 127.0.0.1.
    pub fn server(&self) -> Pem {
        self.sign(CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap())
    }

    /// A client certificate of `user` that expires on `not_after` (year, month, day).
    pub fn client(&self, user: &str, not_after: (i32, u8, u8)) -> Pem {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, user);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Pem {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pem { cert: cert.pem(), key: key.serialize_pem() }
    }
}

/// A TLS server that answers every request with one status and a `Status` body; it stops when
/// dropped.
pub struct TlsServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    _task: AbortOnDropHandle<()>,
}

impl TlsServer {
    /// Serves with a certificate of `ca`, answering `status`. With `clients`, it asks for a client
    /// certificate and checks it against that CA in the handshake (as a TLS-terminating proxy
    /// does; the API server itself checks it later and answers 401).
    pub async fn start(ca: &Ca, clients: Option<&Ca>, status: u16) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match clients {
            Some(clients) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(clients.der.clone()).unwrap();
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .allow_unauthenticated()
                        .build()
                        .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let serving = ca.server();
        let chain =
            CertificateDer::pem_slice_iter(serving.cert.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
        let key = PrivatePkcs8KeyDer::from_pem_slice(serving.key.as_bytes()).unwrap();
        let config = builder.with_single_cert(chain, PrivateKeyDer::Pkcs8(key)).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            let mut served = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                served.spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let service = hyper::service::service_fn(move |_request| async move { answer(status) });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Self { addr, connections, _task: AbortOnDropHandle::new(task) }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The TCP connections it accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn answer(status: u16) -> Result<http::Response<http_body_util::Full<bytes::Bytes>>, http::Error> {
    let (reason, message) = match status {
        401 => ("Unauthorized", "Unauthorized".to_owned()),
        403 => {
            ("Forbidden", "nodes is forbidden: User \"someone\" cannot list resource \"nodes\"".to_owned())
        }
        _ => ("", String::new()),
    };
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": status});
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
}

/// How a kubeconfig's user proves who it is.
pub enum User<'a> {
    /// A bearer token.
    Token(&'a str),
    /// A client certificate.
    Certificate(&'a Pem),
}

/// Writes a kubeconfig of `server` trusting `ca_pem`, with `user`, into `dir`.
pub fn kubeconfig(dir: &Path, server: &str, ca_pem: &str, user: &User<'_>) -> PathBuf {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
    let user = match user {
        User::Token(token) => format!("token: {token}"),
        User::Certificate(pem) => {
            format!("client-certificate-data: {}\n    client-key-data: {}", b64(&pem.cert), b64(&pem.key))
        }
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    {user}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        b64(ca_pem)
    );
    let path = dir.join("tls.kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}
