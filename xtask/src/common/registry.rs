//! The image registry both providers run (the CNCF distribution registry): its port per cluster
//! name, its configuration and the probe that says it serves.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use anyhow::{Context, Result};

/// The kind cluster name that gets port 5000 (kind's default).
pub const DEFAULT_CLUSTER_NAME: &str = "kind";

/// kubevirtci's port rule: 5000 for the default cluster name, 5001 for any other.
pub fn port_for(cluster_name: &str) -> u16 {
    if cluster_name == DEFAULT_CLUSTER_NAME { 5000 } else { 5001 }
}

/// The registry's configuration: filesystem storage under the state, deletes allowed (tests
/// clean up what they push), no background upload purging, listening on every address of its
/// namespace.
pub fn config(storage: &Path, port: u16) -> String {
    format!(
        "# Written by `cargo xtask cluster up --registry`.\nversion: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false\nhttp:\n  addr: 0.0.0.0:{port}\n",
        storage.display()
    )
}

/// The HTTP status of `GET /v2/` at `addr` (the registry API's version check).
pub fn v2_status(addr: SocketAddr) -> Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /v2/ HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head)?;
    let line = String::from_utf8_lossy(&head);
    line.get(9..12)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP answer: {line:?}"))
}
