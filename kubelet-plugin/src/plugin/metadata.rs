//! Device metadata files, as upstream's kubelet-plugin helper writes them for a driver that
//! enables them (`kubeletplugin.EnableDeviceMetadata`, k8s.io/dynamic-resource-allocation
//! v0.37, API group `metadata.resource.k8s.io`).
//!
//! Per prepared claim and request of this driver:
//! - a metadata file on the node,
//!   `<plugin data dir>/dra-device-metadata/<namespace>_<claim>/<base request>/metadata.json`:
//!   a stream of JSON objects (pretty-printed, each followed by a newline), the same
//!   [`DeviceMetadata`] once per configured version, in the configured order;
//! - a CDI spec `<cdi dir>/<driver>_metadata_<claim UID>_<base request>.json`, kind
//!   `<driver>/metadata`, device `<claim UID>_<base request>`, that bind-mounts the file
//!   read-only into the containers at
//!   `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`,
//!   or, for a claim generated from a template (annotation
//!   `resource.kubernetes.io/pod-claim-name`), under `resourceclaimtemplates/<pod claim name>/`.
//!
//! The CDI device ID (`<driver>/metadata=<claim UID>_<base request>`) is added to the first
//! device of each request in the `NodePrepareResources` response. Unprepare removes the claim's
//! metadata directory and its metadata CDI specs.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::api::resource::v1::{DeviceAttribute, NetworkDeviceData};
use serde::{Deserialize, Serialize};

use super::cdi::{CdiContainerEdits, CdiDevice, CdiMount, CdiSpec};

/// The API group of device metadata.
pub const METADATA_GROUP: &str = "metadata.resource.k8s.io";

/// The kind of a device metadata object.
pub const METADATA_KIND: &str = "DeviceMetadata";

/// Where the files appear inside containers.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// Subdirectory of [`CONTAINER_DIR`] for claims the pod names directly.
pub const RESOURCE_CLAIMS_SUBDIR: &str = "resourceclaims";

/// Subdirectory of [`CONTAINER_DIR`] for claims generated from a template.
pub const RESOURCE_CLAIM_TEMPLATES_SUBDIR: &str = "resourceclaimtemplates";

/// Suffix of a driver's file name inside containers: `<driver>-metadata.json`.
pub const METADATA_FILE_SUFFIX: &str = "-metadata.json";

/// Subdirectory of the plugin data directory that holds the files on the node.
pub const HOST_SUBDIR: &str = "dra-device-metadata";

/// The claim annotation that names the pod's claim entry of a generated claim.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// CDI class of the metadata specs: kind `<driver>/metadata`.
pub const METADATA_CDI_CLASS: &str = "metadata";

/// A version of the metadata API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetadataVersion {
    /// `metadata.resource.k8s.io/v1alpha1` (still written by upstream's helper when enabled).
    V1alpha1,
    /// `metadata.resource.k8s.io/v1beta1`, the latest, which every driver must enable.
    V1beta1,
}

impl MetadataVersion {
    /// Every version, oldest first.
    pub const ALL: [MetadataVersion; 2] = [MetadataVersion::V1alpha1, MetadataVersion::V1beta1];

    /// The version part, e.g. `v1beta1`.
    pub fn version(self) -> &'static str {
        match self {
            MetadataVersion::V1alpha1 => "v1alpha1",
            MetadataVersion::V1beta1 => "v1beta1",
        }
    }

    /// The `apiVersion` field, e.g. `metadata.resource.k8s.io/v1beta1`.
    pub fn api_version(self) -> String {
        format!("{METADATA_GROUP}/{}", self.version())
    }

    /// The version an `apiVersion` names, if known.
    pub fn from_api_version(api_version: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.api_version() == api_version)
    }
}

/// A metadata configuration upstream's helper rejects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataConfigError {
    /// No version was chosen.
    #[error("metadata versions must be explicitly selected, none chosen")]
    NoVersion,
    /// The latest version is not among them.
    #[error("the latest metadata version is {METADATA_GROUP}/v1beta1 and must be enabled explicitly")]
    LatestMissing,
}

/// Device metadata of one plugin instance (upstream's `EnableDeviceMetadata(true, versions)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataConfig {
    /// The plugin data directory as the node (and the proxy pod, at the same path) sees it:
    /// `<kubelet root>/plugins/<driver>`.
    pub plugin_data_dir: PathBuf,
    /// The versions each file holds, in this order; duplicates are dropped.
    pub versions: Vec<MetadataVersion>,
}

impl MetadataConfig {
    /// Checks the versions as upstream's helper does: at least one, v1beta1 among them.
    pub fn new(
        plugin_data_dir: impl Into<PathBuf>,
        versions: &[MetadataVersion],
    ) -> Result<Self, MetadataConfigError> {
        if versions.is_empty() {
            return Err(MetadataConfigError::NoVersion);
        }
        if !versions.contains(&MetadataVersion::V1beta1) {
            return Err(MetadataConfigError::LatestMissing);
        }
        let mut unique = Vec::new();
        for v in versions {
            if !unique.contains(v) {
                unique.push(*v);
            }
        }
        Ok(MetadataConfig { plugin_data_dir: plugin_data_dir.into(), versions: unique })
    }

