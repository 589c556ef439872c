//! The proxy pod: which pod a tunnel or exec targets, and noticing that it is gone.

use std::{future::Future, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// How long a pod lookup may take.
const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// A pod as the tunnel and exec code address it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID; when set, a pod of the same name with another UID counts as a replacement.
    pub uid: Option<String>,
    /// The container to exec in (the pod's first container).
    pub container: String,
}

/// The pod object lacks something a [`PodRef`] needs.
#[derive(Debug, thiserror::Error)]
#[error("pod {pod} cannot be used as a proxy pod: {reason}")]
pub struct InvalidPod {
    /// `namespace/name` as far as known.
    pub pod: String,
    /// What is missing.
    pub reason: &'static str,
}

impl PodRef {
    /// Namespace, name, UID and first container of `pod` (as returned by the API server).
    pub fn from_pod(pod: &Pod) -> Result<PodRef, InvalidPod> {
        let meta = &pod.metadata;
        let shown =
            format!("{}/{}", meta.namespace.as_deref().unwrap_or("?"), meta.name.as_deref().unwrap_or("?"));
        let invalid = |reason| InvalidPod { pod: shown.clone(), reason };
        Ok(PodRef {
            namespace: meta.namespace.clone().ok_or_else(|| invalid("no namespace"))?,
            name: meta.name.clone().ok_or_else(|| invalid("no name"))?,
            uid: Some(
                meta.uid
                    .clone()
                    .ok_or_else(|| invalid("no UID (use the object returned by the API server)"))?,
            ),
            container: pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .map(|c| c.name.clone())
                .ok_or_else(|| invalid("no containers"))?,
        })
    }

    /// `namespace/name`.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why `pod` (as currently stored, `None` = not found) no longer is the pod `want` refers to.
pub(crate) fn gone_reason(want: &PodRef, pod: Option<&Pod>) -> Option<String> {
    let Some(pod) = pod else {
        return Some(format!("pod {} was deleted", want.display()));
    };
    if let (Some(want_uid), Some(uid)) = (&want.uid, &pod.metadata.uid)
        && want_uid != uid
    {
        return Some(format!("pod {} was replaced (UID {want_uid} -> {uid})", want.display()));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(format!("pod {} is being deleted", want.display()));
    }
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some(phase @ ("Failed" | "Succeeded")) => Some(format!(
            "pod {} has terminated (phase {phase}{})",
            want.display(),
            pod.status
                .as_ref()
                .and_then(|s| s.reason.as_deref())
                .map(|r| format!(", reason {r}"))
                .unwrap_or_default()
        )),
        _ => container_ended(want, pod),
    }
}

/// Why the container of `want` will not run again although its pod does: it terminated and the
/// pod's `restartPolicy` is `Never` (a container whose start a stopping kubelet cancelled ends
/// so, with `StartError`, while the pod's other containers run on).
fn container_ended(want: &PodRef, pod: &Pod) -> Option<String> {
    let never = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
    let status =
        pod.status.as_ref()?.container_statuses.iter().flatten().find(|c| c.name == want.container)?;
    let terminated = status.state.as_ref()?.terminated.as_ref().filter(|_| never)?;
    Some(format!(
        "container {} of pod {} has terminated (reason {}, exit code {}{}) and restartPolicy Never does not start it again",
        want.container,
        want.display(),
        terminated.reason.as_deref().unwrap_or("unknown"),
        terminated.exit_code,
        terminated.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
    ))
}

/// GETs the pod: `Err(reason)` when it is gone, `Ok` when it is there or the lookup failed
/// (a failed lookup is no proof that the pod is gone).
pub(crate) async fn check_pod(pods: &Api<Pod>, want: &PodRef) -> Result<(), String> {
    match tokio::time::timeout(GET_TIMEOUT, pods.get_opt(&want.name)).await {
        Ok(Ok(pod)) => match gone_reason(want, pod.as_ref()) {
            Some(reason) => Err(reason),
            None => Ok(()),
        },
        Ok(Err(e)) => {
            tracing::debug!(pod = %want.display(), error = %e, "could not look up the pod");
            Ok(())
        }
        Err(_) => {
            tracing::debug!(pod = %want.display(), timeout = ?GET_TIMEOUT, "pod lookup timed out");
            Ok(())
        }
    }
}

/// Watches one pod and reports when it is deleted (or being deleted), replaced by a pod of the
/// same name with another UID, or terminated. Dropping it stops the watch.
#[derive(Debug)]
pub struct PodWatch {
    gone: watch::Receiver<Option<String>>,
    _task: AbortOnDropHandle<()>,
}

