//! The DRA service (`DRAPlugin` v1 and v1beta1): prepare and unprepare.
//!
//! Semantics follow upstream's kubelet-plugin helper plus test driver:
//! - Prepare first reads every claim of the request; the whole call fails
//!   (status `UNKNOWN`, as a plain Go error becomes) when a claim cannot be
//!   read, is not allocated or has a different UID ("got replaced").
//! - Then per claim: if already prepared, the cached devices are returned
//!   (idempotent, nothing rewritten); else one CDI spec per allocation result
//!   of this driver is written and the devices returned. Per-claim failures go
//!   into the claim's `error` field.
//! - With device metadata on ([`PluginConfig::metadata`]), prepare also writes a metadata
//!   file and a CDI spec that mounts it per request, and adds the mount's CDI ID to the
//!   request's first device (see [`super::metadata`]); unprepare removes them.
//! - Unprepare removes the files of prepared claims; unknown claims succeed.
//! - Injected per-claim faults ([`Calls::fail_claim`](crate::calls::Calls::fail_claim), reached
//!   through the request's [`ClaimFaults`]) are applied here, claim by claim, after the claims
//!   were read: such a claim gets the injected error and is left as it was (not prepared, or
//!   still prepared), the others are handled as usual.
//!
//! Unlike upstream there is no global lock: calls for different claims run in
//! parallel; operations on the same claim are serialized by a per-claim lock.
//!
//! The prepared claims and the per-claim locks live in a [`ClaimState`], which
//! several instances of one driver on one node can share (a rolling update:
//! upstream's helper then serializes the calls of all instances with a file
//! lock and expects the driver to keep its state where every instance finds
//! it). With a shared state, an instance unprepares a claim that another one
//! prepared (its CDI file names follow from the claim UID and request), and two
//! instances never work on the same claim at the same time.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use tonic::{Request, Response, Status};

use super::{
    PluginConfig,
    cdi::{self, CdiSpec},
    claims::ClaimSource,
    files::{FileOps, write_atomically},
    metadata::{
        self, DeviceMetadata, DeviceMetadataRequest, MetadataConfig, MetadataDevice, MetadataObjectMeta,
    },
};
use crate::{
    calls::{ClaimFaults, ClaimRef},
    grpc::{dra_v1, dra_v1beta1},
};

/// A claim as identified by the kubelet: name and UID (the namespace is not
/// needed to make it unique).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimId {
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
}

/// A device returned for a prepared claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDevice {
    /// Pool of the allocated device.
    pub pool: String,
    /// Name of the allocated device.
    pub device: String,
    /// Share ID of the allocation result (sent in v1 only).
    pub share_id: Option<String>,
    /// Base request names (subrequest suffix stripped).
    pub requests: Vec<String>,
    /// CDI device IDs.
    pub cdi_ids: Vec<String>,
}

/// A claim named in a prepare/unprepare request.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClaimRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimRequest {
    /// The per-claim error injected for this claim in this call, if any.
    fn injected_error(&self, faults: Option<&ClaimFaults>) -> Option<String> {
        let faults = faults?;
        faults.take(&ClaimRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        })
    }
}

type ClaimLock = Arc<tokio::sync::Mutex<()>>;

/// What a plugin knows about its claims: which are prepared (with the devices returned for
/// them) and which are being worked on. Cheap to clone; clones are the same state, so plugin
/// instances of one driver on one node that run at the same time (a rolling update) can share
/// it through [`PluginBuilder::claim_state`](super::PluginBuilder::claim_state).
///
/// ```
/// use kubelet_plugin::plugin::ClaimState;
/// let state = ClaimState::default();
/// let shared = state.clone();
/// assert!(state.same_as(&shared));
/// assert!(!state.same_as(&ClaimState::default()));
/// assert!(shared.prepared_claims().is_empty());
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClaimState {
    inner: Arc<ClaimStateInner>,
}

#[derive(Debug, Default)]
struct ClaimStateInner {
    /// Prepared claims and their devices.
    prepared: Mutex<HashMap<ClaimId, Vec<PreparedDevice>>>,
    /// One lock per claim UID while an operation on it runs.
    locks: Mutex<HashMap<String, ClaimLock>>,
}

