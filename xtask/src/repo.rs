//! Where the repository is (every command finds kind.yaml, the Go modules and the manifests
//! relative to it), and the running xtask binary.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The repository root (the workspace that holds xtask).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Copies the running xtask binary to `to` (for processes that outlive it or run it again). It is
/// read through /proc/self/exe, not `current_exe()`: cargo may have replaced (deleted) the file
/// this process runs from since it started (`cargo xtask test` rebuilds xtask), and the open link
/// still reads the running binary.
pub fn copy_running_xtask(to: &Path) -> anyhow::Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(to); // a copy of an earlier run may be running: replace, not overwrite
    std::fs::copy("/proc/self/exe", to)
        .with_context(|| format!("copy the running xtask (/proc/self/exe) to {}", to.display()))?;
    Ok(())
}

/// The variables cargo sets for the process it runs (`cargo xtask` runs xtask with them): the
/// names found in this process's environment. A cargo that xtask starts must not inherit them:
/// build scripts that track them (ring's tracks `CARGO_MANIFEST_DIR`) would run again and
/// rebuild ring, rustls, kube and the workspace, and the next plain `cargo build` or `cargo
/// xtask` (which builds xtask without them) would rebuild them back: about a minute on two cores
/// for every `cargo xtask e2e`. `CARGO`, the path of cargo itself, stays.
pub fn run_only_cargo_vars() -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| is_run_only_cargo_var(&name.to_string_lossy()))
        .collect()
}

/// Whether `name` is a variable cargo sets only for a process it runs (see [`run_only_cargo_vars`]).
fn is_run_only_cargo_var(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
            "OUT_DIR",
        ]
        .contains(&name)
}

/// The cargo that runs xtask (`$CARGO`, else `cargo` from PATH).
pub fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// A command running [`cargo_program`] in the workspace at `repo`, without the variables cargo
/// set for xtask itself ([`run_only_cargo_vars`]).
pub fn cargo_command(repo: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(cargo_program());
    for name in run_only_cargo_vars() {
        cmd.env_remove(name);
    }
    cmd.current_dir(repo);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_cargo_sets_for_a_run_are_left_out_but_cargo_s_own_path_stays() {
        for name in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "CARGO_BIN_NAME", "CARGO_CRATE_NAME", "OUT_DIR"]
        {
            assert!(is_run_only_cargo_var(name), "{name}");
        }
        for name in ["CARGO", "CARGO_HOME", "CARGO_TARGET_DIR", "CARGO_TERM_COLOR", "CARGO_INCREMENTAL"] {
            assert!(!is_run_only_cargo_var(name), "{name}");
        }
        // `cargo test` sets CARGO_MANIFEST_DIR for this test process, as `cargo xtask` does for xtask.
        let left_out = run_only_cargo_vars();
        assert!(left_out.iter().any(|n| n == "CARGO_MANIFEST_DIR"), "{left_out:?}");
        let cmd = cargo_command(Path::new("."));
        let removed: Vec<_> =
            cmd.get_envs().filter(|(_, v)| v.is_none()).map(|(k, _)| k.to_owned()).collect();
        assert!(removed.iter().any(|n| n == "CARGO_MANIFEST_DIR"), "{removed:?}");
    }
}
