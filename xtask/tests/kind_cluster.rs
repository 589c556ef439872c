//! A real kind cluster from the node image built here: `cargo xtask cluster up --provider kind`
//! (which builds `dra-e2e/kind-node:<version>-<hash>` first if it is missing), then every node is
//! Ready, CoreDNS is available, a pod on one worker reaches a pod on another worker, and a pod
//! reaches `kubernetes.default` by its DNS name through the Service, and an image pushed to the
//! cluster's registry (`--registry`, `localhost:5001`) runs in a pod; `cluster down` must leave no
//! container of the cluster, no registry and no `kind` network.
//!
//! It needs root, Go, the run's own Docker engine (`cargo xtask docker up`; started here if it
//! does not run, and left running) and, for a cold build, the Go module proxy and Debian's mirror.
//! Run:
//!
//! ```sh
//! cargo test -p xtask --test kind_cluster -- --ignored --nocapture
//! ```

use std::{process::Output, time::Duration};

const CLUSTER: &str = "dra-e2e-kind-test";
/// `cluster up` may build the node image (cold: tens of minutes on two cores).
const UP_TIMEOUT: Duration = Duration::from_secs(60 * 60);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";

/// `cluster down` when dropped, so a failed check leaves nothing behind either.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["cluster", "down", "--provider", "kind", "--name", CLUSTER])
            .status();
        eprintln!("cluster down: {status:?}");
    }
}

async fn run(mut command: tokio::process::Command, what: &str, timeout: Duration) -> Output {
    command.kill_on_drop(true).stdin(std::process::Stdio::null());
    match tokio::time::timeout(timeout, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => panic!("cannot run {what}: {err}"),
        Err(_) => panic!("{what} did not finish within {timeout:?}"),
    }
}

async fn xtask(args: &[&str], timeout: Duration) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_xtask"));
    command.args(args);
    run(command, &format!("xtask {}", args.join(" ")), timeout).await
}

async fn docker(args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new("docker");
    command.args(args).env("DOCKER_HOST", docker_host());
    run(command, &format!("docker {}", args.join(" ")), COMMAND_TIMEOUT).await
}

fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///run/dra-e2e-docker/docker.sock".into())
}

/// kubectl inside the control-plane node, with its admin kubeconfig; panics unless it succeeds.
async fn kubectl(args: &[&str]) -> String {
    let node = format!("{CLUSTER}-control-plane");
    let mut all = vec!["exec", "-i", node.as_str(), "kubectl", "--kubeconfig=/etc/kubernetes/admin.conf"];
    all.extend_from_slice(args);
    let out = docker(&all).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {} failed: {stdout}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A busybox pod on `node` running `script`.
fn pod(name: &str, node: &str, script: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    })
    .to_string()
}

