//! The production [`ClusterBackend`]: a real cluster through kube-rs.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::Duration,
};

use crate::{
    cluster::artifact_files::{pod_logs, write_list},
    cluster::backend::{ArtifactRequest, ClusterBackend, ClusterError, NamespaceRequest, SpecNamespace},
    cluster::credentials::Credentials,
    cluster::preflight::{ClusterInfo, NodeInfo, PreflightError},
    cluster::reconnect,
    cluster::refusal::{self, root_cause},
    cluster::resend::CREATE_TOKEN_LABEL,
    cluster::run_identity::MANAGED_BY_LABEL,
    duration,
};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::ObjectMeta,
};

/// How long preflight may take in total (connect, discovery, nodes).
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP connect timeout of the client.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a new namespace may wait for its `default` ServiceAccount (upstream's
/// `ServiceAccountProvisionTimeout`).
const DEFAULT_SERVICE_ACCOUNT_TIMEOUT: Duration = Duration::from_secs(120);

/// Annotation with the spec's full text on its namespace.
pub const SPEC_ANNOTATION: &str = "dra-e2e.k8s.io/spec";

/// How long removing a namespace that a failed create may have made may take, its being gone
/// included.
const UNDO_CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// A client for tunnels: like `kube::Client::try_from(config)`, but its TCP connections to the
/// API server set `TCP_NODELAY`.
///
/// kube's default connector leaves Nagle's algorithm on. A port-forward WebSocket carries small
/// gRPC frames; a second small write waits for the ACK of the first, which the API server's
/// kernel delays (up to 40 ms), so some calls through a tunnel take 40 ms longer (seen as the
/// p99 of `cargo bench --bench tunnel` through a real port-forward). Use this client for
/// port-forward tunnels and exec. It keeps the config's connect timeout but has no read or
/// write timeouts (streams are long-lived) and no request tracing.
pub fn nodelay_client(config: &kube::Config) -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt as _;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(|e: hyper_util::client::legacy::Error| -> Box<dyn std::error::Error + Send + Sync> {
            Box::new(e)
        })
        .service(
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https),
        );
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// A real cluster.
#[derive(Clone)]
pub struct KubeBackend {
    client: Client,
    /// The same identity, with `TCP_NODELAY` connections, for port-forward and exec.
    stream_client: Client,
    server: String,
    /// The kubeconfig's credentials, for the sentence of a refusal.
    credentials: Credentials,
}

