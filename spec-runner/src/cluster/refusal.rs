//! Why the cluster refuses a run, in one sentence that says what to fix: a server certificate
//! the kubeconfig does not trust, a client certificate that expired or is not the cluster's, a
//! token refused (`401`), a user forbidden (`403`), an API server that cannot be reached.

use std::{error::Error as StdError, time::SystemTime};

use crate::cluster::{
    credentials::{self, Credentials},
    preflight::PreflightError,
    transport::{self, Failure, TlsProblem},
};

/// What `error`, met talking to the API server at `server` with `credentials`, means for the run.
pub(crate) fn refusal(server: &str, credentials: Credentials, error: kube::Error) -> PreflightError {
    let server = server.to_owned();
    if let Failure::Tls(problem) = transport::failure(&error) {
        return match problem {
            TlsProblem::ServerNotTrusted { reason, detail } => {
                PreflightError::ServerNotTrusted { server, reason: reason.to_owned(), detail }
            }
            TlsProblem::ClientCertificateRefused { detail } => {
                client_certificate_refused(server, credentials, format!("the TLS handshake failed: {detail}"))
            }
            TlsProblem::Other { detail } => {
                PreflightError::Other { server, reason: format!("the TLS handshake failed: {detail}") }
            }
        };
    }
    match error {
        kube::Error::Api(status) if status.code == 401 => {
            let reason = format!("401 {}", status.message);
            match credentials {
                Credentials::ClientCertificate { .. } => {
                    client_certificate_refused(server, credentials, reason)
                }
                Credentials::Token => PreflightError::TokenRefused { server, reason },
                Credentials::None => PreflightError::Unauthorized { server, reason },
            }
        }
        kube::Error::Api(status) if status.code == 403 => {
            PreflightError::Forbidden { server, reason: format!("403 {}", status.message) }
        }
        e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => {
            PreflightError::Unreachable { server, reason: root_cause(&e) }
        }
        e => PreflightError::Other { server, reason: root_cause(&e) },
    }
}

/// The API server refused the kubeconfig's client certificate: expired, or not its CA's.
fn client_certificate_refused(server: String, credentials: Credentials, reason: String) -> PreflightError {
    match credentials {
        Credentials::ClientCertificate { expires: Some(expires) } if expires <= SystemTime::now() => {
            PreflightError::ClientCertificateExpired {
                server,
                expired: credentials::display_time(expires),
                reason,
            }
        }
        Credentials::ClientCertificate { .. } => PreflightError::ClientCertificateRefused { server, reason },
        Credentials::Token | Credentials::None => PreflightError::Unauthorized {
            server,
            reason: format!("{reason}; it asks for a client certificate, and the kubeconfig has none"),
        },
    }
}

/// The innermost cause of an error (the most specific message: "Connection refused (os error 111)").
pub(crate) fn root_cause(error: &(dyn StdError + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("Unauthorized", "Unauthorized").with_code(code).boxed())
    }

    #[test]
    fn a_401_is_named_by_the_credentials_it_refused() {
        let expired = Credentials::ClientCertificate { expires: Some(SystemTime::UNIX_EPOCH) };
        let valid = Credentials::ClientCertificate { expires: None };
        let server = "https://127.0.0.1:6443/";
        assert!(matches!(
            refusal(server, expired, status(401)),
            PreflightError::ClientCertificateExpired { .. }
        ));
        assert!(matches!(
            refusal(server, valid, status(401)),
            PreflightError::ClientCertificateRefused { .. }
        ));
        assert!(matches!(
            refusal(server, Credentials::Token, status(401)),
            PreflightError::TokenRefused { .. }
        ));
        assert!(matches!(
            refusal(server, Credentials::None, status(401)),
            PreflightError::Unauthorized { .. }
        ));
        assert!(matches!(refusal(server, Credentials::Token, status(403)), PreflightError::Forbidden { .. }));
    }
}
