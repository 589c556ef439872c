//! The cluster network, as kind's docker network but made of network namespaces: one namespace
//! (`dra-e2e-net`) holds a bridge; every node has its own namespace with a veth whose peer is on
//! that bridge, and a node IP from a private /24 that exists only inside these namespaces. There
//! is no default route anywhere and nothing in the host's namespace but loopback listeners.
//!
//! The host reaches services inside a namespace (the apiserver for the admin kubeconfig, the
//! components' health endpoints for xtask) through [`Connector`]: a thread that has joined the
//! namespace creates the sockets (setns affects only the calling thread; a socket keeps the
//! namespace it was created in), and bytes are spliced both ways.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use tokio::{net::TcpListener, sync::oneshot};

use super::nodes::{NODE_PREFIX, NodeSpec};

/// The namespace holding the cluster network's bridge.
pub const NET_NS: &str = "dra-e2e-net";
/// The bridge of the cluster network (inside [`NET_NS`]).
pub const NET_BRIDGE: &str = "dra-e2e-br";
/// The prefix of every network namespace the cluster creates.
pub const NS_PREFIX: &str = "dra-e2e-";

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("run ip (package iproute2)")?;
    if !out.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Creates the cluster network and each node's namespace, veth and address.
pub fn create(nodes: &[NodeSpec]) -> Result<()> {
    ip(&["netns", "add", NET_NS])?;
    ip(&["-n", NET_NS, "link", "set", "lo", "up"])?;
    ip(&["-n", NET_NS, "link", "add", NET_BRIDGE, "type", "bridge"])?;
    ip(&["-n", NET_NS, "link", "set", NET_BRIDGE, "up"])?;
    for node in nodes {
        let ns = node.netns();
        let port = format!("veth{}", node.index);
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&["-n", NET_NS, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
        ip(&["-n", NET_NS, "link", "set", &port, "master", NET_BRIDGE, "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("{}/{NODE_PREFIX}", node.ip), "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
    }
    Ok(())
}

/// The cluster's network namespaces that exist (by name).
pub fn existing() -> Vec<String> {
    let Ok(entries) = fs::read_dir("/run/netns") else { return Vec::new() };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.starts_with(NS_PREFIX))
        .collect();
    names.sort();
    names
}

/// Deletes every network namespace of the cluster (their veths and bridges go with them).
pub fn delete_all() -> Vec<String> {
    let mut problems = Vec::new();
    for name in existing() {
        if let Err(e) = ip(&["netns", "delete", &name]) {
            problems.push(format!("{e:#}"));
        }
    }
    problems
}

/// Opens TCP connections inside one network namespace, from any thread or task.
#[derive(Debug, Clone)]
pub struct Connector {
    requests: mpsc::Sender<(SocketAddr, oneshot::Sender<std::io::Result<std::net::TcpStream>>)>,
}

impl Connector {
    /// A connector for the namespace at `netns` (e.g. `/run/netns/dra-e2e-kind-control-plane`):
    /// starts the thread that joins it.
    pub fn new(netns: &Path) -> Result<Self> {
        let file =
            fs::File::open(netns).with_context(|| format!("open network namespace {}", netns.display()))?;
        let (tx, rx) = mpsc::channel::<(SocketAddr, oneshot::Sender<std::io::Result<std::net::TcpStream>>)>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new().name("netns-connector".into()).spawn(move || {
            let joined = rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            );
            let ok = joined.is_ok();
            let _ = ready_tx.send(joined);
            if !ok {
                return;
            }
            while let Ok((addr, reply)) = rx.recv() {
                let _ = reply.send(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)));
            }
        })?;
        ready_rx
            .recv()
            .context("the connector thread ended before joining the namespace")?
            .with_context(|| format!("join network namespace {}", netns.display()))?;
        Ok(Self { requests: tx })
    }

    /// Connects to `addr` inside the namespace.
    pub async fn connect(&self, addr: SocketAddr) -> Result<tokio::net::TcpStream> {
        let (tx, rx) = oneshot::channel();
        self.requests.send((addr, tx)).context("the connector thread has ended")?;
        let stream = rx
            .await
            .context("the connector thread has ended")?
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(tokio::net::TcpStream::from_std(stream)?)
    }
}

/// Accepts connections on `listener` and splices each to `target` inside the connector's
/// namespace, until the returned future is dropped.
pub async fn serve(listener: TcpListener, connector: Connector, target: SocketAddr) -> Result<()> {
    loop {
        let (mut inbound, peer) = listener.accept().await.context("accept")?;
        let _ = inbound.set_nodelay(true);
        let connector = connector.clone();
        tokio::spawn(async move {
            match connector.connect(target).await {
                Ok(mut outbound) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(e) => tracing::debug!("forward from {peer} to {target}: {e:#}"),
            }
        });
    }
}

/// A forwarder inside this process: listens on an ephemeral 127.0.0.1 port of the host and
/// forwards to `target` in a namespace; stops when dropped.
#[derive(Debug)]
pub struct LocalForward {
    /// The host address to connect to.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl LocalForward {
    /// Starts forwarding `127.0.0.1:<ephemeral port>` to `target` inside `netns`.
    pub async fn start(netns: &Path, target: SocketAddr) -> Result<Self> {
        let connector = Connector::new(netns)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, connector, target));
        Ok(Self { addr, task })
    }
}

impl Drop for LocalForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hidden `xtask netns-forward` command: forwards `listen` (on the host) to `connect`
/// inside `netns` until SIGTERM or SIGINT.
pub async fn forward_command(netns: PathBuf, listen: SocketAddr, connect: SocketAddr) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let connector = Connector::new(&netns)?;
    let listener = TcpListener::bind(listen).await.with_context(|| format!("listen on {listen}"))?;
    eprintln!("forwarding {listen} to {connect} in {}", netns.display());
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        result = serve(listener, connector, connect) => result,
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}
