//! The crate's example driver (`examples/node_driver.rs`, included here as it is) against a real
//! kubelet: on a node of dra-e2e's local cluster it publishes its devices, the kubelet registers
//! it, a pod with a claim on its device runs with the claim's CDI environment, and deleting the
//! pod unprepares the claim. `#[ignore]`d: `cargo xtask test` runs it with `DRA_E2E_KUBECONFIG`
//! set to the local cluster's admin kubeconfig, whose directory holds the nodes' directories
//! (`nodes/<node>/kubelet` is the node's `/var/lib/kubelet`, `nodes/<node>/cdi` its
//! `/var/run/cdi`). gRPC's C core (`clients/`) then prepares the same claim again, read from the
//! API server.

#![allow(clippy::unwrap_used)]

#[path = "../examples/node_driver.rs"]
#[allow(dead_code)]
mod node_driver;

mod clients;

use std::{path::PathBuf, time::Duration};

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, GroupVersionKind, LogParams, PostParams},
    core::ApiResource,
};
use kubelet_plugin::calls::Method;
use node_driver::{Args, NodeDriver};

/// The node the driver serves (a worker of the local cluster).
const NODE: &str = "kind-worker3";
/// The test image the local cluster's nodes hold.
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
const TIMEOUT: Duration = Duration::from_secs(120);

fn kubeconfig() -> PathBuf {
    std::env::var_os("DRA_E2E_KUBECONFIG").map(PathBuf::from).expect(
        "DRA_E2E_KUBECONFIG must name the local cluster's admin kubeconfig (cargo xtask test sets it)",
    )
}

async fn client(kubeconfig: &PathBuf) -> Client {
    let config = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

fn dynamic(client: &Client, kind: &str, plural: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// Polls `check` every 200 ms until it returns `Some`, failing after [`TIMEOUT`] with `what`.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {TIMEOUT:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster: cargo xtask test runs it with DRA_E2E_KUBECONFIG"]
async fn the_example_driver_serves_a_pod_on_a_real_kubelet() {
    let kubeconfig = kubeconfig();
    let client = client(&kubeconfig).await;
    let node_dir = kubeconfig.parent().unwrap().join("nodes").join(NODE);
    assert!(
        node_dir.join("kubelet").is_dir(),
        "{} is not a local cluster node's directory; this test needs dra-e2e's local cluster",
        node_dir.display()
    );
    let suffix: u32 = rand::random();
    // Short: the socket paths under the node directory must fit a sockaddr_un (108 bytes).
    let driver_name = format!("nd-{suffix:08x}.dra.test");
    let namespace = format!("node-driver-{suffix:08x}");
    let args = Args {
        driver_name: driver_name.clone(),
        node_name: NODE.to_owned(),
        devices: 2,
        kubelet_dir: node_dir.join("kubelet"),
        kubelet_dir_in_node: Some(PathBuf::from("/var/lib/kubelet")),
        cdi_dir: node_dir.join("cdi"),
        kubeconfig: Some(kubeconfig.clone()),
        brk: None,
        static_cdi: false,
        optional_devices: false,
    };

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: kube::core::ObjectMeta { name: Some(namespace.clone()), ..Default::default() },
        ..Default::default()
    };
    namespaces.create(&PostParams::default(), &ns).await.unwrap();
    let classes = dynamic(&client, "DeviceClass", "deviceclasses", None);
    classes
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": driver_name},
                "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver_name}\"")}}]},
            })),
        )
        .await
        .unwrap();

    let started = NodeDriver::start(&args).await;
    let driver = match started {
        Ok(driver) => driver,
        Err(e) => {
            let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
            let _ = classes.delete(&driver_name, &DeleteParams::default()).await;
            panic!("the example driver did not start: {e:#}");
        }
    };
    let body = async {
        let claims = dynamic(&client, "ResourceClaim", "resourceclaims", Some(&namespace));
        claims
            .create(
                &PostParams::default(),
                &object(serde_json::json!({
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "claim"},
                    "spec": {"devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": driver_name}}]}},
                })),
            )
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "tester"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "c", "resourceClaimName": "claim"}],
                "containers": [{
                    "name": "ctr",
                    "image": BUSYBOX,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "echo claim=$claim_claim_req; sleep 3600"],
                    "resources": {"claims": [{"name": "c"}]},
                }],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();

        // The CDI spec the plugin wrote sets the claim's variable in the container.
        let logs = eventually("the pod to print its claim's CDI environment", || async {
            let logs = pods.logs("tester", &LogParams::default()).await.ok()?;
            logs.contains("claim=").then_some(logs)
        })
        .await;
        assert!(logs.contains("claim=true"), "the container lacks the CDI environment: {logs:?}");
        let calls = driver.plugin.calls();
        assert_eq!(calls.count(Method::NodePrepareResources), 1, "{:?}", calls.log());
        assert_eq!(calls.count(Method::NodeUnprepareResources), 0);

        let uid = claims.get("claim").await.unwrap().metadata.uid.unwrap();

        // gRPC's C core gets the same answer for the claim, read from the API server.
        let claim = vec![(namespace.clone(), "claim".to_owned(), uid.clone())];
        let dra_socket = args.kubelet_dir.join("plugins").join(&driver_name).join("dra.sock");
        let answers = clients::Client::CCore.run(&dra_socket, &[clients::Call::PrepareV1(claim)]).await;
        let prepared: kubelet_plugin::grpc::dra_v1::NodePrepareResourcesResponse = answers[0].ok();
        let devices = &prepared.claims[&uid].devices;
        assert_eq!(prepared.claims[&uid].error, "");
        assert_eq!(devices.len(), 1, "{prepared:?}");
        assert_eq!(devices[0].pool_name, NODE);
        assert!(devices[0].device_name.starts_with("device-0"), "{prepared:?}");
        pods.delete("tester", &DeleteParams::default()).await.unwrap();
        calls.wait_unprepared(&uid, TIMEOUT).await.unwrap();
        assert!(driver.plugin.prepared_claims().is_empty());
    };
    let outcome = std::panic::AssertUnwindSafe(body).catch_unwind().await;

    driver.stop().await;
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
    let _ = classes.delete(&driver_name, &DeleteParams::default()).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    // Nothing of the driver is left on the node.
    assert!(!args.kubelet_dir.join("plugins_registry").join(format!("{driver_name}-reg.sock")).exists());
    assert!(!args.kubelet_dir.join("plugins").join(&driver_name).exists());
}
