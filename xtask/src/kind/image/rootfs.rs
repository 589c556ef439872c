//! The node image's root filesystem: a Debian bookworm `debootstrap --variant=minbase` tree
//! (cached), kind's own base files from the `sigs.k8s.io/kind` module (entrypoint, systemd units,
//! containerd and kubelet configuration), the steps of kind's base Dockerfile, and our binaries
//! where kind's base and `kind build node-image` put theirs.

use std::{
    fs,
    os::unix::fs::{PermissionsExt, symlink},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use sha2::{Digest, Sha256};

use super::run_logged;
use crate::common::{build::Binaries, images};

/// The Debian release of the node's userland.
pub const SUITE: &str = "bookworm";
/// Where debootstrap fetches it.
pub const MIRROR: &str = "http://deb.debian.org/debian";
/// What the node needs beyond minbase: systemd as PID 1, the tools kubeadm's preflight checks,
/// the kubelet, kube-proxy, kind's entrypoint and kind's hooks run.
pub const PACKAGES: &[&str] = &[
    "systemd",
    "dbus",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "socat",
    "conntrack",
    "mount",
    "util-linux",
    "ca-certificates",
    "procps",
    "kmod",
    "libseccomp2",
    "bash",
    // kind's createContainer hook (/kind/bin/mount-product-files.sh) edits the OCI spec with jq.
    "jq",
];
const DEBOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const QUICK: Duration = Duration::from_secs(120);

/// The multi-call binary's names in the node (`/usr/local/bin/<name> -> kube`): the control-plane
/// images run them by name, and `/usr/bin/kubelet` points there too.
pub const KUBE_LINKS: [&str; 4] = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"];

/// The debootstrap tree for [`PACKAGES`], made once and kept in `cache` (`debootstrap-<hash>`).
pub async fn debootstrap(cache: &Path) -> Result<PathBuf> {
    let mut hasher = Sha256::new();
    hasher.update(format!("{SUITE} {MIRROR} minbase {}", PACKAGES.join(",")));
    let key = hex::encode(&hasher.finalize()[..6]);
    let dir = cache.join(format!("debootstrap-{SUITE}-{key}"));
    if dir.join("usr/lib/systemd/systemd").is_file() {
        eprintln!("    debootstrap {SUITE}: cached in {}", dir.display());
        return Ok(dir);
    }
    if which("debootstrap").is_none() {
        eprintln!("    installing Debian's debootstrap with apt-get");
        let mut cmd = tokio::process::Command::new("apt-get");
        cmd.args(["-o", "Acquire::Retries=3", "install", "-y", "--no-install-recommends", "debootstrap"]);
        run_logged(cmd, "apt-get install debootstrap", Duration::from_secs(10 * 60)).await.context(
            "debootstrap is missing and could not be installed; install it (apt-get install debootstrap)",
        )?;
    }
    fs::create_dir_all(cache).with_context(|| format!("create {}", cache.display()))?;
    let tmp = cache.join(format!("debootstrap-{SUITE}-{key}.partial-{}", std::process::id()));
    remove_tree(&tmp)?;
    let mut cmd = tokio::process::Command::new("debootstrap");
    cmd.args(["--variant=minbase", &format!("--include={}", PACKAGES.join(",")), SUITE])
        .arg(&tmp)
        .arg(MIRROR);
    let result = run_logged(cmd, "debootstrap", DEBOOTSTRAP_TIMEOUT).await;
    if let Err(err) = result {
        remove_tree(&tmp)?;
        return Err(err);
    }
    // Package caches are not part of the image.
    remove_tree(&tmp.join("var/cache/apt/archives"))?;
    fs::rename(&tmp, &dir).with_context(|| format!("rename {} to {}", tmp.display(), dir.display()))?;
    Ok(dir)
}

/// Copies the debootstrap tree to `staging` and turns it into a kind node's root filesystem.
pub async fn assemble(
    base: &Path,
    staging: &Path,
    kind_files: &Path,
    bins: &Binaries,
    version: &str,
) -> Result<()> {
    let mut cp = tokio::process::Command::new("cp");
    cp.arg("-a").arg(base).arg(staging);
    run_logged(cp, "copy the debootstrap tree", QUICK).await?;
    copy_kind_files(kind_files, staging)?;
    kind_base_steps(staging).await?;
    install_binaries(staging, bins)?;
    containerd_files(staging, bins).await?;
    write(staging, "kind/version", version, 0o644)?;
    write(staging, "kind/manifests/default-storage.yaml", DEFAULT_STORAGE, 0o644)?;
    fs::create_dir_all(staging.join("etc/kubernetes/manifests"))?;
    fs::create_dir_all(staging.join("etc/cni/net.d"))?;
    Ok(())
}

/// kind's default StorageClass manifest location holds a StorageClass without a provisioner:
/// the suites need none, and no pod of the cluster should need an image the node lacks.
const DEFAULT_STORAGE: &str =
    "# dra-e2e kind node image: a default StorageClass without a dynamic provisioner
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: \"true\"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
";

/// kind's `images/base/files` tree, with the modes its Dockerfile gives (executables under
/// `usr/local/bin` and `kind/bin`, everything else 0644; the module cache's files are read-only).
fn copy_kind_files(from: &Path, to: &Path) -> Result<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let src = from.join(&rel);
        for entry in fs::read_dir(&src).with_context(|| format!("read {}", src.display()))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                fs::create_dir_all(to.join(&rel))?;
                fs::set_permissions(to.join(&rel), fs::Permissions::from_mode(0o755))?;
                stack.push(rel);
                continue;
            }
            let executable = rel.starts_with("usr/local/bin") || rel.starts_with("kind/bin");
            let dest = to.join(&rel);
            let _ = fs::remove_file(&dest);
            fs::copy(entry.path(), &dest).with_context(|| format!("copy {}", rel.display()))?;
            fs::set_permissions(&dest, fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 }))?;
        }
    }
    Ok(())
}

