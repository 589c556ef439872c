//! Which Kubernetes the local cluster runs: the release `xtask/local-cluster/go.mod` pins (the
//! default); another release, `cluster up --k8s-version V`; or a Kubernetes checkout, `cluster up
//! --k8s-source DIR`. The last two are built from a Go module this file generates in the cache:
//! k8s.io/kubernetes@V with its staging modules at their published versions (or the checkout and
//! its `staging/src/k8s.io/*`, by local `replace`s), our `cmd/kube` (the multi-call binary) taken
//! from `xtask/local-cluster` by a local `replace`, and the Go toolchain the Kubernetes go.mod
//! asks for (`GOTOOLCHAIN`, fetched by go). Go's build cache makes a second build of the same
//! sources take seconds, and a build after an edit of a checkout recompiles what the edit touches.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::common::{kube_version::KubeVersion, layout::Layout};
use crate::{gomod, usage::UsageError};

/// The import path of our multi-call binary (`xtask/local-cluster/cmd/kube`).
pub const KUBE_PACKAGE: &str = "github.com/dra-e2e/dra-e2e/xtask/local-cluster/cmd/kube";

/// The module path of `xtask/local-cluster`.
const LOCAL_CLUSTER_MODULE: &str = "github.com/dra-e2e/dra-e2e/xtask/local-cluster";

/// The main package of upstream's sample device plugin, inside the pinned k8s.io/kubernetes module.
pub const SAMPLE_DEVICE_PLUGIN_PACKAGE: &str = "k8s.io/kubernetes/test/images/sample-device-plugin";
/// The main package of kubectl, inside the pinned k8s.io/kubernetes module (a `tool` of go.mod,
/// so that go.sum covers it).
pub const KUBECTL_PACKAGE: &str = "k8s.io/kubernetes/cmd/kubectl";
/// kubeadm's main package, inside the Kubernetes module (a `tool` of go.mod; kind node image).
pub const KUBEADM_PACKAGE: &str = "k8s.io/kubernetes/cmd/kubeadm";
/// kube-proxy's main package, inside the Kubernetes module (a `tool` of go.mod; kind node image).
pub const KUBE_PROXY_PACKAGE: &str = "k8s.io/kubernetes/cmd/kube-proxy";
/// Packages of k8s.io/kubernetes the cluster builds besides [`KUBE_PACKAGE`] (`tool` lines, so
/// that `go mod tidy` keeps what they need).
/// kubeadm and kube-proxy are for the kind node image.
const TOOLS: &[&str] = &[KUBECTL_PACKAGE, SAMPLE_DEVICE_PLUGIN_PACKAGE, KUBEADM_PACKAGE, KUBE_PROXY_PACKAGE];

/// Bumped when the generated go.mod changes shape, so modules generated before are regenerated.
const GENERATOR: &str = "4";

/// The Go module the cluster's Kubernetes binaries are built in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeModule {
    /// Its directory.
    pub dir: PathBuf,
    /// The Kubernetes version it builds (`v1.38.0-beta.0`).
    pub version: KubeVersion,
    /// `GOTOOLCHAIN` for its builds; `None` leaves the environment's.
    pub toolchain: Option<String>,
    /// The checkout it builds (`--k8s-source`): its sources change without its version, so its
    /// binaries are rebuilt by every `cluster up` (Go's cache keeps that short).
    pub checkout: Option<PathBuf>,
}

impl KubeModule {
    /// The pinned release: `xtask/local-cluster` itself.
    pub fn pinned(layout: &Layout) -> Result<Self> {
        let dir = layout.go_dir();
        let go_mod = dir.join("go.mod");
        let required = gomod::go_mod_version(&go_mod, "k8s.io/kubernetes")?;
        let version = KubeVersion::parse_tag(&required)
            .with_context(|| format!("{} requires k8s.io/kubernetes {required}", go_mod.display()))?;
        Ok(Self { dir, version, toolchain: None, checkout: None })
    }

    /// The module of `--k8s-source` if given, else of `--k8s-version` (see [`Self::for_version`]).
    pub fn for_overrides(
        layout: &Layout,
        version: Option<&KubeVersion>,
        source: Option<&Path>,
    ) -> Result<Self> {
        match source {
            Some(dir) => checkout(layout, dir),
            None => Self::for_version(layout, version),
        }
    }

    /// The module for `version`: the pinned one when `version` is `None` or the pinned release,
    /// else the generated module of that release (generated unless the cache has it).
    pub fn for_version(layout: &Layout, version: Option<&KubeVersion>) -> Result<Self> {
        let pinned = Self::pinned(layout)?;
        match version {
            None => Ok(pinned),
            Some(v) if *v == pinned.version => Ok(pinned),
            Some(v) => release(layout, v),
        }
    }

