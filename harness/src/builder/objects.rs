//! The objects of a spec, made but not created (upstream's `Builder` object makers): the
//! DeviceClass, claims with the default request and parameters, templates, restricted test pods.

use super::*;

/// The restricted pod security context of upstream's `MakePod(..., LevelRestricted, ...)`.
pub(super) fn restricted_pod_security() -> serde_json::Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": NON_ROOT_USER,
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

/// The restricted container security context.
pub(super) fn restricted_container_security() -> serde_json::Value {
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
    })
}

/// The objects of a spec, without API access: names, class, claims, templates and pods as
/// upstream's Builder makes them. [`Builder`] dereferences to it.
#[derive(Debug)]
pub struct Objects {
    namespace: String,
    driver_name: String,
    pub(super) name_suffix: String,
    class_parameters: Option<serde_json::Value>,
    pod_counter: AtomicUsize,
    claim_counter: AtomicUsize,
    pub(super) workload_counter: AtomicUsize,
    pub(super) pod_group_counter: AtomicUsize,
}

impl Objects {
    /// Objects for `driver_name` (with the driver's `name_suffix`) in `namespace`.
    pub fn new(
        namespace: impl Into<String>,
        driver_name: impl Into<String>,
        name_suffix: impl Into<String>,
        class_parameters: Option<serde_json::Value>,
    ) -> Self {
        Objects {
            namespace: namespace.into(),
            driver_name: driver_name.into(),
            name_suffix: name_suffix.into(),
            class_parameters,
            pod_counter: AtomicUsize::new(0),
            claim_counter: AtomicUsize::new(0),
            workload_counter: AtomicUsize::new(0),
            pod_group_counter: AtomicUsize::new(0),
        }
    }

    /// The spec's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The driver name.
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// The class name: `<namespace><suffix>-class`.
    pub fn class_name(&self) -> String {
        format!("{}{}-class", self.namespace, self.name_suffix)
    }

