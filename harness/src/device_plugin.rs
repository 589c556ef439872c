//! Upstream's sample device plugin (k8s.io/kubernetes `test/images/sample-device-plugin`), deployed
//! as a DaemonSet in a spec's namespace, as upstream's `deployDevicePlugin` does for "supports
//! extended resources together with ResourceClaim".
//!
//! The plugin registers with the kubelet's device manager and advertises [`DEVICES`] healthy
//! devices of the extended resource [`RESOURCE_NAME`]; for each device a container gets, its
//! Allocate answers a bind mount of `/tmp/<device ID>` ([`DEVICE_PATHS`]). The name is fixed in
//! the binary, so a spec using it must be `Serial`.
//!
//! [`DevicePlugin::deploy`] waits until no chosen node advertises the resource (an earlier
//! plugin's count can linger in the node's status for the kubelet's 10 s status period), creates
//! the DaemonSet from [`crate::manifests::SAMPLE_DEVICE_PLUGIN`] (namespace replaced, required
//! node affinity on the chosen nodes), registers its removal as a cleanup at once, and waits
//! until every chosen node advertises the devices as allocatable. The
//! cleanup ([`DevicePlugin::undeploy`]) deletes the DaemonSet, waits until its pods are gone and
//! until no chosen node advertises the resource as allocatable any more. Deploy after
//! [`crate::builder::Builder::start`], so that this cleanup runs before the builder's teardown
//! (cleanups run last registered first), as upstream's order is.

use std::time::Duration;

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Node, NodeAffinity, Pod},
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use serde_json::json;

use crate::{
    builder::{POD_DELETE_TIMEOUT, POD_START_TIMEOUT},
    framework::Ctx,
    manifests::{ManifestError, sample_device_plugin},
    wait::{self, Verdict, WaitError},
};

/// The extended resource the plugin advertises (fixed in the binary).
pub const RESOURCE_NAME: &str = "example.com/resource";
/// How many devices of [`RESOURCE_NAME`] it advertises per node (`Dev-1`, `Dev-2`).
pub const DEVICES: i64 = 2;
/// What its Allocate mounts into a container for each device it gets: `/tmp/<device ID>`, at the
/// same path on the host (where the container runtime creates it when it is missing).
pub const DEVICE_PATHS: [&str; 2] = ["/tmp/Dev-1", "/tmp/Dev-2"];
/// The label of the DaemonSet and its pods.
pub const APP_LABEL: (&str, &str) = ("k8s-app", "sample-device-plugin");
/// How long the kubelet may take to advertise the devices, or to stop advertising them
/// (upstream's `f.Timeouts.PodStart`).
pub const ADVERTISE_TIMEOUT: Duration = POD_START_TIMEOUT;
/// How long the whole removal may take: the pods to be gone, then the allocatable count to drop.
pub const UNDEPLOY_TIMEOUT: Duration =
    Duration::from_secs(POD_DELETE_TIMEOUT.as_secs() + ADVERTISE_TIMEOUT.as_secs() + 30);

/// Errors of deploying and removing the plugin.
#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    /// The embedded manifest is broken.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was attempted.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A wait failed; `pods` describes the plugin's pods at that moment.
    #[error("{source}\nsample device plugin pods: {pods}")]
    Wait {
        /// The wait's error (what it waited for and what it saw last).
        #[source]
        source: WaitError,
        /// The plugin's pods (phase, container states).
        pods: String,
    },
}

/// The DaemonSet for `namespace`, running only on `nodes`.
pub fn daemonset(namespace: &str, nodes: &[String]) -> Result<DaemonSet, ManifestError> {
    let mut ds = sample_device_plugin(namespace)?;
    let affinity: NodeAffinity = serde_json::from_value(json!({
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{
                "matchExpressions": [{
                    "key": "kubernetes.io/hostname",
                    "operator": "In",
                    "values": nodes,
                }],
            }],
        },
    }))
    .map_err(|e| ManifestError::Parse { index: 0, kind: "NodeAffinity", reason: e.to_string() })?;
    let pod = ds.spec.template.spec.as_mut().ok_or_else(|| ManifestError::Parse {
        index: 0,
        kind: "DaemonSet",
        reason: "no pod template spec".to_owned(),
    })?;
    pod.affinity.get_or_insert_with(Default::default).node_affinity = Some(affinity);
    Ok(ds)
}

/// How many devices of [`RESOURCE_NAME`] the node advertises as allocatable (0 when it advertises
/// none, or a value that is not a plain count).
pub fn allocatable(node: &Node) -> i64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(RESOURCE_NAME))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