    /// Its go.mod and go.sum, for the build cache key.
    pub fn files(&self) -> Vec<PathBuf> {
        ["go.mod", "go.sum"].iter().map(|f| self.dir.join(f)).filter(|p| p.exists()).collect()
    }
}

/// Parses `--k8s-version`'s value: a release tag such as v1.38.0-beta.0 (see
/// [`KubeVersion::parse_tag`]); bad input is one sentence naming the flag.
pub fn parse_version(version: &str) -> std::result::Result<KubeVersion, UsageError> {
    KubeVersion::parse_tag(version).map_err(|e| UsageError::new(format!("--k8s-version {e}")))
}

/// The generated module of `version` in the cache, generated when missing or made from other
/// inputs (another checkout of this repository, another `xtask/local-cluster/go.mod`).
fn release(layout: &Layout, version: &KubeVersion) -> Result<KubeModule> {
    let dir = layout.cache.join("k8s").join(version.to_string());
    let inputs = inputs_of(layout)?;
    let stamp = dir.join("inputs");
    let toolchain_file = dir.join("toolchain");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == inputs)
        && let Ok(toolchain) = fs::read_to_string(&toolchain_file)
    {
        return Ok(KubeModule { dir, version: version.clone(), toolchain: Some(toolchain), checkout: None });
    }
    let step = crate::progress::Step::start(format!(
        "generate the Go module of Kubernetes {version} (k8s.io/kubernetes from the Go module proxy)"
    ));
    let module = gomod::download(version).map_err(|e| {
        anyhow::Error::from(UsageError::new(format!(
            "k8s.io/kubernetes@{version} cannot be downloaded from the Go module proxy ({e:#}): is {version} a released tag?"
        )))
    })?;
    let toolchain = gomod::toolchain_for(&module.go_mod)?;
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let _ = fs::remove_file(&stamp);
    fs::write(dir.join("go.mod"), go_mod(version, &module.go_mod, &layout.go_dir(), None)?)
        .with_context(|| format!("write {}/go.mod", dir.display()))?;
    let _ = fs::remove_file(dir.join("go.sum"));
    let replaced = gomod::tidy(&dir, &toolchain.env, &gomod::replacements(&layout.repo))?;
    fs::write(&toolchain_file, &toolchain.env)?;
    fs::write(&stamp, &inputs)?;
    step.finish(&format!(
        "done (Go {}{})",
        toolchain.needed,
        if replaced.is_empty() { String::new() } else { format!("; ours for {}", replaced.join(", ")) }
    ));
    Ok(KubeModule { dir, version: version.clone(), toolchain: Some(toolchain.env), checkout: None })
}

/// The generated module of the checkout `source` (`--k8s-source`): regenerated when its go.mod
/// or go.sum changed; the version is what the checkout says it is (see [`checkout_version`]).
fn checkout(layout: &Layout, source: &Path) -> Result<KubeModule> {
    let source = source.canonicalize().map_err(|e| {
        anyhow::Error::from(UsageError::new(format!(
            "--k8s-source {}: {e}; give the directory of a Kubernetes checkout",
            source.display()
        )))
    })?;
    let k8s_go_mod = fs::read_to_string(source.join("go.mod")).unwrap_or_default();
    if !k8s_go_mod.lines().any(|l| l.trim() == "module k8s.io/kubernetes")
        || !source.join("staging/src/k8s.io").is_dir()
    {
        return Err(UsageError::new(format!(
            "--k8s-source {} is not a Kubernetes checkout (no go.mod of module k8s.io/kubernetes with staging/src/k8s.io beside it)",
            source.display()
        ))
        .into());
    }
    let version = checkout_version(&source, std::env::var("KUBE_GIT_VERSION").ok().as_deref())?;
    let mut hasher = Sha256::new();
    hasher.update(source.to_string_lossy().as_bytes());
    let dir = layout.cache.join("k8s").join(format!("checkout-{}", &hex::encode(hasher.finalize())[..12]));
    let mut inputs = Sha256::new();
    inputs.update(inputs_of(layout)?.as_bytes());
    inputs.update(k8s_go_mod.as_bytes());
    inputs.update(fs::read(source.join("go.sum")).unwrap_or_default());
    let inputs = hex::encode(inputs.finalize());
    let stamp = dir.join("inputs");
    let toolchain = gomod::toolchain_for(&k8s_go_mod)?;
    if fs::read_to_string(&stamp).is_ok_and(|s| s == inputs) {
        return Ok(KubeModule { dir, version, toolchain: Some(toolchain.env), checkout: Some(source) });
    }
    let step =
        crate::progress::Step::start(format!("generate the Go module of the checkout {}", source.display()));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let _ = fs::remove_file(&stamp);
    // The required version of a replaced module is only a placeholder.
    let placeholder = KubeVersion::new(0, 0, 0);
    fs::write(dir.join("go.mod"), go_mod(&placeholder, &k8s_go_mod, &layout.go_dir(), Some(&source))?)
        .with_context(|| format!("write {}/go.mod", dir.display()))?;
    let _ = fs::remove_file(dir.join("go.sum"));
    gomod::tidy(&dir, &toolchain.env, &gomod::replacements(&layout.repo))?;
    fs::write(&stamp, &inputs)?;
    step.finish(&format!("done (Kubernetes {version}, Go {})", toolchain.needed));
    Ok(KubeModule { dir, version, toolchain: Some(toolchain.env), checkout: Some(source) })
}