/// What kind's base Dockerfile does after installing its packages: no units but its own are
/// started, journald does not read kmsg, systemd is /sbin/init, kubelet, containerd and
/// undo-mount-hacks are enabled, binfmt is masked.
async fn kind_base_steps(root: &Path) -> Result<()> {
    let _ =
        fs::remove_file(root.join("lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service"));
    for (dir, only) in [
        ("lib/systemd/system/multi-user.target.wants", None),
        ("lib/systemd/system/local-fs.target.wants", None),
        ("lib/systemd/system/basic.target.wants", None),
        ("lib/systemd/system/sockets.target.wants", Some(["udev", "initctl"])),
    ] {
        let Ok(entries) = fs::read_dir(root.join(dir)) else { continue };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if only.is_none_or(|words| words.iter().any(|w| name.contains(w))) {
                fs::remove_file(entry.path()).with_context(|| format!("remove {dir}/{name}"))?;
            }
        }
    }
    if let Ok(entries) = fs::read_dir(root.join("etc/systemd/system")) {
        for entry in entries.filter_map(|e| e.ok()) {
            if entry.file_name().to_string_lossy().ends_with(".wants") {
                remove_tree(&entry.path())?;
            }
        }
    }
    let journald = root.join("etc/systemd/journald.conf");
    let mut text = fs::read_to_string(&journald).unwrap_or_default();
    text.push_str("ReadKMsg=no\n");
    fs::write(&journald, text).with_context(|| format!("write {}", journald.display()))?;
    let init = root.join("sbin/init");
    let _ = fs::remove_file(&init);
    symlink("/usr/lib/systemd/systemd", &init).context("link /sbin/init")?;
    for args in [
        &["enable", "kubelet.service", "containerd.service", "undo-mount-hacks.service"][..],
        &["mask", "systemd-binfmt.service"][..],
    ] {
        let mut cmd = tokio::process::Command::new("chroot");
        cmd.arg(root).arg("systemctl").args(args);
        run_logged(cmd, &format!("systemctl {}", args.join(" ")), QUICK).await?;
    }
    Ok(())
}

/// Our binaries where kind's images have theirs.
fn install_binaries(root: &Path, bins: &Binaries) -> Result<()> {
    let local = root.join("usr/local/bin");
    for (src, dest) in [
        (bins.containerd(), local.join("containerd")),
        (bins.dir.join("containerd-shim-runc-v2"), local.join("containerd-shim-runc-v2")),
        (bins.ctr(), local.join("ctr")),
        (bins.crictl(), local.join("crictl")),
        (bins.runc(), root.join("usr/local/sbin/runc")),
        (bins.kube(), local.join("kube")),
        (bins.kube_proxy(), local.join("kube-proxy")),
        (bins.kubeadm(), root.join("usr/bin/kubeadm")),
        (bins.kubectl(), root.join("usr/bin/kubectl")),
    ] {
        copy_executable(&src, &dest)?;
    }
    for (name, src) in bins.cni_plugins() {
        copy_executable(&src, &root.join("opt/cni/bin").join(name))?;
    }
    for name in KUBE_LINKS {
        let link = local.join(name);
        let _ = fs::remove_file(&link);
        symlink("kube", &link).with_context(|| format!("link {}", link.display()))?;
    }
    let kubelet = root.join("usr/bin/kubelet");
    let _ = fs::remove_file(&kubelet);
    symlink("/usr/local/bin/kube", &kubelet).context("link /usr/bin/kubelet")?;
    Ok(())
}

