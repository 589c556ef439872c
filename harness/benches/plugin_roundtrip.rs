//! Prepare + unprepare round trips against the in-process plugin over a real
//! Unix socket, with and without the call-recording layer.
//!
//! Run: `cargo bench -p harness --bench plugin_roundtrip`
//! (`BENCH_ITERATIONS=N` changes the number of measured round trips per mode.)
//!
//! Each round trip is one `NodePrepareResources` (claim read from memory, CDI
//! spec written to a temp dir with write + rename) followed by one
//! `NodeUnprepareResources` (file removed), sequentially on one connection,
//! the way one kubelet talks to one plugin.

use std::{
    error::Error,
    sync::Arc,
    time::{Duration, Instant},
};

use harness::{
    grpc::dra_v1::{self, dra_plugin_client::DraPluginClient},
    plugin::{KubeletPlugin, Listener, MemoryClaims, PluginConfig, PluginListeners},
};
use hyper_util::rt::TokioIo;
use k8s_openapi::{
    api::resource::v1::{
        AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
        DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::RawExtension},
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

const DRIVER: &str = "bench.dra-e2e.k8s.io";
const WARMUP: usize = 200;
const BATCH: usize = 250;

fn claim() -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("claim".into()),
            namespace: Some("bench".into()),
            uid: Some("uid-bench".into()),
            ..Default::default()
        },
        spec: None,
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    config: Some(vec![DeviceAllocationConfiguration {
                        opaque: Some(OpaqueDeviceConfiguration {
                            driver: DRIVER.into(),
                            parameters: RawExtension(serde_json::json!({"a": "b"})),
                        }),
                        requests: None,
                        source: "FromClaim".into(),
                    }]),
                    results: Some(vec![DeviceRequestAllocationResult {
                        device: "device-00".into(),
                        driver: DRIVER.into(),
                        pool: "node".into(),
                        request: "req".into(),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

async fn connect(path: std::path::PathBuf) -> Result<Channel, Box<dyn Error>> {
    Ok(Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await?)
}

/// One plugin and a client connected to it.
struct Target {
    _dir: tempfile::TempDir,
    plugin: KubeletPlugin,
    client: DraPluginClient<Channel>,
    record: bool,
    latencies: Vec<Duration>,
    calls: usize,
}

async fn start(record: bool) -> Result<Target, Box<dyn Error>> {
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
    let client = DraPluginClient::new(connect(dra_socket).await?);
    Ok(Target { _dir: dir, plugin, client, record, latencies: Vec::new(), calls: 0 })
}

impl Target {
    /// `n` round trips; latencies are kept when `keep`.
    async fn run(&mut self, n: usize, keep: bool) -> Result<(), Box<dyn Error>> {
        let claims =
            vec![dra_v1::Claim { namespace: "bench".into(), uid: "uid-bench".into(), name: "claim".into() }];
        for _ in 0..n {
            let start = Instant::now();
            let prepared = self
                .client
                .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: claims.clone() })
                .await?
                .into_inner();
            if prepared.claims.get("uid-bench").is_none_or(|c| !c.error.is_empty()) {
                return Err(format!("prepare failed: {prepared:?}").into());
            }
            let unprepared = self
                .client
                .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: claims.clone() })
                .await?
                .into_inner();
            if unprepared.claims.get("uid-bench").is_none_or(|c| !c.error.is_empty()) {
                return Err(format!("unprepare failed: {unprepared:?}").into());
            }
            self.calls += 2;
            if keep {
                self.latencies.push(start.elapsed());
            }
        }
        Ok(())
    }

    async fn report(mut self, name: &str) -> Result<(), Box<dyn Error>> {
        if self.record {
            // Sanity: the layer saw every call.
            let recorded = self.plugin.calls().log().records.len();
            if recorded != self.calls {
                return Err(format!("expected {} recorded calls, got {recorded}", self.calls).into());
            }
        }
        self.plugin.stop().await;
        self.latencies.sort();
        let total: Duration = self.latencies.iter().sum();
        let pick = |q: f64| {
            let index = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
            self.latencies.get(index).copied().unwrap_or_default()
        };
        println!(
            "  {name:<24} {:>8.0} round trips/s   p50 {:>7.1} µs   p99 {:>7.1} µs",
            self.latencies.len() as f64 / total.as_secs_f64(),
            pick(0.50).as_secs_f64() * 1e6,
            pick(0.99).as_secs_f64() * 1e6,
        );
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let iterations = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        println!(
            "plugin_roundtrip: {iterations} sequential prepare+unprepare round trips per mode over a Unix socket \
             ({WARMUP} warm-up; the modes alternate in batches of {BATCH} to share machine noise)"
        );
        let mut plain = start(false).await?;
        let mut recorded = start(true).await?;
        plain.run(WARMUP, false).await?;
        recorded.run(WARMUP, false).await?;
        let mut done = 0;
        while done < iterations {
            let n = BATCH.min(iterations - done);
            plain.run(n, true).await?;
            recorded.run(n, true).await?;
            done += n;
        }
        plain.report("without recording layer").await?;
        recorded.report("with recording layer").await?;
        Ok::<(), Box<dyn Error>>(())
    })
}
