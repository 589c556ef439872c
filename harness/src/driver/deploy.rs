//! The objects a driver deploys: the proxy ReplicaSet (created, awaited, scaled down), objects
//! deleted at cleanup, and its ResourceSlices' removal.

use std::{collections::BTreeMap, fmt, time::Duration};

use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod, resource::v1::ResourceSlice};
use kube::{
    Api, Resource,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use super::{
    config::DriverConfig,
    error::{DriverError, api_error},
    nodes::Nodes,
    proxy,
};
use crate::{
    framework::Ctx,
    manifests::INSTANCE_LABEL,
    wait::{self, Verdict, WaitError},
};

/// How long the proxy pods may take to become available.
pub const PROXY_START_TIMEOUT: Duration = Duration::from_secs(300);

/// Creates an object and registers its deletion (waiting until it is gone) on `ctx`.
pub(super) async fn create_with_cleanup<K>(ctx: &Ctx, api: Api<K>, obj: &K) -> Result<K, DriverError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let name = obj.meta().name.clone().unwrap_or_default();
    let created = api
        .create(&PostParams { field_manager: Some("dra-e2e".into()), ..Default::default() }, obj)
        .await
        .map_err(api_error(format!("create {kind} {name}")))?;
    ctx.delete_at_cleanup(api, name);
    Ok(created)
}

/// A random UID-shaped string (for plugin identities without a pod).
pub(super) fn random_uid() -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    let b: [u8; 16] = rng.random();
    let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// The longest `generateName` the API server uses as is: it cuts a longer one to 58 characters
/// (63 less its 5 random ones) before appending the random suffix
/// (k8s.io/apiserver/pkg/storage/names). With kind's node names under a cluster name
/// (`dra-e2e-worker`), `00000-<driver>-<node>-` is longer than that.
const MAX_GENERATED_NAME_BASE: usize = 58;

/// The part of `generate_name` a name the API server generated from it starts with.
pub fn generated_name_base(generate_name: &str) -> &str {
    match generate_name.char_indices().nth(MAX_GENERATED_NAME_BASE) {
        Some((end, _)) => &generate_name[..end],
        None => generate_name,
    }
}

/// Whether a stored slice has the content a plugin would publish (`driver`, `nodeName`, pool and
/// devices as in `desired`).
pub(super) fn same_slice_content(stored: &ResourceSlice, desired: &ResourceSlice) -> bool {
    let (a, b) = (&stored.spec, &desired.spec);
    a.driver == b.driver
        && a.node_name == b.node_name
        && a.pool.name == b.pool.name
        && a.pool.resource_slice_count == b.pool.resource_slice_count
        && serde_json::to_value(&a.devices).ok() == serde_json::to_value(&b.devices).ok()
        && serde_json::to_value(&a.shared_counters).ok() == serde_json::to_value(&b.shared_counters).ok()
        && a.skip_node_operations == b.skip_node_operations
        && desired.metadata.generate_name.as_deref().is_some_and(|prefix| {
            stored.metadata.name.as_deref().unwrap_or_default().starts_with(generated_name_base(prefix))
        })
}

pub(super) async fn wait_slices_gone(
    api: &Api<ResourceSlice>,
    driver: &str,
    timeout: Duration,
) -> Result<(), WaitError> {
    tracing::info!(driver, "waiting for the driver's ResourceSlices to be removed");
    wait::objects(
        api,
        watcher::Config::default().fields(&format!("spec.driver={driver}")),
        format!("every ResourceSlice of driver {driver} to be removed"),
        timeout,
        |slices| Verdict::done_if(slices.is_empty()),
    )
    .await
    .map(|_| ())
}

/// Creates the proxy ReplicaSet, registers its scale-down, waits for its pods and returns them
/// by node.
#[allow(clippy::too_many_arguments)]
pub(super) async fn deploy_proxy(
    ctx: &Ctx,
    admin: &kube::Client,
    namespace: &str,
    driver: &str,
    rs_name: &str,
    nodes: &Nodes,
    config: &DriverConfig,
    service_account: &str,
) -> Result<BTreeMap<String, Pod>, DriverError> {
    let instance = format!("{driver}{}", config.instance_suffix);
    let rs = proxy::replicaset(&proxy::ProxyParams {
        name_suffix: &format!("{}{}", config.name_suffix, config.instance_suffix),
        instance: &instance,
        driver,
        nodes: nodes.names(),
        service_account,
        image: &config.image,
        kubelet_root_dir: &config.kubelet_root_dir,
    })?;
    let rs_api: Api<ReplicaSet> = Api::namespaced(admin.clone(), namespace);
    rs_api
        .create(&PostParams::default(), &rs)
        .await
        .map_err(api_error(format!("create the proxy ReplicaSet {rs_name}")))?;
    {
        let rs_api = rs_api.clone();
        let rs_name = rs_name.to_owned();
        let driver = driver.to_owned();
        ctx.defer_with_timeout(
            format!("scale the proxy pods of driver {driver} down to zero"),
            PROXY_START_TIMEOUT,
            async move {
                scale_proxy_down(&rs_api, &rs_name, &driver).await?;
                Ok(())
            },
        );
    }
    let want = i32::try_from(nodes.len()).unwrap_or(i32::MAX);
    let timeout = PROXY_START_TIMEOUT.min(ctx.remaining());
    wait::object(
        &rs_api,
        rs_name,
        format!("{want} available proxy pods of driver {driver}"),
        timeout,
        |rs| Verdict::done_if(rs.is_some_and(|rs| available_replicas(rs) >= want)),
    )
    .await?;
    let pods = Api::<Pod>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
        .map_err(api_error(format!("list the proxy pods of driver {driver}")))?;
    let by_node: BTreeMap<String, Pod> = pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()).map(|n| (n, p)))
        .collect();
    if by_node.keys().map(String::as_str).ne(nodes.names().iter().map(String::as_str)) {
        return Err(DriverError::ProxyPods {
            driver: driver.to_owned(),
            expected: nodes.names().to_vec(),
            found: by_node.keys().cloned().collect(),
        });
    }
    Ok(by_node)
}

