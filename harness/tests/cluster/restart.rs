//! A kubelet restart under the in-process plugin: the restarted kubelet registers the plugin
//! again (through the same proxy pod's registration socket, as a kubelet reconnects to a plugin
//! that kept running, kubernetes#131770), keeps the claim its running pod holds as its checkpoint
//! says (no second NodePrepareResources), unprepares it once when the pod goes, and prepares a
//! new pod's claim. Runs in `cargo xtask test`, which restarts the kubelet through
//! `DRA_E2E_RESTART_KUBELET` (a command with `{node}` in it, `cargo xtask cluster restart
//! kubelet-{node}` on the local cluster), or by hand:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//! DRA_E2E_RESTART_KUBELET="cargo xtask cluster restart kubelet-{node}" \
//!     cargo test -p harness --test cluster -- --ignored restart::
//! ```
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use harness::{
    builder::Builder,
    calls::Method,
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, SpecResult},
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};
use serde_json::json;

use crate::run::run_one_spec;

/// How long the restarted kubelet gets to register the plugin again, and to unprepare a claim.
const KUBELET_WAIT: Duration = Duration::from_secs(90);

/// Runs `DRA_E2E_RESTART_KUBELET` for `node` and waits until it returns.
async fn restart_kubelet(node: &str) -> Result<(), String> {
    let template = std::env::var("DRA_E2E_RESTART_KUBELET").map_err(|_| {
        "DRA_E2E_RESTART_KUBELET is not set: give the command that restarts a node's kubelet, with {node} for the node (`cargo xtask cluster restart kubelet-{node}` on the local cluster)".to_owned()
    })?;
    let command = template.replace("{node}", node);
    // `cargo xtask …` from here must not see the variables cargo set for this test.
    let mut restart = tokio::process::Command::new("sh");
    for name in crate::cargo_env::test_only_vars() {
        restart.env_remove(name);
    }
    let status =
        restart.args(["-c", &command]).status().await.map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !status.success() {
        return Err(format!("{command:?} failed ({status})"));
    }
    Ok(())
}

/// The UID of the pod's one claim.
async fn claim_uid(b: &Builder, pod: &k8s_openapi::api::core::v1::Pod) -> anyhow::Result<String> {
    let claims = b.pod_claims(pod).await?;
    let claim = claims.values().next().ok_or_else(|| anyhow::anyhow!("the pod has no claim"))?;
    claim.metadata.uid.clone().ok_or_else(|| anyhow::anyhow!("the claim has no UID"))
}

async fn body(ctx: Ctx) -> SpecResult {
    let list = Api::<Node>::all(ctx.client().clone()).list(&ListParams::default()).await?;
    let nodes = Nodes::choose(&list.items, 1, 1, 0)?;
    let node = nodes.names()[0].clone();
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(2))).await?;
    let calls = driver.calls(&node).clone();
    assert!(driver.is_registered(&node), "kubelet on {node} did not register the plugin: {}", calls.log());
    let registrations = calls.count(Method::GetInfo);

    // A pod that runs across the restart.
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let before = b.test_pod(&pod, &[("admin_x", "y")]).await?;
    let prepared = calls.log().count(Method::NodePrepareResources.succeeded());
    assert_eq!(prepared, 1, "{}", calls.log());

    restart_kubelet(&node).await.map_err(anyhow::Error::msg)?;
    let log = calls
        .wait_for(
            format!("the restarted kubelet on {node} to register the plugin again (GetInfo, then NotifyRegistrationStatus)"),
            move |log| {
                log.count(Method::GetInfo) > registrations
                    && log.count(Method::NotifyRegistrationStatus) > registrations
            },
            KUBELET_WAIT,
        )
        .await?;
    assert!(driver.is_registered(&node), "the restarted kubelet did not accept the plugin: {log}");

    // Still running, its claim as the checkpoint left it: nothing prepared again.
    let after = b.test_pod(&before, &[("admin_x", "y")]).await?;
    assert_eq!(after.metadata.uid, before.metadata.uid);
    let uid = claim_uid(&b, &after).await?;
    let history = calls.claim(&uid);
    assert_eq!(
        history.prepared(),
        1,
        "the restarted kubelet prepared the running pod's claim again: {}",
        calls.log()
    );
    assert_eq!(
        history.unprepared(),
        0,
        "the restarted kubelet unprepared a running pod's claim: {}",
        calls.log()
    );

    // The restarted kubelet unprepares it once when the pod goes.
    b.delete_pod_and_wait(&after).await?;
    let history = calls.wait_unprepared(&uid, KUBELET_WAIT).await?;
    assert_eq!(history.unprepared(), 1, "{}", calls.log());
    assert_eq!(history.prepared(), 1, "{}", calls.log());

    // And serves a new pod through the plugin it registered again.
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let second = b.test_pod(&pod, &[("admin_x", "y")]).await?;
    let second_uid = claim_uid(&b, &second).await?;
    assert_eq!(calls.claim(&second_uid).prepared(), 1, "{}", calls.log());
    b.delete_pod_and_wait(&second).await?;
    calls.wait_unprepared(&second_uid, KUBELET_WAIT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts a node's kubelet: run via cargo xtask test"]
async fn a_restarted_kubelet_registers_the_plugin_again_and_keeps_its_claims() {
    run_one_spec("[restart]", "kubelet restart", body).await;
}