/// The version a checkout says it is, as upstream's hack/lib/version.sh finds it:
/// `KUBE_GIT_VERSION` (`kube_git_version`) if set, else `git describe --tags --match 'v*'
/// --abbrev=14 --dirty` (`v1.38.0-alpha.0-12-gabcdef01234567-dirty`, a pre-release of v1.38.0).
fn checkout_version(source: &Path, kube_git_version: Option<&str>) -> Result<KubeVersion> {
    if let Some(version) = kube_git_version
        && !version.trim().is_empty()
    {
        return KubeVersion::parse(version)
            .map_err(|e| UsageError::new(format!("KUBE_GIT_VERSION {e}")).into());
    }
    let out = std::process::Command::new("git")
        .args(["describe", "--tags", "--match", "v*", "--abbrev=14", "--dirty"])
        .current_dir(source)
        .output();
    let described = match out {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => {
            return Err(UsageError::new(format!(
                "cannot tell the version of the checkout {}: it has no git tag v* (`git describe` failed); set KUBE_GIT_VERSION=v1.x.y as upstream's build takes it",
                source.display()
            ))
            .into());
        }
    };
    KubeVersion::parse(&described).map_err(|e| {
        UsageError::new(format!(
            "cannot tell the version of the checkout {}: `git describe` says {e}; set KUBE_GIT_VERSION=v1.x.y as upstream's build takes it",
            source.display()
        ))
        .into()
    })
}

