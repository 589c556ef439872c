//! Reading pods and claims: node, phase, conditions, generated claim names, allocation results.

use super::*;

/// The pod's claim names: pod claim name -> ResourceClaim name (from
/// `status.resourceClaimStatuses` for templates; `None` if not generated yet or not needed).
pub fn pod_claim_names(pod: &Pod) -> BTreeMap<String, Option<String>> {
    let statuses: BTreeMap<String, Option<String>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .map(|ss| ss.iter().map(|s| (s.name.clone(), s.resource_claim_name.clone())).collect())
        .unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .map(|claims| {
            claims
                .iter()
                .map(|c| {
                    let resolved = match &c.resource_claim_name {
                        Some(name) => Some(name.clone()),
                        None => statuses.get(&c.name).cloned().flatten(),
                    };
                    (c.name.clone(), resolved)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The pod's node, once scheduled.
pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The pod's phase (`""` if unknown).
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// A pod condition by type.
pub fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

/// `(pool, device)` of the claim's allocation results of `driver` that the kubelet must prepare
/// (results whose `skipNodeOperations` names `NodePrepareResources` or `*` are left out).
pub fn prepared_results(driver: &str, claim: &ResourceClaim) -> Vec<(String, String)> {
    allocation_results(claim)
        .iter()
        .filter(|r| r.driver == driver)
        .filter(|r| {
            // A field of newer API versions: read it from JSON.
            let skips = serde_json::to_value(r)
                .ok()
                .and_then(|v| v.get("skipNodeOperations").cloned())
                .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
                .unwrap_or_default();
            !skips.iter().any(|s| s == "NodePrepareResources" || s == "*")
        })
        .map(|r| (r.pool.clone(), r.device.clone()))
        .collect()
}

/// The device allocation results of the claim (empty while it is not allocated).
pub fn allocation_results(claim: &ResourceClaim) -> &[DeviceRequestAllocationResult] {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
}

/// An init container made from `container` (same claims), named `<name>-init`, that succeeds
/// only if it sees the claim's `user_a=b` env, so that its pod can start only then.
pub fn env_checking_init_container(container: &Container) -> Container {
    let mut init = container.clone();
    init.name.push_str("-init");
    init.command = Some(vec!["sh".into(), "-c".into(), "env | grep user_a=b".into()]);
    init
}

/// Whether the claim has an allocation.
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

/// The name of the claim the scheduler created for the pod's extended resources
/// (`status.extendedResourceClaimStatus.resourceClaimName`), if the status names one.
pub fn extended_resource_claim_name(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.clone())
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodResourceClaimStatus, PodStatus};

    use super::*;

    #[test]
    fn pod_claim_names_resolve_templates_through_the_status() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "p" },
            "spec": {
                "containers": [],
                "resourceClaims": [
                    { "name": "inline", "resourceClaimTemplateName": "t" },
                    { "name": "ext", "resourceClaimName": "external-claim" },
                ],
            },
        }))
        .unwrap();
        let names = pod_claim_names(&pod);
        assert_eq!(names["inline"], None);
        assert_eq!(names["ext"].as_deref(), Some("external-claim"));
        pod.status = Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "inline".into(),
                resource_claim_name: Some("p-inline-xyz".into()),
            }]),
            ..Default::default()
        });
        assert_eq!(pod_claim_names(&pod)["inline"].as_deref(), Some("p-inline-xyz"));
    }

    #[test]
    fn extended_resource_claim_name_comes_from_the_status() {
        let mut pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(extended_resource_claim_name(&pod), None);
        pod.status = serde_json::from_value(json!({"extendedResourceClaimStatus": {
            "resourceClaimName": "p-extended-resources-abc",
            "requestMappings": [{"containerName": "c", "resourceName": "r", "requestName": "container-0-request-0"}],
        }}))
        .unwrap();
        assert_eq!(extended_resource_claim_name(&pod).as_deref(), Some("p-extended-resources-abc"));
    }
}
