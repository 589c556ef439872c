//! API clients that act as another user (upstream's `ImpersonateKubeletPlugin`).
//!
//! The impersonation headers come from kube's own `Config.auth_info.impersonate`,
//! `impersonate_groups` and `impersonate_user_extra` (through `ConfigExt::extra_headers_layer`,
//! which also percent-encodes extra keys as client-go does). They are added on top of the admin
//! client, so the new client needs no kubeconfig: every request goes through the admin
//! client's connection and credentials with `Impersonate-*` headers added.

use std::collections::{BTreeMap, HashMap};

use kube::client::ConfigExt as _;

/// Extra key: the pod the plugin runs in.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// Extra key: the UID of that pod.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// Extra key: the node of that pod (what the ValidatingAdmissionPolicy checks).
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// A user to act as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Impersonation {
    /// `Impersonate-User`.
    pub user: String,
    /// `Impersonate-Group` (repeated).
    pub groups: Vec<String>,
    /// `Impersonate-Extra-<key>`.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The impersonated client cannot be built (a name that is not a valid header value).
#[derive(Debug, thiserror::Error)]
#[error("cannot build a client impersonating {user}: {source}")]
pub struct ImpersonationError {
    /// The user.
    pub user: String,
    /// kube's error.
    #[source]
    pub source: kube::Error,
}

impl Impersonation {
    /// A ServiceAccount without node binding: `system:serviceaccount:<ns>:<name>` with the groups
    /// the API server gives ServiceAccounts.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Impersonation {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec!["system:serviceaccounts".to_owned(), format!("system:serviceaccounts:{namespace}")],
            extra: BTreeMap::new(),
        }
    }

    /// A kubelet plugin's identity: the ServiceAccount of a pod on `node`, with the pod-name,
    /// pod-uid and node-name extras a bound token of that pod carries. It has exactly the
    /// rights of a real DaemonSet pod, including the node-scoped admission policy.
    pub fn kubelet_plugin(
        namespace: &str,
        service_account: &str,
        node: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Self {
        let mut identity = Self::service_account(namespace, service_account);
        identity.extra = BTreeMap::from([
            (EXTRA_POD_NAME.to_owned(), vec![pod_name.to_owned()]),
            (EXTRA_POD_UID.to_owned(), vec![pod_uid.to_owned()]),
            (EXTRA_NODE_NAME.to_owned(), vec![node.to_owned()]),
        ]);
        identity
    }

    /// The kube configuration fields that carry this identity (only `auth_info` is used).
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(http::Uri::from_static("https://impersonation.invalid"));
        config.auth_info.impersonate = Some(self.user.clone());
        config.auth_info.impersonate_groups = Some(self.groups.clone());
        if !self.extra.is_empty() {
            config.auth_info.impersonate_user_extra =
                Some(self.extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
        }
        config
    }

    /// A client that sends every request through `admin` with this identity's impersonation
    /// headers.
    pub fn client(&self, admin: &kube::Client) -> Result<kube::Client, ImpersonationError> {
        let layer = self
            .config()
            .extra_headers_layer()
            .map_err(|source| ImpersonationError { user: self.user.clone(), source })?;
        let inner = admin.clone();
        let service = tower::ServiceBuilder::new().layer(layer).service(tower::service_fn(
            move |request: http::Request<kube::client::Body>| {
                let inner = inner.clone();
                async move { inner.send(request).await }
            },
        ));
        Ok(kube::Client::new(service, admin.default_namespace()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;

    use super::*;

    #[test]
    fn kubelet_plugin_identity_is_the_service_account_with_pod_and_node() {
        let id = Impersonation::kubelet_plugin("ns", "sa", "node-1", "pod-a", "uid-1");
        assert_eq!(id.user, "system:serviceaccount:ns:sa");
        assert_eq!(id.groups, ["system:serviceaccounts", "system:serviceaccounts:ns"]);
        assert_eq!(id.extra[EXTRA_NODE_NAME], ["node-1"]);
        assert_eq!(id.extra[EXTRA_POD_NAME], ["pod-a"]);
        assert_eq!(id.extra[EXTRA_POD_UID], ["uid-1"]);
        let config = id.config();
        assert_eq!(config.auth_info.impersonate.as_deref(), Some("system:serviceaccount:ns:sa"));
        assert_eq!(config.auth_info.impersonate_user_extra.unwrap().len(), 3);
    }

    /// The headers reach the wire: a fake "admin" client records what it is asked to send.
    #[tokio::test]
    async fn requests_carry_the_impersonation_headers() {
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let recorder = seen.clone();
        let admin = kube::Client::new(
            tower::service_fn(move |request: Request<Body>| {
                let recorder = recorder.clone();
                async move {
                    let mut headers: Vec<(String, String)> = request
                        .headers()
                        .iter()
                        .filter(|(k, _)| k.as_str().starts_with("impersonate-"))
                        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
                        .collect();
                    headers.sort();
                    *recorder.lock().unwrap() = headers;
                    Ok::<_, std::convert::Infallible>(
                        Response::builder().status(200).body(Body::from(br#"{"major":"1","minor":"37","gitVersion":"v1.37.2","gitCommit":"","gitTreeState":"","buildDate":"2026-01-01T00:00:00Z","goVersion":"","compiler":"","platform":""}"#.to_vec())).unwrap(),
                    )
                }
            }),
            "default",
        );
        let client =
            Impersonation::kubelet_plugin("ns", "sa", "node-1", "pod-a", "uid-1").client(&admin).unwrap();
        client.apiserver_version().await.unwrap();
        let headers = seen.lock().unwrap().clone();
        assert_eq!(
            headers,
            [
                (
                    "impersonate-extra-authentication.kubernetes.io%2fnode-name".to_owned(),
                    "node-1".to_owned()
                ),
                ("impersonate-extra-authentication.kubernetes.io%2fpod-name".to_owned(), "pod-a".to_owned()),
                ("impersonate-extra-authentication.kubernetes.io%2fpod-uid".to_owned(), "uid-1".to_owned()),
                ("impersonate-group".to_owned(), "system:serviceaccounts".to_owned()),
                ("impersonate-group".to_owned(), "system:serviceaccounts:ns".to_owned()),
                ("impersonate-user".to_owned(), "system:serviceaccount:ns:sa".to_owned()),
            ]
        );
    }
}