/// What the generated module depends on: this generator, the path and go.mod of
/// `xtask/local-cluster` (its replace target), the go.mod of our replacements.
fn inputs_of(layout: &Layout) -> Result<String> {
    let go = layout.go_dir();
    let text = fs::read(go.join("go.mod")).with_context(|| format!("read {}/go.mod", go.display()))?;
    let mut hasher = Sha256::new();
    hasher.update(GENERATOR.as_bytes());
    hasher.update(go.to_string_lossy().as_bytes());
    hasher.update(text);
    // A replacement's requirements end up in the generated go.mod and go.sum.
    for replacement in gomod::replacements(&layout.repo) {
        let go_mod = replacement.dir.join("go.mod");
        hasher.update(fs::read(&go_mod).with_context(|| format!("read {}", go_mod.display()))?);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The generated go.mod: k8s.io/kubernetes@`version`, its staging modules at v0.X.Y of the
/// same release, our module by a local replace, and the packages the cluster builds as tools.
fn go_mod(
    version: &KubeVersion,
    k8s_go_mod: &str,
    local_cluster: &Path,
    checkout: Option<&Path>,
) -> Result<String> {
    let go_line = k8s_go_mod
        .lines()
        .find_map(|l| l.strip_prefix("go "))
        .context("k8s.io/kubernetes's go.mod has no go line")?
        .trim();
    let staging = version.staging();
    let mut out = format!(
        "// Generated by `cargo xtask cluster up` for Kubernetes {version} (xtask/src/common/kube_module.rs).\n\
         module dra-e2e.local/kubernetes\n\ngo {go_line}\n\n\
         require (\n\t{LOCAL_CLUSTER_MODULE} v0.0.0\n\tk8s.io/kubernetes {version}\n)\n\n\
         replace {LOCAL_CLUSTER_MODULE} => {}\n\n",
        local_cluster.display()
    );
    if let Some(checkout) = checkout {
        out.push_str(&format!("replace k8s.io/kubernetes => {}\n", checkout.display()));
    }
    for module in gomod::staging_modules(k8s_go_mod) {
        match checkout {
            Some(checkout) => {
                out.push_str(&format!("replace {module} => {}/staging/src/{module}\n", checkout.display()))
            }
            None => out.push_str(&format!("replace {module} => {module} {staging}\n")),
        }
    }
    out.push('\n');
    for tool in std::iter::once(&KUBE_PACKAGE).chain(TOOLS) {
        out.push_str(&format!("tool {tool}\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> KubeVersion {
        KubeVersion::parse(text).unwrap()
    }

    #[test]
    fn the_generated_go_mod_pins_the_release_and_its_staging_modules() {
        let k8s = "module k8s.io/kubernetes\n\ngo 1.27.0\n\nrequire (\n\tk8s.io/api v0.0.0\n\tk8s.io/cri-client v0.0.0\n\tk8s.io/klog/v2 v2.130.1\n)\n";
        let text = go_mod(&v("v1.38.0-beta.0"), k8s, Path::new("/repo/xtask/local-cluster"), None).unwrap();
        assert!(text.contains("\ngo 1.27.0\n"), "{text}");
        assert!(text.contains("\tk8s.io/kubernetes v1.38.0-beta.0\n"), "{text}");
        assert!(text.contains("replace k8s.io/api => k8s.io/api v0.38.0-beta.0\n"), "{text}");
        assert!(text.contains("replace k8s.io/cri-client => k8s.io/cri-client v0.38.0-beta.0\n"), "{text}");
        assert!(!text.contains("klog/v2 =>"), "{text}");
        assert!(text.contains(&format!("replace {LOCAL_CLUSTER_MODULE} => /repo/xtask/local-cluster\n")));
        assert!(text.contains(&format!("tool {KUBE_PACKAGE}\n")), "{text}");
        assert!(go_mod(&v("v1.38.0"), "module k8s.io/kubernetes\n", Path::new("/x"), None).is_err());
        let text = go_mod(&v("v1.38.0"), k8s, Path::new("/x"), Some(Path::new("/src/k8s"))).unwrap();
        assert!(text.contains("replace k8s.io/kubernetes => /src/k8s\n"), "{text}");
        assert!(text.contains("replace k8s.io/api => /src/k8s/staging/src/k8s.io/api\n"), "{text}");
    }

    #[test]
    fn a_version_that_is_no_release_tag_is_bad_input() {
        assert_eq!(parse_version("v1.38.0-beta.0").unwrap(), v("v1.38.0-beta.0"));
        assert_eq!(parse_version("1.38.0").unwrap().to_string(), "v1.38.0");
        for bad in ["1.38", "v1.38", "latest", "v1.38.0/../x", "v2.0.0", "v1.38.0+abc"] {
            let err = parse_version(bad).unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    "--k8s-version {bad:?} is not a Kubernetes release tag such as v1.37.2 or v1.38.0-beta.0"
                )
            );
        }
    }

    #[test]
    fn a_checkout_is_at_the_version_git_describe_or_kube_git_version_gives() {
        let dir = tempfile::tempdir().unwrap();
        let err = checkout_version(dir.path(), None).unwrap_err().to_string();
        assert!(err.contains("it has no git tag v*") && !err.contains('\n'), "{err}");
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"])
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        git(&["init", "-q"]);
        git(&["commit", "-q", "--allow-empty", "-m", "a"]);
        git(&["tag", "v1.38.0-alpha.0"]);
        git(&["commit", "-q", "--allow-empty", "-m", "b"]);
        let version = checkout_version(dir.path(), None).unwrap();
        assert!(version.to_string().starts_with("v1.38.0-alpha.0-1-g"), "{version}");
        assert_eq!(version.release(), KubeVersion::new(1, 38, 0));
        git(&["tag", "vnext"]);
        let err = checkout_version(dir.path(), None).unwrap_err().to_string();
        assert!(err.contains("`git describe` says \"vnext\" is not a Kubernetes version"), "{err}");
        let version = checkout_version(dir.path(), Some("v1.38.0-alpha.0.5+abc")).unwrap();
        assert_eq!(version.to_string(), "v1.38.0-alpha.0.5+abc");
        let err = checkout_version(dir.path(), Some("main")).unwrap_err().to_string();
        assert_eq!(
            err,
            "KUBE_GIT_VERSION \"main\" is not a Kubernetes version such as v1.37.2 or v1.38.0-beta.0"
        );
    }

    #[test]
    fn the_pinned_release_is_the_local_cluster_module() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let pinned = KubeModule::pinned(&layout).unwrap();
        assert_eq!(pinned.dir, layout.go_dir());
        assert_eq!(KubeModule::for_version(&layout, Some(&pinned.version)).unwrap(), pinned);
        assert_eq!(KubeModule::for_version(&layout, None).unwrap(), pinned);
    }
}
