//! The Kubernetes checkout the mutants go into: the user's (`--k8s-source DIR`), or one assembled
//! from Go's module cache for a release (k8s.io/kubernetes@V copied and made writable, its
//! staging modules at their published versions linked under `staging/src/k8s.io`), which is what
//! a checkout of the release tag builds. And putting one mutant in and taking it out again: the
//! original is kept beside the file while the mutant is in, so a run killed in the middle leaves
//! nothing the next run does not put back first.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    common::{kube_version::KubeVersion, layout::Layout},
    gomod,
    mutants::catalogue::Mutant,
};

/// The suffix of the copy of a file's original text while a mutant is in it.
const ORIGINAL_SUFFIX: &str = ".dra-e2e-original";

/// The checkout of release `version` assembled from Go's module cache under the cache directory
/// (once; later runs find it).
pub fn assemble(layout: &Layout, version: &KubeVersion) -> Result<PathBuf> {
    let dir = layout.cache.join("mutants").join(format!("kubernetes-{version}"));
    let complete = dir.join(".dra-e2e-complete");
    if complete.exists() {
        return Ok(dir);
    }
    let step = crate::progress::Step::start(format!(
        "assemble a Kubernetes {version} checkout from Go's module cache in {}",
        dir.display()
    ));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("remove the partial checkout {}", dir.display()))?;
    }
    let module = gomod::download(version)?;
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    run(Command::new("cp").arg("-a").arg(&module.dir).arg(&dir))?;
    run(Command::new("chmod").args(["-R", "u+w"]).arg(&dir))?;
    let staging_version = version.staging().to_string();
    let toolchain = gomod::toolchain_for(&module.go_mod)?;
    let staging = gomod::staging_modules(&module.go_mod);
    for (path, module_dir) in download_modules(&staging, &staging_version, &toolchain.env)? {
        let link = dir.join("staging/src").join(&path);
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        std::os::unix::fs::symlink(&module_dir, &link)
            .with_context(|| format!("link {} to {}", link.display(), module_dir.display()))?;
    }
    fs::write(&complete, "")?;
    step.finish(&format!("done ({} staging modules at {staging_version})", staging.len()));
    Ok(dir)
}

