//! The tunnel chain through a real proxy pod and the API server's port-forward and exec.
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored tunnel::
//! ```
//!
//! Every test fails (never passes silently) when `DRA_E2E_KUBECONFIG` is unset. Each test
//! creates its own namespace (deleted at the end, also after a failure) with a privileged pod
//! running the `hostpathplugin` image, mounted like the driver's proxy pods; the tests must run
//! on the machine of the pod's node (the kubelet-like client dials the sockets under the node's
//! /var/lib/kubelet, and CDI files are checked under its /var/run/cdi). On the local cluster a
//! node's directories are in its state directory ([`on_host`]).
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::*;
use crate::run::kubeconfig;
use crate::tunnel_support::wait_tasks;
use harness::{
    calls::{Calls, Method},
    plugin::{ClaimState, HealthState, KubeletPlugin, Listener, MemoryClaims, PluginConfig, PluginListeners},
    podexec::{PodExec, PodFiles, ProxyProcess, ProxyProcessConfig, Runner},
    proxied::{self, ProxiedPlugin, ProxiedPluginSpec, ProxyPorts},
    tunnel::{PodRef, PortForwardDialer, Tunnel, tunnel_client},
};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
    runtime::{conditions, wait::await_condition},
};

const IMAGE: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1";
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(120);

/// The admin client and its configuration.
pub(crate) async fn config_and_client() -> (kube::Config, Client) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "harness=debug".into()),
        )
        .with_test_writer()
        .try_init();
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    (config.clone(), Client::try_from(config).unwrap())
}

async fn client() -> Client {
    config_and_client().await.1
}

/// A namespace of this test, deleted when dropped (also after a panic).
pub(crate) struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    pub(crate) async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {
                "generateName": format!("{prefix}-"),
                "labels": {"pod-security.kubernetes.io/enforce": "privileged", "dra-e2e.k8s.io/test": "tunnel"},
            }
        }))
        .unwrap();
        let created = namespaces.create(&PostParams::default(), &ns).await.unwrap();
        let name = created.metadata.name.unwrap();
        // Pods are refused until the service account controller made `default`.
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        within_cluster(
            "service account default",
            await_condition(accounts, "default", |sa: Option<&ServiceAccount>| sa.is_some()),
        )
        .await
        .unwrap();
        TestNamespace { client: client.clone(), name }
    }

    /// The unique driver name of this test.
    pub(crate) fn driver(&self) -> String {
        format!("{}.k8s.io", self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        // A runtime of its own: this may run while the test's runtime is shutting down.
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let namespaces: Api<Namespace> = Api::all(client);
                tokio::time::timeout(
                    Duration::from_secs(30),
                    namespaces.delete(&name, &DeleteParams::default()),
                )
                .await
            })
        })
        .join();
        if !matches!(deleted, Ok(Ok(Ok(_)))) {
            eprintln!("could not delete namespace {}: {deleted:?}", self.name);
        }
    }
}

async fn within_cluster<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(CLUSTER_TIMEOUT, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {CLUSTER_TIMEOUT:?} waiting for {what}"),
    }
}

/// Where a node's `path` (under /var/lib/kubelet or /var/run/cdi) is on this machine: on the
/// local cluster, in the node's state directory (`$DRA_E2E_LOCAL_STATE/nodes/<node>`, which the
/// node's mount namespace bind-mounts at those paths); elsewhere the path itself.
fn on_host(node: &str, path: &Path) -> PathBuf {
    let state = std::env::var_os("DRA_E2E_LOCAL_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/dra-e2e/local"))
        .join("nodes")
        .join(node);
    if !state.is_dir() {
        return path.to_path_buf();
    }
    for (inside, dir) in [("/var/lib/kubelet", "kubelet"), ("/var/run/cdi", "cdi")] {
        if let Ok(rest) = path.strip_prefix(inside) {
            return state.join(dir).join(rest);
        }
    }
    path.to_path_buf()
}

