//! The versions a build makes, read from the Go modules, and the `-ldflags` that stamp them into
//! the binaries.

use std::path::Path;

use anyhow::Result;

use crate::common::{kube_module::KubeModule, kube_version::KubeVersion, layout::Layout};
use crate::gomod::go_mod_version;

/// The versions a build makes, read from the Go modules.
#[derive(Debug, Clone)]
pub struct Versions {
    /// Kubernetes, e.g. `v1.37.2`.
    pub kubernetes: KubeVersion,
    /// etcd, e.g. `v3.7.0` (what the Kubernetes module resolves).
    pub etcd: String,
    /// containerd, e.g. `v2.3.7`.
    pub containerd: String,
    /// runc, e.g. `v1.4.3`.
    pub runc: String,
    /// The Go module the Kubernetes binaries are built in.
    pub kube: KubeModule,
}

impl Versions {
    /// Reads the versions the Go modules pin.
    pub fn read(layout: &Layout) -> Result<Self> {
        Self::with(layout, KubeModule::pinned(layout)?)
    }

    /// The versions of a cluster of Kubernetes `release` or of the checkout `source` (neither:
    /// the pinned one), generating its Go module if needed (see [`crate::common::kube_module`]).
    pub fn for_cluster(
        layout: &Layout,
        release: Option<&KubeVersion>,
        source: Option<&Path>,
    ) -> Result<Self> {
        Self::with(layout, KubeModule::for_overrides(layout, release, source)?)
    }

    fn with(layout: &Layout, kube: KubeModule) -> Result<Self> {
        let go = layout.go_dir();
        Ok(Self {
            kubernetes: kube.version.clone(),
            etcd: go_mod_version(&kube.dir.join("go.mod"), "go.etcd.io/etcd/server/v3")?,
            containerd: go_mod_version(&go.join("containerd/go.mod"), "github.com/containerd/containerd/v2")?,
            runc: go_mod_version(&go.join("runc/go.mod"), "github.com/opencontainers/runc")?,
            kube,
        })
    }

    /// The `-ldflags` that stamp the Kubernetes version into k8s.io/component-base/version, so the
    /// kubelet reports it in Node.status.nodeInfo (specs gate on kubelet versions).
    pub fn kube_ldflags(&self) -> String {
        kube_ldflags(&self.kubernetes)
    }

    /// The `-ldflags` of the sample device plugin: linked statically (its image has no libc), but
    /// compiled with cgo on, as the multi-call binary is by default, so that it reuses every
    /// package that build compiled and costs one compile and one link (`CGO_ENABLED=0` would
    /// recompile its ~270 non-standard packages).
    pub fn sample_device_plugin_ldflags() -> &'static str {
        "-s -w -linkmode external -extldflags -static"
    }

    /// The `-ldflags` that stamp containerd's version.
    pub(super) fn containerd_ldflags(&self) -> String {
        format!("-s -w -X github.com/containerd/containerd/v2/version.Version={}", self.containerd)
    }
}

/// The `-ldflags` that stamp `version` into k8s.io/component-base/version (also of the older
/// kubelets of version skew).
pub fn kube_ldflags(version: &KubeVersion) -> String {
    let v = "k8s.io/component-base/version";
    let (major, minor) = (version.major(), version.minor());
    format!(
        "-s -w -X {v}.gitVersion={version} -X {v}.gitMajor={major} -X {v}.gitMinor={minor} -X {v}.gitTreeState=archive -X {v}.buildDate=1970-01-01T00:00:00Z"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldflags_stamp_the_kubernetes_version() {
        let v = Versions {
            kubernetes: KubeVersion::new(1, 37, 2),
            etcd: "v3.7.0".into(),
            containerd: "v2.3.7".into(),
            runc: "v1.4.3".into(),
            kube: KubeModule {
                dir: "/x".into(),
                version: KubeVersion::new(1, 37, 2),
                toolchain: None,
                checkout: None,
            },
        };
        let flags = v.kube_ldflags();
        assert!(flags.contains("version.gitVersion=v1.37.2"), "{flags}");
        assert!(flags.contains("version.gitMajor=1 "), "{flags}");
        assert!(flags.contains("version.gitMinor=37 "), "{flags}");
    }
}
