//! Upstream's DRA test driver (`k8s.io/kubernetes/test/e2e/dra/test-driver`) built from the Go
//! module the cluster's own Kubernetes binaries are built in, at the cluster's version.
//!
//! The module's go.mod pins every version the cluster's build uses; the driver is built against
//! a copy of it (`go build -modfile`, so the repository's files stay as they are) and the copy
//! must come out unchanged: the driver links exactly the module versions of the cluster's
//! components. Its go.sum may grow: the few modules only the driver imports (for v1.37.2,
//! `tags.cncf.io/container-device-interface/specs-go`) come through the Go module proxy,
//! checked against the checksum database as every download. It is compiled with cgo on and
//! linked statically, as the sample device plugin is ([`Versions::sample_device_plugin_ldflags`]),
//! so it reuses every package the cluster's build left in Go's build cache (measured: 18 s,
//! most of it the link). The binary is cached under a key of the Go version, the module's go.mod
//! and go.sum and these flags.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::{
    common::{
        build::{Versions, go_build_quiet, go_version, path_str, prune},
        layout::Layout,
    },
    progress::Step,
};

/// The driver's main package, in the k8s.io/kubernetes module.
pub const PACKAGE: &str = "k8s.io/kubernetes/test/e2e/dra/test-driver";

/// The binary's name (upstream's README calls it so).
pub const BINARY: &str = "dra-test-driver";

/// Bumped when what a cached build holds changes.
const FORMAT: &str = "1";

/// The cache directory of builds for `versions` with Go `go`.
fn cache_dir(layout: &Layout, versions: &Versions, go: &str) -> Result<(PathBuf, String)> {
    let mut hasher = Sha256::new();
    for part in [FORMAT, go, PACKAGE, Versions::sample_device_plugin_ldflags()] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.update(versions.kube.toolchain.as_deref().unwrap_or("").as_bytes());
    for file in versions.kube.files() {
        hasher.update(fs::read(&file).with_context(|| format!("read {}", file.display()))?);
    }
    let key = format!("{}-{}", versions.kubernetes, hex::encode(&hasher.finalize()[..8]));
    Ok((layout.cache.join("upstream-driver"), key))
}

/// Builds the driver for `versions` unless the cache has it, and returns the static binary. What
/// a build fetched through the Go module proxy is named in its step's line.
pub fn ensure(layout: &Layout, versions: &Versions) -> Result<PathBuf> {
    if versions.kube.checkout.is_some() {
        bail!(
            "upstream's test driver is built from a released k8s.io/kubernetes module; the cluster runs the checkout {}",
            versions.kubernetes
        );
    }
    let (root, key) = cache_dir(layout, versions, &go_version()?)?;
    let binary = root.join(&key).join(BINARY);
    let step = Step::start(format!("build upstream's DRA test driver {} ({PACKAGE})", versions.kubernetes));
    if binary.is_file() {
        step.finish("cached");
        return Ok(binary);
    }
    let work = root.join(format!("{key}.partial-{}", std::process::id()));
    let built = build_in(&versions.kube.dir, &versions.kube.toolchain, &work);
    let fetched = match built {
        Ok(fetched) => fetched,
        Err(e) => {
            let _ = fs::remove_dir_all(&work);
            return Err(e);
        }
    };
    fs::create_dir_all(root.join(&key)).with_context(|| format!("create {}", root.join(&key).display()))?;
    fs::rename(work.join(BINARY), &binary)
        .with_context(|| format!("move the driver to {}", binary.display()))?;
    fs::remove_dir_all(&work).with_context(|| format!("remove {}", work.display()))?;
    prune(&root, &key);
    if fetched.is_empty() {
        step.done();
    } else {
        step.finish(&format!("done; fetched through the Go module proxy: {}", fetched.join(", ")));
    }
    Ok(binary)
}

/// Builds into `work` with a copy of `module`'s go.mod and go.sum; returns what go.sum gained.
fn build_in(module: &Path, toolchain: &Option<String>, work: &Path) -> Result<Vec<String>> {
    if work.exists() {
        fs::remove_dir_all(work).with_context(|| format!("remove {}", work.display()))?;
    }
    fs::create_dir_all(work).with_context(|| format!("create {}", work.display()))?;
    let read = |p: &Path| fs::read_to_string(p).with_context(|| format!("read {}", p.display()));
    let go_mod = read(&module.join("go.mod"))?;
    let go_sum = read(&module.join("go.sum")).unwrap_or_default();
    fs::write(work.join("go.mod"), &go_mod)?;
    fs::write(work.join("go.sum"), &go_sum)?;
    let (env, args) = go_build_command(work, toolchain.as_deref())?;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    go_build_quiet(module, &env, &args)?;
    let after = read(&work.join("go.mod"))?;
    if after != go_mod {
        bail!(
            "building {PACKAGE} needs other module versions than the cluster's build in {} uses (its go.mod would change: {}); build it from the same versions or update that module",
            module.display(),
            changed_lines(&go_mod, &after).join("; ")
        );
    }
    Ok(fetched_modules(&go_sum, &read(&work.join("go.sum"))?))
}