/// A running proxy pod like the driver's on the cluster's first node: see [`proxy_pod_on`].
async fn proxy_pod(client: &Client, ns: &TestNamespace, driver: &str) -> Pod {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = nodes.list(&Default::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    proxy_pod_on(client, ns, driver, &node).await
}

/// A running proxy pod like the driver's on `node`: privileged, sleeping, with the plugin
/// directory of `driver`, the plugin registry and the CDI directory mounted at the node's paths.
pub(crate) async fn proxy_pod_on(client: &Client, ns: &TestNamespace, driver: &str, node: &str) -> Pod {
    let plugin_dir = format!("{}/{driver}", proxied::PLUGINS_DIR);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "proxy"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "pause",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "while true; do sleep 10000; done"],
                "securityContext": {"privileged": true},
                "volumeMounts": [
                    {"name": "socket-dir", "mountPath": plugin_dir},
                    {"name": "registration-dir", "mountPath": proxied::REGISTRY_DIR},
                    {"name": "cdi-dir", "mountPath": "/cdi"},
                ],
            }],
            "volumes": [
                {"name": "socket-dir", "hostPath": {"path": plugin_dir, "type": "DirectoryOrCreate"}},
                {"name": "registration-dir", "hostPath": {"path": proxied::REGISTRY_DIR, "type": "DirectoryOrCreate"}},
                {"name": "cdi-dir", "hostPath": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}},
            ],
        }
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    within_cluster(
        "the proxy pod to run",
        await_condition(pods.clone(), "proxy", conditions::is_pod_running()),
    )
    .await
    .unwrap();
    pods.get("proxy").await.unwrap()
}

/// Output of a command in the pod, which must succeed.
async fn sh(exec: &PodExec, script: &str) -> String {
    exec.checked(vec!["sh".into(), "-c".into(), script.into()]).await.unwrap().stdout
}

/// Kills (SIGKILL) the proxy process of `socket` in the pod.
async fn kill_proxy(exec: &PodExec, socket: &Path) {
    const SCRIPT: &str = r#"for p in $(pidof hostpathplugin); do
  if tr '\000' '\n' < "/proc/$p/cmdline" | grep -qxF -e "$1"; then kill -9 "$p"; echo "$p"; fi
done"#;
    let argv = ["sh", "-c", SCRIPT, "sh"]
        .into_iter()
        .map(String::from)
        .chain([format!("--endpoint={}", socket.display())]);
    let killed = exec.checked(argv.collect()).await.unwrap().stdout;
    assert!(!killed.trim().is_empty(), "no proxy process for {}", socket.display());
}

/// TCP sockets in the pod's network namespace with local port `port` in `state` (`01`
/// established, `0A` listening).
async fn pod_sockets(exec: &PodExec, port: u16, state: &str) -> usize {
    let tables = sh(exec, "cat /proc/net/tcp /proc/net/tcp6").await;
    tables
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3
                && fields[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
                && fields[3] == state
        })
        .count()
}

