//! Device health in the pod status (KEP-4680, `ResourceHealthStatus`): the kubelet watches a
//! driver's `DRAResourceHealth` stream and publishes each device's health (and, with
//! `ResourceHealthStatusMessage`, its message) in
//! `pod.status.containerStatuses[].allocatedResourcesStatus[name="claim:<pod claim>"]`, the entry
//! identified by the device's first CDI device ID (`<driver>/test=...`).
//!
//! | upstream | specs |
//! |---|---|
//! | test/e2e/dra/health.go (`kubelet ... [FeatureGate:ResourceHealthStatus] [KubeletMinVersion:1.36]`) | must reflect device health changes in the pod status, with a driver which serves both health API versions, only v1alpha1, only v1 |
//! | test/e2e/dra/dra.go (`kubelet`) | should report device health with custom messages |
//!
//! Kubernetes v1.37.2's own tree has the three health.go specs in test/e2e_node/dra_test.go
//! instead (health.go was added to test/e2e/dra later); the names, labels and checks here are
//! health.go's.
//!
//! What the kubelet does, and what the call log must show: at registration it picks the most
//! recent health version that both it and the plugin support (a 1.37 kubelet: `v1` before
//! `v1alpha1`; 1.36 has only `v1alpha1`), then keeps one `NodeWatchResources` stream open on it,
//! reopening it if it ends. So each spec expects at least one call of exactly
//! `/v1.DRAResourceHealth/NodeWatchResources` or `/v1alpha1.DRAResourceHealth/NodeWatchResources`
//! and none of the other.
//!
//! Feature gates: specs skip when the API server reports `ResourceHealthStatus` (or
//! `ResourceHealthStatusMessage`) off, because it then drops those fields, and unless the
//! kubelet of the node the spec will select runs with them on, as its metrics say, else its
//! configuration (`/configz`, see [`gates`]); a kubelet whose gates cannot be read skips the
//! spec, saying why. Both are decided before anything is created (the specs' requirements), as
//! is the kubelet version (the `KubeletMinVersion` labels); never from what the kubelet does,
//! which is what the specs test.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{Builder, node_name},
    calls::{CallLog, Method},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{ClusterAccess, Ctx, Label, Precheck, Registry, SpecResult},
    plugin::Health,
    wait::Verdict,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

use super::{
    FEATURE_DRA,
    kubelet_drivers::{
        evidence::{self, HealthApi},
        gates,
    },
};

/// How long a health change may take to reach the pod status (health.go: 60 s).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a health change with a message may take (dra.go: 30 s).
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the kubelet may take to open the health stream (health.go: 60 s).
const WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// The name of health.go's specs.
const REFLECT: &str = "must reflect device health changes in the pod status";

/// Registers the specs under `[sig-node] [DRA]`.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels(
            "kubelet",
            [
                Label::new(FEATURE_DRA),
                Label::gate("ResourceHealthStatus"),
                Label::new("KubeletMinVersion:1.36"),
            ],
            |r| {
                r.requires(gates::api_server_requirement(
                    "ResourceHealthStatus",
                    "it drops allocatedResourcesStatus from pod status",
                ));
                r.requires(|pre| kubelet_gate_requirement(pre, "ResourceHealthStatus"));
                r.context("with a driver which serves all health API versions", |r| {
                    r.it(REFLECT, |ctx| reflect_health(ctx, true, true));
                });
                // Like a driver which shipped before the v1 API existed.
                r.context("with a driver which only serves the v1alpha1 health API", |r| {
                    r.it(REFLECT, |ctx| reflect_health(ctx, false, true));
                });
                // Like a driver which dropped v1alpha1; kubelets before 1.37 cannot consume it.
                r.context("with a driver which only serves the v1 health API", |r| {
                    r.it(REFLECT, |ctx| reflect_health(ctx, true, false)).label("KubeletMinVersion:1.37");
                });
            },
        );
        r.context_with_labels("kubelet", [FEATURE_DRA], |r| {
            // `framework.WithLabel("KubeletMinVersion:1.36")` and
            // `f.WithFeatureGate(features.ResourceHealthStatusMessage)`.
            r.it("should report device health with custom messages", custom_messages)
                .labels([Label::new("KubeletMinVersion:1.36"), Label::gate("ResourceHealthStatusMessage")])
                .requires(gates::api_server_requirement(
                    "ResourceHealthStatus",
                    "it drops allocatedResourcesStatus from pod status",
                ))
                .requires(gates::api_server_requirement(
                    "ResourceHealthStatusMessage",
                    "it drops the message from allocatedResourcesStatus",
                ))
                .requires(|pre| kubelet_gate_requirement(pre, "ResourceHealthStatus"))
                .requires(|pre| kubelet_gate_requirement(pre, "ResourceHealthStatusMessage"));
        });
    });
}

