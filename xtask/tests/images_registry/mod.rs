//! `cargo xtask kubectl`, `cargo xtask cluster load` and the local registry (`cluster up
//! --registry`), end to end: images built here (a static Go program in a one-layer image, no
//! registry on the network) are loaded into the nodes or pushed to the local registry with crane
//! (built from go-containerregistry's module), and pods run them. Every image is removed from the
//! nodes and the registry afterwards.
//!
//! The tests without `#[ignore]` need no cluster: they check the usage errors.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::Mutex,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{LogParams, PostParams},
    runtime::wait::await_condition,
};
use sha2::{Digest, Sha256};

use super::{
    CONTROL_PLANE, WORKERS, client, in_namespace,
    nodes_support::{containerd_socket, ctr, on_node, state_dir},
    pod,
};

/// The host address of the local registry (`cluster up --registry`).
const REGISTRY: &str = "127.0.0.1:5000";
/// How long a pod may take to pull and run.
const RUN_WAIT: Duration = Duration::from_secs(180);

fn xtask(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(args);
    cmd
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A token that tells this run's images apart.
fn token() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos());
    format!("{:x}{:x}", std::process::id(), nanos.unwrap_or_default() % 0xffff_ffff)
}

/// The Go module of the test programs (the hello program and crane).
fn go_module() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images_support/go")
}

/// Builds a program of the test Go module once per test process (static, no cgo).
fn go_build(name: &str, package: &str) -> Result<PathBuf> {
    static BUILD: Mutex<()> = Mutex::new(());
    let _guard = BUILD.lock().map_err(|_| anyhow::anyhow!("an earlier build panicked"))?;
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("images-support").join(name);
    if out.is_file() {
        return Ok(out);
    }
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .args(["-ldflags", "-s -w", package])
        .env("CGO_ENABLED", "0")
        .current_dir(go_module())
        .status()
        .context("run go build (Go is needed by the local cluster anyway)")?;
    if !status.success() {
        bail!("go build {package} failed ({status})");
    }
    Ok(out)
}

/// Writes a Docker-format archive of a one-layer image: the static hello program at /hello and
/// `message` at /message; it runs /hello, which prints the message.
fn write_image(path: &Path, name: &str, message: &str) -> Result<()> {
    let hello = std::fs::read(go_build("hello", "./hello")?)?;
    let mut layer = tar::Builder::new(Vec::new());
    for (file, data, mode) in [("hello", hello.as_slice(), 0o755), ("message", message.as_bytes(), 0o644)] {
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        layer.append_data(&mut h, file, data)?;
    }
    let layer = layer.into_inner()?;
    let hex = |d: &[u8]| Sha256::digest(d).iter().map(|b| format!("{b:02x}")).collect::<String>();
    let layer_digest = hex(&layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": match std::env::consts::ARCH { "x86_64" => "amd64", "aarch64" => "arm64", a => a },
        "os": "linux",
        "config": {"Entrypoint": ["/hello"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    }))?;
    let config_name = format!("{}.json", hex(&config));
    let layer_name = format!("{layer_digest}/layer.tar");
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}
    ]))?;
    let mut archive = tar::Builder::new(File::create(path)?);
    for (file, data) in
        [("manifest.json", &manifest), (config_name.as_str(), &config), (layer_name.as_str(), &layer)]
    {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        archive.append_data(&mut h, file, data.as_slice())?;
    }
    archive.into_inner()?.flush()?;
    Ok(())
}

/// Runs `image` (never pulled when `policy` is Never) on `node` until it exits; returns its log.
async fn run_to_completion(
    pods: &Api<Pod>,
    name: &str,
    node: &str,
    image: &str,
    policy: &str,
) -> Result<String> {
    let mut p = on_node(pod(name, image, &[])?, node)?;
    let spec = p.spec.as_mut().context("spec")?;
    spec.restart_policy = Some("Never".into());
    spec.containers[0].command = None;
    spec.containers[0].image_pull_policy = Some(policy.into());
    pods.create(&PostParams::default(), &p).await?;
    let done = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
    };
    if tokio::time::timeout(RUN_WAIT, await_condition(pods.clone(), name, done)).await.is_err() {
        let status = pods.get(name).await.map(|p| format!("{:?}", p.status)).unwrap_or_default();
        bail!("pod {name} ({image} on {node}) did not finish within {RUN_WAIT:?}: {status}");
    }
    let phase = pods.get(name).await?.status.and_then(|s| s.phase).unwrap_or_default();
    let log = pods.logs(name, &LogParams::default()).await?;
    if phase != "Succeeded" {
        bail!("pod {name} ({image} on {node}) ended {phase}: {log}");
    }
    Ok(log)
}