impl ClaimState {
    /// Prepared claims, sorted.
    pub fn prepared_claims(&self) -> Vec<ClaimId> {
        let mut ids: Vec<ClaimId> = lock(&self.inner.prepared).keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The devices of a prepared claim.
    pub fn prepared_devices(&self, id: &ClaimId) -> Option<Vec<PreparedDevice>> {
        lock(&self.inner.prepared).get(id).cloned()
    }

    /// Whether both are the same (shared) state.
    pub fn same_as(&self, other: &ClaimState) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn insert(&self, id: ClaimId, devices: Vec<PreparedDevice>) {
        lock(&self.inner.prepared).insert(id, devices);
    }

    fn remove(&self, id: &ClaimId) {
        lock(&self.inner.prepared).remove(id);
    }

    fn claim_lock(&self, uid: &str) -> ClaimLock {
        lock(&self.inner.locks).entry(uid.to_string()).or_default().clone()
    }

    /// Drops the lock entry of a claim when nobody else holds or waits for it.
    fn release_claim_lock(&self, uid: &str, held: ClaimLock) {
        let mut locks = lock(&self.inner.locks);
        // One reference in the map, one in `held`.
        if Arc::strong_count(&held) <= 2 {
            locks.remove(uid);
        }
    }
}

/// Version-independent prepare/unprepare, shared by the v1 and v1beta1 services.
#[derive(Debug)]
pub(crate) struct DraCore {
    config: PluginConfig,
    claims: Arc<dyn ClaimSource>,
    files: Arc<dyn FileOps>,
    state: ClaimState,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DraCore {
    pub(crate) fn new(
        config: PluginConfig,
        claims: Arc<dyn ClaimSource>,
        files: Arc<dyn FileOps>,
        state: ClaimState,
    ) -> Self {
        DraCore { config, claims, files, state }
    }

    /// The claim state (possibly shared with other instances).
    pub(crate) fn state(&self) -> &ClaimState {
        &self.state
    }

    /// Reads every claim; the first failure fails the whole call.
    async fn read_claims(&self, requests: &[ClaimRequest]) -> Result<Vec<ResourceClaim>, Status> {
        let mut claims = Vec::with_capacity(requests.len());
        for req in requests {
            let ns = &req.namespace;
            let name = &req.name;
            if name.is_empty() {
                // What client-go answers for a GET without a name.
                return Err(Status::unknown(format!(
                    "get resource claims: retrieve claim {ns}/{name}: resource name may not be empty"
                )));
            }
            let claim = self.claims.get(ns, name).await.map_err(|e| {
                Status::unknown(format!("get resource claims: retrieve claim {ns}/{name}: {e}"))
            })?;
            let allocated = claim.status.as_ref().is_some_and(|s| s.allocation.is_some());
            if !allocated {
                return Err(Status::unknown(format!("get resource claims: claim {ns}/{name} not allocated")));
            }
            let uid = claim.metadata.uid.as_deref().unwrap_or_default();
            if req.uid.is_empty() || uid != req.uid {
                return Err(Status::unknown(format!("get resource claims: claim {ns}/{name} got replaced")));
            }
            claims.push(claim);
        }
        Ok(claims)
    }

    /// Prepares all claims: whole-call errors as status, per-claim results keyed by UID. A claim
    /// with an injected per-claim fault gets its error and is not prepared.
    pub(crate) async fn prepare(
        &self,
        requests: &[ClaimRequest],
        faults: Option<&ClaimFaults>,
    ) -> Result<HashMap<String, Result<Vec<PreparedDevice>, String>>, Status> {
        let claims = self.read_claims(requests).await.inspect_err(|status| {
            tracing::warn!(error = %status.message(), "NodePrepareResources failed");
        })?;
        let mut results = HashMap::new();
        // read_claims returns the claims in request order.
        for (request, claim) in requests.iter().zip(&claims) {
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            let result = match request.injected_error(faults) {
                Some(error) => Err(error),
                None => self.prepare_claim(claim).await,
            };
            if let Err(e) = &result {
                tracing::warn!(claim = ?claim.metadata.name, error = %e, "prepare failed");
            }
            results.insert(uid, result);
        }
        Ok(results)
    }

    async fn prepare_claim(&self, claim: &ResourceClaim) -> Result<Vec<PreparedDevice>, String> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let id = ClaimId { name: name.clone(), uid: uid.clone() };
        let claim_lock = self.state.claim_lock(&uid);
        let result = {
            let _guard = claim_lock.lock().await;
            match self.state.prepared_devices(&id) {
                Some(devices) => Ok(devices),
                None => {
                    let result = self.write_claim(claim, &name, &uid).await;
                    if let Ok(devices) = &result {
                        self.state.insert(id, devices.clone());
                    }
                    result
                }
            }
        };
        self.state.release_claim_lock(&uid, claim_lock);
        result
    }

