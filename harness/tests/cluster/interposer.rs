//! The interposer against a real driver: the example driver of `kubelet-plugin` runs on this
//! machine for node kind-worker2 of the local cluster, the interposer registers in its place,
//! and the kubelet's calls go through the harness to it. Needs the proxy image with
//! `/dra-e2e-dial` and the example driver already running:
//!
//! ```text
//! cargo run -p kubelet-plugin --example node_driver -- --driver-name h3.example.dra-e2e.test \
//!     --node-name kind-worker2 --kubelet-dir /var/lib/dra-e2e/local/nodes/kind-worker2/kubelet \
//!     --kubelet-dir-in-node /var/lib/kubelet --cdi-dir /var/lib/dra-e2e/local/nodes/kind-worker2/cdi \
//!     --kubeconfig /var/lib/dra-e2e/local/admin.kubeconfig &
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig DRA_E2E_INTERPOSE_DRIVER=h3.example.dra-e2e.test \
//!     cargo test -p harness --test cluster -- --ignored interposer::
//! ```
//!
//! The driver's DeviceClass (named after the driver, selecting its devices) is created here.
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

use crate::run::run_one_spec;

const NODE: &str = "kind-worker2";
const T: Duration = Duration::from_secs(120);

/// The real driver to interpose: `DRA_E2E_INTERPOSE_DRIVER`, or the example driver's name
/// above.
fn driver() -> String {
    std::env::var("DRA_E2E_INTERPOSE_DRIVER")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "h3.example.dra-e2e.test".to_owned())
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
#[ignore = "needs the local cluster, the proxy image with /dra-e2e-dial and the example driver running for kind-worker2 (see the module documentation)"]
async fn the_interposer_stands_between_the_kubelet_and_a_real_driver() {
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
            assert_eq!(log.succeeded(Method::NodePrepareResources), 1, "{log}");
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
            assert!(calls.log().failed(Method::NodePrepareResources) >= 1, "{}", calls.log());
            drop(fault);
            wait_running(&ctx, "second").await?;
            let log = calls.log();
            assert_eq!(log.succeeded(Method::NodePrepareResources), 2, "{log}");
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
}
