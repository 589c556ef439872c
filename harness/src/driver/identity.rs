//! The identity a node's kubelet plugin acts as: the driver's ServiceAccount bound to the proxy
//! pod the plugin runs in and to its node (see [`Impersonation::kubelet_plugin`]). When the
//! plugin moves to a replacement proxy pod, the identity is bound to the replacement, behind the
//! same client: whoever holds it (the plugin's claim reads, the slice publishing, a spec) acts
//! from then on as the plugin in the replacement pod, as a real driver's new pod would.

use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;

use super::impersonate::{Impersonation, ImpersonationError};

/// The identity of one node's plugin and the client that acts as it.
pub(super) struct PluginIdentity {
    admin: kube::Client,
    namespace: String,
    service_account: String,
    node: String,
    /// The client of the pod the identity is bound to now.
    bound: Arc<Mutex<kube::Client>>,
    /// Sends every request through `bound`.
    client: kube::Client,
}

impl PluginIdentity {
    /// The identity of ServiceAccount `namespace/service_account` bound to pod `pod_name`
    /// (`pod_uid`) on `node`; requests go through `admin`.
    pub(super) fn new(
        admin: &kube::Client,
        namespace: &str,
        service_account: &str,
        node: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<Self, ImpersonationError> {
        let first = Impersonation::kubelet_plugin(namespace, service_account, node, pod_name, pod_uid)
            .client(admin)?;
        let bound = Arc::new(Mutex::new(first));
        let current = bound.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let client = current.lock().unwrap_or_else(PoisonError::into_inner).clone();
            async move { client.send(request).await }
        });
        Ok(PluginIdentity {
            admin: admin.clone(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            node: node.to_owned(),
            bound,
            client: kube::Client::new(service, admin.default_namespace()),
        })
    }

    /// The client that acts as the plugin (in the pod it is bound to at the time of each request).
    pub(super) fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Binds the identity to `pod` (the replacement the plugin moved to).
    pub(super) fn bind(&self, pod: &Pod) -> Result<(), ImpersonationError> {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let client =
            Impersonation::kubelet_plugin(&self.namespace, &self.service_account, &self.node, name, uid)
                .client(&self.admin)?;
        *self.bound.lock().unwrap_or_else(PoisonError::into_inner) = client;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::client::Body;

    use super::*;
    use crate::driver::impersonate::{EXTRA_POD_NAME, EXTRA_POD_UID};

    /// A fake admin client that records the pod extras of the last request it was asked to send.
    fn recording_admin() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let recorder = seen.clone();
        let admin = kube::Client::new(
            tower::service_fn(move |request: Request<Body>| {
                let recorder = recorder.clone();
                async move {
                    let header = |key: &str| {
                        let name = format!("impersonate-extra-{}", key.replace('/', "%2f"));
                        request.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
                    };
                    *recorder.lock().unwrap() = vec![header(EXTRA_POD_NAME), header(EXTRA_POD_UID)];
                    let version = br#"{"major":"1","minor":"37","gitVersion":"v1.37.2","gitCommit":"","gitTreeState":"","buildDate":"2026-01-01T00:00:00Z","goVersion":"","compiler":"","platform":""}"#;
                    Ok::<_, std::convert::Infallible>(
                        Response::builder().status(200).body(Body::from(version.to_vec())).unwrap(),
                    )
                }
            }),
            "default",
        );
        (admin, seen)
    }

    #[tokio::test]
    async fn the_same_client_acts_from_the_replacement_pod_once_bound_to_it() {
        let (admin, seen) = recording_admin();
        let identity = PluginIdentity::new(&admin, "ns", "sa", "node-1", "pod-a", "uid-a").unwrap();
        let client = identity.client().clone();
        client.apiserver_version().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["pod-a", "uid-a"]);
        let replacement = Pod {
            metadata: ObjectMeta {
                name: Some("pod-b".into()),
                uid: Some("uid-b".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        identity.bind(&replacement).unwrap();
        client.apiserver_version().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["pod-b", "uid-b"]);
    }
}