    async fn write_claim(
        &self,
        claim: &ResourceClaim,
        name: &str,
        uid: &str,
    ) -> Result<Vec<PreparedDevice>, String> {
        let driver = &self.config.driver_name;
        let devices_result =
            claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
        let Some(allocation) = devices_result else {
            return Ok(Vec::new());
        };
        let configs = allocation.config.as_deref().unwrap_or_default();
        let mut devices = Vec::new();
        for result in allocation.results.iter().flatten() {
            if &result.driver != driver {
                continue;
            }
            let base = cdi::base_request(&result.request);
            if self.config.static_cdi {
                devices.push(PreparedDevice {
                    pool: result.pool.clone(),
                    device: result.device.clone(),
                    share_id: result.share_id.clone(),
                    requests: vec![base.to_string()],
                    cdi_ids: vec![cdi::static_device_id(driver, &result.device)],
                });
                continue;
            }
            let env = cdi::env_for_result(driver, name, configs, result)?;
            if env.is_empty() {
                // CDI rejects empty container edits; inject nothing instead.
                continue;
            }
            let spec = CdiSpec::new(driver, cdi::device_name(uid, base), env);
            let json = spec.to_json().map_err(|e| format!("marshal spec: {e}"))?;
            let path = cdi::spec_path(&self.config.cdi_dir, driver, uid, base);
            write_atomically(self.files.as_ref(), &path, &json)
                .await
                .map_err(|e| format!("failed to write CDI file: {e}"))?;
            tracing::debug!(path = %path.display(), "CDI file written");
            devices.push(PreparedDevice {
                pool: result.pool.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
                requests: vec![base.to_string()],
                cdi_ids: vec![cdi::device_id(driver, uid, base)],
            });
        }
        if let Some(config) = &self.config.metadata {
            self.write_metadata(
                config,
                claim,
                allocation.results.as_deref().unwrap_or_default(),
                &mut devices,
            )
            .await?;
        }
        Ok(devices)
    }

    /// Upstream's helper after a successful prepare with device metadata on: per request of
    /// this driver a metadata file and a CDI spec that mounts it, whose device ID goes to the
    /// request's first device (see [`metadata`]).
    async fn write_metadata(
        &self,
        config: &MetadataConfig,
        claim: &ResourceClaim,
        results: &[DeviceRequestAllocationResult],
        devices: &mut [PreparedDevice],
    ) -> Result<(), String> {
        let driver = &self.config.driver_name;
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pod_claim_name = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(metadata::POD_CLAIM_NAME_ANNOTATION))
            .cloned();
        // Request (as in the results, maybe `request/sub`) -> its devices, in result order.
        let mut requests: Vec<(&str, Vec<MetadataDevice>)> = Vec::new();
        for result in results.iter().filter(|r| &r.driver == driver) {
            let device = MetadataDevice::test_driver(driver, &result.pool, &result.device);
            match requests.iter_mut().find(|(r, _)| *r == result.request) {
                Some((_, devices)) => devices.push(device),
                None => requests.push((&result.request, vec![device])),
            }
        }
        for (request, metadata_devices) in requests {
            let base = cdi::base_request(request);
            let object = DeviceMetadata {
                metadata: MetadataObjectMeta {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    uid: uid.clone(),
                    generation: 1,
                },
                pod_claim_name: pod_claim_name.clone(),
                requests: vec![DeviceMetadataRequest { name: request.to_owned(), devices: metadata_devices }],
                ..Default::default()
            };
            let stream = object
                .encode_stream(&config.versions)
                .map_err(|e| format!("write metadata for request {request:?}: encode: {e}"))?;
            let host_file = config.host_file(&namespace, &name, base);
            let dir = host_file.parent().unwrap_or(&config.plugin_data_dir);
            self.files.mkdir_all(dir).await.map_err(|e| {
                format!("write metadata for request {request:?}: create metadata directory: {e}")
            })?;
            write_atomically(self.files.as_ref(), &host_file, &stream)
                .await
                .map_err(|e| format!("write metadata for request {request:?}: write metadata file: {e}"))?;
            let container_path = match pod_claim_name.as_deref() {
                Some(pod_claim) if !pod_claim.is_empty() => {
                    metadata::resource_claim_template_file_path(driver, pod_claim, base)
                }
                _ => metadata::resource_claim_file_path(driver, &name, base),
            };
            let spec =
                metadata::cdi_spec(driver, metadata::cdi_device_name(&uid, base), &host_file, container_path);
            let json = serde_json::to_vec_pretty(&spec)
                .map_err(|e| format!("write CDI spec for request {request:?}: marshal CDI spec: {e}"))?;
            let path = metadata::cdi_spec_path(&self.config.cdi_dir, driver, &uid, base);
            write_atomically(self.files.as_ref(), &path, &json)
                .await
                .map_err(|e| format!("write CDI spec for request {request:?}: write CDI spec file: {e}"))?;
            tracing::debug!(file = %host_file.display(), cdi = %path.display(), "device metadata written");
            if let Some(first) = devices.iter_mut().find(|d| d.requests.iter().any(|r| r == base)) {
                first.cdi_ids.push(metadata::cdi_device_id(driver, &uid, base));
            }
        }
        Ok(())
    }

