//! Which kind binary the provider runs: the kind on PATH when it has the wanted version
//! (`--kind-version`, default [`KIND_VERSION`]), else the one in dra-e2e's cache,
//! `<cache>/kind/<version>/kind`, installed there with `go install sigs.k8s.io/kind@<version>`
//! (GOBIN) the first time it is needed. `--kind-from-path` insists on the kind on PATH: then a
//! missing kind or another version is an error instead of an install.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use tracing::{debug, info};

use super::{
    KIND_VERSION, QUICK_TIMEOUT,
    host::{Host, find_program},
    kind_semver, kind_version_cmd, parse_kind_version, same_version,
};
use crate::{progress::Step, usage::UsageError};

/// How long `go install sigs.k8s.io/kind@V` may take (a cold module cache downloads and builds).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// `v0.33.0` for `0.33.0` or `v0.33.0`; anything but a semantic version is a [`UsageError`].
pub fn normalize_version(version: &str) -> Result<String, UsageError> {
    match kind_semver(version) {
        Some(semver) => Ok(format!("v{semver}")),
        None => Err(UsageError::new(format!(
            "{version:?} is not a kind version: give one like {KIND_VERSION} to --kind-version (KIND_VERSION)"
        ))),
    }
}

/// Where the cache keeps kind `version`.
pub fn cached_path(cache: &Path, version: &str) -> PathBuf {
    cache.join("kind").join(version).join("kind")
}

/// The install command as one shell line (what the progress line shows).
pub fn install_line(version: &str, gobin: &Path) -> String {
    format!("GOBIN={} go install sigs.k8s.io/kind@{version}", super::shell_quote(gobin.as_os_str()))
}

/// The version `kind version` reports for the binary at `kind`.
async fn version_of(kind: &Path, host: &Host) -> Result<String> {
    let mut command = tokio::process::Command::new(kind);
    command.args(&kind_version_cmd().args).stdin(Stdio::null()).kill_on_drop(true);
    if let Some(path) = &host.path {
        command.env("PATH", path);
    }
    let output = tokio::time::timeout(QUICK_TIMEOUT, command.output())
        .await
        .map_err(|_| anyhow::anyhow!("`{} version` did not answer within {QUICK_TIMEOUT:?}", kind.display()))?
        .with_context(|| format!("cannot run {}", kind.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    parse_kind_version(&text)
        .map(str::to_owned)
        .with_context(|| format!("cannot read the version in `{} version` output {text:?}", kind.display()))
}

/// The kind binary to run; see the module documentation.
pub(super) async fn resolve(host: &Host, wanted: Option<&str>, from_path: bool) -> Result<PathBuf> {
    let version = normalize_version(wanted.unwrap_or(KIND_VERSION))?;
    let install = format!("`go install sigs.k8s.io/kind@{version}`");
    let reason = match find_program("kind", host.path.as_deref()) {
        Some(kind) => {
            let found = version_of(&kind, host).await?;
            if same_version(&found, &version) {
                info!("using kind {found} ({})", kind.display());
                return Ok(kind);
            }
            if from_path {
                return Err(UsageError::new(format!(
                    "kind {found} is on PATH ({}) but {version} is required (--kind-version / KIND_VERSION) and \
                     --kind-from-path forbids installing it: install it with {install} or drop --kind-from-path.",
                    kind.display()
                ))
                .into());
            }
            format!("the kind on PATH is {found}")
        }
        None if from_path => {
            return Err(UsageError::new(format!(
                "kind was not found on PATH and --kind-from-path forbids installing it: install it with {install} \
                 (and put $(go env GOPATH)/bin on PATH) or drop --kind-from-path."
            ))
            .into());
        }
        None => "kind is not on PATH".to_string(),
    };

    let cached = cached_path(&host.cache, &version);
    if cached.is_file() {
        match version_of(&cached, host).await {
            Ok(found) if same_version(&found, &version) => {
                info!("using kind {found} from the cache ({}; {reason})", cached.display());
                return Ok(cached);
            }
            other => debug!("the cached kind at {} is not {version}: {other:?}", cached.display()),
        }
    }
    let Some(go) = find_program("go", host.path.as_deref()) else {
        return Err(UsageError::new(format!(
            "kind {version} is needed and {reason}, and Go is not on PATH to install it: install Go 1.26 \
             (https://go.dev/dl/) or put kind {version} on PATH."
        ))
        .into());
    };
    let gobin = cached.parent().context("the cache path has no parent")?.to_path_buf();
    std::fs::create_dir_all(&gobin).with_context(|| format!("create {}", gobin.display()))?;
    let step = Step::start(format!("install kind {version} ({reason}): {}", install_line(&version, &gobin)));
    let mut command = tokio::process::Command::new(&go);
    command
        .args(["install", &format!("sigs.k8s.io/kind@{version}")])
        .env("GOBIN", &gobin)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(path) = &host.path {
        command.env("PATH", path);
    }
    let status = tokio::time::timeout(INSTALL_TIMEOUT, command.status())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "`go install sigs.k8s.io/kind@{version}` did not finish within {INSTALL_TIMEOUT:?}"
            )
        })?
        .with_context(|| format!("cannot run {}", go.display()))?;
    if !status.success() {
        step.finish("failed");
        bail!("`go install sigs.k8s.io/kind@{version}` failed ({status}); see its output above");
    }
    let found = version_of(&cached, host).await?;
    if !same_version(&found, &version) {
        step.finish("failed");
        bail!("{} reports kind {found} after installing {version}", cached.display());
    }
    step.done();
    Ok(cached)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn versions_are_normalized_or_refused() {
        assert_eq!(normalize_version("0.33.0").unwrap(), "v0.33.0");
        assert_eq!(normalize_version("v0.34.0-alpha.1").unwrap(), "v0.34.0-alpha.1");
        for bad in ["", "latest", "v0.33.0; rm -rf /", "main", "0.33", "vv0.33.0"] {
            let err = normalize_version(bad).unwrap_err().to_string();
            assert!(err.contains("is not a kind version"), "{err}");
        }
        assert_eq!(
            install_line("v0.33.0", Path::new("/root/.cache/dra-e2e/kind/v0.33.0")),
            "GOBIN=/root/.cache/dra-e2e/kind/v0.33.0 go install sigs.k8s.io/kind@v0.33.0"
        );
    }
}
