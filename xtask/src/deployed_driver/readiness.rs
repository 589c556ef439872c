//! What `deploy` and `remove` of a driver wait for: the DaemonSet's pods of this deployment all
//! ready, each served node's ResourceSlice published (by the driver, for that node), and after
//! `remove`, no pod, slice or namespace left.

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

use super::{Deployed, IMAGE_ANNOTATION};
use crate::wait::{Probe, poll_until};

/// How often the waits look.
const INTERVAL: Duration = Duration::from_secs(1);

/// A node the driver runs on: its pod, and when that pod started.
#[derive(Debug, Clone)]
pub struct Served {
    /// The node.
    pub node: String,
    /// The driver's pod on it.
    pub pod: String,
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
    d: &Deployed,
    args: &[String],
    digest: &str,
    timeout: Duration,
) -> Result<Vec<Served>> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), d.namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), d.namespace);
    let what = format!(
        "DaemonSet {}/{} to run a ready pod of this deployment on every worker",
        d.namespace, d.daemonset
    );
    poll_until(&what, timeout, INTERVAL, || async {
        let ds = daemonsets.get(d.daemonset).await?;
        let desired = ds.status.as_ref().map_or(0, |s| s.desired_number_scheduled);
        let observed = ds.status.as_ref().and_then(|s| s.observed_generation);
        if desired == 0 || observed < ds.metadata.generation {
            return Ok(Probe::Pending(format!("{desired} pods desired, generation {observed:?} observed")));
        }
        let list = pods.list(&ListParams::default().labels(d.pod_selector)).await?;
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
                let pod = p.metadata.name.clone()?;
                let started = p.status.as_ref()?.start_time.clone()?;
                Some(Served { node, pod, started })
            })
            .collect();
        Ok(Probe::Done(served))
    })
    .await
}

/// One pod in a few words: name, node, phase, and a waiting container's reason.
pub fn pod_state(pod: &Pod) -> String {
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

/// The driver's slices of `node` that are not being deleted.
async fn slices_of_node(slices: &Api<ResourceSlice>, d: &Deployed, node: &str) -> Result<Vec<ResourceSlice>> {
    let of_node = ListParams::default().fields(&format!("spec.driver={},spec.nodeName={node}", d.driver));
    let list = slices.list(&of_node).await?;
    Ok(list.items.into_iter().filter(|s| s.metadata.deletion_timestamp.is_none()).collect())
}

/// Which slices [`slices_published`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Only slices created after the node's pod started (a driver that publishes only once the
    /// kubelet registered it: such a slice also says it is registered).
    SincePodStart,
    /// Any slice of the node (a driver that keeps the slices an earlier pod published).
    Any,
}

/// Waits until each served node has a ResourceSlice of the driver, as `published` says.
pub async fn slices_published(
    client: &Client,
    d: &Deployed,
    served: &[Served],
    published: Published,
    timeout: Duration,
) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let nodes: Vec<&str> = served.iter().map(|s| s.node.as_str()).collect();
    let what = format!("{} to publish its ResourceSlices on {}", d.what, nodes.join(", "));
    poll_until(&what, timeout, INTERVAL, || async {
        let mut missing = Vec::new();
        for s in served {
            let counted = slices_of_node(&slices, d, &s.node).await?.iter().any(|slice| {
                published == Published::Any
                    || slice.metadata.creation_timestamp.as_ref().is_some_and(|c| c.0 >= s.started.0)
            });
            if !counted {
                missing.push(s.node.as_str());
            }
        }
        let since =
            if published == Published::SincePodStart { " (published after the pod started)" } else { "" };
        Ok(if missing.is_empty() {
            Probe::Done(())
        } else {
            Probe::Pending(format!("no slice{since} for {}", missing.join(", ")))
        })
    })
    .await
}

/// Waits until `node` has a slice of the driver (one there already counts).
pub async fn slice_back(client: &Client, d: &Deployed, node: &str, timeout: Duration) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let what = format!("{} to publish its ResourceSlice of {node} again", d.what);
    poll_until(&what, timeout, INTERVAL, || async {
        Ok(if slices_of_node(&slices, d, node).await?.is_empty() {
            Probe::Pending("no slice (or only one being deleted)".into())
        } else {
            Probe::Done(())
        })
    })
    .await
}

/// Waits until no pod of the driver is left.
pub async fn pods_gone(client: &Client, d: &Deployed, timeout: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), d.namespace);
    let what = format!("{}'s pods in {} to be gone", d.what, d.namespace);
    poll_until(&what, timeout, INTERVAL, || async {
        let list = pods.list(&ListParams::default().labels(d.pod_selector)).await?;
        Ok(if list.items.is_empty() {
            Probe::Done(())
        } else {
            Probe::Pending(list.items.iter().map(pod_state).collect::<Vec<_>>().join("; "))
        })
    })
    .await
}

/// Deletes the slices of the driver its pods left behind and waits until none is left.
pub async fn slices_gone(client: &Client, d: &Deployed, timeout: Duration) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let of_driver = ListParams::default().fields(&format!("spec.driver={}", d.driver));
    let what = format!("the ResourceSlices of {} to be gone", d.driver);
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
pub async fn namespace_gone(client: &Client, d: &Deployed, timeout: Duration) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    poll_until(&format!("namespace {} to be gone", d.namespace), timeout, INTERVAL, || async {
        Ok(match namespaces.get_opt(d.namespace).await? {
            Some(_) => Probe::Pending("still there".into()),
            None => Probe::Done(()),
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(args: &[&str], digest: &str, ready: &str, deleting: bool) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {IMAGE_ANNOTATION: digest}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "args": args}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap();
        if deleting {
            pod.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        pod
    }

    #[test]
    fn only_a_ready_pod_of_this_deployment_is_current() {
        let args = ["--x".to_string()];
        assert!(current_and_ready(&pod(&["--x"], "d1", "True", false), &args, "d1"));
        assert!(!current_and_ready(&pod(&["--x"], "d0", "True", false), &args, "d1"), "an old image");
        assert!(!current_and_ready(&pod(&["--y"], "d1", "True", false), &args, "d1"), "old args");
        assert!(!current_and_ready(&pod(&["--x"], "d1", "False", false), &args, "d1"), "not ready");
        assert!(!current_and_ready(&pod(&["--x"], "d1", "True", true), &args, "d1"), "terminating");
        assert_eq!(pod_state(&pod(&[], "d", "True", true)), "p on n: Running, terminating");
    }
}
