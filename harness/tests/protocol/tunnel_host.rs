//! The tunnel chain on this machine, without a cluster: a kubelet-like tonic client on the Unix
//! socket ↔ the real `hostpathplugin --proxy-endpoint` (started and restarted by
//! `ProxyProcess`) ↔ a TCP tunnel ↔ the in-process plugin.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{sync::Arc, time::Duration};

use crate::common::*;
use crate::tunnel_support::*;
use harness::{
    calls::Method,
    grpc::registration,
    plugin::{LocalDirFiles, MemoryClaims},
    proxied::{ProxyResets, SocketControl},
    tunnel::{TcpDialer, Tunnel, TunnelConfig},
};

/// Claims `claim-0` … `claim-{n-1}` (uid `uid-i`), each with one device.
fn claims(n: usize) -> MemoryClaims {
    let claims = MemoryClaims::new();
    for i in 0..n {
        claims.insert(allocated_claim(&format!("claim-{i}"), &format!("uid-{i}"), &[("req", "device-00")]));
    }
    claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_and_200_round_trips_through_the_tunnel() {
    let baseline = alive_tasks();
    let chain = Chain::start(Arc::new(claims(200)), Arc::new(LocalDirFiles), TunnelConfig::default()).await;
    chain.ready(10).await;
    // Dials before the proxy listened failed; none may fail from here on.
    let failures_at_start = [chain.dra.tunnel.stats().failures, chain.registration.tunnel.stats().failures];

    // Registration exactly as the kubelet does it (GetInfo within 1 s on a fresh connection).
    let registered = register_like_kubelet(&chain.registration.path).await;
    assert_eq!(registered.info.name, DRIVER);
    assert_eq!(registered.info.endpoint, chain.dra.path.display().to_string());
    assert_eq!(registered.chosen, "v1.DRAPlugin");
    within("registration", chain.plugin.wait_registered(TIMEOUT)).await.unwrap();

    let dra = DraClient::connect(&chain.dra.path, &registered.chosen).await;
    for i in 0..200 {
        let (name, uid) = (format!("claim-{i}"), format!("uid-{i}"));
        let claim = [claim_ref(&name, &uid)];
        let prepared = within("prepare", dra.prepare(&claim)).await.unwrap();
        let devices = prepared[&uid].clone().unwrap();
        assert_eq!(devices[0].cdi_device_ids, [format!("{DRIVER}/test=claim-{uid}-req")]);
        assert!(chain.cdi_file(&uid, "req").exists());
        let unprepared = within("unprepare", dra.unprepare(&claim)).await.unwrap();
        assert_eq!(unprepared[&uid], "");
        assert!(!chain.cdi_file(&uid, "req").exists());
    }
    let calls = chain.plugin.calls().log();
    assert_eq!(calls.count(Method::NodePrepareResources.succeeded()), 200, "{calls}");
    assert_eq!(calls.count(Method::NodeUnprepareResources.succeeded()), 200, "{calls}");
    assert_eq!(calls.count(Method::GetInfo.succeeded()), 1, "{calls}");

    // The used connections were replaced: each tunnel still holds 10 unused ones.
    for (socket, failures) in [&chain.dra, &chain.registration].into_iter().zip(failures_at_start) {
        let stats =
            socket.tunnel.wait_for("10 idle again", TIMEOUT, |s| s.idle == 10 && s.used >= 1).await.unwrap();
        assert_eq!(stats.failures, failures, "{stats:?}");
    }
    drop(dra);
    chain.stop().await;
    wait_tasks(baseline, "after stopping the chain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_connections_get_info_within_the_kubelets_budget() {
    let chain =
        Chain::start(Arc::new(MemoryClaims::new()), Arc::new(LocalDirFiles), TunnelConfig::default()).await;
    chain.ready(10).await;
    // More fresh connections than pre-established ones, one after the other, each with the
    // kubelet's 1 s GetInfo deadline; the tunnel replaces each used connection.
    let mut slowest = Duration::ZERO;
    for _ in 0..30 {
        let started = tokio::time::Instant::now();
        let mut client = registration::registration_client::RegistrationClient::new(
            unix_channel(&chain.registration.path).await,
        );
        let mut request = tonic::Request::new(registration::InfoRequest {});
        request.set_timeout(Duration::from_secs(1));
        let info = tokio::time::timeout(Duration::from_secs(1), client.get_info(request))
            .await
            .expect("GetInfo must answer within 1 s")
            .unwrap()
            .into_inner();
        assert_eq!(info.name, DRIVER);
        slowest = slowest.max(started.elapsed());
    }
    println!("slowest connect + GetInfo: {slowest:?}");
    chain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_after_the_proxy_process_is_killed_and_restarted() {
    let chain = Chain::start(Arc::new(claims(2)), Arc::new(LocalDirFiles), TunnelConfig::default()).await;
    chain.ready(10).await;
    let registered = register_like_kubelet(&chain.registration.path).await;
    let dra = DraClient::connect(&chain.dra.path, &registered.chosen).await;
    let first = [claim_ref("claim-0", "uid-0")];
    within("prepare before kill", dra.prepare(&first)).await.unwrap()["uid-0"].clone().unwrap();

    // Kill both proxies hard; ProxyProcess restarts them (1 s backoff).
    for socket in [&chain.dra, &chain.registration] {
        let pids = processes_with_arg(&socket.endpoint_arg());
        assert_eq!(pids.len(), 1, "{pids:?}");
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pids[0]).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
    }
    for socket in [&chain.dra, &chain.registration] {
        socket.proxy.wait_starts(2, Duration::from_secs(10)).await.unwrap();
    }

    // The same client channel reconnects (tonic redials the Unix socket) and calls succeed.
    let second = [claim_ref("claim-1", "uid-1")];
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut failures = 0;
    loop {
        match dra.prepare(&second).await {
            Ok(result) => {
                result["uid-1"].clone().unwrap();
                break;
            }
            Err(status) => {
                failures += 1;
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no successful prepare after restart: {status}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    println!("prepare failed {failures} times while the proxy restarted");
    within("unprepare after restart", dra.unprepare(&first)).await.unwrap();

    // Registration works again on a fresh connection, within the 1 s budget.
    chain.registration.tunnel.wait_for("an idle connection", TIMEOUT, |s| s.idle >= 1).await.unwrap();
    register_like_kubelet(&chain.registration.path).await;
    let stats = chain.dra.tunnel.stats();
    assert!(stats.failures >= 1, "the dead connections count as failures: {stats:?}");
    drop(dra);
    chain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_tunnel_leaves_no_connection_or_task() {
    let chain =
        Chain::start(Arc::new(MemoryClaims::new()), Arc::new(LocalDirFiles), TunnelConfig::default()).await;
    chain.ready(10).await;

    // A second tunnel to the DRA proxy on a runtime of its own, so that its tasks can be
    // counted exactly; dropped without close().
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (sender, listener) = harness::plugin::Listener::channel(64);
    let extra = {
        let _entered = runtime.enter();
        Tunnel::start(
            Arc::new(TcpDialer::new(([127, 0, 0, 1], chain.dra.port).into())),
            sender,
            TunnelConfig::default(),
        )
    };
    extra.wait_for("10 idle connections", TIMEOUT, |s| s.idle == 10).await.unwrap();
    // The dial loop and one supervisor per connection (the last one may be spawning still).
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while runtime.metrics().num_alive_tasks() != 11 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} tasks, expected 11",
            runtime.metrics().num_alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(established_to(chain.dra.port), 20);
    drop(extra);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while runtime.metrics().num_alive_tasks() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "tasks of the dropped tunnel still alive");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Closed although the consumer still holds the handed-over connections.
    assert_eq!(established_to(chain.dra.port), 10);
    drop(listener);
    runtime.shutdown_background();

    chain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_retries_until_the_proxy_listens() {
    // The tunnel starts long before anything listens: failed dials are retried with backoff.
    let port = free_port();
    let (sender, _listener) = harness::plugin::Listener::channel(64);
    let tunnel = Tunnel::start(
        Arc::new(TcpDialer::new(([127, 0, 0, 1], port).into())),
        sender,
        TunnelConfig::default(),
    );
    tunnel.wait_for("3 failed dials", TIMEOUT, |s| s.failures >= 3).await.unwrap();
    assert_eq!(tunnel.stats().idle, 0);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tunnel
        .wait_for("10 handed-over idle connections", TIMEOUT, |s| s.idle == 10 && s.handed_over == 10)
        .await
        .unwrap();
    let final_stats = within("close", tunnel.close()).await.unwrap();
    assert_eq!((final_stats.open, final_stats.idle), (0, 0));
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_waits_for_the_socket_it_comes_after_at_most_five_seconds() {
    // As the registration proxy waits for the DRA socket: `waits` starts only once `dra.sock`
    // exists; `gives_up` waits for a socket that never appears and starts anyway.
    let dir = tempfile::tempdir().unwrap();
    let (dra, reg, other) =
        (dir.path().join("dra.sock"), dir.path().join("reg.sock"), dir.path().join("other.sock"));
    let runner = Arc::new(harness::podexec::LocalRunner::new());
    let waits = harness::podexec::ProxyProcess::start(
        runner.clone(),
        local_proxy(&reg, free_port()).after_socket(dra.display().to_string()),
    );
    let gives_up = harness::podexec::ProxyProcess::start(
        runner,
        local_proxy(&other, free_port()).after_socket(dir.path().join("never.sock").display().to_string()),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(waits.starts(), 0, "started before the socket it waits for existed");
    assert!(!reg.exists());
    let _dra = std::os::unix::net::UnixListener::bind(&dra).unwrap();
    waits.wait_starts(1, TIMEOUT).await.unwrap();
    wait_for_path(&reg, "reg.sock to appear").await;
    gives_up.wait_starts(1, TIMEOUT).await.unwrap();
    within("stop", waits.stop()).await.unwrap();
    within("stop", gives_up.stop()).await.unwrap();
    assert!(!reg.exists() && !other.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_proxy_ends_the_connections_it_splices() {
    // The kubelet may dial the DRA socket again after the plugin behind the tunnel stopped, and
    // the tunnel keeps idle connections: a proxy told to stop must not wait for such a pair to
    // end, as neither side ends it. Here both peers hold their connection open.
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dra.sock");
    let port = free_port();
    let proxy = spawn_proxy(&socket, port);
    wait_for_path(&socket, "the proxy's socket").await;
    let mut kubelet_side = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let mut tunnel_side = connect_port(port, "the proxy's port").await;
    kubelet_side.write_all(b"x").await.unwrap();
    let mut byte = [0u8; 1];
    within("the spliced byte", tunnel_side.read_exact(&mut byte)).await.unwrap();
    assert_eq!(&byte, b"x");

    terminate(proxy).await;
    assert_eq!(within("EOF on the kubelet's side", kubelet_side.read(&mut byte)).await.unwrap(), 0);
    assert_eq!(within("EOF on the tunnel's side", tunnel_side.read(&mut byte)).await.unwrap(), 0);
    assert!(!socket.exists(), "the proxy left its socket behind");
}

/// A TCP connection to the proxy's `port` on 127.0.0.1, dialed until it listens.
async fn connect_port(port: u16, what: &str) -> tokio::net::TcpStream {
    within(what, async {
        loop {
            match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                Ok(stream) => break stream,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
}

/// `hostpathplugin --proxy-endpoint` between `socket` and TCP `port` on this machine.
fn spawn_proxy(socket: &std::path::Path, port: u16) -> tokio::process::Child {
    tokio::process::Command::new(hostpathplugin())
        .arg(format!("--endpoint={}", socket.display()))
        .arg(format!("--proxy-endpoint=tcp://127.0.0.1:{port}"))
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// SIGTERMs `proxy` and waits for its clean exit.
async fn terminate(mut proxy: tokio::process::Child) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(proxy.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = within("the proxy to exit after SIGTERM", proxy.wait()).await.unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_stopped_after_its_replacement_started_leaves_the_replacement_s_socket() {
    // A lost proxy pod's container is killed when its kubelet gets to it, which on a loaded node
    // can be after the replacement pod's proxy listened at the same host path: the old proxy's
    // exit must not unlink the new socket (the kubelet would lose the plugin).
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dra.sock");
    let old = spawn_proxy(&socket, free_port());
    wait_for_path(&socket, "the old proxy's socket").await;
    let port = free_port();
    let new = spawn_proxy(&socket, port);
    // The replacement listens on its port only after its socket took the path.
    let mut tunnel_side = connect_port(port, "the replacement's port").await;

    terminate(old).await;
    assert!(socket.exists(), "the old proxy's exit removed the replacement's socket");
    // The socket still reaches the replacement.
    let mut kubelet_side = within("connect", tokio::net::UnixStream::connect(&socket)).await.unwrap();
    kubelet_side.write_all(b"y").await.unwrap();
    let mut byte = [0u8; 1];
    within("the spliced byte", tunnel_side.read_exact(&mut byte)).await.unwrap();
    assert_eq!(&byte, b"y");

    terminate(new).await;
    assert!(!socket.exists(), "the replacement left its own socket behind");
}

/// One GetInfo as the kubelet's registration makes it (1 s), without retries: `Err` with why.
async fn get_info_once(socket: &std::path::Path) -> Result<registration::PluginInfo, String> {
    let path = socket.to_path_buf();
    let endpoint = tonic::transport::Endpoint::from_static("http://[::]:50051");
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(path).await?,
            ))
        }
    }));
    let call = async {
        let channel = connect.await.map_err(|e| format!("connect: {e}"))?;
        let mut client = registration::registration_client::RegistrationClient::new(channel);
        client.get_info(registration::InfoRequest {}).await.map(|r| r.into_inner()).map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(1), call).await.map_err(|_| "no answer within 1 s".to_owned())?
}

/// How long a proxy's restart may take here: as long as the resets allow one (their
/// `START_TIMEOUT`), not a test's usual 10 s, which a loaded machine exceeded once.
const RESTART_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until both proxies were started `n` times and both tunnels hold 10 idle connections.
async fn refilled(chain: &Chain, n: u64) {
    for socket in [&chain.dra, &chain.registration] {
        socket.proxy.wait_starts(n, RESTART_TIMEOUT).await.unwrap();
        wait_for_path(&socket.path, "the proxy's socket").await;
        socket
            .tunnel
            .wait_for("10 idle connections", RESTART_TIMEOUT, |s| s.idle >= 10 && !s.paused)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_of_the_way_to_the_proxies_leaves_dead_connections_until_they_restart() {
    // What the resets decided (restart, or not while a connection is in use) is in a failure's
    // output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "harness::proxied=debug,harness::tunnel=debug".into()),
        )
        .with_test_writer()
        .try_init();
    // Each tunnel reaches its proxy through a relay that stands in for the port-forwards through
    // a node's kubelet: cutting it is what a kubelet restart does to them.
    let chain =
        Chain::start_with(Arc::new(claims(2)), Arc::new(LocalDirFiles), TunnelConfig::default(), true).await;
    chain.ready(10).await;
    assert_eq!(get_info_once(&chain.registration.path).await.unwrap().name, DRIVER);

    // Without the restarts: the connections the cut ended stay queued in the proxy, in front of
    // the good ones the tunnel makes again, and the next kubelet connection gets one of them.
    let lost = chain.registration.tunnel.stats().lost_idle;
    chain.registration.relay.as_ref().unwrap().cut();
    chain
        .registration
        .tunnel
        .wait_for("lost connections", TIMEOUT, |s| s.lost_idle >= lost + 9)
        .await
        .unwrap();
    refilled(&chain, 1).await;
    let dead = get_info_once(&chain.registration.path).await;
    assert!(dead.is_err(), "a kubelet connection got a good tunnel connection first: {dead:?}");

    // With them: both proxies get a fresh listener, the registration proxy after the DRA proxy,
    // and the first calls of the next kubelet succeed.
    let resets = ProxyResets::start(
        SocketControl::new(&chain.dra.tunnel, &chain.dra.proxy),
        SocketControl::new(&chain.registration.tunnel, &chain.registration.proxy),
        "test plugin",
    );
    for socket in [&chain.dra, &chain.registration] {
        socket.relay.as_ref().unwrap().cut();
    }
    refilled(&chain, 2).await;
    let info = get_info_once(&chain.registration.path).await.unwrap();
    assert_eq!(info.endpoint, chain.dra.path.display().to_string());
    let dra = DraClient::connect(&chain.dra.path, "v1.DRAPlugin").await;
    let claim = [claim_ref("claim-0", "uid-0")];
    within("prepare after the restart", dra.prepare(&claim)).await.unwrap()["uid-0"].clone().unwrap();
    // One restart each.
    assert_eq!((chain.dra.proxy.starts(), chain.registration.proxy.starts()), (2, 2));
    resets.stop().await;
    chain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_of_a_chain_dropped_without_stop_are_killed() {
    // What a test that panics before `stop` does: its proxies, which outlive their start scripts
    // by design, must not outlive the test.
    let chain = Chain::start(Arc::new(claims(1)), Arc::new(LocalDirFiles), TunnelConfig::default()).await;
    chain.ready(10).await;
    let endpoints = [chain.dra.endpoint_arg(), chain.registration.endpoint_arg()];
    for endpoint in &endpoints {
        assert!(!processes_with_arg(endpoint).is_empty(), "no proxy runs with {endpoint}");
    }
    drop(chain);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    for endpoint in &endpoints {
        while !processes_with_arg(endpoint).is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "the proxy with {endpoint} still runs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
