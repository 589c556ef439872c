//! `cluster up --registry`: the CNCF distribution registry for the local cluster, opt-in. Images
//! pushed to `127.0.0.1:5000` on the host are pulled by every node as `localhost:5000/…`.
//!
//! Where it runs: in a network namespace of its own, `dra-e2e-registry`, with a veth on the
//! cluster bridge and the address [`IP`] (above every node address), so it is one more host on
//! the cluster network exactly like a node. The nodes' containerd (each in its node's network
//! namespace, where `localhost` is the node itself) reaches it there through a `hosts.toml` for
//! `localhost:5000` in the node's `config/certs.d`, which containerd reads at every pull, so adding
//! the registry to a running cluster restarts nothing. The host pushes to `127.0.0.1:5000` through
//! a `netns-forward` process, as it reaches the apiserver. Its own namespace rather than the
//! bridge's: the bridge namespace stays a pure switch (no address, nothing listening), and the
//! registry's namespace, veth and address come and go with it; `cluster down` deletes every
//! `dra-e2e-` namespace anyway. The namespace has no default route, so the registry never reaches
//! outside the machine (no pull-through proxy, tracing export off).
//!
//! The port follows kubevirtci's kind providers: 5000 for the default cluster name, 5001 for any
//! other. The local cluster has no name option (it is always named [`nodes::CLUSTER_NAME`], as
//! kind's default), so its registry is always on 5000.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    LocalCluster, components,
    netns::{self, NET_BRIDGE, NET_NS},
    nodes::{self, NODE_PREFIX, NODE_SUBNET, NodeDirs},
    wait,
};

use crate::common::{
    build::Binaries,
    layout::Layout,
    process::ProcessSpec,
    registry::{config, port_for, v2_status},
};

/// The registry's network namespace.
pub const NETNS: &str = "dra-e2e-registry";
/// The registry's veth in the bridge namespace.
const VETH: &str = "veth-registry";
/// Supervisor name of the registry.
pub const REGISTRY: &str = "registry";
/// Supervisor name of its host forwarder (127.0.0.1:PORT on the host).
pub const FORWARD: &str = "registry-forward";
/// The registry's address on the cluster network: above every node's (10.89.0.2 up to
/// 10.89.0.201 for [`nodes::MAX_NODES`] nodes).
pub const IP: Ipv4Addr = Ipv4Addr::new(NODE_SUBNET[0], NODE_SUBNET[1], NODE_SUBNET[2], 250);

/// The local cluster's registry port (always 5000: its name is always kind's default).
pub fn port() -> u16 {
    port_for(nodes::CLUSTER_NAME)
}

/// The registry's state: its configuration and its storage.
pub fn state_dir(layout: &Layout) -> PathBuf {
    layout.state.join("registry")
}

fn netns_path() -> PathBuf {
    Path::new("/run/netns").join(NETNS)
}