/// containerd's config with the sandbox image we import, and the base OCI spec kind's config
/// names: `ctr oci spec` with kind's createContainer hook and without rlimits, as kind's base
/// image builds it.
async fn containerd_files(root: &Path, bins: &Binaries) -> Result<()> {
    let path = root.join("etc/containerd/config.toml");
    let config = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let config = with_sandbox_image(&config, images::PAUSE)?;
    fs::write(&path, config).with_context(|| format!("write {}", path.display()))?;

    let out =
        tokio::time::timeout(QUICK, tokio::process::Command::new(bins.ctr()).args(["oci", "spec"]).output())
            .await
            .context("`ctr oci spec` did not finish within 2 minutes")?
            .context("run ctr oci spec")?;
    ensure!(out.status.success(), "ctr oci spec failed: {}", String::from_utf8_lossy(&out.stderr));
    let spec = cri_base_spec(&out.stdout)?;
    write(root, "etc/containerd/cri-base.json", &spec, 0o644)
}

/// containerd's config with `sandbox_image` set to `image`.
pub fn with_sandbox_image(config: &str, image: &str) -> Result<String> {
    let mut found = false;
    let lines: Vec<String> = config
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("sandbox_image") {
                found = true;
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}sandbox_image = \"{image}\"")
            } else {
                line.to_string()
            }
        })
        .collect();
    ensure!(found, "kind's containerd config names no sandbox_image");
    Ok(lines.join("\n") + "\n")
}

/// kind's base runtime spec from `ctr oci spec` output.
pub fn cri_base_spec(ctr_spec: &[u8]) -> Result<String> {
    let mut spec: serde_json::Value = serde_json::from_slice(ctr_spec).context("ctr oci spec is not JSON")?;
    let object = spec.as_object_mut().context("ctr oci spec is not a JSON object")?;
    let hooks = object.entry("hooks").or_insert_with(|| serde_json::json!({}));
    let create = hooks
        .as_object_mut()
        .context("hooks is not an object")?
        .entry("createContainer")
        .or_insert_with(|| serde_json::json!([]));
    create
        .as_array_mut()
        .context("hooks.createContainer is not a list")?
        .push(serde_json::json!({"path": "/kind/bin/mount-product-files.sh"}));
    if let Some(process) = object.get_mut("process").and_then(|p| p.as_object_mut()) {
        process.remove("rlimits");
    }
    Ok(serde_json::to_string_pretty(&spec)?)
}

fn copy_executable(src: &Path, dest: &Path) -> Result<()> {
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let _ = fs::remove_file(dest);
    fs::copy(src, dest).with_context(|| format!("copy {} to {}", src.display(), dest.display()))?;
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn write(root: &Path, rel: &str, contents: &str, mode: u32) -> Result<()> {
    let path = root.join(rel);
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    fs::write(&path, contents).with_context(|| format!("write {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Removes a directory tree if it exists.
pub fn remove_tree(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("remove {}", path.display())),
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_image_is_replaced_in_place() {
        let config = "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.10\"\n  x = 1\n";
        let out = with_sandbox_image(config, "registry.k8s.io/pause:3.10.2").unwrap();
        assert!(out.contains("  sandbox_image = \"registry.k8s.io/pause:3.10.2\"\n"), "{out}");
        assert!(out.contains("  x = 1"));
        assert!(with_sandbox_image("x = 1\n", "p").is_err());
    }

    #[test]
    fn the_base_spec_gets_kind_s_hook_and_loses_rlimits() {
        let spec = br#"{"process":{"rlimits":[{"type":"RLIMIT_NOFILE"}],"args":["sh"]},"hooks":{}}"#;
        let out: serde_json::Value = serde_json::from_str(&cri_base_spec(spec).unwrap()).unwrap();
        assert!(out["process"].get("rlimits").is_none());
        assert_eq!(out["process"]["args"][0], "sh");
        assert_eq!(out["hooks"]["createContainer"][0]["path"], "/kind/bin/mount-product-files.sh");
    }
}
