//! Shared by the tunnel tests: the real `hostpathplugin` proxy binary, and the whole chain on
//! this machine (kubelet-like client → Unix socket → hostpathplugin → TCP tunnel → in-process
//! plugin).
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use harness::{
    plugin::{ClaimSource, FileOps, KubeletPlugin, Listener, PluginConfig, PluginListeners},
    podexec::{LocalRunner, ProxyProcess, ProxyProcessConfig},
    tunnel::{TcpDialer, Tunnel, TunnelConfig},
};
use tempfile::TempDir;
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};

use crate::common::{DRIVER, NODE, within};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Builds the project's `hostpathplugin` (the proxy mode of the real binary, as in the image)
/// once per test binary and returns its path.
pub fn hostpathplugin() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tunnel-hostpathplugin");
            std::fs::create_dir_all(&dir).unwrap();
            let binary = dir.join("hostpathplugin");
            // Build under a unique name, then rename: test binaries build concurrently.
            let tmp = dir.join(format!("hostpathplugin.{}", std::process::id()));
            let status = std::process::Command::new("go")
                .args(["build", "-o"])
                .arg(&tmp)
                .arg("./cmd/hostpathplugin")
                .current_dir(workspace().join("xtask/local-cluster/images"))
                .env("CGO_ENABLED", "0")
                .status()
                .expect("go must be installed to build hostpathplugin for the tunnel tests");
            assert!(status.success(), "go build of hostpathplugin failed");
            std::fs::rename(&tmp, &binary).unwrap();
            binary
        })
        .clone()
}

