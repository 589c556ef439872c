//! CDI spec and device metadata files written through a [`Runner`]: the proxy pod's `/cdi` is the node's
//! `/var/run/cdi`, where the container runtime reads them.

use std::{fmt, path::Path, sync::Arc};

use async_trait::async_trait;
use base64::Engine as _;

use super::{PodExecError, Runner};
use crate::plugin::{FileOps, FileOpsError};

/// Largest file [`PodFiles`] writes: its base64 form must fit into one exec argument (Linux
/// limits one argument to 128 KiB).
pub const MAX_FILE_SIZE: usize = 90 * 1024;

/// Decodes `$1` (base64) into the file `$2`, mode 0644 (upstream wrote through a heredoc; piping
/// stdin to `dd` sometimes wrote nothing, kubernetes#112834; argv avoids both stdin and quoting).
const WRITE_SCRIPT: &str = r#"umask 022 && printf '%s' "$1" | base64 -d > "$2""#;

/// Renames `$1` to `$2`; done already (`$1` gone, `$2` there) counts as done: a rename whose exec
/// stream broke after it ran is run again (see [`Runner::output`]).
const RENAME_SCRIPT: &str =
    r#"mv -f -- "$1" "$2" 2>/dev/null || { [ ! -e "$1" ] && [ -e "$2" ]; } || mv -f -- "$1" "$2""#;

/// [`FileOps`] through commands: write = `sh -c '… base64 -d > "$2"' sh <base64> <path>`,
/// rename = `mv -f -- <from> <to>` (done already counts as done), remove = `rm -f -- <path>`,
/// `mkdir -p -- <path>`, `rm -rf -- <path>`. Paths are separate arguments, never part of shell
/// text. Each may run twice (see [`Runner::output`]) and ends the same.
#[derive(Clone)]
pub struct PodFiles {
    runner: Arc<dyn Runner>,
}

impl fmt::Debug for PodFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodFiles").field("runner", &self.runner).finish()
    }
}

impl PodFiles {
    /// File operations run by `runner` (e.g. a [`PodExec`](super::PodExec) for the proxy pod).
    pub fn new(runner: Arc<dyn Runner>) -> Self {
        PodFiles { runner }
    }

    async fn run(&self, op: &'static str, path: &Path, argv: Vec<String>) -> Result<(), FileOpsError> {
        self.runner.checked(argv).await.map(drop).map_err(|e| FileOpsError::new(op, path, e))
    }
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

#[async_trait]
impl FileOps for PodFiles {
    async fn write(&self, path: &Path, contents: &[u8]) -> Result<(), FileOpsError> {
        if contents.len() > MAX_FILE_SIZE {
            return Err(FileOpsError::new(
                "write",
                path,
                PodExecError::TooLong {
                    command: "base64 -d".into(),
                    len: contents.len(),
                    limit: MAX_FILE_SIZE,
                },
            ));
        }
        let encoded = base64::engine::general_purpose::STANDARD.encode(contents);
        let argv = ["sh", "-c", WRITE_SCRIPT, "sh"]
            .into_iter()
            .map(String::from)
            .chain([encoded, arg(path)])
            .collect();
        self.run("write", path, argv).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), FileOpsError> {
        let argv = ["sh", "-c", RENAME_SCRIPT, "sh"]
            .into_iter()
            .map(String::from)
            .chain([arg(from), arg(to)])
            .collect();
        self.run("rename", from, argv).await
    }

    async fn remove(&self, path: &Path) -> Result<(), FileOpsError> {
        let argv = ["rm", "-f", "--"].into_iter().map(String::from).chain([arg(path)]).collect();
        self.run("remove", path, argv).await
    }

    async fn mkdir_all(&self, path: &Path) -> Result<(), FileOpsError> {
        let argv = ["mkdir", "-p", "--"].into_iter().map(String::from).chain([arg(path)]).collect();
        self.run("mkdir", path, argv).await
    }

    async fn remove_all(&self, path: &Path) -> Result<(), FileOpsError> {
        let argv = ["rm", "-rf", "--"].into_iter().map(String::from).chain([arg(path)]).collect();
        self.run("remove all", path, argv).await
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::{
        plugin::{tmp_path, write_atomically},
        podexec::LocalRunner,
    };

    #[tokio::test]
    async fn write_rename_remove_through_commands() {
        let dir = tempfile::tempdir().unwrap();
        // Quotes, spaces, a leading dash and `$` must reach the file system unchanged.
        let path = dir.path().join("-it's a $file.json");
        let files = PodFiles::new(Arc::new(LocalRunner::new()));
        let contents: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        write_atomically(&files, &path, &contents).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), contents);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
        assert!(!tmp_path(&path).exists());
        files.remove(&path).await.unwrap();
        assert!(!path.exists());
        files.remove(&path).await.unwrap();
        // Every operation may run twice and ends the same.
        let tmp = tmp_path(&path);
        files.write(&tmp, b"v").await.unwrap();
        files.write(&tmp, b"v").await.unwrap();
        files.rename(&tmp, &path).await.unwrap();
        files.rename(&tmp, &path).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"v");
        assert!(!tmp.exists());
        files.remove(&path).await.unwrap();
        // A rename of nothing to nothing is no rename.
        let err = files.rename(&tmp, &path).await.unwrap_err();
        assert_eq!(err.op, "rename");
        assert!(err.reason.contains("No such file"), "{err}");
        let deep = dir.path().join("-a b").join("c");
        files.mkdir_all(&deep).await.unwrap();
        write_atomically(&files, &deep.join("f"), b"x").await.unwrap();
        files.remove_all(&dir.path().join("-a b")).await.unwrap();
        assert!(!deep.exists());
        files.remove_all(&dir.path().join("-a b")).await.unwrap();
    }

    #[tokio::test]
    async fn failures_name_the_operation() {
        let dir = tempfile::tempdir().unwrap();
        let files = PodFiles::new(Arc::new(LocalRunner::new()));
        let missing = dir.path().join("missing").join("a.json");
        let err = files.write(&missing, b"{}").await.unwrap_err();
        assert_eq!(err.op, "write");
        assert!(err.reason.contains("exit code"), "{err}");
        let too_big = vec![0u8; MAX_FILE_SIZE + 1];
        let err = files.write(&dir.path().join("big"), &too_big).await.unwrap_err();
        assert!(err.reason.contains("too long"), "{err}");
    }
}
