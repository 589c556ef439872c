//! Bad input is refused at once, in one sentence that says what to fix: a kubeconfig whose
//! server does not listen, whose certificate authority is not the server's, whose client
//! certificate expired or is not the cluster's, whose token is refused, whose user is forbidden.
//! Real TLS servers in-process ([`support::tls`]); the run's client is built as a run builds it
//! (`KubeBackend::connect`), and preflight says what is wrong. None of these is sent again: the
//! run's client waits up to 60 s for an API server that went away, so each bound below (30 s)
//! would be overrun by a resending client.
#![allow(clippy::unwrap_used)]

mod support;

use std::{path::Path, time::Duration};

use spec_runner::{ClusterBackend as _, KubeBackend, PreflightError};
use support::tls::{Ca, TlsServer, User, kubeconfig};

/// Far less than the run's client waits for an API server that went away (60 s).
const BOUND: Duration = Duration::from_secs(30);

/// [`refused`] for a kubeconfig of `server` trusting `ca_pem`, with `user`.
async fn refused_by(server: &str, ca_pem: &str, user: &User<'_>) -> PreflightError {
    let dir = tempfile::tempdir().unwrap();
    refused(&kubeconfig(dir.path(), server, ca_pem, user)).await
}

/// Preflight through a backend of `kubeconfig`, and the same first request through the run's
/// client: both refused within [`BOUND`]; preflight's error.
async fn refused(kubeconfig: &Path) -> PreflightError {
    let backend = KubeBackend::connect(Some(kubeconfig)).await.unwrap();
    let first = tokio::time::timeout(BOUND, backend.client().apiserver_version()).await;
    first.expect("the run's client refused at once").expect_err("refused");
    let error = tokio::time::timeout(BOUND, backend.preflight()).await.expect("preflight refused at once");
    error.expect_err("refused")
}

#[tokio::test]
async fn a_server_that_does_not_listen() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ca = Ca::new("ca");
    let error = refused_by(&format!("https://127.0.0.1:{port}"), ca.pem(), &User::Token("t")).await;
    assert!(matches!(error, PreflightError::Unreachable { .. }), "{error}");
    assert!(error.to_string().contains("Connection refused"), "{error}");
}

#[tokio::test]
async fn a_server_whose_certificate_another_ca_signed() {
    let server = TlsServer::start(&Ca::new("the server's"), None, 200).await;
    let error = refused_by(&server.url(), Ca::new("another").pem(), &User::Token("t")).await;
    assert!(matches!(error, PreflightError::ServerNotTrusted { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains(
            "is not trusted: its certificate was not signed by the kubeconfig's certificate authority"
        ),
        "{text}"
    );
    assert!(text.contains("certificate-authority-data"), "says what to fix: {text}");
    assert_eq!(server.connections(), 2, "one handshake each for the run's client and preflight");
}

#[tokio::test]
async fn an_expired_client_certificate_refused_with_401() {
    let ca = Ca::new("ca");
    let server = TlsServer::start(&ca, None, 401).await;
    let expired = ca.client("admin", (2021, 3, 4));
    let error = refused_by(&server.url(), ca.pem(), &User::Certificate(&expired)).await;
    assert!(matches!(error, PreflightError::ClientCertificateExpired { .. }), "{error}");
    assert!(
        error
            .to_string()
            .starts_with("the kubeconfig's client certificate expired on 2021-03-04 00:00:00 UTC"),
        "{error}"
    );
}

#[tokio::test]
async fn an_expired_client_certificate_refused_in_the_handshake() {
    let ca = Ca::new("ca");
    let server = TlsServer::start(&ca, Some(&ca), 200).await;
    let expired = ca.client("admin", (2021, 3, 4));
    let error = refused_by(&server.url(), ca.pem(), &User::Certificate(&expired)).await;
    assert!(matches!(error, PreflightError::ClientCertificateExpired { .. }), "{error}");
    assert!(error.to_string().contains("CertificateExpired"), "{error}");
}

#[tokio::test]
async fn a_client_certificate_of_another_ca() {
    let ca = Ca::new("ca");
    let server = TlsServer::start(&ca, None, 401).await;
    let theirs = Ca::new("another").client("admin", (2090, 1, 1));
    let error = refused_by(&server.url(), ca.pem(), &User::Certificate(&theirs)).await;
    assert!(matches!(error, PreflightError::ClientCertificateRefused { .. }), "{error}");
    assert!(error.to_string().contains("not issued by this cluster's client CA"), "{error}");
}

#[tokio::test]
async fn a_token_refused_with_401() {
    let ca = Ca::new("ca");
    let server = TlsServer::start(&ca, None, 401).await;
    let error = refused_by(&server.url(), ca.pem(), &User::Token("stale")).await;
    assert!(matches!(error, PreflightError::TokenRefused { .. }), "{error}");
    assert!(error.to_string().contains("refused the kubeconfig's token (401 Unauthorized)"), "{error}");
}

#[tokio::test]
async fn a_user_forbidden_with_403() {
    let ca = Ca::new("ca");
    let server = TlsServer::start(&ca, None, 403).await;
    let error = refused_by(&server.url(), ca.pem(), &User::Token("viewer")).await;
    assert!(matches!(error, PreflightError::Forbidden { .. }), "{error}");
    assert!(error.to_string().contains("use an admin kubeconfig (a user bound to cluster-admin)"), "{error}");
}
