//! Test pods with several claims: existing claims or claims generated from templates, and
//! containers that each name the claims (or single requests of them) they use; and a running
//! pod's claim UIDs, the key of everything in the call log.
//!
//! ```
//! use harness::builder::Objects;
//! let objects = Objects::new("ns", "ns.k8s.io", "", None);
//! let (pod, templates) = objects
//!     .pod_with_claims()
//!     .claim("first", "external-claim")
//!     .template("second")
//!     .container("both", &["first", "second"])
//!     .container("one-request", &["second/my-request"])
//!     .build();
//! assert_eq!(templates.len(), 1);
//! let spec = pod.spec.unwrap();
//! assert_eq!(spec.resource_claims.unwrap().len(), 2);
//! assert_eq!(spec.containers.len(), 2);
//! ```

use k8s_openapi::api::core::v1::{PodResourceClaim, ResourceClaim as ContainerClaim};

use super::*;

/// A test pod with several claims, built step by step ([`Objects::pod_with_claims`],
/// [`Builder::pod_with_claims`]); [`PodWithClaims::build`] gives the pod and the templates to
/// create with it.
#[derive(Debug)]
#[must_use = "build() gives the pod"]
pub struct PodWithClaims<'a> {
    objects: &'a Objects,
    pod: Pod,
    claims: Vec<PodResourceClaim>,
    templates: Vec<ResourceClaimTemplate>,
    containers: Vec<(String, Vec<ContainerClaim>)>,
}

impl<'a> PodWithClaims<'a> {
    fn new(objects: &'a Objects) -> Self {
        PodWithClaims {
            objects,
            pod: objects.pod(),
            claims: Vec::new(),
            templates: Vec::new(),
            containers: Vec::new(),
        }
    }

    /// Adds pod claim `name` for the existing ResourceClaim `claim` (`resourceClaimName`).
    pub fn claim(mut self, name: &str, claim: &str) -> Self {
        self.claims.push(PodResourceClaim {
            name: name.to_owned(),
            resource_claim_name: Some(claim.to_owned()),
            ..Default::default()
        });
        self
    }

    /// Adds pod claim `name` generated from a new ResourceClaimTemplate `<pod>-<name>` with the
    /// default claim spec ([`Objects::claim_spec`]); [`PodWithClaims::build`] returns the template.
    pub fn template(mut self, name: &str) -> Self {
        let template_name = format!("{}-{name}", self.pod.name_any());
        let mut template = ResourceClaimTemplate::default();
        template.metadata.name = Some(template_name.clone());
        template.metadata.namespace = Some(self.objects.namespace().to_owned());
        template.spec.get_or_insert_with(Default::default).spec = Some(self.objects.claim_spec());
        self.templates.push(template);
        self.claims.push(PodResourceClaim {
            name: name.to_owned(),
            resource_claim_template_name: Some(template_name),
            ..Default::default()
        });
        self
    }

    /// Adds a container `name` (the builder's sleeper) that uses `uses`: each entry a pod claim,
    /// or `<pod claim>/<request>` for one request of it only.
    pub fn container(mut self, name: &str, uses: &[&str]) -> Self {
        let claims = uses
            .iter()
            .map(|entry| match entry.split_once('/') {
                Some((claim, request)) => {
                    ContainerClaim { name: claim.to_owned(), request: Some(request.to_owned()) }
                }
                None => ContainerClaim { name: (*entry).to_owned(), request: None },
            })
            .collect();
        self.containers.push((name.to_owned(), claims));
        self
    }

    /// The pod and the templates to create with it. Without a [`PodWithClaims::container`], its
    /// one container `with-resource` uses every claim.
    pub fn build(mut self) -> (Pod, Vec<ResourceClaimTemplate>) {
        if self.containers.is_empty() {
            let every: Vec<ContainerClaim> =
                self.claims.iter().map(|c| ContainerClaim { name: c.name.clone(), request: None }).collect();
            self.containers.push((CLAIM_CONTAINER.to_owned(), every));
        }
        if let Some(spec) = self.pod.spec.as_mut()
            && let Some(base) = spec.containers.first().cloned()
        {
            spec.resource_claims = Some(self.claims);
            spec.containers = self
                .containers
                .into_iter()
                .map(|(name, claims)| {
                    let mut container = base.clone();
                    container.name = name;
                    container.resources.get_or_insert_with(Default::default).claims = Some(claims);
                    container
                })
                .collect();
        }
        (self.pod, self.templates)
    }
}

