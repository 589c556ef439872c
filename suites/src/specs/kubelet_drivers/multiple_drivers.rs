//! Upstream's `multipleDrivers` (`kubelet ... with multiple drivers`): two drivers on the same
//! nodes, each with two devices per node and two external claims, one pod using all four claims
//! (its container uses only the first). Variants serve only `v1beta1.DRAPlugin`, only
//! `v1.DRAPlugin`, or both.
//!
//! Upstream checks only that the pod runs. Here the call logs show what the kubelet did: it
//! registered each plugin with the first advertised version it supports (so `v1` whenever it is
//! served), prepared exactly each driver's own two claims through that version's
//! `NodePrepareResources`, and after the pod is deleted unprepared them through the same version's
//! `NodeUnprepareResources`, never touching the other version.

use anyhow::Context as _;
use harness::{
    builder::{Builder, node_name},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    grpc::{health_v1, health_v1alpha1},
};
use k8s_openapi::api::core::v1::PodResourceClaim;
use kube::ResourceExt as _;

use super::evidence::{self, ClaimKey, DraApi};

/// Registers the specs (inside `kubelet [Feature:DynamicResourceAllocation]`).
pub fn register(r: &mut Registry) {
    r.context("with multiple drivers", |r| {
        r.context("using only drapbv1beta1", |r| {
            r.it("work", |ctx| work(ctx, true, false));
        });
        // Without v1beta1, a kubelet from 1.34 (when v1 was introduced) is needed.
        r.context_with_labels("using only drapbv1", ["KubeletMinVersion:1.34"], |r| {
            r.it("work", |ctx| work(ctx, false, true));
        });
        r.context("using drapbv1beta1 and drapbv1", |r| {
            r.it("work", |ctx| work(ctx, true, true));
        });
    });
}

async fn work(ctx: Ctx, v1beta1: bool, v1: bool) -> SpecResult {
    if !v1beta1 {
        ctx.cluster().require_kubelet_version(1, 34)?;
    }
    // The kubelet takes the first entry of supported_versions that it knows; the plugin lists
    // v1 before v1beta1, as upstream's helper does.
    let api = if v1 { DraApi::V1 } else { DraApi::V1beta1 };
    let advertised: Vec<&str> = [(v1, DraApi::V1.registration()), (v1beta1, DraApi::V1beta1.registration())]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .chain([health_v1::SERVICE_VERSION, health_v1alpha1::SERVICE_VERSION])
        .collect();

    let nodes = Nodes::select(&ctx, 1, 4).await?;
    let config = |suffix: &str| {
        DriverConfig::kubelet(resources::node_local(2)).name_suffix(suffix).dra_versions(v1, v1beta1)
    };
    let (driver1, driver2) = futures::try_join!(
        Driver::start(&ctx, &nodes, config("")),
        Driver::start(&ctx, &nodes, config("-other")),
    )?;
    let b1 = Builder::start(&ctx, &driver1, None).await?;
    let b2 = Builder::start(&ctx, &driver2, None).await?;

    let claim1 = b1.external_claim();
    let claim1b = b1.external_claim();
    let claim2 = b2.external_claim();
    let claim2b = b2.external_claim();
    let mut pod = b1.pod_external(&claim1.name_any());
    if let Some(spec) = pod.spec.as_mut() {
        let claims = spec.resource_claims.get_or_insert_default();
        for (i, claim) in [&claim1b, &claim2, &claim2b].into_iter().enumerate() {
            claims.push(PodResourceClaim {
                name: format!("claim{}", i + 1),
                resource_claim_name: Some(claim.name_any()),
                ..Default::default()
            });
        }
    }
    let mut keys1 = Vec::new();
    for claim in [&claim1, &claim1b] {
        keys1.push(ClaimKey::of(&b1.create_claim(claim).await?)?);
    }
    let mut keys2 = Vec::new();
    for claim in [&claim2, &claim2b] {
        keys2.push(ClaimKey::of(&b2.create_claim(claim).await?)?);
    }
    b1.create_pod(&pod).await?;
    let running = b1.test_pod(&pod, &[]).await?;
    // Only the claim the container uses reaches it; the pod's other claims are prepared but
    // give the container nothing.
    let first = format!("claim_{}_my_request", claim1.name_any().replace('-', "_"));
    b1.expect_env_exact(
        &running,
        harness::builder::CLAIM_CONTAINER,
        &[(first.as_str(), "true"), ("user_a", "b")],
    )
    .await?;

    let node = node_name(&running).context("the running pod has no node")?.to_owned();
    let mut evidence = Vec::new();
    for (driver, keys) in [(&driver1, &keys1), (&driver2, &keys2)] {
        let log = driver.try_calls(&node)?.log();
        evidence::check_advertised(&log, &advertised)?;
        let summary = evidence::check_prepared(&log, api, keys)
            .with_context(|| format!("driver {} on node {node}", driver.name()))?;
        evidence.push(format!("{}: {summary}", driver.name()));
    }

    b1.delete_pod_and_wait(&pod).await?;
    for (driver, keys) in [(&driver1, &keys1), (&driver2, &keys2)] {
        let summary = evidence::wait_unprepared(driver.try_calls(&node)?, api, keys)
            .await
            .with_context(|| format!("driver {} on node {node}", driver.name()))?;
        evidence.push(format!("{}: {summary}", driver.name()));
    }
    tracing::info!(?advertised, chosen = %api, "kubelet gRPC evidence:\n  {}", evidence.join("\n  "));
    Ok(())
}
