//! Pruning the cache: the build directories of other cache keys that nothing needs any more.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// Removes build directories of other cache keys under `bin_dir`, except the newest of them (so
/// switching between two checkouts does not rebuild each time), any that a running process
/// executes from (a cluster still up on that build: removing it would break every container it
/// starts next), and partial builds whose builder is gone; the older kubelets' builds
/// ([`crate::common::layout::OLD_KUBELET_DIR`]) stay. Best effort: a directory that cannot be
/// removed is only logged.
pub fn prune(bin_dir: &Path, current: &str) {
    let Ok(entries) = fs::read_dir(bin_dir) else { return };
    let mut others: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == current || name == crate::common::layout::OLD_KUBELET_DIR || !path.is_dir() {
            continue;
        }
        if let Some((_, pid)) = name.rsplit_once(".partial-") {
            let alive = pid.parse::<i32>().is_ok_and(|pid| procfs::process::Process::new(pid).is_ok());
            if !alive {
                remove_logged(&path);
            }
            continue;
        }
        let modified = entry.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
        others.push((modified, path));
    }
    others.sort();
    others.pop(); // the newest other build stays
    for (_, path) in others {
        let users = crate::host_cleanup::processes_running_from(&path);
        if users.is_empty() {
            remove_logged(&path);
        } else {
            eprintln!("    kept the old build {}: processes {users:?} run from it", path.display());
        }
    }
}

fn remove_logged(path: &Path) {
    match fs::remove_dir_all(path) {
        Ok(()) => eprintln!("    pruned the old build {}", path.display()),
        Err(e) => tracing::warn!("could not prune {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_current_and_the_newest_other_build() {
        let dir = tempfile::tempdir().unwrap();
        for (name, age) in [("old", 30), ("newer", 20), ("current", 40)] {
            let path = dir.path().join(name);
            fs::create_dir(&path).unwrap();
            let time = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            fs::File::open(&path).unwrap().set_modified(time).unwrap();
        }
        fs::create_dir(dir.path().join("x.partial-999999999")).unwrap();
        fs::create_dir(dir.path().join(crate::common::layout::OLD_KUBELET_DIR)).unwrap();
        let mine = dir.path().join(format!("y.partial-{}", std::process::id()));
        fs::create_dir(&mine).unwrap();
        prune(dir.path(), "current");
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["current", "kubelet", "newer", &format!("y.partial-{}", std::process::id())]);
    }

    #[test]
    fn prune_keeps_a_build_that_a_process_runs_from() {
        let dir = tempfile::tempdir().unwrap();
        // A cluster still up on the oldest build: its processes execute from that directory.
        fs::create_dir(dir.path().join("in-use")).unwrap();
        let sleep = dir.path().join("in-use/sleep");
        fs::copy("/bin/sleep", &sleep).unwrap();
        for (name, age) in [("in-use", 30), ("newer", 20), ("current", 10)] {
            let path = dir.path().join(name);
            fs::create_dir_all(&path).unwrap();
            let time = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            fs::File::open(&path).unwrap().set_modified(time).unwrap();
        }
        // A test that forks at the moment of the copy can hold the file open for writing a moment.
        let mut child = (0..50)
            .find_map(|_| match std::process::Command::new(&sleep).arg("30").spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    None
                }
                other => Some(other.unwrap()),
            })
            .unwrap();
        prune(dir.path(), "current");
        let _ = child.kill();
        let _ = child.wait();
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["current", "in-use", "newer"]);
    }
}
