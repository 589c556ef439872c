//! Builds the cluster's binaries from the Go modules in `xtask/local-cluster`, once per set of pinned
//! versions: the outputs live in the cache under a key hashed from the Go version, the modules'
//! go.mod/go.sum, our own Go sources and the build flags, so a warm `cluster up` builds nothing.
//! Each `go build` runs only when one of its outputs is missing, so `cargo xtask kubectl` builds
//! only kubectl and `cluster up --registry` only adds the registry to a complete build.

mod kind;
mod lock;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::common::{
    kube_module::{KUBE_PACKAGE, KUBECTL_PACKAGE, KubeModule, SAMPLE_DEVICE_PLUGIN_PACKAGE},
    kube_version::KubeVersion,
    layout::Layout,
};
use crate::{gomod::go_mod_version, progress::Step};

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
            self.sample_device_plugin(),
        ]
    }
}

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

    fn containerd_ldflags(&self) -> String {
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

/// Removes build directories of other cache keys under `bin_dir`, except the newest of them (so
/// switching between two checkouts does not rebuild each time), any that a running process
/// executes from (a cluster still up on that build: removing it would break every container it
/// starts next), and partial builds whose builder is gone; the older kubelets' builds
/// ([`crate::common::layout::OLD_KUBELET_DIR`]) stay. Best effort: a directory that cannot be
/// removed is only logged.
pub fn prune(bin_dir: &Path, current: &str) {
    let Ok(entries) = fs::read_dir(bin_dir) else { return };
    let mut others: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == current || name == crate::common::layout::OLD_KUBELET_DIR || !path.is_dir() {
            continue;
        }
        if let Some((_, pid)) = name.rsplit_once(".partial-") {
            let alive = pid.parse::<i32>().is_ok_and(|pid| procfs::process::Process::new(pid).is_ok());
            if !alive {
                remove_logged(&path);
            }
            continue;
        }
        let modified = entry.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
        others.push((modified, path));
    }
    others.sort();
    others.pop(); // the newest other build stays
    for (_, path) in others {
        let users = crate::host_cleanup::processes_running_from(&path);
        if users.is_empty() {
            remove_logged(&path);
        } else {
            eprintln!("    kept the old build {}: processes {users:?} run from it", path.display());
        }
    }
}

fn remove_logged(path: &Path) {
    match fs::remove_dir_all(path) {
        Ok(()) => eprintln!("    pruned the old build {}", path.display()),
        Err(e) => tracing::warn!("could not prune {}: {e}", path.display()),
    }
}

/// The main package of the CNCF distribution registry, in the `registry` module.
pub const REGISTRY_PACKAGE: &str = "github.com/distribution/distribution/v3/cmd/registry";

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

