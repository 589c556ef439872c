//! What a failed request's error says about its connection to the API server: never sent (no
//! connection could be made), its answer lost (the connection broke after the request went out,
//! or may have), or refused by TLS (a certificate problem: never transient, never sent again).

use std::error::Error as StdError;

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection was made: the API server never saw the request.
    NotSent,
    /// The connection broke after the request was (or may have been) sent: it may have been done.
    AnswerLost,
    /// TLS refused the connection: sending it again cannot help.
    Tls(TlsProblem),
    /// Not a failure of the connection (the request could not be built, credentials could not be
    /// loaded): the caller's.
    Other,
}

/// A TLS failure, in the terms of what to fix; each with what TLS said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TlsProblem {
    /// The server's certificate is not trusted: what is wrong with it.
    ServerNotTrusted {
        /// What is wrong with it, as the end of "its certificate ...".
        reason: &'static str,
        /// What TLS said.
        detail: String,
    },
    /// The server refused the client certificate during the handshake (a TLS alert).
    ClientCertificateRefused {
        /// What TLS said.
        detail: String,
    },
    /// Any other TLS error (no common protocol version, say).
    Other {
        /// What TLS said.
        detail: String,
    },
}

/// What `error` says about the request's connection.
pub(crate) fn failure(error: &(dyn StdError + 'static)) -> Failure {
    let mut transport = false;
    let mut connect = false;
    for e in chain(error) {
        if let Some(tls) = rustls_error(e) {
            return Failure::Tls(tls_problem(tls));
        }
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            transport = true;
            connect |= e.is_connect();
        }
        transport |= e.is::<hyper::Error>() || e.is::<std::io::Error>();
    }
    match (connect, transport) {
        (true, _) => Failure::NotSent,
        (false, true) => Failure::AnswerLost,
        (false, false) => Failure::Other,
    }
}

/// `error` and its sources, outermost first.
fn chain<'a>(error: &'a (dyn StdError + 'static)) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |e: &&'a (dyn StdError + 'static)| (*e).source())
}

/// The rustls error `error` is or carries. An `io::Error` hides the error it wraps from
/// `source()` (it gives that error's source), so it is looked into, as deep as it nests
/// (hyper-rustls' connector wraps the `io::Error` of tokio-rustls in another).
fn rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut current = error;
    loop {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner = current.downcast_ref::<std::io::Error>()?.get_ref()?;
        current = inner;
    }
}

fn tls_problem(error: &rustls::Error) -> TlsProblem {
    use rustls::{AlertDescription as Alert, CertificateError as Cert};
    let detail = error.to_string();
    match error {
        rustls::Error::InvalidCertificate(cert) => TlsProblem::ServerNotTrusted {
            reason: match cert {
                Cert::UnknownIssuer | Cert::BadSignature => {
                    "its certificate was not signed by the kubeconfig's certificate authority"
                }
                Cert::NotValidForName | Cert::NotValidForNameContext { .. } => {
                    "its certificate is not valid for the host of the kubeconfig's server address"
                }
                Cert::Expired | Cert::ExpiredContext { .. } => "its certificate has expired",
                Cert::NotValidYet | Cert::NotValidYetContext { .. } => "its certificate is not valid yet",
                _ => "its certificate is not valid",
            },
            detail,
        },
        rustls::Error::AlertReceived(
            Alert::BadCertificate
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::CertificateUnknown
            | Alert::CertificateRequired
            | Alert::UnknownCA
            | Alert::UnsupportedCertificate
            | Alert::AccessDenied,
        ) => TlsProblem::ClientCertificateRefused { detail },
        _ => TlsProblem::Other { detail },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    /// An error as hyper-rustls' connector gives it: the rustls error in an `io::Error` in
    /// another.
    fn wrapped(error: rustls::Error) -> kube::Error {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, error);
        kube::Error::Service(Box::new(std::io::Error::other(io)))
    }

    #[test]
    fn tls_errors_are_found_inside_io_errors() {
        let unknown = wrapped(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer));
        assert_eq!(
            failure(&unknown),
            Failure::Tls(TlsProblem::ServerNotTrusted {
                reason: "its certificate was not signed by the kubeconfig's certificate authority",
                detail: "invalid peer certificate: UnknownIssuer".into(),
            })
        );
        let alert = wrapped(rustls::Error::AlertReceived(rustls::AlertDescription::CertificateExpired));
        assert_eq!(
            failure(&alert),
            Failure::Tls(TlsProblem::ClientCertificateRefused {
                detail: "received fatal alert: CertificateExpired".into()
            })
        );
        let version =
            wrapped(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::ServerDoesNotSupportTls12Or13));
        assert!(matches!(failure(&version), Failure::Tls(TlsProblem::Other { .. })));
    }

    #[test]
    fn a_broken_connection_is_an_answer_lost_and_other_errors_are_the_callers() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert_eq!(failure(&kube::Error::Service(Box::new(reset))), Failure::AnswerLost);
        assert_eq!(failure(&kube::Error::LinesCodecMaxLineLengthExceeded), Failure::Other);
    }
}
