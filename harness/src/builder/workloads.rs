//! Workloads and PodGroups (`scheduling.k8s.io/v1beta1`, gates `GenericWorkload` and
//! `DRAWorkloadResourceClaims`) as upstream's Builder makes them: a Workload with one PodGroup
//! template `group` (basic scheduling policy), the template's claims (an existing claim, or one
//! generated from a ResourceClaimTemplate for the whole group), a PodGroup of that template, and
//! a pod in the group that uses the group's claims.

use k8s_openapi::api::scheduling::v1beta1::{PodGroup, PodGroupTemplate, Workload};

use super::*;

/// Name of the Workload's one PodGroup template.
pub const POD_GROUP_TEMPLATE: &str = "group";

impl Objects {
    /// A Workload `tester<suffix>-<n>` (from 0) with one PodGroup template [`POD_GROUP_TEMPLATE`]
    /// and the basic scheduling policy, without claims.
    pub fn workload(&self) -> Workload {
        self.workload_with_claims(json!([]))
    }

    /// [`Objects::workload`] whose template refers to the existing claim `claim` (group claim
    /// `resource-claim`).
    pub fn workload_external(&self, claim: &str) -> Workload {
        self.workload_with_claims(json!([{ "name": EXTERNAL_CLAIM_NAME, "resourceClaimName": claim }]))
    }

    /// [`Objects::workload`] whose template generates its claim `my-inline-claim` from a
    /// ResourceClaimTemplate named like the Workload, and that template.
    pub fn workload_inline(&self) -> (Workload, ResourceClaimTemplate) {
        let n = self.workload_counter.load(Ordering::SeqCst);
        let name = format!("tester{}-{n}", self.name_suffix);
        let workload = self
            .workload_with_claims(json!([{ "name": INLINE_CLAIM_NAME, "resourceClaimTemplateName": name }]));
        let template = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": { "name": name, "namespace": self.namespace() },
            "spec": { "spec": self.claim_spec() },
        }))
        .unwrap_or_default();
        (workload, template)
    }

    fn workload_with_claims(&self, claims: serde_json::Value) -> Workload {
        let n = self.workload_counter.fetch_add(1, Ordering::SeqCst);
        let mut template = json!({ "name": POD_GROUP_TEMPLATE, "schedulingPolicy": { "basic": {} } });
        if claims.as_array().is_some_and(|c| !c.is_empty()) {
            template["resourceClaims"] = claims;
        }
        serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": { "name": format!("tester{}-{n}", self.name_suffix), "namespace": self.namespace() },
            "spec": { "podGroupTemplates": [template] },
        }))
        .unwrap_or_default()
    }

    /// A PodGroup `<workload>-<template>-<n>` (from 0) of `template` of `workload`, with the
    /// template's scheduling policy and claims.
    pub fn pod_group(&self, workload: &Workload, template: &PodGroupTemplate) -> PodGroup {
        let n = self.pod_group_counter.fetch_add(1, Ordering::SeqCst);
        let workload_name = workload.name_any();
        serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {
                "name": format!("{workload_name}-{}-{n}", template.name),
                "namespace": self.namespace(),
            },
            "spec": {
                "workloadRef": { "workloadName": workload_name, "templateName": template.name },
                "schedulingPolicy": template.scheduling_policy,
                "resourceClaims": template.resource_claims,
            },
        }))
        .unwrap_or_default()
    }

    /// [`Objects::pod_group`] of the Workload's first template (upstream's
    /// `b.PodGroup(workload, workload.Spec.PodGroupTemplates[0])`).
    pub fn pod_group_of(&self, workload: &Workload) -> PodGroup {
        let template = workload.spec.pod_group_templates.iter().flatten().next().cloned().unwrap_or_default();
        self.pod_group(workload, &template)
    }

    /// A test pod in `pod_group` (`spec.schedulingGroup`) whose container uses each of the
    /// group's claims under the same names (upstream's `GroupedPodWithClaims`).
    pub fn grouped_pod_with_claims(&self, pod_group: &PodGroup) -> Pod {
        let mut pod = self.pod();
        let Some(spec) = pod.spec.as_mut() else { return pod };
        spec.scheduling_group = Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
            pod_group_name: Some(pod_group.name_any()),
        });
        for claim in pod_group.spec.resource_claims.iter().flatten() {
            let pod_claim = serde_json::from_value(json!({
                "name": claim.name,
                "resourceClaimName": claim.resource_claim_name,
                "resourceClaimTemplateName": claim.resource_claim_template_name,
            }))
            .unwrap_or_default();
            spec.resource_claims.get_or_insert_with(Vec::new).push(pod_claim);
            if let Some(container) = spec.containers.first_mut() {
                let resources = container.resources.get_or_insert_with(Default::default);
                resources.claims.get_or_insert_with(Vec::new).push(
                    k8s_openapi::api::core::v1::ResourceClaim {
                        name: claim.name.clone(),
                        ..Default::default()
                    },
                );
            }
        }
        pod
    }
}

