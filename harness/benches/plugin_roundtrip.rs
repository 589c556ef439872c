//! Prepare + unprepare round trips against the in-process plugin over a real Unix socket: with
//! tonic's client (`:authority` `[::]:50051`, so every connection passes through after its first
//! header block), with and without the call-recording layer; and with the kubelet's grpc-go
//! client dialing a `unix:` target (`localhost`: passed through) and a passthrough target (the
//! percent-encoded socket path: every request rewritten), the two ways grpc-go reaches a plugin.
//!
//! Run: `cargo bench -p harness --bench plugin_roundtrip`
//! (`BENCH_ITERATIONS=N` changes the number of measured round trips per mode; the grpc-go modes
//! need `go` on PATH and are left out without it.)
//!
//! Each round trip is one `NodePrepareResources` (claim read from memory, CDI spec written to a
//! temp dir with write + rename) followed by one `NodeUnprepareResources` (file removed),
//! sequentially on one connection, the way one kubelet talks to one plugin.

#[path = "../../kubelet-plugin/tests/clients/mod.rs"]
mod clients;
mod common;

use std::{path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use clients::Call;
use common::{BATCH, BoxError, DRIVER, WARMUP, claim, quantile, round_trip, unix_channel};
use harness::{
    grpc::dra_v1::dra_plugin_client::DraPluginClient,
    plugin::{KubeletPlugin, Listener, MemoryClaims, PluginConfig, PluginListeners},
};
use tokio::io::AsyncWriteExt as _;
use tonic::transport::Channel;

/// How a mode's round trips are made.
enum Driver {
    /// tonic's client on one connection.
    Tonic(DraPluginClient<Channel>),
    /// The grpc-go client (`kubelet-plugin/tests/clients/go-client bench`), one process and connection per batch.
    GrpcGo { binary: PathBuf, target: &'static str },
}

/// One plugin and how its round trips are made.
struct Target {
    _dir: tempfile::TempDir,
    plugin: KubeletPlugin,
    socket: PathBuf,
    driver: Driver,
    record: bool,
    latencies: Vec<Duration>,
    calls: usize,
}

async fn start(record: bool) -> Result<(tempfile::TempDir, KubeletPlugin, PathBuf), BoxError> {
    let dir = tempfile::Builder::new().prefix("dra-bench").tempdir()?;
    let cdi = dir.path().join("cdi");
    std::fs::create_dir_all(&cdi)?;
    let claims = MemoryClaims::new();
    claims.insert(claim());
    let dra_socket = dir.path().join("dra.sock");
    let plugin = KubeletPlugin::builder(PluginConfig::new(DRIVER, "node", &cdi))
        .claim_source(Arc::new(claims))
        .record_calls(record)
        .start(PluginListeners {
            registration: Listener::unix(dir.path().join("reg.sock")),
            dra: Listener::unix(&dra_socket),
        })
        .await?;
    Ok((dir, plugin, dra_socket))
}

async fn tonic_target(record: bool) -> Result<Target, BoxError> {
    let (dir, plugin, socket) = start(record).await?;
    let client = DraPluginClient::new(unix_channel(socket.clone()).await?);
    Ok(Target {
        _dir: dir,
        plugin,
        socket,
        driver: Driver::Tonic(client),
        record,
        latencies: Vec::new(),
        calls: 0,
    })
}

async fn grpc_go_target(binary: PathBuf, target: &'static str) -> Result<Target, BoxError> {
    let (dir, plugin, socket) = start(false).await?;
    let driver = Driver::GrpcGo { binary, target };
    Ok(Target { _dir: dir, plugin, socket, driver, record: false, latencies: Vec::new(), calls: 0 })
}

/// The grpc-go client's input: the benchmark claim's prepare and unprepare.
fn grpc_go_calls() -> String {
    let claims = vec![("bench".to_owned(), "claim".to_owned(), "uid-bench".to_owned())];
    [Call::PrepareV1(claims.clone()), Call::UnprepareV1(claims)]
        .iter()
        .map(|call| {
            use base64::Engine as _;
            let request = base64::engine::general_purpose::STANDARD.encode(call.request());
            format!("{}\n", serde_json::json!({"method": call.path(), "request": request}))
        })
        .collect()
}

impl Target {
    /// `n` round trips; latencies are kept when `keep`.
    async fn run(&mut self, n: usize, keep: bool) -> Result<(), BoxError> {
        match &mut self.driver {
            Driver::Tonic(client) => {
                for _ in 0..n {
                    let trip = round_trip(client).await?;
                    if keep {
                        self.latencies.push(trip.total);
                    }
                }
            }
            Driver::GrpcGo { binary, target } => {
                let mut child = tokio::process::Command::new(&*binary)
                    .arg("bench")
                    .arg(&self.socket)
                    .arg(*target)
                    .arg(n.to_string())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()?;
                let mut stdin = child.stdin.take().ok_or("no stdin")?;
                stdin.write_all(grpc_go_calls().as_bytes()).await?;
                drop(stdin);
                let out = child.wait_with_output().await?;
                if !out.status.success() {
                    return Err(format!("the grpc-go client failed: {}", out.status).into());
                }
                let parsed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
                let latencies = parsed["latencies_ns"].as_array().ok_or("no latencies_ns")?;
                if keep {
                    self.latencies
                        .extend(latencies.iter().filter_map(|ns| ns.as_u64()).map(Duration::from_nanos));
                }
                // The unmeasured connecting round.
                self.calls += 2;
            }
        }
        self.calls += 2 * n;
        Ok(())
    }

    async fn report(self, name: &str) -> Result<(), BoxError> {
        if self.record {
            // Sanity: the layer saw every call.
            let recorded = self.plugin.calls().log().records.len();
            if recorded != self.calls {
                return Err(format!("expected {} recorded calls, got {recorded}", self.calls).into());
            }
        }
        self.plugin.stop().await;
        let total: Duration = self.latencies.iter().sum();
        let pick = |q: f64| quantile(&self.latencies, q);
        println!(
            "  {name:<44} {:>8.0} round trips/s   p50 {:>7.1} µs   p99 {:>7.1} µs",
            self.latencies.len() as f64 / total.as_secs_f64(),
            pick(0.50).as_secs_f64() * 1e6,
            pick(0.99).as_secs_f64() * 1e6,
        );
        Ok(())
    }
}

/// Whether `go` runs here.
fn have_go() -> bool {
    std::process::Command::new("go").arg("version").output().is_ok_and(|o| o.status.success())
}

fn main() -> Result<(), BoxError> {
    let iterations = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        println!(
            "plugin_roundtrip: {iterations} sequential prepare+unprepare round trips per mode over a Unix socket \
             ({WARMUP} warm-up; the modes alternate in batches of {BATCH} to share machine noise)"
        );
        let mut targets = vec![
            ("tonic, without recording layer", tonic_target(false).await?),
            ("tonic, with recording layer", tonic_target(true).await?),
        ];
        if have_go() {
            let binary = clients::go_client().await;
            targets.push(("grpc-go unix: target (passed through)", grpc_go_target(binary.clone(), "unix").await?));
            targets.push((
                "grpc-go passthrough target (rewritten)",
                grpc_go_target(binary, "passthrough").await?,
            ));
        } else {
            println!("  (no `go` on PATH: the grpc-go modes are left out)");
        }
        for (_, target) in &mut targets {
            target.run(WARMUP, false).await?;
        }
        let mut done = 0;
        while done < iterations {
            let n = BATCH.min(iterations - done);
            for (_, target) in &mut targets {
                target.run(n, true).await?;
            }
            done += n;
        }
        for (name, target) in targets {
            target.report(name).await?;
        }
        Ok::<(), BoxError>(())
    })
}
