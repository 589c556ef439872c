//! Older kubelets for version skew (`cluster up --kubelet-version`, see [`crate::skew`]): the
//! kubelet alone, `go build k8s.io/kubernetes/cmd/kubelet` in its own Go module
//! `xtask/local-cluster/kubelet/<version>` (go.mod and go.sum only: `k8s.io/kubernetes@<version>`
//! and the staging `replace` block that `update-replace.sh <version> kubelet/<version>`
//! generates). Built once per version and cached under `<cache>/bin/kubelet/<version>-<hash>`,
//! keyed like the cluster's build by the Go version, the module's files and the flags. Next to
//! the binary lies the list of feature gates that kubelet knows, read from its `--help`.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::common::{
    build,
    kube_version::KubeVersion,
    layout::{Layout, OLD_KUBELET_DIR},
};
use crate::{progress::Step, skew};

/// The kubelet's main package inside `k8s.io/kubernetes`.
pub const KUBELET_PACKAGE: &str = "k8s.io/kubernetes/cmd/kubelet";
/// The directory of the old kubelets (see [`OLD_KUBELET_DIR`]).
const DIR: &str = OLD_KUBELET_DIR;
/// The file of known gates next to each binary, one name per line.
const GATES_FILE: &str = "feature-gates";

/// One built older kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldKubelet {
    /// Its version (stamped into the binary: the node reports it).
    pub version: KubeVersion,
    /// The binary.
    pub binary: PathBuf,
    /// The feature gates it knows (GA and deprecated gates are not listed by the kubelet).
    pub gates: Vec<String>,
}

/// The Go module of the kubelet at `version`.
pub fn module_dir(layout: &Layout, version: &KubeVersion) -> PathBuf {
    layout.go_dir().join(DIR).join(version.to_string())
}

/// The versions that have a module, oldest first.
pub fn supported(layout: &Layout) -> Vec<KubeVersion> {
    let Ok(entries) = fs::read_dir(layout.go_dir().join(DIR)) else { return Vec::new() };
    let mut versions: Vec<KubeVersion> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("go.mod").is_file())
        .filter_map(|e| KubeVersion::parse_release(&e.file_name().to_string_lossy()).ok())
        .collect();
    versions.sort();
    versions
}

/// The older kubelet of each node (`None`: the node runs the cluster's own kubelet), from
/// `--kubelet-version` and kind.yaml's node images (see [`skew::node_versions`]); builds those
/// the cache lacks. A pre-release cluster counts as its release.
pub fn for_nodes(
    layout: &Layout,
    cluster_version: &KubeVersion,
    config: &crate::cluster_config::ClusterConfig,
    node_count: usize,
    flag: &[KubeVersion],
) -> Result<Vec<Option<OldKubelet>>> {
    let cluster = cluster_version.release();
    let versions = skew::node_versions(&cluster, node_count, &config.node_images, flag)?;
    let mut built: Vec<OldKubelet> = Vec::new();
    versions
        .into_iter()
        .map(|version| {
            if version == cluster {
                return Ok(None);
            }
            if let Some(kubelet) = built.iter().find(|k| k.version == version) {
                return Ok(Some(kubelet.clone()));
            }
            let kubelet = ensure(layout, &version)?;
            built.push(kubelet.clone());
            Ok(Some(kubelet))
        })
        .collect()
}

/// What the nodes run, for the progress line: `kind-worker v1.34.4, the others v1.37.2`.
pub fn describe(names: &[&str], kubelets: &[Option<OldKubelet>], cluster_version: &KubeVersion) -> String {
    let old: Vec<String> = names
        .iter()
        .zip(kubelets)
        .filter_map(|(name, k)| k.as_ref().map(|k| format!("{name} {}", k.version)))
        .collect();
    if old.is_empty() {
        format!("{cluster_version} on every node")
    } else {
        format!("{}, the others {cluster_version}", old.join(", "))
    }
}

