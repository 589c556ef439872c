//! The disk a run of `cargo xtask test` fills: the target directory, the build caches, the
//! clusters' state and the kind engine's images and volumes. The run watches the free space of
//! every filesystem it writes to: the step table shows the lowest free space during each step,
//! and below [`FLOOR`] no further step starts (the clusters are still taken down, which frees
//! their part). A full disk otherwise fails the run without saying so: every process that writes
//! its log, cargo and this one included, dies at its next write, and CI's log ends mid-step.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

/// Free space under which no further step starts: enough left for the clean-up's own writes
/// and the step table.
pub const FLOOR: u64 = 2 << 30;

/// How often the watch looks.
const EVERY: Duration = Duration::from_secs(2);

/// No sample yet.
const NONE: u64 = u64::MAX;

/// Where the run writes: the target directory, the build cache (`~/.cache/dra-e2e`), the local
/// cluster's state (`/var/lib/dra-e2e/local`) and what sits beside it (the kind engine's data),
/// Go's caches, and the temporary directory.
pub fn paths(repo: &Path) -> Vec<PathBuf> {
    let mut paths = vec![crate::e2e::target_dir(repo), std::env::temp_dir()];
    if let Ok(layout) = crate::common::layout::Layout::from_env(repo.to_path_buf()) {
        paths.extend(layout.state.parent().map(Path::to_path_buf));
        paths.push(layout.cache);
    }
    if let Some(home) = std::env::var_os("HOME") {
        paths.push(PathBuf::from(home).join("go"));
    }
    paths
}

/// One filesystem: the first of the run's paths on it (or its nearest existing ancestor).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Filesystem {
    device: u64,
    path: PathBuf,
}

/// The distinct filesystems that hold `paths`, each named by the first path on it; a path that
/// does not exist yet counts by its nearest existing ancestor.
fn filesystems(paths: &[PathBuf]) -> Vec<Filesystem> {
    let mut found: Vec<Filesystem> = Vec::new();
    for path in paths {
        let Some(existing) = path.ancestors().find(|p| p.exists()) else { continue };
        let Ok(stat) = rustix::fs::stat(existing) else { continue };
        if !found.iter().any(|fs| fs.device == stat.st_dev) {
            found.push(Filesystem { device: stat.st_dev, path: existing.to_path_buf() });
        }
    }
    found
}

/// The bytes of `path`'s filesystem available to this process (what `df` shows as Avail).
fn available(path: &Path) -> Option<u64> {
    let vfs = rustix::fs::statvfs(path).ok()?;
    Some(vfs.f_bavail.saturating_mul(vfs.f_frsize))
}

/// The filesystem with the least free space now, and that space.
fn least_free(filesystems: &[Filesystem]) -> Option<(u64, &Path)> {
    filesystems
        .iter()
        .filter_map(|fs| Some((available(&fs.path)?, fs.path.as_path())))
        .min_by_key(|(free, _)| *free)
}

/// `bytes` in GiB, one decimal: `35.2 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// The watch over the run's filesystems, sampling every [`EVERY`] until dropped.
pub struct DiskWatch {
    filesystems: Vec<Filesystem>,
    /// The lowest free space since the last [`DiskWatch::take_lowest`].
    lowest: Arc<AtomicU64>,
    /// The sentence that says the disk fell below the floor, once it did.
    low: Arc<OnceLock<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl DiskWatch {
    /// Watches the filesystems of `paths`; below `floor` it prints why once, sets `stop` (no
    /// further step starts) and [`DiskWatch::fell_below_floor`] says so from then on.
    pub fn start(paths: &[PathBuf], floor: u64, stop: Arc<AtomicBool>) -> Self {
        let filesystems = filesystems(paths);
        let lowest = Arc::new(AtomicU64::new(NONE));
        let low = Arc::new(OnceLock::new());
        let task = {
            let (filesystems, lowest, low) = (filesystems.clone(), lowest.clone(), low.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(EVERY);
                loop {
                    every.tick().await;
                    let Some((free, path)) = least_free(&filesystems) else { continue };
                    lowest.fetch_min(free, Ordering::SeqCst);
                    if free < floor && low.get().is_none() {
                        let why = format!(
                            "the disk of {} has {} free, under the run's floor of {}: no further step starts \
                             (free space, for example an old target directory or ~/.cache/go-build, and run again)",
                            path.display(),
                            gib(free),
                            gib(floor)
                        );
                        eprintln!("==> {why}");
                        stop.store(true, Ordering::SeqCst);
                        let _ = low.set(why);
                    }
                }
            })
        };
        Self { filesystems, lowest, low, task }
    }

    /// What the run starts with: the free space of each filesystem it writes to.
    pub fn describe(&self) -> String {
        let each: Vec<String> = self
            .filesystems
            .iter()
            .filter_map(|fs| {
                Some(format!("{} on the disk of {}", gib(available(&fs.path)?), fs.path.display()))
            })
            .collect();
        format!("free disk space: {}", each.join(", "))
    }

    /// The lowest free space since the last call (at least the free space now), across the
    /// filesystems.
    pub fn take_lowest(&self) -> Option<u64> {
        let now = least_free(&self.filesystems).map(|(free, _)| free).unwrap_or(NONE);
        let lowest = self.lowest.swap(NONE, Ordering::SeqCst).min(now);
        (lowest != NONE).then_some(lowest)
    }

    /// Why the run stopped starting steps, if the disk fell below the floor.
    pub fn fell_below_floor(&self) -> Option<String> {
        self.low.get().cloned()
    }
}

impl Drop for DiskWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn paths_on_one_filesystem_count_once_and_missing_ones_by_their_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not/yet/made");
        let found = filesystems(&[dir.path().to_path_buf(), missing]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, dir.path());
        assert!(least_free(&found).unwrap().0 > 0);
    }

    #[test]
    fn gib_has_one_decimal() {
        assert_eq!(gib(3 << 29), "1.5 GiB");
        assert_eq!(gib(0), "0.0 GiB");
    }

    #[tokio::test]
    async fn below_the_floor_the_run_stops_starting_steps() {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watch = DiskWatch::start(&[dir.path().to_path_buf()], u64::MAX, stop.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while watch.fell_below_floor().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "the watch never looked");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(stop.load(Ordering::SeqCst));
        let why = watch.fell_below_floor().unwrap();
        assert!(why.contains(&dir.path().display().to_string()) || why.contains("the disk of /"), "{why}");
        assert!(watch.take_lowest().is_some());
    }

    #[tokio::test]
    async fn above_the_floor_nothing_stops() {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watch = DiskWatch::start(&[dir.path().to_path_buf()], 0, stop.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(watch.fell_below_floor().is_none());
        assert!(!stop.load(Ordering::SeqCst));
        assert!(watch.describe().contains("GiB on the disk of"), "{}", watch.describe());
    }
}