    /// Removes a claim's device metadata: its directory and its metadata CDI specs.
    async fn remove_metadata(&self, req: &ClaimRequest, devices: &[PreparedDevice]) -> Result<(), String> {
        let Some(config) = &self.config.metadata else { return Ok(()) };
        let dir = config.claim_dir(&req.namespace, &req.name);
        self.files.remove_all(&dir).await.map_err(|e| format!("clean up device metadata: {e}"))?;
        for request in devices.iter().flat_map(|d| &d.requests) {
            let path =
                metadata::cdi_spec_path(&self.config.cdi_dir, &self.config.driver_name, &req.uid, request);
            self.files.remove(&path).await.map_err(|e| format!("clean up device metadata: {e}"))?;
        }
        Ok(())
    }

    /// Unprepares all claims; per-claim results keyed by UID (`Ok` = success). A claim with an
    /// injected per-claim fault gets its error and stays prepared.
    pub(crate) async fn unprepare(
        &self,
        requests: &[ClaimRequest],
        faults: Option<&ClaimFaults>,
    ) -> HashMap<String, Result<(), String>> {
        let mut results = HashMap::new();
        for req in requests {
            let result = match req.injected_error(faults) {
                Some(error) => Err(error),
                None => self.unprepare_claim(req).await,
            };
            if let Err(e) = &result {
                tracing::warn!(claim = %req.name, error = %e, "unprepare failed");
            }
            results.insert(req.uid.clone(), result);
        }
        results
    }

    async fn unprepare_claim(&self, req: &ClaimRequest) -> Result<(), String> {
        let id = ClaimId { name: req.name.clone(), uid: req.uid.clone() };
        let claim_lock = self.state.claim_lock(&req.uid);
        let result = {
            let _guard = claim_lock.lock().await;
            match self.state.prepared_devices(&id) {
                // Not prepared (by this instance or one sharing its state): nothing to do.
                None => Ok(()),
                Some(devices) => {
                    let mut result = Ok(());
                    // Static CDI devices stay defined: no file per claim.
                    let per_claim = if self.config.static_cdi { &[][..] } else { &devices[..] };
                    'devices: for device in per_claim {
                        for request in &device.requests {
                            let path = self.spec_path(&req.uid, request);
                            if let Err(e) = self.files.remove(&path).await {
                                result = Err(format!("error removing CDI file: {e}"));
                                break 'devices;
                            }
                            tracing::debug!(path = %path.display(), "CDI file removed");
                        }
                    }
                    if result.is_ok() {
                        result = self.remove_metadata(req, &devices).await;
                    }
                    if result.is_ok() {
                        self.state.remove(&id);
                    }
                    result
                }
            }
        };
        self.state.release_claim_lock(&req.uid, claim_lock);
        result
    }

    fn spec_path(&self, uid: &str, request: &str) -> PathBuf {
        cdi::spec_path(&self.config.cdi_dir, &self.config.driver_name, uid, cdi::base_request(request))
    }
}

