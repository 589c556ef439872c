//! The kubeconfig's credentials, as far as the sentence for a refusal needs them: a client
//! certificate (and when it expires), a token, or none.

use std::time::SystemTime;

use rustls::pki_types::{CertificateDer, pem::PemObject as _};

/// How the kubeconfig's user proves who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Credentials {
    /// A client certificate, with its `notAfter` when it could be read.
    ClientCertificate {
        /// When it expires.
        expires: Option<SystemTime>,
    },
    /// A bearer token (given, from a file, or from an exec or auth provider plugin) or a
    /// password.
    Token,
    /// None the kubeconfig names (or unknown: a client built elsewhere).
    #[default]
    None,
}

impl Credentials {
    /// The credentials of `config`'s user.
    pub(crate) fn of(config: &kube::Config) -> Self {
        let auth = &config.auth_info;
        if auth.client_certificate_data.is_some() || auth.client_certificate.is_some() {
            return Credentials::ClientCertificate {
                expires: client_certificate(auth).and_then(|d| not_after(&d)),
            };
        }
        let token = auth.token.is_some()
            || auth.token_file.is_some()
            || auth.exec.is_some()
            || auth.auth_provider.is_some()
            || auth.password.is_some();
        if token { Credentials::Token } else { Credentials::None }
    }
}

/// The DER of the client certificate (the first one of its PEM), from the kubeconfig's data or
/// file.
fn client_certificate(auth: &kube::config::AuthInfo) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let pem = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?,
        (None, Some(path)) => std::fs::read(path).ok()?,
        (None, None) => return None,
    };
    CertificateDer::pem_slice_iter(&pem).next()?.ok().map(|der| der.to_vec())
}

/// The `notAfter` of an X.509 certificate in DER: `Certificate ::= SEQUENCE { tbsCertificate
/// SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer, validity SEQUENCE {
/// notBefore, notAfter }, ... }, ... }` (RFC 5280, 4.1).
pub(crate) fn not_after(der: &[u8]) -> Option<SystemTime> {
    let (certificate, _) = element(der, SEQUENCE)?;
    let (mut tbs, _) = element(certificate, SEQUENCE)?;
    if tbs.first() == Some(&VERSION) {
        tbs = element(tbs, VERSION)?.1;
    }
    let (_serial, rest) = element(tbs, INTEGER)?;
    let (_signature, rest) = element(rest, SEQUENCE)?;
    let (_issuer, rest) = element(rest, SEQUENCE)?;
    let (validity, _) = element(rest, SEQUENCE)?;
    let rest = skip(validity)?;
    let tag = *rest.first()?;
    let (time, _) = element(rest, tag)?;
    asn1_time(tag, std::str::from_utf8(time).ok()?)
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The contents of the DER element at the start of `input` if its tag is `tag`, and what follows it.
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count].iter().fold(0usize, |len, b| (len << 8) | usize::from(*b));
        (len, &rest[count..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// What follows the DER element at the start of `input`, whatever its tag.
fn skip(input: &[u8]) -> Option<&[u8]> {
    element(input, *input.first()?).map(|(_, rest)| rest)
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950 to 2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn asn1_time(tag: u8, text: &str) -> Option<SystemTime> {
    let digits = text.strip_suffix('Z')?;
    let (year, rest) = match tag {
        UTC_TIME => {
            let yy: i32 = digits.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, digits.get(2..)?)
        }
        GENERALIZED_TIME => (digits.get(..4)?.parse().ok()?, digits.get(4..)?),
        _ => return None,
    };
    let field = |i: usize| -> Option<u8> { rest.get(i..i + 2)?.parse().ok() };
    if rest.len() != 10 {
        return None;
    }
    let date =
        time::Date::from_calendar_date(year, time::Month::try_from(field(0)?).ok()?, field(2)?).ok()?;
    let clock = time::Time::from_hms(field(4)?, field(6)?, field(8)?).ok()?;
    Some(time::PrimitiveDateTime::new(date, clock).assume_utc().into())
}

/// `2026-01-31 12:00:00 UTC`.
pub(crate) fn display_time(at: SystemTime) -> String {
    let t = time::OffsetDateTime::from(at);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn certificate(not_after: (i32, u8, u8)) -> rcgen::Certificate {
        let mut params = rcgen::CertificateParams::new(vec!["admin".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        params.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap()
    }

    #[test]
    fn reads_the_expiry_of_a_certificate() {
        // rcgen writes UTCTime before 2050 and GeneralizedTime from 2050 on.
        for (date, shown) in
            [((2021, 3, 4), "2021-03-04 00:00:00 UTC"), ((2051, 12, 31), "2051-12-31 00:00:00 UTC")]
        {
            let der = certificate(date).der().to_vec();
            assert_eq!(not_after(&der).map(display_time).as_deref(), Some(shown));
        }
        assert_eq!(not_after(b"\x30\x03\x02\x01\x00"), None);
        assert_eq!(not_after(b""), None);
    }

    #[test]
    fn the_kubeconfig_says_which_credentials() {
        use base64::Engine as _;
        let mut config = kube::Config::new(http::Uri::from_static("https://127.0.0.1:6443"));
        assert_eq!(Credentials::of(&config), Credentials::None);
        config.auth_info.token = Some("t".to_owned().into());
        assert_eq!(Credentials::of(&config), Credentials::Token);
        let pem = certificate((2021, 3, 4)).pem();
        config.auth_info.client_certificate_data =
            Some(base64::engine::general_purpose::STANDARD.encode(pem.as_bytes()));
        let Credentials::ClientCertificate { expires: Some(expires) } = Credentials::of(&config) else {
            panic!("{:?}", Credentials::of(&config))
        };
        assert_eq!(display_time(expires), "2021-03-04 00:00:00 UTC");
    }
}
