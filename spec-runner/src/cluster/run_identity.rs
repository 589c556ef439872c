//! A run's identity: every object the run creates carries the label [`RUN_LABEL`]`=<run id>`,
//! and the run holds a Lease ([`RunLease`]) that it renews while it lives.
//!
//! The label is stamped in one place, the clients of the run: [`stamp`] wraps a client so that
//! every create (a POST to a collection, namespaced or cluster-scoped) gets the label in its
//! body's `metadata.labels`. Everything derived from those clients (impersonated clients, the
//! driver, its kubelet plugins and ResourceSlice publishing) stamps its objects too, and no
//! object maker needs to know. Subresource POSTs (eviction, binding, exec, tokens) and updates
//! are left as they are: an update keeps the labels of the stored object it came from, and an
//! update never adds the label to someone else's object (a node, say).
//!
//! The Lease `kube-system/dra-e2e-run-<run id>` lasts [`LEASE_DURATION`] (30 s) and is renewed
//! every [`RENEW_EVERY`] (10 s), so a run SIGKILLed (or whose machine went away) is taken for
//! gone 30 s after its last renewal; a run whose API server does not answer for 30 s may be
//! taken for gone too (it logs each failed renewal). On a clean exit the Lease is deleted. The
//! Lease also names its holder process ([`crate::cluster::holder`]): a run on the same machine
//! takes a run whose process is gone for gone at once, without waiting for the Lease.
//! [`crate::cluster::leftovers`] finds and removes the objects of runs whose Lease expired or is gone.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
    client::Body,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cluster::holder::{HOLDER_ANNOTATION, Holder};

/// Label on every namespace the runner creates and on the run's Lease.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "dra-e2e");
/// The label with the run id on every object a run creates.
pub const RUN_LABEL: &str = "dra-e2e.k8s.io/run";
/// Where the runs' Leases live.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// A run's Lease is `<LEASE_PREFIX><run id>`.
pub const LEASE_PREFIX: &str = "dra-e2e-run-";
/// A run whose Lease was not renewed for this long is gone.
pub const LEASE_DURATION: Duration = Duration::from_secs(30);
/// How often a live run renews its Lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Annotation on a run's Lease: who ran it (pid, host, start time, arguments), for reports.
pub const RUN_INFO_ANNOTATION: &str = "dra-e2e.k8s.io/run-info";

/// A new run id: `YYYYMMDD-HHMMSS-` and 6 random characters (a valid label value, sorts by start).
pub fn new_run_id() -> String {
    let now = Timestamp::now().strftime("%Y%m%d-%H%M%S");
    let suffix = crate::names::unique_suffix();
    format!("{now}-{}", &suffix[..6])
}

/// The name of run `run_id`'s Lease.
pub fn lease_name(run_id: &str) -> String {
    format!("{LEASE_PREFIX}{run_id}")
}

/// `client`, with every create stamped with `RUN_LABEL=run_id` (see the module docs).
pub fn stamp(client: Client, run_id: &str) -> Client {
    let run_id = run_id.to_owned();
    let default_namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let inner = client.clone();
        let run_id = run_id.clone();
        async move {
            let request = if request.method() == http::Method::POST && is_collection(request.uri().path()) {
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await?.to_bytes();
                let bytes = stamp_body(&bytes, &run_id).map_or(bytes, Bytes::from);
                http::Request::from_parts(parts, Body::from(bytes))
            } else {
                request
            };
            inner.send(request).await
        }
    });
    Client::new(service, &default_namespace)
}

/// Whether `path` is a collection (`/api/v1/pods`, `/apis/g/v/namespaces/ns/things`), not an
/// object or one of its subresources.
pub(crate) fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        _ => return false,
    };
    matches!(rest, [_resource] | ["namespaces", _, _resource])
}

/// The JSON object `body` with `metadata.labels[RUN_LABEL] = run_id`; `None` when the body is
/// not a JSON object (left as it is).
fn stamp_body(body: &[u8], run_id: &str) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    add_label(&mut value, RUN_LABEL, run_id)?;
    serde_json::to_vec(&value).ok()
}

