//! Builds the cluster's binaries from the Go modules in `xtask/local-cluster`, once per set of pinned
//! versions: the outputs live in the cache under a key hashed from the Go version, the modules'
//! go.mod/go.sum, our own Go sources and the build flags, so a warm `cluster up` builds nothing.
//! Each `go build` runs only when one of its outputs is missing, so `cargo xtask kubectl` builds
//! only kubectl and `cluster up --registry` only adds the registry to a complete build.
//!
//! Here: the [`Binaries`] of a build and [`ensure_wanted`], which makes them. Its parts:
//! [`versions`] (what a build makes, and the flags that stamp the versions), [`go`] (the Go
//! toolchain and what one `go build` is), [`plan`](mod@plan) (which builds make what a caller
//! wants), [`kind`] (what the kind node image adds), [`cache_key`](mod@cache_key), [`lock`] and
//! [`prune`](mod@prune).

mod cache_key;
mod go;
mod kind;
mod lock;
mod plan;
mod prune;
mod versions;

use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail};

pub(crate) use self::go::{go_build, go_build_quiet, go_version, path_str};
use self::{cache_key::cache_key, go::GoBuild, plan::plan};
pub use self::{
    plan::Wanted,
    prune::prune,
    versions::{Versions, kube_ldflags},
};
use crate::common::layout::Layout;
use crate::progress::Step;

/// The binaries of one build.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The directory holding them.
    pub dir: PathBuf,
}

impl Binaries {
    /// The multi-call binary: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet.
    pub fn kube(&self) -> PathBuf {
        self.dir.join("kube")
    }
    /// The containerd daemon.
    pub fn containerd(&self) -> PathBuf {
        self.dir.join("containerd")
    }
    /// containerd's CLI.
    pub fn ctr(&self) -> PathBuf {
        self.dir.join("ctr")
    }
    /// runc, with seccomp.
    pub fn runc(&self) -> PathBuf {
        self.dir.join("runc")
    }
    /// The static pause binary for the sandbox image.
    pub fn pause(&self) -> PathBuf {
        self.dir.join("pause")
    }
    /// The static hostpathplugin (proxy mode) for the DRA proxy image.
    pub fn hostpathplugin(&self) -> PathBuf {
        self.dir.join("hostpathplugin")
    }
    /// The static dra-e2e-dial (splices stdin/stdout with a Unix socket) for the DRA proxy image.
    pub fn dra_e2e_dial(&self) -> PathBuf {
        self.dir.join("dra-e2e-dial")
    }
    /// Upstream's sample device plugin (`k8s.io/kubernetes/test/images/sample-device-plugin`),
    /// static, for the image of the extended-resources spec.
    pub fn sample_device_plugin(&self) -> PathBuf {
        self.dir.join("sample-device-plugin")
    }
    /// kubectl of the pinned Kubernetes version (`k8s.io/kubernetes/cmd/kubectl`).
    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }
    /// The CNCF distribution registry (`cluster up --registry`).
    pub fn registry(&self) -> PathBuf {
        self.dir.join("registry")
    }
    /// kubeadm of the pinned Kubernetes version (kind node image).
    pub fn kubeadm(&self) -> PathBuf {
        self.dir.join("kubeadm")
    }
    /// kube-proxy of the pinned Kubernetes version (kind node image).
    pub fn kube_proxy(&self) -> PathBuf {
        self.dir.join("kube-proxy")
    }
    /// CoreDNS at the version kubeadm deploys (kind node image).
    pub fn coredns(&self) -> PathBuf {
        self.dir.join("coredns")
    }
    /// crictl (kind node image).
    pub fn crictl(&self) -> PathBuf {
        self.dir.join("crictl")
    }
    /// The CNI plugins of the kind node image, as (name, path).
    pub fn cni_plugins(&self) -> Vec<(&'static str, PathBuf)> {
        kind::CNI_PLUGINS.iter().map(|p| (*p, self.dir.join(p))).collect()
    }
    /// Every file `cluster up` needs (the registry is built only when asked for).
    #[cfg(test)]
    fn all(&self) -> Vec<PathBuf> {
        vec![
            self.kube(),
            self.kubectl(),
            self.containerd(),
            self.dir.join("containerd-shim-runc-v2"),
            self.ctr(),
            self.runc(),
            self.pause(),
            self.hostpathplugin(),
            self.dra_e2e_dial(),
            self.sample_device_plugin(),
        ]
    }
}