async fn apply(manifest: &str) {
    let node = format!("{CLUSTER}-control-plane");
    let mut command = tokio::process::Command::new("docker");
    command
        .args(["exec", "-i", &node, "kubectl", "--kubeconfig=/etc/kubernetes/admin.conf", "apply", "-f", "-"])
        .env("DOCKER_HOST", docker_host())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("start kubectl apply");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, manifest.as_bytes()).await.expect("write manifest");
    drop(stdin);
    let out = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .expect("kubectl apply did not finish within 5 minutes")
        .expect("kubectl apply");
    assert!(out.status.success(), "kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
#[ignore = "builds a kind node image and runs a four-node kind cluster; needs root and Docker"]
async fn kind_cluster_from_the_image_built_here_works_and_goes_away() {
    let up = xtask(&["docker", "up"], COMMAND_TIMEOUT).await;
    assert!(up.status.success(), "docker up failed: {}", String::from_utf8_lossy(&up.stderr));
    let guard = Cluster;
    let up =
        xtask(&["cluster", "up", "--provider", "kind", "--name", CLUSTER, "--registry"], UP_TIMEOUT).await;
    assert!(
        up.status.success(),
        "cluster up --provider kind failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );

    // Every node Ready (cluster up waited for it; checked again from inside the cluster).
    let nodes = kubectl(&["get", "nodes", "-o", "name"]).await;
    assert_eq!(nodes.lines().count(), 4, "{nodes}");
    kubectl(&["wait", "--for=condition=Ready", "node", "--all", "--timeout=120s"]).await;
    kubectl(&["-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=180s"]).await;

    // A server on one worker, a client on another.
    let worker = format!("{CLUSTER}-worker");
    let worker2 = format!("{CLUSTER}-worker2");
    apply(&pod(
        "server",
        &worker,
        "echo hello-from-server > /tmp/index.html && exec httpd -f -p 8080 -h /tmp",
    ))
    .await;
    kubectl(&["wait", "--for=condition=Ready", "pod/server", "--timeout=120s"]).await;
    let ip = kubectl(&["get", "pod", "server", "-o", "jsonpath={.status.podIP}"]).await;
    assert!(!ip.trim().is_empty(), "the server pod has no IP");
    // busybox's nc, not its wget (which crashes in Debian's static build); `nc NAME 443` resolves
    // the name through CoreDNS and connects through kube-proxy's Service rules.
    let script = format!(
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {ip} 8080 && nslookup kubernetes.default.svc.cluster.local && nc -w 10 kubernetes.default 443 </dev/null && echo reached-kubernetes-default",
        ip = ip.trim()
    );
    apply(&pod("client", &worker2, &script)).await;
    kubectl(&["wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/client", "--timeout=120s"]).await;
    let log = kubectl(&["logs", "client"]).await;
    assert!(log.contains("hello-from-server"), "the client did not reach the server pod:\n{log}");
    assert!(log.contains("Address: 10.96.0.1"), "kubernetes.default did not resolve to its Service:\n{log}");
    assert!(
        log.contains("reached-kubernetes-default"),
        "the client did not reach kubernetes.default:\n{log}"
    );

    // The registry: the host pushes to localhost:5001 (the registry image itself, which is in the
    // engine), a pod pulls it from there.
    let registry_image =
        docker(&["inspect", "--format", "{{.Config.Image}}", &format!("{CLUSTER}-registry")]).await;
    assert!(registry_image.status.success(), "no registry container: {registry_image:?}");
    let pushed = "localhost:5001/dra-e2e/registry:kind-test";
    let source = String::from_utf8_lossy(&registry_image.stdout).trim().to_string();
    for args in [vec!["tag", source.as_str(), pushed], vec!["push", pushed], vec!["image", "rm", pushed]] {
        let out = docker(&args).await;
        assert!(out.status.success(), "docker {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let from_registry = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "from-registry", "namespace": "default"},
        "spec": {
            "nodeName": worker,
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": pushed, "imagePullPolicy": "Always", "args": ["--version"]}],
        },
    });
    apply(&from_registry.to_string()).await;
    kubectl(&["wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/from-registry", "--timeout=120s"])
        .await;
    let log = kubectl(&["logs", "from-registry"]).await;
    assert!(log.contains("registry"), "the pod from the registry printed: {log}");

    drop(guard);
    let left =
        docker(&["ps", "-a", "--filter", &format!("label=io.x-k8s.kind.cluster={CLUSTER}"), "-q"]).await;
    assert!(String::from_utf8_lossy(&left.stdout).trim().is_empty(), "containers left after cluster down");
    let registry = docker(&["ps", "-a", "--filter", &format!("name=^{CLUSTER}-registry$"), "-q"]).await;
    assert!(
        String::from_utf8_lossy(&registry.stdout).trim().is_empty(),
        "the registry is left after cluster down"
    );
    let networks = docker(&["network", "ls", "--filter", "name=^kind$", "-q"]).await;
    assert!(
        String::from_utf8_lossy(&networks.stdout).trim().is_empty(),
        "the kind network is left after cluster down"
    );
}