/// `DRAPlugin` v1.
#[derive(Clone, Debug)]
pub(crate) struct DraV1(pub Arc<DraCore>);

/// `DRAPlugin` v1beta1.
#[derive(Clone, Debug)]
pub(crate) struct DraV1beta1(pub Arc<DraCore>);

macro_rules! claim_requests {
    ($claims:expr) => {
        $claims
            .into_iter()
            .map(|c| ClaimRequest { namespace: c.namespace, name: c.name, uid: c.uid })
            .collect::<Vec<_>>()
    };
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for DraV1 {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let faults = ClaimFaults::of(&request).cloned();
        let requests = claim_requests!(request.into_inner().claims);
        let results = self.0.prepare(&requests, faults.as_ref()).await?;
        let claims = results
            .into_iter()
            .map(|(uid, result)| {
                let response = match result {
                    Ok(devices) => dra_v1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| dra_v1::Device {
                                request_names: d.requests,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(error) => dra_v1::NodePrepareResourceResponse { devices: Vec::new(), error },
                };
                (uid, response)
            })
            .collect();
        Ok(Response::new(dra_v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        let faults = ClaimFaults::of(&request).cloned();
        let requests = claim_requests!(request.into_inner().claims);
        let claims = self
            .0
            .unprepare(&requests, faults.as_ref())
            .await
            .into_iter()
            .map(|(uid, result)| {
                let error = result.err().unwrap_or_default();
                (uid, dra_v1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for DraV1beta1 {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        let faults = ClaimFaults::of(&request).cloned();
        let requests = claim_requests!(request.into_inner().claims);
        let results = self.0.prepare(&requests, faults.as_ref()).await?;
        let claims = results
            .into_iter()
            .map(|(uid, result)| {
                let response = match result {
                    // v1beta1 has no share ID.
                    Ok(devices) => dra_v1beta1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| dra_v1beta1::Device {
                                request_names: d.requests,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_ids,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(error) => dra_v1beta1::NodePrepareResourceResponse { devices: Vec::new(), error },
                };
                (uid, response)
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let faults = ClaimFaults::of(&request).cloned();
        let requests = claim_requests!(request.into_inner().claims);
        let claims = self
            .0
            .unprepare(&requests, faults.as_ref())
            .await
            .into_iter()
            .map(|(uid, result)| {
                let error = result.err().unwrap_or_default();
                (uid, dra_v1beta1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;
    use crate::plugin::{LocalDirFiles, MemoryClaims};

    /// With static CDI devices, prepare answers the static IDs and writes no file; unprepare
    /// removes none (the static spec stays).
    #[tokio::test]
    async fn static_cdi_prepares_and_unprepares_without_a_file_per_claim() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("d.k8s.io-static.json");
        std::fs::write(&spec, cdi::static_spec("d.k8s.io", &["device-00".to_owned()]).to_json().unwrap())
            .unwrap();
        let claims = MemoryClaims::new();
        claims.insert(
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "c", "namespace": "ns", "uid": "u1" },
                "spec": {},
                "status": { "allocation": { "devices": { "results": [
                    { "request": "req", "driver": "d.k8s.io", "pool": "node-1", "device": "device-00" },
                ] } } },
            }))
            .unwrap(),
        );
        let config = PluginConfig::new("d.k8s.io", "node-1", dir.path()).static_cdi(true);
        let core = DraCore::new(config, Arc::new(claims), Arc::new(LocalDirFiles), Default::default());
        let request = ClaimRequest { namespace: "ns".into(), name: "c".into(), uid: "u1".into() };
        let prepared = core.prepare(std::slice::from_ref(&request), None).await.unwrap();
        let devices = prepared["u1"].clone().unwrap();
        assert_eq!(devices[0].cdi_ids, ["d.k8s.io/device=device-00"]);
        let files = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into())
                .collect();
            names.sort();
            names
        };
        assert_eq!(files(), ["d.k8s.io-static.json"]);
        assert!(core.unprepare(&[request], None).await["u1"].is_ok());
        assert_eq!(files(), ["d.k8s.io-static.json"]);
    }
}