/// The one node a health spec runs on, as its set-up selects it (the spec's `KubeletMinVersion`
/// leaves older kubelets out).
async fn health_node(from: &impl ClusterAccess) -> SpecResult<String> {
    let nodes = Nodes::select(from, 1, 1).await?;
    Ok(nodes.names().first().context("no node selected")?.clone())
}

/// Skips before anything is created unless the kubelet of the node the spec will run on runs
/// with `gate` on (see [`gates::require_kubelet`]).
async fn kubelet_gate_requirement(pre: Precheck, gate: &'static str) -> SpecResult {
    let node = health_node(&pre).await?;
    gates::require_kubelet(&pre, &node, gate).await
}

/// The health and message of the driver's device as the pod status shows it under
/// `status_name`, from the first container status that has it.
fn device_health(pod: &Pod, status_name: &str, driver: &str) -> Option<(String, Option<String>)> {
    let prefix = format!("{driver}/");
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .flat_map(|cs| cs.allocated_resources_status.iter().flatten())
        .filter(|rs| rs.name == status_name)
        .flat_map(|rs| rs.resources.iter().flatten())
        .find(|h| h.resource_id.starts_with(&prefix))
        .map(|h| (h.health.clone().unwrap_or_default(), h.message.clone()))
}

/// Health string and message the plugin last sent for `pool/device` on the stream of `method`.
fn last_report(log: &CallLog, method: &Method, pool: &str, device: &str) -> Option<(i64, String)> {
    let response = log.last(method.clone())?.response.as_ref()?;
    response["devices"].as_array()?.iter().find_map(|d| {
        (d["device"]["pool_name"] == pool && d["device"]["device_name"] == device).then(|| {
            (d["health"].as_i64().unwrap_or_default(), d["message"].as_str().unwrap_or_default().to_owned())
        })
    })
}

/// A running pod with one allocated device, and what is known about the kubelet.
struct HealthFixture {
    driver: Driver,
    b: Builder,
    pod: Pod,
    node: String,
    pool: String,
    device: String,
    /// `claim:<pod claim>` (the container's claim has no request).
    status_name: String,
    /// The health API the kubelet must watch.
    api: HealthApi,
}

