//! Which Linux capabilities this machine's root holds, read from `/proc/self/status`.
//!
//! A privileged container asks runc for every capability the kernel knows. Where root itself lacks
//! one (in some VMs and sandboxes the bounding set lacks `CAP_SYS_RESOURCE`), runc fails with
//! "unable to apply caps"; the engine then runs containers through the capability shim
//! ([`super::shim`]), which drops exactly the capabilities [`missing`] returns.

use anyhow::{Context, Result};
use caps::{Capability, CapsHashSet};
use procfs::process::Process;

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
        let status = Process::myself().and_then(|me| me.status()).context("read /proc/self/status")?;
        let bounding = status.capbnd.context("no CapBnd line in /proc/self/status")?;
        Ok(Self { effective: status.capeff, bounding })
    }

    /// The capabilities of `supported` (those the kernel knows) that this process cannot give a
    /// container: not in its bounding set or not effective. In the kernel's order.
    pub fn missing(&self, supported: &CapsHashSet) -> Vec<Capability> {
        let held = self.effective & self.bounding;
        let mut missing: Vec<Capability> =
            supported.iter().copied().filter(|cap| held & cap.bitmask() == 0).collect();
        missing.sort_by_key(Capability::index);
        missing
    }
}

/// The capabilities the engine must drop from containers on this machine (empty almost
/// everywhere; `["CAP_SYS_RESOURCE"]` on the sandboxes this project was first run on).
pub fn missing() -> Result<Vec<Capability>> {
    // Those up to the kernel's `/proc/sys/kernel/cap_last_cap`; every one the crate knows (up to
    // `CAP_CHECKPOINT_RESTORE`) where that cannot be read.
    let supported = caps::runtime::procfs_all_supported(None).unwrap_or_else(|_| caps::all());
    Ok(CapSets::current()?.missing(&supported))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The capabilities a kernel whose `cap_last_cap` is `last` knows.
    fn up_to(last: u8) -> CapsHashSet {
        caps::all().into_iter().filter(|cap| cap.index() <= last).collect()
    }

    #[test]
    fn names_are_numbered_as_the_kernel_numbers_them() {
        let mut known: Vec<Capability> = caps::all().into_iter().collect();
        known.sort_by_key(Capability::index);
        assert_eq!(known.len(), 41);
        assert!(known.iter().enumerate().all(|(bit, cap)| usize::from(cap.index()) == bit));
        assert_eq!(known[21].to_string(), "CAP_SYS_ADMIN");
        assert_eq!(known[24].to_string(), "CAP_SYS_RESOURCE");
        assert_eq!(known[40].to_string(), "CAP_CHECKPOINT_RESTORE");
    }

    #[test]
    fn a_bounding_set_without_sys_resource_misses_exactly_that() {
        use Capability::*;
        // This machine's root: everything up to 40 except bit 24.
        let sets = CapSets { effective: 0x1ff_feff_ffff, bounding: 0x1ff_feff_ffff };
        assert_eq!(sets.missing(&up_to(40)), [CAP_SYS_RESOURCE]);
        // A full root misses nothing; a kernel that knows fewer capabilities asks for fewer.
        let full = CapSets { effective: 0x1ff_ffff_ffff, bounding: 0x1ff_ffff_ffff };
        assert!(full.missing(&up_to(40)).is_empty());
        let old_kernel = CapSets { effective: (1 << 38) - 1, bounding: (1 << 38) - 1 };
        assert!(old_kernel.missing(&up_to(37)).is_empty());
        assert_eq!(old_kernel.missing(&up_to(40)), [CAP_PERFMON, CAP_BPF, CAP_CHECKPOINT_RESTORE]);
        // Effective counts too: a capability in the bounding set that root cannot use is missing.
        let no_eff = CapSets { effective: 0x1ff_ffff_ffff & !(1 << 21), bounding: 0x1ff_ffff_ffff };
        assert_eq!(no_eff.missing(&up_to(40)), [CAP_SYS_ADMIN]);
    }

    #[test]
    fn reads_this_process_s_sets() {
        CapSets::current().expect("/proc/self/status has CapEff and CapBnd");
        missing().expect("this machine's missing capabilities");
    }
}
