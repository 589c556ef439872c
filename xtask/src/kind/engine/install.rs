//! Finding the Docker engine's programs, and installing Debian's `docker.io` when there is no
//! dockerd (as root on Debian only; anywhere else the user is told what to install).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::super::host::find_program;
use crate::usage::UsageError;

/// How long `apt-get` may take (update and install together).
const APT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Where Debian puts dockerd, runc and containerd, searched after PATH (a non-login root shell
/// may lack the sbin directories).
const SYSTEM_DIRS: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// PATH followed by the system directories: what the engine searches and what dockerd gets.
pub fn search_path() -> OsString {
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if !path.is_empty() {
        path.push(":");
    }
    path.push(SYSTEM_DIRS);
    path
}

/// The first `program` on [`search_path`].
pub fn find(program: &str) -> Option<PathBuf> {
    find_program(program, Some(&search_path()))
}

/// The sentence for a machine without dockerd where this run cannot install it.
pub fn no_dockerd_sentence(root: bool, debian: bool) -> String {
    let why = if !debian {
        "this is not Debian with apt-get, where it would install docker.io"
    } else if !root {
        "installing Debian's docker.io needs root"
    } else {
        "apt-get did not provide it"
    };
    format!(
        "there is no dockerd on this machine and `cargo xtask docker up` cannot install one ({why}): install \
         Docker Engine (https://docs.docker.com/engine/install/) or run as root on Debian, or use `--provider \
         local`, which needs no Docker."
    )
}

/// Whether this is Debian (or a derivative) with apt-get.
pub fn is_debian() -> bool {
    Path::new("/etc/debian_version").is_file() && find("apt-get").is_some()
}

/// dockerd, installed with `apt-get install docker.io` first if the machine has none (as root
/// on Debian; says so). Elsewhere a missing dockerd is a [`UsageError`].
pub async fn ensure_dockerd() -> Result<PathBuf> {
    if let Some(dockerd) = find("dockerd") {
        return Ok(dockerd);
    }
    let root = rustix::process::geteuid().is_root();
    let debian = is_debian();
    if !(root && debian) {
        return Err(UsageError::new(no_dockerd_sentence(root, debian)).into());
    }
    eprintln!(
        "==> there is no dockerd on this machine: installing Debian's docker.io with apt-get \
         (its system services are not started; the engine runs with its own data root and socket)"
    );
    let _guard = NoServiceStarts::new()?;
    let install = async |update: bool| -> Result<bool> {
        if update {
            run_apt(&["update", "-qq"]).await?;
        }
        run_apt(&["install", "-y", "-qq", "--no-install-recommends", "docker.io"]).await
    };
    if !install(false).await? && !install(true).await? {
        bail!(
            "`apt-get install docker.io` failed (see its output above); install Docker Engine yourself and retry"
        );
    }
    find("dockerd")
        .context("apt-get installed docker.io, but there is still no dockerd on PATH or in /usr/sbin")
}

async fn run_apt(args: &[&str]) -> Result<bool> {
    let mut command = tokio::process::Command::new("apt-get");
    command
        .args(["-o", "Acquire::Retries=3"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .kill_on_drop(true);
    let status = tokio::time::timeout(APT_TIMEOUT, command.status())
        .await
        .map_err(|_| anyhow::anyhow!("`apt-get {}` did not finish within {APT_TIMEOUT:?}", args.join(" ")))?
        .with_context(|| format!("cannot run `apt-get {}`", args.join(" ")))?;
    Ok(status.success())
}

/// `/usr/sbin/policy-rc.d` answering 101 ("action forbidden") while it lives, so that installing
/// docker.io starts neither the system's dockerd nor its containerd (which would change the
/// host's network); removed again if this run created it.
struct NoServiceStarts {
    created: Option<PathBuf>,
}

impl NoServiceStarts {
    const PATH: &str = "/usr/sbin/policy-rc.d";

    fn new() -> Result<Self> {
        let path = Path::new(Self::PATH);
        if path.exists() {
            return Ok(Self { created: None });
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(
            path,
            "#!/bin/sh\n# dra-e2e: no service starts while docker.io is installed\nexit 101\n",
        )
        .with_context(|| format!("write {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("make {} executable", path.display()))?;
        Ok(Self { created: Some(path.to_path_buf()) })
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if let Some(path) = &self.created {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_dockerd_the_sentence_says_why_and_what_to_do() {
        let not_root = no_dockerd_sentence(false, true);
        assert_eq!(
            not_root,
            "there is no dockerd on this machine and `cargo xtask docker up` cannot install one (installing \
             Debian's docker.io needs root): install Docker Engine (https://docs.docker.com/engine/install/) or run \
             as root on Debian, or use `--provider local`, which needs no Docker."
        );
        assert!(no_dockerd_sentence(true, false).contains("(this is not Debian with apt-get"));
        for text in [not_root, no_dockerd_sentence(false, false)] {
            assert_eq!(text.matches(". ").count(), 0, "one sentence: {text}");
            assert!(text.ends_with('.'));
        }
    }

    #[test]
    fn the_search_path_ends_with_the_system_directories() {
        let path = search_path();
        assert!(path.to_string_lossy().ends_with("/usr/sbin:/usr/bin:/sbin:/bin"), "{path:?}");
        assert!(find("sh").is_some());
        assert!(find("no-such-program-dra-e2e").is_none());
    }
}
