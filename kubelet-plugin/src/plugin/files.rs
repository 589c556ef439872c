//! File operations for CDI spec files and device metadata files.
//!
//! The plugin needs only five primitives, so that an implementation can run
//! them anywhere: locally ([`LocalDirFiles`]) or inside the proxy pod through
//! `exec` (`sh`/`base64` for write, `mv` for rename, `rm -f` for remove, `mkdir -p`, `rm -rf`).
//! Atomic replacement (write `<name>.tmp`, then rename) is done by the plugin
//! on top of these primitives, see [`write_atomically`].

use std::{
    fmt,
    path::{Path, PathBuf},
};

use async_trait::async_trait;

/// A failed file operation.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {reason}")]
pub struct FileOpsError {
    /// The operation, e.g. `write`.
    pub op: &'static str,
    /// The path it was applied to.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

impl FileOpsError {
    /// An error for `op` on `path`.
    pub fn new(op: &'static str, path: &Path, reason: impl fmt::Display) -> Self {
        FileOpsError { op, path: path.display().to_string(), reason: reason.to_string() }
    }
}

/// Where the plugin writes CDI spec files.
#[async_trait]
pub trait FileOps: Send + Sync + fmt::Debug + 'static {
    /// Creates or overwrites `path` with `contents` (mode 0644).
    async fn write(&self, path: &Path, contents: &[u8]) -> Result<(), FileOpsError>;

    /// Renames `from` to `to`, replacing `to` if it exists.
    async fn rename(&self, from: &Path, to: &Path) -> Result<(), FileOpsError>;

    /// Removes `path`. A missing file is success.
    async fn remove(&self, path: &Path) -> Result<(), FileOpsError>;

    /// Creates the directory `path` and its missing parents (mode 0755).
    async fn mkdir_all(&self, path: &Path) -> Result<(), FileOpsError>;

    /// Removes the directory `path` with everything in it. A missing directory is success.
    async fn remove_all(&self, path: &Path) -> Result<(), FileOpsError>;
}

/// The temporary name used while writing `path`: `<path>.tmp`.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// Writes `<path>.tmp` and renames it to `path`, so readers never see a
/// partial file. On failure the temporary file is removed (best effort).
pub async fn write_atomically(files: &dyn FileOps, path: &Path, contents: &[u8]) -> Result<(), FileOpsError> {
    let tmp = tmp_path(path);
    let result = match files.write(&tmp, contents).await {
        Ok(()) => files.rename(&tmp, path).await,
        Err(e) => Err(e),
    };
    if result.is_err()
        && let Err(e) = files.remove(&tmp).await
    {
        tracing::warn!(path = %tmp.display(), error = %e, "could not remove temporary file");
    }
    result
}

/// File operations on the local file system (tests, or a plugin that runs
/// on the node itself).
#[derive(Clone, Debug, Default)]
pub struct LocalDirFiles;

impl LocalDirFiles {
    /// Local file operations.
    pub fn new() -> Self {
        LocalDirFiles
    }
}

#[async_trait]
impl FileOps for LocalDirFiles {
    async fn write(&self, path: &Path, contents: &[u8]) -> Result<(), FileOpsError> {
        use tokio::io::AsyncWriteExt as _;
        let write = async {
            let mut file = tokio::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(path)
                .await?;
            file.write_all(contents).await?;
            file.flush().await
        };
        write.await.map_err(|e| FileOpsError::new("write", path, e))
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), FileOpsError> {
        tokio::fs::rename(from, to)
            .await
            .map_err(|e| FileOpsError::new("rename", from, format!("to {}: {e}", to.display())))
    }

    async fn remove(&self, path: &Path) -> Result<(), FileOpsError> {
        match tokio::fs::remove_file(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(FileOpsError::new("remove", path, e)),
        }
    }

    async fn mkdir_all(&self, path: &Path) -> Result<(), FileOpsError> {
        let mut builder = tokio::fs::DirBuilder::new();
        builder.recursive(true).mode(0o755);
        builder.create(path).await.map_err(|e| FileOpsError::new("mkdir", path, e))
    }

    async fn remove_all(&self, path: &Path) -> Result<(), FileOpsError> {
        match tokio::fs::remove_dir_all(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(FileOpsError::new("remove all", path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_write_rename_remove() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomically(&LocalDirFiles, &path, b"{}").await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert!(!tmp_path(&path).exists());
        LocalDirFiles.remove(&path).await.unwrap();
        assert!(!path.exists());
        // Missing file: still success.
        LocalDirFiles.remove(&path).await.unwrap();
    }

    #[tokio::test]
    async fn local_mkdir_all_and_remove_all() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a").join("b");
        LocalDirFiles.mkdir_all(&deep).await.unwrap();
        LocalDirFiles.mkdir_all(&deep).await.unwrap();
        write_atomically(&LocalDirFiles, &deep.join("f"), b"x").await.unwrap();
        LocalDirFiles.remove_all(&dir.path().join("a")).await.unwrap();
        assert!(!dir.path().join("a").exists());
        LocalDirFiles.remove_all(&dir.path().join("a")).await.unwrap();
    }

    #[tokio::test]
    async fn failed_write_leaves_no_tmp() {
        let dir = tempfile::tempdir().unwrap();
        // The parent directory does not exist.
        let path = dir.path().join("missing").join("a.json");
        let err = write_atomically(&LocalDirFiles, &path, b"{}").await.unwrap_err();
        assert_eq!(err.op, "write");
        assert!(!tmp_path(&path).exists());
    }
}