/// The environment of a `go build`: name and value.
type GoEnv = Vec<(&'static str, String)>;

/// The environment and the arguments of `go build` for a build in `work` (its go.mod copy and
/// its output): cgo on, the toolchain the module asks for, the modfile copy (`-mod=mod`: go.sum
/// may gain what only the driver imports), linked statically.
fn go_build_command(work: &Path, toolchain: Option<&str>) -> Result<(GoEnv, Vec<String>)> {
    let mut env = vec![("CGO_ENABLED", "1".to_string())];
    if let Some(toolchain) = toolchain {
        env.push(("GOTOOLCHAIN", toolchain.to_string()));
    }
    let args = vec![
        format!("-modfile={}", path_str(&work.join("go.mod"))?),
        "-mod=mod".to_string(),
        "-o".to_string(),
        path_str(&work.join(BINARY))?,
        "-ldflags".to_string(),
        Versions::sample_device_plugin_ldflags().to_string(),
        PACKAGE.to_string(),
    ];
    Ok((env, args))
}

/// The lines of `after` that `before` lacks.
fn changed_lines(before: &str, after: &str) -> Vec<String> {
    let old: BTreeSet<&str> = before.lines().map(str::trim).collect();
    after.lines().map(str::trim).filter(|l| !l.is_empty() && !old.contains(l)).map(String::from).collect()
}

/// The modules whose source go.sum gained (`module version`; their go.mod hashes are left out).
fn fetched_modules(before: &str, after: &str) -> Vec<String> {
    changed_lines(before, after)
        .iter()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (module, version) = (fields.next()?, fields.next()?);
            (!version.ends_with("/go.mod")).then(|| format!("{module} {version}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_go_sum_gained_is_named_by_module_and_version() {
        let before = "a.io/x v1.0.0 h1:aaa=\na.io/x v1.0.0/go.mod h1:bbb=\n";
        let after = "a.io/x v1.0.0 h1:aaa=\na.io/x v1.0.0/go.mod h1:bbb=\ntags.cncf.io/container-device-interface/specs-go v1.1.0 h1:QRZ=\ntags.cncf.io/container-device-interface/specs-go v1.1.0/go.mod h1:u86=\n";
        assert_eq!(
            fetched_modules(before, after),
            ["tags.cncf.io/container-device-interface/specs-go v1.1.0"]
        );
        assert!(fetched_modules(before, before).is_empty());
        assert_eq!(changed_lines("require (\n\ta v1\n)", "require (\n\ta v2\n)"), ["a v2"]);
    }

    #[test]
    fn the_cache_key_follows_the_module_and_the_go_version() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let mut versions = Versions::read(&layout).unwrap();
        fs::write(dir.path().join("go.mod"), "module m\n").unwrap();
        versions.kube.dir = dir.path().to_path_buf();
        let (root, key) = cache_dir(&layout, &versions, "go1.26.8").unwrap();
        assert_eq!(root, layout.cache.join("upstream-driver"));
        assert!(key.starts_with(&format!("{}-", versions.kubernetes)), "{key}");
        assert_ne!(cache_dir(&layout, &versions, "go1.27.0").unwrap().1, key);
        fs::write(dir.path().join("go.sum"), "m v1 h1:x=\n").unwrap();
        assert_ne!(cache_dir(&layout, &versions, "go1.26.8").unwrap().1, key);
    }

    #[test]
    fn the_go_build_uses_the_module_copy_and_links_statically() {
        let (env, args) = go_build_command(Path::new("/w"), Some("go1.26.8")).unwrap();
        assert_eq!(env, [("CGO_ENABLED", "1".to_string()), ("GOTOOLCHAIN", "go1.26.8".to_string())]);
        assert_eq!(&args[..4], ["-modfile=/w/go.mod", "-mod=mod", "-o", "/w/dra-test-driver"]);
        assert_eq!(args[4], "-ldflags");
        assert_eq!(args[5], Versions::sample_device_plugin_ldflags());
        assert!(args[5].contains("-static"), "{}", args[5]);
        assert_eq!(args.last().map(String::as_str), Some(PACKAGE));
        let (env, _) = go_build_command(Path::new("/w"), None).unwrap();
        assert_eq!(env, [("CGO_ENABLED", "1".to_string())]);
    }

    #[test]
    fn a_checkout_is_refused_in_one_sentence() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let mut versions = Versions::read(&layout).unwrap();
        versions.kube.checkout = Some("/src/kubernetes".into());
        let err = ensure(&layout, &versions).unwrap_err().to_string();
        assert!(err.contains("built from a released k8s.io/kubernetes module"), "{err}");
    }
}
