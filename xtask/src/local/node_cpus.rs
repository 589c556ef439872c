//! Nodes that report more CPUs than the machine has, the way a VM's kubelet reports its vCPUs.
//!
//! The kubelet sizes a node's `cpu` capacity from cadvisor's machine info, whose core count is the
//! CPUs listed under the NUMA nodes of sysfs (`/sys/devices/system/node/node*/cpu*`, each with its
//! `topology/core_id` and `topology/physical_package_id`) that `/sys/devices/system/cpu/online`
//! lists. Inside a node's own mount namespace (and only there) the cluster mounts a generated
//! `/sys/devices/system/node` with one NUMA node of N CPUs and an `online` list of N CPUs over
//! the real ones. What stays real: the node's memory (`node0/meminfo`, and `/proc/meminfo` the
//! kubelet's memory capacity comes from), its distances and hugepages (`node0/hugepages` and
//! `/sys/kernel/mm/hugepages`, bind-mounted or untouched), and every other sysfs path. Pods do
//! not see it (each container mounts its own sysfs), nor does the CPU time they get: requests and
//! limits become cgroup shares and quotas, which the kernel honours on the real CPUs.
//!
//! How many: `cluster up --node-cpus N`, by default [`crate::overrides::DEFAULT_NODE_CPUS`] (what
//! upstream's kind nodes have on its CI, and what its Node Allocatable specs, 2.1–3.3 CPU per
//! pod, need); 0 or the machine's count or less leaves sysfs alone.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

/// The real NUMA node whose memory, distances and hugepages the generated one shows.
const REAL_NODE: &str = "/sys/devices/system/node/node0";
/// The directory the generated NUMA nodes are mounted over.
const NODE_DIR: &str = "/sys/devices/system/node";
/// The list of online CPUs that cadvisor checks each CPU against.
const ONLINE_FILE: &str = "/sys/devices/system/cpu/online";

/// One mount done in a node's mount namespace when it is created, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Whether submounts of `source` come along (`mount --rbind`).
    pub recursive: bool,
    /// What is mounted.
    pub source: PathBuf,
    /// Where, inside the node's mount namespace.
    pub target: PathBuf,
}

impl Mount {
    fn bind(source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        Self { recursive: false, source: source.into(), target: target.into() }
    }
}

/// The number of CPUs the machine has online (the entries of `/sys/devices/system/cpu/online`).
pub fn machine_cpus() -> Result<usize> {
    let text = fs::read_to_string(ONLINE_FILE).with_context(|| format!("read {ONLINE_FILE}"))?;
    cpu_list_len(&text).with_context(|| format!("{ONLINE_FILE} holds {:?}, not a CPU list", text.trim()))
}

/// The number of CPUs in a kernel CPU list such as `0-3,6,8-9`.
fn cpu_list_len(text: &str) -> Result<usize> {
    let mut count = 0;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (first.trim().parse()?, last.trim().parse()?);
        if last < first {
            bail!("range {part} runs backwards");
        }
        count += last - first + 1;
    }
    Ok(count)
}

/// The CPU list of `cpus` CPUs numbered from 0.
fn cpu_list(cpus: usize) -> String {
    match cpus {
        0 | 1 => "0".to_string(),
        n => format!("0-{}", n - 1),
    }
}