/// Scales the proxy ReplicaSet to zero and waits until it has no available replica (a missing
/// ReplicaSet is fine).
pub(super) async fn scale_proxy_down(
    rs_api: &Api<ReplicaSet>,
    rs_name: &str,
    driver: &str,
) -> Result<(), DriverError> {
    let scale = Patch::Merge(json!({"spec": {"replicas": 0}}));
    match rs_api.patch(rs_name, &PatchParams::default(), &scale).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(api_error(format!("scale the proxy ReplicaSet {rs_name} down"))(e)),
    }
    wait::object(
        rs_api,
        rs_name,
        format!("ReplicaSet {rs_name} of driver {driver} to have no available replicas"),
        PROXY_START_TIMEOUT - Duration::from_secs(10),
        |rs| Verdict::done_if(rs.is_none_or(|rs| available_replicas(rs) == 0)),
    )
    .await?;
    Ok(())
}

/// Where the proxy pods of a node come from: the pods of a ReplicaSet (a driver's own, or the
/// run's shared one of the node), found by its label selector.
#[derive(Clone)]
pub(super) struct ProxyPods {
    /// The ReplicaSet's namespace.
    pub(super) api: Api<Pod>,
    /// Its pods' label selector.
    pub(super) selector: String,
}

impl ProxyPods {
    /// Waits up to `timeout` for a pod of this ReplicaSet on `node` that runs, is ready, is not
    /// being deleted and is not `except` (a lost pod's UID), and returns it: at once when there
    /// is one already.
    pub(super) async fn ready_on(
        &self,
        node: &str,
        except: Option<&str>,
        what: String,
        timeout: Duration,
    ) -> Result<Pod, WaitError> {
        let config = watcher::Config::default().labels(&self.selector);
        let pods = wait::objects(&self.api, config, what.clone(), timeout, |pods| {
            Verdict::done_if(pods.iter().any(|p| is_ready_on(p, node, except)))
        })
        .await?;
        pods.into_iter().find(|p| is_ready_on(p, node, except)).ok_or_else(|| WaitError::Failed {
            what,
            reason: "the wait ended without one".to_owned(),
            last: String::new(),
        })
    }
}

/// Whether `pod` may serve a plugin on `node` in place of the pod with UID `except`: another
/// pod, on that node, not being deleted, running and ready.
pub(super) fn is_ready_on(pod: &Pod, node: &str, except: Option<&str>) -> bool {
    (except.is_none() || pod.metadata.uid.as_deref() != except)
        && pod.metadata.deletion_timestamp.is_none()
        && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
        && is_running_and_ready(pod)
}

/// Whether `pod` runs (phase `Running`) and is ready (condition `Ready`).
pub(super) fn is_running_and_ready(pod: &Pod) -> bool {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && ready
}

pub(super) fn available_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodSpec, PodStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn pod(uid: &str, node: &str, phase: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta { uid: Some(uid.into()), ..Default::default() },
            spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_proxy_pod_serves_when_it_is_another_ready_running_pod_on_the_node() {
        assert!(is_ready_on(&pod("new", "n1", "Running", true), "n1", Some("old")));
        assert!(is_ready_on(&pod("old", "n1", "Running", true), "n1", None), "no pod lost");
        assert!(!is_ready_on(&pod("old", "n1", "Running", true), "n1", Some("old")));
        assert!(!is_ready_on(&pod("new", "n2", "Running", true), "n1", Some("old")));
        assert!(!is_ready_on(&pod("new", "n1", "Pending", false), "n1", Some("old")));
        assert!(!is_ready_on(&pod("new", "n1", "Running", false), "n1", Some("old")));
        let mut deleting = pod("new", "n1", "Running", true);
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!is_ready_on(&deleting, "n1", None));
    }

    #[test]
    fn random_uids_look_like_uids() {
        let uid = random_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(uid.matches('-').count(), 4);
        assert_ne!(uid, random_uid());
    }

    #[test]
    fn a_long_generate_name_is_matched_as_the_api_server_cut_it() {
        // The name a kind API server gave a slice of node dra-e2e-worker (its generateName is
        // 59 characters; the trailing '-' was cut).
        let prefix = "00000-dra-sequential-update-wi-p68xx.k8s.io-dra-e2e-worker-";
        let stored = "00000-dra-sequential-update-wi-p68xx.k8s.io-dra-e2e-worker4s57j";
        assert_eq!(prefix.len(), 59);
        assert!(stored.starts_with(generated_name_base(prefix)));
        assert_eq!(generated_name_base("00000-d.k8s.io-kind-worker-"), "00000-d.k8s.io-kind-worker-");
    }
}