impl PodWatch {
    /// Starts watching `pod` (its UID must be set to notice a replacement).
    pub fn start(client: kube::Client, pod: PodRef) -> PodWatch {
        let (tx, rx) = watch::channel(None);
        let api: Api<Pod> = Api::namespaced(client, &pod.namespace);
        let task = tokio::spawn(async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={}", pod.name));
            let mut events = std::pin::pin!(watcher(api, config).default_backoff());
            let mut seen_in_list = false;
            while let Some(event) = events.next().await {
                let reason = match event {
                    Ok(watcher::Event::Init) => {
                        seen_in_list = false;
                        None
                    }
                    Ok(watcher::Event::InitApply(p)) => {
                        seen_in_list |= pod.uid.is_none() || p.metadata.uid == pod.uid;
                        gone_reason(&pod, Some(&p))
                    }
                    Ok(watcher::Event::InitDone) if !seen_in_list => gone_reason(&pod, None),
                    Ok(watcher::Event::InitDone) => None,
                    Ok(watcher::Event::Apply(p)) => gone_reason(&pod, Some(&p)),
                    Ok(watcher::Event::Delete(p)) if pod.uid.is_none() || p.metadata.uid == pod.uid => {
                        gone_reason(&pod, None)
                    }
                    Ok(watcher::Event::Delete(_)) => None,
                    Err(e) => {
                        tracing::debug!(pod = %pod.display(), error = %e, "pod watch failed; retrying");
                        None
                    }
                };
                if let Some(reason) = reason {
                    tracing::info!(pod = %pod.display(), %reason, "proxy pod is gone");
                    tx.send_replace(Some(reason));
                    return;
                }
            }
        });
        PodWatch { gone: rx, _task: AbortOnDropHandle::new(task) }
    }

    /// Why the pod is gone, if it is.
    pub fn is_gone(&self) -> Option<String> {
        self.gone.borrow().clone()
    }

    /// Resolves with the reason once the pod is gone. Stays pending if the watch is dropped
    /// before that.
    pub fn gone(&self) -> impl Future<Output = String> + Send + 'static {
        let mut rx = self.gone.clone();
        async move {
            let reason = rx.wait_for(Option::is_some).await.ok().and_then(|reason| reason.clone());
            match reason {
                Some(reason) => reason,
                None => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{
            Container, ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec, PodStatus,
        },
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn pod(uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("proxy".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container { name: "pause".into(), ..Default::default() }],
                ..Default::default()
            }),
            status: Some(PodStatus { phase: Some("Running".into()), ..Default::default() }),
        }
    }

    #[test]
    fn pod_ref_from_pod() {
        let r = PodRef::from_pod(&pod("u1")).unwrap();
        assert_eq!(
            r,
            PodRef {
                namespace: "ns".into(),
                name: "proxy".into(),
                uid: Some("u1".into()),
                container: "pause".into()
            }
        );
        let mut no_uid = pod("u1");
        no_uid.metadata.uid = None;
        assert!(PodRef::from_pod(&no_uid).unwrap_err().to_string().contains("no UID"));
    }

    #[test]
    fn gone_reasons() {
        let want = PodRef::from_pod(&pod("u1")).unwrap();
        assert_eq!(gone_reason(&want, Some(&pod("u1"))), None);
        assert_eq!(gone_reason(&want, None).unwrap(), "pod ns/proxy was deleted");
        assert!(gone_reason(&want, Some(&pod("u2"))).unwrap().contains("replaced (UID u1 -> u2)"));
        let mut deleting = pod("u1");
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(gone_reason(&want, Some(&deleting)).unwrap().contains("being deleted"));
        let mut failed = pod("u1");
        failed.status = Some(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            ..Default::default()
        });
        assert!(gone_reason(&want, Some(&failed)).unwrap().contains("phase Failed, reason Evicted"));
    }

    /// A pod whose container `c` is in `state`, with `restart_policy`.
    fn with_container(state: ContainerState, restart_policy: &str) -> Pod {
        let mut pod = pod("u1");
        pod.spec = Some(PodSpec { restart_policy: Some(restart_policy.into()), ..Default::default() });
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "c".into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_terminated_container_of_a_never_pod_is_gone_while_its_pod_runs() {
        let mut want = PodRef::from_pod(&pod("u1")).unwrap();
        want.container = "c".into();
        let start_error = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 128,
                reason: Some("StartError".into()),
                message: Some(
                    "failed to create containerd task: failed to get task pid: context canceled".into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let gone = gone_reason(&want, Some(&with_container(start_error.clone(), "Never"))).unwrap();
        assert_eq!(
            gone,
            "container c of pod ns/proxy has terminated (reason StartError, exit code 128: failed to create \
             containerd task: failed to get task pid: context canceled) and restartPolicy Never does not start it again"
        );
        // The kubelet starts it again, or it runs.
        assert_eq!(gone_reason(&want, Some(&with_container(start_error, "Always"))), None);
        let running = ContainerState { running: Some(Default::default()), ..Default::default() };
        assert_eq!(gone_reason(&want, Some(&with_container(running, "Never"))), None);
    }
}
