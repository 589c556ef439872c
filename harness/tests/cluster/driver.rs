//! The Driver and the Builder against a real cluster. Run through `cargo xtask test`, or:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored driver::
//! ```
//!
//! Every test fails (never passes silently) when `DRA_E2E_KUBECONFIG` is unset.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use harness::{
    builder::Builder,
    driver::{Driver, DriverConfig, Nodes, resources},
    framework::{Ctx, Registry, SpecResult},
    manifests::INSTANCE_LABEL,
};
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::ReplicaSet,
    authentication::v1::SelfSubjectReview,
    core::v1::{Namespace, Pod},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::{DeviceClass, ResourceSlice},
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{ListParams, PostParams},
};
use serde_json::json;

use crate::run::run;

/// Names of what a spec created, for the checks after the run.
#[derive(Default, Clone)]
pub(crate) struct Created(Arc<Mutex<Vec<(&'static str, String)>>>);

impl Created {
    pub(crate) fn add(&self, kind: &'static str, name: impl Into<String>) {
        self.0.lock().unwrap().push((kind, name.into()));
    }
    fn all(&self) -> Vec<(&'static str, String)> {
        self.0.lock().unwrap().clone()
    }
}

/// After the run every recorded object is gone.
pub(crate) async fn assert_nothing_left(client: &Client, created: &Created) {
    let all = created.all();
    assert!(!all.is_empty());
    for (kind, name) in all {
        let left = match kind {
            "Namespace" => Api::<Namespace>::all(client.clone()).get_opt(&name).await.unwrap().is_some(),
            "DeviceClass" => Api::<DeviceClass>::all(client.clone()).get_opt(&name).await.unwrap().is_some(),
            "ClusterRole" => Api::<ClusterRole>::all(client.clone()).get_opt(&name).await.unwrap().is_some(),
            "ClusterRoleBinding" => {
                Api::<ClusterRoleBinding>::all(client.clone()).get_opt(&name).await.unwrap().is_some()
            }
            "ValidatingAdmissionPolicy" => {
                Api::<ValidatingAdmissionPolicy>::all(client.clone()).get_opt(&name).await.unwrap().is_some()
            }
            "ValidatingAdmissionPolicyBinding" => {
                Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                    .get_opt(&name)
                    .await
                    .unwrap()
                    .is_some()
            }
            "Driver" => !Api::<ResourceSlice>::all(client.clone())
                .list(&ListParams::default().fields(&format!("spec.driver={name}")))
                .await
                .unwrap()
                .items
                .is_empty(),
            other => panic!("unknown kind {other}"),
        };
        assert!(!left, "{kind} {name} is left behind");
    }
}

/// Runs `body` as the one spec `[driver] name` of a run: it must pass, and nothing it recorded
/// in its [`Created`] may be left after the run.
pub(crate) async fn run_alone_and_check<F, Fut>(name: &str, body: F)
where
    F: Fn(Ctx, Created) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = SpecResult> + Send + 'static,
{
    let created = Created::default();
    let c = created.clone();
    let mut reg = Registry::new();
    reg.describe("[driver]", |r| {
        r.it(name, move |ctx: Ctx| body(ctx, c.clone()));
    });
    let (report, output, client) = run(reg).await;
    assert_eq!((report.failed(), report.passed()), (0, 1), "{}", crate::run::explain(&report, &output));
    assert_nothing_left(&client, &created).await;
}

/// The mount paths of a pod's first container.
fn mount_paths(pod: &Pod) -> Vec<String> {
    let mounts = pod.spec.as_ref().unwrap().containers[0].volume_mounts.as_ref().unwrap();
    mounts.iter().map(|m| m.mount_path.clone()).collect()
}

/// Records the cluster-scoped objects of a driver with RBAC.
pub(crate) fn record_driver(created: &Created, ctx: &Ctx, driver: &Driver) {
    let id = driver.deployment_id();
    created.add("Namespace", ctx.namespace());
    created.add("Driver", driver.name());
    created.add("ClusterRole", format!("dra-kubelet-plugin-{id}-role"));
    created.add("ClusterRoleBinding", format!("dra-kubelet-plugin-{id}-role-binding"));
    created.add("ValidatingAdmissionPolicy", format!("resourceslices-policy-dra-kubelet-plugin-{id}"));
    created.add("ValidatingAdmissionPolicyBinding", format!("resourceslices-policy-dra-kubelet-plugin-{id}"));
}

async fn control_plane_body(ctx: Ctx, created: Created) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let driver =
        Driver::start(&ctx, &nodes, DriverConfig::control_plane(resources::node_local(2)).rbac(true)).await?;
    record_driver(&created, &ctx, &driver);
    assert_eq!(driver.name(), format!("{}.k8s.io", ctx.namespace()));

    // RBAC and policy exist, per driver.
    let id = driver.deployment_id();
    Api::<ClusterRole>::all(ctx.client().clone()).get(&format!("dra-kubelet-plugin-{id}-role")).await?;
    let vap = Api::<ValidatingAdmissionPolicy>::all(ctx.client().clone())
        .get(&format!("resourceslices-policy-dra-kubelet-plugin-{id}"))
        .await?;
    let condition = &vap.spec.unwrap().match_conditions.unwrap()[0].expression;
    assert!(condition.contains(&format!(
        "system:serviceaccount:{}:{}",
        ctx.namespace(),
        driver.service_account().unwrap()
    )));

    // The node's slice: published by the plugin identity, owned by the Node. Its name was
    // generated from `00000-<driver>-<node>-`, which the API server cuts when it is long (kind's
    // node names).
    let slices = driver.slices().await?;
    assert_eq!(slices.len(), 1, "{slices:?}");
    let slice = &slices[0];
    let generate_name = format!("00000-{}-{node}-", driver.name());
    assert!(
        slice.name_any().starts_with(harness::driver::generated_name_base(&generate_name)),
        "{}",
        slice.name_any()
    );
    assert_eq!(slice.spec.node_name.as_deref(), Some(node.as_str()));
    assert_eq!(slice.spec.pool.name, node);
    assert_eq!(slice.spec.pool.generation, 1);
    let owner = &slice.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Node", node.as_str(), Some(true))
    );
    let devices: Vec<_> = slice.spec.devices.as_ref().unwrap().iter().map(|d| d.name.clone()).collect();
    assert_eq!(devices, ["device-00", "device-01"]);
    assert!(slice.managed_fields().iter().any(|f| f.manager.as_deref().is_some_and(|m| !m.is_empty())));

    // The plugin identity may not write another node's slice.
    let other: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"generateName": "driver-test-"},
        "spec": {"driver": driver.name(), "nodeName": "some-other-node", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}},
    }))?;
    let plugin_slices: Api<ResourceSlice> = Api::all(driver.client(&node).unwrap().clone());
    let err = plugin_slices
        .create(&PostParams { dry_run: true, ..Default::default() }, &other)
        .await
        .expect_err("the policy must deny it");
    assert!(
        err.to_string().contains(&format!(
            "this user running on node '{node}' may not modify resourceslices on node 'some-other-node'"
        )),
        "{err}"
    );

    // No kubelet: no calls, nothing prepared.
    assert_eq!(driver.calls(&node).log().records.len(), 0);
    assert!(driver.prepared_claims(&node).is_empty());
    assert!(!driver.is_registered(&node));

    // Builder: a claim is allocated on the node's devices with the configuration.
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let claim = b.external_claim();
    let pod = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod).await?;
    let scheduled = b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    assert_eq!(harness::builder::node_name(&scheduled), Some(node.as_str()));
    let wrong = b.check_allocations(&scheduled, &[("user_a", "c")]).await;
    assert!(wrong.unwrap_err().to_string().contains("user_a=b, expected user_a=c"));

    // Exec in a running container (a pod without claims runs without a plugin).
    let plain = b.pod();
    b.create_pod(&plain).await?;
    let running = b.wait_running(&plain).await?;
    let container = running.spec.as_ref().unwrap().containers[0].name.clone();
    b.expect_env(&running, &container, &[("HOSTNAME", plain.name_any().as_str())]).await?;
    let err = b.expect_env(&running, &container, &[("user_a", "b")]).await.unwrap_err();
    assert!(err.to_string().contains("user_a is not set"), "{err}");
    b.delete_pod_and_wait(&plain).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn control_plane_driver_with_rbac_publishes_as_the_plugin_and_cleans_up() {
    run_alone_and_check("control plane driver with RBAC", control_plane_body).await;
}

