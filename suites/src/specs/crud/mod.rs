//! `[sig-node] [DRA] CRUD Tests`: the API conformance tests of upstream's
//! test/e2e/dra/dra.go (Kubernetes v1.37). Each spec runs the generic CRUD
//! test of [`testcase`] against one resource of `resource.k8s.io`, with the
//! test data upstream uses:
//!
//! | spec | upstream release | status | patch types |
//! |---|---|---|---|
//! | `resource.k8s.io/v1 DeviceClass` | Conformance v1.35 | — | strategic merge |
//! | `resource.k8s.io/v1 DeviceTaintRule` | Conformance v1.37 | conditions | strategic merge (spec and status) |
//! | `resource.k8s.io/v1 ResourceClaim` | Conformance v1.35 | allocation | all four, spec and status |
//! | `resource.k8s.io/v1 ResourceClaimTemplate` | Conformance v1.35 | — | strategic merge |
//! | `resource.k8s.io/v1 ResourceSlice` | Conformance v1.35 | — | strategic merge |
//! | `resource.k8s.io/v1alpha3 ResourcePoolStatusRequest` | alpha, FG `DRAResourcePoolStatus` | — | strategic merge |
//!
//! They need nothing but the API server: no nodes, no driver. The objects
//! select or describe no real devices (CEL `false`, an empty taint selector,
//! a pool of a node that does not exist), so they cannot disturb other specs.
//! DeviceTaintRule and ResourcePoolStatusRequest are skipped with the reason
//! when the cluster does not serve them.
//!
//! The admin-access validation spec of dra.go ("validate ResourceClaimTemplate
//! and ResourceClaim for admin access") belongs to upstream's `control plane`
//! group with a test driver, not to `CRUD Tests`, and is not registered here.

mod recorder;
mod testcase;

use harness::framework::{Ctx, Label, Registry, Skip, SpecResult};
use k8s_openapi::{
    api::resource::{
        v1::{Device, DeviceClass, DeviceTaintRule, ResourceClaim, ResourceClaimTemplate, ResourceSlice},
        v1alpha3::ResourcePoolStatusRequest,
    },
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff,
    serde::Serialize,
};
use kube::Api;
use serde_json::{Value, json};

use self::testcase::{
    Check, Modify, PatchData, PatchType, ResourceTestcase, StatusCase, discovery_lists, test_resource,
};

/// The label upstream adds when a spec cannot change an immutable spec.
const UPDATE_LABEL: &str = "test.dra.example.com";
/// The driver and device class name upstream's test data uses.
const EXAMPLE_DRIVER: &str = "dra.example.com";

/// `framework.ConformanceIt`: upstream's framework always renders `Conformance` at the end.
const CONFORMANCE: Label = Label::trailing("Conformance");

/// Registers the `CRUD Tests` specs under `[sig-node] [DRA]`.
pub fn register(registry: &mut Registry) {
    registry.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context("CRUD Tests", |r| {
            r.it("resource.k8s.io/v1 DeviceClass", device_class).label(CONFORMANCE);
            r.it("resource.k8s.io/v1 DeviceTaintRule", device_taint_rule).label(CONFORMANCE);
            r.it("resource.k8s.io/v1 ResourceClaim", resource_claim).label(CONFORMANCE);
            r.it("resource.k8s.io/v1 ResourceClaimTemplate", resource_claim_template).label(CONFORMANCE);
            r.it("resource.k8s.io/v1 ResourceSlice", resource_slice).label(CONFORMANCE);
            // Upstream: f.WithFeatureGate(features.DRAResourcePoolStatus).
            r.it("resource.k8s.io/v1alpha3 ResourcePoolStatusRequest", resource_pool_status_request)
                .label(Label::gate("DRAResourcePoolStatus"));
        });
    });
}

/// Release v1.35, "CRUD operations for deviceclasses".
async fn device_class(ctx: Ctx) -> SpecResult {
    let tc = ResourceTestcase {
        plural: "deviceclasses",
        initial: from_json::<DeviceClass>(json!({
            // Matches no devices.
            "spec": {"selectors": [{"cel": {"expression": "false"}}]},
        }))?,
        check_initial: check(|c: &DeviceClass| {
            expect_field(c, "/spec/selectors/0/cel/expression", json!("false"))
        }),
        update_spec: modify(|c: &mut DeviceClass| {
            // Still matches no devices.
            let selectors = c.spec.get_or_insert_default().selectors.get_or_insert_default();
            if let Some(cel) = selectors.first_mut().and_then(|s| s.cel.as_mut()) {
                cel.expression = "1 == 0".to_owned();
            }
        }),
        check_updated: check(|c: &DeviceClass| {
            expect_field(c, "/spec/selectors/0/cel/expression", json!("1 == 0"))
        }),
        spec_patches: vec![PatchData::new(
            PatchType::StrategicMerge,
            r#"{"spec": {"selectors": [{"cel": {"expression": "1 == 0"}}]}}"#,
        )],
        status: None,
    };
    let api: Api<DeviceClass> = Api::all(ctx.client().clone());
    test_resource(&ctx, api.clone(), api, false, tc).await?;
    Ok(())
}

