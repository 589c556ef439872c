//! The tunnel's cost: prepare latency and call rate through the whole proxy chain on this
//! machine (client → Unix socket → real `hostpathplugin --proxy-endpoint` → TCP tunnel →
//! in-process plugin) against the same plugin on a direct Unix socket, measured in one run; and
//! the time from starting a tunnel to the first answered call.
//!
//! Run: `cargo bench -p harness --bench tunnel` (needs Go to build `hostpathplugin`;
//! `BENCH_ITERATIONS=N` changes the number of measured round trips per mode, `BENCH_STARTS=N`
//! the number of tunnel starts).
//!
//! One round trip = `NodePrepareResources` (claim from memory, CDI spec written to a temp dir)
//! then `NodeUnprepareResources`, sequentially on one connection, as one kubelet does. The two
//! modes alternate in batches so that they share the machine's noise.

mod common;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use common::{BATCH, BoxError, DRIVER, WARMUP, claim, quantile, round_trip, unix_channel};
use harness::{
    grpc::{
        dra_v1::dra_plugin_client::DraPluginClient,
        registration::{InfoRequest, registration_client::RegistrationClient},
    },
    plugin::{KubeletPlugin, Listener, LocalDirFiles, MemoryClaims, PluginConfig, PluginListeners},
    podexec::{LocalRunner, ProxyProcess, ProxyProcessConfig},
    tunnel::{TcpDialer, Tunnel, TunnelConfig},
};
use tonic::transport::Channel;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Builds `hostpathplugin` from this workspace.
fn build_hostpathplugin() -> Result<PathBuf, BoxError> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-hostpathplugin");
    std::fs::create_dir_all(&dir)?;
    let binary = dir.join("hostpathplugin");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().ok_or("no workspace")?;
    let status = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg("./cmd/hostpathplugin")
        .current_dir(workspace.join("xtask/local-cluster/images"))
        .env("CGO_ENABLED", "0")
        .status()?;
    if !status.success() {
        return Err("go build of hostpathplugin failed".into());
    }
    Ok(binary)
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether something listens on 127.0.0.1:`port` (from /proc/net/tcp, without connecting:
/// a probe connection would sit in the proxy's backlog and be paired with a client).
fn listening(port: u16) -> Result<bool, BoxError> {
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    Ok(table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3
            && fields[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
            && fields[3] == "0A"
    }))
}

