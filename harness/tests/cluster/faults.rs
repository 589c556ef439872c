//! Faults a kubelet spec must survive, against a real cluster: its proxy pod deleted (and
//! replaced by the ReplicaSet) while the kubelet prepares a claim, after it prepared one (the
//! plugin keeps its prepared claims, their CDI files and its call log) and while it unprepares
//! one, and the port-forward connections of its tunnels closed from outside. Run through `cargo xtask test`, or:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored faults::
//! ```
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::Builder,
    calls::{CallLog, Method},
    driver::{Driver, DriverConfig, Nodes, ProxyMove, resources},
    framework::{Ctx, Registry, SpecResult},
    manifests::INSTANCE_LABEL,
    plugin::ClaimId,
    tunnel::PodRef,
    wait::Attempt,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams},
};
use serde_json::json;

use crate::{
    driver::{Created, assert_nothing_left},
    run::run,
};

const T: Duration = Duration::from_secs(120);

/// Records what a kubelet driver creates, for [`assert_nothing_left`].
fn record(created: &Created, ctx: &Ctx) {
    created.add("Namespace", ctx.namespace());
    let name = format!("{}.k8s.io", ctx.namespace());
    let id = harness::driver::deployment_id(&name, "");
    created.add("Driver", name);
    for (kind, name) in [
        ("ClusterRole", format!("dra-kubelet-plugin-{id}-role")),
        ("ClusterRoleBinding", format!("dra-kubelet-plugin-{id}-role-binding")),
        ("ValidatingAdmissionPolicy", format!("resourceslices-policy-dra-kubelet-plugin-{id}")),
        ("ValidatingAdmissionPolicyBinding", format!("resourceslices-policy-dra-kubelet-plugin-{id}")),
    ] {
        created.add(kind, name);
    }
}

/// Whether the log has a successful registration notification from call `from` on.
fn registered_since(log: &CallLog, from: u64) -> bool {
    log.matching(Method::NotifyRegistrationStatus).iter().any(|r| {
        r.id >= from
            && r.succeeded()
            && r.request.as_ref().is_some_and(|req| {
                ["plugin_registered", "pluginRegistered"]
                    .iter()
                    .any(|k| req.get(k).and_then(serde_json::Value::as_bool) == Some(true))
            })
    })
}