impl Builder {
    /// Creates a Workload in the namespace (it goes with the namespace).
    pub async fn create_workload(&self, workload: &Workload) -> Result<Workload, BuilderError> {
        tracing::info!(workload = %workload.name_any(), "creating Workload");
        self.workloads()
            .create(&PostParams::default(), workload)
            .await
            .map_err(api_error(format!("create Workload {}", workload.name_any())))
    }

    /// Creates a PodGroup in the namespace; the teardown deletes it after the test pods and
    /// before the claims, so that the claims reserved for it are released.
    pub async fn create_pod_group(&self, pod_group: &PodGroup) -> Result<PodGroup, BuilderError> {
        tracing::info!(pod_group = %pod_group.name_any(), "creating PodGroup");
        self.inner.pod_groups.store(true, Ordering::SeqCst);
        self.pod_groups()
            .create(&PostParams::default(), pod_group)
            .await
            .map_err(api_error(format!("create PodGroup {}", pod_group.name_any())))
    }

    /// Deletes every PodGroup of the namespace and waits until they are gone (if the spec
    /// created any): their claims stay reserved for them until then.
    pub(super) async fn delete_pod_groups(&self) -> Result<(), BuilderError> {
        if !self.inner.pod_groups.load(Ordering::SeqCst) {
            return Ok(());
        }
        let api = self.pod_groups();
        let list = api.list(&ListParams::default()).await.map_err(api_error("list PodGroups"))?;
        for group in list.items.iter().filter(|g| g.metadata.deletion_timestamp.is_none()) {
            tracing::info!(pod_group = %group.name_any(), "deleting PodGroup");
            match api.delete(&group.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(format!("delete PodGroup {}", group.name_any()))(e)),
            }
        }
        wait::objects(&api, watcher::Config::default(), "PodGroups to be gone", TEARDOWN_STEP_TIMEOUT, |g| {
            Verdict::done_if(g.is_empty())
        })
        .await?;
        Ok(())
    }

    fn workloads(&self) -> Api<Workload> {
        Api::namespaced(self.inner.ctx.client().clone(), self.namespace())
    }

    fn pod_groups(&self) -> Api<PodGroup> {
        Api::namespaced(self.inner.ctx.client().clone(), self.namespace())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> Objects {
        Objects::new("ns", "driver.example.com", "-x", None)
    }

    #[test]
    fn an_inline_workload_s_group_pod_uses_the_template_claim() {
        let o = objects();
        let (workload, template) = o.workload_inline();
        assert_eq!(workload.name_any(), "tester-x-0");
        assert_eq!(template.name_any(), "tester-x-0");
        let group_template = &workload.spec.pod_group_templates.as_ref().unwrap()[0];
        assert_eq!(group_template.name, POD_GROUP_TEMPLATE);
        assert!(group_template.scheduling_policy.basic.is_some());
        let group = o.pod_group(&workload, group_template);
        assert_eq!(group.name_any(), "tester-x-0-group-0");
        let reference = group.spec.workload_ref.as_ref().unwrap();
        assert_eq!(
            (reference.workload_name.as_str(), reference.template_name.as_str()),
            ("tester-x-0", "group")
        );
        let pod = o.grouped_pod_with_claims(&group);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.scheduling_group.as_ref().unwrap().pod_group_name.as_deref(),
            Some("tester-x-0-group-0")
        );
        let claims = spec.resource_claims.as_ref().unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].name, INLINE_CLAIM_NAME);
        assert_eq!(claims[0].resource_claim_template_name.as_deref(), Some("tester-x-0"));
        let used = spec.containers[0].resources.as_ref().unwrap().claims.as_ref().unwrap();
        assert_eq!(used[0].name, INLINE_CLAIM_NAME);
    }

    #[test]
    fn an_external_workload_refers_to_the_claim_and_counters_advance() {
        let o = objects();
        let first = o.workload();
        assert!(first.spec.pod_group_templates.as_ref().unwrap()[0].resource_claims.is_none());
        let workload = o.workload_external("external-claim-x");
        assert_eq!(workload.name_any(), "tester-x-1");
        let group = o.pod_group_of(&workload);
        let claims = group.spec.resource_claims.as_ref().unwrap();
        assert_eq!(claims[0].name, EXTERNAL_CLAIM_NAME);
        assert_eq!(claims[0].resource_claim_name.as_deref(), Some("external-claim-x"));
        let pod = o.grouped_pod_with_claims(&group);
        let pod_claims = pod.spec.as_ref().unwrap().resource_claims.as_ref().unwrap();
        assert_eq!(pod_claims[0].resource_claim_name.as_deref(), Some("external-claim-x"));
        assert!(pod_claims[0].resource_claim_template_name.is_none());
    }
}
