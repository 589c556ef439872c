//! Faults a kubelet spec must survive, against a real cluster: its proxy pod deleted (and
//! replaced by the ReplicaSet) while the kubelet prepares a claim, after it prepared one (the
//! plugin keeps its prepared claims, their CDI files and its call log) and while it unprepares
//! one, and the port-forward connections of its tunnels closed from outside. Each proxy pod
//! fault is tested on a driver's own proxy pods here and on the run's shared ones in
//! `faults/shared.rs`. Run through `cargo xtask test`, or:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored faults::
//! ```
#![allow(clippy::unwrap_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use harness::{
    builder::Builder,
    calls::{CallLog, Method},
    driver::{Driver, DriverConfig, Nodes, ProxyMove, registered_since, resources},
    framework::{Ctx, Registry, SpecError, SpecResult},
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
    driver::{Created, assert_nothing_left, run_alone_and_check},
    run::run,
};

mod shared;

const T: Duration = Duration::from_secs(120);

/// Which proxy pods a test's driver runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proxies {
    /// A ReplicaSet of the driver's own in the spec's namespace.
    Own,
    /// The run's shared pods (a ReplicaSet per node in the run's proxy namespace).
    Shared,
}

impl Proxies {
    /// A kubelet driver with these proxy pods.
    fn config(self, resources: harness::driver::ResourcesFn) -> DriverConfig {
        DriverConfig::kubelet(resources).own_proxy_pods(self == Proxies::Own)
    }
}

/// Starts a kubelet driver on one node with `proxies`, and records its proxy pods' namespace
/// when it is not the spec's (the run's shared one, which must be gone after the run).
async fn start_driver(ctx: &Ctx, created: &Created, proxies: Proxies) -> Result<(Driver, String), SpecError> {
    let nodes = Nodes::select(ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let driver = Driver::start(ctx, &nodes, proxies.config(resources::node_local(1))).await?;
    let pod = driver.proxy_pod(&node).context("no proxy pod")?;
    let namespace = pod.namespace().unwrap_or_default();
    assert_eq!(namespace == ctx.namespace(), proxies == Proxies::Own, "{proxies:?} in {namespace}");
    if proxies == Proxies::Shared {
        created.add("Namespace", namespace);
    }
    Ok((driver, node))
}

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

async fn proxy_pod_deleted_body(ctx: Ctx, created: Created, proxies: Proxies) -> SpecResult {
    record(&created, &ctx);
    let (driver, node) = start_driver(&ctx, &created, proxies).await?;
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
    let proxy_pods: Api<Pod> = Api::namespaced(ctx.client().clone(), &lost.namespace().unwrap());
    proxy_pods.delete(&lost.name_any(), &DeleteParams::default()).await?;
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
    assert_eq!(moved.from, format!("{}/{}", lost.namespace().unwrap(), lost.name_any()));
    let replacement = driver.proxy_pod(&node).unwrap();
    assert_ne!(replacement.uid(), lost.uid());
    assert_eq!(moved.to, format!("{}/{}", replacement.namespace().unwrap(), replacement.name_any()));
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

    // Only the replacement is left of the node's proxy pods.
    harness::wait::gone(&proxy_pods, &lost.name_any(), format!("lost proxy pod {}", lost.name_any()), T)
        .await?;
    assert_eq!(proxy_pods_on(&proxy_pods, &replacement, &node).await?, [replacement.name_any()]);
    Ok(())
}

/// The names of the pods in `api` on `node` that belong to the ReplicaSet of `proxy` (those with
/// its instance label).
async fn proxy_pods_on(api: &Api<Pod>, proxy: &Pod, node: &str) -> anyhow::Result<Vec<String>> {
    let instance = proxy.labels().get(INSTANCE_LABEL).context("proxy pod without instance label")?;
    let pods = api.list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}"))).await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .map(|p| p.name_any())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_deleted_proxy_pod_is_replaced_while_the_kubelet_prepares() {
    run_alone_and_check("proxy pod deleted", |ctx, c| proxy_pod_deleted_body(ctx, c, Proxies::Own)).await;
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
    assert_eq!((report.failed(), report.passed()), (0, 1), "{}", crate::run::explain(&report, &output));
    assert_nothing_left(&client, &created).await;
}

/// What [`not_replaced_body`] leaves for its test to look at after the run: the driver, its node
/// and the claim the kubelet could not unprepare once the proxy pod was lost.
type NotReplaced = Arc<Mutex<Option<(Driver, String, ClaimId)>>>;