/// A `hostpathplugin` proxy for `socket` on a fresh port, running and listening.
async fn start_proxy(binary: &Path, socket: &Path) -> Result<(ProxyProcess, u16), BoxError> {
    let port = free_port()?;
    let proxy = ProxyProcess::start(
        Arc::new(LocalRunner::new()),
        ProxyProcessConfig::new(socket.display().to_string(), port)
            .binary(binary.display().to_string())
            .proxy_endpoint(format!("tcp://127.0.0.1:{port}")),
    );
    proxy.wait_starts(1, TIMEOUT).await?;
    let deadline = Instant::now() + TIMEOUT;
    while !(listening(port)? && socket.exists()) {
        if Instant::now() > deadline {
            return Err(format!("hostpathplugin did not listen on {port} within {TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok((proxy, port))
}

/// One plugin and a client connected to it, directly or through the tunnel chain.
struct Target {
    name: &'static str,
    _dir: Option<tempfile::TempDir>,
    plugin: KubeletPlugin,
    chain: Option<(Tunnel, ProxyProcess)>,
    client: DraPluginClient<Channel>,
    prepare: Vec<Duration>,
    calls: usize,
    busy: Duration,
}

async fn start(name: &'static str, binary: Option<&Path>) -> Result<Target, BoxError> {
    let dir = tempfile::Builder::new().prefix("dra-bench").tempdir()?;
    let cdi = dir.path().join("cdi");
    std::fs::create_dir_all(&cdi)?;
    let claims = MemoryClaims::new();
    claims.insert(claim());
    let socket = dir.path().join("dra.sock");
    let builder = KubeletPlugin::builder(
        PluginConfig::new(DRIVER, "node", &cdi).dra_endpoint(socket.display().to_string()),
    )
    .claim_source(Arc::new(claims))
    .file_ops(Arc::new(LocalDirFiles));
    let (plugin, chain) = match binary {
        None => {
            let listeners = PluginListeners {
                registration: Listener::unix(dir.path().join("reg.sock")),
                dra: Listener::unix(&socket),
            };
            (builder.start(listeners).await?, None)
        }
        Some(binary) => {
            let (tx, dra) = Listener::channel(64);
            let plugin = builder
                .start(PluginListeners { registration: Listener::unix(dir.path().join("reg.sock")), dra })
                .await?;
            let (proxy, port) = start_proxy(binary, &socket).await?;
            let tunnel = Tunnel::start(
                Arc::new(TcpDialer::new(([127, 0, 0, 1], port).into())),
                tx,
                TunnelConfig::default(),
            );
            tunnel.wait_for("10 idle connections", TIMEOUT, |s| s.idle >= 10).await?;
            (plugin, Some((tunnel, proxy)))
        }
    };
    let client = DraPluginClient::new(unix_channel(socket).await?);
    Ok(Target {
        name,
        _dir: Some(dir),
        plugin,
        chain,
        client,
        prepare: Vec::new(),
        calls: 0,
        busy: Duration::ZERO,
    })
}

impl Target {
    /// `n` round trips; measured when `keep`.
    async fn run(&mut self, n: usize, keep: bool) -> Result<(), BoxError> {
        for _ in 0..n {
            let trip = round_trip(&mut self.client).await?;
            if keep {
                self.prepare.push(trip.prepare);
                self.calls += 2;
                self.busy += trip.total;
            }
        }
        Ok(())
    }

    fn p(&self, q: f64) -> Duration {
        quantile(&self.prepare, q)
    }

    fn rate(&self) -> f64 {
        self.calls as f64 / self.busy.as_secs_f64()
    }

    fn report(&self) {
        println!(
            "  {:<38} prepare p50 {:>7.1} µs  p99 {:>7.1} µs   {:>7.0} calls/s",
            self.name,
            self.p(0.50).as_secs_f64() * 1e6,
            self.p(0.99).as_secs_f64() * 1e6,
            self.rate()
        );
    }

    async fn stop(self) -> Result<(), BoxError> {
        drop(self.client);
        self.plugin.stop().await;
        if let Some((tunnel, proxy)) = self.chain {
            tunnel.close().await?;
            proxy.stop().await?;
        }
        Ok(())
    }
}

/// Time from `Tunnel::start` until a fresh client's `GetInfo` through the proxy is answered,
/// and until all 10 connections are established; the proxy listens before the start.
async fn first_connection(binary: &Path, starts: usize) -> Result<(), BoxError> {
    let mut first = Vec::new();
    let mut all = Vec::new();
    for _ in 0..starts {
        let dir = tempfile::Builder::new().prefix("dra-bench").tempdir()?;
        let socket = dir.path().join("reg.sock");
        let (tx, registration) = Listener::channel(64);
        let plugin =
            KubeletPlugin::builder(PluginConfig::new(DRIVER, "node", dir.path()).dra_endpoint("/dra.sock"))
                .start(PluginListeners { registration, dra: Listener::unix(dir.path().join("dra.sock")) })
                .await?;
        let (proxy, port) = start_proxy(binary, &socket).await?;

        let began = Instant::now();
        let tunnel = Tunnel::start(
            Arc::new(TcpDialer::new(([127, 0, 0, 1], port).into())),
            tx,
            TunnelConfig::default(),
        );
        let mut client = RegistrationClient::new(unix_channel(socket.clone()).await?);
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(Duration::from_secs(1));
        client.get_info(request).await?;
        first.push(began.elapsed());
        tunnel.wait_for("10 connections", TIMEOUT, |s| s.open >= 10).await?;
        all.push(began.elapsed());

        drop(client);
        plugin.stop().await;
        tunnel.close().await?;
        proxy.stop().await?;
    }
    first.sort();
    all.sort();
    let median = |v: &[Duration]| v[v.len() / 2].as_secs_f64() * 1e6;
    println!(
        "  start → first GetInfo answered through the tunnel: median {:>7.1} µs  max {:>7.1} µs",
        median(&first),
        first.last().copied().unwrap_or_default().as_secs_f64() * 1e6
    );
    println!(
        "  start → 10 connections established:               median {:>7.1} µs  max {:>7.1} µs",
        median(&all),
        all.last().copied().unwrap_or_default().as_secs_f64() * 1e6
    );
    Ok(())
}

/// The same through a real proxy pod and the API server's port-forward (when
/// `DRA_E2E_KUBECONFIG` is set): creates a namespace with a proxy pod on the first node, and
/// deletes it afterwards. CDI files go to a local temp dir, so only the tunnel differs.
mod port_forward {
    use super::*;
    use harness::{
        podexec::{PodExec, Runner},
        proxied,
        tunnel::{PodRef, PortForwardDialer, tunnel_client},
    };
    use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
    use kube::{
        Api, Client,
        api::{DeleteParams, PostParams},
        runtime::{conditions, wait::await_condition},
    };

    const WAIT: Duration = Duration::from_secs(120);

    async fn timed<T, E: Into<BoxError>>(
        what: &str,
        fut: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, BoxError> {
        match tokio::time::timeout(WAIT, fut).await {
            Ok(result) => result.map_err(Into::into),
            Err(_) => Err(format!("timed out after {WAIT:?} waiting for {what}").into()),
        }
    }

    pub async fn run(
        kubeconfig: &str,
        iterations: usize,
        starts: usize,
        direct: &Target,
    ) -> Result<(), BoxError> {
        let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        let client = Client::try_from(config.clone())?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"generateName": "dra-bench-", "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}
        }))?;
        let ns = namespaces.create(&PostParams::default(), &ns).await?.metadata.name.ok_or("no name")?;
        let result = measure(&config, &client, &ns, iterations, starts, direct).await;
        let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
        let _ = std::fs::remove_dir_all(format!("{}/{ns}.k8s.io", proxied::PLUGINS_DIR));
        result
    }

    /// Whether something listens on `port` in the pod (its /proc/net/tcp{,6}).
    async fn listening_in_pod(exec: &Arc<dyn Runner>, port: u16) -> Result<bool, BoxError> {
        let argv = ["cat", "/proc/net/tcp", "/proc/net/tcp6"].map(String::from).to_vec();
        let tables = exec.checked(argv).await?.stdout;
        Ok(tables.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3
                && fields[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
                && fields[3] == "0A"
        }))
    }

    async fn measure(
        config: &kube::Config,
        client: &Client,
        ns: &str,
        iterations: usize,
        starts: usize,
        direct: &Target,
    ) -> Result<(), BoxError> {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        timed(
            "service account default",
            await_condition(accounts, "default", |sa: Option<&ServiceAccount>| sa.is_some()),
        )
        .await?;
        let node =
            Api::<Node>::all(client.clone()).list(&Default::default()).await?.items[0].metadata.name.clone();
        let dir = format!("{}/{ns}.k8s.io", proxied::PLUGINS_DIR);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "proxy"},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "pause",
                    "image": "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1",
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "while true; do sleep 10000; done"],
                    "securityContext": {"privileged": true},
                    "volumeMounts": [{"name": "socket-dir", "mountPath": dir}],
                }],
                "volumes": [{"name": "socket-dir", "hostPath": {"path": dir, "type": "DirectoryOrCreate"}}],
            }
        }))?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.create(&PostParams::default(), &pod).await?;
        timed("the proxy pod to run", await_condition(pods.clone(), "proxy", conditions::is_pod_running()))
            .await?;
        let pod = PodRef::from_pod(&pods.get("proxy").await?)?;
        let exec: Arc<dyn Runner> = Arc::new(PodExec::new(client.clone(), pod.clone()));

        // Start → first answered call, each time with a fresh proxy on a fresh port (a closed
        // tunnel's connections stay in the old proxy's backlog).
        let mut first = Vec::new();
        for i in 0..starts {
            let port = 9100 + i as u16;
            let socket = PathBuf::from(format!("{dir}/reg-{i}.sock"));
            let tmp = tempfile::Builder::new().prefix("dra-bench").tempdir()?;
            let (tx, registration) = Listener::channel(64);
            let plugin = KubeletPlugin::builder(
                PluginConfig::new(DRIVER, "node", tmp.path()).dra_endpoint("/dra.sock"),
            )
            .start(PluginListeners { registration, dra: Listener::unix(tmp.path().join("dra.sock")) })
            .await?;
            let proxy = ProxyProcess::start(
                exec.clone(),
                ProxyProcessConfig::new(socket.display().to_string(), port),
            );
            proxy.wait_starts(1, WAIT).await?;
            // The proxy listens on the Unix socket before the TCP port: wait for the port.
            let deadline = Instant::now() + WAIT;
            while !listening_in_pod(&exec, port).await? {
                if Instant::now() > deadline {
                    return Err(format!("the proxy in the pod did not listen on {port}").into());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let dialer = PortForwardDialer::new(client.clone(), pod.clone(), port);
            let began = Instant::now();
            let tunnel = Tunnel::start(Arc::new(dialer), tx, proxied::tunnel_config());
            let mut registration = RegistrationClient::new(unix_channel(socket).await?);
            timed("GetInfo through port-forward", registration.get_info(InfoRequest {})).await?;
            first.push(began.elapsed());
            drop(registration);
            plugin.stop().await;
            tunnel.close().await?;
            proxy.stop().await?;
        }
        first.sort();
        println!(
            "  port-forward: start → first GetInfo answered: median {:>7.1} ms  max {:>7.1} ms ({starts} starts)",
            first[first.len() / 2].as_secs_f64() * 1e3,
            first.last().copied().unwrap_or_default().as_secs_f64() * 1e3
        );

        // Latency and rate, with kube's default client and with `tunnel_client` (TCP_NODELAY).
        let nodelay = tunnel_client(config)?;
        for (name, port, dial_client) in [
            ("port-forward (kube default client)", 9001, client.clone()),
            ("port-forward (tunnel_client, NODELAY)", 9002, nodelay),
        ] {
            let target = latency(name, &dir, port, dial_client, &exec, &pod, iterations).await?;
            target.report();
            println!(
                "    ratio to direct (direct measured above, not interleaved): prepare p50 ×{:.1}  p99 ×{:.1}  calls/s ×{:.3}",
                target.p(0.5).as_secs_f64() / direct.p(0.5).as_secs_f64(),
                target.p(0.99).as_secs_f64() / direct.p(0.99).as_secs_f64(),
                target.rate() / direct.rate()
            );
            target.stop().await?;
        }
        Ok(())
    }

    async fn latency(
        name: &'static str,
        dir: &str,
        port: u16,
        client: Client,
        exec: &Arc<dyn Runner>,
        pod: &PodRef,
        iterations: usize,
    ) -> Result<Target, BoxError> {
        let tmp = tempfile::Builder::new().prefix("dra-bench").tempdir()?;
        let cdi = tmp.path().join("cdi");
        std::fs::create_dir_all(&cdi)?;
        let claims = MemoryClaims::new();
        claims.insert(claim());
        let socket = PathBuf::from(format!("{dir}/dra-{port}.sock"));
        let (tx, dra) = Listener::channel(64);
        let plugin = KubeletPlugin::builder(
            PluginConfig::new(DRIVER, "node", &cdi).dra_endpoint(socket.display().to_string()),
        )
        .claim_source(Arc::new(claims))
        .file_ops(Arc::new(LocalDirFiles))
        .start(PluginListeners { registration: Listener::unix(tmp.path().join("reg.sock")), dra })
        .await?;
        let proxy =
            ProxyProcess::start(exec.clone(), ProxyProcessConfig::new(socket.display().to_string(), port));
        let dialer = PortForwardDialer::new(client, pod.clone(), port);
        let tunnel = Tunnel::start(Arc::new(dialer), tx, proxied::tunnel_config());
        tunnel.wait_for("10 idle connections", WAIT, |s| s.idle >= 10).await?;
        let client = DraPluginClient::new(unix_channel(socket).await?);
        let mut target = Target {
            name,
            _dir: Some(tmp),
            plugin,
            chain: Some((tunnel, proxy)),
            client,
            prepare: Vec::new(),
            calls: 0,
            busy: Duration::ZERO,
        };
        target.run(WARMUP / 4, false).await?;
        target.run(iterations, true).await?;
        Ok(target)
    }
}