impl KubeBackend {
    /// Loads `kubeconfig` (or `KUBECONFIG`, `~/.kube/config`, in-cluster
    /// config, as kube-rs infers) and builds a client. Does not contact the
    /// cluster; [`ClusterBackend::preflight`] does.
    pub async fn connect(kubeconfig: Option<&Path>) -> Result<Self, PreflightError> {
        let env = std::env::var("KUBECONFIG").ok().filter(|v| !v.is_empty());
        let mut config = match (kubeconfig, env) {
            (Some(path), _) => {
                let bad =
                    |reason: String| PreflightError::Kubeconfig { path: path.display().to_string(), reason };
                let kc = Kubeconfig::read_from(path).map_err(|e| bad(root_cause(&e)))?;
                Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| bad(root_cause(&e)))?
            }
            (None, Some(env)) => {
                Config::from_kubeconfig(&KubeConfigOptions::default()).await.map_err(|e| {
                    PreflightError::Kubeconfig {
                        path: format!("{env} (from KUBECONFIG)"),
                        reason: root_cause(&e),
                    }
                })?
            }
            (None, None) => {
                Config::infer().await.map_err(|e| PreflightError::NoKubeconfig { reason: root_cause(&e) })?
            }
        };
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        let server = config.cluster_url.to_string();
        let credentials = Credentials::of(&config);
        let bad = |e: kube::Error| PreflightError::Kubeconfig {
            path: kubeconfig.map_or_else(|| "(inferred)".to_owned(), |p| p.display().to_string()),
            reason: root_cause(&e),
        };
        let stream_client = nodelay_client(&config).map_err(bad)?;
        let client =
            reconnect::reconnecting(Client::try_from(config).map_err(bad)?, reconnect::RECONNECT_BUDGET);
        Ok(Self { client, stream_client, server, credentials })
    }

    /// Uses an existing client.
    pub fn new(client: Client, server: impl Into<String>) -> Self {
        Self { stream_client: client.clone(), client, server: server.into(), credentials: Credentials::None }
    }

    /// The same backend whose clients stamp every object they create with the run's identity
    /// ([`crate::cluster::run_identity::stamp`]).
    pub fn with_run_identity(self, run_id: &str) -> Self {
        Self {
            client: crate::cluster::run_identity::stamp(self.client, run_id),
            stream_client: crate::cluster::run_identity::stamp(self.stream_client, run_id),
            server: self.server,
            credentials: self.credentials,
        }
    }

    /// Why `error` keeps the run from using the cluster, in one sentence that says what to fix
    /// (the cluster module's `refusal` rules).
    pub fn refusal(&self, error: kube::Error) -> PreflightError {
        refusal::refusal(&self.server, self.credentials, error)
    }

    async fn discover(&self) -> Result<ClusterInfo, PreflightError> {
        // Asked once, through the client that does not send a request again: an API server
        // that cannot be reached is refused at once with its reason, not waited for.
        let version = self.stream_client.apiserver_version().await.map_err(|e| self.refusal(e))?;
        let core = self.client.list_core_api_versions().await.map_err(|e| self.refusal(e))?;
        let groups = self.client.list_api_groups().await.map_err(|e| self.refusal(e))?;
        let mut api_versions: BTreeSet<String> = core.versions.into_iter().collect();
        for group in groups.groups {
            api_versions.extend(group.versions.into_iter().map(|v| v.group_version));
        }
        let mut info = ClusterInfo {
            server: self.server.clone(),
            server_version: version.git_version,
            api_versions,
            nodes: Vec::new(),
            api_server_gates: None,
        };
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.refusal(e))?;
        info.nodes = nodes.items.into_iter().map(node_info).collect();
        info.api_server_gates = self.api_server_gates().await;
        Ok(info)
    }

    /// Deletes the namespaces a failed create request with this token made, if any, and waits
    /// until they are gone; bounded by [`UNDO_CREATE_TIMEOUT`]. The run's client sends the list
    /// and delete again while the API server is away. What it cannot remove is logged (a later
    /// run's leftover clean-up finds it by its run label).
    async fn undo_create(&self, token: &str) {
        let undo = async {
            let api = Api::<Namespace>::all(self.client.clone());
            let made =
                api.list(&ListParams::default().labels(&format!("{CREATE_TOKEN_LABEL}={token}"))).await?;
            for ns in made.items {
                let namespace = SpecNamespace {
                    name: ns.metadata.name.unwrap_or_default(),
                    uid: ns.metadata.uid.unwrap_or_default(),
                };
                tracing::info!(namespace = %namespace.name, "a namespace create went unanswered but made it; deleting it");
                self.delete_namespace(&namespace).await?;
                self.wait_namespace_gone(&namespace, UNDO_CREATE_TIMEOUT).await?;
            }
            Ok::<_, anyhow::Error>(())
        };
        match tokio::time::timeout(UNDO_CREATE_TIMEOUT, undo).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove what a failed namespace create made"),
            Err(_) => tracing::warn!("removing what a failed namespace create made took too long"),
        }
    }
}

impl KubeBackend {
    /// The API server's feature gates from its `/metrics` (`None`, logged, when it cannot be
    /// read: the specs that need a gate then ask for it themselves and say why they cannot know).
    async fn api_server_gates(&self) -> Option<BTreeMap<String, bool>> {
        let request = kube::core::Request::new("").get("metrics", &Default::default()).ok()?;
        match self.client.request_text(request).await {
            Ok(text) => Some(crate::cluster::preflight::feature_gates_from_metrics(&text)),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the API server's /metrics for its feature gates");
                None
            }
        }
    }
}

