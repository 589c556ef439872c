//! `[sig-api-machinery] ResourceQuota should create a ResourceQuota and capture the life of a
//! ResourceClaim`: upstream's test/e2e/apimachinery/resource_quota.go, the one spec outside
//! test/e2e/dra that `--ginkgo.focus=DRA` selects (it is labelled `DRA`).
//!
//! As upstream: count the namespace's quotas once their number is stable; create quota
//! `test-quota` with upstream's hard limits plus one ResourceClaim and one device of class `gold`;
//! wait for its status to count the quotas (one more), no claim and no device; create claim
//! `test-claim` requesting one device of class `gold` (the class need not exist: the claim is
//! never allocated); wait for one claim and one device; delete the claim; wait for zero again.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use harness::{
    framework::{Ctx, Label, Registry, SpecResult, step},
    wait::{self, Verdict},
};
use k8s_openapi::api::{core::v1::ResourceQuota, resource::v1::ResourceClaim};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

/// Upstream's quota and claim names, and its device class.
const QUOTA: &str = "test-quota";
const CLAIM: &str = "test-claim";
const CLASS_GOLD: &str = "gold";
/// Upstream's `core.ClaimObjectCountName`.
const CLAIM_COUNT: &str = "count/resourceclaims.resource.k8s.io";
/// The quota's `resourcequotas` entry.
const QUOTAS: &str = "resourcequotas";
/// How long the quota controller may take to update the status (upstream's e2e framework's
/// default `Eventually` timeout).
const QUOTA_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the namespace's quota count may take to settle, and how long it must stay the same
/// (upstream's `countResourceQuota`: 30 s, polled every second, stable for 5 polls).
const COUNT_TIMEOUT: Duration = Duration::from_secs(30);
const COUNT_STABLE_POLLS: u32 = 5;

/// Registers the spec under `[sig-api-machinery] ResourceQuota`.
pub fn register(registry: &mut Registry) {
    registry.describe("[sig-api-machinery]", |r| {
        r.context("ResourceQuota", |r| {
            // Upstream: f.WithFeatureGate(features.DynamicResourceAllocation) (removed in
            // v1.38, where the spec no longer names it), f.WithLabel("DRA").
            r.it("should create a ResourceQuota and capture the life of a ResourceClaim", claim_life)
                .labels([Label::gate("DynamicResourceAllocation"), Label::new("DRA")]);
        });
    });
}