/// Writes the sysfs that shows `cpus` CPUs into `dir` (a directory of the node's state, made
/// anew) and returns the mounts that put it in place in the node's mount namespace: nothing when
/// `cpus` is not more than `machine` (the node then reports the machine's own CPUs).
pub fn prepare(dir: &Path, cpus: usize, machine: usize) -> Result<Vec<Mount>> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    if cpus <= machine {
        return Ok(Vec::new());
    }
    let real = Path::new(REAL_NODE);
    if !real.join("meminfo").is_file() {
        bail!(
            "--node-cpus {cpus}: this machine's sysfs has no NUMA node ({REAL_NODE}/meminfo), which a node reporting more CPUs than the machine needs; pass --node-cpus 0 to report the machine's {machine}"
        );
    }
    let node_dir = dir.join("node");
    let node0 = node_dir.join("node0");
    for cpu in 0..cpus {
        let topology = node0.join(format!("cpu{cpu}/topology"));
        fs::create_dir_all(&topology).with_context(|| format!("create {}", topology.display()))?;
        // One core per CPU, one package: cadvisor counts each (core, package) pair's threads.
        fs::write(topology.join("core_id"), format!("{cpu}\n"))?;
        fs::write(topology.join("physical_package_id"), "0\n")?;
        fs::write(topology.join("thread_siblings_list"), format!("{cpu}\n"))?;
    }
    let list = format!("{}\n", cpu_list(cpus));
    fs::write(node0.join("cpulist"), &list)?;
    for file in ["online", "possible", "has_cpu", "has_memory", "has_normal_memory"] {
        fs::write(node_dir.join(file), "0\n")?;
    }
    let online = dir.join("cpu-online");
    fs::write(&online, &list)?;

    // The real node's memory, distances and hugepages, mounted into the generated node first.
    let mut mounts = Vec::new();
    for file in ["meminfo", "distance"] {
        if real.join(file).is_file() {
            fs::write(node0.join(file), "")?;
            mounts.push(Mount::bind(real.join(file), node0.join(file)));
        }
    }
    if real.join("hugepages").is_dir() {
        fs::create_dir_all(node0.join("hugepages"))?;
        mounts.push(Mount::bind(real.join("hugepages"), node0.join("hugepages")));
    }
    mounts.push(Mount { recursive: true, source: node_dir, target: PathBuf::from(NODE_DIR) });
    mounts.push(Mount::bind(online, ONLINE_FILE));
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(cpu_list_len("0-1\n").unwrap(), 2);
        assert_eq!(cpu_list_len("0").unwrap(), 1);
        assert_eq!(cpu_list_len("0-3,6,8-9").unwrap(), 7);
        assert!(cpu_list_len("3-1").is_err());
        assert!(cpu_list_len("a").is_err());
        assert_eq!(cpu_list(8), "0-7");
        assert_eq!(cpu_list(1), "0");
    }

    #[test]
    fn no_more_cpus_than_the_machine_mounts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sysfs = dir.path().join("sysfs");
        fs::create_dir_all(sysfs.join("stale")).unwrap();
        assert!(prepare(&sysfs, 2, 2).unwrap().is_empty());
        assert!(!sysfs.exists(), "an earlier tree is removed");
    }

    #[test]
    fn eight_cpus_get_one_numa_node_with_eight_cores_and_the_real_memory() {
        if !Path::new(REAL_NODE).join("meminfo").is_file() {
            return; // a machine without NUMA sysfs: prepare refuses, tested below
        }
        let dir = tempfile::tempdir().unwrap();
        let sysfs = dir.path().join("sysfs");
        let mounts = prepare(&sysfs, 8, 2).unwrap();
        let node0 = sysfs.join("node/node0");
        for cpu in 0..8 {
            let core = fs::read_to_string(node0.join(format!("cpu{cpu}/topology/core_id"))).unwrap();
            assert_eq!(core.trim(), cpu.to_string());
        }
        assert!(!node0.join("cpu8").exists());
        assert_eq!(fs::read_to_string(sysfs.join("cpu-online")).unwrap(), "0-7\n");
        assert_eq!(fs::read_to_string(node0.join("cpulist")).unwrap(), "0-7\n");
        // The real node's files are mounted into the tree before the tree goes over sysfs.
        let targets: Vec<&Path> = mounts.iter().map(|m| m.target.as_path()).collect();
        let tree = targets.iter().position(|t| *t == Path::new(NODE_DIR)).unwrap();
        let meminfo = targets.iter().position(|t| *t == node0.join("meminfo")).unwrap();
        assert!(meminfo < tree);
        assert!(mounts[tree].recursive, "the real files mounted into the tree come along");
        assert_eq!(mounts.last().unwrap().target, Path::new(ONLINE_FILE));
    }
}