fn node_info(node: Node) -> NodeInfo {
    let status = node.status.unwrap_or_default();
    let spec = node.spec.unwrap_or_default();
    let tainted =
        spec.taints.unwrap_or_default().iter().any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
    NodeInfo {
        name: node.metadata.name.unwrap_or_default(),
        kubelet_version: status.node_info.map(|i| i.kubelet_version).unwrap_or_default(),
        ready: status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True"),
        schedulable: !spec.unschedulable.unwrap_or(false) && !tainted,
    }
}

#[async_trait]
impl ClusterBackend for KubeBackend {
    async fn preflight(&self) -> Result<ClusterInfo, PreflightError> {
        tokio::time::timeout(PREFLIGHT_TIMEOUT, self.discover()).await.unwrap_or_else(|_| {
            Err(PreflightError::Timeout { server: self.server.clone(), secs: PREFLIGHT_TIMEOUT.as_secs() })
        })
    }

    fn client(&self) -> Client {
        self.client.clone()
    }

    fn watches_disruptions(&self) -> bool {
        true
    }

    fn stream_client(&self) -> Client {
        self.stream_client.clone()
    }

    async fn create_namespace(&self, request: &NamespaceRequest) -> Result<SpecNamespace, ClusterError> {
        let token = crate::names::unique_suffix();
        let labels: BTreeMap<String, String> = [
            ("pod-security.kubernetes.io/enforce", "privileged"),
            ("pod-security.kubernetes.io/audit", "privileged"),
            ("pod-security.kubernetes.io/warn", "privileged"),
            MANAGED_BY_LABEL,
            (CREATE_TOKEN_LABEL, &token),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(request.generate_name.clone()),
                labels: Some(labels),
                annotations: Some([(SPEC_ANNOTATION.to_owned(), request.full_text.clone())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let api = Api::<Namespace>::all(self.client.clone());
        // The run's client sends again a create that never reached the API server (restarting,
        // say); one that may have been done is not repeated (a second namespace).
        let created = match api.create(&PostParams::default(), &ns).await {
            Ok(created) => created,
            Err(source) => {
                // Unanswered (not refused by the API server): it may have been made all the same,
                // and nothing else would delete it.
                if !matches!(source, kube::Error::Api(_)) {
                    self.undo_create(&token).await;
                }
                return Err(ClusterError::Kube {
                    what: format!("create namespace with generateName {}", request.generate_name),
                    source,
                });
            }
        };
        let name = created.metadata.name.unwrap_or_default();
        let uid = created.metadata.uid.unwrap_or_default();
        if name.is_empty() || uid.is_empty() {
            self.undo_create(&token).await;
            return Err(ClusterError::Other("the created namespace has no name or uid".to_owned()));
        }
        // As upstream's framework does: a pod created before the serviceaccount controller made
        // the namespace's `default` ServiceAccount is refused ("serviceaccount \"default\" not
        // found"), which happens when the controller manager is slow (after an API server
        // restart, say).
        let accounts = Api::<ServiceAccount>::namespaced(self.client.clone(), &name);
        let made =
            kube::runtime::wait::await_condition(accounts, "default", |sa: Option<&ServiceAccount>| {
                sa.is_some()
            });
        let failed = match tokio::time::timeout(DEFAULT_SERVICE_ACCOUNT_TIMEOUT, made).await {
            Ok(Ok(_)) => return Ok(SpecNamespace { name, uid }),
            Ok(Err(e)) => format!("could not watch for the default ServiceAccount of namespace {name}: {e}"),
            Err(_) => format!(
                "namespace {name} got no default ServiceAccount within {}s (the controller manager's serviceaccount controller makes it)",
                DEFAULT_SERVICE_ACCOUNT_TIMEOUT.as_secs()
            ),
        };
        // The spec never gets it, so it is not deleted at the spec's clean-up.
        self.undo_create(&token).await;
        Err(ClusterError::Other(failed))
    }

    async fn delete_namespace(&self, namespace: &SpecNamespace) -> Result<(), ClusterError> {
        let api = Api::<Namespace>::all(self.client.clone());
        match api.delete(&namespace.name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => {
                Err(ClusterError::Kube { what: format!("delete namespace {}", namespace.name), source })
            }
        }
    }

    async fn wait_namespace_gone(
        &self,
        namespace: &SpecNamespace,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let api = Api::<Namespace>::all(self.client.clone());
        let gone = await_deleted(api.clone(), &namespace.name, &namespace.uid);
        let waiting =
            crate::run::monitor::waiting(format!("namespace {} to be gone", namespace.name), Some(timeout));
        let waited = tokio::time::timeout(timeout, gone).await;
        drop(waiting);
        match waited {
            Ok(()) => Ok(()),
            Err(_) => {
                // Say what holds the namespace up (the namespace controller's conditions).
                let remaining = match api.get_opt(&namespace.name).await {
                    Ok(Some(ns)) => ns
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| c.status == "True")
                        .filter_map(|c| c.message)
                        .collect::<Vec<_>>()
                        .join("; "),
                    Ok(None) => return Ok(()),
                    Err(e) => e.to_string(),
                };
                Err(ClusterError::Timeout {
                    what: format!(
                        "namespace {} to be gone{}",
                        namespace.name,
                        if remaining.is_empty() { String::new() } else { format!(" ({remaining})") }
                    ),
                    after: duration::display(timeout),
                })
            }
        }
    }

    async fn wait_namespace_pods_gone(
        &self,
        namespace: &SpecNamespace,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let what = format!("the pods of namespace {} to be gone", namespace.name);
        let api = Api::<Pod>::namespaced(self.client.clone(), &namespace.name);
        let waiting = crate::run::monitor::waiting(what.clone(), Some(timeout));
        let waited = tokio::time::timeout(timeout, until_no_pods(api.clone())).await;
        drop(waiting);
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ClusterError::Other(format!("wait for {what}: {e}"))),
            Err(_) => {
                // Name the pods that are still there and their phases.
                let left = match api.list(&ListParams::default()).await {
                    Ok(list) => list
                        .items
                        .iter()
                        .map(|p| {
                            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("?");
                            format!("{} ({phase})", p.metadata.name.as_deref().unwrap_or("?"))
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    Err(e) => e.to_string(),
                };
                Err(ClusterError::Timeout {
                    what: format!("{what} (left: {left})"),
                    after: duration::display(timeout),
                })
            }
        }
    }

    async fn collect_artifacts(&self, request: ArtifactRequest<'_>) -> Vec<String> {
        let mut problems = Vec::new();
        let dir = request.dir;
        let ns = request.namespace;
        let client = &self.client;

        let mut note = |what: &str, result: Result<(), String>| {
            if let Err(e) = result {
                tracing::warn!("collecting {what} failed: {e}");
                problems.push(format!("{what}: {e}"));
            }
        };

        let events = Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await;
        note("events.yaml", write_list(dir, "events.yaml", events.map(|l| l.items)).await);

        let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await;
        let pods = pods.map(|l| l.items);
        if let Ok(pods) = &pods {
            for pod in pods {
                if let Err(e) = pod_logs(client, ns, pod, &dir.join("logs")).await {
                    note("logs", Err(e));
                }
            }
        }
        note("pods.yaml", write_list(dir, "pods.yaml", pods).await);

        problems
    }
}

/// Waits until the object `name` with `uid` is gone. A failed watch (the API server restarting,
/// say) is retried each second; the caller bounds the wait.
pub(crate) async fn await_deleted<K>(api: Api<K>, name: &str, uid: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    loop {
        match kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::conditions::is_deleted(uid),
        )
        .await
        {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(name, error = %e, "watching for the deletion failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Watches the pods of `api`'s namespace until there are none (a watch, not a poll: it ends at
/// the event that removes the last one).
async fn until_no_pods(api: Api<Pod>) -> Result<(), kube::runtime::watcher::Error> {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, reflector, watcher};
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    let mut events = std::pin::pin!(events);
    let mut listed = false;
    while let Some(event) = events.next().await {
        // A failed watch (the API server restarting, say) is retried with backoff; only the
        // caller's timeout ends the wait.
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(error = %e, "watching pods failed; retrying");
                continue;
            }
        };
        match event {
            watcher::Event::InitDone => listed = true,
            watcher::Event::Init | watcher::Event::InitApply(_) => continue,
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {}
        }
        if listed && reader.is_empty() {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{
        error::Error as StdError,
        sync::{Arc, Mutex},
    };

    use http_body_util::BodyExt as _;
    use kube::client::Body;

    use super::*;

    /// An API server that makes the namespace of a create but loses its answer, and records the
    /// requests it got after that.
    #[derive(Default)]
    struct LostAnswer {
        made: Mutex<Option<serde_json::Value>>,
        deleted: Mutex<Vec<String>>,
    }

    impl LostAnswer {
        async fn serve(
            self: Arc<Self>,
            req: http::Request<Body>,
        ) -> Result<http::Response<Body>, Box<dyn StdError + Send + Sync>> {
            let (parts, body) = req.into_parts();
            let (method, path, query) =
                (parts.method, parts.uri.path().to_owned(), parts.uri.query().unwrap_or_default().to_owned());
            let json =
                |v: serde_json::Value| -> Result<http::Response<Body>, Box<dyn StdError + Send + Sync>> {
                    Ok(http::Response::builder()
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&v)?))?)
                };
            let list = |items: Vec<serde_json::Value>| serde_json::json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "1"}, "items": items});
            match (method.as_str(), path.as_str()) {
                ("POST", "/api/v1/namespaces") => {
                    let sent: serde_json::Value = serde_json::from_slice(&body.collect().await?.to_bytes())?;
                    let mut ns = sent.clone();
                    ns["metadata"]["name"] = "dra-lost-abcde".into();
                    ns["metadata"]["uid"] = "uid-1".into();
                    *self.made.lock().unwrap() = Some(ns);
                    Err("connection reset before the answer".into())
                }
                ("GET", "/api/v1/namespaces") => {
                    let made = self.made.lock().unwrap().clone();
                    let token = made.as_ref().and_then(|ns| {
                        ns["metadata"]["labels"][CREATE_TOKEN_LABEL].as_str().map(str::to_owned)
                    });
                    // Only the list by the create's token names it (the token is random).
                    let selected =
                        token.is_some_and(|t| query.contains("labelSelector") && query.contains(&t));
                    // The wait for it to be gone lists by name: deleted means an empty list.
                    json(list(if selected { made.into_iter().collect() } else { Vec::new() }))
                }
                ("DELETE", p) if p.starts_with("/api/v1/namespaces/") => {
                    self.deleted.lock().unwrap().push(p.trim_start_matches("/api/v1/namespaces/").to_owned());
                    *self.made.lock().unwrap() = None;
                    json(serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}))
                }
                _ => Ok(http::Response::builder().status(404).body(Body::empty())?),
            }
        }
    }

    #[tokio::test]
    async fn a_create_whose_answer_was_lost_deletes_the_namespace_it_made() {
        let api = Arc::new(LostAnswer::default());
        let served = api.clone();
        let service = tower::service_fn(move |req| served.clone().serve(req));
        let backend = KubeBackend::new(Client::new(service, "default"), "test");
        let request = NamespaceRequest { generate_name: "dra-lost-".into(), full_text: "lost".into() };
        let err = tokio::time::timeout(Duration::from_secs(60), backend.create_namespace(&request))
            .await
            .expect("the create and its undo hung")
            .unwrap_err();
        assert!(format!("{err}").contains("create namespace with generateName dra-lost-"), "{err}");
        assert_eq!(*api.deleted.lock().unwrap(), ["dra-lost-abcde"]);
        assert!(api.made.lock().unwrap().is_none());
    }
}