/// Removes `image` from every node's containerd with every other reference to the same manifest
/// (a CRI pull also records `repo@digest` and the image ID); nodes without it are skipped.
fn remove_from_nodes(image: &str) -> Result<()> {
    let ctr = ctr()?;
    for node in WORKERS.iter().copied().chain([CONTROL_PLANE]) {
        let run = |args: &[&str]| -> Result<String> {
            let out = Command::new(&ctr)
                .arg("--address")
                .arg(containerd_socket(node))
                .args(["--namespace", "k8s.io"])
                .args(args)
                .output()?;
            if !out.status.success() {
                bail!("ctr {} on {node}: {}", args.join(" "), stderr(&out));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        // Columns: REF TYPE DIGEST ...
        let listed = run(&["images", "ls"])?;
        let rows: Vec<Vec<&str>> = listed.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
        let Some(digest) = rows.iter().find(|r| r.first() == Some(&image)).and_then(|r| r.get(2).copied())
        else {
            continue;
        };
        let refs: Vec<&str> =
            rows.iter().filter(|r| r.get(2) == Some(&digest)).filter_map(|r| r.first().copied()).collect();
        let mut args = vec!["images", "rm"];
        args.extend(refs);
        run(&args)?;
    }
    Ok(())
}

#[test]
fn kubectl_without_a_cluster_or_a_kubeconfig_is_one_sentence_and_exit_2() {
    let empty = tempfile::tempdir().unwrap();
    let out = xtask(&["kubectl", "get", "nodes"])
        .env("DRA_E2E_LOCAL_STATE", empty.path())
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no local cluster is up and no kubeconfig was given"), "{err}");
}

#[test]
fn cluster_load_of_bad_input_is_one_sentence_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.tar");
    std::fs::write(&text, "plain text, not a tar archive of an image, long enough to be read").unwrap();
    let missing = dir.path().join("missing.tar");
    for (path, expected) in [(&missing, "does not exist"), (&text, "is not an image archive")] {
        for provider in ["local", "kind"] {
            let out = xtask(&["cluster", "load", "--provider", provider]).arg(path).output().unwrap();
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(err.contains(expected), "{err}");
        }
    }
}

#[test]
fn cluster_load_for_kind_runs_kind_load_image_archive() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("hello.tar");
    // Only the check before loading reads it: a manifest.json is enough (no Go build here).
    let mut tar = tar::Builder::new(File::create(&archive)?);
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o644);
    tar.append_data(&mut h, "manifest.json", &b"[]"[..])?;
    tar.into_inner()?.flush()?;
    let out = xtask(&["cluster", "load", "--provider", "kind", "--name", "other", "--dry-run"])
        .arg(&archive)
        .output()?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("kind load image-archive --name other {}\n", archive.display())
    );
    Ok(())
}