/// containerd's hosts.toml for `localhost:PORT`: pull and resolve from the registry's address on
/// the cluster network, over plain HTTP.
pub fn hosts_toml(port: u16) -> String {
    format!(
        "# Written by `cargo xtask cluster up --registry`: localhost:{port} is the local registry.\nserver = \"http://{IP}:{port}\"\n\n[host.\"http://{IP}:{port}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// The hosts.toml of one node.
pub fn hosts_toml_path(dirs: &NodeDirs, port: u16) -> PathBuf {
    dirs.config().join("certs.d").join(format!("localhost:{port}")).join("hosts.toml")
}

/// Whether the registry and its forwarder run.
pub fn is_running(cluster: &LocalCluster) -> bool {
    cluster.sup.is_running(REGISTRY) && cluster.sup.is_running(FORWARD)
}

/// Starts the registry on the running `cluster` (nothing else is touched) and points every node's
/// containerd at it; does nothing but report when it already runs.
pub async fn ensure(cluster: &LocalCluster, bins: &Binaries) -> Result<()> {
    let port = port();
    let layout = &cluster.layout;
    if is_running(cluster) {
        write_hosts(cluster, port)?;
        eprintln!("the local registry already runs on 127.0.0.1:{port} ({IP}:{port} for the nodes)");
        return Ok(());
    }
    // A half-started registry (one of the two died) is stopped and started again.
    for name in [FORWARD, REGISTRY] {
        cluster.sup.stop(name, Duration::from_secs(10))?;
    }
    if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        bail!(
            "port {port} on 127.0.0.1, which the local registry needs, is in use by another process; stop it and retry"
        );
    }
    if !netns_path().exists() {
        create_netns()?;
    }
    let dir = state_dir(layout);
    let storage = dir.join("storage");
    fs::create_dir_all(&storage).with_context(|| format!("create {}", storage.display()))?;
    let config_file = dir.join("config.yml");
    fs::write(&config_file, config(&storage, port))
        .with_context(|| format!("write {}", config_file.display()))?;
    cluster.sup.start(&ProcessSpec {
        name: REGISTRY.into(),
        program: "nsenter".into(),
        args: vec![
            format!("--net={}", netns_path().display()),
            "--".into(),
            bins.registry().display().to_string(),
            "serve".into(),
            config_file.display().to_string(),
        ],
        // The namespace has no route out anyway; this keeps the OpenTelemetry exporter from
        // trying localhost:4318 at all.
        env: vec![("OTEL_TRACES_EXPORTER".into(), "none".into())],
    })?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    cluster.sup.start(&components::netns_forwarder(layout, FORWARD, &netns_path(), addr, addr)?)?;
    wait::until(
        &format!("the registry answering GET /v2/ on 127.0.0.1:{port}"),
        Duration::from_secs(60),
        Some((&cluster.sup, REGISTRY)),
        || async move { Ok(v2_status(addr).is_ok_and(|status| status == 200)) },
    )
    .await?;
    // The nodes reach it on the cluster network, not through the host's forwarder.
    let node_netns = cluster.control_plane().netns_path();
    let on_bridge = SocketAddr::from((IP, port));
    let connector = netns::Connector::new(&node_netns)?;
    wait::until(
        &format!("{on_bridge} reachable from node {}", cluster.control_plane().name),
        Duration::from_secs(30),
        Some((&cluster.sup, REGISTRY)),
        || {
            let connector = connector.clone();
            async move { Ok(connector.connect(on_bridge).await.is_ok()) }
        },
    )
    .await?;
    write_hosts(cluster, port)?;
    eprintln!(
        "==> local registry up: push to 127.0.0.1:{port}, pods pull localhost:{port}/… (the nodes reach {IP}:{port})"
    );
    Ok(())
}

/// Writes every node's hosts.toml for localhost:PORT (atomically: containerd may read it now).
fn write_hosts(cluster: &LocalCluster, port: u16) -> Result<()> {
    for node in &cluster.nodes {
        let path = hosts_toml_path(&NodeDirs::new(&cluster.layout, node), port);
        let dir = path.parent().context("hosts.toml has a directory")?;
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let tmp = path.with_extension("toml.partial");
        fs::write(&tmp, hosts_toml(port)).with_context(|| format!("write {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// The registry's namespace with a veth on the cluster bridge and [`IP`].
fn create_netns() -> Result<()> {
    let ip = |args: &[&str]| -> Result<()> {
        let out = Command::new("ip").args(args).output().context("run ip (package iproute2)")?;
        if !out.status.success() {
            bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    };
    ip(&["netns", "add", NETNS])?;
    ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
    ip(&["-n", NET_NS, "link", "add", VETH, "type", "veth", "peer", "name", "eth0", "netns", NETNS])?;
    ip(&["-n", NET_NS, "link", "set", VETH, "master", NET_BRIDGE, "up"])?;
    ip(&["-n", NETNS, "addr", "add", &format!("{IP}/{NODE_PREFIX}"), "dev", "eth0"])?;
    ip(&["-n", NETNS, "link", "set", "eth0", "up"])?;
    Ok(())
}

/// The status line of `cluster status`; None when no registry was started.
pub fn status_line(cluster: &LocalCluster) -> Option<String> {
    let registry = cluster.sup.record(REGISTRY)?;
    let port = port();
    let state = if is_running(cluster) {
        format!(
            "running (pid {}), push to 127.0.0.1:{port}, nodes pull localhost:{port}/… from {IP}:{port}",
            registry.pid
        )
    } else {
        format!("DIED or stopped (see {})", cluster.sup.log_path(REGISTRY).display())
    };
    Some(format!("registry (network namespace {NETNS}): {state}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_rule_is_kubevirtci_s() {
        assert_eq!(port_for("kind"), 5000);
        assert_eq!(port_for("dra-e2e"), 5001);
        assert_eq!(port(), 5000, "the local cluster is always named kind");
    }

    #[test]
    fn the_registry_address_is_on_the_node_subnet_above_every_node() {
        let last = nodes::cluster_nodes(nodes::MAX_NODES).pop().unwrap();
        assert!(IP.octets()[3] > last.ip.octets()[3], "{IP} vs {}", last.ip);
        assert_eq!(IP.octets()[..3], NODE_SUBNET);
        assert!(NETNS.starts_with(netns::NS_PREFIX), "cluster down deletes it with the others");
        assert!(VETH.len() <= 15, "an interface name has at most 15 bytes");
    }

    #[test]
    fn hosts_toml_points_localhost_at_the_registry_on_the_bridge() {
        let toml = hosts_toml(5000);
        assert!(toml.contains("server = \"http://10.89.0.250:5000\""), "{toml}");
        assert!(toml.contains("[host.\"http://10.89.0.250:5000\"]"), "{toml}");
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let dirs = NodeDirs::new(&layout, &nodes::cluster_nodes(1)[0]);
        let path = hosts_toml_path(&dirs, 5000);
        assert!(path.ends_with("config/certs.d/localhost:5000/hosts.toml"), "{}", path.display());
    }

    #[test]
    fn config_stores_under_the_given_directory() {
        let c = config(Path::new("/state/registry/storage"), 5000);
        assert!(c.contains("rootdirectory: /state/registry/storage"), "{c}");
        assert!(c.contains("addr: 0.0.0.0:5000"), "{c}");
    }
}
