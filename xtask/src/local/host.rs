//! What the local cluster needs from the machine: root, the Debian packages it builds or runs with
//! (libseccomp-dev for runc, the CNI plugins, a static busybox), and the kernel settings the kubelet changes, which are saved before
//! the kubelet starts and restored by `cluster down`.

use std::{collections::BTreeMap, fs, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use super::components::CNI_BIN_DIR;

use crate::common::{images::BUSYBOX_BINARY, layout::Layout};

/// The local cluster starts containerd and the kubelet: it must run as root.
pub fn require_root() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!(
            "the local cluster runs containerd and the kubelet, which need root: run `cargo xtask cluster up --provider local` as root (for example with sudo -E)"
        );
    }
    Ok(())
}

/// A Debian package the cluster needs and how to tell it is installed.
struct Package {
    name: &'static str,
    present: fn() -> bool,
}

const PACKAGES: [Package; 5] = [
    // runc itself is built from source; its seccomp support links libseccomp.
    Package { name: "libseccomp-dev", present: || Path::new("/usr/include/seccomp.h").is_file() },
    Package {
        name: "containernetworking-plugins",
        present: || {
            ["bridge", "host-local", "loopback"].iter().all(|p| Path::new(CNI_BIN_DIR).join(p).is_file())
        },
    },
    Package { name: "busybox-static", present: || is_static_elf(Path::new(BUSYBOX_BINARY)) },
    // The nodes' network namespaces, veths and bridge.
    Package { name: "iproute2", present: || on_path("ip") },
    // The nodes' mount namespaces (unshare), entering them (nsenter), bind mounts (mount).
    Package { name: "util-linux", present: || ["unshare", "nsenter", "mount"].iter().all(|p| on_path(p)) },
];

/// Makes sure the Debian packages are installed; as root on Debian it installs missing ones itself
/// (and says so), elsewhere it names them.
pub fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().filter(|p| !(p.present)()).map(|p| p.name).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    let debian = Path::new("/etc/debian_version").is_file() && on_path("apt-get");
    if !debian || !rustix::process::geteuid().is_root() {
        bail!(
            "the local cluster needs these Debian packages (or their equivalents): {list}; install them (as root: apt-get install -y {list}) and retry"
        );
    }
    eprintln!("==> installing missing Debian packages: {list}");
    let install = |update: bool| -> Result<bool> {
        if update {
            let status =
                Command::new("apt-get").args(["-o", "Acquire::Retries=3", "update", "-qq"]).status()?;
            if !status.success() {
                bail!("apt-get update failed; install {list} yourself and retry");
            }
        }
        Ok(Command::new("apt-get")
            .args(["-o", "Acquire::Retries=3", "install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("run apt-get install")?
            .success())
    };
    if !install(false)? && !install(true)? {
        bail!("apt-get install {list} failed; install them yourself and retry");
    }
    let still: Vec<&str> = PACKAGES.iter().filter(|p| !(p.present)()).map(|p| p.name).collect();
    if !still.is_empty() {
        bail!(
            "after apt-get install, still missing: {} (is a dynamically linked busybox installed instead of busybox-static?)",
            still.join(" ")
        );
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Whether a file is an ELF executable without a program interpreter (statically linked), so it
/// runs in an image that has no libc.
pub fn is_static_elf(path: &Path) -> bool {
    let Ok(bytes) = fs::read(path) else { return false };
    elf_has_no_interpreter(&bytes).unwrap_or(false)
}

fn elf_has_no_interpreter(b: &[u8]) -> Option<bool> {
    if b.get(..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None; // only 64-bit little-endian ELF is expected here
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The kernel settings the cluster changes: those the kubelet sets at start
/// (`protectKernelDefaults: false`), and the hugepages pool (see [`super::hugepages`]).
const KUBELET_SYSCTLS: [&str; 7] = [
    "vm/nr_hugepages",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Saves the current values of the settings the cluster will change, once per cluster.
pub fn save_sysctls(layout: &Layout) -> Result<()> {
    let path = layout.saved_sysctls();
    if path.exists() {
        return Ok(());
    }
    let values: BTreeMap<&str, String> = KUBELET_SYSCTLS
        .iter()
        .filter_map(|k| {
            Some((*k, fs::read_to_string(Path::new("/proc/sys").join(k)).ok()?.trim().to_string()))
        })
        .collect();
    fs::write(&path, serde_json::to_vec_pretty(&values)?)?;
    Ok(())
}

/// Restores the saved kernel settings and forgets them.
pub fn restore_sysctls(layout: &Layout) -> Result<()> {
    let path = layout.saved_sysctls();
    let Ok(text) = fs::read_to_string(&path) else { return Ok(()) };
    let values: BTreeMap<String, String> = serde_json::from_str(&text).context("parse saved sysctls")?;
    for (key, value) in values {
        if !KUBELET_SYSCTLS.contains(&key.as_str()) {
            continue;
        }
        let file = Path::new("/proc/sys").join(&key);
        if let Err(e) = fs::write(&file, &value) {
            tracing::warn!("could not restore {}: {e}", file.display());
        }
    }
    fs::remove_file(path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_static_from_dynamic_executables() {
        // /bin/sh on Debian is dynamically linked; the busybox-static binary is not.
        assert!(!is_static_elf(Path::new("/bin/sh")));
        assert!(!is_static_elf(Path::new("/etc/passwd")));
        if Path::new(BUSYBOX_BINARY).exists() {
            assert!(is_static_elf(Path::new(BUSYBOX_BINARY)));
        }
    }
}