#[test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
fn kubectl_of_the_pinned_version_gets_the_nodes() -> Result<()> {
    let kubeconfig = std::env::var("DRA_E2E_KUBECONFIG").context("DRA_E2E_KUBECONFIG is not set")?;
    let mut expected: Vec<String> =
        WORKERS.iter().copied().chain([CONTROL_PLANE]).map(|n| format!("node/{n}")).collect();
    expected.sort();
    // The local cluster's kubeconfig by default, or the one given (kubectl's own flag).
    for extra in [vec![], vec!["--kubeconfig", kubeconfig.as_str()]] {
        let out = xtask(&["kubectl"])
            .args(&extra)
            .args(["get", "nodes", "-o", "name"])
            .env_remove("KUBECONFIG")
            .output()?;
        assert!(out.status.success(), "kubectl {extra:?} get nodes: {}", stderr(&out));
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
        names.sort();
        assert_eq!(names, expected);
    }
    let out = xtask(&["kubectl", "version", "-o", "json"]).output()?;
    assert!(out.status.success(), "{}", stderr(&out));
    let version: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(version["clientVersion"]["gitVersion"], version["serverVersion"]["gitVersion"], "{version}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn an_archive_loaded_with_cluster_load_runs_on_every_node() -> Result<()> {
    let token = token();
    let image = format!("dra-e2e.test/hello:load-{token}");
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("hello.tar");
    let message = format!("loaded {token}\n");
    write_image(&archive, &image, &message)?;
    let out = xtask(&["cluster", "load"]).arg(&archive).output()?;
    let result = if out.status.success() {
        let client = client().await?;
        let (image, message) = (image.clone(), message.clone());
        in_namespace(&client, |client, ns| async move {
            let pods: Api<Pod> = Api::namespaced(client, &ns);
            for (i, node) in WORKERS.iter().copied().chain([CONTROL_PLANE]).enumerate() {
                let log = run_to_completion(&pods, &format!("loaded-{i}"), node, &image, "Never").await?;
                assert_eq!(log, message, "the loaded image's program on {node}");
            }
            Ok(())
        })
        .await
    } else {
        Err(anyhow::anyhow!("cargo xtask cluster load failed: {}", stderr(&out)))
    };
    let cleanup = remove_from_nodes(&image);
    result.and(cleanup)
}

#[tokio::test]
#[ignore = "needs the local cluster with --registry: run via cargo xtask test"]
async fn an_image_pushed_to_the_local_registry_runs_in_a_pod() -> Result<()> {
    let token = token();
    let repo = "dra-e2e-test/hello";
    let pushed = format!("{REGISTRY}/{repo}:{token}");
    let image = format!("localhost:5000/{repo}:{token}");
    let dir = tempfile::tempdir()?;
    let archive = dir.path().join("hello.tar");
    let message = format!("pulled from the local registry {token}\n");
    write_image(&archive, "dra-e2e.test/hello:unused", &message)?;
    let crane = go_build("crane", "github.com/google/go-containerregistry/cmd/crane")?;
    let out = Command::new(&crane).arg("push").arg(&archive).arg(&pushed).output()?;
    if !out.status.success() {
        bail!(
            "crane push to {REGISTRY} failed (is the registry up? `cargo xtask cluster up --registry`): {}",
            stderr(&out)
        );
    }
    let digest = String::from_utf8_lossy(&out.stdout).trim().rsplit_once('@').map(|(_, d)| d.to_string());
    let client = client().await?;
    let node = WORKERS[2];
    let result = in_namespace(&client, |client, ns| {
        let image = image.clone();
        async move {
            let pods: Api<Pod> = Api::namespaced(client, &ns);
            let log = run_to_completion(&pods, "pulled", node, &image, "IfNotPresent").await?;
            assert_eq!(log, message);
            Ok(())
        }
    })
    .await;
    // The node pulled it from the registry over the cluster network: the registry's access log
    // has the manifest request from a node address, nothing came from elsewhere.
    let log = std::fs::read_to_string(state_dir().join("logs/registry.log")).unwrap_or_default();
    let from_node = log
        .lines()
        .any(|l| l.contains(&format!("/v2/{repo}/manifests/{token}")) && l.contains("remoteaddr=\"10.89.0."));
    let cleanup = remove_from_nodes(&image).and_then(|()| match &digest {
        Some(d) => {
            let out = Command::new(&crane).args(["delete", &format!("{REGISTRY}/{repo}@{d}")]).output()?;
            if out.status.success() { Ok(()) } else { bail!("crane delete: {}", stderr(&out)) }
        }
        None => bail!("crane push printed no digest"),
    });
    result?;
    assert!(from_node, "the registry log shows no pull of {repo}:{token} from a node");
    cleanup
}

/// The PID records of the cluster's processes (name, first word of the record: the PID).
fn recorded_pids() -> Result<Vec<(String, String)>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(state_dir().join("pids")).context("read the cluster's PID records")? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        pids.push((name, text.split_whitespace().next().unwrap_or_default().to_string()));
    }
    pids.sort();
    Ok(pids)
}

#[test]
#[ignore = "needs the local cluster with --registry: run via cargo xtask test"]
fn cluster_up_with_the_registry_on_a_running_cluster_restarts_nothing() -> Result<()> {
    let before = recorded_pids()?;
    assert!(before.iter().any(|(n, _)| n == "registry"), "the registry runs: {before:?}");
    let out = xtask(&["cluster", "up", "--registry"]).output()?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("the local registry already runs on 127.0.0.1:5000"), "{}", stderr(&out));
    assert_eq!(recorded_pids()?, before, "no process of the cluster was restarted");
    let out = xtask(&["cluster", "status"]).output()?;
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("registry (network namespace dra-e2e-registry): running"), "{status}");
    Ok(())
}