    /// The DeviceClass: CEL selector `device.driver == "<driver>"`, plus the class parameters as
    /// opaque configuration for the driver.
    pub fn class(&self) -> DeviceClass {
        let mut spec = json!({
            "selectors": [{ "cel": { "expression": format!("device.driver == \"{}\"", self.driver_name) } }],
        });
        if let Some(params) = &self.class_parameters {
            spec["config"] = json!([{ "opaque": { "driver": self.driver_name, "parameters": params } }]);
        }
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": { "name": self.class_name() },
            "spec": spec,
        }))
        .unwrap_or_default()
    }

    /// Upstream's `ExtendedResourceName(suffix)`: `<driver>/resource-<suffix>`.
    pub fn extended_resource_name(&self, suffix: &str) -> String {
        format!("{}/resource-{suffix}", self.driver_name)
    }

    /// Upstream's `ClassWithExtendedResource`: [`Objects::class`] named
    /// `<class>-<last part of the resource name>`, with `spec.extendedResourceName` set.
    pub fn class_with_extended_resource(&self, extended_resource: &str) -> DeviceClass {
        let suffix = extended_resource.rsplit('/').next().unwrap_or(extended_resource);
        let mut class = self.class();
        class.metadata.name = Some(format!("{}-{suffix}", self.class_name()));
        class.spec.get_or_insert_with(Default::default).extended_resource_name =
            Some(extended_resource.to_owned());
        class
    }

    /// The claim parameters (`{"a":"b"}`).
    pub fn parameters(&self) -> serde_json::Value {
        json!({"a": "b"})
    }

    /// The env the claim parameters produce: `user_a=b`.
    pub fn parameters_env(&self) -> Vec<(String, String)> {
        vec![("user_a".to_owned(), "b".to_owned())]
    }

    /// One request `my-request` for the class, plus the claim parameters as opaque config.
    pub fn claim_spec(&self) -> ResourceClaimSpec {
        serde_json::from_value(json!({
            "devices": {
                "requests": [{ "name": REQUEST_NAME, "exactly": { "deviceClassName": self.class_name() } }],
                "config": [{ "opaque": { "driver": self.driver_name, "parameters": self.parameters() } }],
            },
        }))
        .unwrap_or_default()
    }

    /// An external claim `external-claim<suffix>` (then `-2`, `-3`, ...).
    pub fn external_claim(&self) -> ResourceClaim {
        let n = self.claim_counter.fetch_add(1, Ordering::SeqCst) + 1;
        let mut name = format!("external-claim{}", self.name_suffix);
        if n > 1 {
            name.push_str(&format!("-{n}"));
        }
        let mut claim = ResourceClaim { spec: Some(self.claim_spec()), ..Default::default() };
        claim.metadata.name = Some(name);
        claim.metadata.namespace = Some(self.namespace.clone());
        claim
    }

    /// A pod `tester<suffix>-<n>` without claims: one busybox container that sleeps until
    /// SIGTERM, restricted security context, restart policy Never.
    pub fn pod(&self) -> Pod {
        let n = self.pod_counter.fetch_add(1, Ordering::SeqCst) + 1;
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("tester{}-{n}", self.name_suffix),
                "namespace": self.namespace,
            },
            "spec": {
                "restartPolicy": "Never",
                "securityContext": restricted_pod_security(),
                "containers": [{
                    "name": "write-pod",
                    "image": BUSYBOX_IMAGE,
                    "command": ["/bin/sh", "-c", INFINITE_SLEEP],
                    "securityContext": restricted_container_security(),
                }],
            },
        }))
        .unwrap_or_default()
    }

    /// A pod whose container uses an inline claim `my-inline-claim` from a template named like
    /// the pod, and that template.
    pub fn pod_inline(&self) -> (Pod, ResourceClaimTemplate) {
        let mut pod = self.pod();
        let name = pod.name_any();
        use_claim(
            &mut pod,
            INLINE_CLAIM_NAME,
            json!({ "name": INLINE_CLAIM_NAME, "resourceClaimTemplateName": name }),
        );
        let template = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": { "spec": self.claim_spec() },
        }))
        .unwrap_or_default();
        (pod, template)
    }

    /// [`Objects::pod_inline`] with three containers using the claim.
    pub fn pod_inline_multiple(&self) -> (Pod, ResourceClaimTemplate) {
        let (mut pod, template) = self.pod_inline();
        triple_container(&mut pod);
        (pod, template)
    }

    /// A pod whose container uses the existing claim `claim` (pod claim `resource-claim`).
    pub fn pod_external(&self, claim: &str) -> Pod {
        let mut pod = self.pod();
        use_claim(
            &mut pod,
            EXTERNAL_CLAIM_NAME,
            json!({ "name": EXTERNAL_CLAIM_NAME, "resourceClaimName": claim }),
        );
        pod
    }

    /// [`Objects::pod_external`] with three containers using the claim.
    pub fn pod_external_multiple(&self, claim: &str) -> Pod {
        let mut pod = self.pod_external(claim);
        triple_container(&mut pod);
        pod
    }
}

/// Adds a pod claim and makes the first container use it, renamed `with-resource`.
pub(super) fn use_claim(pod: &mut Pod, name: &str, pod_claim: serde_json::Value) {
    if let Some(spec) = pod.spec.as_mut() {
        if let Ok(claim) = serde_json::from_value(pod_claim) {
            spec.resource_claims = Some(vec![claim]);
        }
        if let Some(c) = spec.containers.first_mut() {
            c.name = CLAIM_CONTAINER.to_owned();
            let resources = c.resources.get_or_insert_with(Default::default);
            resources.claims = serde_json::from_value(json!([{ "name": name }])).ok();
        }
    }
}

