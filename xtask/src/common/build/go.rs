//! The Go toolchain: `go version`, `go build`, and what one `go build` into the cache is.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::common::go_retry::{PAUSES, go_output_with_retries, run_teeing_stderr, with_retries};

/// One `go build` into the cache: what it makes, from which module and with which flags. Every
/// build writes into a directory (`-o DIR/`), so each output is named after its package.
pub(super) struct GoBuild {
    /// What the build makes, as its progress step says it.
    pub(super) what: String,
    /// The Go module it runs in.
    pub(super) module: PathBuf,
    /// The environment on top of ours (`CGO_ENABLED`, `GOTOOLCHAIN`).
    pub(super) env: Vec<(&'static str, String)>,
    /// The arguments after `go build -o DIR/`.
    pub(super) args: Vec<String>,
    /// The files it writes into `DIR/`.
    pub(super) outputs: Vec<&'static str>,
    /// Print the compiler's output only when the build fails.
    pub(super) quiet: bool,
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

/// `go build ARGS` in `dir` with `env` on top of ours, its output shown as it comes; run again
/// when a module download broke on the way ([`with_retries`]).
pub(crate) fn go_build(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<()> {
    let out = with_retries(&format!("go build in {}", dir.display()), &PAUSES, || {
        let mut command = go_build_command(dir, env, args);
        command.stdout(Stdio::inherit());
        run_teeing_stderr(command)
    })?;
    if !out.status.success() {
        bail!(
            "go build {} failed in {} ({}); see the output above",
            args.join(" "),
            dir.display(),
            out.status
        );
    }
    Ok(())
}

/// [`go_build`] with the output captured and printed only when the build fails.
pub(crate) fn go_build_quiet(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<()> {
    let out = go_output_with_retries(&format!("go build in {}", dir.display()), || {
        go_build_command(dir, env, args)
    })?;
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

fn go_build_command(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut command = Command::new("go");
    command.arg("build").args(args).envs(env.iter().copied()).current_dir(dir);
    command
}

/// `p` as a string, or an error when it is not UTF-8 (Go takes paths as arguments).
pub(crate) fn path_str(p: &Path) -> Result<String> {
    p.to_str().map(String::from).with_context(|| format!("path is not UTF-8: {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_go_is_one_clear_sentence() {
        let err = go_version_of("go-that-does-not-exist").unwrap_err().to_string();
        assert!(err.contains("`go` is not on PATH"), "{err}");
        assert!(err.contains("install Go"), "{err}");
        assert!(!err.contains('\n'), "one sentence: {err}");
    }
}
