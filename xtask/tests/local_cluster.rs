//! Cluster tests of the local provider, against the real cluster that `cargo xtask test` starts
//! (`cargo xtask cluster up --provider local`). They read the admin kubeconfig from
//! `DRA_E2E_KUBECONFIG` and fail when it is missing, so they can never pass without a cluster.
//!
//! Run: `DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig cargo test -p xtask --test local_cluster -- --ignored`
//!
//! The cluster has kind's default nodes (one control plane, three workers). Tests that look at a
//! node's files from the host use the node's state directory
//! (`$DRA_E2E_LOCAL_STATE/nodes/<node>`), which each node's mount namespace bind-mounts at
//! /var/lib/kubelet, /var/run/cdi, /tmp, ...

use std::{future::Future, path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    resource::v1::{DeviceClass, ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client, ResourceExt,
    api::{AttachParams, DeleteParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::wait::{await_condition, conditions},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod images_registry;
mod node_isolation;
mod nodes_support;

use nodes_support::{CONTROL_PLANE, NODE, OTHER_NODE, WORKERS, node_path, on_node};

/// The busybox image every node has.
pub const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
const HOSTPATHPLUGIN: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1";
const WAIT: Duration = Duration::from_secs(120);

/// A client with the admin kubeconfig of the cluster under test.
pub async fn client() -> Result<Client> {
    let path = std::env::var_os("DRA_E2E_KUBECONFIG").context(
        "DRA_E2E_KUBECONFIG is not set: these tests need the local cluster (run them through `cargo xtask test`)",
    )?;
    let kubeconfig = Kubeconfig::read_from(PathBuf::from(path))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Runs `body` in a fresh namespace and deletes the namespace afterwards (also on failure),
/// waiting until it is gone.
pub async fn in_namespace<F, Fut>(client: &Client, body: F) -> Result<()>
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "local-cluster-test-"}
    }))?;
    let ns = namespaces.create(&PostParams::default(), &ns).await?;
    let name = ns.name_any();
    // Pods need the namespace's default ServiceAccount, which a controller creates.
    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &name);
    let sa_ready =
        tokio::time::timeout(WAIT, await_condition(sa, "default", |sa: Option<&_>| sa.is_some())).await;
    let result = match sa_ready {
        Ok(Ok(_)) => body(client.clone(), name.clone()).await,
        _ => Err(anyhow::anyhow!("namespace {name} got no default ServiceAccount within {WAIT:?}")),
    };
    let uid = ns.uid().unwrap_or_default();
    namespaces.delete(&name, &DeleteParams::default()).await?;
    tokio::time::timeout(WAIT, await_condition(namespaces, &name, conditions::is_deleted(&uid)))
        .await
        .with_context(|| format!("namespace {name} still exists {WAIT:?} after deletion"))??;
    result
}

/// A pod with one container `main` running `command` in `image` (1 s grace period).
pub fn pod(name: &str, image: &str, command: &[&str]) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "command": command}],
        }
    }))?)
}

/// Waits until the pod runs.
pub async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<()> {
    match tokio::time::timeout(WAIT, await_condition(pods.clone(), name, conditions::is_pod_running())).await
    {
        Ok(result) => {
            result?;
            Ok(())
        }
        Err(_) => bail!("pod {name} not running within {WAIT:?}: {}", pod_state(pods, name).await),
    }
}

/// What a pod's status says, for error messages.
async fn pod_state(pods: &Api<Pod>, name: &str) -> String {
    match pods.get(name).await {
        Ok(p) => format!("{:?}", p.status),
        Err(e) => format!("cannot read pod {name}: {e}"),
    }
}