    /// `<plugin data dir>/dra-device-metadata`: every claim's files.
    pub fn host_root(&self) -> PathBuf {
        self.plugin_data_dir.join(HOST_SUBDIR)
    }

    /// `<plugin data dir>/dra-device-metadata/<namespace>_<claim>`.
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> PathBuf {
        self.host_root().join(format!("{namespace}_{claim}"))
    }

    /// `<claim dir>/<base request>/metadata.json`.
    pub fn host_file(&self, namespace: &str, claim: &str, base_request: &str) -> PathBuf {
        self.claim_dir(namespace, claim).join(base_request).join("metadata.json")
    }
}

/// Where a directly referenced claim's file appears in a container.
pub fn resource_claim_file_path(driver: &str, claim: &str, request: &str) -> String {
    format!("{CONTAINER_DIR}/{RESOURCE_CLAIMS_SUBDIR}/{claim}/{request}/{driver}{METADATA_FILE_SUFFIX}")
}

/// Where a template-generated claim's file appears in a container (by the pod's claim name).
pub fn resource_claim_template_file_path(driver: &str, pod_claim: &str, request: &str) -> String {
    format!(
        "{CONTAINER_DIR}/{RESOURCE_CLAIM_TEMPLATES_SUBDIR}/{pod_claim}/{request}/{driver}{METADATA_FILE_SUFFIX}"
    )
}

/// The metadata CDI device name: `<claim UID>_<base request>`.
pub fn cdi_device_name(claim_uid: &str, base_request: &str) -> String {
    format!("{claim_uid}_{base_request}")
}

/// `<driver>/metadata=<claim UID>_<base request>`.
pub fn cdi_device_id(driver: &str, claim_uid: &str, base_request: &str) -> String {
    format!("{driver}/{METADATA_CDI_CLASS}={}", cdi_device_name(claim_uid, base_request))
}

/// `<cdi dir>/<driver>_metadata_<claim UID>_<base request>.json`.
pub fn cdi_spec_path(cdi_dir: &Path, driver: &str, claim_uid: &str, base_request: &str) -> PathBuf {
    cdi_dir.join(format!("{driver}_metadata_{claim_uid}_{base_request}.json"))
}

/// The CDI spec that bind-mounts `host_file` at `container_path`. Its version is the minimum
/// CDI needs: 0.5.0 when the device name starts with a digit (a UID may), else 0.3.0.
pub fn cdi_spec(driver: &str, device_name: String, host_file: &Path, container_path: String) -> CdiSpec {
    let version = if device_name.starts_with(|c: char| c.is_ascii_digit()) { "0.5.0" } else { "0.3.0" };
    CdiSpec {
        version: version.to_owned(),
        kind: format!("{driver}/{METADATA_CDI_CLASS}"),
        devices: vec![CdiDevice {
            name: device_name,
            container_edits: CdiContainerEdits {
                env: Vec::new(),
                mounts: vec![CdiMount {
                    host_path: host_file.display().to_string(),
                    container_path,
                    options: vec!["ro".to_owned(), "bind".to_owned()],
                }],
            },
        }],
        container_edits: CdiContainerEdits::default(),
    }
}

/// The `metadata` of a [`DeviceMetadata`]: the claim's identity and the file's generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataObjectMeta {
    /// The claim's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The claim's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The claim's UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// 1 when written at prepare, incremented by each update.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// One metadata object (`DeviceMetadata` of v1alpha1 and v1beta1, which have the same fields).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceMetadata {
    /// Always [`METADATA_KIND`].
    #[serde(default)]
    pub kind: String,
    /// `metadata.resource.k8s.io/<version>`.
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    /// The claim's identity.
    #[serde(default)]
    pub metadata: MetadataObjectMeta,
    /// The pod's name for a template-generated claim (`pod.spec.resourceClaims[].name`).
    #[serde(rename = "podClaimName", default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// One entry: the request this file is for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<DeviceMetadataRequest>,
}

/// The devices of one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceMetadataRequest {
    /// The request name as in the allocation result (may be `<request>/<subrequest>`).
    pub name: String,
    /// The request's devices of this driver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<MetadataDevice>,
}

/// One allocated device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataDevice {
    /// The driver.
    pub driver: String,
    /// The device's pool.
    pub pool: String,
    /// The device's name.
    pub name: String,
    /// Attributes as in a ResourceSlice; upstream's test driver sets `driverName`, `pool` and
    /// `device` to strings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Network data of a network device.
    #[serde(rename = "networkData", default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<NetworkDeviceData>,
}

