//! What a driver adds to a failed spec's artifacts.

use std::path::Path;

use async_trait::async_trait;

use crate::{
    calls::{CallLog, Calls},
    framework::ArtifactSource,
};

/// Writes the driver's ResourceSlices and each node's recorded gRPC calls into a failed spec's
/// artifacts.
pub(super) struct DriverArtifacts {
    pub(super) name: String,
    pub(super) driver: String,
    pub(super) client: kube::Client,
    pub(super) calls: Vec<(String, Calls)>,
}

#[async_trait]
impl ArtifactSource for DriverArtifacts {
    fn name(&self) -> &str {
        &self.name
    }

    async fn collect(&self, dir: &Path) -> anyhow::Result<()> {
        let slices = crate::suite::list_dra_objects(&self.client, "ResourceSlice", "resourceslices", None)
            .await
            .map(|slices| {
                let ours = |s: &kube::api::DynamicObject| {
                    s.data.pointer("/spec/driver").and_then(|d| d.as_str()) == Some(self.driver.as_str())
                };
                slices.into_iter().filter(ours).collect::<Vec<_>>()
            });
        let slices = crate::framework::write_list(dir, "resourceslices.yaml", slices).await;
        for (node, calls) in &self.calls {
            let log: CallLog = calls.log();
            tokio::fs::write(dir.join(format!("grpc-calls-{node}.json")), serde_json::to_vec_pretty(&log)?)
                .await?;
            tokio::fs::write(dir.join(format!("grpc-calls-{node}.txt")), log.to_string()).await?;
        }
        slices.map_err(|e| anyhow::anyhow!(e))
    }
}