/// Builds whatever `cluster up` needs and the cache lacks, and returns the binaries.
pub fn ensure(layout: &Layout, versions: &Versions) -> Result<Binaries> {
    ensure_wanted(layout, versions, Wanted::Cluster)
}

/// Builds the binaries of `wanted` that the cache lacks (only those) and returns the binaries
/// of the current cache key. Outputs go to a directory of this process first and are then moved
/// into the key's directory one by one, so a concurrent reader never sees a partial file.
pub fn ensure_wanted(layout: &Layout, versions: &Versions, wanted: Wanted) -> Result<Binaries> {
    let go_version = go_version()?;
    let key = cache_key(layout, versions, &go_version)?;
    let bins = Binaries { dir: layout.cache.join("bin").join(&key) };
    // A checkout's sources change under the same version: its builds always run (Go's cache
    // makes an unchanged one quick).
    let checkout = versions.kube.checkout.is_some();
    let to_build = || -> Vec<GoBuild> {
        plan(&layout.go_dir(), versions, wanted)
            .into_iter()
            .filter(|b| {
                (checkout && b.module == versions.kube.dir)
                    || b.outputs.iter().any(|o| !bins.dir.join(o).is_file())
            })
            .collect()
    };
    // One build of a key at a time; a cache hit takes no lock (outputs arrive by rename), so a
    // build in the background never holds up a `cluster up` whose binaries are there. After the
    // wait, what the other build made is no longer built.
    let mut builds = to_build();
    let _one_at_a_time = if builds.is_empty() {
        None
    } else {
        let lock = lock::BuildLock::acquire(
            &lock::lock_file(&layout.cache.join("bin"), &key),
            lock::BUILD_LOCK_TIMEOUT,
        )?;
        builds = to_build();
        Some(lock)
    };
    if builds.is_empty() {
        if matches!(wanted, Wanted::Cluster | Wanted::Kind) {
            Step::start(format!("build Kubernetes {} components", versions.kubernetes)).finish("cached");
        }
        prune(&layout.cache.join("bin"), &key);
        return Ok(bins);
    }
    let tmp = layout.cache.join("bin").join(format!("{key}.partial-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let out_dir = format!("{}/", path_str(&tmp)?);
    for build in &builds {
        let step = Step::start(build.what.clone());
        let mut args: Vec<&str> = vec!["-o", &out_dir];
        args.extend(build.args.iter().map(String::as_str));
        let env: Vec<(&str, &str)> = build.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if build.quiet {
            go_build_quiet(&build.module, &env, &args)?;
        } else {
            go_build(&build.module, &env, &args)?;
        }
        step.done();
    }
    let outputs: Vec<&str> = builds.iter().flat_map(|b| b.outputs.iter().copied()).collect();
    let missing: Vec<_> = outputs.iter().filter(|o| !tmp.join(o).is_file()).collect();
    if !missing.is_empty() {
        bail!("the Go build did not produce {missing:?} in {}", tmp.display());
    }
    fs::create_dir_all(&bins.dir).with_context(|| format!("create {}", bins.dir.display()))?;
    for output in outputs {
        fs::rename(tmp.join(output), bins.dir.join(output))
            .with_context(|| format!("move {output} into {}", bins.dir.display()))?;
    }
    fs::remove_dir_all(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
    prune(&layout.cache.join("bin"), &key);
    Ok(bins)
}

/// The feature gates the built kubelet takes (its `--help`; the control plane's list is the same
/// registry), cached beside the binaries.
pub fn known_gates(bins: &Binaries) -> Result<Vec<String>> {
    let file = bins.dir.join("feature-gates");
    if let Ok(text) = fs::read_to_string(&file) {
        return Ok(text.lines().map(String::from).collect());
    }
    let gates = crate::skew::listed_gates(&bins.kube(), &["kubelet"])?;
    fs::write(&file, gates.join("\n")).with_context(|| format!("write {}", file.display()))?;
    Ok(gates)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::{
        kube_module::{KUBECTL_PACKAGE, KubeModule},
        kube_version::KubeVersion,
    };

    #[test]
    fn each_wanted_set_builds_exactly_its_binaries() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let v = Versions::read(&layout).unwrap();
        let bins = Binaries { dir: PathBuf::from("/cache") };
        let outputs = |wanted| -> Vec<PathBuf> {
            plan(&layout.go_dir(), &v, wanted)
                .iter()
                .flat_map(|b| b.outputs.clone())
                .map(|o| bins.dir.join(o))
                .collect()
        };
        let mut cluster = outputs(Wanted::Cluster);
        cluster.sort();
        let mut all = bins.all();
        all.sort();
        assert_eq!(cluster, all);
        let mut kind = outputs(Wanted::Kind);
        kind.sort();
        let mut want = bins.all();
        want.extend([bins.kubeadm(), bins.kube_proxy(), bins.coredns(), bins.crictl()]);
        want.extend(bins.cni_plugins().into_iter().map(|(_, path)| path));
        want.sort();
        assert_eq!(kind, want);
        assert_eq!(outputs(Wanted::Kubectl), [bins.kubectl()]);
        assert_eq!(outputs(Wanted::Registry), [bins.registry()]);
        // kubectl carries the cluster's version stamp.
        let kubectl = plan(&layout.go_dir(), &v, Wanted::Kubectl).remove(0);
        assert!(kubectl.args.contains(&v.kube_ldflags()), "{:?}", kubectl.args);
        assert!(kubectl.args.contains(&KUBECTL_PACKAGE.to_string()));
    }

    #[test]
    fn a_release_builds_kubernetes_in_its_module_with_its_go() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let mut v = Versions::read(&layout).unwrap();
        let pinned_key = cache_key(&layout, &v, "go1.26.8").unwrap();
        v.kubernetes = KubeVersion::parse("v1.38.0-beta.0").unwrap();
        v.kube = KubeModule {
            dir: "/cache/k8s/v1.38.0-beta.0".into(),
            version: v.kubernetes.clone(),
            toolchain: Some("go1.27.0".into()),
            checkout: None,
        };
        let outputs = |wanted| -> Vec<&str> {
            plan(&layout.go_dir(), &v, wanted).iter().flat_map(|b| b.outputs.clone()).collect()
        };
        // cargo xtask kubectl runs the pinned release's; the kind node image carries its own.
        assert!(!outputs(Wanted::Cluster).contains(&"kubectl"));
        assert!(outputs(Wanted::Kind).contains(&"kubectl"));
        for build in plan(&layout.go_dir(), &v, Wanted::Kind) {
            let kubernetes = build
                .outputs
                .iter()
                .any(|o| ["kube", "kubectl", "sample-device-plugin", "kubeadm"].contains(o));
            let toolchain = build.env.iter().find(|(k, _)| *k == "GOTOOLCHAIN").map(|(_, v)| v.as_str());
            if kubernetes {
                assert_eq!(build.module, v.kube.dir, "{}", build.what);
                assert_eq!(toolchain, Some("go1.27.0"), "{}", build.what);
            } else {
                assert!(build.module.starts_with(layout.go_dir()), "{}", build.what);
                assert_eq!(toolchain, None, "{}", build.what);
            }
        }
        let key = cache_key(&layout, &v, "go1.26.8").unwrap();
        assert!(key.starts_with("v1.38.0-beta.0-"), "{key}");
        assert_ne!(key, pinned_key);
    }
}