/// Builds the kubelet at `version` unless the cache has it, and returns it.
pub fn ensure(layout: &Layout, version: &KubeVersion) -> Result<OldKubelet> {
    let module = module_dir(layout, version);
    if !module.join("go.mod").is_file() {
        let known: Vec<String> = supported(layout).iter().map(ToString::to_string).collect();
        bail!(
            "no Go module for kubelet {version} in {}: the supported versions are {} (add one with `xtask/local-cluster/update-replace.sh {version} kubelet/{version}`)",
            module.display(),
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        );
    }
    let ldflags = build::kube_ldflags(version);
    let key = cache_key(&module, &build::go_version()?, &ldflags)?;
    let builds = layout.cache.join("bin").join(DIR);
    let dir = builds.join(format!("{version}-{key}"));
    if let Some(kubelet) = read_cached(&dir, version)? {
        Step::start(format!("build kubelet {version}")).finish("cached");
        return Ok(kubelet);
    }
    let step = Step::start(format!(
        "build kubelet {version} from k8s.io/kubernetes@{version} (cold: ~8 CPU-minutes, measured 26 min on a loaded 2-core machine)"
    ));
    let tmp = builds.join(format!("{version}-{key}.partial-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let binary = tmp.join("kubelet");
    let out = build::path_str(&binary)?;
    build::go_build(&module, &[], &["-o", &out, "-ldflags", &ldflags, KUBELET_PACKAGE])?;
    let gates = skew::listed_gates(&binary, &[])?;
    fs::write(tmp.join(GATES_FILE), gates.join("\n") + "\n")?;
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::rename(&tmp, &dir).with_context(|| format!("move {} to {}", tmp.display(), dir.display()))?;
    step.done();
    prune_other_builds(&builds, version, &dir);
    read_cached(&dir, version)?.with_context(|| format!("the build in {} is incomplete", dir.display()))
}

/// The cached build in `dir`, if complete.
fn read_cached(dir: &Path, version: &KubeVersion) -> Result<Option<OldKubelet>> {
    let binary = dir.join("kubelet");
    let gates_file = dir.join(GATES_FILE);
    if !binary.is_file() || !gates_file.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(&gates_file).with_context(|| format!("read {}", gates_file.display()))?;
    let gates = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    Ok(Some(OldKubelet { version: version.clone(), binary, gates }))
}

/// Removes the other builds of `version` (an earlier cache key) and dead partial builds.
fn prune_other_builds(builds: &Path, version: &KubeVersion, current: &Path) {
    let Ok(entries) = fs::read_dir(builds) else { return };
    let prefix = format!("{version}-");
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let live_partial = name.rsplit_once(".partial-").is_some_and(|(_, pid)| {
            pid.parse::<i32>().is_ok_and(|pid| procfs::process::Process::new(pid).is_ok())
        });
        if path != current
            && name.starts_with(&prefix)
            && !live_partial
            && let Err(e) = fs::remove_dir_all(&path)
        {
            tracing::warn!("could not prune {}: {e}", path.display());
        }
    }
}

/// Hashes the Go version, the flags and the module's go.mod and go.sum.
fn cache_key(module: &Path, go_version: &str, ldflags: &str) -> Result<String> {
    let mut hasher = Sha256::new();
    hasher.update(go_version.as_bytes());
    hasher.update(ldflags.as_bytes());
    hasher.update(KUBELET_PACKAGE.as_bytes());
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        hasher.update(file.as_bytes());
        hasher.update(fs::read(&path).with_context(|| format!("read {}", path.display()))?);
    }
    Ok(hex::encode(&hasher.finalize()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::from_env(crate::repo::repo_root()).unwrap()
    }

    #[test]
    fn the_three_previous_minors_have_modules_pinning_their_version() {
        let layout = layout();
        let versions: Vec<String> = supported(&layout).iter().map(ToString::to_string).collect();
        assert_eq!(versions, ["v1.34.4", "v1.35.4", "v1.36.3"]);
        for version in supported(&layout) {
            let go_mod = module_dir(&layout, &version).join("go.mod");
            let pinned = crate::gomod::go_mod_version(&go_mod, "k8s.io/kubernetes").unwrap();
            assert_eq!(pinned, version.to_string(), "{}", go_mod.display());
            let text = fs::read_to_string(&go_mod).unwrap();
            let staging = format!("k8s.io/kubelet => k8s.io/kubelet {}", version.staging());
            assert!(text.contains(&staging), "{} lacks {staging:?}", go_mod.display());
            assert!(text.contains(&format!("tool {KUBELET_PACKAGE}")), "{}", go_mod.display());
        }
    }

    #[test]
    fn a_version_without_module_names_the_supported_ones() {
        let err = ensure(&layout(), &KubeVersion::new(1, 20, 0)).unwrap_err().to_string();
        assert!(err.contains("v1.34.4, v1.35.4, v1.36.3"), "{err}");
        assert!(err.contains("update-replace.sh v1.20.0 kubelet/v1.20.0"), "{err}");
    }

    #[test]
    fn the_cache_key_follows_the_module_and_the_go_version() {
        let layout = layout();
        let module = module_dir(&layout, &KubeVersion::new(1, 34, 4));
        let a = cache_key(&module, "go1.26.8", "-s").unwrap();
        assert_eq!(a, cache_key(&module, "go1.26.8", "-s").unwrap());
        assert_ne!(a, cache_key(&module, "go1.26.9", "-s").unwrap());
        let other = module_dir(&layout, &KubeVersion::new(1, 35, 4));
        assert_ne!(a, cache_key(&other, "go1.26.8", "-s").unwrap());
    }
}
