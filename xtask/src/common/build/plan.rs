//! Which `go build`s make the binaries a caller wants, in which order and with which flags.

use std::path::Path;

use super::{go::GoBuild, kind, versions::Versions};
use crate::common::kube_module::{KUBE_PACKAGE, KUBECTL_PACKAGE, SAMPLE_DEVICE_PLUGIN_PACKAGE};

/// The main package of the CNCF distribution registry, in the `registry` module.
pub(super) const REGISTRY_PACKAGE: &str = "github.com/distribution/distribution/v3/cmd/registry";

/// Which binaries a caller needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Everything `cluster up` runs, and kubectl.
    Cluster,
    /// kubectl only (`cargo xtask kubectl`).
    Kubectl,
    /// The registry only (`cluster up --registry`).
    Registry,
    /// Everything of [`Wanted::Cluster`] plus what a kind node image needs in addition: kubeadm,
    /// kube-proxy, CoreDNS, crictl and the CNI plugins.
    Kind,
}

/// The builds that make `wanted`, in the order that reuses Go's build cache best.
pub(super) fn plan(go: &Path, versions: &Versions, wanted: Wanted) -> Vec<GoBuild> {
    let strs = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // The Kubernetes builds run in the release's module, with the Go it needs.
    let kube_env: Vec<(&'static str, String)> =
        versions.kube.toolchain.iter().map(|t| ("GOTOOLCHAIN", t.clone())).collect();
    let kubectl = GoBuild {
        what: format!("build kubectl {} (cold: ~4 min on 2 cores)", versions.kubernetes),
        module: versions.kube.dir.clone(),
        env: kube_env.clone(),
        args: vec!["-ldflags".into(), versions.kube_ldflags(), KUBECTL_PACKAGE.into()],
        outputs: vec!["kubectl"],
        quiet: false,
    };
    match wanted {
        Wanted::Kubectl => return vec![kubectl],
        Wanted::Registry => {
            return vec![GoBuild {
                what: "build the CNCF distribution registry".into(),
                module: go.join("registry"),
                env: vec![("CGO_ENABLED", "0".into())],
                args: strs(&["-ldflags", "-s -w", REGISTRY_PACKAGE]),
                outputs: vec!["registry"],
                quiet: false,
            }];
        }
        Wanted::Cluster | Wanted::Kind => {}
    }
    let mut builds = vec![
        GoBuild {
            what: format!(
                "build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet {} and etcd {} (cold: ~9 min on 2 cores)",
                versions.kubernetes, versions.etcd
            ),
            module: versions.kube.dir.clone(),
            env: kube_env.clone(),
            args: vec!["-ldflags".into(), versions.kube_ldflags(), KUBE_PACKAGE.into()],
            outputs: vec!["kube"],
            quiet: false,
        },
        // Right after the multi-call binary, from the same module with cgo on (Go's default
        // there), so that every package it needs is in Go's build cache already: one compile and
        // one link. The linker's output is shown only on failure: on success it is just glibc's
        // warnings that a static binary cannot use NSS for user and host lookups, which the
        // plugin never makes.
        GoBuild {
            what: "build the sample device plugin (extended-resources spec)".into(),
            module: versions.kube.dir.clone(),
            env: [kube_env.as_slice(), &[("CGO_ENABLED", "1".into())]].concat(),
            args: strs(&["-ldflags", Versions::sample_device_plugin_ldflags(), SAMPLE_DEVICE_PLUGIN_PACKAGE]),
            outputs: vec!["sample-device-plugin"],
            quiet: true,
        },
        GoBuild {
            what: format!("build containerd {}, its runc shim and ctr", versions.containerd),
            module: go.join("containerd"),
            env: vec![("CGO_ENABLED", "0".into())],
            args: vec![
                "-ldflags".into(),
                versions.containerd_ldflags(),
                "github.com/containerd/containerd/v2/cmd/containerd".into(),
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2".into(),
                "github.com/containerd/containerd/v2/cmd/ctr".into(),
            ],
            outputs: vec!["containerd", "containerd-shim-runc-v2", "ctr"],
            quiet: false,
        },
        // runc at the version containerd v2.3's own CI uses; Debian's 1.1.5 predates containerd
        // 2.x and reports a failed container init without its cause. cgo for nsenter, libseccomp
        // for the RuntimeDefault seccomp profile.
        GoBuild {
            what: format!("build runc {} (with seccomp)", versions.runc),
            module: go.join("runc"),
            env: vec![("CGO_ENABLED", "1".into())],
            args: vec![
                "-tags".into(),
                "seccomp urfave_cli_no_docs".into(),
                "-ldflags".into(),
                format!("-s -w -X main.version={}", versions.runc.trim_start_matches('v')),
                "github.com/opencontainers/runc".into(),
            ],
            outputs: vec!["runc"],
            quiet: false,
        },
        GoBuild {
            what: "build the pause, hostpathplugin and dra-e2e-dial image binaries".into(),
            module: go.join("images"),
            env: vec![("CGO_ENABLED", "0".into())],
            args: strs(&["-ldflags", "-s -w", "./cmd/pause", "./cmd/hostpathplugin", "./cmd/dra-e2e-dial"]),
            outputs: vec!["pause", "hostpathplugin", "dra-e2e-dial"],
            quiet: false,
        },
    ];
    // kubectl from the same module and with the same version stamp, so `kubectl version` reports
    // the cluster's version: for `cargo xtask kubectl` (the pinned release's) and the kind node
    // image. Another release's local cluster runs without it (~4 min of a cold build saved).
    if wanted == Wanted::Kind || versions.kube.dir == *go {
        builds.insert(2, kubectl);
    }
    if wanted == Wanted::Kind {
        builds.extend(kind::plan(go, versions));
    }
    builds
}
