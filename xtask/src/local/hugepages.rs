//! Hugepages the nodes report: 2 MiB pages reserved in the kernel's pool before the kubelets
//! start, so each node reports `hugepages-2Mi` (cadvisor reads the pool of the machine's NUMA
//! node, which every node's sysfs shows, see [`super::node_cpus`]), and on a cgroup v1 host the
//! `hugetlb` controller mounted at `/sys/fs/cgroup/hugetlb`, where the kubelet sets the pods'
//! hugetlb limits (a v1 host may keep that controller in its unified hierarchy, where a v1
//! kubelet does not look). The nodes share the one pool: each reports all of it.
//!
//! How much: `cluster up --node-hugepages SIZE`, by default [`crate::overrides::DEFAULT_NODE_HUGEPAGES_MIB`] (the
//! Node Allocatable hugepages specs ask for 202 MiB on one node); 0 leaves the machine as it is.
//! What the cluster changed is undone by `cluster down`: the pool's size is saved with the other
//! kernel settings ([`super::host::save_sysctls`]), and a hierarchy it mounted is unmounted.
//! Where the kernel refuses (no memory to spare, no right to mount), nothing is changed and the
//! step says why: the hugepages specs then skip with the node's reason.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use procfs::CGroupController;

use crate::common::layout::Layout;
use crate::overrides::HUGEPAGE_MIB as PAGE_MIB;

/// The number of 2 MiB pages in the kernel's pool.
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
/// Where a cgroup v1 host gets its `hugetlb` hierarchy.
const HUGETLB_HIERARCHY: &str = "/sys/fs/cgroup/hugetlb";

/// What [`reserve`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reserved {
    /// The pool holds this many MiB (at least what was asked).
    Pool { mib: u64 },
    /// The kernel refused; the sentence says what, and nothing was changed.
    Refused(String),
}

/// Grows the kernel's pool to `mib` MiB (more than 0) of 2 MiB pages (never shrinks it) and, on a cgroup v1
/// host, mounts the `hugetlb` hierarchy if no hierarchy has it. Call after
/// [`super::host::save_sysctls`] and before the nodes' mount namespaces are made (they copy the
/// host's mounts).
pub fn reserve(layout: &Layout, mib: u64) -> Result<Reserved> {
    let cgroup_v1 = !Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    if cgroup_v1 && !Path::new(HUGETLB_HIERARCHY).join("cgroup.procs").is_file() {
        if let Err(e) = mount_hugetlb() {
            return Ok(Reserved::Refused(format!(
                "cannot mount the cgroup v1 hugetlb controller at {HUGETLB_HIERARCHY} ({e}), where the kubelet would set the pods' hugepages limits: no hugepages reserved"
            )));
        }
        fs::write(mounted_marker(layout), HUGETLB_HIERARCHY)
            .context("record the hugetlb hierarchy the cluster mounted")?;
    }
    let pages = mib / PAGE_MIB;
    let before = pool_pages()?;
    if before >= pages {
        return Ok(Reserved::Pool { mib: before * PAGE_MIB });
    }
    let written = fs::write(NR_HUGEPAGES, pages.to_string());
    let after = pool_pages()?;
    if written.is_err() || after < pages {
        // A partial pool would pass the "node has hugepages" check and fail the specs instead.
        let _ = fs::write(NR_HUGEPAGES, before.to_string());
        unmount_hugetlb(layout);
        let why = match written {
            Err(e) => format!("writing {NR_HUGEPAGES} failed: {e}"),
            Ok(()) => format!("the kernel found {} of {mib} MiB", after * PAGE_MIB),
        };
        return Ok(Reserved::Refused(format!("cannot reserve {mib} MiB of hugepages ({why})")));
    }
    Ok(Reserved::Pool { mib: after * PAGE_MIB })
}

