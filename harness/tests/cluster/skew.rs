//! Version skew: the in-process plugin behind the proxy on a node whose kubelet is older than the
//! control plane. Runs in the skew lane of `cargo xtask test` (the cluster restarted with
//! `--kubelet-version v1.34.4`), or by hand:
//!
//! ```text
//! cargo xtask cluster up --provider local --kubelet-version v1.34.4
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored skew::
//! ```
//!
//! It fails (never passes vacuously) on a cluster without an older kubelet. On that node the old
//! kubelet must register the plugin, prepare and unprepare a claim, and do so through the DRA API
//! version its own rules choose, read from the call log: kubelets since v1.34 know `v1.DRAPlugin`
//! and `v1beta1.DRAPlugin` and take the first service the plugin advertises that they know
//! (pkg/kubelet/cm/dra/plugin, `validateSupportedServices`, the same in v1.34.4 and v1.37.2);
//! v1.32 and v1.33 know only v1beta1. Device health: kubelets before v1.37 speak only
//! `v1alpha1.DRAResourceHealth`.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use harness::{
    builder::Builder,
    calls::{DraApi, HealthApi, Method},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, KubeVersion, SpecResult},
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};
use serde_json::json;

use crate::run::run_one_spec;

/// The `DRAPlugin` versions a kubelet knows, newest first.
fn kubelet_dra_apis(kubelet: KubeVersion) -> &'static [DraApi] {
    if kubelet.minor_version() >= (1, 34) { &[DraApi::V1, DraApi::V1beta1] } else { &[DraApi::V1beta1] }
}

/// The version a kubelet chooses: the first one the plugin advertises that it knows.
fn chosen_dra_api(kubelet: KubeVersion, advertised: &[DraApi]) -> Option<DraApi> {
    advertised.iter().copied().find(|api| kubelet_dra_apis(kubelet).contains(api))
}

/// The health version a kubelet calls when the plugin advertises both.
fn chosen_health_api(kubelet: KubeVersion) -> HealthApi {
    if kubelet.minor_version() >= (1, 37) { HealthApi::V1 } else { HealthApi::V1alpha1 }
}

#[test]
fn the_kubelet_rules_choose_as_its_sources_say() {
    let v = |text| KubeVersion::parse(text).unwrap();
    let both = [DraApi::V1, DraApi::V1beta1];
    assert_eq!(chosen_dra_api(v("v1.34.4"), &both), Some(DraApi::V1));
    assert_eq!(chosen_dra_api(v("v1.34.4"), &[DraApi::V1beta1]), Some(DraApi::V1beta1));
    assert_eq!(chosen_dra_api(v("v1.33.5"), &both), Some(DraApi::V1beta1));
    assert_eq!(chosen_dra_api(v("v1.33.5"), &[DraApi::V1]), None);
    assert_eq!(chosen_health_api(v("v1.36.3")), HealthApi::V1alpha1);
    assert_eq!(chosen_health_api(v("v1.37.2")), HealthApi::V1);
}

/// The schedulable nodes whose kubelet is older than the API server, with their versions.
async fn old_nodes(ctx: &Ctx) -> Vec<(String, KubeVersion)> {
    let server = ctx.cluster().server().unwrap();
    let list = Api::<Node>::all(ctx.client().clone()).list(&ListParams::default()).await.unwrap();
    let usable = Nodes::choose(&list.items, 1, list.items.len(), 0).unwrap();
    usable
        .objects()
        .iter()
        .filter_map(|node| {
            let reported = &node.status.as_ref()?.node_info.as_ref()?.kubelet_version;
            let version = KubeVersion::parse(reported)?;
            (version.minor_version() < server.minor_version())
                .then(|| (node.metadata.name.clone().unwrap_or_default(), version))
        })
        .collect()
}

/// One driver on `node` advertising `advertised`; a pod with a claim runs and is deleted; the
/// call log shows which version prepared and unprepared it.
async fn prepare_through(ctx: &Ctx, node: &str, kubelet: KubeVersion, advertised: &[DraApi]) -> SpecResult {
    let expected = chosen_dra_api(kubelet, advertised).unwrap();
    let nodes = Nodes::from_names(vec![node.to_string()], vec![]);
    let config = DriverConfig::kubelet(resources::node_local(1))
        .name_suffix(if advertised.len() == 1 { "-one" } else { "" })
        .dra_versions(advertised.contains(&DraApi::V1), advertised.contains(&DraApi::V1beta1));
    let driver = Driver::start(ctx, &nodes, config).await?;
    assert!(driver.is_registered(node), "kubelet {kubelet} on {node} did not register the plugin");

    let b = Builder::start(ctx, &driver, Some(json!({"x": "y"}))).await?;
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    let log = driver.calls(node).log();
    assert_eq!(
        log.count(expected.prepare().succeeded()),
        1,
        "kubelet {kubelet} advertised {advertised:?}: {log}"
    );
    assert_eq!(
        log.count(expected.other().prepare()),
        0,
        "kubelet {kubelet} advertised {advertised:?}: {log}"
    );

    b.delete_pod_and_wait(&running).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = driver.calls(node).log();
        if log.count(expected.unprepare().succeeded()) >= 1 {
            assert_eq!(log.count(expected.other().unprepare()), 0, "{log}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubelet {kubelet} did not call {} NodeUnprepareResources within 60s of the pod's deletion: {log}",
            expected.service()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The health stream: the version this kubelet speaks (the plugin serves both).
    let health = chosen_health_api(kubelet);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = driver.calls(node).log();
        if log.count(health.watch()) >= 1 {
            assert_eq!(log.count(health.other().watch()), 0, "{log}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubelet {kubelet} did not call {} NodeWatchResources within 60s: {log}",
            health.service()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(driver.calls(node).count(Method::GetInfo) >= 1);
    Ok(())
}

async fn old_kubelet_body(ctx: Ctx) -> SpecResult {
    let old = old_nodes(&ctx).await;
    assert!(
        !old.is_empty(),
        "no schedulable node runs a kubelet older than the API server {}: this test needs the skew lane's cluster (`cargo xtask cluster up --provider local --kubelet-version v1.34.4`)",
        ctx.cluster().server_version
    );
    let (node, kubelet) = old[0].clone();
    prepare_through(&ctx, &node, kubelet, &[DraApi::V1, DraApi::V1beta1]).await?;
    prepare_through(&ctx, &node, kubelet, &[DraApi::V1beta1]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the skew lane's cluster: run via cargo xtask test"]
async fn an_old_kubelet_prepares_through_the_proxy_with_the_api_version_it_chooses() {
    run_one_spec("[skew]", "old kubelet", old_kubelet_body).await;
}
