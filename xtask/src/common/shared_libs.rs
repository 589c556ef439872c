//! The shared libraries a dynamically linked binary loads, as `ldd` names them, so that an image
//! can carry them (and the dynamic loader) instead of a libc of its own.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

/// The absolute paths `ldd` reports for `binary`: each library it loads and the dynamic loader
/// (the kernel's vDSO, which has no file, left out). A static binary has none.
pub fn of(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output().context("run ldd (Debian's libc-bin)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // ldd exits with 1 for a static binary, saying so.
        let stderr = String::from_utf8_lossy(&out.stderr);
        if format!("{stdout}{stderr}").contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {}", binary.display(), stderr.trim());
    }
    parse(&stdout).with_context(|| format!("the libraries of {}", binary.display()))
}

/// The paths in `ldd`'s output: `name => /path (0x…)` and `/loader (0x…)` lines.
fn parse(output: &str) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("statically linked") {
            continue;
        }
        let target = match line.split_once(" => ") {
            Some((name, rest)) if rest.starts_with("not found") => bail!("ldd finds no {name}"),
            Some((_, rest)) => rest,
            None => line,
        };
        let path = target.split(" (").next().unwrap_or(target).trim();
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_and_the_loader_are_read_and_the_vdso_is_left_out() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x7f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n";
        assert_eq!(
            parse(out).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse("\tstatically linked\n").unwrap().is_empty());
        assert!(parse("\tlibfoo.so.1 => not found\n").is_err());
    }
}