/// Sets `metadata.labels[key] = value` in the JSON object `object`; `None` when it is not an
/// object (or its metadata or labels are not).
pub(crate) fn add_label(object: &mut serde_json::Value, key: &str, value: &str) -> Option<()> {
    let metadata = object.as_object_mut()?.entry("metadata").or_insert_with(|| serde_json::json!({}));
    let labels = metadata.as_object_mut()?.entry("labels").or_insert_with(|| serde_json::json!({}));
    if labels.is_null() {
        *labels = serde_json::json!({});
    }
    labels.as_object_mut()?.insert(key.to_owned(), value.into());
    Some(())
}

/// The Lease of a live run; renewed until [`RunLease::release`] (or the process ends).
pub struct RunLease {
    run_id: String,
    api: Api<Lease>,
    stop: CancellationToken,
    renewal: JoinHandle<()>,
}

impl RunLease {
    /// Creates the Lease of `run_id` (with `info` in its [`RUN_INFO_ANNOTATION`]) and starts
    /// renewing it every [`RENEW_EVERY`].
    pub async fn acquire(client: Client, run_id: &str, info: &str) -> Result<Self, kube::Error> {
        let api = Api::<Lease>::namespaced(client, LEASE_NAMESPACE);
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(run_id)),
                labels: Some(
                    [(RUN_LABEL, run_id), MANAGED_BY_LABEL]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                ),
                annotations: Some(
                    std::iter::once((RUN_INFO_ANNOTATION.to_owned(), info.to_owned()))
                        .chain(Holder::current().map(|h| (HOLDER_ANNOTATION.to_owned(), h.annotation())))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(run_id.to_owned()),
                lease_duration_seconds: Some(i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(i32::MAX)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        };
        api.create(&PostParams::default(), &lease).await?;
        let stop = CancellationToken::new();
        let renewal = tokio::spawn(renew(api.clone(), lease_name(run_id), stop.clone()));
        Ok(Self { run_id: run_id.to_owned(), api, stop, renewal })
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Stops the renewal and deletes the Lease (the run ended cleanly).
    pub async fn release(self) {
        self.stop.cancel();
        let _ = self.renewal.await;
        let name = lease_name(&self.run_id);
        match tokio::time::timeout(Duration::from_secs(10), self.api.delete(&name, &DeleteParams::default()))
            .await
        {
            Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => {}
            Ok(Err(e)) => tracing::warn!("cannot delete the run's Lease {LEASE_NAMESPACE}/{name}: {e}"),
            Err(_) => tracing::warn!("deleting the run's Lease {LEASE_NAMESPACE}/{name} took over 10s"),
        }
    }
}

/// Sets the Lease's `renewTime` to now every [`RENEW_EVERY`] until `stop`.
async fn renew(api: Api<Lease>, name: String, stop: CancellationToken) {
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let patch = serde_json::json!({ "spec": { "renewTime": MicroTime(Timestamp::now()) } });
        let renewed = tokio::time::timeout(
            RENEW_EVERY,
            api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)),
        )
        .await;
        match renewed {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                "cannot renew the run's Lease {LEASE_NAMESPACE}/{name}: {e}; after {}s without renewal \
                 another run may remove this run's objects",
                LEASE_DURATION.as_secs()
            ),
            Err(_) => tracing::warn!("renewing the run's Lease {LEASE_NAMESPACE}/{name} took over 10s"),
        }
    }
}