/// Waits until `check` holds, polling `what` every 200 ms for at most the cluster timeout.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within_cluster(what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// Claims allocated to the common test driver, with uids unique to this run.
fn claims(ns: &str, n: usize) -> (MemoryClaims, Vec<(String, String)>) {
    let claims = MemoryClaims::new();
    let mut refs = Vec::new();
    for i in 0..n {
        let (name, uid) = (format!("claim-{i}"), format!("{ns}-uid-{i}"));
        claims.insert(allocated_claim(&name, &uid, &[("req", "device-00")]));
        refs.push((name, uid));
    }
    (claims, refs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn tunnel_through_port_forward_and_exec() {
    let (config, admin) = config_and_client().await;
    // Port-forward and exec through the NODELAY client, as a driver should.
    let client = tunnel_client(&config).unwrap();
    let ns = TestNamespace::create(&admin, "dra-tunnel").await;
    let driver = ns.driver();
    let pod = proxy_pod(&admin, &ns, &driver).await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let pod_ref = PodRef::from_pod(&pod).unwrap();
    let exec = Arc::new(PodExec::new(client.clone(), pod_ref.clone()));
    let baseline = crate::tunnel_support::alive_tasks();

    // Both sockets in the driver's plugin directory (not the registry: the real kubelet must not
    // pick this plugin up), served by the common test driver's plugin.
    let plugin_dir = PathBuf::from(proxied::PLUGINS_DIR).join(&driver);
    let dra_socket = plugin_dir.join("dra.sock");
    let reg_socket = plugin_dir.join("reg.sock");
    let (claims, refs) = claims(&ns.name, 200);
    let (dra_tx, dra_listener) = Listener::channel(64);
    let (reg_tx, reg_listener) = Listener::channel(64);
    let plugin = KubeletPlugin::builder(
        PluginConfig::new(DRIVER, NODE, "/cdi")
            .dra_endpoint(dra_socket.display().to_string())
            .health_resend_interval(None),
    )
    .claim_source(Arc::new(claims))
    .file_ops(Arc::new(PodFiles::new(exec.clone())))
    .start(PluginListeners { registration: reg_listener, dra: dra_listener })
    .await
    .unwrap();
    let mut sockets = Vec::new();
    for (socket, port, sender) in [(&dra_socket, 9001, dra_tx), (&reg_socket, 9002, reg_tx)] {
        let dialer = PortForwardDialer::new(client.clone(), pod_ref.clone(), port);
        let tunnel = Tunnel::start(Arc::new(dialer), sender, proxied::tunnel_config());
        let proxy =
            ProxyProcess::start(exec.clone(), ProxyProcessConfig::new(socket.display().to_string(), port));
        sockets.push((tunnel, proxy, port));
    }
    for (tunnel, proxy, port) in &sockets {
        proxy.wait_starts(1, CLUSTER_TIMEOUT).await.unwrap();
        // The proxy listens on its Unix socket before its TCP port.
        eventually(&format!("the proxy to listen on pod port {port}"), || async {
            pod_sockets(&exec, *port, "0A").await > 0
        })
        .await;
        tunnel.wait_for("10 idle connections", CLUSTER_TIMEOUT, |s| s.idle >= 10).await.unwrap();
    }

    // Registration and round trips like the kubelet, through port-forward.
    let registered = register_like_kubelet(&on_host(&node, &reg_socket)).await;
    assert_eq!(registered.info.endpoint, dra_socket.display().to_string());
    let dra = DraClient::connect(&on_host(&node, &dra_socket), &registered.chosen).await;
    let cdi_dir = on_host(&node, Path::new("/var/run/cdi"));
    let host_cdi = |uid: &str| cdi_dir.join(format!("{DRIVER}-{uid}-req.json"));
    let started = std::time::Instant::now();
    for (name, uid) in &refs {
        let claim = [claim_ref(name, uid)];
        let prepared = within("prepare", dra.prepare(&claim)).await.unwrap();
        prepared[uid].clone().unwrap();
        // Written in the pod through exec, visible on the node.
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(host_cdi(uid)).unwrap()).unwrap();
        assert_eq!(spec["kind"], format!("{DRIVER}/test"));
        assert_eq!(within("unprepare", dra.unprepare(&claim)).await.unwrap()[uid], "");
        assert!(!host_cdi(uid).exists(), "{} not removed", host_cdi(uid).display());
    }
    println!("200 prepare+unprepare round trips with CDI files through exec: {:?}", started.elapsed());
    assert_eq!(plugin.calls().log().count(Method::NodePrepareResources.succeeded()), 200);
    assert!(
        std::fs::read_dir(&cdi_dir)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains(&ns.name))
    );

    // Kill the DRA proxy in the pod: it is restarted, and the client reconnects.
    kill_proxy(&exec, &dra_socket).await;
    sockets[0].1.wait_starts(2, CLUSTER_TIMEOUT).await.unwrap();
    let (name, uid) = &refs[0];
    let deadline = tokio::time::Instant::now() + CLUSTER_TIMEOUT;
    loop {
        match dra.prepare(&[claim_ref(name, uid)]).await {
            Ok(result) => {
                result[uid].clone().unwrap();
                break;
            }
            Err(status) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no prepare after the proxy restart: {status}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    within("unprepare after restart", dra.unprepare(&[claim_ref(name, uid)])).await.unwrap();
    drop(dra);

    // Stop: plugin, tunnels (no port-forward left), proxies (killed, sockets removed).
    plugin.stop().await;
    for (tunnel, proxy, port) in sockets {
        let stats = tunnel.close().await.unwrap();
        assert_eq!((stats.open, stats.idle), (0, 0), "{stats:?}");
        eventually(&format!("no established connection on pod port {port}"), || async {
            pod_sockets(&exec, port, "01").await == 0
        })
        .await;
        proxy.stop().await.unwrap();
    }
    assert_eq!(sh(&exec, "pidof hostpathplugin || true").await.trim(), "");
    assert!(!dra_socket.exists() && !reg_socket.exists());
    let _ = std::fs::remove_dir(&plugin_dir);
    // Port-forwards and execs of this test ended: only the kube client's pooled connections
    // may remain.
    wait_tasks(baseline + 4, "after stopping everything").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn exec_stream_close_leaves_the_remote_process_running() {
    let client = client().await;
    let ns = TestNamespace::create(&client, "dra-tunnel-exec").await;
    let pod = proxy_pod(&client, &ns, &ns.driver()).await;
    let exec = PodExec::new(client.clone(), PodRef::from_pod(&pod).unwrap());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let started_tx = Mutex::new(Some(started_tx));
    let on_line = move |line: &str| {
        if line == "started"
            && let Some(tx) = started_tx.lock().unwrap().take()
        {
            let _ = tx.send(());
        }
        true
    };
    let argv = vec!["sh".into(), "-c".into(), "echo started; exec sleep 3601".into()];
    let run = exec.run_logged(argv, "sleeper", &on_line);
    tokio::select! {
        _ = run => panic!("the sleeper ended early"),
        started = started_rx => started.unwrap(),
    }
    // The future (and with it the exec stream) is dropped here.
    let pids = || async {
        sh(&exec, "pidof sleep | tr ' ' '\\n' | while read p; do grep -q 3601 /proc/$p/cmdline && echo $p; done; true").await
    };
    tokio::time::sleep(Duration::from_secs(2)).await; // give a runtime that would kill it time to do so
    let left = pids().await;
    assert!(!left.trim().is_empty(), "the process ended with its exec stream");
    sh(&exec, &format!("kill {}", left.trim())).await;
    println!("closing the exec stream left `sleep 3601` running as PID {}", left.trim());
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let _ = std::fs::remove_dir(on_host(&node, &Path::new(proxied::PLUGINS_DIR).join(ns.driver())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn real_kubelet_registers_a_proxied_plugin() {
    let (config, admin) = config_and_client().await;
    let client = tunnel_client(&config).unwrap();
    let ns = TestNamespace::create(&admin, "dra-proxied").await;
    let driver = ns.driver();
    let pod = proxy_pod(&admin, &ns, &driver).await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let exec = PodExec::new(client.clone(), PodRef::from_pod(&pod).unwrap());
    let reg_socket = on_host(&node, Path::new(&proxied::registration_socket(&driver)));
    let dra_socket = on_host(&node, Path::new(&proxied::dra_socket(&driver)));
    let spec = || ProxiedPluginSpec {
        client: client.clone(),
        pod: pod.clone(),
        plugin: PluginConfig::new(&driver, &node, "/cdi"),
        claims: Arc::new(MemoryClaims::new()),
        calls: Calls::new(),
        health: HealthState::new(),
        claim_state: ClaimState::default(),
        forward: None,
        ports: ProxyPorts::default(),
    };

    let proxied = ProxiedPlugin::start(spec()).await.unwrap();
    let registered = proxied.plugin().wait_registered(Duration::from_secs(60)).await;
    let log = proxied.plugin().calls().log();
    println!("calls of the real kubelet:\n{log}");
    registered.unwrap();
    assert!(log.count(Method::GetInfo.succeeded()) >= 1, "{log}");
    proxied.stop_checked().await.unwrap();
    assert_eq!(sh(&exec, "pidof hostpathplugin || true").await.trim(), "");
    assert!(!reg_socket.exists() && !dra_socket.exists(), "sockets left on the node");

    // Again on the same pod; then the pod goes away and the plugin notices.
    let proxied = ProxiedPlugin::start(spec()).await.unwrap();
    proxied.plugin().wait_registered(Duration::from_secs(60)).await.unwrap();
    let gone = proxied.gone();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    pods.delete("proxy", &DeleteParams::default()).await.unwrap();
    let reason = within_cluster("gone() after the pod deletion", gone).await;
    println!("gone: {reason}");
    assert!(reason.contains("proxy"), "{reason}");
    proxied.stop().await;
    within_cluster(
        "the pod to be deleted",
        await_condition(pods, "proxy", conditions::is_deleted(pod.metadata.uid.as_deref().unwrap())),
    )
    .await
    .unwrap();
    // Killing the container killed the proxies; their socket files stay (as upstream notes).
    for socket in [&reg_socket, &dra_socket] {
        let _ = std::fs::remove_file(socket);
    }
    let _ = std::fs::remove_dir(on_host(&node, &Path::new(proxied::PLUGINS_DIR).join(&driver)));
}