/// The sample device plugin deployed on some nodes.
#[derive(Clone)]
pub struct DevicePlugin {
    client: kube::Client,
    namespace: String,
    name: String,
    nodes: Vec<String>,
}

impl std::fmt::Debug for DevicePlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePlugin")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl DevicePlugin {
    /// Upstream's `deployDevicePlugin`: creates the DaemonSet in the spec's namespace for `nodes`,
    /// registers [`DevicePlugin::undeploy`] as a cleanup, and waits until each node advertises
    /// [`DEVICES`] allocatable devices of [`RESOURCE_NAME`]. Beyond upstream, each node must first
    /// advertise none, so that the count it waits for is this plugin's, not an earlier one's.
    pub async fn deploy(ctx: &Ctx, nodes: &[String]) -> Result<Self, DevicePluginError> {
        let ds = daemonset(ctx.namespace(), nodes)?;
        let api: Api<DaemonSet> = Api::namespaced(ctx.client().clone(), ctx.namespace());
        let mut plugin = DevicePlugin {
            client: ctx.client().clone(),
            namespace: ctx.namespace().to_owned(),
            name: ds.name_any(),
            nodes: nodes.to_vec(),
        };
        // An earlier plugin's devices may still be in the node's status: the kubelet writes it
        // every 10 s, so a node can advertise devices its device manager no longer has. A count
        // read before this plugin runs would be that stale one, and a pod admitted on it fails
        // ("no healthy devices present"); so the count must be 0 first.
        for node in nodes {
            plugin
                .wait_allocatable(
                    node,
                    format!("node {node} to advertise no {RESOURCE_NAME} before the plugin is deployed"),
                    |n| n == 0,
                )
                .await?;
        }
        let created = api.create(&PostParams::default(), &ds).await.map_err(|source| {
            DevicePluginError::Api { what: format!("create DaemonSet {}", ds.name_any()), source }
        })?;
        plugin.name = created.name_any();
        tracing::info!(daemonset = %plugin.name, nodes = ?nodes, "deployed the sample device plugin");
        let cleanup = plugin.clone();
        ctx.defer_with_timeout("undeploy the sample device plugin", UNDEPLOY_TIMEOUT, async move {
            cleanup.undeploy().await?;
            Ok(())
        });
        for node in nodes {
            plugin
                .wait_allocatable(
                    node,
                    format!("node {node} to advertise {DEVICES} allocatable {RESOURCE_NAME}"),
                    |n| n == DEVICES,
                )
                .await?;
        }
        Ok(plugin)
    }

    /// The extended resource the plugin advertises.
    pub fn resource_name(&self) -> &'static str {
        RESOURCE_NAME
    }

    /// The nodes it runs on.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Upstream's `undeployDevicePlugin`: deletes the DaemonSet (already gone is fine), waits
    /// until its pods are gone, then until no node of it advertises the resource as allocatable
    /// (the kubelet marks the devices unhealthy once the plugin's socket is gone).
    pub async fn undeploy(&self) -> Result<(), DevicePluginError> {
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.namespace);
        match api.delete(&self.name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(DevicePluginError::Api {
                    what: format!("delete DaemonSet {}", self.name),
                    source,
                });
            }
        }
        let pods = self.pods_api();
        let selector = format!("{}={}", APP_LABEL.0, APP_LABEL.1);
        let gone = wait::objects(
            &pods,
            watcher::Config::default().labels(&selector),
            format!("the pods of DaemonSet {} to be gone", self.name),
            POD_DELETE_TIMEOUT,
            |p| Verdict::done_if(p.is_empty()),
        )
        .await;
        if let Err(source) = gone {
            return Err(DevicePluginError::Wait { source, pods: self.describe_pods().await });
        }
        // Said in the log, so that a clean-up bound that cuts the wait shows which one it cut.
        tracing::info!(daemonset = %self.name, nodes = ?self.nodes, "the plugin's pods are gone; waiting for the nodes to advertise no {RESOURCE_NAME}");
        for node in &self.nodes {
            self.wait_allocatable(
                node,
                format!("node {node} to advertise no allocatable {RESOURCE_NAME} after the plugin is gone"),
                |n| n == 0,
            )
            .await?;
        }
        tracing::info!(daemonset = %self.name, "removed the sample device plugin");
        Ok(())
    }

    /// Watches the node until its allocatable count of [`RESOURCE_NAME`] satisfies `want`.
    async fn wait_allocatable(
        &self,
        node: &str,
        what: String,
        want: impl Fn(i64) -> bool,
    ) -> Result<(), DevicePluginError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let result = wait::object(&nodes, node, what, ADVERTISE_TIMEOUT, |n| match n {
            Some(n) => Verdict::done_if(want(allocatable(n))),
            None => Verdict::Fail(format!("node {node} does not exist")),
        })
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(source) => Err(DevicePluginError::Wait { source, pods: self.describe_pods().await }),
        }
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// One line per pod of the plugin: name, node, phase and each container's state.
    async fn describe_pods(&self) -> String {
        let selector = format!("{}={}", APP_LABEL.0, APP_LABEL.1);
        match self.pods_api().list(&ListParams::default().labels(&selector)).await {
            Ok(list) if list.items.is_empty() => "none".to_owned(),
            Ok(list) => list.items.iter().map(describe_pod).collect::<Vec<_>>().join("; "),
            Err(e) => format!("cannot list them: {e}"),
        }
    }
}