impl Objects {
    /// A test pod `tester<suffix>-<n>` to which [`PodWithClaims`] adds claims and containers.
    pub fn pod_with_claims(&self) -> PodWithClaims<'_> {
        PodWithClaims::new(self)
    }
}

impl Builder {
    /// [`Objects::pod_with_claims`]: a test pod with several claims.
    pub fn pod_with_claims(&self) -> PodWithClaims<'_> {
        self.objects().pod_with_claims()
    }

    /// The UIDs of the pod's claims, by pod claim name, fetched; for a pod whose claims come from
    /// templates pass the pod as stored once they are generated (e.g. as [`Builder::test_pod`]
    /// returns it).
    pub async fn pod_claim_uids(&self, pod: &Pod) -> Result<BTreeMap<String, String>, BuilderError> {
        let claims = self.pod_claims(pod).await?;
        Ok(claims
            .into_iter()
            .map(|(pod_claim, claim)| (pod_claim, claim.uid().unwrap_or_default()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> Objects {
        Objects::new("dra-ns", "dra-ns.k8s.io", "", None)
    }

    /// The claims (and requests) a container uses.
    fn uses(container: &Container) -> Vec<(String, Option<String>)> {
        let claims = container.resources.as_ref().and_then(|r| r.claims.as_ref());
        claims.into_iter().flatten().map(|c| (c.name.clone(), c.request.clone())).collect()
    }

    #[test]
    fn one_container_uses_every_claim_unless_containers_are_named() {
        let o = objects();
        let (pod, templates) = o.pod_with_claims().claim("a", "claim-a").claim("b", "claim-b").build();
        assert!(templates.is_empty());
        assert_eq!(pod.metadata.name.as_deref(), Some("tester-1"));
        let spec = pod.spec.unwrap();
        let claims: Vec<_> = spec
            .resource_claims
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.resource_claim_name, c.resource_claim_template_name))
            .collect();
        assert_eq!(
            claims,
            [("a".into(), Some("claim-a".into()), None), ("b".into(), Some("claim-b".into()), None)]
        );
        let [container] = spec.containers.as_slice() else { panic!("one container: {:?}", spec.containers) };
        assert_eq!(container.name, CLAIM_CONTAINER);
        assert_eq!(container.image.as_deref(), Some(BUSYBOX_IMAGE));
        assert_eq!(uses(container), [("a".into(), None), ("b".into(), None)]);
    }

    #[test]
    fn templates_are_named_after_pod_and_claim_and_containers_name_requests() {
        let o = objects();
        let (pod, templates) = o
            .pod_with_claims()
            .template("gpu")
            .claim("shared", "external")
            .container("c0", &["gpu", "shared"])
            .container("c1", &["gpu/my-request"])
            .build();
        let [template] = templates.as_slice() else { panic!("one template: {templates:?}") };
        assert_eq!(template.metadata.name.as_deref(), Some("tester-1-gpu"));
        assert_eq!(template.metadata.namespace.as_deref(), Some("dra-ns"));
        assert_eq!(template.spec.clone().and_then(|s| s.spec), Some(o.claim_spec()));
        let spec = pod.spec.unwrap();
        let gpu = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(
            (gpu.name.as_str(), gpu.resource_claim_template_name.as_deref()),
            ("gpu", Some("tester-1-gpu"))
        );
        assert_eq!(spec.containers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["c0", "c1"]);
        assert_eq!(uses(&spec.containers[0]), [("gpu".into(), None), ("shared".into(), None)]);
        assert_eq!(uses(&spec.containers[1]), [("gpu".into(), Some("my-request".into()))]);
        // Both containers are the builder's restricted sleeper.
        assert!(spec.containers.iter().all(|c| c.security_context.is_some() && c.command.is_some()));
    }
}