/// Release v1.37, "CRUD operations for devicetaintrules".
async fn device_taint_rule(ctx: Ctx) -> SpecResult {
    if !discovery_lists(&ctx, "resource.k8s.io/v1", "devicetaintrules").await? {
        return Err(Skip::because(
            "the cluster does not serve devicetaintrules in resource.k8s.io/v1 (GA in Kubernetes 1.37, feature gate DRADeviceTaintRules)",
        ));
    }
    // One timestamp for the update and the patch, encoded as the API encodes it.
    let now = Time(jiff::Timestamp::now());
    let condition = json!({
        "type": "Testing",
        "status": "True",
        "lastTransitionTime": serde_json::to_value(&now)?,
        "reason": "E2E_test_running",
        "message": "This condition can be ignored.",
    });
    let status_patch = json!({"status": {"conditions": [condition.clone()]}});
    let new_condition: Condition = from_json(condition.clone())?;
    let tc = ResourceTestcase {
        plural: "devicetaintrules",
        initial: from_json::<DeviceTaintRule>(json!({
            // No device selector: no devices are selected, so the rule is harmless.
            "spec": {"taint": {"key": "testing", "effect": "None"}},
        }))?,
        check_initial: check(|r: &DeviceTaintRule| {
            expect_field(r, "/spec/taint/key", json!("testing"))?;
            expect_field(r, "/spec/taint/effect", json!("None"))
        }),
        update_spec: modify(|r: &mut DeviceTaintRule| r.spec.taint.effect = "NoExecute".to_owned()),
        check_updated: check(|r: &DeviceTaintRule| expect_field(r, "/spec/taint/effect", json!("NoExecute"))),
        spec_patches: vec![PatchData::new(
            PatchType::StrategicMerge,
            r#"{"spec": {"taint": {"effect": "NoExecute"}}}"#,
        )],
        status: Some(StatusCase {
            update: modify(move |r: &mut DeviceTaintRule| {
                r.status
                    .get_or_insert_default()
                    .conditions
                    .get_or_insert_default()
                    .push(new_condition.clone());
            }),
            check: check(move |r: &DeviceTaintRule| {
                let conditions = field(r, "/status/conditions")?;
                let found = conditions.as_array().is_some_and(|list| {
                    list.iter().any(|c| {
                        ["type", "status", "lastTransitionTime", "reason", "message"]
                            .iter()
                            .all(|k| c.get(k) == condition.get(k))
                    })
                });
                anyhow::ensure!(
                    found,
                    "/status/conditions is {conditions}, expected it to include {condition}"
                );
                Ok(())
            }),
            patches: vec![PatchData::new(PatchType::StrategicMerge, status_patch.to_string())],
        }),
    };
    let api: Api<DeviceTaintRule> = Api::all(ctx.client().clone());
    test_resource(&ctx, api.clone(), api, false, tc).await?;
    Ok(())
}

