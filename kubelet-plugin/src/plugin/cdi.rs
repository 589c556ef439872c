//! CDI spec content for prepared claims, as upstream's test driver writes it.
//!
//! Per allocation result of this driver: one spec with `cdiVersion` 0.3.0,
//! kind `<driver>/test`, one device `claim-<claimUID>-<baseRequest>` whose
//! container edits set environment variables:
//! - `user_<key>=<value>` from opaque claim configs of this driver,
//! - `admin_<key>=<value>` from opaque DeviceClass configs (source `FromClass`),
//! - `claim_<claim>_<baseRequest>=true`, every non-alphanumeric character of
//!   that name replaced by `_`,
//!
//! as `KEY=VALUE` strings sorted. The file is
//! `<cdiDir>/<driver>-<claimUID>-<baseRequest>.json`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, DeviceRequestAllocationResult};
use serde::Serialize;

/// The CDI spec version upstream's driver writes (the minimum for env edits).
pub const CDI_VERSION: &str = "0.3.0";

/// CDI class used in the kind `<driver>/test`.
pub const CDI_CLASS: &str = "test";

/// Config source value for DeviceClass configs.
const SOURCE_CLASS: &str = "FromClass";

/// The part of a request reference before `/` (subrequests are `request/sub`).
pub fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// `claim-<uid>-<baseRequest>`.
pub fn device_name(claim_uid: &str, base_request: &str) -> String {
    format!("claim-{claim_uid}-{base_request}")
}

/// `<driver>/test`.
pub fn kind(driver: &str) -> String {
    format!("{driver}/{CDI_CLASS}")
}

/// `<driver>/test=claim-<uid>-<baseRequest>`.
pub fn device_id(driver: &str, claim_uid: &str, base_request: &str) -> String {
    format!("{}={}", kind(driver), device_name(claim_uid, base_request))
}

/// `<cdiDir>/<driver>-<uid>-<baseRequest>.json`.
pub fn spec_path(cdi_dir: &Path, driver: &str, claim_uid: &str, base_request: &str) -> PathBuf {
    cdi_dir.join(format!("{driver}-{claim_uid}-{base_request}.json"))
}

/// The CDI class of static devices: kind `<driver>/device`.
pub const STATIC_CLASS: &str = "device";

/// `<driver>/device=<device>`: a device of the [`static_spec`] ([`PluginConfig::static_cdi`](super::PluginConfig::static_cdi)).
pub fn static_device_id(driver: &str, device: &str) -> String {
    format!("{driver}/{STATIC_CLASS}={device}")
}

/// The static spec of `devices` (kind `<driver>/device`): each sets `<DEVICE>=<device>` in the
/// container, its name in upper case with every character outside `[A-Z0-9]` replaced by `_`.
pub fn static_spec(driver: &str, devices: &[String]) -> CdiSpec {
    let device = |name: &String| {
        let key: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
            .collect();
        CdiDevice {
            name: name.clone(),
            container_edits: CdiContainerEdits { env: vec![format!("{key}={name}")], mounts: Vec::new() },
        }
    };
    CdiSpec {
        version: CDI_VERSION.to_string(),
        kind: format!("{driver}/{STATIC_CLASS}"),
        devices: devices.iter().map(device).collect(),
        container_edits: CdiContainerEdits::default(),
    }
}

/// `claim_<claim>_<baseRequest>` with every character outside `[a-zA-Z0-9]`
/// replaced by `_`.
pub fn claim_env_name(claim_name: &str, base_request: &str) -> String {
    format!("claim_{claim_name}_{base_request}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Whether a config applies to a result: no request list, or it names the
/// result's request or its base request.
fn config_applies(config: &DeviceAllocationConfiguration, request: &str) -> bool {
    match &config.requests {
        None => true,
        Some(requests) if requests.is_empty() => true,
        Some(requests) => requests.iter().any(|r| r == request || r == base_request(request)),
    }
}

/// The environment for one allocation result, as sorted `KEY=VALUE` strings.
///
/// Configs are applied in order (later wins); only opaque configs of
/// `driver` count. Parameters must be a JSON object of strings; otherwise the
/// error is upstream's `parameters in config #<i>: decoding <user|admin>
/// parameters: ...`, with `i` counting the configs that apply to the result.
pub fn env_for_result(
    driver: &str,
    claim_name: &str,
    configs: &[DeviceAllocationConfiguration],
    result: &DeviceRequestAllocationResult,
) -> Result<Vec<String>, String> {
    let mut env = BTreeMap::new();
    let applicable = configs.iter().filter(|c| c.opaque.is_some() && config_applies(c, &result.request));
    for (i, config) in applicable.enumerate() {
        let Some(opaque) = &config.opaque else {
            continue;
        };
        if opaque.driver != driver {
            continue;
        }
        let prefix = if config.source == SOURCE_CLASS { "admin" } else { "user" };
        let parameters = &opaque.parameters.0;
        if parameters.is_null() {
            continue;
        }
        let values: BTreeMap<String, String> = serde_json::from_value(parameters.clone())
            .map_err(|e| format!("parameters in config #{i}: decoding {prefix} parameters: {e}"))?;
        for (key, value) in values {
            env.insert(format!("{prefix}_{key}"), value);
        }
    }
    env.insert(claim_env_name(claim_name, base_request(&result.request)), "true".to_string());
    let mut strings: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    // Sorted as strings, like upstream (differs from key order for e.g. "a" vs "a0").
    strings.sort();
    Ok(strings)
}

/// A CDI spec file, serialized with upstream's field order.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CdiSpec {
    /// Always [`CDI_VERSION`].
    #[serde(rename = "cdiVersion")]
    pub version: String,
    /// `<driver>/test`.
    pub kind: String,
    /// Exactly one device (every device of the node in a [`static_spec`]).
    pub devices: Vec<CdiDevice>,
    /// Spec-wide edits: always empty, present because upstream's Go encoder
    /// writes the empty struct.
    #[serde(rename = "containerEdits", default)]
    pub container_edits: CdiContainerEdits,
}

/// One CDI device.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CdiDevice {
    /// `claim-<uid>-<baseRequest>`.
    pub name: String,
    /// The environment to set.
    #[serde(rename = "containerEdits")]
    pub container_edits: CdiContainerEdits,
}

