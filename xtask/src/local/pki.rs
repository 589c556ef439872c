//! The cluster's PKI, generated in Rust (rcgen): a server CA for the apiserver's and kubelet's
//! serving certificates, a client CA for every component's client certificate, a request-header CA
//! for the aggregation proxy, and the service-account signing key; plus a kubeconfig per client.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};

use super::nodes::{self, NodeSpec};

use crate::common::layout::{Layout, ports};

/// A client identity: the file stem of its certificate and kubeconfig, its user name (CN) and groups (O).
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    /// File stem under pki/ and config/.
    pub file: &'static str,
    /// The user name.
    pub user: &'static str,
    /// The groups.
    pub groups: &'static [&'static str],
}

/// The cluster administrator (system:masters), whose kubeconfig users and tests get.
pub const ADMIN: Identity = Identity { file: "admin", user: "system:admin", groups: &["system:masters"] };
/// kube-controller-manager.
pub const CONTROLLER_MANAGER: Identity =
    Identity { file: "controller-manager", user: "system:kube-controller-manager", groups: &[] };
/// kube-scheduler.
pub const SCHEDULER: Identity = Identity { file: "scheduler", user: "system:kube-scheduler", groups: &[] };
/// The apiserver's identity towards kubelets (exec, port-forward, logs).
pub const APISERVER_KUBELET_CLIENT: Identity =
    Identity { file: "apiserver-kubelet-client", user: "kube-apiserver", groups: &[] };

/// Paths of the generated files.
#[derive(Debug, Clone)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// The PKI of a layout (files may not exist yet).
    pub fn new(layout: &Layout) -> Self {
        Self { dir: layout.pki() }
    }
    /// A file in the PKI directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    /// Server CA certificate (trust anchor for the apiserver and kubelet serving certificates).
    pub fn server_ca(&self) -> PathBuf {
        self.file("server-ca.crt")
    }
    /// Client CA certificate (trust anchor for client certificates).
    pub fn client_ca(&self) -> PathBuf {
        self.file("client-ca.crt")
    }
    /// Certificate of an identity.
    pub fn cert(&self, id: Identity) -> PathBuf {
        self.file(&format!("{}.crt", id.file))
    }
    /// Key of an identity.
    pub fn key(&self, id: Identity) -> PathBuf {
        self.file(&format!("{}.key", id.file))
    }
    /// The serving certificate of a node's kubelet (SANs: node name and IP).
    pub fn kubelet_serving_cert(&self, node: &str) -> PathBuf {
        self.file(&format!("kubelet-serving-{node}.crt"))
    }
    /// The key of [`Pki::kubelet_serving_cert`].
    pub fn kubelet_serving_key(&self, node: &str) -> PathBuf {
        self.file(&format!("kubelet-serving-{node}.key"))
    }
}

/// Generates the whole PKI and the kubeconfigs unless they exist already (so a running cluster keeps
/// its certificates when `up` runs again): one client and one serving certificate per node, each
/// node's kubelet as `system:node:<name>` (the Node authorizer's identity), reaching the apiserver
/// on the control-plane node IP.
pub fn ensure(layout: &Layout, nodes: &[NodeSpec]) -> Result<Pki> {
    let pki = Pki::new(layout);
    if pki.server_ca().is_file() && layout.kubeconfig().is_file() {
        return Ok(pki);
    }
    fs::create_dir_all(layout.pki())?;
    fs::create_dir_all(layout.config())?;

    let server_ca = new_ca("dra-e2e-server-ca")?;
    let client_ca = new_ca("dra-e2e-client-ca")?;
    let proxy_ca = new_ca("dra-e2e-request-header-ca")?;
    server_ca.write(&pki, "server-ca")?;
    client_ca.write(&pki, "client-ca")?;
    proxy_ca.write(&pki, "request-header-ca")?;

    let apiserver_sans = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
        "127.0.0.1",
        "10.0.0.1",
    ];
    let cp_ip = nodes::control_plane_ip().to_string();
    let apiserver_sans: Vec<&str> = apiserver_sans.into_iter().chain([cp_ip.as_str()]).collect();
    server_ca.issue_serving("kube-apiserver", &apiserver_sans)?.write(&pki, "apiserver")?;
    for id in [ADMIN, CONTROLLER_MANAGER, SCHEDULER, APISERVER_KUBELET_CLIENT] {
        client_ca.issue_client(id.user, id.groups)?.write(&pki, id.file)?;
    }
    let ca_pem = fs::read_to_string(pki.server_ca())?;
    let node_server = format!("https://{cp_ip}:{}", ports::APISERVER);
    for node in nodes {
        let ip = node.ip.to_string();
        let serving = server_ca.issue_serving(&node.name, &[node.name.as_str(), ip.as_str()])?;
        serving.write(&pki, &format!("kubelet-serving-{}", node.name))?;
        let client = client_ca.issue_client(&format!("system:node:{}", node.name), &["system:nodes"])?;
        let text = kubeconfig(&node_server, &ca_pem, &client.cert_pem, &client.key_pem, "kubelet");
        write_private(&node_kubeconfig_path(layout, &node.name), &text)?;
    }
    proxy_ca.issue_client("system:auth-proxy", &[])?.write(&pki, "auth-proxy")?;

    let sa = KeyPair::generate().context("generate the service-account key")?;
    write_private(&pki.file("sa.key"), &sa.serialize_pem())?;
    fs::write(pki.file("sa.pub"), sa.public_key_pem())?;

    // The controller manager and scheduler run in the control-plane node's network namespace and
    // the admin reaches the apiserver through the host's forwarder: both on 127.0.0.1.
    let server = format!("https://127.0.0.1:{}", ports::APISERVER);
    for id in [ADMIN, CONTROLLER_MANAGER, SCHEDULER] {
        let text = kubeconfig(
            &server,
            &ca_pem,
            &fs::read_to_string(pki.cert(id))?,
            &fs::read_to_string(pki.key(id))?,
            id.file,
        );
        write_private(&kubeconfig_path(layout, id), &text)?;
    }
    // The admin kubeconfig is the one users get: keep a copy at the well-known path.
    fs::copy(kubeconfig_path(layout, ADMIN), layout.kubeconfig())?;
    Ok(pki)
}