/// Unmounts the `hugetlb` hierarchy if the cluster mounted it; `Some` says what failed.
///
/// The hierarchy is emptied first: every cgroup left in it without a process is removed, also
/// those another program made while it was mounted (the run's own Docker engine makes
/// `dra-e2e-docker` in every hierarchy it finds; they exist only because the cluster mounted
/// it). A hierarchy unmounted with cgroups in it lives on unseen and keeps the controller out of
/// the unified hierarchy, where systemd (kind's nodes) then fails to reload. So if a cgroup in
/// it still holds a process, it stays mounted and `Some` names that cgroup.
pub fn unmount_hugetlb(layout: &Layout) -> Option<String> {
    let marker = mounted_marker(layout);
    let target = fs::read_to_string(&marker).ok()?;
    let target = PathBuf::from(target.trim());
    if target.join("cgroup.procs").is_file() {
        if let Some(busy) = empty_hierarchy(&target) {
            return Some(format!(
                "left the hugetlb cgroup hierarchy {} mounted: {busy} (unmounted, it would keep the controller away from the unified hierarchy)",
                target.display()
            ));
        }
        // Removed cgroups are released a moment after rmdir; the kernel destroys the hierarchy
        // at unmount only if none is left by then.
        if !wait_for(|| hugetlb_in_proc_cgroups().is_none_or(|(_, cgroups)| cgroups <= 1)) {
            return Some(format!(
                "left the hugetlb cgroup hierarchy {} mounted: the kernel had not released its removed cgroups {}s later (/proc/cgroups)",
                target.display(),
                RELEASE_TIMEOUT.as_secs()
            ));
        }
        if let Err(e) = rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()) {
            return Some(format!("unmount the hugetlb cgroup hierarchy {}: {e}", target.display()));
        }
        if !wait_for(|| hugetlb_in_proc_cgroups().is_none_or(|(hierarchy, _)| hierarchy == 0)) {
            return Some(format!(
                "the hugetlb controller was still in a cgroup v1 hierarchy {}s after {} was unmounted (/proc/cgroups)",
                RELEASE_TIMEOUT.as_secs(),
                target.display()
            ));
        }
    }
    let _ = fs::remove_dir(&target);
    fs::remove_file(&marker).err().map(|e| format!("remove {}: {e}", marker.display()))
}

/// Removes every cgroup below the hierarchy's root, leaf first; `Some` names one that could not
/// be removed (a process still in it).
fn empty_hierarchy(root: &Path) -> Option<String> {
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) => return Some(format!("cannot list {}: {e}", root.display())),
    };
    let mut busy = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir())
            && let Err(e) = crate::host_cleanup::remove_cgroup_tree(&path)
        {
            busy.push(format!("cgroup {} ({e})", path.display()));
        }
    }
    (!busy.is_empty()).then(|| busy.join(", "))
}

/// The hierarchy the cluster mounted and did not unmount yet, for `cluster down`'s check.
pub fn leftover(layout: &Layout) -> Option<String> {
    mounted_marker(layout)
        .exists()
        .then(|| format!("the hugetlb cgroup hierarchy {HUGETLB_HIERARCHY} the cluster mounted"))
}

fn mount_hugetlb() -> Result<()> {
    fs::create_dir_all(HUGETLB_HIERARCHY).with_context(|| format!("create {HUGETLB_HIERARCHY}"))?;
    rustix::mount::mount(
        "cgroup",
        HUGETLB_HIERARCHY,
        "cgroup",
        rustix::mount::MountFlags::empty(),
        c"hugetlb",
    )
    .map_err(|e| {
        let _ = fs::remove_dir(HUGETLB_HIERARCHY);
        anyhow::anyhow!("{e}")
    })
}

/// How long the kernel gets to release removed cgroups and the unmounted hierarchy.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Polls `done` every 100 ms for at most [`RELEASE_TIMEOUT`]; whether it became true.
fn wait_for(done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + RELEASE_TIMEOUT;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The hugetlb line of `/proc/cgroups`: its hierarchy (0: the unified one) and its number of
/// cgroups (those removed but not yet released included).
fn hugetlb_in_proc_cgroups() -> Option<(u32, u32)> {
    controller(&procfs::cgroups().ok()?.0, "hugetlb")
}

/// The hierarchy and number of cgroups of `name` among the controllers of `/proc/cgroups`.
fn controller(controllers: &[CGroupController], name: &str) -> Option<(u32, u32)> {
    controllers.iter().find(|c| c.name == name).map(|c| (c.hierarchy, c.num_cgroups))
}

fn pool_pages() -> Result<u64> {
    let text = fs::read_to_string(NR_HUGEPAGES).with_context(|| format!("read {NR_HUGEPAGES}"))?;
    text.trim().parse().with_context(|| format!("{NR_HUGEPAGES} holds {:?}, not a number", text.trim()))
}

fn mounted_marker(layout: &Layout) -> PathBuf {
    layout.state.join("hugetlb-mounted")
}

#[cfg(test)]
mod tests {
    use procfs::FromBufRead;

    use super::*;

    #[test]
    fn reads_a_controller_s_hierarchy_and_cgroups() {
        let text = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t114\t1\nhugetlb\t12\t2\t1\n";
        let controllers = procfs::CGroupControllers::from_buf_read(text.as_bytes()).unwrap().0;
        assert_eq!(controller(&controllers, "hugetlb"), Some((12, 2)));
        assert_eq!(controller(&controllers, "rdma"), None);
    }
}