/// How long ago `lease` expired at `now` (`None`: it is live). A Lease without a renewal or
/// acquire time counts as expired.
pub fn expired_for(lease: &Lease, now: Timestamp) -> Option<Duration> {
    let Some(spec) = lease.spec.as_ref() else { return Some(Duration::ZERO) };
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0);
    let secs =
        spec.lease_duration_seconds.map_or(LEASE_DURATION.as_secs(), |s| u64::try_from(s).unwrap_or(0));
    let Some(renewed) = renewed else { return Some(Duration::ZERO) };
    let since = now.duration_since(renewed);
    let since = Duration::try_from(since).unwrap_or(Duration::ZERO);
    since.checked_sub(Duration::from_secs(secs)).filter(|d| !d.is_zero())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn only_collections_are_stamped() {
        assert!(is_collection("/api/v1/namespaces"));
        assert!(is_collection("/api/v1/namespaces/ns/pods"));
        assert!(is_collection("/apis/rbac.authorization.k8s.io/v1/clusterroles"));
        assert!(is_collection("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"));
        assert!(!is_collection("/api/v1/namespaces/ns/pods/p/eviction"));
        assert!(!is_collection("/api/v1/namespaces/ns/serviceaccounts/sa/token"));
        assert!(!is_collection("/api/v1/namespaces/ns/pods/p"));
        assert!(!is_collection("/apis/resource.k8s.io/v1/deviceclasses/c/status"));
        assert!(!is_collection("/version"));
    }

    #[test]
    fn stamping_adds_the_label_and_keeps_the_rest() {
        let body = br#"{"kind":"ClusterRole","metadata":{"name":"r","labels":{"a":"b"}},"rules":[]}"#;
        let stamped: serde_json::Value = serde_json::from_slice(&stamp_body(body, "id1").unwrap()).unwrap();
        assert_eq!(stamped["metadata"]["labels"]["a"], "b");
        assert_eq!(stamped["metadata"]["labels"][RUN_LABEL], "id1");
        assert_eq!(stamped["metadata"]["name"], "r");
        assert_eq!(stamped["rules"], serde_json::json!([]));
        let bare: serde_json::Value =
            serde_json::from_slice(&stamp_body(br#"{"metadata":{"labels":null}}"#, "x").unwrap()).unwrap();
        assert_eq!(bare["metadata"]["labels"][RUN_LABEL], "x");
        assert_eq!(stamp_body(b"not json", "x"), None);
        assert_eq!(stamp_body(b"[1]", "x"), None);
    }

    #[test]
    fn a_run_id_is_a_label_value() {
        let id = new_run_id();
        assert!(id.len() <= 63 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{id}");
        assert_ne!(id, new_run_id());
    }

    #[test]
    fn a_lease_expires_after_its_duration() {
        let now = Timestamp::now();
        let lease = |ago: i64| Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(now - k8s_openapi::jiff::SignedDuration::from_secs(ago))),
                lease_duration_seconds: Some(30),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert_eq!(expired_for(&lease(0), now), None);
        assert_eq!(expired_for(&lease(29), now), None);
        assert_eq!(expired_for(&lease(45), now), Some(Duration::from_secs(15)));
        assert_eq!(expired_for(&Lease::default(), now), Some(Duration::ZERO));
    }

    /// The stamp reaches the wire, for creates only.
    #[tokio::test]
    async fn a_stamped_client_labels_creates_only() {
        use std::sync::{Arc, Mutex};
        let seen: Arc<Mutex<Vec<(String, serde_json::Value)>>> = Arc::default();
        let recorder = seen.clone();
        let fake = Client::new(
            tower::service_fn(move |request: http::Request<Body>| {
                let recorder = recorder.clone();
                async move {
                    let path = request.uri().path().to_owned();
                    let bytes = request.into_body().collect().await.unwrap().to_bytes();
                    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
                    recorder.lock().unwrap().push((path, body.clone()));
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder().status(200).body(Body::from(bytes.to_vec())).unwrap(),
                    )
                }
            }),
            "default",
        );
        let client = stamp(fake, "run1");
        let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, "ns");
        let cm = k8s_openapi::api::core::v1::ConfigMap {
            metadata: ObjectMeta { name: Some("c".into()), ..ObjectMeta::default() },
            ..Default::default()
        };
        api.create(&PostParams::default(), &cm).await.unwrap();
        api.replace("c", &PostParams::default(), &cm).await.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].0, "/api/v1/namespaces/ns/configmaps");
        assert_eq!(seen[0].1["metadata"]["labels"][RUN_LABEL], "run1");
        assert_eq!(seen[1].0, "/api/v1/namespaces/ns/configmaps/c");
        assert!(seen[1].1["metadata"].get("labels").is_none(), "{:?}", seen[1].1);
    }
}
