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
