//! What `deploy` and `remove` wait for: the DaemonSet's pods of this deployment all ready, each
//! served node's ResourceSlice published after its pod started (the driver publishes only once
//! the kubelet registered it), and after `remove`, no pod, slice or namespace left.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Namespace, Pod},
        resource::v1::ResourceSlice,
    },
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams},
};

use super::{DAEMONSET, DRIVER_NAME, NAMESPACE, manifest::IMAGE_ANNOTATION, slice_name};
use crate::wait::{Probe, poll_until};

/// How often the waits look.
const INTERVAL: Duration = Duration::from_secs(1);

/// The label the DaemonSet's pods carry.
const POD_SELECTOR: &str = "app.kubernetes.io/name=example-driver";

/// A node the driver runs on, and when its pod started.
#[derive(Debug, Clone)]
pub struct Served {
    /// The node.
    pub node: String,
    /// The pod's start time.
    pub started: Time,
}

/// Whether `pod` is ready and of this deployment (its args and image digest).
fn current_and_ready(pod: &Pod, args: &[String], digest: &str) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let same_image = annotations.and_then(|a| a.get(IMAGE_ANNOTATION)).is_some_and(|d| d == digest);
    let same_args = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.args.as_ref())
        .is_some_and(|a| a == args);
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    pod.metadata.deletion_timestamp.is_none() && same_image && same_args && ready
}

/// Waits until the DaemonSet schedules at least one pod and every pod of it is one of this
/// deployment (`args`, `digest`) and ready, with no old pod left; returns the served nodes.
pub async fn daemonset_ready(
    client: &Client,
    args: &[String],
    digest: &str,
    timeout: Duration,
) -> Result<Vec<Served>> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let what =
        format!("DaemonSet {NAMESPACE}/{DAEMONSET} to run a ready pod of this deployment on every worker");
    poll_until(&what, timeout, INTERVAL, || async {
        let ds = daemonsets.get(DAEMONSET).await?;
        let desired = ds.status.as_ref().map_or(0, |s| s.desired_number_scheduled);
        let observed = ds.status.as_ref().and_then(|s| s.observed_generation);
        if desired == 0 || observed < ds.metadata.generation {
            return Ok(Probe::Pending(format!("{desired} pods desired, generation {observed:?} observed")));
        }
        let list = pods.list(&ListParams::default().labels(POD_SELECTOR)).await?;
        let current: Vec<&Pod> = list.items.iter().filter(|p| current_and_ready(p, args, digest)).collect();
        if current.len() != list.items.len() || current.len() != desired as usize {
            let states: Vec<String> = list.items.iter().map(pod_state).collect();
            return Ok(Probe::Pending(format!(
                "{} of {desired} pods current and ready: {}",
                current.len(),
                states.join("; ")
            )));
        }
        let served = current
            .iter()
            .filter_map(|p| {
                let node = p.spec.as_ref()?.node_name.clone()?;
                let started = p.status.as_ref()?.start_time.clone()?;
                Some(Served { node, started })
            })
            .collect();
        Ok(Probe::Done(served))
    })
    .await
}

/// One pod in a few words: name, node, phase, and a waiting container's reason.
fn pod_state(pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("unscheduled");
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("?");
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone());
    let deleting = if pod.metadata.deletion_timestamp.is_some() { ", terminating" } else { "" };
    match waiting {
        Some(reason) => format!("{name} on {node}: {phase} ({reason}){deleting}"),
        None => format!("{name} on {node}: {phase}{deleting}"),
    }
}

/// Waits until each served node has the driver's ResourceSlice, created after its pod started:
/// the driver publishes only after the kubelet registered it, so this also says it is registered.
pub async fn slices_published(client: &Client, served: &[Served], timeout: Duration) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let nodes: Vec<&str> = served.iter().map(|s| s.node.as_str()).collect();
    let what = format!("the driver to register and publish its ResourceSlice on {}", nodes.join(", "));
    poll_until(&what, timeout, INTERVAL, || async {
        let mut missing = Vec::new();
        for s in served {
            let fresh = slices.get_opt(&slice_name(&s.node)).await?.is_some_and(|slice| {
                slice.metadata.deletion_timestamp.is_none()
                    && slice.metadata.creation_timestamp.is_some_and(|created| created.0 >= s.started.0)
            });
            if !fresh {
                missing.push(s.node.as_str());
            }
        }
        Ok(if missing.is_empty() {
            Probe::Done(())
        } else {
            Probe::Pending(format!("no slice (published after the pod started) for {}", missing.join(", ")))
        })
    })
    .await
}

/// Waits until `node` has the driver's slice.
pub async fn slice_back(client: &Client, node: &str, timeout: Duration) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice_name(node);
    let what = format!("the example driver to publish ResourceSlice {name} again");
    poll_until(&what, timeout, INTERVAL, || async {
        Ok(match slices.get_opt(&name).await? {
            Some(slice) if slice.metadata.deletion_timestamp.is_some() => {
                Probe::Pending("being deleted".into())
            }
            Some(_) => Probe::Done(()),
            None => Probe::Pending("no slice".into()),
        })
    })
    .await
}

/// Waits until no pod of the driver is left.
pub async fn pods_gone(client: &Client, timeout: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    poll_until(&format!("the example driver's pods in {NAMESPACE} to be gone"), timeout, INTERVAL, || async {
        let list = pods.list(&ListParams::default().labels(POD_SELECTOR)).await?;
        Ok(if list.items.is_empty() {
            Probe::Done(())
        } else {
            Probe::Pending(list.items.iter().map(pod_state).collect::<Vec<_>>().join("; "))
        })
    })
    .await
}

/// Deletes the slices of the driver its pods left behind and waits until none is left.
pub async fn slices_gone(client: &Client, timeout: Duration) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let of_driver = ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}"));
    let what = format!("the ResourceSlices of {DRIVER_NAME} to be gone");
    poll_until(&what, timeout, INTERVAL, || async {
        let list = slices.list(&of_driver).await?;
        if list.items.is_empty() {
            return Ok(Probe::Done(()));
        }
        let names: Vec<String> = list.items.iter().filter_map(|s| s.metadata.name.clone()).collect();
        for name in &names {
            match slices.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Probe::Pending(format!("left: {}", names.join(", "))))
    })
    .await
}

/// Waits until the driver's namespace is gone.
pub async fn namespace_gone(client: &Client, timeout: Duration) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    poll_until(&format!("namespace {NAMESPACE} to be gone"), timeout, INTERVAL, || async {
        Ok(match namespaces.get_opt(NAMESPACE).await? {
            Some(_) => Probe::Pending("still there".into()),
            None => Probe::Done(()),
        })
    })
    .await
}