/// Release v1.35, "CRUD operations for resourceclaims": all four patch types,
/// for the object and for its status.
async fn resource_claim(ctx: Ctx) -> SpecResult {
    let label_patch = format!(r#"{{"metadata": {{"labels": {{"{UPDATE_LABEL}": "test"}}}}}}"#);
    let allocation_patch = r#"{"status": {"allocation": {}}}"#;
    let tc = ResourceTestcase {
        plural: "resourceclaims",
        initial: from_json::<ResourceClaim>(json!({
            "spec": {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": EXAMPLE_DRIVER}}]}},
        }))?,
        check_initial: check(|c: &ResourceClaim| {
            expect_field(c, "/spec/devices/requests/0/exactly/deviceClassName", json!(EXAMPLE_DRIVER))
        }),
        // The spec is immutable: add a label instead.
        update_spec: modify(|c: &mut ResourceClaim| add_update_label(&mut c.metadata)),
        check_updated: check(has_update_label::<ResourceClaim>),
        spec_patches: vec![
            PatchData::new(PatchType::StrategicMerge, label_patch.clone()),
            PatchData::new(PatchType::Apply, label_patch.clone()),
            PatchData::new(PatchType::JsonMerge, label_patch),
            PatchData::new(
                PatchType::Json,
                format!(r#"[{{"op": "add", "path": "/metadata/labels/{UPDATE_LABEL}", "value": "test"}}]"#),
            ),
        ],
        status: Some(StatusCase {
            // "Nothing allocated" is a valid allocation result.
            update: modify(|c: &mut ResourceClaim| {
                c.status.get_or_insert_default().allocation = Some(Default::default());
            }),
            check: check(|c: &ResourceClaim| {
                let allocation = field(c, "/status/allocation")?;
                anyhow::ensure!(
                    allocation.is_object(),
                    "/status/allocation is {allocation}, expected an object"
                );
                Ok(())
            }),
            patches: vec![
                PatchData::new(PatchType::StrategicMerge, allocation_patch),
                PatchData::new(PatchType::Apply, allocation_patch),
                PatchData::new(PatchType::JsonMerge, allocation_patch),
                PatchData::new(
                    PatchType::Json,
                    r#"[{"op": "add", "path": "/status/allocation", "value": {}}]"#,
                ),
            ],
        }),
    };
    let api: Api<ResourceClaim> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let all: Api<ResourceClaim> = Api::all(ctx.client().clone());
    test_resource(&ctx, api, all, true, tc).await?;
    Ok(())
}

/// Release v1.35, "CRUD operations for resourceclaimtemplates".
async fn resource_claim_template(ctx: Ctx) -> SpecResult {
    let tc = ResourceTestcase {
        plural: "resourceclaimtemplates",
        initial: from_json::<ResourceClaimTemplate>(json!({
            "spec": {"spec": {"devices": {"requests": [
                {"name": "req-0", "exactly": {"deviceClassName": EXAMPLE_DRIVER}},
            ]}}},
        }))?,
        check_initial: check(|t: &ResourceClaimTemplate| {
            expect_field(t, "/spec/spec/devices/requests/0/exactly/deviceClassName", json!(EXAMPLE_DRIVER))
        }),
        // The spec is immutable: add a label instead.
        update_spec: modify(|t: &mut ResourceClaimTemplate| add_update_label(&mut t.metadata)),
        check_updated: check(has_update_label::<ResourceClaimTemplate>),
        spec_patches: vec![PatchData::new(
            PatchType::StrategicMerge,
            format!(r#"{{"metadata": {{"labels": {{"{UPDATE_LABEL}": "test"}}}}}}"#),
        )],
        status: None,
    };
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let all: Api<ResourceClaimTemplate> = Api::all(ctx.client().clone());
    test_resource(&ctx, api, all, true, tc).await?;
    Ok(())
}

/// Release v1.35, "CRUD operations for resoureslices" (sic).
async fn resource_slice(ctx: Ctx) -> SpecResult {
    let tc = ResourceTestcase {
        plural: "resourceslices",
        initial: from_json::<ResourceSlice>(json!({
            "spec": {
                "driver": EXAMPLE_DRIVER,
                "pool": {"name": "cluster", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "no-such-node",
                // The pool is empty: no devices.
            },
        }))?,
        check_initial: check(|s: &ResourceSlice| {
            expect_field(s, "/spec/driver", json!(EXAMPLE_DRIVER))?;
            expect_field(s, "/spec/pool/name", json!("cluster"))?;
            expect_field(s, "/spec/nodeName", json!("no-such-node"))?;
            let devices = s.spec.devices.as_deref().unwrap_or_default();
            anyhow::ensure!(devices.is_empty(), "/spec/devices has {} devices, expected none", devices.len());
            Ok(())
        }),
        update_spec: modify(|s: &mut ResourceSlice| {
            s.spec.devices = Some(vec![Device { name: "device-0".to_owned(), ..Default::default() }]);
        }),
        check_updated: check(|s: &ResourceSlice| {
            let names: Vec<&str> = s.spec.devices.iter().flatten().map(|d| d.name.as_str()).collect();
            anyhow::ensure!(names == ["device-0"], "/spec/devices are {names:?}, expected [\"device-0\"]");
            Ok(())
        }),
        spec_patches: vec![PatchData::new(
            PatchType::StrategicMerge,
            r#"{"spec": {"devices": [{"name": "device-0"}]}}"#,
        )],
        status: None,
    };
    let api: Api<ResourceSlice> = Api::all(ctx.client().clone());
    test_resource(&ctx, api.clone(), api, false, tc).await?;
    Ok(())
}

/// Not conformance: the alpha ResourcePoolStatusRequest (no status update
/// yet, as upstream).
async fn resource_pool_status_request(ctx: Ctx) -> SpecResult {
    const GROUP_VERSION: &str = "resource.k8s.io/v1alpha3";
    const WHY: &str = "(feature gate DRAResourcePoolStatus and runtime config resource.k8s.io/v1alpha3=true)";
    if !ctx.cluster().serves(GROUP_VERSION) {
        return Err(Skip::because(format!("the cluster does not serve {GROUP_VERSION} {WHY}")));
    }
    if !discovery_lists(&ctx, GROUP_VERSION, "resourcepoolstatusrequests").await? {
        return Err(Skip::because(format!(
            "the cluster does not serve resourcepoolstatusrequests in {GROUP_VERSION} {WHY}"
        )));
    }
    let tc = ResourceTestcase {
        plural: "resourcepoolstatusrequests",
        initial: from_json::<ResourcePoolStatusRequest>(json!({"spec": {"driver": EXAMPLE_DRIVER}}))?,
        check_initial: check(|r: &ResourcePoolStatusRequest| {
            expect_field(r, "/spec/driver", json!(EXAMPLE_DRIVER))
        }),
        // The spec is immutable: add a label instead.
        update_spec: modify(|r: &mut ResourcePoolStatusRequest| add_update_label(&mut r.metadata)),
        check_updated: check(has_update_label::<ResourcePoolStatusRequest>),
        spec_patches: vec![PatchData::new(
            PatchType::StrategicMerge,
            format!(r#"{{"metadata": {{"labels": {{"{UPDATE_LABEL}": "test"}}}}}}"#),
        )],
        status: None,
    };
    let api: Api<ResourcePoolStatusRequest> = Api::all(ctx.client().clone());
    test_resource(&ctx, api.clone(), api, false, tc).await?;
    Ok(())
}

fn from_json<K: k8s_openapi::serde::de::DeserializeOwned>(value: Value) -> anyhow::Result<K> {
    Ok(serde_json::from_value(value)?)
}

fn check<K>(f: impl Fn(&K) -> anyhow::Result<()> + Send + Sync + 'static) -> Check<K> {
    Box::new(f)
}

fn modify<K>(f: impl Fn(&mut K) + Send + Sync + 'static) -> Modify<K> {
    Box::new(f)
}

fn add_update_label(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.labels.get_or_insert_default().insert(UPDATE_LABEL.to_owned(), "test".to_owned());
}

fn has_update_label<K: kube::Resource>(obj: &K) -> anyhow::Result<()> {
    let value = obj.meta().labels.as_ref().and_then(|l| l.get(UPDATE_LABEL));
    anyhow::ensure!(
        value.map(String::as_str) == Some("test"),
        "label {UPDATE_LABEL} is {value:?}, expected \"test\""
    );
    Ok(())
}

/// The field at a JSON pointer of the object's JSON form.
fn field<K: Serialize>(obj: &K, pointer: &str) -> anyhow::Result<Value> {
    let value = serde_json::to_value(obj)?;
    value.pointer(pointer).cloned().ok_or_else(|| anyhow::anyhow!("{pointer} is missing"))
}

/// Checks the field at a JSON pointer of the object's JSON form.
fn expect_field<K: Serialize>(obj: &K, pointer: &str, expected: Value) -> anyhow::Result<()> {
    let actual = field(obj, pointer)?;
    anyhow::ensure!(actual == expected, "{pointer} is {actual}, expected {expected}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_texts_match_upstream() {
        let mut registry = Registry::for_version(crate::versions::DEFAULT);
        register(&mut registry);
        let texts: Vec<&str> = registry.specs().map(|s| s.full_text()).collect();
        assert_eq!(
            texts,
            [
                "[sig-node] [DRA] CRUD Tests resource.k8s.io/v1 DeviceClass [Conformance]",
                "[sig-node] [DRA] CRUD Tests resource.k8s.io/v1 DeviceTaintRule [Conformance]",
                "[sig-node] [DRA] CRUD Tests resource.k8s.io/v1 ResourceClaim [Conformance]",
                "[sig-node] [DRA] CRUD Tests resource.k8s.io/v1 ResourceClaimTemplate [Conformance]",
                "[sig-node] [DRA] CRUD Tests resource.k8s.io/v1 ResourceSlice [Conformance]",
                "[sig-node] [DRA] CRUD Tests resource.k8s.io/v1alpha3 ResourcePoolStatusRequest [FeatureGate:DRAResourcePoolStatus] [Alpha] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation]",
            ]
        );
        assert!(registry.validate().is_ok());
    }

    #[test]
    fn test_data_decodes_and_checks_fail_on_wrong_values() -> anyhow::Result<()> {
        let mut class: DeviceClass =
            from_json(json!({"spec": {"selectors": [{"cel": {"expression": "false"}}]}}))?;
        expect_field(&class, "/spec/selectors/0/cel/expression", json!("false"))?;
        assert!(expect_field(&class, "/spec/selectors/0/cel/expression", json!("1 == 0")).is_err());
        assert!(has_update_label(&class).is_err());
        add_update_label(&mut class.metadata);
        has_update_label(&class)?;
        Ok(())
    }
}
