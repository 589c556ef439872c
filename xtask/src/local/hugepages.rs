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

/// Unmounts the `hugetlb` hierarchy if the cluster mounted it (once the node cgroups in it are
/// gone); `Some` says what failed.
pub fn unmount_hugetlb(layout: &Layout) -> Option<String> {
    let marker = mounted_marker(layout);
    let target = fs::read_to_string(&marker).ok()?;
    let target = PathBuf::from(target.trim());
    if target.join("cgroup.procs").is_file()
        && let Err(e) = rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty())
    {
        return Some(format!("unmount the hugetlb cgroup hierarchy {}: {e}", target.display()));
    }
    let _ = fs::remove_dir(&target);
    fs::remove_file(&marker).err().map(|e| format!("remove {}: {e}", marker.display()))
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

fn pool_pages() -> Result<u64> {
    let text = fs::read_to_string(NR_HUGEPAGES).with_context(|| format!("read {NR_HUGEPAGES}"))?;
    text.trim().parse().with_context(|| format!("{NR_HUGEPAGES} holds {:?}, not a number", text.trim()))
}

fn mounted_marker(layout: &Layout) -> PathBuf {
    layout.state.join("hugetlb-mounted")
}