async fn proxy_pod_deleted_body(ctx: Ctx, created: Created) -> SpecResult {
    record(&created, &ctx);
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let driver =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1)).own_proxy_pods(true))
            .await?;
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let calls = driver.calls(&node).clone();
    let lost = driver.proxy_pod(&node).unwrap();

    // The kubelet prepares, and the call is held.
    let block = calls.block(Method::NodePrepareResources);
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    calls
        .wait_for(
            "a blocked NodePrepareResources",
            |log| log.count(Method::NodePrepareResources.blocked()) > 0,
            T,
        )
        .await?;

    // The proxy pod goes; the ReplicaSet makes a new one, and the plugin moves to it.
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    pods.delete(&lost.name_any(), &DeleteParams::default()).await?;
    harness::wait::poll(
        "the plugin to move to a replacement proxy pod",
        T,
        Duration::from_millis(200),
        || {
            let moves = driver.proxy_moves(&node);
            async move {
                match moves.first() {
                    Some(_) => harness::wait::Attempt::Done(()),
                    None => harness::wait::Attempt::Retry("no move yet".to_owned()),
                }
            }
        },
    )
    .await?;
    let moved = driver.proxy_moves(&node)[0].clone();
    tracing::info!("{moved}");
    assert_eq!(moved.from, format!("{}/{}", ctx.namespace(), lost.name_any()));
    let replacement = driver.proxy_pod(&node).unwrap();
    assert_ne!(replacement.uid(), lost.uid());
    assert_eq!(moved.to, format!("{}/{}", ctx.namespace(), replacement.name_any()));
    let first = moved.first_call;
    calls
        .wait_for("registration through the replacement", move |log| registered_since(log, first), T)
        .await?;

    // Let the kubelet prepare again: the pod runs with its claim, prepared through the new pod.
    block.release();
    let running = b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    let log = calls.log();
    let after: Vec<_> = log
        .matching(Method::NodePrepareResources)
        .into_iter()
        .filter(|r| r.id >= first && r.succeeded())
        .map(|r| r.id)
        .collect();
    assert!(!after.is_empty(), "no successful prepare after the move ({moved}):\n{log}");
    assert_eq!(driver.prepared_claims(&node).len(), 1, "{log}");
    let container = running.spec.as_ref().unwrap().containers[0].name.clone();
    let claim = harness::builder::pod_claim_names(&running).into_values().next().flatten().unwrap();
    let claim_var = harness::plugin::claim_env_name(&claim, "my-request");
    b.expect_env_exact(
        &running,
        &container,
        &[("admin_x", "y"), ("user_a", "b"), (claim_var.as_str(), "true")],
    )
    .await?;

    // Only the replacement is left of the proxy pods.
    harness::wait::gone(&pods, &lost.name_any(), format!("lost proxy pod {}", lost.name_any()), T).await?;
    let proxies =
        pods.list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={}", driver.name()))).await?;
    let names: Vec<String> = proxies.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(names, [replacement.name_any()]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_deleted_proxy_pod_is_replaced_while_the_kubelet_prepares() {
    let created = Created::default();
    let c = created.clone();
    let mut reg = Registry::new();
    reg.describe("[faults]", |r| {
        r.it("proxy pod deleted", move |ctx: Ctx| proxy_pod_deleted_body(ctx, c.clone()));
    });
    let (report, output, client) = run(reg).await;
    assert_eq!(report.failed(), 0, "{output}");
    assert_eq!(report.passed(), 1, "{output}");
    assert_nothing_left(&client, &created).await;
}

/// The local ports of this process's TCP connections to `api` (`host:port`), from `ss -tnp`.
fn own_connections(api: &str) -> Vec<String> {
    let out = std::process::Command::new("ss").args(["-Htnp", "state", "established"]).output().unwrap();
    assert!(out.status.success(), "ss: {}", String::from_utf8_lossy(&out.stderr));
    let pid = format!("pid={},", std::process::id());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&pid))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // Recv-Q Send-Q Local Peer Process
            (cols.len() >= 4 && cols[3] == api).then(|| cols[2].to_owned())
        })
        .collect()
}

/// Closes this process's connections to the API server from outside (`ss -K`, as root): the
/// tunnels' port-forwards, the exec streams of the proxy processes and the clients' pooled
/// connections alike. Returns how many it closed.
fn kill_own_connections(api: &str) -> usize {
    let local = own_connections(api);
    for addr in &local {
        let (host, port) = addr.rsplit_once(':').unwrap();
        let (dhost, dport) = api.rsplit_once(':').unwrap();
        let filter = format!("src {host} and sport = :{port} and dst {dhost} and dport = :{dport}");
        let out = std::process::Command::new("ss").args(["-K", "-tn"]).arg(filter).output().unwrap();
        assert!(out.status.success(), "ss -K: {}", String::from_utf8_lossy(&out.stderr));
    }
    local.len()
}

