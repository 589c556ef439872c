//! Which Linux capabilities this machine's root holds, read from `/proc/self/status`.
//!
//! A privileged container asks runc for every capability the kernel knows. Where root itself lacks
//! one (in some VMs and sandboxes the bounding set lacks `CAP_SYS_RESOURCE`), runc fails with
//! "unable to apply caps"; the engine then runs containers through the capability shim
//! ([`super::shim`]), which drops exactly the capabilities [`missing`] returns.

use std::path::Path;

use anyhow::{Context, Result};

/// Capability names by number, as `linux/capability.h` numbers them (0 to 40).
pub const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The capability sets of one process, as `/proc/PID/status` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSets {
    /// `CapEff`: what the process may use now.
    pub effective: u64,
    /// `CapBnd`: the most any process it starts may ever get.
    pub bounding: u64,
}

impl CapSets {
    /// The sets of this process.
    pub fn current() -> Result<Self> {
        let path = Path::new("/proc/self/status");
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("no CapEff/CapBnd lines in {}", path.display()))
    }

    /// Parses the `CapEff:` and `CapBnd:` lines of a `/proc/PID/status` text.
    pub fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| {
            let line = status.lines().find_map(|line| line.strip_prefix(name))?;
            u64::from_str_radix(line.trim(), 16).ok()
        };
        Some(Self { effective: field("CapEff:")?, bounding: field("CapBnd:")? })
    }

    /// The capabilities up to `last_cap` (the kernel's `cap_last_cap`) that this process cannot
    /// give a container: not in its bounding set or not effective.
    pub fn missing(&self, last_cap: u32) -> Vec<&'static str> {
        let held = self.effective & self.bounding;
        NAMES
            .iter()
            .enumerate()
            .filter(|(bit, _)| *bit as u32 <= last_cap && held & (1u64 << bit) == 0)
            .map(|(_, name)| *name)
            .collect()
    }
}

/// The capabilities the engine must drop from containers on this machine (empty almost
/// everywhere; `["CAP_SYS_RESOURCE"]` on the sandboxes this project was first run on).
pub fn missing() -> Result<Vec<&'static str>> {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .unwrap_or(NAMES.len() as u32 - 1);
    Ok(CapSets::current()?.missing(last_cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_numbered_as_the_kernel_numbers_them() {
        assert_eq!(NAMES[21], "CAP_SYS_ADMIN");
        assert_eq!(NAMES[24], "CAP_SYS_RESOURCE");
        assert_eq!(NAMES[40], "CAP_CHECKPOINT_RESTORE");
    }

    #[test]
    fn a_bounding_set_without_sys_resource_misses_exactly_that() {
        // This machine's root: everything up to 40 except bit 24.
        let status = "Name:\tcat\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\n\
                      CapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\nCapAmb:\t0000000000000000\n";
        let sets = CapSets::parse(status).unwrap();
        assert_eq!(sets.missing(40), ["CAP_SYS_RESOURCE"]);
        // A full root misses nothing; a kernel that knows fewer capabilities asks for fewer.
        let full = CapSets { effective: 0x1ff_ffff_ffff, bounding: 0x1ff_ffff_ffff };
        assert!(full.missing(40).is_empty());
        let old_kernel = CapSets { effective: (1 << 38) - 1, bounding: (1 << 38) - 1 };
        assert!(old_kernel.missing(37).is_empty());
        assert_eq!(old_kernel.missing(40), ["CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"]);
        // Effective counts too: a capability in the bounding set that root cannot use is missing.
        let no_eff = CapSets { effective: 0x1ff_ffff_ffff & !(1 << 21), bounding: 0x1ff_ffff_ffff };
        assert_eq!(no_eff.missing(40), ["CAP_SYS_ADMIN"]);
        assert_eq!(CapSets::parse("Name:\tcat\n"), None);
    }
}
