//! Where the repository is: every command finds kind.yaml, the Go modules and the manifests
//! relative to it.

use std::path::PathBuf;

/// The repository root (the workspace that holds xtask).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}