/// Upstream's `newTestResourceQuota` hard limits, plus `newTestResourceQuotaDRA`'s two.
fn hard_limits() -> BTreeMap<String, String> {
    let gold_storage = |r: &str| format!("{CLASS_GOLD}.storageclass.storage.k8s.io/{r}");
    [
        ("pods", "5"),
        ("services", "10"),
        ("services.nodeports", "1"),
        ("services.loadbalancers", "1"),
        ("replicationcontrollers", "10"),
        (QUOTAS, "1"),
        ("cpu", "1"),
        ("memory", "500Mi"),
        ("configmaps", "10"),
        ("secrets", "10"),
        ("persistentvolumeclaims", "10"),
        ("requests.storage", "10Gi"),
        ("ephemeral-storage", "50Gi"),
        (&gold_storage("persistentvolumeclaims"), "10"),
        (&gold_storage("requests.storage"), "10Gi"),
        ("count/replicasets.apps", "5"),
        ("requests.example.com/dongle", "3"),
        (CLAIM_COUNT, "1"),
        (&device_class_devices(), "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Upstream's `core.V1ResourceByDeviceClass(classGold)`.
fn device_class_devices() -> String {
    format!("{CLASS_GOLD}.deviceclass.resource.k8s.io/devices")
}

/// `(resource, quantity)` pairs as a used-resources map.
fn used(entries: &[(&str, String)]) -> BTreeMap<String, String> {
    entries.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
}

/// Whether the quota's `status.used` has every `expected` entry (others are ignored, as
/// upstream's `haveUsedResources`).
fn shows_used(quota: &ResourceQuota, expected: &BTreeMap<String, String>) -> bool {
    let Some(used) = quota.status.as_ref().and_then(|s| s.used.as_ref()) else { return false };
    expected.iter().all(|(k, v)| used.get(k).is_some_and(|q| &q.0 == v))
}

/// Upstream's `waitForResourceQuota`.
async fn wait_used(api: &Api<ResourceQuota>, expected: &BTreeMap<String, String>, what: &str) -> SpecResult {
    wait::existing(api, QUOTA, format!("ResourceQuota {QUOTA} {what} ({expected:?})"), QUOTA_TIMEOUT, |q| {
        Verdict::done_if(shows_used(q, expected))
    })
    .await?;
    Ok(())
}

/// Upstream's `countResourceQuota`: the number of quotas once it has not changed for five polls.
async fn count_quotas(api: &Api<ResourceQuota>) -> anyhow::Result<usize> {
    let deadline = tokio::time::Instant::now() + COUNT_TIMEOUT;
    let (mut found, mut unchanged) = (0, 0);
    loop {
        let n = api.list(&ListParams::default()).await.context("list ResourceQuotas")?.items.len();
        if n == found {
            unchanged += 1;
            if unchanged >= COUNT_STABLE_POLLS {
                return Ok(found);
            }
        } else {
            (found, unchanged) = (n, 0);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the number of ResourceQuotas did not settle within {COUNT_TIMEOUT:?} (last {found})"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// "should create a ResourceQuota and capture the life of a ResourceClaim".
async fn claim_life(ctx: Ctx) -> SpecResult {
    let quotas: Api<ResourceQuota> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let claims: Api<ResourceClaim> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    let devices = device_class_devices();

    step("Counting existing ResourceQuota");
    let existing = count_quotas(&quotas).await?;

    step("Creating a ResourceQuota");
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": { "name": QUOTA },
        "spec": { "hard": hard_limits() },
    }))?;
    quotas.create(&PostParams::default(), &quota).await.context("create ResourceQuota test-quota")?;
    ctx.delete_at_cleanup(quotas.clone(), QUOTA);

    step("Ensuring resource quota status is calculated");
    let initial = used(&[
        (QUOTAS, (existing + 1).to_string()),
        (CLAIM_COUNT, "0".to_owned()),
        (&devices, "0".to_owned()),
    ]);
    wait_used(&quotas, &initial, "to count the quota and no claim").await?;

    step("Creating a ResourceClaim");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": { "name": CLAIM },
        "spec": { "devices": { "requests": [
            { "name": "req-0", "exactly": { "deviceClassName": CLASS_GOLD } },
        ] } },
    }))?;
    claims.create(&PostParams::default(), &claim).await.context("create ResourceClaim test-claim")?;
    ctx.delete_at_cleanup(claims.clone(), CLAIM);

    step("Ensuring resource quota status captures resource claim creation");
    let one = used(&[(CLAIM_COUNT, "1".to_owned()), (&devices, "1".to_owned())]);
    wait_used(&quotas, &one, "to count the claim").await?;

    step("Deleting a ResourceClaim");
    claims.delete(CLAIM, &DeleteParams::default()).await.context("delete ResourceClaim test-claim")?;

    step("Ensuring resource quota status released usage");
    let none = used(&[(CLAIM_COUNT, "0".to_owned()), (&devices, "0".to_owned())]);
    wait_used(&quotas, &none, "to release the claim").await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn full_text_matches_upstream() {
        assert_eq!(
            crate::specs::registered_texts(register),
            [
                "[sig-api-machinery] ResourceQuota should create a ResourceQuota and capture the life of a ResourceClaim [FeatureGate:DynamicResourceAllocation] [DRA]"
            ]
        );
    }

    #[test]
    fn hard_limits_have_upstreams_dra_entries() {
        let hard = hard_limits();
        assert_eq!(hard.len(), 19);
        assert_eq!(hard[CLAIM_COUNT], "1");
        assert_eq!(hard["gold.deviceclass.resource.k8s.io/devices"], "1");
    }

    #[test]
    fn used_entries_are_compared_as_upstream() {
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": { "name": QUOTA },
            "status": { "used": { CLAIM_COUNT: "1", "gold.deviceclass.resource.k8s.io/devices": "1", "pods": "0" } },
        }))
        .unwrap();
        let devices = device_class_devices();
        assert!(shows_used(&quota, &used(&[(CLAIM_COUNT, "1".to_owned()), (&devices, "1".to_owned())])));
        assert!(!shows_used(&quota, &used(&[(CLAIM_COUNT, "0".to_owned())])));
        assert!(!shows_used(&quota, &used(&[(QUOTAS, "1".to_owned())])));
        let empty: ResourceQuota = serde_json::from_value(json!({ "metadata": { "name": QUOTA } })).unwrap();
        assert!(!shows_used(&empty, &BTreeMap::new()));
    }
}