/// One `go build` into the cache: what it makes, from which module and with which flags. Every
/// build writes into a directory (`-o DIR/`), so each output is named after its package.
struct GoBuild {
    what: String,
    module: PathBuf,
    env: Vec<(&'static str, String)>,
    args: Vec<String>,
    outputs: Vec<&'static str>,
    /// Print the compiler's output only when the build fails.
    quiet: bool,
}

/// The builds that make `wanted`, in the order that reuses Go's build cache best.
fn plan(go: &Path, versions: &Versions, wanted: Wanted) -> Vec<GoBuild> {
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
            what: "build the pause and hostpathplugin image binaries".into(),
            module: go.join("images"),
            env: vec![("CGO_ENABLED", "0".into())],
            args: strs(&["-ldflags", "-s -w", "./cmd/pause", "./cmd/hostpathplugin"]),
            outputs: vec!["pause", "hostpathplugin"],
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

/// `go version`, or a clear error when Go is missing.
pub(crate) fn go_version() -> Result<String> {
    go_version_of("go")
}

fn go_version_of(go: &str) -> Result<String> {
    let out = Command::new(go)
        .arg("version")
        .output()
        .map_err(|e| crate::gomod::cannot_run_go("go version", &e))?;
    if !out.status.success() {
        bail!("`go version` failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) fn go_build(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<()> {
    let status = Command::new("go")
        .arg("build")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .status()
        .with_context(|| format!("run go build in {}", dir.display()))?;
    if !status.success() {
        bail!("go build {} failed in {} ({status}); see the output above", args.join(" "), dir.display());
    }
    Ok(())
}

/// [`go_build`] with the output captured and printed only when the build fails.
fn go_build_quiet(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<()> {
    let out = Command::new("go")
        .arg("build")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .with_context(|| format!("run go build in {}", dir.display()))?;
    if !out.status.success() {
        bail!(
            "go build {} failed in {} ({}):\n{}{}",
            args.join(" "),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(())
}

pub(crate) fn path_str(p: &Path) -> Result<String> {
    p.to_str().map(String::from).with_context(|| format!("path is not UTF-8: {}", p.display()))
}

/// Hashes everything that determines the build outputs.
fn cache_key(layout: &Layout, versions: &Versions, go_version: &str) -> Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(go_version.as_bytes());
    hasher.update(versions.kube_ldflags().as_bytes());
    hasher.update(versions.containerd_ldflags().as_bytes());
    hasher.update(SAMPLE_DEVICE_PLUGIN_PACKAGE.as_bytes());
    hasher.update(Versions::sample_device_plugin_ldflags().as_bytes());
    hasher.update(KUBECTL_PACKAGE.as_bytes());
    hasher.update(REGISTRY_PACKAGE.as_bytes());
    let go = layout.go_dir();
    let mut files = Vec::new();
    // A release's generated module: its go.mod, go.sum and the Go it builds with.
    if let Some(toolchain) = &versions.kube.toolchain {
        hasher.update(toolchain.as_bytes());
    }
    if versions.kube.dir != go {
        for file in versions.kube.files() {
            hasher.update(fs::read(&file).with_context(|| format!("read {}", file.display()))?);
        }
        // Our replacements of modules the proxy refuses, which such a module may build with.
        for file in replacement_sources(&layout.repo)? {
            hasher.update(file.strip_prefix(&layout.repo).unwrap_or(&file).to_string_lossy().as_bytes());
            hasher.update(fs::read(&file).with_context(|| format!("read {}", file.display()))?);
        }
    }
    for module in [
        go.clone(),
        go.join("containerd"),
        go.join("runc"),
        go.join("images"),
        go.join("registry"),
        go.join("kind"),
    ] {
        files.push(module.join("go.mod"));
        if module.join("go.sum").exists() {
            files.push(module.join("go.sum"));
        }
        collect_go_files(&module.join("cmd"), &mut files)?;
    }
    files.sort();
    for file in files {
        let rel = file.strip_prefix(&go).unwrap_or(&file);
        hasher.update(rel.to_string_lossy().as_bytes());
        hasher.update(fs::read(&file).with_context(|| format!("read {}", file.display()))?);
    }
    let digest = hasher.finalize();
    Ok(format!("{}-{}", versions.kubernetes, hex::encode(&digest[..8])))
}

/// What a build takes from our replacements ([`crate::gomod::replacements`]): go.mod, go.sum and
/// the Go sources but the tests, in a fixed order.
fn replacement_sources(repo: &Path) -> Result<Vec<PathBuf>> {
    let mut sources = Vec::new();
    for replacement in crate::gomod::replacements(repo) {
        sources.extend([replacement.dir.join("go.mod"), replacement.dir.join("go.sum")]);
        collect_go_files(&replacement.dir, &mut sources)?;
    }
    sources.retain(|f| f.exists() && !f.to_string_lossy().ends_with("_test.go"));
    sources.sort();
    Ok(sources)
}

fn collect_go_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            collect_go_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "go") {
            out.push(path);
        }
    }
    Ok(())
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

    #[test]
    fn missing_go_is_one_clear_sentence() {
        let err = go_version_of("go-that-does-not-exist").unwrap_err().to_string();
        assert!(err.contains("`go` is not on PATH"), "{err}");
        assert!(err.contains("install Go"), "{err}");
        assert!(!err.contains('\n'), "one sentence: {err}");
    }

    #[test]
    fn prune_keeps_the_current_and_the_newest_other_build() {
        let dir = tempfile::tempdir().unwrap();
        for (name, age) in [("old", 30), ("newer", 20), ("current", 40)] {
            let path = dir.path().join(name);
            fs::create_dir(&path).unwrap();
            let time = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            fs::File::open(&path).unwrap().set_modified(time).unwrap();
        }
        fs::create_dir(dir.path().join("x.partial-999999999")).unwrap();
        fs::create_dir(dir.path().join(super::super::layout::OLD_KUBELET_DIR)).unwrap();
        let mine = dir.path().join(format!("y.partial-{}", std::process::id()));
        fs::create_dir(&mine).unwrap();
        prune(dir.path(), "current");
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["current", "kubelet", "newer", &format!("y.partial-{}", std::process::id())]);
    }

    #[test]
    fn prune_keeps_a_build_that_a_process_runs_from() {
        let dir = tempfile::tempdir().unwrap();
        // A cluster still up on the oldest build: its processes execute from that directory.
        fs::create_dir(dir.path().join("in-use")).unwrap();
        let sleep = dir.path().join("in-use/sleep");
        fs::copy("/bin/sleep", &sleep).unwrap();
        for (name, age) in [("in-use", 30), ("newer", 20), ("current", 10)] {
            let path = dir.path().join(name);
            fs::create_dir_all(&path).unwrap();
            let time = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            fs::File::open(&path).unwrap().set_modified(time).unwrap();
        }
        // A test that forks at the moment of the copy can hold the file open for writing a moment.
        let mut child = (0..50)
            .find_map(|_| match std::process::Command::new(&sleep).arg("30").spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    None
                }
                other => Some(other.unwrap()),
            })
            .unwrap();
        prune(dir.path(), "current");
        let _ = child.kill();
        let _ = child.wait();
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["current", "in-use", "newer"]);
    }

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

    #[test]
    fn builds_of_other_releases_depend_on_our_replacements_but_their_tests() {
        let repo = crate::repo::repo_root();
        let sources = replacement_sources(&repo).unwrap();
        let dir = repo.join("xtask/local-cluster/iptables-wrappers");
        assert!(sources.contains(&dir.join("go.mod")), "{sources:?}");
        assert!(sources.contains(&dir.join("pkg/iptables/iptables.go")), "{sources:?}");
        assert!(!sources.iter().any(|f| f.to_string_lossy().ends_with("_test.go")), "{sources:?}");
    }

    #[test]
    fn cache_key_changes_with_inputs() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let v = Versions::read(&layout).unwrap();
        let a = cache_key(&layout, &v, "go version go1.26.8 linux/amd64").unwrap();
        let b = cache_key(&layout, &v, "go version go1.26.9 linux/amd64").unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(&v.kubernetes.to_string()));
        assert_eq!(a, cache_key(&layout, &v, "go version go1.26.8 linux/amd64").unwrap());
    }
}