async fn dropped_connections_body(ctx: Ctx, created: Created, api: String) -> SpecResult {
    record(&created, &ctx);
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let driver =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(2)).own_proxy_pods(true))
            .await?;
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let calls = driver.calls(&node).clone();

    let (first, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&first).await?;
    b.test_pod(&first, &[("admin_x", "y"), ("user_a", "b")]).await?;

    // Every connection of this process to the API server is closed under its feet.
    let closed = kill_own_connections(&api);
    assert!(closed >= 4, "expected the tunnels' connections among ours, closed {closed}");
    tracing::info!(closed, "closed this process's connections to the API server");
    let before = calls.count(Method::NodePrepareResources);
    // The client's pooled connections were closed too, and a request sent before the client
    // noticed fails ("error writing a body to connection"): the spec is about the tunnels, so
    // the first request after the kill is a GET that may meet such a connection and is retried.
    let client = ctx.client().clone();
    harness::wait::poll("the API server to answer this process again", T, Duration::from_millis(100), || {
        let client = client.clone();
        async move {
            match client.apiserver_version().await {
                Ok(_) => harness::wait::Attempt::Done(()),
                Err(e) => harness::wait::Attempt::Retry(format!("{e}")),
            }
        }
    })
    .await?;

    // The kubelet reaches the plugin again: a second pod is prepared and the first unprepared.
    let (second, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&second).await?;
    b.test_pod(&second, &[("admin_x", "y"), ("user_a", "b")]).await?;
    let log = calls.log();
    assert!(log.count(Method::NodePrepareResources.succeeded()) > before.min(1), "{log}");
    b.delete_pod_and_wait(&first).await?;
    calls
        .wait_for(
            "an unprepare after the connections were closed",
            |log| log.count(Method::NodeUnprepareResources.succeeded()) >= 1,
            T,
        )
        .await?;
    assert!(driver.proxy_moves(&node).is_empty(), "the pod was not lost: {:?}", driver.proxy_moves(&node));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn tunnels_and_proxies_come_back_after_their_connections_are_closed() {
    let kubeconfig = kube::config::Kubeconfig::read_from(crate::run::kubeconfig()).unwrap();
    let server = kubeconfig.clusters[0].cluster.as_ref().unwrap().server.clone().unwrap();
    let api = server.trim_start_matches("https://").trim_end_matches('/').to_owned();
    let created = Created::default();
    let c = created.clone();
    let mut reg = Registry::new();
    reg.describe("[faults]", |r| {
        r.it("connections closed", move |ctx: Ctx| dropped_connections_body(ctx, c.clone(), api.clone()));
    });
    let (report, output, client) = run(reg).await;
    assert_eq!(report.failed(), 0, "{output}");
    assert_eq!(report.passed(), 1, "{output}");
    assert_nothing_left(&client, &created).await;
}