/// The kubeconfig of a node's kubelet.
pub fn node_kubeconfig_path(layout: &Layout, node: &str) -> PathBuf {
    layout.config().join(format!("kubelet-{node}.kubeconfig"))
}

/// The kubeconfig of a component identity.
pub fn kubeconfig_path(layout: &Layout, id: Identity) -> PathBuf {
    layout.config().join(format!("{}.kubeconfig", id.file))
}

/// A certificate and its key, both PEM.
struct Issued {
    cert_pem: String,
    key_pem: String,
}

impl Issued {
    fn write(&self, pki: &Pki, stem: &str) -> Result<()> {
        fs::write(pki.file(&format!("{stem}.crt")), &self.cert_pem)?;
        write_private(&pki.file(&format!("{stem}.key")), &self.key_pem)
    }
}

/// A CA that can issue certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    issued: Issued,
}

fn new_ca(name: &str) -> Result<Ca> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = dn(name, &[]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key).with_context(|| format!("self-sign {name}"))?;
    let issued = Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
    Ok(Ca { issuer: Issuer::new(params, key), issued })
}

impl Ca {
    fn write(&self, pki: &Pki, stem: &str) -> Result<()> {
        self.issued.write(pki, stem)
    }

    fn issue(&self, mut params: CertificateParams) -> Result<Issued> {
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    fn issue_serving(&self, cn: &str, sans: &[&str]) -> Result<Issued> {
        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = dn(cn, &[]);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    fn issue_client(&self, cn: &str, groups: &[&str]) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = dn(cn, groups);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }
}

fn dn(cn: &str, groups: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for group in groups {
        dn.push(DnType::OrganizationName, *group);
    }
    dn.push(DnType::CommonName, cn);
    dn
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// A kubeconfig with embedded credentials.
pub fn kubeconfig(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str, user: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: dra-e2e-local
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: dra-e2e-local
  context:
    cluster: dra-e2e-local
    user: {user}
current-context: dra-e2e-local
",
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_complete_pki_once() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            repo: crate::repo::repo_root(),
            cache: dir.path().join("cache"),
            state: dir.path().join("state"),
            run: dir.path().join("run"),
        };
        let pki = ensure(&layout, &nodes::cluster_nodes(2)).unwrap();
        for f in [
            "server-ca.crt",
            "client-ca.crt",
            "apiserver.crt",
            "apiserver.key",
            "kubelet-serving-kind-worker.crt",
            "sa.key",
            "sa.pub",
            "auth-proxy.crt",
        ] {
            assert!(pki.file(f).is_file(), "{f}");
        }
        let mode = fs::metadata(pki.file("sa.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "keys are private");
        let admin = fs::read_to_string(layout.kubeconfig()).unwrap();
        assert!(admin.contains("server: https://127.0.0.1:6443"));
        let ca_before = fs::read(pki.server_ca()).unwrap();
        let kubelet = fs::read_to_string(node_kubeconfig_path(&layout, "kind-worker")).unwrap();
        assert!(kubelet.contains("server: https://10.89.0.2:6443"), "{kubelet}");
        ensure(&layout, &nodes::cluster_nodes(2)).unwrap();
        assert_eq!(ca_before, fs::read(pki.server_ca()).unwrap(), "a second ensure keeps the PKI");
    }
}
