//! What the protocol tests of the run's client share: a proxy that cuts connections, an API
//! server in memory, TLS servers and certificates.

pub mod cut_proxy;
pub mod fake_api;
pub mod tls;