async fn not_replaced_body(ctx: Ctx, created: Created) -> SpecResult {
    record(&created, &ctx);
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let mut config = DriverConfig::kubelet(resources::node_local(1)).own_proxy_pods(true);
    config.replacement_timeout = Duration::from_secs(10);
    Driver::start(&ctx, &nodes, config).await?;
    // Nothing replaces the pod: its ReplicaSet is scaled to zero and deletes it.
    let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(ctx.client().clone(), ctx.namespace());
    let scale = kube::api::Patch::Merge(json!({"spec": {"replicas": 0}}));
    rs.patch("dra-test-driver", &kube::api::PatchParams::default(), &scale).await?;
    // A long wait of the body: the spec must not sit it out.
    harness::wait::poll(
        "something that never happens",
        Duration::from_secs(600),
        Duration::from_secs(1),
        || async { harness::wait::Attempt::<()>::Retry("nothing".into()) },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_proxy_pod_without_replacement_fails_the_spec_at_once() {
    let created = Created::default();
    let c = created.clone();
    let mut reg = Registry::new();
    reg.describe("[faults]", |r| {
        r.it("not replaced", move |ctx: Ctx| not_replaced_body(ctx, c.clone()));
    });
    let started = std::time::Instant::now();
    let (report, output, client) = run(reg).await;
    let took = started.elapsed();
    assert_eq!(report.failed(), 1, "{output}");
    let spec = &report.specs[0];
    let harness::framework::Outcome::Failed { message, .. } = &spec.outcome else { panic!("{output}") };
    assert!(message.contains("was deleted at"), "{message}");
    assert!(message.contains("no replacement ready after 10s"), "{message}");
    // Not the spec's 5 min timeout: the loss, 10 s, the clean-up.
    assert!(spec.duration < Duration::from_secs(150), "{:?}\n{output}", spec.duration);
    assert!(took < Duration::from_secs(200), "{took:?}");
    assert_nothing_left(&client, &created).await;
}

/// The CDI spec files in `/cdi` of proxy pod `proxy` (the node's `/var/run/cdi`) that belong to
/// claim `uid`, sorted.
async fn cdi_files(ctx: &Ctx, proxy: &Pod, uid: &str) -> anyhow::Result<Vec<String>> {
    use harness::podexec::Runner as _;
    let exec = harness::podexec::PodExec::new(ctx.stream_client().clone(), PodRef::from_pod(proxy)?);
    let out = exec.checked(vec!["ls".into(), "-1".into(), "/cdi".into()]).await?;
    let mut files: Vec<String> =
        out.stdout.lines().filter(|f| f.contains(uid) && f.ends_with(".json")).map(str::to_owned).collect();
    files.sort();
    Ok(files)
}

/// Deletes the node's proxy pod at once (grace period 0, as a node drain, an eviction or a
/// crash loses it) and waits until the plugin moved to the replacement. While it moves and
/// after, the plugin still holds `claim` as prepared. Returns the move.
async fn lose_proxy_pod(
    ctx: &Ctx,
    driver: &Driver,
    node: &str,
    claim: &ClaimId,
) -> anyhow::Result<ProxyMove> {
    let lost = driver.proxy_pod(node).context("no proxy pod")?;
    let before = driver.proxy_moves(node).len();
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    pods.delete(&lost.name_any(), &DeleteParams::default().grace_period(0)).await?;
    tracing::info!(pod = %lost.name_any(), "proxy pod deleted with grace period 0");
    let claim = claim.clone();
    let polls = std::sync::atomic::AtomicUsize::new(0);
    let moved = harness::wait::poll(
        "the plugin to move to a replacement proxy pod",
        T,
        Duration::from_millis(20),
        || {
            polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let prepared = driver.prepared_claims(node);
            let moves = driver.proxy_moves(node);
            let claim = claim.clone();
            async move {
                if !prepared.contains(&claim) {
                    return Attempt::Fail(format!(
                        "the plugin forgot claim {claim:?} while moving (prepared: {prepared:?}, moves: {moves:?})"
                    ));
                }
                match moves.get(before) {
                    Some(moved) => Attempt::Done(moved.clone()),
                    None => Attempt::Retry("no move yet".to_owned()),
                }
            }
        },
    )
    .await?;
    tracing::info!(polls = polls.into_inner(), "{moved}");
    assert_eq!(moved.from, format!("{}/{}", ctx.namespace(), lost.name_any()));
    Ok(moved)
}

/// The pod's claim, prepared and held by the plugin on `node`.
fn the_prepared_claim(driver: &Driver, node: &str) -> anyhow::Result<ClaimId> {
    let prepared = driver.prepared_claims(node);
    anyhow::ensure!(prepared.len() == 1, "one prepared claim expected: {prepared:?}");
    Ok(prepared[0].clone())
}

async fn lost_after_prepare_body(ctx: Ctx, created: Created) -> SpecResult {
    record(&created, &ctx);
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let driver =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1)).own_proxy_pods(true))
            .await?;
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let calls = driver.calls(&node).clone();
    let lost = driver.proxy_pod(&node).unwrap();

    // The kubelet prepares the pod's claim; the proxy pod goes before the spec checks it.
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let prepared = |log: &CallLog| log.matching(Method::NodePrepareResources).iter().any(|r| r.succeeded());
    calls.wait_for("a successful NodePrepareResources", prepared, T).await?;
    let claim = the_prepared_claim(&driver, &node)?;
    let files = cdi_files(&ctx, &lost, &claim.uid).await?;
    assert!(!files.is_empty(), "no CDI file of claim {claim:?} in {}", lost.name_any());
    let moved = lose_proxy_pod(&ctx, &driver, &node, &claim).await?;
    calls
        .wait_for(
            "registration through the replacement",
            move |log| registered_since(log, moved.first_call),
            T,
        )
        .await?;

    // The spec's checks pass: the pod runs with its devices, the claim is prepared as the
    // kubelet asked and held by the plugin, its CDI files are still on the node.
    let running = b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    b.expect_prepared(&running).await?;
    let replacement = driver.proxy_pod(&node).unwrap();
    assert_ne!(replacement.uid(), lost.uid());
    assert_eq!(cdi_files(&ctx, &replacement, &claim.uid).await?, files);
    // One call log: the first registration, the prepare, the registration through the
    // replacement; every prepare of the claim (a repeated one too) succeeded with the same
    // devices.
    let log = calls.log();
    assert!(registered_since(&log, 0), "{log}");
    let history = calls.claim(&claim.uid);
    assert_eq!(history.prepare_failures(), 0, "{history}");
    let devices: Vec<_> = history.prepares().map(|c| c.devices.clone()).collect();
    assert!(devices.windows(2).all(|w| w[0] == w[1]), "{history}");
    assert!(history.prepares().any(|c| c.id < moved.first_call), "{history}");

    // The kubelet unprepares through the replacement: the claim and its files go.
    b.delete_pod_and_wait(&running).await?;
    let uid = claim.uid.clone();
    let unprepared = move |log: &CallLog| !log.claim(&uid).is_prepared();
    calls.wait_for("the claim unprepared", unprepared, T).await?;
    assert_eq!(driver.prepared_claims(&node), []);
    assert_eq!(cdi_files(&ctx, &replacement, &claim.uid).await?, Vec::<String>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_proxy_pod_lost_after_prepare_keeps_the_prepared_claims() {
    let created = Created::default();
    let c = created.clone();
    let mut reg = Registry::new();
    reg.describe("[faults]", |r| {
        r.it("proxy pod lost after prepare", move |ctx: Ctx| lost_after_prepare_body(ctx, c.clone()));
    });
    let (report, output, client) = run(reg).await;
    assert_eq!(report.failed(), 0, "{output}");
    assert_eq!(report.passed(), 1, "{output}");
    assert_nothing_left(&client, &created).await;
}

async fn lost_during_unprepare_body(ctx: Ctx, created: Created) -> SpecResult {
    record(&created, &ctx);
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let driver =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1)).own_proxy_pods(true))
            .await?;
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let calls = driver.calls(&node).clone();
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    let claim = the_prepared_claim(&driver, &node)?;

    // The pod goes; the kubelet's NodeUnprepareResources is held; then the proxy pod goes.
    let block = calls.block(Method::NodeUnprepareResources);
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    pods.delete(&pod.name_any(), &DeleteParams::default()).await?;
    let blocked = |log: &CallLog| log.count(Method::NodeUnprepareResources.blocked()) > 0;
    calls.wait_for("a blocked NodeUnprepareResources", blocked, T).await?;
    let moved = lose_proxy_pod(&ctx, &driver, &node, &claim).await?;
    calls
        .wait_for(
            "registration through the replacement",
            move |log| registered_since(log, moved.first_call),
            T,
        )
        .await?;

    // Released, the unprepare completes through the replacement (the kubelet calls again).
    block.release();
    harness::wait::gone(&pods, &pod.name_any(), format!("test pod {}", pod.name_any()), T).await?;
    let log = calls.log();
    let history = log.claim(&claim.uid);
    let last = history.last_unprepared().with_context(|| format!("never unprepared: {history}"))?;
    assert!(last.id >= moved.first_call, "unprepared before the move ({moved}): {history}");
    assert!(!history.is_prepared(), "{history}");
    assert_eq!(driver.prepared_claims(&node), []);
    let replacement = driver.proxy_pod(&node).unwrap();
    assert_eq!(cdi_files(&ctx, &replacement, &claim.uid).await?, Vec::<String>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_proxy_pod_lost_during_unprepare_lets_it_complete_after_the_move() {
    let created = Created::default();
    let c = created.clone();
    let mut reg = Registry::new();
    reg.describe("[faults]", |r| {
        r.it("proxy pod lost during unprepare", move |ctx: Ctx| lost_during_unprepare_body(ctx, c.clone()));
    });
    let (report, output, client) = run(reg).await;
    assert_eq!(report.failed(), 0, "{output}");
    assert_eq!(report.passed(), 1, "{output}");
    assert_nothing_left(&client, &created).await;
}
