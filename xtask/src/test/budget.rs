//! What each step of `cargo xtask test` costs, so the run's CPU budget shows in every CI log: the
//! machine's busy CPU time over the step (`/proc/stat`), the part of it the background builds took
//! (read from their own cgroup's CPU accounting), and how long the step waited for a background
//! build.
//!
//! The background builds run in a cgroup of minimal CPU weight (`dra-e2e-background`: cgroup v1
//! `cpu.shares` 2 and `cpu.idle`, or cgroup v2 `cpu.weight` 1 and `cpu.idle`) and under
//! `SCHED_IDLE`, so they take only the CPU nothing else wants; nice 19 still took about a tenth of
//! a busy core from the lanes beside them.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use procfs::CurrentSI;

/// The cgroup of the background builds, in every hierarchy it is made in.
pub const BACKGROUND_CGROUP: &str = "dra-e2e-background";

/// Where a step started: its clock and the CPU counters then.
#[derive(Debug, Clone, Copy)]
pub struct StepStart {
    at: Instant,
    cpu: Option<Duration>,
    background: Option<Duration>,
    waited: Duration,
}

/// What a step cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepCost {
    /// Wall time.
    pub elapsed: Duration,
    /// The machine's busy CPU time over the step, the background builds' share left out (the
    /// step's own processes and the cluster's); `None` where `/proc/stat` cannot be read.
    pub cpu: Option<Duration>,
    /// The background builds' CPU time over the step; `None` without their cgroup.
    pub background: Option<Duration>,
    /// How long the step waited for a background build.
    pub waited: Duration,
}

impl StepStart {
    /// Now, with the machine's and the background builds' CPU counters.
    pub fn now() -> Self {
        Self {
            at: Instant::now(),
            cpu: machine_busy(),
            background: background_usage(),
            waited: Duration::ZERO,
        }
    }

    /// When the step started.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The same start, with `waited` spent waiting for a background build.
    pub fn waited(self, waited: Duration) -> Self {
        Self { waited: self.waited + waited, ..self }
    }

    /// What the step cost from its start until now.
    pub fn cost(&self) -> StepCost {
        let background = background_usage().zip(self.background).map(|(now, then)| now.saturating_sub(then));
        let cpu = machine_busy()
            .zip(self.cpu)
            .map(|(now, then)| now.saturating_sub(then).saturating_sub(background.unwrap_or_default()));
        StepCost { elapsed: self.at.elapsed(), cpu, background, waited: self.waited }
    }
}

/// The machine's busy CPU time since boot: every `/proc/stat` column but idle and iowait (and the
/// guest columns, which user and nice already count).
pub fn machine_busy() -> Option<Duration> {
    let stat = procfs::KernelStats::current().ok()?;
    busy_of(&stat.total, procfs::ticks_per_second())
}

/// The busy time of a `cpu` line of `/proc/stat` counted in ticks of `1 / ticks_per_second` s.
fn busy_of(cpu: &procfs::CpuTime, ticks_per_second: u64) -> Option<Duration> {
    let busy =
        cpu.user + cpu.nice + cpu.system + [cpu.irq, cpu.softirq, cpu.steal].iter().flatten().sum::<u64>();
    (ticks_per_second > 0).then(|| Duration::from_secs_f64(busy as f64 / ticks_per_second as f64))
}

/// The background builds' CPU time so far, if their cgroup exists.
pub fn background_usage() -> Option<Duration> {
    cgroup_usage(BACKGROUND_CGROUP)
}

/// The CPU time of the cgroup `name` (directly under the cgroup root) so far, if it exists.
pub(super) fn cgroup_usage(name: &str) -> Option<Duration> {
    let v1 = Path::new("/sys/fs/cgroup/cpuacct").join(name).join("cpuacct.usage");
    if let Ok(text) = std::fs::read_to_string(&v1) {
        return text.trim().parse().ok().map(Duration::from_nanos);
    }
    let v2 = Path::new("/sys/fs/cgroup").join(name).join("cpu.stat");
    let text = std::fs::read_to_string(v2).ok()?;
    let usec = text.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
    usec.trim().parse().ok().map(Duration::from_micros)
}

/// The background builds' cgroup: made on [`BackgroundCgroup::create`], removed on drop.
#[derive(Debug)]
pub struct BackgroundCgroup {
    /// The cgroup's directory in each hierarchy (one on cgroup v2).
    dirs: Vec<PathBuf>,
}

impl BackgroundCgroup {
    /// Makes (or takes over, after a killed run) the cgroup with the least CPU weight the
    /// kernel allows, in the v1 `cpu` and `cpuacct` hierarchies or in the v2 hierarchy.
    pub fn create() -> Result<Self> {
        Self::create_under(Path::new("/sys/fs/cgroup"), BACKGROUND_CGROUP)
    }

    /// [`BackgroundCgroup::create`] with another name (tests running side by side).
    #[cfg(test)]
    pub(super) fn create_named(name: &str) -> Result<Self> {
        Self::create_under(Path::new("/sys/fs/cgroup"), name)
    }

