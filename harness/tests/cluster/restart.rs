//! A kubelet restart under the in-process plugin: the restarted kubelet registers the plugin
//! again (through the same proxy pod's registration socket, as a kubelet reconnects to a plugin
//! that kept running, kubernetes#131770), keeps the claim its running pod holds as its checkpoint
//! says (no second NodePrepareResources), unprepares it once when the pod goes, and prepares a
//! new pod's claim. Also restarted: while an exec stream runs through it (the stream ends with an
//! error, and commands run during the restart succeed), while it registers a plugin (it registers
//! the plugin again), and while a claim's NodePrepareResources is held (the claim is prepared
//! once, the pod runs with its devices, the claim is unprepared once). The node is the last
//! usable one (kind-worker3 on the local cluster). Runs in `cargo xtask test`, which restarts the kubelet through
//! `DRA_E2E_RESTART_KUBELET` (a command with `{node}` in it, `cargo xtask cluster restart
//! kubelet-{node}` on the local cluster), or by hand:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//! DRA_E2E_RESTART_KUBELET="cargo xtask cluster restart kubelet-{node}" \
//!     cargo test -p harness --test cluster -- --ignored restart::
//! ```
#![allow(clippy::unwrap_used)]

use std::{sync::Arc, time::Duration};

use harness::{
    builder::Builder,
    calls::{Calls, Method},
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, SpecResult},
    plugin::{ClaimState, HealthState, MemoryClaims, PluginConfig},
    podexec::{PodExec, PodExecError, Runner as _},
    proxied::{ProxiedPlugin, ProxiedPluginSpec, ProxyPorts},
    tunnel::{PodRef, tunnel_client},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{ListParams, PostParams},
    runtime::{conditions, wait::await_condition},
};
use serde_json::json;

use crate::run::run_one_spec;
use crate::tunnel::{TestNamespace, config_and_client, proxy_pod_on};

/// How long the restarted kubelet gets to register the plugin again, and to unprepare a claim.
const KUBELET_WAIT: Duration = Duration::from_secs(90);

/// Held by each test here for as long as it runs: they restart the same kubelet, and a test
/// binary runs its tests at the same time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// The last usable node by name (kind-worker3 on the local cluster): a restart there disturbs the
/// fewest other runs, whose single-node specs take the first worker.
fn last_usable_node(all: &[Node]) -> anyhow::Result<String> {
    let usable = Nodes::choose(all, 1, all.len(), 0)?;
    usable.names().last().cloned().ok_or_else(|| anyhow::anyhow!("no usable node"))
}

async fn body(ctx: Ctx) -> SpecResult {
    let list = Api::<Node>::all(ctx.client().clone()).list(&ListParams::default()).await?;
    let node = last_usable_node(&list.items)?;
    let nodes = Nodes::from_names(vec![node.clone()], Vec::new());
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
    let _alone = ONE_AT_A_TIME.lock().await;
    run_one_spec("[restart]", "kubelet restart", body).await;
}

/// A pod on `node` that sleeps, in the spec's namespace; its reference for exec, once it runs.
async fn sleeper_on(ctx: &Ctx, node: &str) -> anyhow::Result<PodRef> {
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sleeper"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "sleeper",
                "image": "registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    tokio::time::timeout(
        KUBELET_WAIT,
        await_condition(pods.clone(), "sleeper", conditions::is_pod_running()),
    )
    .await
    .map_err(|_| anyhow::anyhow!("pod sleeper did not run within {KUBELET_WAIT:?}"))??;
    Ok(PodRef::from_pod(&pods.get("sleeper").await?)?)
}

