//! `cluster up --k8s-source DIR` against a real checkout: a copy of Kubernetes v1.37.2's sources
//! (k8s.io/kubernetes from the Go module cache, its staging modules under staging/src/k8s.io as
//! in a git checkout, committed and tagged v1.37.2 in a fresh git repository) with one visible
//! change: the kubelet reports a marked OS image in its Node's status. The cluster built from
//! it shows the mark and the version `git describe` gives the edited tree (v1.37.2-dirty); a
//! second edit is rebuilt (only what it touches) and shows up after `cluster up` again.
//!
//! It owns the local cluster while it runs (it stops a running one) and leaves it down. The
//! first build compiles everything from the copy's paths (cold: about as long as the first
//! `cluster up`), later ones reuse Go's cache. Run:
//! `cargo test -p xtask --test k8s_source -- --ignored --nocapture`
//! (`DRA_E2E_K8S_SOURCE_COPY=DIR` keeps the copy there between runs).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};

const VERSION: &str = "v1.37.2";
const SETTER: &str = "pkg/kubelet/nodestatus/setters.go";
const ORIGINAL: &str = "node.Status.NodeInfo.OSImage = verinfo.ContainerOsVersion";

fn run(dir: &Path, program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .with_context(|| format!("run {program} {}", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "{program} {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `go mod download -json module@version`'s directory.
fn module_dir(module: &str, version: &str) -> Result<PathBuf> {
    let json = run(Path::new("/"), "go", &["mod", "download", "-json", &format!("{module}@{version}")])?;
    let value: serde_json::Value = serde_json::from_str(&json)?;
    value["Dir"].as_str().map(PathBuf::from).with_context(|| format!("no Dir for {module}@{version}: {json}"))
}

/// A git checkout of `VERSION` assembled from the module cache, committed and tagged.
fn assemble(dest: &Path) -> Result<()> {
    if dest.join(".git").is_dir() {
        run(dest, "git", &["checkout", "--", "."])?;
        return Ok(());
    }
    let k8s = module_dir("k8s.io/kubernetes", VERSION)?;
    run(Path::new("/"), "cp", &["-r", &k8s.to_string_lossy(), &dest.to_string_lossy()])?;
    run(dest, "chmod", &["-R", "u+w", "."])?;
    let go_mod = std::fs::read_to_string(dest.join("go.mod"))?;
    let staging_version = format!("v0.{}", VERSION.trim_start_matches("v1."));
    for line in go_mod.lines() {
        let mut words = line.split_whitespace();
        let (Some(module), Some("v0.0.0")) = (words.next(), words.next()) else { continue };
        if !module.starts_with("k8s.io/") {
            continue;
        }
        let source = module_dir(module, &staging_version)?;
        let target = dest.join("staging/src").join(module);
        std::fs::create_dir_all(target.parent().context("staging parent")?)?;
        run(Path::new("/"), "cp", &["-r", &source.to_string_lossy(), &target.to_string_lossy()])?;
    }
    run(dest, "chmod", &["-R", "u+w", "."])?;
    run(dest, "git", &["init", "-q"])?;
    run(dest, "git", &["add", "-A"])?;
    run(dest, "git", &["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", VERSION])?;
    run(dest, "git", &["tag", VERSION])?;
    Ok(())
}

/// Changes what the kubelet reports as OS image to end in `mark`.
fn mark_os_image(checkout: &Path, mark: &str) -> Result<()> {
    let path = checkout.join(SETTER);
    let text = std::fs::read_to_string(&path)?;
    let start = text.find("node.Status.NodeInfo.OSImage = ").context("OSImage setter not found")?;
    let end = start + text[start..].find('\n').context("line end")?;
    let edited = format!("{}{ORIGINAL} + \" ({mark})\"{}", &text[..start], &text[end..]);
    std::fs::write(&path, edited)?;
    Ok(())
}

fn xtask(repo: &Path, args: &[&str]) -> Result<String> {
    let started = Instant::now();
    let out = Command::new(env!("CARGO"))
        .args(["xtask"])
        .args(args)
        .current_dir(repo)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("run cargo xtask {}", args.join(" ")))?;
    eprintln!("cargo xtask {}: {:.0?}", args.join(" "), started.elapsed());
    if !out.status.success() {
        bail!("cargo xtask {} failed ({})", args.join(" "), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every node's (OS image, kubelet version).
fn nodes(kubeconfig: &str) -> Result<Vec<(String, String)>> {
    let json = run(Path::new("/"), "kubectl", &["--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"])?;
    let value: serde_json::Value = serde_json::from_str(&json)?;
    let items = value["items"].as_array().context("no items")?;
    Ok(items
        .iter()
        .map(|n| {
            let info = &n["status"]["nodeInfo"];
            (
                info["osImage"].as_str().unwrap_or("").to_string(),
                info["kubeletVersion"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect())
}

#[test]
#[ignore = "builds Kubernetes from a copy of its sources and runs the local cluster: run by hand"]
fn a_cluster_built_from_a_changed_checkout_shows_the_change() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().context("repo")?.to_path_buf();
    let kept = std::env::var_os("DRA_E2E_K8S_SOURCE_COPY").map(PathBuf::from);
    let temp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let checkout = kept.unwrap_or_else(|| temp.path().join("kubernetes"));
    assemble(&checkout)?;
    let source = checkout.to_string_lossy().into_owned();

    let result = (|| -> Result<()> {
        mark_os_image(&checkout, "edited once")?;
        let kubeconfig = xtask(&repo, &["cluster", "up", "--provider", "local", "--k8s-source", &source])?;
        let kubeconfig = kubeconfig.lines().last().context("no kubeconfig printed")?.trim().to_string();
        for (os, kubelet) in nodes(&kubeconfig)? {
            ensure!(os.ends_with("(edited once)"), "a node reports OS image {os:?}, without the edit");
            ensure!(
                kubelet == format!("{VERSION}-dirty"),
                "a kubelet reports {kubelet}, not {VERSION}-dirty"
            );
        }

        mark_os_image(&checkout, "edited twice")?;
        xtask(&repo, &["cluster", "up", "--provider", "local", "--k8s-source", &source])?;
        for (os, _) in nodes(&kubeconfig)? {
            ensure!(os.ends_with("(edited twice)"), "after the second edit a node reports OS image {os:?}");
        }
        Ok(())
    })();
    let down = xtask(&repo, &["cluster", "down", "--provider", "local"]);
    result?;
    down.map(|_| ())
}
