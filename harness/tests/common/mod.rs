//! Shared helpers for the plugin tests: claims, a plugin in a temp dir, and a
//! kubelet-like gRPC client over real Unix sockets.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    collections::HashMap,
    future::Future,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use harness::{
    grpc::{dra_v1, dra_v1beta1, registration},
    plugin::{
        ClaimSource, ClaimSourceError, FileOps, FileOpsError, KubeletPlugin, Listener, LocalDirFiles,
        MemoryClaims, PluginConfig, PluginListeners,
    },
};
use hyper_util::rt::TokioIo;
use k8s_openapi::{
    api::resource::v1::{
        AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
        DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimSpec,
        ResourceClaimStatus,
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::RawExtension},
};
use tempfile::TempDir;
use tokio::{net::UnixStream, sync::Notify};
use tonic::transport::{Channel, Endpoint};

pub const DRIVER: &str = "test-driver.dra-e2e.k8s.io";
pub const NODE: &str = "node-1";
pub const NS: &str = "dra-test";

/// Upper bound for every wait in these tests.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The DRA services the kubelet (1.34+) knows, in its order.
pub const KUBELET_DRA_SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// Awaits `fut` for at most [`TIMEOUT`], naming `what` on timeout.
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {TIMEOUT:?} waiting for {what}"),
    }
}

/// A claim allocated to `DRIVER` with one result per `(request, device)`,
/// claim config `{"a": "b"}` and class config `{"x": "y"}`.
pub fn allocated_claim(name: &str, uid: &str, results: &[(&str, &str)]) -> ResourceClaim {
    claim_with(
        name,
        uid,
        Some(allocation(
            results,
            vec![
                opaque(DRIVER, "FromClass", serde_json::json!({"x": "y"})),
                opaque(DRIVER, "FromClaim", serde_json::json!({"a": "b"})),
            ],
        )),
    )
}

pub fn claim_with(name: &str, uid: &str, allocation: Option<AllocationResult>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec::default()),
        status: Some(ResourceClaimStatus { allocation, ..Default::default() }),
    }
}

pub fn allocation(results: &[(&str, &str)], config: Vec<DeviceAllocationConfiguration>) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            config: Some(config),
            results: Some(
                results
                    .iter()
                    .map(|(request, device)| DeviceRequestAllocationResult {
                        device: (*device).into(),
                        driver: DRIVER.into(),
                        pool: NODE.into(),
                        request: (*request).into(),
                        share_id: Some(format!("share-{device}")),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
        ..Default::default()
    }
}

pub fn opaque(driver: &str, source: &str, params: serde_json::Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        opaque: Some(OpaqueDeviceConfiguration { driver: driver.into(), parameters: RawExtension(params) }),
        requests: None,
        source: source.into(),
    }
}

/// A [`ClaimSource`] over [`MemoryClaims`] whose reads of chosen claims wait
/// until released, and which counts reads.
#[derive(Debug, Default)]
pub struct GatedClaims {
    pub inner: MemoryClaims,
    gates: Mutex<HashMap<String, Arc<Notify>>>,
    pub waiting: Arc<Notify>,
    pub reads: AtomicUsize,
}

impl GatedClaims {
    pub fn new(inner: MemoryClaims) -> Self {
        GatedClaims { inner, ..Default::default() }
    }

    /// Reads of `name` wait until the returned notify is notified.
    pub fn gate(&self, name: &str) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.gates.lock().unwrap().insert(name.into(), notify.clone());
        notify
    }
}

#[async_trait]
impl ClaimSource for GatedClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimSourceError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let gate = self.gates.lock().unwrap().get(name).cloned();
        if let Some(gate) = gate {
            self.waiting.notify_one();
            gate.notified().await;
        }
        self.inner.get(namespace, name).await
    }
}

