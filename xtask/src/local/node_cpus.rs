//! Nodes that report more CPUs than the machine has, the way a VM's kubelet reports its vCPUs.
//!
//! The kubelet sizes a node's `cpu` capacity from cadvisor's machine info, whose core count is the
//! number of CPU directories under the NUMA nodes of sysfs (`/sys/devices/system/node/node*/cpu*`,
//! each with its `topology/core_id` and `topology/physical_package_id`), each counted once per
//! core it names. Inside a node's own mount namespace (and only there) the cluster mounts a
//! generated `/sys/devices/system/node` whose one NUMA node has N such directories, one core
//! each. Their CPU numbers are the machine's real ones, repeated with leading zeros (`cpu0`,
//! `cpu1`, `cpu00`, `cpu01`…, which cadvisor reads as CPUs 0, 1, 0, 1): the kubelet writes the
//! CPU numbers it knows into the `cpuset.cpus` of its pods' cgroup, and the kernel refuses a CPU
//! that does not exist, so the set of CPU numbers stays the machine's while the count is N. What
//! stays real: the node's memory (`node0/meminfo`, and `/proc/meminfo` the kubelet's memory
//! capacity comes from), its distances and hugepages (`node0/hugepages` and
//! `/sys/kernel/mm/hugepages`, bind-mounted or untouched), the online list and every other sysfs
//! path. Pods do not see it (each container mounts its own sysfs), nor does the CPU time they
//! get: requests and limits become cgroup shares and quotas, which the kernel honours on the real
//! CPUs. The kubelet's static CPU manager policy (exclusive CPUs per pod) would not work with it;
//! the cluster runs the `none` policy, as kind does.
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
/// The list of online CPUs, the machine's CPU numbers (left as it is in the nodes).
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

/// The numbers of the CPUs the machine has online (`/sys/devices/system/cpu/online`).
pub fn machine_cpus() -> Result<Vec<usize>> {
    let text = fs::read_to_string(ONLINE_FILE).with_context(|| format!("read {ONLINE_FILE}"))?;
    cpu_list(&text).with_context(|| format!("{ONLINE_FILE} holds {:?}, not a CPU list", text.trim()))
}

/// The CPUs of a kernel CPU list such as `0-3,6,8-9`.
fn cpu_list(text: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (first.trim().parse()?, last.trim().parse()?);
        if last < first {
            bail!("range {part} runs backwards");
        }
        cpus.extend(first..=last);
    }
    if cpus.is_empty() {
        bail!("no CPU listed");
    }
    Ok(cpus)
}

/// The directory name of the `index`th generated CPU: the machine's CPUs in turn, each round
/// with one more leading zero (`cpu0`, `cpu1`, `cpu00`, `cpu01`, … for CPUs 0 and 1).
/// `machine` is never empty ([`cpu_list`] refuses an empty list).
fn cpu_dir_name(index: usize, machine: &[usize]) -> String {
    let round = index / machine.len();
    format!("cpu{}{}", "0".repeat(round), machine[index % machine.len()])
}

/// Writes the sysfs that shows `cpus` CPUs into `dir` (a directory of the node's state, made
/// anew) and returns the mounts that put it in place in the node's mount namespace: nothing when
/// `cpus` is not more than the machine's CPUs `machine` (the node then reports those).
pub fn prepare(dir: &Path, cpus: usize, machine: &[usize]) -> Result<Vec<Mount>> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    if cpus <= machine.len() || machine.is_empty() {
        return Ok(Vec::new());
    }
    let machine_count = machine.len();
    let real = Path::new(REAL_NODE);
    if !real.join("meminfo").is_file() {
        bail!(
            "--node-cpus {cpus}: this machine's sysfs has no NUMA node ({REAL_NODE}/meminfo), which a node reporting more CPUs than the machine needs; pass --node-cpus 0 to report the machine's {machine_count}"
        );
    }
    let node_dir = dir.join("node");
    let node0 = node_dir.join("node0");
    for index in 0..cpus {
        let topology = node0.join(cpu_dir_name(index, machine)).join("topology");
        fs::create_dir_all(&topology).with_context(|| format!("create {}", topology.display()))?;
        // One core per directory, one package: cadvisor counts each core's threads.
        fs::write(topology.join("core_id"), format!("{index}\n"))?;
        fs::write(topology.join("physical_package_id"), "0\n")?;
    }
    for file in ["online", "possible", "has_cpu", "has_memory", "has_normal_memory"] {
        fs::write(node_dir.join(file), "0\n")?;
    }

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
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_their_cpus() {
        assert_eq!(cpu_list("0-1\n").unwrap(), [0, 1]);
        assert_eq!(cpu_list("0").unwrap(), [0]);
        assert_eq!(cpu_list("0-3,6,8-9").unwrap(), [0, 1, 2, 3, 6, 8, 9]);
        assert!(cpu_list("3-1").is_err());
        assert!(cpu_list("a").is_err());
        assert!(cpu_list("").is_err());
    }

    #[test]
    fn generated_cpus_repeat_the_machine_s_numbers() {
        let names: Vec<String> = (0..8).map(|i| cpu_dir_name(i, &[0, 1])).collect();
        assert_eq!(names, ["cpu0", "cpu1", "cpu00", "cpu01", "cpu000", "cpu001", "cpu0000", "cpu0001"]);
        assert_eq!(cpu_dir_name(4, &[2, 5, 7]), "cpu05");
    }

    #[test]
    fn no_more_cpus_than_the_machine_mounts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sysfs = dir.path().join("sysfs");
        fs::create_dir_all(sysfs.join("stale")).unwrap();
        assert!(prepare(&sysfs, 2, &[0, 1]).unwrap().is_empty());
        assert!(!sysfs.exists(), "an earlier tree is removed");
    }

    #[test]
    fn eight_cpus_get_one_numa_node_with_eight_cores_and_the_real_memory() {
        if !Path::new(REAL_NODE).join("meminfo").is_file() {
            return; // a machine without NUMA sysfs: prepare refuses, tested below
        }
        let dir = tempfile::tempdir().unwrap();
        let sysfs = dir.path().join("sysfs");
        let mounts = prepare(&sysfs, 8, &[0, 1]).unwrap();
        let node0 = sysfs.join("node/node0");
        let mut cores = Vec::new();
        for entry in fs::read_dir(&node0).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name().to_string_lossy().starts_with("cpu") {
                let core = fs::read_to_string(entry.path().join("topology/core_id")).unwrap();
                cores.push(core.trim().parse::<usize>().unwrap());
            }
        }
        cores.sort();
        assert_eq!(cores, (0..8).collect::<Vec<_>>(), "eight CPU directories, a core each");
        // The real node's files are mounted into the tree before the tree goes over sysfs.
        let targets: Vec<&Path> = mounts.iter().map(|m| m.target.as_path()).collect();
        let tree = targets.iter().position(|t| *t == Path::new(NODE_DIR)).unwrap();
        let meminfo = targets.iter().position(|t| *t == node0.join("meminfo")).unwrap();
        assert!(meminfo < tree);
        assert!(mounts[tree].recursive, "the real files mounted into the tree come along");
        assert_eq!(tree, mounts.len() - 1, "the tree goes over sysfs last");
    }
}