async fn kubelet_body(ctx: Ctx, created: Created) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    created.add("Namespace", ctx.namespace());
    created.add("Driver", format!("{}.k8s.io", ctx.namespace()));
    let id = harness::driver::deployment_id(&format!("{}.k8s.io", ctx.namespace()), "");
    for (kind, name) in [
        ("ClusterRole", format!("dra-kubelet-plugin-{id}-role")),
        ("ClusterRoleBinding", format!("dra-kubelet-plugin-{id}-role-binding")),
        ("ValidatingAdmissionPolicy", format!("resourceslices-policy-dra-kubelet-plugin-{id}")),
        ("ValidatingAdmissionPolicyBinding", format!("resourceslices-policy-dra-kubelet-plugin-{id}")),
    ] {
        created.add(kind, name);
    }
    let config = DriverConfig::kubelet(resources::node_local(1)).own_proxy_pods(true);
    let driver = Driver::start(&ctx, &nodes, config).await?;
    let node = nodes.names()[0].clone();

    // One proxy pod per node, with the plugin directory at the same path as on the node.
    let pods = Api::<Pod>::namespaced(ctx.client().clone(), ctx.namespace())
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={}", driver.name())))
        .await?;
    assert_eq!(pods.items.len(), 1);
    let pod = &pods.items[0];
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()));
    let mounts = mount_paths(pod);
    assert_eq!(mounts[0], format!("/var/lib/kubelet/plugins/{}", driver.name()));
    assert_eq!(driver.proxy_pod(&node).unwrap().name_any(), pod.name_any());

    // Registered, and the calls recorded.
    assert!(driver.is_registered(&node));
    let log = driver.calls(&node).log();
    assert!(log.count(harness::calls::Method::GetInfo) >= 1, "{log}");

    // A pod with a claim runs and sees the driver's env.
    let b = Builder::start(&ctx, &driver, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    assert!(driver.calls(&node).count(harness::calls::Method::NodePrepareResources) >= 1);
    assert_eq!(driver.prepared_claims(&node).len(), 1);
    // The claim's history in the call log: prepared once, not unprepared.
    let stored = b.pod_claims(&running).await?.into_values().next().unwrap();
    let history = driver.calls(&node).claim(&stored.uid().unwrap());
    assert_eq!((history.prepared(), history.unprepares().count()), (1, 0), "{history}");
    assert!(history.is_prepared());
    let container = running.spec.as_ref().unwrap().containers[0].name.clone();
    let claim = harness::builder::pod_claim_names(&running).into_values().next().flatten().unwrap();
    let claim_var = harness::plugin::claim_env_name(&claim, "my-request");
    b.expect_env_exact(
        &running,
        &container,
        &[("admin_x", "y"), ("user_a", "b"), (claim_var.as_str(), "true")],
    )
    .await?;
    Ok(())
}

