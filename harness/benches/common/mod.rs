//! What the benchmarks share: the benchmark claim, a kubelet-like client on a Unix socket, one
//! measured prepare+unprepare round trip, and quantiles.

#![allow(dead_code)] // each bench uses a different part

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use harness::grpc::dra_v1::{self, dra_plugin_client::DraPluginClient};
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

/// Errors of the benchmarks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The driver name of the benchmark plugin.
pub const DRIVER: &str = "bench.dra-e2e.k8s.io";
/// Round trips before measuring.
pub const WARMUP: usize = 200;
/// Round trips per batch; modes alternate per batch so that they share the machine's noise.
pub const BATCH: usize = 250;

/// The one allocated claim every round trip prepares.
pub fn claim() -> ResourceClaim {
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

/// A gRPC channel to a Unix socket, the way the kubelet connects to a plugin.
pub async fn unix_channel(path: PathBuf) -> Result<Channel, BoxError> {
    Ok(Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await?)
}

/// Durations of one round trip.
pub struct RoundTrip {
    /// NodePrepareResources alone.
    pub prepare: Duration,
    /// Prepare and unprepare.
    pub total: Duration,
}

/// One NodePrepareResources + NodeUnprepareResources of the benchmark claim; fails when either
/// reports an error for the claim.
pub async fn round_trip(client: &mut DraPluginClient<Channel>) -> Result<RoundTrip, BoxError> {
    let claims =
        vec![dra_v1::Claim { namespace: "bench".into(), uid: "uid-bench".into(), name: "claim".into() }];
    let start = Instant::now();
    let prepared = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: claims.clone() })
        .await?
        .into_inner();
    let prepare = start.elapsed();
    if prepared.claims.get("uid-bench").is_none_or(|c| !c.error.is_empty()) {
        return Err(format!("prepare failed: {prepared:?}").into());
    }
    let unprepared =
        client.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims }).await?.into_inner();
    if unprepared.claims.get("uid-bench").is_none_or(|c| !c.error.is_empty()) {
        return Err(format!("unprepare failed: {unprepared:?}").into());
    }
    Ok(RoundTrip { prepare, total: start.elapsed() })
}

/// The `q` quantile (0..=1) of some durations.
pub fn quantile(durations: &[Duration], q: f64) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}
