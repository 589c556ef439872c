//! What `cluster build --provider kind` builds beyond the local cluster's binaries
//! ([`super::Wanted::Kind`]).

use std::path::Path;

use super::{go::GoBuild, versions::Versions};
use crate::common::kube_module::{KUBE_PROXY_PACKAGE, KUBEADM_PACKAGE};

/// The CNI plugins the kind node image carries (`xtask/local-cluster/kind`).
pub const CNI_PLUGINS: [&str; 5] = ["bridge", "host-local", "loopback", "portmap", "ptp"];

/// What a kind node image needs beyond the local cluster's binaries: kubeadm and kube-proxy from
/// the pinned Kubernetes module (same version stamp), CoreDNS, crictl and the CNI plugins from
/// their own module (`xtask/local-cluster/kind`, whose go.mod pins the versions).
pub(super) fn plan(go: &Path, versions: &Versions) -> Vec<GoBuild> {
    let mut cni: Vec<String> = vec!["-ldflags".into(), "-s -w".into()];
    cni.extend(CNI_PLUGINS.iter().map(|p| {
        let kind = match *p {
            "host-local" => "ipam",
            "portmap" => "meta",
            _ => "main",
        };
        format!("github.com/containernetworking/plugins/plugins/{kind}/{p}")
    }));
    vec![
        GoBuild {
            what: format!("build kubeadm and kube-proxy {} (kind node image)", versions.kubernetes),
            module: versions.kube.dir.clone(),
            env: versions.kube.toolchain.iter().map(|t| ("GOTOOLCHAIN", t.clone())).collect(),
            args: vec![
                "-ldflags".into(),
                versions.kube_ldflags(),
                KUBEADM_PACKAGE.into(),
                KUBE_PROXY_PACKAGE.into(),
            ],
            outputs: vec!["kubeadm", "kube-proxy"],
            quiet: false,
        },
        GoBuild {
            what: "build CoreDNS and crictl (kind node image; cold: ~5 min on 2 cores)".into(),
            module: go.join("kind"),
            env: vec![("CGO_ENABLED", "0".into())],
            args: vec![
                "-ldflags".into(),
                "-s -w".into(),
                "github.com/coredns/coredns".into(),
                "sigs.k8s.io/cri-tools/cmd/crictl".into(),
            ],
            outputs: vec!["coredns", "crictl"],
            quiet: false,
        },
        GoBuild {
            what: "build the CNI plugins (kind node image)".into(),
            module: go.join("kind"),
            env: vec![("CGO_ENABLED", "0".into())],
            args: cni,
            outputs: CNI_PLUGINS.to_vec(),
            quiet: false,
        },
    ]
}