async fn not_replaced_body(ctx: Ctx, created: Created, proxies: Proxies, seen: NotReplaced) -> SpecResult {
    record(&created, &ctx);
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let mut config = proxies.config(resources::node_local(1));
    config.replacement_timeout = Duration::from_secs(10);
    let driver = Driver::start(&ctx, &nodes, config).await?;
    let lost = driver.proxy_pod(&node).context("no proxy pod")?;
    let proxy_namespace = lost.namespace().unwrap_or_default();
    if proxies == Proxies::Shared {
        created.add("Namespace", proxy_namespace.clone());
    }
    // A pod whose claim the plugin prepared: the kubelet cannot unprepare it once the plugin
    // is gone, so the clean-up must not wait for it to.
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    let claim = the_prepared_claim(&driver, &node)?;
    *seen.lock().unwrap() = Some((driver.clone(), node.clone(), claim));
    // Nothing replaces the pod: its ReplicaSet is scaled to zero and deletes it.
    let owner = lost.owner_references().first().context("proxy pod without owner")?.name.clone();
    let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(ctx.client().clone(), &proxy_namespace);
    let scale = kube::api::Patch::Merge(json!({"spec": {"replicas": 0}}));
    rs.patch(&owner, &kube::api::PatchParams::default(), &scale).await?;
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

/// Runs [`not_replaced_body`]: the spec fails at once with the loss, and its clean-up ends:
/// the plugin served the kubelet from a rescue pod, which unprepared the claim through it, no
/// clean-up and no deferred check failed (the test pod was not left terminating), and nothing is
/// left.
async fn not_replaced(proxies: Proxies) {
    let created = Created::default();
    let seen = NotReplaced::default();
    let (c, s) = (created.clone(), seen.clone());
    let mut reg = Registry::new();
    reg.describe("[faults]", |r| {
        r.it("not replaced", move |ctx: Ctx| not_replaced_body(ctx, c.clone(), proxies, s.clone()));
    });
    let (report, output, client) = run(reg).await;
    assert_eq!(report.failed(), 1, "{}", crate::run::explain(&report, &output));
    let spec = &report.specs[0];
    let harness::framework::Outcome::Failed { message, .. } = &spec.outcome else { panic!("{output}") };
    assert!(message.contains("was lost at"), "{message}");
    assert!(message.contains("no replacement ready after 10s"), "{message}");
    assert!(!message.contains("; and "), "a clean-up or deferred check failed too: {message}\n{output}");
    let failed: Vec<String> = spec.deferred.iter().filter_map(|c| c.failure()).collect();
    assert!(failed.is_empty(), "{failed:?}\n{output}");
    assert!(!spec.deferred.is_empty(), "no deferred check ran:\n{output}");
    let (driver, node, claim) = seen.lock().unwrap().take().expect("the body ran up to the loss");
    let moves = driver.proxy_moves(&node);
    let rescue = moves.last().unwrap_or_else(|| panic!("no move to a rescue pod\n{output}"));
    assert!(rescue.reason.contains("a rescue pod for the clean-up"), "{rescue}");
    let history = driver.calls(&node).claim(&claim.uid);
    let unprepared = history.last_unprepared().unwrap_or_else(|| panic!("never unprepared: {history}"));
    assert!(unprepared.id >= rescue.first_call, "unprepared before the rescue ({rescue}): {history}");
    assert!(!history.is_prepared(), "{history}");
    assert_nothing_left(&client, &created).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_proxy_pod_without_replacement_fails_the_spec_at_once() {
    not_replaced(Proxies::Own).await;
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
    claim: Option<&ClaimId>,
) -> anyhow::Result<ProxyMove> {
    let lost = driver.proxy_pod(node).context("no proxy pod")?;
    let lost_namespace = lost.namespace().unwrap_or_default();
    let before = driver.proxy_moves(node).len();
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), &lost_namespace);
    pods.delete(&lost.name_any(), &DeleteParams::default().grace_period(0)).await?;
    tracing::info!(pod = %lost.name_any(), "proxy pod deleted with grace period 0");
    let polls = std::sync::atomic::AtomicUsize::new(0);
    let moved = harness::wait::poll(
        "the plugin to move to a replacement proxy pod",
        T,
        Duration::from_millis(20),
        || {
            polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let prepared = driver.prepared_claims(node);
            let moves = driver.proxy_moves(node);
            let claim = claim.cloned();
            async move {
                if let Some(claim) = claim.filter(|c| !prepared.contains(c)) {
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
    assert_eq!(moved.from, format!("{lost_namespace}/{}", lost.name_any()));
    Ok(moved)
}

/// The pod's claim, prepared and held by the plugin on `node`.
fn the_prepared_claim(driver: &Driver, node: &str) -> anyhow::Result<ClaimId> {
    let prepared = driver.prepared_claims(node);
    anyhow::ensure!(prepared.len() == 1, "one prepared claim expected: {prepared:?}");
    Ok(prepared[0].clone())
}

async fn lost_after_prepare_body(ctx: Ctx, created: Created, proxies: Proxies) -> SpecResult {
    record(&created, &ctx);
    let (driver, node) = start_driver(&ctx, &created, proxies).await?;
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
    let moved = lose_proxy_pod(&ctx, &driver, &node, Some(&claim)).await?;
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
    run_alone_and_check("proxy pod lost after prepare", |ctx, c| {
        lost_after_prepare_body(ctx, c, Proxies::Own)
    })
    .await;
}

async fn lost_during_unprepare_body(ctx: Ctx, created: Created, proxies: Proxies) -> SpecResult {
    record(&created, &ctx);
    let (driver, node) = start_driver(&ctx, &created, proxies).await?;
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
    let moved = lose_proxy_pod(&ctx, &driver, &node, Some(&claim)).await?;
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
    run_alone_and_check("proxy pod lost during unprepare", |ctx, c| {
        lost_during_unprepare_body(ctx, c, Proxies::Own)
    })
    .await;
}