/// `name on node: phase, container: state (restarts)`.
fn describe_pod(pod: &Pod) -> String {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "no node".to_owned());
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "no phase".to_owned());
    let containers: Vec<String> = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            let state = c.state.as_ref();
            let state = if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
                format!(
                    "waiting ({}: {})",
                    w.reason.as_deref().unwrap_or_default(),
                    w.message.as_deref().unwrap_or_default()
                )
            } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
                format!("terminated (exit code {}, {})", t.exit_code, t.reason.as_deref().unwrap_or_default())
            } else if state.and_then(|s| s.running.as_ref()).is_some() {
                "running".to_owned()
            } else {
                "unknown".to_owned()
            };
            format!("{}: {state}, {} restarts", c.name, c.restart_count)
        })
        .collect();
    format!("{} on {node}: {phase}, {}", pod.name_any(), containers.join(", "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn daemonset_runs_upstreams_plugin_on_the_chosen_nodes() {
        let nodes = vec!["n1".to_owned()];
        let ds = daemonset("ns-1", &nodes).unwrap();
        assert_eq!(ds.metadata.namespace.as_deref(), Some("ns-1"));
        assert_eq!(ds.labels().get(APP_LABEL.0).map(String::as_str), Some(APP_LABEL.1));
        let spec = &ds.spec;
        let selector = spec.selector.match_labels.as_ref().unwrap();
        assert_eq!(selector.get(APP_LABEL.0).map(String::as_str), Some(APP_LABEL.1));
        let template_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(template_labels.get(APP_LABEL.0).map(String::as_str), Some(APP_LABEL.1));
        let pod = spec.template.spec.as_ref().unwrap();
        let terms = &pod
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        let expr = &terms[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (expr.key.as_str(), expr.operator.as_str(), expr.values.as_deref()),
            ("kubernetes.io/hostname", "In", Some(&nodes[..]))
        );
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.k8s.io/e2e-test-images/sample-device-plugin:1.8.0"));
        assert!(c.security_context.as_ref().unwrap().privileged.unwrap());
        let env: Vec<_> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
            .collect();
        assert_eq!(env, [("PLUGIN_SOCK_DIR", "/var/lib/kubelet/device-plugins")]);
        let mounts: Vec<_> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        let volumes: Vec<_> = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| (v.name.as_str(), v.host_path.as_ref().unwrap().path.as_str()))
            .collect();
        // Every host path is mounted at the same path inside.
        assert_eq!(mounts, volumes);
        assert!(mounts.contains(&("device-plugins", "/var/lib/kubelet/device-plugins")), "{mounts:?}");
        assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    }

    #[test]
    fn allocatable_counts_the_extended_resource() {
        let node = |allocatable: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"allocatable": allocatable}}))
                .unwrap()
        };
        assert_eq!(allocatable(&node(json!({"cpu": "2", "example.com/resource": "2"}))), 2);
        assert_eq!(allocatable(&node(json!({"example.com/resource": "0"}))), 0);
        assert_eq!(allocatable(&node(json!({"cpu": "2"}))), 0);
        assert_eq!(allocatable(&Node::default()), 0);
    }

    #[test]
    fn pods_are_described_with_their_container_states() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}},
            }]},
        }))
        .unwrap();
        assert_eq!(
            describe_pod(&pod),
            "p on n1: Pending, c: waiting (ErrImageNeverPull: not present), 0 restarts"
        );
    }
}