/// Local files that count writes and can be told to fail writes.
#[derive(Debug, Default)]
pub struct CountingFiles {
    pub writes: AtomicUsize,
    pub removes: AtomicUsize,
    pub fail_writes: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl FileOps for CountingFiles {
    async fn write(&self, path: &Path, contents: &[u8]) -> Result<(), FileOpsError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(FileOpsError::new("write", path, "disk full (injected by test)"));
        }
        LocalDirFiles.write(path, contents).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), FileOpsError> {
        LocalDirFiles.rename(from, to).await
    }

    async fn remove(&self, path: &Path) -> Result<(), FileOpsError> {
        self.removes.fetch_add(1, Ordering::SeqCst);
        LocalDirFiles.remove(path).await
    }

    async fn mkdir_all(&self, path: &Path) -> Result<(), FileOpsError> {
        LocalDirFiles.mkdir_all(path).await
    }

    async fn remove_all(&self, path: &Path) -> Result<(), FileOpsError> {
        self.removes.fetch_add(1, Ordering::SeqCst);
        LocalDirFiles.remove_all(path).await
    }
}

/// A plugin serving on Unix sockets in a temp dir.
pub struct TestPlugin {
    pub dir: TempDir,
    pub plugin: KubeletPlugin,
    pub reg_socket: PathBuf,
    pub dra_socket: PathBuf,
    pub cdi_dir: PathBuf,
}

pub struct Paths {
    pub dir: TempDir,
    pub reg_socket: PathBuf,
    pub dra_socket: PathBuf,
    pub cdi_dir: PathBuf,
}

pub fn paths() -> Paths {
    let dir = tempfile::Builder::new().prefix("dra").tempdir().unwrap();
    let registry = dir.path().join("plugins_registry");
    let plugin_dir = dir.path().join("plugins").join(DRIVER);
    let cdi_dir = dir.path().join("cdi");
    for d in [&registry, &plugin_dir, &cdi_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    Paths {
        reg_socket: registry.join(format!("{DRIVER}-reg.sock")),
        dra_socket: plugin_dir.join("dra.sock"),
        cdi_dir,
        dir,
    }
}

impl TestPlugin {
    /// Starts a plugin with `claims`, local files and the config changed by `configure`.
    pub async fn start(
        claims: Arc<dyn ClaimSource>,
        files: Arc<dyn FileOps>,
        configure: impl FnOnce(PluginConfig) -> PluginConfig,
    ) -> TestPlugin {
        let p = paths();
        let config = configure(PluginConfig::new(DRIVER, NODE, &p.cdi_dir));
        let plugin = KubeletPlugin::builder(config)
            .claim_source(claims)
            .file_ops(files)
            .start(PluginListeners {
                registration: Listener::unix(&p.reg_socket),
                dra: Listener::unix(&p.dra_socket),
            })
            .await
            .unwrap();
        TestPlugin {
            dir: p.dir,
            plugin,
            reg_socket: p.reg_socket,
            dra_socket: p.dra_socket,
            cdi_dir: p.cdi_dir,
        }
    }

    pub fn cdi_file(&self, uid: &str, request: &str) -> PathBuf {
        self.cdi_dir.join(format!("{DRIVER}-{uid}-{request}.json"))
    }
}

/// A gRPC channel over a Unix socket, like the kubelet's `unix:` dial.
pub async fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    within(
        "connecting to the socket",
        Endpoint::from_static("http://[::]:50051").connect_with_connector(tower::service_fn(
            move |_: http::Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            },
        )),
    )
    .await
    .unwrap()
}

/// What a kubelet registration produced.
pub struct Registered {
    pub info: registration::PluginInfo,
    /// The DRA service the kubelet would use: the first supported version it knows.
    pub chosen: String,
}