/// `go mod download -json M@version…` for `modules`, from an empty directory: each module's path
/// and extracted directory.
fn download_modules(modules: &[&str], version: &str, toolchain: &str) -> Result<Vec<(String, PathBuf)>> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Download {
        path: String,
        dir: Option<PathBuf>,
        error: Option<String>,
    }
    let outside = tempfile::tempdir().context("create an empty directory")?;
    let out = crate::common::go_retry::go_output_with_retries("go mod download", || {
        let mut command = Command::new("go");
        command
            .args(["mod", "download", "-json"])
            .args(modules.iter().map(|m| format!("{m}@{version}")))
            .current_dir(outside.path())
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", toolchain);
        command
    })?;
    let mut found = Vec::new();
    for item in serde_json::Deserializer::from_slice(&out.stdout).into_iter::<Download>() {
        let item = item.context("read go mod download -json's output")?;
        match (item.dir, item.error) {
            (Some(dir), None) => found.push((item.path, dir)),
            (_, error) => bail!(
                "go mod download {}@{version}: {}",
                item.path,
                error.unwrap_or_else(|| "no directory".to_owned())
            ),
        }
    }
    ensure!(
        found.len() == modules.len(),
        "go mod download found {} of {} staging modules: {}",
        found.len(),
        modules.len(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(found)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("run {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed ({status})");
    Ok(())
}

/// Puts back every original a killed run left beside its file.
pub fn restore_leftovers(checkout: &Path, mutants: &[Mutant]) -> Result<()> {
    for mutant in mutants {
        let file = checkout.join(mutant.file);
        let original = with_suffix(&file);
        if original.exists() {
            tracing::warn!(
                "putting back {} (a mutant of an interrupted run was still in it)",
                file.display()
            );
            fs::rename(&original, &file).with_context(|| format!("put back {}", file.display()))?;
        }
    }
    Ok(())
}

/// Checks that `mutant` can go into `checkout`: its original text is in its file exactly once.
pub fn check(checkout: &Path, mutant: &Mutant) -> Result<()> {
    let file = checkout.join(mutant.file);
    let text = fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
    let count = text.matches(mutant.original).count();
    ensure!(
        count == 1,
        "mutant {} does not fit this checkout: {} holds its original text {:?} {count} times (it must once)",
        mutant.name,
        mutant.file,
        mutant.original
    );
    Ok(())
}

/// A mutant in its file; dropping it puts the original back.
#[derive(Debug)]
pub struct Applied {
    file: PathBuf,
    original: PathBuf,
}

/// Puts `mutant` into `checkout` (the original kept beside the file until [`Applied`] is dropped).
pub fn apply(checkout: &Path, mutant: &Mutant) -> Result<Applied> {
    check(checkout, mutant)?;
    let file = checkout.join(mutant.file);
    let text = fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
    let original = with_suffix(&file);
    fs::write(&original, &text).with_context(|| format!("write {}", original.display()))?;
    let applied = Applied { file, original };
    // Written beside and renamed over: a file hard-linked into Go's module cache stays untouched.
    let next = with_suffix_str(&applied.file, ".dra-e2e-mutant");
    fs::write(&next, text.replacen(mutant.original, mutant.mutated, 1))
        .with_context(|| format!("write {}", next.display()))?;
    fs::rename(&next, &applied.file).with_context(|| format!("replace {}", applied.file.display()))?;
    Ok(applied)
}

impl Drop for Applied {
    fn drop(&mut self) {
        if let Err(e) = fs::rename(&self.original, &self.file) {
            tracing::error!(
                "could not put back {} from {}: {e}",
                self.file.display(),
                self.original.display()
            );
        }
    }
}

fn with_suffix(file: &Path) -> PathBuf {
    with_suffix_str(file, ORIGINAL_SUFFIX)
}

fn with_suffix_str(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::mutants::catalogue::Lane;

    /// A mutant of `pkg/a.go`'s `x > 1`, for tests.
    pub(in crate::mutants) const MUTANT: Mutant = Mutant {
        name: "flip",
        component: "test",
        file: "pkg/a.go",
        original: "x > 1",
        mutated: "x > 2",
        bug: "off by one",
        lane: Lane::Kubelet,
    };

    fn checkout(text: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("pkg")).unwrap();
        fs::write(dir.path().join("pkg/a.go"), text).unwrap();
        dir
    }

    #[test]
    fn a_mutant_goes_in_and_comes_out() {
        let dir = checkout("if x > 1 {}\n");
        let file = dir.path().join("pkg/a.go");
        let applied = apply(dir.path(), &MUTANT).unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "if x > 2 {}\n");
        drop(applied);
        assert_eq!(fs::read_to_string(&file).unwrap(), "if x > 1 {}\n");
        assert_eq!(fs::read_dir(dir.path().join("pkg")).unwrap().count(), 1, "nothing left beside it");
    }

    #[test]
    fn a_killed_run_s_mutant_is_put_back_first() {
        let dir = checkout("if x > 1 {}\n");
        let applied = apply(dir.path(), &MUTANT).unwrap();
        std::mem::forget(applied); // as if killed
        restore_leftovers(dir.path(), &[MUTANT]).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("pkg/a.go")).unwrap(), "if x > 1 {}\n");
    }

    #[test]
    fn a_mutant_whose_text_is_missing_or_repeated_does_not_fit() {
        for text in ["if y > 1 {}\n", "x > 1; x > 1\n"] {
            let dir = checkout(text);
            let err = apply(dir.path(), &MUTANT).unwrap_err().to_string();
            assert!(err.contains("mutant flip does not fit"), "{err}");
            assert_eq!(fs::read_to_string(dir.path().join("pkg/a.go")).unwrap(), text);
        }
    }
}
