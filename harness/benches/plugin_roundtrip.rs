//! Prepare + unprepare round trips against the in-process plugin over a real
//! Unix socket, with and without the call-recording layer, and with the
//! `:authority` rewrite that the DRA listener does for kubelets before v1.36.
//!
//! Run: `cargo bench -p harness --bench plugin_roundtrip`
//! (`BENCH_ITERATIONS=N` changes the number of measured round trips per mode.)
//!
//! Each round trip is one `NodePrepareResources` (claim read from memory, CDI
//! spec written to a temp dir with write + rename) followed by one
//! `NodeUnprepareResources` (file removed), sequentially on one connection,
//! the way one kubelet talks to one plugin.

mod common;

use std::{sync::Arc, time::Duration};

use common::{BATCH, BoxError, DRIVER, WARMUP, claim, quantile, round_trip, unix_channel};
use harness::{
    grpc::dra_v1::dra_plugin_client::DraPluginClient,
    plugin::{KubeletPlugin, Listener, MemoryClaims, PluginConfig, PluginListeners},
};
use tonic::transport::Channel;

/// One plugin and a client connected to it.
struct Target {
    _dir: tempfile::TempDir,
    plugin: KubeletPlugin,
    client: DraPluginClient<Channel>,
    record: bool,
    latencies: Vec<Duration>,
    calls: usize,
}

async fn start(record: bool, rewrite_authority: bool) -> Result<Target, BoxError> {
    let dir = tempfile::Builder::new().prefix("dra-bench").tempdir()?;
    let cdi = dir.path().join("cdi");
    std::fs::create_dir_all(&cdi)?;
    let claims = MemoryClaims::new();
    claims.insert(claim());
    let dra_socket = dir.path().join("dra.sock");
    let plugin = KubeletPlugin::builder(
        PluginConfig::new(DRIVER, "node", &cdi).dra_authority_rewrite(rewrite_authority),
    )
    .claim_source(Arc::new(claims))
    .record_calls(record)
    .start(PluginListeners {
        registration: Listener::unix(dir.path().join("reg.sock")),
        dra: Listener::unix(&dra_socket),
    })
    .await?;
    let client = DraPluginClient::new(unix_channel(dra_socket).await?);
    Ok(Target { _dir: dir, plugin, client, record, latencies: Vec::new(), calls: 0 })
}

impl Target {
    /// `n` round trips; latencies are kept when `keep`.
    async fn run(&mut self, n: usize, keep: bool) -> Result<(), BoxError> {
        for _ in 0..n {
            let trip = round_trip(&mut self.client).await?;
            self.calls += 2;
            if keep {
                self.latencies.push(trip.total);
            }
        }
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
            "  {name:<24} {:>8.0} round trips/s   p50 {:>7.1} µs   p99 {:>7.1} µs",
            self.latencies.len() as f64 / total.as_secs_f64(),
            pick(0.50).as_secs_f64() * 1e6,
            pick(0.99).as_secs_f64() * 1e6,
        );
        Ok(())
    }
}

fn main() -> Result<(), BoxError> {
    let iterations = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        println!(
            "plugin_roundtrip: {iterations} sequential prepare+unprepare round trips per mode over a Unix socket \
             ({WARMUP} warm-up; the modes alternate in batches of {BATCH} to share machine noise)"
        );
        let mut plain = start(false, false).await?;
        let mut recorded = start(true, false).await?;
        let mut rewritten = start(false, true).await?;
        for target in [&mut plain, &mut recorded, &mut rewritten] {
            target.run(WARMUP, false).await?;
        }
        let mut done = 0;
        while done < iterations {
            let n = BATCH.min(iterations - done);
            for target in [&mut plain, &mut recorded, &mut rewritten] {
                target.run(n, true).await?;
            }
            done += n;
        }
        plain.report("without recording layer").await?;
        recorded.report("with recording layer").await?;
        rewritten.report("with :authority rewrite").await?;
        Ok::<(), BoxError>(())
    })
}