impl HealthFixture {
    /// Sets up the driver (`config`) on one node, a claim (named `claim_name` if given) and a pod
    /// using it, waits until the pod runs, and checks the health stream in the call log. The
    /// kubelet version and gates were decided by the spec's requirements.
    async fn start(ctx: &Ctx, config: DriverConfig, claim_name: Option<&str>) -> SpecResult<Self> {
        let nodes = Nodes::select(ctx, 1, 1).await?;
        let node = nodes.names().first().context("no node selected")?.clone();
        let (health_v1, health_v1alpha1) = (config.health_v1, config.health_v1alpha1);
        let driver = Driver::start(ctx, &nodes, config).await?;
        let b = Builder::start(ctx, &driver, None).await?;

        let mut claim = b.external_claim();
        if let Some(name) = claim_name {
            claim.metadata.name = Some(name.to_owned());
        }
        let pod = b.pod_external(&claim.name_any());
        b.create_claim(&claim).await?;
        b.create_pod(&pod).await?;
        let running = b.test_pod(&pod, &[]).await?;
        let running_node = node_name(&running).context("the running pod has no node")?;
        expect!(running_node == node, "the pod runs on {running_node}, the driver only on {node}");

        let claims = b.pod_claims(&running).await?;
        let stored = claims.values().next().context("the pod has no claim")?;
        let result = harness::builder::allocation_results(stored)
            .first()
            .with_context(|| format!("claim {} has no allocation result", stored.name_any()))?;
        let (pool, device) = (result.pool.clone(), result.device.clone());

        let calls = driver.try_calls(&node)?;
        // The most recent version served by the driver that the kubelet supports.
        let kubelet = ctx.cluster().nodes.iter().find(|n| n.name == node).and_then(|n| n.kubelet());
        let api = match (health_v1, health_v1alpha1) {
            (false, _) => HealthApi::V1alpha1,
            // Only choice; the spec's kubelet version requirement ensures the v1 client.
            (true, false) => HealthApi::V1,
            (true, true) if kubelet.is_some_and(|v| v.minor_version() >= (1, 37)) => HealthApi::V1,
            (true, true) => HealthApi::V1alpha1,
        };
        // A stream on the other version decides the check at once.
        let (expected, other) = (api.watch(), api.other().watch());
        calls
            .wait_for(
                format!("a health stream on {api} (one on {} fails the spec)", api.other()),
                move |log| log.count(expected.clone()) > 0 || log.count(other.clone()) > 0,
                WATCH_TIMEOUT,
            )
            .await?;
        let watch = evidence::check_watch(&calls.log(), api)?;
        tracing::info!(%api, ?kubelet, "kubelet gRPC evidence on node {node}: {watch}");

        let status_name = format!(
            "claim:{}",
            running
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.resources.as_ref())
                .and_then(|r| r.claims.as_ref())
                .and_then(|c| c.first())
                .map(|c| c.name.clone())
                .context("the pod's container uses no claim")?
        );
        Ok(HealthFixture { driver, b, pod: running, node, pool, device, status_name, api })
    }

    /// Reports `health` with `message` for the device.
    fn set(&self, health: Health, message: &str) {
        tracing::info!(pool = %self.pool, device = %self.device, ?health, message, "setting device health");
        self.driver.health(&self.node).set(&self.pool, &self.device, health, message);
    }

    /// Waits until the pod status shows a health and message for the device for which `done`
    /// holds; returns them.
    async fn wait(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&str, Option<&str>) -> bool,
    ) -> anyhow::Result<(String, Option<String>)> {
        let (status_name, driver) = (self.status_name.clone(), self.driver.name().to_owned());
        let what = format!("to show {what} for device {}/{} under {status_name}", self.pool, self.device);
        let pod = self
            .b
            .wait_pod(&self.pod, &what, timeout, |p| {
                Verdict::done_if(
                    device_health(p, &status_name, &driver).is_some_and(|(h, m)| done(&h, m.as_deref())),
                )
            })
            .await?;
        device_health(&pod, &self.status_name, self.driver.name()).context("the device's health disappeared")
    }

    /// Checks again that the kubelet watched only the expected health API, and that the plugin's
    /// last report on that stream is `health` with `message`. Returns a summary.
    fn check_stream(&self, health: Health, message: &str) -> anyhow::Result<String> {
        let log = self.driver.try_calls(&self.node)?.log();
        let watch = evidence::check_watch(&log, self.api)?;
        let method = self.api.watch();
        let want = match health {
            Health::Unknown => 0,
            Health::Healthy => 1,
            Health::Unhealthy => 2,
        };
        let got = last_report(&log, &method, &self.pool, &self.device);
        anyhow::ensure!(
            got.as_ref().is_some_and(|(h, m)| *h == want && m == message),
            "the last report on {method} for {}/{} is {got:?}, expected health {want} with message {message:?}\ncall log:\n{log}",
            self.pool,
            self.device
        );
        let streams = log.matching(method.clone());
        let sent: u64 = streams.iter().map(|r| r.responses).sum();
        Ok(format!("{watch}; {sent} reports sent on {} stream(s)", streams.len()))
    }
}