    fn create_under(root: &Path, name: &str) -> Result<Self> {
        let v1 = ["cpu", "cpuacct"].map(|h| root.join(h));
        let dirs: Vec<PathBuf> = if v1.iter().all(|h| h.join("cgroup.procs").is_file()) {
            // `cpu` and `cpuacct` may be one hierarchy (cpu,cpuacct with two symlinks).
            let mut dirs: Vec<PathBuf> = Vec::new();
            for hierarchy in &v1 {
                let real =
                    hierarchy.canonicalize().with_context(|| format!("resolve {}", hierarchy.display()))?;
                let dir = real.join(name);
                if !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
            dirs
        } else if root.join("cgroup.controllers").is_file() {
            vec![root.join(name)]
        } else {
            bail!("no cgroup v1 cpu/cpuacct hierarchy and no cgroup v2 hierarchy under {}", root.display());
        };
        let group = Self { dirs };
        for dir in &group.dirs {
            match std::fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).with_context(|| format!("create cgroup {}", dir.display())),
            }
            // A group left by a killed run is idle already, and the kernel refuses `cpu.shares`
            // on an idle group (EINVAL): make it a plain group first.
            let idle = dir.join("cpu.idle");
            if idle.is_file() {
                std::fs::write(&idle, "0").with_context(|| format!("write 0 to {}", idle.display()))?;
            }
            // v1: the least shares; v2: the least weight. `cpu.idle` (Linux 5.15) makes the group
            // SCHED_IDLE among its siblings; older kernels lack the file.
            for (file, value) in [("cpu.shares", "2"), ("cpu.weight", "1"), ("cpu.idle", "1")] {
                let path = dir.join(file);
                if path.is_file() {
                    std::fs::write(&path, value)
                        .with_context(|| format!("write {value} to {}", path.display()))?;
                }
            }
        }
        Ok(group)
    }

    /// The `cgroup.procs` files a process writes its PID to, to join the group.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }
}

impl Drop for BackgroundCgroup {
    fn drop(&mut self) {
        // The builds' processes were stopped just before; a cgroup is removable once they exited.
        for dir in &self.dirs {
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
            if dir.exists() {
                eprintln!("==> could not remove the background builds' cgroup {}", dir.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_out_idle_and_iowait() {
        use procfs::{ExplicitSystemInfo, FromBufReadSI, KernelStats};
        let info = ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: true,
        };
        let stat = |cpu: &str| {
            let text = format!("{cpu}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\nctxt 1\nbtime 1\nprocesses 1\n");
            KernelStats::from_buf_read(text.as_bytes(), &info).map(|stat| stat.total)
        };
        // user 100 + nice 20 + system 30 + irq 6 + softirq 7 + steal 8 = 171 ticks.
        let cpu = stat("cpu  100 20 30 4000 500 6 7 8 50 0").unwrap();
        assert_eq!(busy_of(&cpu, 100), Some(Duration::from_millis(1710)));
        // An old kernel's line without the later columns.
        assert_eq!(busy_of(&stat("cpu  100 20 30 4000").unwrap(), 100), Some(Duration::from_millis(1500)));
        assert_eq!(busy_of(&cpu, 0), None);
    }

    #[test]
    fn the_machine_counts_busy_time() {
        let before = machine_busy().expect("/proc/stat readable on Linux");
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(300) {
            std::hint::black_box(0u64);
        }
        assert!(machine_busy().unwrap() > before, "a spinning thread made no busy time");
    }

    #[test]
    fn a_v2_hierarchy_gets_the_least_weight_and_is_removed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu\n").unwrap();
        let group = BackgroundCgroup::create_under(root.path(), BACKGROUND_CGROUP).unwrap();
        let dir = root.path().join(BACKGROUND_CGROUP);
        assert_eq!(group.procs_files(), vec![dir.join("cgroup.procs")]);
        // A real cgroupfs has these files; in a temporary directory none, so nothing is written.
        assert!(dir.is_dir() && !dir.join("cpu.weight").exists());
        // Taken over after a killed run.
        let again = BackgroundCgroup::create_under(root.path(), BACKGROUND_CGROUP).unwrap();
        drop(again);
        drop(group);
        assert!(!dir.exists());
    }

    #[test]
    fn a_real_group_left_idle_by_a_killed_run_is_taken_over() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: making a cgroup needs root (CI runs as root)");
            return;
        }
        let name = format!("dra-e2e-background-takeover-{}", std::process::id());
        // A killed run leaves its group behind, idle where the kernel has cpu.idle.
        let left = BackgroundCgroup::create_named(&name).unwrap();
        let dirs = left.dirs.clone();
        std::mem::forget(left);
        let again = BackgroundCgroup::create_named(&name).expect("take over the group a killed run left");
        for dir in &dirs {
            // An idle group is idle again; without `cpu.idle` the least shares show it (an idle
            // group reads the kernel's idle weight from `cpu.shares`, 3, not what was written).
            let idle = dir.join("cpu.idle");
            let shares = dir.join("cpu.shares");
            if idle.is_file() {
                assert_eq!(std::fs::read_to_string(&idle).unwrap().trim(), "1", "{}", idle.display());
            } else if shares.is_file() {
                assert_eq!(std::fs::read_to_string(&shares).unwrap().trim(), "2", "{}", shares.display());
            }
        }
        drop(again);
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?} left");
    }

    #[test]
    fn without_a_hierarchy_it_says_so() {
        let root = tempfile::tempdir().unwrap();
        let err = BackgroundCgroup::create_under(root.path(), BACKGROUND_CGROUP).unwrap_err();
        assert!(format!("{err}").contains("no cgroup v1 cpu/cpuacct hierarchy"), "{err}");
    }
}