/// Copies the first container twice, named `<name>-1` and `<name>-2`.
pub(super) fn triple_container(pod: &mut Pod) {
    if let Some(spec) = pod.spec.as_mut()
        && let Some(first) = spec.containers.first().cloned()
    {
        for i in 1..=2 {
            let mut c = first.clone();
            c.name = format!("{}-{i}", first.name);
            spec.containers.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> Objects {
        Objects::new("dra-ns", "dra-ns.k8s.io", "", Some(json!({"x": "y"})))
    }

    #[test]
    fn class_selects_the_driver_and_carries_class_parameters() {
        let class = objects().class();
        assert_eq!(class.metadata.name.as_deref(), Some("dra-ns-class"));
        let spec = class.spec.clone().unwrap();
        let selectors = spec.selectors.clone().unwrap();
        assert_eq!(selectors[0].cel.as_ref().unwrap().expression, r#"device.driver == "dra-ns.k8s.io""#);
        let config = &spec.config.as_ref().unwrap()[0];
        let opaque = config.opaque.as_ref().unwrap();
        assert_eq!(opaque.driver, "dra-ns.k8s.io");
        assert_eq!(opaque.parameters.0, json!({"x": "y"}));
        let plain = Objects::new("dra-ns", "dra-ns.k8s.io", "-b", None).class();
        assert_eq!(plain.metadata.name.as_deref(), Some("dra-ns-b-class"));
        assert!(plain.spec.unwrap().config.is_none());
    }

    #[test]
    fn classes_for_extended_resources_are_named_after_the_resource() {
        let o = objects();
        let name = o.extended_resource_name("gpu");
        assert_eq!(name, "dra-ns.k8s.io/resource-gpu");
        let class = o.class_with_extended_resource(&name);
        assert_eq!(class.metadata.name.as_deref(), Some("dra-ns-class-resource-gpu"));
        let spec = class.spec.unwrap();
        assert_eq!(spec.extended_resource_name.as_deref(), Some("dra-ns.k8s.io/resource-gpu"));
        assert!(spec.selectors.is_some());
        let plain = o.class_with_extended_resource("example.com/resource");
        assert_eq!(plain.metadata.name.as_deref(), Some("dra-ns-class-resource"));
    }

    #[test]
    fn claims_have_the_default_request_and_parameters() {
        let o = objects();
        let claim = o.external_claim();
        assert_eq!(claim.metadata.name.as_deref(), Some("external-claim"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("dra-ns"));
        assert_eq!(o.external_claim().metadata.name.as_deref(), Some("external-claim-2"));
        let devices = claim.spec.unwrap().devices.unwrap();
        let request = &devices.requests.unwrap()[0];
        assert_eq!(request.name, REQUEST_NAME);
        assert_eq!(request.exactly.as_ref().unwrap().device_class_name, "dra-ns-class");
        let opaque = devices.config.unwrap()[0].opaque.clone().unwrap();
        assert_eq!((opaque.driver.as_str(), opaque.parameters.0), ("dra-ns.k8s.io", json!({"a": "b"})));
        assert_eq!(o.parameters_env(), [("user_a".to_owned(), "b".to_owned())]);
    }

    #[test]
    fn pods_are_restricted_sleepers_with_counted_names() {
        let o = objects();
        let pod = o.pod();
        assert_eq!(pod.metadata.name.as_deref(), Some("tester-1"));
        assert_eq!(o.pod().metadata.name.as_deref(), Some("tester-2"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some(BUSYBOX_IMAGE));
        assert_eq!(c.command.as_deref().unwrap(), ["/bin/sh", "-c", INFINITE_SLEEP]);
        assert!(spec.security_context.unwrap().run_as_non_root.unwrap());
    }

    #[test]
    fn inline_pods_use_a_template_named_like_the_pod() {
        let (pod, template) = objects().pod_inline_multiple();
        assert_eq!(template.metadata.name, pod.metadata.name);
        assert_eq!(template.metadata.namespace.as_deref(), Some("dra-ns"));
        let claim_spec = template.spec.unwrap().spec.unwrap();
        assert_eq!(claim_spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0].name, REQUEST_NAME);
        let spec = pod.spec.unwrap();
        let claim = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(claim.name, INLINE_CLAIM_NAME);
        assert_eq!(claim.resource_claim_template_name.as_deref(), Some("tester-1"));
        let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["with-resource", "with-resource-1", "with-resource-2"]);
        for c in &spec.containers {
            assert_eq!(c.resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name, INLINE_CLAIM_NAME);
        }
    }

    #[test]
    fn external_pods_reference_the_claim() {
        let pod = objects().pod_external("external-claim");
        let spec = pod.spec.unwrap();
        let claim = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(
            (claim.name.as_str(), claim.resource_claim_name.as_deref()),
            (EXTERNAL_CLAIM_NAME, Some("external-claim"))
        );
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(
            spec.containers[0].resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name,
            EXTERNAL_CLAIM_NAME
        );
        assert_eq!(objects().pod_external_multiple("c").spec.unwrap().containers.len(), 3);
    }

    #[test]
    fn restricted_security_contexts_parse() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {},
            "spec": {
                "securityContext": restricted_pod_security(),
                "containers": [{ "name": "c", "securityContext": restricted_container_security() }],
            },
        }))
        .unwrap();
        let spec = pod.spec.unwrap();
        let psc = spec.security_context.unwrap();
        assert_eq!((psc.run_as_non_root, psc.run_as_user), (Some(true), Some(NON_ROOT_USER)));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let csc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    }
}