impl MetadataDevice {
    /// A device with the attributes upstream's test driver gives it: `driverName`, `pool` and
    /// `device` as strings.
    pub fn test_driver(driver: &str, pool: &str, device: &str) -> Self {
        let string = |s: &str| DeviceAttribute { string: Some(s.to_owned()), ..Default::default() };
        let attributes = [("driverName", driver), ("pool", pool), ("device", device)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), string(v)))
            .collect();
        MetadataDevice {
            driver: driver.to_owned(),
            pool: pool.to_owned(),
            name: device.to_owned(),
            attributes,
            network_data: None,
        }
    }

    /// A string attribute.
    pub fn string_attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).and_then(|a| a.string.as_deref())
    }
}

/// A stream that is not a valid metadata file.
#[derive(Debug, thiserror::Error)]
pub enum MetadataDecodeError {
    /// Not a stream of JSON objects.
    #[error("object #{index} of the stream is not valid JSON: {source}")]
    Json {
        /// Which object (0 = first).
        index: usize,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// An object of a known version does not have the metadata fields.
    #[error("object #{index} ({api_version}) is not a DeviceMetadata: {source}")]
    Object {
        /// Which object.
        index: usize,
        /// Its apiVersion.
        api_version: String,
        /// The error.
        source: serde_json::Error,
    },
    /// No object of a known version.
    #[error("no object of a known version (found: {found:?})")]
    NoKnownVersion {
        /// The apiVersions (and kinds) found.
        found: Vec<String>,
    },
}

impl DeviceMetadata {
    /// The object for `version`.
    pub fn for_version(&self, version: MetadataVersion) -> DeviceMetadata {
        DeviceMetadata { kind: METADATA_KIND.to_owned(), api_version: version.api_version(), ..self.clone() }
    }

    /// The file content: one pretty-printed object per version, each followed by a newline.
    pub fn encode_stream(&self, versions: &[MetadataVersion]) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::new();
        for version in versions {
            serde_json::to_writer_pretty(&mut out, &self.for_version(*version))?;
            out.push(b'\n');
        }
        Ok(out)
    }

    /// Every object of a stream of a known kind and version, in order, with that version;
    /// objects of other versions or kinds are skipped, as upstream's decoder skips them.
    pub fn decode_stream(data: &[u8]) -> Result<Vec<(MetadataVersion, DeviceMetadata)>, MetadataDecodeError> {
        let mut known = Vec::new();
        let mut found = Vec::new();
        let stream = serde_json::Deserializer::from_slice(data).into_iter::<serde_json::Value>();
        for (index, value) in stream.enumerate() {
            let value = value.map_err(|source| MetadataDecodeError::Json { index, source })?;
            let field = |name: &str| value.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
            let (api_version, kind) = (field("apiVersion"), field("kind"));
            found.push(format!("{kind} {api_version}"));
            let Some(version) = MetadataVersion::from_api_version(&api_version) else { continue };
            if kind != METADATA_KIND {
                continue;
            }
            let object = serde_json::from_value(value).map_err(|source| MetadataDecodeError::Object {
                index,
                api_version,
                source,
            })?;
            known.push((version, object));
        }
        if known.is_empty() {
            return Err(MetadataDecodeError::NoKnownVersion { found });
        }
        Ok(known)
    }

    /// What upstream's validation of the versioned object rejects (the subset that applies to
    /// what drivers write): each request needs a name; each device a driver that is a DNS
    /// subdomain of at most 63 characters, a pool of DNS subdomains separated by `/` (at most
    /// 253 characters), a name that is a DNS label, at most 32 attributes; the pod claim name,
    /// if set, a DNS label. Empty when valid.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(name) = &self.pod_claim_name
            && !is_dns_label(name)
        {
            problems.push(format!("podClaimName {name:?} is not a DNS label"));
        }
        for (i, request) in self.requests.iter().enumerate() {
            if request.name.is_empty() {
                problems.push(format!("requests[{i}].name is empty"));
            }
            for (j, device) in request.devices.iter().enumerate() {
                let at = format!("requests[{i}].devices[{j}]");
                if device.driver.len() > 63 || !is_dns_subdomain(&device.driver) {
                    problems.push(format!(
                        "{at}.driver {:?} is not a DNS subdomain of <= 63 characters",
                        device.driver
                    ));
                }
                if device.pool.len() > 253 || !device.pool.split('/').all(is_dns_subdomain) {
                    problems.push(format!("{at}.pool {:?} is not a valid pool name", device.pool));
                }
                if !is_dns_label(&device.name) {
                    problems.push(format!("{at}.name {:?} is not a DNS label", device.name));
                }
                if device.attributes.len() > 32 {
                    problems.push(format!("{at} has {} attributes, at most 32", device.attributes.len()));
                }
            }
        }
        problems
    }
}

/// A DNS label (RFC 1123): 1-63 of `[a-z0-9-]`, alphanumeric at both ends.
fn is_dns_label(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| ok(c) || c == '-')
        && s.starts_with(ok)
        && s.ends_with(ok)
}

/// A DNS subdomain (RFC 1123): at most 253 characters, labels separated by dots.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