/// Two drivers on one node: their plugins run in the run's one shared proxy pod of the node,
/// outside the spec's namespace, each on ports of its own and as its own ServiceAccount.
async fn shared_body(ctx: Ctx, created: Created) -> SpecResult {
    let nodes = Nodes::select(&ctx, 1, 1).await?;
    let node = nodes.names()[0].clone();
    let first = Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1))).await?;
    record_driver(&created, &ctx, &first);
    let second =
        Driver::start(&ctx, &nodes, DriverConfig::kubelet(resources::node_local(1)).name_suffix("-second"))
            .await?;
    record_driver(&created, &ctx, &second);
    let pod = first.proxy_pod(&node).unwrap();
    assert_eq!(second.proxy_pod(&node).unwrap().uid(), pod.uid(), "one shared pod per node");
    let shared_namespace = pod.namespace().unwrap();
    assert!(shared_namespace.starts_with("dra-e2e-proxies-"), "{shared_namespace}");
    // Removed when the run ends.
    created.add("Namespace", shared_namespace);
    let own = Api::<ReplicaSet>::namespaced(ctx.client().clone(), ctx.namespace())
        .list(&ListParams::default())
        .await?;
    assert!(own.items.is_empty(), "no ReplicaSet of the drivers' own: {:?}", own.items);
    let mounts = mount_paths(&pod);
    assert_eq!(mounts[0], "/var/lib/kubelet/plugins");
    assert!(first.is_registered(&node) && second.is_registered(&node));
    // Each plugin acts as its own driver's ServiceAccount, bound to the shared pod on its node.
    for driver in [&first, &second] {
        let client = driver.client(&node).unwrap().clone();
        let review = Api::<SelfSubjectReview>::all(client)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await?;
        let user = review.status.and_then(|s| s.user_info).unwrap();
        let sa = format!("system:serviceaccount:{}:{}", ctx.namespace(), driver.service_account().unwrap());
        assert_eq!(user.username.as_deref(), Some(sa.as_str()));
        let extra = user.extra.unwrap();
        assert_eq!(extra["authentication.kubernetes.io/pod-name"], [pod.name_any()]);
        assert_eq!(extra["authentication.kubernetes.io/pod-uid"], [pod.uid().unwrap()]);
        assert_eq!(extra["authentication.kubernetes.io/node-name"], std::slice::from_ref(&node));
    }

    // A pod with a claim of the second driver runs, prepared by the second plugin only.
    let b = Builder::start(&ctx, &second, Some(json!({"x": "y"}))).await?;
    created.add("DeviceClass", b.class_name());
    let (test_pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&test_pod).await?;
    b.test_pod(&test_pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    assert_eq!(second.calls(&node).count(harness::calls::Method::NodePrepareResources), 1);
    assert_eq!(first.calls(&node).count(harness::calls::Method::NodePrepareResources), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn kubelet_drivers_share_the_runs_proxy_pods_and_the_run_removes_them() {
    run_alone_and_check("drivers sharing proxy pods", shared_body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn kubelet_driver_deploys_proxy_pods_and_cleans_up() {
    run_alone_and_check("kubelet driver", kubelet_body).await;
}