/// Runs a command in a pod's container and returns its stdout (fails on a non-zero exit).
pub async fn exec(pods: &Api<Pod>, name: &str, command: &[&str]) -> Result<String> {
    let mut process = pods.exec(name, command.to_vec(), &AttachParams::default().stderr(true)).await?;
    let mut stdout = process.stdout().context("no stdout")?;
    let mut stderr = process.stderr().context("no stderr")?;
    let status = process.take_status().context("no status")?;
    let (mut out, mut err) = (String::new(), String::new());
    let (a, b) = tokio::join!(stdout.read_to_string(&mut out), stderr.read_to_string(&mut err));
    a?;
    b?;
    let status = status.await;
    process.join().await?;
    if let Some(s) = status
        && s.status.as_deref() != Some("Success")
    {
        bail!("{command:?} in pod {name} failed: {:?}; stderr: {err}", s.message);
    }
    Ok(out)
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn every_node_is_ready_and_reports_the_pinned_versions() -> Result<()> {
    let nodes: Api<Node> = Api::all(client().await?);
    let mut names: Vec<String> =
        nodes.list(&Default::default()).await?.items.iter().map(|n| n.name_any()).collect();
    names.sort();
    let mut expected: Vec<&str> = WORKERS.iter().copied().chain([CONTROL_PLANE]).collect();
    expected.sort();
    assert_eq!(names, expected, "the nodes kind.yaml lists, named as kind names them");
    for name in expected {
        let node = nodes.get(name).await?;
        assert_eq!(node.labels().get("kubernetes.io/hostname").map(String::as_str), Some(name));
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let cp_taint = taints
            .iter()
            .any(|t| t.key == "node-role.kubernetes.io/control-plane" && t.effect == "NoSchedule");
        let cp_label = node.labels().contains_key("node-role.kubernetes.io/control-plane");
        assert_eq!(cp_taint, name == CONTROL_PLANE, "{name}: control-plane taint {taints:?}");
        assert_eq!(cp_label, name == CONTROL_PLANE, "{name}: control-plane label");
        let status = node.status.context("node has no status")?;
        let ready =
            status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
        assert!(ready, "node {name} is not Ready");
        let info = status.node_info.context("no nodeInfo")?;
        assert_eq!(info.kubelet_version, "v1.37.2", "{name}: the kubelet version is stamped at build time");
        assert!(
            info.container_runtime_version.starts_with("containerd://2."),
            "{name}: {}",
            info.container_runtime_version
        );
        let addresses = status.addresses.unwrap_or_default();
        let ip = addresses.iter().find(|a| a.type_ == "InternalIP").context("no InternalIP")?;
        assert!(ip.address.starts_with("10.89.0."), "{name}: node IP {}", ip.address);
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn scheduler_allocates_a_claim_from_a_template() -> Result<()> {
    let client = client().await?;
    let suffix = format!("{:x}", std::process::id());
    let driver = format!("local-cluster-{suffix}.dra-e2e.test");
    let class_name = format!("local-cluster-{suffix}");
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let class: DeviceClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": class_name},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]},
    }))?;
    let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("local-cluster-{suffix}")},
        "spec": {
            "driver": driver,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "device-00"}],
        },
    }))?;
    // Only NODE has the device: the scheduler must pick it among the workers.
    classes.create(&PostParams::default(), &class).await?;
    slices.create(&PostParams::default(), &slice).await?;
    let result = in_namespace(&client, |client, ns| {
        let class_name = class_name.clone();
        async move {
            let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
                Api::namespaced(client.clone(), &ns);
            let template = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "template"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "my-request", "exactly": {"deviceClassName": class_name}}
                ]}}},
            }))?;
            templates.create(&PostParams::default(), &template).await?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let mut p = pod("with-claim", BUSYBOX, &["sleep", "3600"])?;
            let spec = p.spec.as_mut().context("spec")?;
            spec.resource_claims = Some(vec![serde_json::from_value(serde_json::json!(
                {"name": "my-claim", "resourceClaimTemplateName": "template"}
            ))?]);
            spec.containers[0].resources =
                Some(serde_json::from_value(serde_json::json!({"claims": [{"name": "my-claim"}]}))?);
            pods.create(&PostParams::default(), &p).await?;
            let scheduled = tokio::time::timeout(
                WAIT,
                await_condition(pods.clone(), "with-claim", |p: Option<&Pod>| {
                    p.and_then(|p| p.spec.as_ref()?.node_name.as_deref()) == Some(NODE)
                }),
            )
            .await;
            if scheduled.is_err() {
                bail!("pod was not scheduled within {WAIT:?}: {}", pod_state(&pods, "with-claim").await);
            }
            let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
            let list = claims.list(&Default::default()).await?;
            let [claim] = list.items.as_slice() else {
                bail!("expected one generated claim, got {}", list.items.len())
            };
            let results = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.clone())
                .context("the generated claim is not allocated")?;
            assert_eq!(results.len(), 1);
            assert_eq!(results[0].device, "device-00");
            assert_eq!(results[0].pool, NODE);
            Ok(())
        }
    })
    .await;
    slices.delete(&format!("local-cluster-{suffix}"), &DeleteParams::default()).await?;
    classes.delete(&class_name, &DeleteParams::default()).await?;
    result
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn exec_and_logs_reach_a_busybox_pod_on_every_node() -> Result<()> {
    let client = client().await?;
    in_namespace(&client, |client, ns| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        for (i, node) in WORKERS.iter().copied().chain([CONTROL_PLANE]).enumerate() {
            let name = format!("busybox-{i}");
            let mut p = on_node(pod(&name, BUSYBOX, &["sh", "-c", "echo started; exec sleep 3600"])?, node)?;
            p.spec.as_mut().context("spec")?.containers[0].env =
                Some(serde_json::from_value(serde_json::json!([{"name": "GREETING", "value": "hello"}]))?);
            pods.create(&PostParams::default(), &p).await?;
        }
        for (i, node) in WORKERS.iter().copied().chain([CONTROL_PLANE]).enumerate() {
            let name = format!("busybox-{i}");
            wait_running(&pods, &name).await?;
            let env = exec(&pods, &name, &["env"]).await?;
            assert!(env.lines().any(|l| l == "GREETING=hello"), "{node}: env output:\n{env}");
            // Pods get no default route: nothing they send can leave the machine.
            let routes = exec(&pods, &name, &["ip", "route"]).await?;
            assert!(!routes.contains("default"), "{node}: pod has a default route:\n{routes}");
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let logs = pods.logs(&name, &Default::default()).await?;
                if logs.contains("started") {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    bail!("{node}: pod {name} logs never showed its output: {logs:?}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    })
    .await
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn port_forward_carries_bytes_both_ways_on_every_node() -> Result<()> {
    let client = client().await?;
    in_namespace(&client, |client, ns| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        for (i, node) in WORKERS.iter().copied().chain([CONTROL_PLANE]).enumerate() {
            // An echo server: every connection gets its input back.
            let echo = pod(
                &format!("echo-{i}"),
                BUSYBOX,
                &["sh", "-c", "while true; do nc -l -p 8080 -e cat; done"],
            )?;
            pods.create(&PostParams::default(), &on_node(echo, node)?).await?;
        }
        for i in 0..=WORKERS.len() {
            echo_through_port_forward(&pods, &format!("echo-{i}")).await?;
        }
        Ok(())
    })
    .await
}

async fn echo_through_port_forward(pods: &Api<Pod>, name: &str) -> Result<()> {
    {
        wait_running(pods, name).await?;
        let payload = b"ping through the API server's port-forward";
        let mut last = String::new();
        for _ in 0..50 {
            let mut pf = pods.portforward(name, &[8080]).await?;
            let mut stream = pf.take_stream(8080).context("no stream")?;
            stream.write_all(payload).await?;
            let mut got = vec![0u8; payload.len()];
            match tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut got)).await {
                Ok(Ok(_)) => {
                    assert_eq!(&got, payload);
                    drop(stream);
                    pf.abort();
                    return Ok(());
                }
                // The server may not listen yet: try again.
                other => last = format!("{other:?}"),
            }
            pf.abort();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("no echo through port-forward from {name}; last attempt: {last}")
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn hostpathplugin_proxies_a_host_socket_to_a_pod_port() -> Result<()> {
    let client = client().await?;
    let dir = format!("/var/lib/kubelet/plugins/local-cluster-test-{}", std::process::id());
    // The proxy runs on NODE; the test process reaches its socket through the node's directory.
    let host_dir = node_path(NODE, &dir);
    let socket = format!("{dir}/proxy.sock");
    let host_socket = format!("{}/proxy.sock", host_dir.display());
    let result = in_namespace(&client, |client, ns| {
        let (dir, socket, host_socket) = (dir.clone(), socket.clone(), host_socket.clone());
        async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let mut p = pod(
                "proxy",
                HOSTPATHPLUGIN,
                &[
                    "/hostpathplugin",
                    "--v=5",
                    &format!("--endpoint={socket}"),
                    "--proxy-endpoint=tcp://:9000",
                ],
            )?;
            let spec = p.spec.as_mut().context("spec")?;
            spec.volumes = Some(serde_json::from_value(serde_json::json!([
                {"name": "dir", "hostPath": {"path": dir, "type": "DirectoryOrCreate"}}
            ]))?);
            spec.containers[0].volume_mounts =
                Some(serde_json::from_value(serde_json::json!([{"name": "dir", "mountPath": dir}]))?);
            spec.containers[0].security_context =
                Some(serde_json::from_value(serde_json::json!({"privileged": true}))?);
            pods.create(&PostParams::default(), &on_node(p, NODE)?).await?;
            wait_running(&pods, "proxy").await?;
            // The TCP side first (it waits in the proxy's accept queue), then the Unix side, as
            // the tunnel and the kubelet do.
            let mut pf = pods.portforward("proxy", &[9000]).await?;
            let mut tcp = pf.take_stream(9000).context("no stream")?;
            let deadline = tokio::time::Instant::now() + WAIT;
            let mut unix = loop {
                match tokio::net::UnixStream::connect(&host_socket).await {
                    Ok(s) => break s,
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing_note(&e);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => bail!("cannot connect to {host_socket} ({socket} on {NODE}): {e}"),
                }
            };
            unix.write_all(b"from the kubelet side").await?;
            let mut buf = [0u8; 21];
            tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut buf)).await??;
            assert_eq!(&buf, b"from the kubelet side");
            tcp.write_all(b"from the test process").await?;
            tokio::time::timeout(Duration::from_secs(10), unix.read_exact(&mut buf)).await??;
            assert_eq!(&buf, b"from the test process");
            pf.abort();
            Ok(())
        }
    })
    .await;
    let _ = std::fs::remove_dir_all(&host_dir);
    result
}

fn tracing_note(e: &std::io::Error) {
    eprintln!("waiting for the proxy socket: {e}");
}

/// The whole DRA data path on one worker: its kubelet registers an in-process DRA plugin through
/// its plugin directory, calls NodePrepareResources for an allocated claim, the plugin writes a
/// CDI spec to the node's /var/run/cdi, and containerd injects its env var into the container.
/// The spec is the node's own: another node's /var/run/cdi does not have it.
#[tokio::test]
#[ignore = "needs the local cluster: run via cargo xtask test"]
async fn cdi_spec_of_a_prepared_claim_reaches_the_container() -> Result<()> {
    use std::sync::Arc;

    use harness::{
        calls::Method,
        plugin::{KubeClaims, KubeletPlugin, Listener, LocalDirFiles, PluginConfig, PluginListeners},
    };

    let client = client().await?;
    let suffix = format!("{:x}", std::process::id());
    let driver = format!("cdi-{suffix}.dra-e2e.test");
    let class_name = format!("cdi-{suffix}");
    let plugin_dir = node_path(NODE, &format!("/var/lib/kubelet/plugins/{driver}"));
    let cdi_dir = node_path(NODE, "/var/run/cdi");
    std::fs::create_dir_all(&plugin_dir)?;
    std::fs::create_dir_all(&cdi_dir)?;
    let registry = node_path(NODE, "/var/lib/kubelet/plugins_registry");
    // The kubelet dials the socket at its own path; the test process listens on the host side.
    let config = PluginConfig::new(&driver, NODE, cdi_dir.display().to_string())
        .dra_endpoint(format!("/var/lib/kubelet/plugins/{driver}/dra.sock"));
    let plugin = KubeletPlugin::builder(config)
        .claim_source(Arc::new(KubeClaims::new(client.clone())))
        .file_ops(Arc::new(LocalDirFiles))
        .start(PluginListeners {
            registration: Listener::unix(registry.join(format!("{driver}-reg.sock"))),
            dra: Listener::unix(plugin_dir.join("dra.sock")),
        })
        .await?;
    plugin.wait_registered(WAIT).await?;

    let classes: Api<DeviceClass> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": class_name},
                "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]},
            }))?,
        )
        .await?;
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": class_name},
                "spec": {
                    "driver": driver,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "device-00"}],
                },
            }))?,
        )
        .await?;
    let result = in_namespace(&client, |client, ns| {
        let (driver, class_name, plugin, cdi_dir) =
            (driver.clone(), class_name.clone(), &plugin, cdi_dir.clone());
        async move {
            let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
            claims
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(serde_json::json!({
                        "metadata": {"name": "external-claim"},
                        "spec": {"devices": {
                            "requests": [{"name": "my-request", "exactly": {"deviceClassName": class_name}}],
                            "config": [{"opaque": {"driver": driver, "parameters": {"a": "b"}}}],
                        }},
                    }))?,
                )
                .await?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let mut p = pod("with-device", BUSYBOX, &["sleep", "3600"])?;
            let spec = p.spec.as_mut().context("spec")?;
            spec.resource_claims = Some(vec![serde_json::from_value(serde_json::json!(
                {"name": "my-claim", "resourceClaimName": "external-claim"}
            ))?]);
            spec.containers[0].resources =
                Some(serde_json::from_value(serde_json::json!({"claims": [{"name": "my-claim"}]}))?);
            pods.create(&PostParams::default(), &p).await?;
            wait_running(&pods, "with-device").await?;
            let scheduled = pods.get("with-device").await?.spec.and_then(|s| s.node_name);
            assert_eq!(scheduled.as_deref(), Some(NODE), "the pod runs where the device is");
            assert_eq!(plugin.calls().count(Method::NodePrepareResources), 1, "{}", plugin.calls().log());
            let uid = claims.get("external-claim").await?.uid().context("claim uid")?;
            let file_name = format!("{driver}-{uid}-my-request.json");
            let spec_file = cdi_dir.join(&file_name);
            assert!(spec_file.is_file(), "no CDI spec at {}", spec_file.display());
            let elsewhere = node_path(OTHER_NODE, "/var/run/cdi").join(&file_name);
            assert!(
                !elsewhere.exists(),
                "{NODE}'s CDI spec is visible on {OTHER_NODE}: {}",
                elsewhere.display()
            );

            let env = exec(&pods, "with-device", &["env"]).await?;
            assert!(
                env.lines().any(|l| l == "user_a=b"),
                "the claim's config did not reach the container:\n{env}"
            );
            assert!(
                env.lines().any(|l| l == "claim_external_claim_my_request=true"),
                "the claim's marker did not reach the container:\n{env}"
            );

            // Deleting the pod unprepares the claim, which removes the CDI spec.
            pods.delete("with-device", &DeleteParams::default()).await?;
            plugin
                .calls()
                .eventually(|c| c.count(Method::NodeUnprepareResources.succeeded()) >= 1, WAIT)
                .await?;
            assert!(!spec_file.exists(), "CDI spec {} still exists after unprepare", spec_file.display());
            Ok(())
        }
    })
    .await;
    plugin.stop().await;
    slices.delete(&class_name, &DeleteParams::default()).await?;
    classes.delete(&class_name, &DeleteParams::default()).await?;
    let _ = std::fs::remove_dir_all(&plugin_dir);
    result
}
