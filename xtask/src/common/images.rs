//! The four images the cluster needs, built without a registry: the pause sandbox, a busybox image
//! with a shell for test pods, the DRA proxy image under hostpathplugin's official name, and
//! upstream's sample device plugin under its official name. Each is written as a Docker-format
//! archive (RepoTags keep the full names) and imported into containerd's `k8s.io` namespace with
//! the pinned label, so no pod ever pulls and the kubelet never collects them.

use std::{
    fs::{self, File},
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::common::{build::Binaries, layout::Layout};

/// The sandbox image containerd pins (the name and tag Kubernetes v1.37 uses).
pub const PAUSE: &str = "registry.k8s.io/pause:3.10.2";
/// The image of test pods (upstream e2e's BusyBox image name and tag).
pub const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
/// The DRA proxy image: the hostpathplugin tag the Kubernetes v1.37 e2e manifests use.
pub const HOSTPATHPLUGIN: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1";

/// Upstream's sample device plugin, with the name and tag of Kubernetes v1.37's
/// test/e2e/testing-manifests/sample-device-plugin manifests (the image's VERSION file says
/// 1.8.0). Upstream's image is alpine plus the binary; the binary needs no libc (it is static
/// here), no shell and no tool, only a writable `/tmp`: its Allocate creates `/tmp/<device ID>`.
pub const SAMPLE_DEVICE_PLUGIN: &str = "registry.k8s.io/e2e-test-images/sample-device-plugin:1.8.0";

/// Where the static busybox of Debian's busybox-static package is.
pub const BUSYBOX_BINARY: &str = "/bin/busybox";

/// One file of an image layer.
#[derive(Debug, Clone)]
enum Entry {
    Dir(&'static str, u32),
    File { path: String, source: PathBuf, mode: u32 },
    Text { path: &'static str, contents: &'static str },
    Symlink { path: String, target: &'static str },
}

/// An image to build.
struct ImageSpec {
    name: &'static str,
    entries: Vec<Entry>,
    entrypoint: Vec<&'static str>,
    cmd: Vec<&'static str>,
}

/// Builds the four archives and imports them into every node's containerd (`sockets`), the nodes
/// in parallel.
pub fn build_and_import(bins: &Binaries, layout: &Layout, sockets: &[PathBuf]) -> Result<()> {
    let archives = test_archives(bins, &layout.images())?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = sockets
            .iter()
            .map(|socket| {
                let archives = &archives;
                scope.spawn(move || -> Result<()> {
                    for (archive, name) in archives {
                        import(bins, socket, archive, name)
                            .with_context(|| format!("into the containerd at {}", socket.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| anyhow::anyhow!("an import thread panicked"))?)
    })
}

/// Writes the four images every cluster needs (pause, busybox, the DRA proxy image, the sample
/// device plugin) as Docker archives into `dir`, for both providers: the local one imports them
/// into each node's containerd, the kind one into its node image. Returns (archive, image name).
pub fn test_archives(bins: &Binaries, dir: &Path) -> Result<Vec<(PathBuf, &'static str)>> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let busybox_entries = busybox_entries()?;
    let mut hostpath_entries = busybox_entries.clone();
    hostpath_entries.push(Entry::File {
        path: "hostpathplugin".into(),
        source: bins.hostpathplugin(),
        mode: 0o755,
    });
    // For the harness's interposer: a byte stream to a socket in the pod through exec.
    hostpath_entries.push(Entry::File {
        path: "dra-e2e-dial".into(),
        source: bins.dra_e2e_dial(),
        mode: 0o755,
    });
    let specs = vec![
        ImageSpec {
            name: PAUSE,
            entries: vec![Entry::File { path: "pause".into(), source: bins.pause(), mode: 0o755 }],
            entrypoint: vec!["/pause"],
            cmd: vec![],
        },
        ImageSpec { name: BUSYBOX, entries: busybox_entries, entrypoint: vec![], cmd: vec!["sh"] },
        ImageSpec {
            name: HOSTPATHPLUGIN,
            entries: hostpath_entries,
            entrypoint: vec!["/hostpathplugin"],
            cmd: vec![],
        },
        sample_device_plugin_image(bins),
    ];
    let mut archives = Vec::new();
    for spec in specs {
        let archive = dir.join(format!("{}.tar", file_stem(spec.name)));
        write_archive(&spec, &archive).with_context(|| format!("build image {}", spec.name))?;
        archives.push((archive, spec.name));
    }
    Ok(archives)
}

/// Writes a one-binary image (the binary at `/<file name>`, a writable `/tmp`, run as
/// `entrypoint`) as a Docker archive at `path`: CoreDNS in the kind node image.
pub fn write_binary_image(name: &str, binary: &Path, entrypoint: &str, path: &Path) -> Result<()> {
    let file = binary.file_name().context("a binary path without a file name")?.to_string_lossy();
    let mut entries = base_entries();
    entries.push(Entry::File { path: file.into_owned(), source: binary.to_path_buf(), mode: 0o755 });
    write_image(name, &entries, &[entrypoint], &[], path).with_context(|| format!("build image {name}"))
}

/// Writes an image of one dynamically linked binary (at `/<file name>`, its entrypoint) with the
/// shared libraries and loader it loads, each at its path on this host (`libs`, from
/// [`shared_libs::of`](crate::common::shared_libs::of)), so it runs in an image without a libc;
/// a Docker archive at `path`. The example DRA driver's image.
pub fn write_linked_binary_image(name: &str, binary: &Path, libs: &[PathBuf], path: &Path) -> Result<()> {
    let file = binary.file_name().context("a binary path without a file name")?.to_string_lossy();
    let entrypoint = format!("/{file}");
    let mut entries = base_entries();
    entries.push(Entry::File { path: file.into_owned(), source: binary.to_path_buf(), mode: 0o755 });
    for lib in libs {
        let in_image = lib.strip_prefix("/").unwrap_or(lib).display().to_string();
        entries.push(Entry::File { path: in_image, source: lib.clone(), mode: 0o755 });
    }
    write_image(name, &entries, &[&entrypoint], &[], path).with_context(|| format!("build image {name}"))
}

/// One image of [`write_shared_layer_archive`]: its name and entrypoint.
#[derive(Debug, Clone)]
pub struct SharedLayerImage {
    /// The full name with tag (`registry.k8s.io/kube-apiserver:v1.37.2`).
    pub name: String,
    /// The entrypoint (kubeadm's static pods name their command, so it may be empty).
    pub entrypoint: Vec<String>,
}

/// Writes one Docker archive holding several images that share one layer, the tar at `layer`
/// (the kind node image's control-plane and kube-proxy images: the layer is stored once).
pub fn write_shared_layer_archive(path: &Path, layer: &Path, images: &[SharedLayerImage]) -> Result<()> {
    let digest = {
        let mut file = File::open(layer).with_context(|| format!("open {}", layer.display()))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).with_context(|| format!("read {}", layer.display()))?;
        hex::encode(hasher.finalize())
    };
    let layer_name = format!("{digest}/layer.tar");
    let mut configs = Vec::new();
    let mut manifest = Vec::new();
    for image in images {
        let config = image_config(&image.entrypoint, &[], &digest)?;
        let config_name = format!("{}.json", sha256_hex(&config));
        manifest.push(
            serde_json::json!({"Config": config_name, "RepoTags": [image.name], "Layers": [layer_name]}),
        );
        configs.push((config_name, config));
    }
    let manifest = serde_json::to_vec(&manifest)?;
    let tmp = path.with_extension("tar.partial");
    let mut archive =
        tar::Builder::new(File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?);
    append_bytes(&mut archive, "manifest.json", &manifest)?;
    for (name, config) in &configs {
        append_bytes(&mut archive, name, config)?;
    }
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_size(fs::metadata(layer)?.len());
    archive.append_data(&mut h, &layer_name, File::open(layer)?)?;
    archive.into_inner()?.flush()?;
    fs::rename(&tmp, path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

fn append_bytes(archive: &mut tar::Builder<File>, name: &str, data: &[u8]) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    archive.append_data(&mut h, name, data)?;
    Ok(())
}

/// The sample device plugin on the base directories (with `/tmp`), with upstream's entrypoint. The
/// plugin reads `PLUGIN_SOCK_DIR` (default `/var/lib/kubelet/device-plugins/`), and only when set
/// `CDI_ENABLED` and `REGISTER_CONTROL_FILE`; the manifest mounts the directories it uses.
fn sample_device_plugin_image(bins: &Binaries) -> ImageSpec {
    let mut entries = base_entries();
    entries.push(Entry::File {
        path: "sampledeviceplugin".into(),
        source: bins.sample_device_plugin(),
        mode: 0o755,
    });
    ImageSpec {
        name: SAMPLE_DEVICE_PLUGIN,
        entries,
        entrypoint: vec!["/sampledeviceplugin", "-alsologtostderr"],
        cmd: vec![],
    }
}

fn file_stem(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

/// Busybox with every applet linked at its usual path, plus the few files a shell image needs.
fn busybox_entries() -> Result<Vec<Entry>> {
    let out = Command::new(BUSYBOX_BINARY)
        .arg("--list-full")
        .output()
        .with_context(|| format!("run {BUSYBOX_BINARY} --list-full (install Debian's busybox-static)"))?;
    if !out.status.success() {
        bail!("{BUSYBOX_BINARY} --list-full failed");
    }
    let mut entries = base_entries();
    entries.push(Entry::File { path: "bin/busybox".into(), source: BUSYBOX_BINARY.into(), mode: 0o755 });
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let applet = applet.trim();
        if applet.is_empty() || applet == "bin/busybox" {
            continue;
        }
        entries.push(Entry::Symlink { path: applet.to_string(), target: "/bin/busybox" });
    }
    Ok(entries)
}

fn base_entries() -> Vec<Entry> {
    vec![
        Entry::Dir("bin", 0o755),
        Entry::Dir("sbin", 0o755),
        Entry::Dir("usr", 0o755),
        Entry::Dir("usr/bin", 0o755),
        Entry::Dir("usr/sbin", 0o755),
        Entry::Dir("etc", 0o755),
        Entry::Dir("root", 0o700),
        Entry::Dir("tmp", 0o1777),
        Entry::Dir("var", 0o755),
        Entry::Text {
            path: "etc/passwd",
            contents: "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        },
        Entry::Text { path: "etc/group", contents: "root:x:0:\nnobody:x:65534:\n" },
    ]
}

/// Writes a reproducible layer tar (mtime 0, root-owned).
fn layer_tar(entries: &[Entry]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let header = |mode: u32, kind: tar::EntryType, size: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(kind);
        h.set_size(size);
        h
    };
    for entry in entries {
        match entry {
            Entry::Dir(path, mode) => {
                let mut h = header(*mode, tar::EntryType::Directory, 0);
                builder.append_data(&mut h, format!("{path}/"), std::io::empty())?;
            }
            Entry::File { path, source, mode } => {
                let data = fs::read(source).with_context(|| format!("read {}", source.display()))?;
                let mut h = header(*mode, tar::EntryType::Regular, data.len() as u64);
                builder.append_data(&mut h, path, data.as_slice())?;
            }
            Entry::Text { path, contents } => {
                let mut h = header(0o644, tar::EntryType::Regular, contents.len() as u64);
                builder.append_data(&mut h, path, contents.as_bytes())?;
            }
            Entry::Symlink { path, target } => {
                let mut h = header(0o777, tar::EntryType::Symlink, 0);
                builder.append_link(&mut h, path, target)?;
            }
        }
    }
    Ok(builder.into_inner()?)
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The image config (Docker's format) of a one-layer image.
fn image_config<S: AsRef<str>>(entrypoint: &[S], cmd: &[S], layer_digest: &str) -> Result<Vec<u8>> {
    let list = |items: &[S]| {
        if items.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::json!(items.iter().map(|s| s.as_ref()).collect::<Vec<_>>())
        }
    };
    let config = serde_json::json!({
        "architecture": go_arch(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": list(entrypoint),
            "Cmd": list(cmd),
            "WorkingDir": "/",
            "Labels": {"org.dra-e2e.built-by": "cargo xtask"},
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        "history": [{"created_by": "dra-e2e image builder"}],
    });
    Ok(serde_json::to_vec(&config)?)
}

/// Writes a Docker-format image archive (manifest.json with RepoTags, the config, one layer).
fn write_archive(spec: &ImageSpec, path: &Path) -> Result<()> {
    write_image(spec.name, &spec.entries, &spec.entrypoint, &spec.cmd, path)
}

fn write_image(name: &str, entries: &[Entry], entrypoint: &[&str], cmd: &[&str], path: &Path) -> Result<()> {
    let layer = layer_tar(entries)?;
    let layer_digest = sha256_hex(&layer);
    let config = image_config(entrypoint, cmd, &layer_digest)?;
    let config_name = format!("{}.json", sha256_hex(&config));
    let layer_name = format!("{layer_digest}/layer.tar");
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name,
        "RepoTags": [name],
        "Layers": [layer_name],
    }]))?;

    let tmp = path.with_extension("tar.partial");
    let mut archive = tar::Builder::new(File::create(&tmp)?);
    for (name, data) in
        [("manifest.json", &manifest), (config_name.as_str(), &config), (layer_name.as_str(), &layer)]
    {
        append_bytes(&mut archive, name, data)?;
    }
    archive.into_inner()?.flush()?;
    fs::rename(&tmp, path)?;
    Ok(())
}

/// `cluster load`: imports user archives into every node's containerd (`sockets`), the nodes in
/// parallel, as [`build_and_import`] does but without the pinned label (they are the user's
/// images: the kubelet may collect them like pulled ones). Returns the image names ctr reports
/// for each archive (the same on every node).
pub fn load(
    bins: &Binaries,
    sockets: &[PathBuf],
    archives: &[PathBuf],
) -> Result<Vec<(PathBuf, Vec<String>)>> {
    let per_node: Vec<Vec<(PathBuf, Vec<String>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sockets
            .iter()
            .map(|socket| {
                scope.spawn(move || -> Result<Vec<(PathBuf, Vec<String>)>> {
                    archives
                        .iter()
                        .map(|archive| {
                            let out = ctr(
                                bins,
                                socket,
                                &["images", "import", "--local", &archive.display().to_string()],
                            )
                            .with_context(|| {
                                format!(
                                    "import {} into the containerd at {}",
                                    archive.display(),
                                    socket.display()
                                )
                            })?;
                            Ok((archive.clone(), imported_names(&out)))
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("an import thread panicked"))?)
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(per_node.into_iter().next().unwrap_or_default())
}

/// The names in ctr import's `unpacking NAME (DIGEST)...done` lines.
fn imported_names(output: &str) -> Vec<String> {
    output
        .split("unpacking ")
        .skip(1)
        .filter_map(|part| part.split_once(" (").map(|(name, _)| name.trim().to_string()))
        .collect()
}

/// `ctr -n k8s.io images import` then the CRI pinned label.
fn import(bins: &Binaries, socket: &Path, archive: &Path, name: &str) -> Result<()> {
    ctr(bins, socket, &["images", "import", "--local", &archive.display().to_string()])
        .with_context(|| format!("import {name}"))?;
    ctr(bins, socket, &["images", "label", name, "io.cri-containerd.pinned=pinned"])
        .with_context(|| format!("pin {name}"))?;
    Ok(())
}

/// Runs ctr against this cluster's containerd in the `k8s.io` namespace.
pub fn ctr(bins: &Binaries, socket: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(bins.ctr())
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .with_context(|| format!("run {}", bins.ctr().display()))?;
    if !out.status.success() {
        bail!("ctr {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imported_names_are_read_from_ctr_s_output() {
        let out = "unpacking localhost/a:1 (sha256:abc)...done\nunpacking docker.io/library/b:2 (sha256:def)...done\n";
        assert_eq!(imported_names(out), ["localhost/a:1", "docker.io/library/b:2"]);
        assert!(imported_names("").is_empty());
    }

    #[test]
    fn archives_are_docker_format_with_full_names() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("pause");
        fs::write(&bin, b"#!/bin/true\n").unwrap();
        let spec = ImageSpec {
            name: PAUSE,
            entries: vec![Entry::File { path: "pause".into(), source: bin, mode: 0o755 }],
            entrypoint: vec!["/pause"],
            cmd: vec![],
        };
        let path = dir.path().join("pause.tar");
        write_archive(&spec, &path).unwrap();
        let mut archive = tar::Archive::new(File::open(&path).unwrap());
        let mut names = Vec::new();
        let mut manifest = None;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            if name == "manifest.json" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut entry, &mut s).unwrap();
                manifest = Some(serde_json::from_str::<serde_json::Value>(&s).unwrap());
            }
            names.push(name);
        }
        let manifest = manifest.unwrap();
        assert_eq!(manifest[0]["RepoTags"][0], PAUSE);
        assert!(names.iter().any(|n| n.ends_with("/layer.tar")));
        // Reproducible: the same input gives the same bytes.
        let again = dir.path().join("again.tar");
        write_archive(&spec, &again).unwrap();
        assert_eq!(fs::read(&path).unwrap(), fs::read(&again).unwrap());
    }

    #[test]
    fn sample_device_plugin_image_is_what_the_manifest_runs() {
        let dir = tempfile::tempdir().unwrap();
        let bins = Binaries { dir: dir.path().to_path_buf() };
        fs::write(bins.sample_device_plugin(), b"#!/bin/true\n").unwrap();
        let spec = sample_device_plugin_image(&bins);
        // The name the suites' DaemonSet uses, so that the kubelet finds it imported.
        let ds = harness::device_plugin::daemonset("ns", &[]).unwrap();
        let container = &ds.spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some(spec.name));
        assert_eq!(spec.entrypoint, ["/sampledeviceplugin", "-alsologtostderr"]);

        let layer = layer_tar(&spec.entries).unwrap();
        let mut found = Vec::new();
        for entry in tar::Archive::new(layer.as_slice()).entries().unwrap() {
            let entry = entry.unwrap();
            let mode = entry.header().mode().unwrap();
            found.push((entry.path().unwrap().display().to_string(), mode));
        }
        assert!(found.contains(&("sampledeviceplugin".to_owned(), 0o755)), "{found:?}");
        // Its Allocate creates /tmp/<device ID> inside the container.
        assert!(found.contains(&("tmp/".to_owned(), 0o1777)), "{found:?}");
    }
}