/// Registers the way the kubelet's plugin watcher does: GetInfo with a 1 s
/// deadline, validate, pick the first known DRA service, notify success.
pub async fn register_like_kubelet(reg_socket: &Path) -> Registered {
    let mut client =
        registration::registration_client::RegistrationClient::new(unix_channel(reg_socket).await);
    let mut request = tonic::Request::new(registration::InfoRequest {});
    request.set_timeout(Duration::from_secs(1));
    let info = tokio::time::timeout(Duration::from_secs(1), client.get_info(request))
        .await
        .expect("GetInfo must answer within the kubelet's 1 s timeout")
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    let chosen = info
        .supported_versions
        .iter()
        .find(|v| KUBELET_DRA_SERVICES.contains(&v.as_str()))
        .expect("the kubelet must know one of the supported versions")
        .clone();
    within(
        "NotifyRegistrationStatus",
        client.notify_registration_status(registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }),
    )
    .await
    .unwrap();
    Registered { info, chosen }
}

/// A DRA client for either API version, like the kubelet's version wrapper.
#[derive(Clone)]
pub enum DraClient {
    V1(dra_v1::dra_plugin_client::DraPluginClient<Channel>),
    V1beta1(dra_v1beta1::dra_plugin_client::DraPluginClient<Channel>),
}

/// A prepared device as returned by either version (`share_id` only in v1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    pub share_id: Option<String>,
}

/// Per-claim result: devices or error.
pub type ClaimResults = HashMap<String, Result<Vec<Device>, String>>;

pub fn claim_ref(name: &str, uid: &str) -> (String, String, String) {
    (NS.to_string(), name.to_string(), uid.to_string())
}

impl DraClient {
    pub async fn connect(socket: &Path, service: &str) -> DraClient {
        let channel = unix_channel(socket).await;
        match service {
            "v1.DRAPlugin" => DraClient::V1(dra_v1::dra_plugin_client::DraPluginClient::new(channel)),
            "v1beta1.DRAPlugin" => {
                DraClient::V1beta1(dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel))
            }
            other => panic!("unknown DRA service {other}"),
        }
    }

    pub async fn prepare(&self, claims: &[(String, String, String)]) -> Result<ClaimResults, tonic::Status> {
        match self.clone() {
            DraClient::V1(mut c) => {
                let request = dra_v1::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|(namespace, name, uid)| dra_v1::Claim {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            uid: uid.clone(),
                        })
                        .collect(),
                };
                let response = c.node_prepare_resources(request).await?.into_inner();
                Ok(response
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let result = if r.error.is_empty() {
                            Ok(r.devices
                                .into_iter()
                                .map(|d| Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                    share_id: d.share_id,
                                })
                                .collect())
                        } else {
                            Err(r.error)
                        };
                        (uid, result)
                    })
                    .collect())
            }
            DraClient::V1beta1(mut c) => {
                let request = dra_v1beta1::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|(namespace, name, uid)| dra_v1beta1::Claim {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            uid: uid.clone(),
                        })
                        .collect(),
                };
                let response = c.node_prepare_resources(request).await?.into_inner();
                Ok(response
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let result = if r.error.is_empty() {
                            Ok(r.devices
                                .into_iter()
                                .map(|d| Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                    share_id: None,
                                })
                                .collect())
                        } else {
                            Err(r.error)
                        };
                        (uid, result)
                    })
                    .collect())
            }
        }
    }

    pub async fn unprepare(
        &self,
        claims: &[(String, String, String)],
    ) -> Result<HashMap<String, String>, tonic::Status> {
        match self.clone() {
            DraClient::V1(mut c) => {
                let request = dra_v1::NodeUnprepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|(namespace, name, uid)| dra_v1::Claim {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            uid: uid.clone(),
                        })
                        .collect(),
                };
                let response = c.node_unprepare_resources(request).await?.into_inner();
                Ok(response.claims.into_iter().map(|(k, v)| (k, v.error)).collect())
            }
            DraClient::V1beta1(mut c) => {
                let request = dra_v1beta1::NodeUnprepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|(namespace, name, uid)| dra_v1beta1::Claim {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            uid: uid.clone(),
                        })
                        .collect(),
                };
                let response = c.node_unprepare_resources(request).await?.into_inner();
                Ok(response.claims.into_iter().map(|(k, v)| (k, v.error)).collect())
            }
        }
    }
}
