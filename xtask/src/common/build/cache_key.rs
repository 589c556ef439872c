//! The cache key of a build: a hash of everything that determines its outputs.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::{plan::REGISTRY_PACKAGE, versions::Versions};
use crate::common::{
    kube_module::{KUBECTL_PACKAGE, SAMPLE_DEVICE_PLUGIN_PACKAGE},
    layout::Layout,
};

/// Hashes everything that determines the build outputs.
pub(super) fn cache_key(layout: &Layout, versions: &Versions, go_version: &str) -> Result<String> {
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