async fn exec_body(ctx: Ctx) -> SpecResult {
    let list = Api::<Node>::all(ctx.client().clone()).list(&ListParams::default()).await?;
    let node = last_usable_node(&list.items)?;
    let exec = PodExec::new(ctx.stream_client().clone(), sleeper_on(&ctx, &node).await?);

    // A command that runs until its stream ends, printing all along.
    let (ticked, mut ticks) = tokio::sync::watch::channel(0u64);
    let on_line = move |_: &str| {
        ticked.send_modify(|n| *n += 1);
        false
    };
    let argv = ["sh", "-c", "while true; do echo tick; sleep 0.2; done"].map(String::from).to_vec();
    let exec_in_task = exec.clone();
    let stream = tokio::spawn(async move { exec_in_task.run_logged(argv, "ticks", &on_line).await });
    tokio::time::timeout(KUBELET_WAIT, ticks.wait_for(|n| *n >= 3)).await??;

    // Commands keep succeeding while the kubelet restarts: a broken or refused stream runs again.
    let restart = tokio::spawn({
        let node = node.clone();
        async move { restart_kubelet(&node).await }
    });
    let mut runs = 0;
    while !restart.is_finished() {
        let out = exec.checked(["sh", "-c", "echo ran"].map(String::from).to_vec()).await?;
        assert_eq!(out.stdout, "ran\n");
        runs += 1;
    }
    restart.await?.map_err(anyhow::Error::msg)?;
    println!("{runs} commands ran during the restart");

    // The long one's stream broke with the kubelet: it ended with an error instead of waiting.
    let ended = tokio::time::timeout(KUBELET_WAIT, stream)
        .await
        .map_err(|_| anyhow::anyhow!("the exec stream through the restarted kubelet did not end"))??;
    assert!(matches!(ended, Err(PodExecError::Stream { .. })), "{ended:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts a node's kubelet: run via cargo xtask test"]
async fn an_exec_stream_a_kubelet_restart_breaks_ends_and_commands_run_again() {
    let _alone = ONE_AT_A_TIME.lock().await;
    run_one_spec("[restart]", "exec across a kubelet restart", exec_body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts a node's kubelet: run via cargo xtask test"]
async fn a_kubelet_restarted_while_it_registers_a_plugin_registers_it_again() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (config, admin) = config_and_client().await;
    let client = tunnel_client(&config).unwrap();
    let list = Api::<Node>::all(admin.clone()).list(&ListParams::default()).await.unwrap();
    let node = last_usable_node(&list.items).unwrap();
    let ns = TestNamespace::create(&admin, "dra-restart-registering").await;
    let driver = ns.driver();
    let pod = proxy_pod_on(&admin, &ns, &driver, &node).await;
    let calls = Calls::new();
    // The kubelet gets the plugin's info; its NotifyRegistrationStatus is held.
    let held = calls.block(Method::NotifyRegistrationStatus);
    let proxied = ProxiedPlugin::start(ProxiedPluginSpec {
        client,
        pod,
        plugin: PluginConfig::new(&driver, &node, "/cdi"),
        claims: Arc::new(MemoryClaims::new()),
        calls: calls.clone(),
        health: HealthState::new(),
        claim_state: ClaimState::default(),
        forward: None,
        ports: ProxyPorts::default(),
    })
    .await
    .unwrap();
    calls
        .wait_for(
            format!("the kubelet of {node} to register the plugin (its NotifyRegistrationStatus held)"),
            |log| log.count(Method::NotifyRegistrationStatus.blocked()) >= 1,
            KUBELET_WAIT,
        )
        .await
        .unwrap();

    restart_kubelet(&node).await.unwrap();
    held.release();
    // The held call went with the old kubelet; the restarted one registers the plugin anew.
    let log = calls
        .wait_for(
            format!("the restarted kubelet of {node} to register the plugin"),
            |log| log.count(Method::NotifyRegistrationStatus.succeeded()) >= 1,
            KUBELET_WAIT,
        )
        .await
        .unwrap();
    println!("calls of the kubelet across its restart:\n{log}");
    // Each kubelet got the plugin's info.
    assert!(log.count(Method::GetInfo.succeeded()) >= 2, "{log}");
    proxied.plugin().wait_registered(KUBELET_WAIT).await.unwrap();
    proxied.stop_checked().await.unwrap();
}

async fn prepare_body(ctx: Ctx) -> SpecResult {
    let list = Api::<Node>::all(ctx.client().clone()).list(&ListParams::default()).await?;
    let node = last_usable_node(&list.items)?;
    let nodes = Nodes::from_names(vec![node.clone()], Vec::new());
    let driver = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(2))).await?;
    let calls = driver.calls(&node).clone();

    // The kubelet starts preparing the pod's claim; the call is held.
    let held = calls.block(Method::NodePrepareResources);
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    calls
        .wait_for(
            format!("the kubelet of {node} to call NodePrepareResources (held)"),
            |log| log.count(Method::NodePrepareResources.blocked()) >= 1,
            KUBELET_WAIT,
        )
        .await?;

    restart_kubelet(&node).await.map_err(anyhow::Error::msg)?;
    held.release();

    // The restarted kubelet registers the plugin again and prepares the claim once it may: the
    // pod runs with its devices.
    let running = b.test_pod(&pod, &[("admin_x", "y")]).await?;
    let uid = claim_uid(&b, &running).await?;
    let history = calls.log().claim(&uid);
    assert_eq!(history.prepared(), 1, "the claim was not prepared exactly once: {}", calls.log());
    assert_eq!(history.unprepared(), 0, "{}", calls.log());

    // Unprepared once when the pod goes.
    b.delete_pod_and_wait(&running).await?;
    let history = calls.wait_unprepared(&uid, KUBELET_WAIT).await?;
    assert_eq!((history.prepared(), history.unprepared()), (1, 1), "{}", calls.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts a node's kubelet: run via cargo xtask test"]
async fn a_kubelet_restarted_while_it_prepares_a_claim_prepares_it_once_and_runs_the_pod() {
    let _alone = ONE_AT_A_TIME.lock().await;
    run_one_spec("[restart]", "kubelet restart during NodePrepareResources", prepare_body).await;
}