/// Waits (at most [`crate::common::TIMEOUT`]) until `path` exists, naming `what` on timeout.
pub async fn wait_for_path(path: &Path, what: &str) {
    within(what, async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A free TCP port on 127.0.0.1 (released again; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Number of live tasks of the current runtime.
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

/// Waits until the runtime's live task count is back to `baseline`.
pub async fn wait_tasks(baseline: usize, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while alive_tasks() > baseline {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {} tasks still alive, expected {baseline}",
            alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Established TCP connections (from /proc/net/tcp) whose remote port is `port`: the tunnel's
/// side of its connections to the proxy.
pub fn established_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = fields[2].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            remote_port == Some(port) && fields[3] == "01"
        })
        .count()
}

/// PIDs of processes that have exactly `arg` as one argument.
pub fn processes_with_arg(arg: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(processes) = std::fs::read_dir("/proc") else { return pids };
    for entry in processes.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// The real `hostpathplugin` proxying the Unix socket `path` to `127.0.0.1:port`.
pub fn local_proxy(path: &Path, port: u16) -> ProxyProcessConfig {
    ProxyProcessConfig::new(path.display().to_string(), port)
        .binary(hostpathplugin().display().to_string())
        .proxy_endpoint(format!("tcp://127.0.0.1:{port}"))
}

/// A TCP relay on this machine to a port, that can end every connection it carries at once,
/// both ways: the stand-in for the port-forwards through a node's kubelet, which all end when the
/// kubelet restarts.
pub struct Relay {
    port: u16,
    cut: Arc<std::sync::Mutex<CancellationToken>>,
    _task: AbortOnDropHandle<()>,
}

impl Relay {
    /// Relays a free port to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(std::sync::Mutex::new(CancellationToken::new()));
        let cuts = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let token = cuts.lock().unwrap().clone();
                tokio::spawn(async move {
                    // Until the target listens (a proxy restarting): a refused connection here
                    // would be a good tunnel connection that ends, as a port-forward's is not
                    // (its dial reports the refusal).
                    let mut outbound = loop {
                        tokio::select! {
                            _ = token.cancelled() => return,
                            connected = tokio::net::TcpStream::connect(("127.0.0.1", target)) => match connected {
                                Ok(outbound) => break outbound,
                                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                            },
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = token.cancelled() => {}
                    }
                });
            }
        });
        Relay { port, cut, _task: AbortOnDropHandle::new(task) }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Ends every connection relayed so far (both sides see them close); later ones are relayed.
    pub fn cut(&self) {
        let old = std::mem::replace(&mut *self.cut.lock().unwrap(), CancellationToken::new());
        old.cancel();
    }
}

/// One socket of the chain: its proxy process (a local `hostpathplugin`) and its tunnel, which
/// reaches the proxy directly or through a [`Relay`].
pub struct Socket {
    pub path: PathBuf,
    pub port: u16,
    pub proxy: ProxyProcess,
    pub tunnel: Tunnel,
    pub relay: Option<Relay>,
    /// Kills its proxy if the test ends without [`Socket::stop`] (a panic).
    _reaper: ProxyReaper,
}

/// Kills, when dropped, the proxy processes still running with one `--endpoint=` argument: a
/// proxy outlives its start script by design (it must survive kubelet restarts), so a test that
/// panics before [`Socket::stop`] would leave it running after the test binary ended.
struct ProxyReaper(String);

impl Drop for ProxyReaper {
    fn drop(&mut self) {
        for pid in processes_with_arg(&self.0) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

impl Socket {
    /// Starts the proxy for `path` on a free port (once `after` exists, if given) and a TCP
    /// tunnel to it (through a relay if `relayed`) feeding `sender`.
    async fn start(
        path: PathBuf,
        after: Option<&Path>,
        sender: harness::plugin::ConnectionSender,
        config: TunnelConfig,
        relayed: bool,
    ) -> Socket {
        let port = free_port();
        let mut proxy_config = local_proxy(&path, port);
        if let Some(after) = after {
            proxy_config = proxy_config.after_socket(after.display().to_string());
        }
        let proxy = ProxyProcess::start(Arc::new(LocalRunner::new()), proxy_config);
        let relay = if relayed { Some(Relay::start(port).await) } else { None };
        let dial = relay.as_ref().map_or(port, Relay::port);
        let tunnel = Tunnel::start(Arc::new(TcpDialer::new(([127, 0, 0, 1], dial).into())), sender, config);
        let reaper = ProxyReaper(format!("--endpoint={}", path.display()));
        Socket { path, port, proxy, tunnel, relay, _reaper: reaper }
    }

    /// The `--endpoint=` argument of its proxy process.
    pub fn endpoint_arg(&self) -> String {
        format!("--endpoint={}", self.path.display())
    }

    /// Closes the tunnel and stops the proxy; asserts nothing is left of either.
    pub async fn stop(self) {
        // The tunnel's connections go to the relay, when there is one.
        let port = self.relay.as_ref().map_or(self.port, Relay::port);
        let stats = within("tunnel close", self.tunnel.close()).await.unwrap();
        assert_eq!((stats.open, stats.idle), (0, 0), "{stats:?}");
        assert_eq!(established_to(port), 0, "tunnel connections to port {port} left open");
        let endpoint = format!("--endpoint={}", self.path.display());
        within("proxy stop", self.proxy.stop()).await.unwrap();
        assert!(
            processes_with_arg(&endpoint).is_empty(),
            "proxy process for {} still running",
            self.path.display()
        );
        assert!(!self.path.exists(), "socket {} left behind", self.path.display());
    }
}

/// The whole chain on this machine.
pub struct Chain {
    pub dir: TempDir,
    pub plugin: KubeletPlugin,
    pub dra: Socket,
    pub registration: Socket,
    pub cdi_dir: PathBuf,
}

impl Chain {
    /// Starts the plugin (claims from `claims`, files through `files`), then per socket a
    /// tunnel and a `hostpathplugin` proxy; the registration proxy waits for the DRA socket, as
    /// in a proxy pod (and is started first here, to show it).
    pub async fn start(claims: Arc<dyn ClaimSource>, files: Arc<dyn FileOps>, tunnel: TunnelConfig) -> Chain {
        Self::start_with(claims, files, tunnel, false).await
    }

    /// [`Chain::start`] with each tunnel going through a [`Relay`] when `relayed`.
    pub async fn start_with(
        claims: Arc<dyn ClaimSource>,
        files: Arc<dyn FileOps>,
        tunnel: TunnelConfig,
        relayed: bool,
    ) -> Chain {
        let dir = tempfile::Builder::new().prefix("dra-tunnel").tempdir().unwrap();
        let plugin_dir = dir.path().join("plugins").join(DRIVER);
        let registry = dir.path().join("plugins_registry");
        let cdi_dir = dir.path().join("cdi");
        for d in [&plugin_dir, &registry, &cdi_dir] {
            std::fs::create_dir_all(d).unwrap();
        }
        let dra_path = plugin_dir.join("dra.sock");
        let reg_path = registry.join(format!("{DRIVER}-reg.sock"));
        let (dra_tx, dra_listener) = Listener::channel(tunnel.max_open);
        let (reg_tx, reg_listener) = Listener::channel(tunnel.max_open);
        let plugin = KubeletPlugin::builder(
            PluginConfig::new(DRIVER, NODE, &cdi_dir)
                .dra_endpoint(dra_path.display().to_string())
                .health_resend_interval(None),
        )
        .claim_source(claims)
        .file_ops(files)
        .start(PluginListeners { registration: reg_listener, dra: dra_listener })
        .await
        .unwrap();
        let registration = Socket::start(reg_path, Some(&dra_path), reg_tx, tunnel.clone(), relayed).await;
        let dra = Socket::start(dra_path, None, dra_tx, tunnel, relayed).await;
        Chain { dir, plugin, dra, registration, cdi_dir }
    }

    /// Waits until both proxies run and both tunnels hold `idle` unused connections.
    pub async fn ready(&self, idle: usize) {
        for socket in [&self.dra, &self.registration] {
            socket.proxy.wait_starts(1, Duration::from_secs(10)).await.unwrap();
            socket
                .tunnel
                .wait_for(&format!("{idle} idle connections"), Duration::from_secs(10), |s| s.idle >= idle)
                .await
                .unwrap();
            if socket.relay.is_some() {
                // The relay holds the tunnel's connections until the proxy listens.
                wait_for_path(&socket.path, "the proxy's socket").await;
            } else {
                // The proxy listens on the socket once it accepts TCP connections.
                assert!(socket.path.exists(), "{} missing", socket.path.display());
            }
        }
    }

    pub fn cdi_file(&self, uid: &str, request: &str) -> PathBuf {
        self.cdi_dir.join(format!("{DRIVER}-{uid}-{request}.json"))
    }

    /// Stops everything in the design's order and asserts nothing is left.
    pub async fn stop(self) {
        within("plugin stop", self.plugin.stop()).await;
        self.dra.stop().await;
        self.registration.stop().await;
    }
}