/// CDI container edits: `env` (the test specs) and `mounts` (the device metadata specs).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CdiContainerEdits {
    /// `KEY=VALUE` strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<CdiMount>,
}

/// A CDI mount.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CdiMount {
    /// The path on the node.
    #[serde(rename = "hostPath")]
    pub host_path: String,
    /// The path in the container.
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// Mount options, e.g. `ro`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl CdiSpec {
    /// The spec for one device of `driver` with environment `env`.
    pub fn new(driver: &str, device_name: String, env: Vec<String>) -> Self {
        CdiSpec {
            version: CDI_VERSION.to_string(),
            kind: kind(driver),
            devices: vec![CdiDevice {
                name: device_name,
                container_edits: CdiContainerEdits { env, mounts: Vec::new() },
            }],
            container_edits: CdiContainerEdits::default(),
        }
    }

    /// The JSON file content.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::resource::v1::OpaqueDeviceConfiguration, apimachinery::pkg::runtime::RawExtension,
    };
    use rstest::rstest;

    fn config(
        driver: &str,
        source: &str,
        requests: Option<&[&str]>,
        params: serde_json::Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(params),
            }),
            requests: requests.map(|r| r.iter().map(|s| s.to_string()).collect()),
            source: source.into(),
        }
    }

    fn result(request: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            device: "device-00".into(),
            driver: "d.k8s.io".into(),
            pool: "node-1".into(),
            request: request.into(),
            ..Default::default()
        }
    }

    #[rstest]
    #[case("my-claim", "my-request", "claim_my_claim_my_request")]
    #[case("a.b", "r", "claim_a_b_r")]
    #[case("x", "req", "claim_x_req")]
    fn claim_env_names(#[case] claim: &str, #[case] request: &str, #[case] expected: &str) {
        assert_eq!(claim_env_name(claim, request), expected);
    }

    #[test]
    fn env_user_admin_and_claim() {
        let configs = vec![
            config("d.k8s.io", "FromClass", None, serde_json::json!({"x": "1"})),
            config("other.k8s.io", "FromClaim", None, serde_json::json!({"ignored": "y"})),
            config("d.k8s.io", "FromClaim", Some(&["other"]), serde_json::json!({"nope": "z"})),
            config("d.k8s.io", "FromClaim", Some(&["req"]), serde_json::json!({"a": "b", "a0": "c"})),
            config("d.k8s.io", "FromClaim", None, serde_json::json!({"a": "later"})),
        ];
        let env = env_for_result("d.k8s.io", "my-claim", &configs, &result("req/sub")).unwrap();
        assert_eq!(env, ["admin_x=1", "claim_my_claim_req=true", "user_a0=c", "user_a=later"]);
    }

    #[test]
    fn bad_parameters() {
        let configs = vec![
            config("other.k8s.io", "FromClaim", None, serde_json::json!({"a": "b"})),
            config("d.k8s.io", "FromClaim", None, serde_json::json!({"a": 1})),
        ];
        let err = env_for_result("d.k8s.io", "c", &configs, &result("r")).unwrap_err();
        assert!(err.starts_with("parameters in config #1: decoding user parameters: "), "{err}");
    }

    #[test]
    fn spec_json_field_order() {
        let spec = CdiSpec::new("d.k8s.io", device_name("uid", "r"), vec!["A=b".into()]);
        let json = String::from_utf8(spec.to_json().unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"cdiVersion":"0.3.0","kind":"d.k8s.io/test","devices":[{"name":"claim-uid-r","containerEdits":{"env":["A=b"]}}],"containerEdits":{}}"#
        );
        assert_eq!(device_id("d.k8s.io", "uid", "r"), "d.k8s.io/test=claim-uid-r");
        assert_eq!(
            spec_path(Path::new("/cdi"), "d.k8s.io", "uid", "r"),
            Path::new("/cdi/d.k8s.io-uid-r.json")
        );
    }

    #[test]
    fn the_static_spec_defines_every_device_with_its_env() {
        let spec = static_spec("d.k8s.io", &["device-00".to_owned(), "gpu.1".to_owned()]);
        assert_eq!(spec.kind, "d.k8s.io/device");
        let devices: Vec<(&str, &[String])> =
            spec.devices.iter().map(|d| (d.name.as_str(), d.container_edits.env.as_slice())).collect();
        assert_eq!(
            devices,
            [
                ("device-00", &["DEVICE_00=device-00".to_owned()][..]),
                ("gpu.1", &["GPU_1=gpu.1".to_owned()][..])
            ]
        );
        assert_eq!(static_device_id("d.k8s.io", "device-00"), "d.k8s.io/device=device-00");
    }
}