fn main() -> Result<(), BoxError> {
    let iterations = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let starts = std::env::var("BENCH_STARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let binary = build_hostpathplugin()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        println!(
            "tunnel: {iterations} sequential prepare+unprepare round trips per mode ({WARMUP} warm-up, \
             modes alternating in batches of {BATCH})"
        );
        let mut direct = start("direct Unix socket", None).await?;
        let mut tunneled = start("hostpathplugin + TCP tunnel", Some(&binary)).await?;
        direct.run(WARMUP, false).await?;
        tunneled.run(WARMUP, false).await?;
        let mut done = 0;
        while done < iterations {
            let n = BATCH.min(iterations - done);
            direct.run(n, true).await?;
            tunneled.run(n, true).await?;
            done += n;
        }
        direct.report();
        tunneled.report();
        println!(
            "  ratio tunnel/direct: prepare p50 ×{:.2}  p99 ×{:.2}  calls/s ×{:.2}",
            tunneled.p(0.5).as_secs_f64() / direct.p(0.5).as_secs_f64(),
            tunneled.p(0.99).as_secs_f64() / direct.p(0.99).as_secs_f64(),
            tunneled.rate() / direct.rate()
        );
        tunneled.stop().await?;

        println!("tunnel start ({starts} starts, proxy already listening):");
        first_connection(&binary, starts).await?;

        match std::env::var("DRA_E2E_KUBECONFIG") {
            Ok(kubeconfig) if !kubeconfig.is_empty() => {
                let n = (iterations / 5).max(1);
                println!("through the API server's port-forward ({n} round trips):");
                port_forward::run(&kubeconfig, n, starts.min(10), &direct).await?;
            }
            _ => println!("(set DRA_E2E_KUBECONFIG to also measure through a real port-forward)"),
        }
        direct.stop().await
    })
}
