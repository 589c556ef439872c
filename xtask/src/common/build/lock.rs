//! One build of the cache at a time: `cluster build` (in the background of `cargo xtask test`, or
//! by hand) and `cluster up` may both find binaries missing; the second waits for the first
//! instead of building the same binaries beside it, then finds them cached.

use std::{
    fs,
    io::Write as _,
    os::fd::AsFd as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use rustix::fs::{FlockOperation, flock};

/// The lock file of the cache key `key` in `bin_dir`, beside the key's directory (a few bytes
/// per key ever built; pruning never removes it, so no two builds can hold two files of a key).
pub fn lock_file(bin_dir: &Path, key: &str) -> std::path::PathBuf {
    bin_dir.join(format!("{key}.lock"))
}

/// How long a build waits for another one: a cold build of everything on two cores, with room.
pub const BUILD_LOCK_TIMEOUT: Duration = Duration::from_secs(45 * 60);

/// An exclusive lock on a file, released when dropped (the file stays: removing it would let a
/// third process lock a new file while the second holds the old one).
#[derive(Debug)]
pub struct BuildLock {
    _file: fs::File,
}

impl BuildLock {
    /// Locks `path` (made if missing), waiting at most `timeout` for its holder, whose PID the
    /// file names, and saying once that it waits.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<Self> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        let started = Instant::now();
        let mut said = false;
        loop {
            match flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {}
                Err(e) => return Err(e).with_context(|| format!("lock {}", path.display())),
            }
            let holder = fs::read_to_string(path).unwrap_or_default();
            if started.elapsed() >= timeout {
                bail!(
                    "another build (pid {}) still holds {} after {}: wait for it or stop it, then retry",
                    holder.trim(),
                    path.display(),
                    crate::progress::human(timeout)
                );
            }
            if !said {
                eprintln!(
                    "==> waiting for another build of the cluster's binaries (pid {}) to finish",
                    holder.trim()
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        file.set_len(0).with_context(|| format!("truncate {}", path.display()))?;
        write!(file, "{}", std::process::id()).with_context(|| format!("write {}", path.display()))?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_build_waits_for_the_first_and_times_out_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bin/.build.lock");
        let first = BuildLock::acquire(&path, Duration::from_secs(1)).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), std::process::id().to_string());
        // flock locks belong to the open file: a second open in this process conflicts too.
        let err = BuildLock::acquire(&path, Duration::from_millis(600)).unwrap_err();
        assert!(format!("{err}").contains(&format!("another build (pid {})", std::process::id())), "{err}");
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || BuildLock::acquire(&path, Duration::from_secs(30)).map(drop))
        };
        std::thread::sleep(Duration::from_millis(700));
        assert!(!waiter.is_finished(), "the second build did not wait");
        drop(first);
        waiter.join().unwrap().unwrap();
    }
}
