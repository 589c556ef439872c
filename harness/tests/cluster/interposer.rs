//! The interposer against a real driver: the example driver of `kubelet-plugin` runs in this
//! process for node kind-worker2 of the local cluster (its sockets in the node's directories on
//! this machine), the interposer registers in its place, and the kubelet's calls go through the
//! harness to it. Needs the proxy image with `/dra-e2e-dial`. Run through `cargo xtask test`, or:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored interposer::
//! ```
//!
//! Each spec creates a DeviceClass of the driver's devices and deletes it at its end.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use harness::{
    builder::BUSYBOX_IMAGE,
    calls::Method,
    framework::Ctx,
    interposer::Interposer,
    wait::{self, Attempt},
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

use futures::FutureExt as _;

use crate::{
    node_driver::{Args, NodeDriver},
    run::{kubeconfig, run_one_spec},
};

const NODE: &str = "kind-worker2";
const T: Duration = Duration::from_secs(120);

/// The name of the real driver (the example driver) the interposer stands in for.
const DRIVER: &str = "h3.example.dra-e2e.test";

fn driver() -> String {
    DRIVER.to_owned()
}

/// The example driver for [`NODE`], its files in the node's directories on this machine.
async fn start_example_driver() -> NodeDriver {
    let kubeconfig = kubeconfig();
    let node_dir = kubeconfig.parent().unwrap().join("nodes").join(NODE);
    assert!(
        node_dir.join("kubelet").is_dir(),
        "{} is not a local cluster node's directory",
        node_dir.display()
    );
    let args = Args {
        driver_name: DRIVER.to_owned(),
        node_name: NODE.to_owned(),
        devices: 2,
        kubelet_dir: node_dir.join("kubelet"),
        kubelet_dir_in_node: Some("/var/lib/kubelet".into()),
        cdi_dir: node_dir.join("cdi"),
        kubeconfig: Some(kubeconfig),
        brk: None,
        static_cdi: false,
        optional_devices: false,
    };
    NodeDriver::start(&args).await.unwrap()
}

fn dynamic(ctx: &Ctx, kind: &str, plural: &str, namespaced: bool) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    match namespaced {
        true => Api::namespaced_with(ctx.client().clone(), ctx.namespace(), &resource),
        false => Api::all_with(ctx.client().clone(), &resource),
    }
}

/// A claim `name` of one device of the driver's class and a pod on [`NODE`] that uses it.
async fn claim_and_pod(ctx: &Ctx, class: &str, name: &str) -> anyhow::Result<()> {
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": class}}]}},
    });
    dynamic(ctx, "ResourceClaim", "resourceclaims", true)
        .create(&PostParams::default(), &serde_json::from_value(claim)?)
        .await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "c", "resourceClaimName": name}],
            "containers": [{
                "name": "ctr",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "sleep 3600"],
                "resources": {"claims": [{"name": "c"}]},
            }],
        },
    }))?;
    Api::<Pod>::namespaced(ctx.client().clone(), ctx.namespace())
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// A DeviceClass of the driver's devices, deleted at the spec's end; returns its name.
async fn device_class(ctx: &Ctx, driver: &str) -> anyhow::Result<String> {
    let classes = dynamic(ctx, "DeviceClass", "deviceclasses", false);
    let name = format!("{}-{driver}", ctx.namespace());
    let class = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]},
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    let deleted = name.clone();
    ctx.defer(format!("delete DeviceClass {name}"), async move {
        classes.delete(&deleted, &DeleteParams::default()).await?;
        Ok(())
    });
    Ok(name)
}

async fn wait_running(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    wait::poll(format!("pod {name} to run"), T, Duration::from_millis(500), || {
        let pods = pods.clone();
        async move {
            match pods.get(name).await {
                Ok(pod) => {
                    let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
                    if phase == "Running" {
                        Attempt::Done(())
                    } else {
                        Attempt::Retry(format!("phase {phase:?}"))
                    }
                }
                Err(e) => Attempt::Retry(e.to_string()),
            }
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local cluster with the proxy image that holds /dra-e2e-dial (see the module documentation)"]
async fn the_interposer_stands_between_the_kubelet_and_a_real_driver() {
    let example = start_example_driver().await;
    let specs = async {
        run_one_spec(
            "interposer",
            "forwards the kubelet's calls to the real driver and fails them on demand",
            |ctx| async move {
                let driver = driver();
                let class_name = device_class(&ctx, &driver).await?;

                let interposer = Interposer::start(&ctx, &driver, &[NODE.to_owned()]).await?;
                assert_eq!(interposer.node_names(), [NODE.to_owned()]);
                let calls = interposer.calls(NODE);

                claim_and_pod(&ctx, &class_name, "first").await?;
                wait_running(&ctx, "first").await?;
                let log = calls.log();
                assert_eq!(log.count(Method::NodePrepareResources), 1, "{log}");
                assert_eq!(log.count(Method::NodePrepareResources.succeeded()), 1, "{log}");
                // The answer is the driver's: its devices are in the pool named after the node (the
                // interposer itself publishes nothing and prepares nothing).
                let prepared = log.matching(Method::NodePrepareResources);
                let response = prepared[0].response.as_ref().map(ToString::to_string).unwrap_or_default();
                assert!(response.contains(NODE) && response.contains("device-"), "{response}");
                assert!(!prepared[0].injected);

                // A fault fails the second pod's prepare (not forwarded), seen in the kubelet's event.
                let fault = interposer.fail(NODE, Method::NodePrepareResources);
                claim_and_pod(&ctx, &class_name, "second").await?;
                let events: Api<Event> = Api::namespaced(ctx.client().clone(), ctx.namespace());
                wait::poll(
                    "the kubelet's FailedPrepareDynamicResources event of pod second",
                    T,
                    Duration::from_secs(1),
                    || {
                        let events = events.clone();
                        async move {
                            let list = match events
                                .list(&ListParams::default().fields("involvedObject.name=second"))
                                .await
                            {
                                Ok(list) => list,
                                Err(e) => return Attempt::Retry(e.to_string()),
                            };
                            let reasons: Vec<String> =
                                list.items.iter().filter_map(|e| e.reason.clone()).collect();
                            if reasons.iter().any(|r| r == "FailedPrepareDynamicResources") {
                                Attempt::Done(())
                            } else {
                                Attempt::Retry(format!("events: {reasons:?}"))
                            }
                        }
                    },
                )
                .await?;
                assert!(calls.log().count(Method::NodePrepareResources.failed()) >= 1, "{}", calls.log());
                drop(fault);
                wait_running(&ctx, "second").await?;
                let log = calls.log();
                assert_eq!(log.count(Method::NodePrepareResources.succeeded()), 2, "{log}");
                Ok(())
            },
        )
        .await;

        // Its teardown unregistered it: the kubelet prepares through the driver again.
        run_one_spec(
            "interposer",
            "is gone after its spec: the kubelet uses the driver again",
            |ctx| async move {
                let class_name = device_class(&ctx, &driver()).await?;
                claim_and_pod(&ctx, &class_name, "after").await?;
                wait_running(&ctx, "after").await?;
                Ok(())
            },
        )
        .await;
    };
    let outcome = std::panic::AssertUnwindSafe(specs).catch_unwind().await;
    example.stop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