/// health.go: Healthy -> Unhealthy -> Healthy, each visible in the pod status.
async fn reflect_health(ctx: Ctx, health_v1: bool, health_v1alpha1: bool) -> SpecResult {
    // The v1 health client came with 1.37: the v1-only spec's `KubeletMinVersion:1.37`.
    let config = DriverConfig::kubelet(resources::node_local(1)).health_versions(health_v1, health_v1alpha1);
    let f = HealthFixture::start(&ctx, config, None).await?;

    // A baseline: without a report the kubelet shows the device as Unknown.
    for (health, text) in
        [(Health::Healthy, "Healthy"), (Health::Unhealthy, "Unhealthy"), (Health::Healthy, "Healthy")]
    {
        f.set(health, "");
        f.wait(&format!("health {text}"), HEALTH_TIMEOUT, |h, _| h == text).await?;
    }
    let summary = f.check_stream(Health::Healthy, "")?;
    tracing::info!("kubelet gRPC evidence on node {}: {summary}", f.node);
    Ok(())
}

/// dra.go: health and message changes, including a message change without a health change.
async fn custom_messages(ctx: Ctx) -> SpecResult {
    let config = DriverConfig::kubelet(resources::network(10, false));
    let f = HealthFixture::start(&ctx, config, Some("health-test-claim")).await?;

    let steps = [
        (Health::Healthy, "Healthy", "Device operating normally, temperature: 45°C"),
        (Health::Unhealthy, "Unhealthy", "ECC error count exceeded threshold (15 errors in last hour)"),
        // Only the message changes.
        (Health::Unhealthy, "Unhealthy", "Critical: Memory corruption detected"),
        (Health::Healthy, "Healthy", "Recovered after reset, all diagnostics passed"),
    ];
    for (health, text, message) in steps {
        f.set(health, message);
        f.wait(&format!("health {text} with message {message:?}"), MESSAGE_TIMEOUT, |h, m| {
            h == text && m == Some(message)
        })
        .await?;
    }
    let summary = f.check_stream(Health::Healthy, "Recovered after reset, all diagnostics passed")?;
    tracing::info!("kubelet gRPC evidence on node {}: {summary}", f.node);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "p" },
            "status": { "containerStatuses": statuses },
        }))
        .unwrap_or_default()
    }

    #[test]
    fn reads_the_drivers_device_health_from_the_pod_status() {
        let p = pod(json!([{
            "name": "with-resource", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "allocatedResourcesStatus": [
                { "name": "claim:other", "resources": [{ "resourceID": "d.k8s.io/test=x", "health": "Unhealthy" }] },
                { "name": "claim:resource-claim", "resources": [
                    { "resourceID": "other.k8s.io/test=y", "health": "Unhealthy" },
                    { "resourceID": "d.k8s.io/test=claim-1-my-request", "health": "Healthy", "message": "ok" },
                ] },
            ],
        }]));
        assert_eq!(
            device_health(&p, "claim:resource-claim", "d.k8s.io"),
            Some(("Healthy".to_owned(), Some("ok".to_owned())))
        );
        assert_eq!(device_health(&p, "claim:resource-claim", "e.k8s.io"), None);
        let bare = pod(
            json!([{ "name": "with-resource", "image": "i", "imageID": "", "ready": true, "restartCount": 0 }]),
        );
        assert_eq!(device_health(&bare, "claim:resource-claim", "d.k8s.io"), None);
    }
}
