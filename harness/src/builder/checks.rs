//! The checks on a running test pod: its claims' allocations, and what the kubelet prepared for
//! each of them, from the driver's recorded calls.

use super::*;

impl Builder {
    /// The pod's claims, resolved and fetched: pod claim name -> ResourceClaim.
    pub async fn pod_claims(&self, pod: &Pod) -> Result<BTreeMap<String, ResourceClaim>, BuilderError> {
        let pod_name = pod.name_any();
        let mut out = BTreeMap::new();
        for (pod_claim, name) in pod_claim_names(pod) {
            let Some(name) = name else {
                return Err(BuilderError::Claim {
                    pod: format!("{}/{pod_name}", self.namespace()),
                    claim: pod_claim,
                    problem: "no ResourceClaim was generated for it (status.resourceClaimStatuses)"
                        .to_owned(),
                });
            };
            let claim =
                self.claims().get(&name).await.map_err(api_error(format!("get ResourceClaim {name}")))?;
            out.insert(pod_claim, claim);
        }
        Ok(out)
    }

    /// Upstream's `TestPod`. Without kubelet: waits until the pod is scheduled and checks that
    /// each of its claims is allocated with devices of the driver, reserved for the pod, and that
    /// the allocation carries the configuration that yields `env` (what the plugin would
    /// inject). With kubelet: waits until the pod runs, checks in the recorded gRPC calls that
    /// the kubelet prepared each of its claims of this driver ([`Builder::expect_prepared`]),
    /// and checks `env` in every container through exec. Empty `env` means the claim
    /// parameters' env (`user_a=b`).
    pub async fn test_pod(&self, pod: &Pod, env: &[(&str, &str)]) -> Result<Pod, BuilderError> {
        let default_env = self.parameters_env();
        let env: Vec<(&str, &str)> = if env.is_empty() {
            default_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
        } else {
            env.to_vec()
        };
        if !self.inner.driver.with_kubelet() {
            let pod = self.wait_scheduled(pod).await?;
            self.check_allocations(&pod, &env).await?;
            return Ok(pod);
        }
        let pod = self.wait_running(pod).await?;
        self.expect_prepared(&pod).await?;
        let containers: Vec<String> = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        for container in containers {
            self.expect_env(&pod, &container, &env).await?;
        }
        Ok(pod)
    }

    /// Checks, for a pod that runs, what the kubelet of its node did with each of its claims that
    /// has devices of this driver (and does not skip `NodePrepareResources`), from the node's
    /// recorded gRPC calls: a `NodePrepareResources` call named the claim (by UID) and succeeded
    /// for it, the claim's last successful call is that prepare (not an unprepare), the devices
    /// returned are exactly the claim's allocated devices of this driver, and the plugin still
    /// holds the claim as prepared. Returns the claims.
    pub async fn expect_prepared(&self, pod: &Pod) -> Result<BTreeMap<String, ResourceClaim>, BuilderError> {
        let claims = self.pod_claims(pod).await?;
        for claim in claims.values() {
            self.expect_claim_prepared(pod, claim)?;
        }
        Ok(claims)
    }

    /// [`Builder::expect_prepared`] for one claim of the running pod (e.g. the claim the
    /// scheduler made for its extended resources): nothing to check when the claim has no
    /// devices of this driver.
    pub fn expect_claim_prepared(&self, pod: &Pod, claim: &ResourceClaim) -> Result<(), BuilderError> {
        let driver = &self.inner.driver;
        let pod_name = format!("{}/{}", self.namespace(), pod.name_any());
        let node = node_name(pod).unwrap_or_default().to_owned();
        let problem = |problem: String| BuilderError::Calls {
            pod: pod_name.clone(),
            claim: claim.name_any(),
            node: node.clone(),
            problem,
            log: driver.try_calls(&node).map(|c| c.log().to_string()).unwrap_or_default(),
        };
        let mut want = prepared_results(self.driver_name(), claim);
        if want.is_empty() {
            return Ok(());
        }
        let calls = match driver.try_calls(&node) {
            Ok(calls) => calls,
            Err(e) => {
                return Err(problem(format!("the pod runs where the driver's plugin does not: {e}")));
            }
        };
        let uid = claim.uid().unwrap_or_default();
        let history = calls.claim(&uid);
        let Some(last) = history.prepares().filter(|c| c.succeeded()).last() else {
            return Err(problem(format!(
                "the kubelet never prepared it successfully (claim UID {uid}): {history}"
            )));
        };
        if !history.is_prepared() {
            return Err(problem(format!("the kubelet unprepared it after preparing it: {history}")));
        }
        let mut got: Vec<(String, String)> =
            last.devices.iter().map(|(pool, device, _)| (pool.clone(), device.clone())).collect();
        got.sort();
        got.dedup();
        want.sort();
        want.dedup();
        if got != want {
            return Err(problem(format!(
                "NodePrepareResources #{} returned devices {got:?}, the allocation has {want:?}",
                last.id
            )));
        }
        let id = crate::plugin::ClaimId { name: claim.name_any(), uid: uid.clone() };
        if !driver.prepared_claims(&node).contains(&id) {
            return Err(problem(format!(
                "the plugin does not hold it as prepared (prepared: {:?})",
                driver.prepared_claims(&node)
            )));
        }
        Ok(())
    }

    /// The claim the scheduler created for the pod's extended resources
    /// (`status.extendedResourceClaimStatus.resourceClaimName`), fetched; `None` when the pod
    /// status names none.
    pub async fn extended_resource_claim(&self, pod: &Pod) -> Result<Option<ResourceClaim>, BuilderError> {
        let Some(name) = extended_resource_claim_name(pod) else { return Ok(None) };
        let claim = self.claims().get(&name).await.map_err(api_error(format!("get ResourceClaim {name}")))?;
        Ok(Some(claim))
    }

    /// Checks that every claim of the scheduled pod is allocated with devices of this driver,
    /// reserved for the pod, and yields `env`. Returns the claims.
    pub async fn check_allocations(
        &self,
        pod: &Pod,
        env: &[(&str, &str)],
    ) -> Result<BTreeMap<String, ResourceClaim>, BuilderError> {
        let pod_name = format!("{}/{}", self.namespace(), pod.name_any());
        let uid = pod.uid().unwrap_or_default();
        let claims = self.pod_claims(pod).await?;
        for (pod_claim, claim) in &claims {
            let problem = |problem: String| BuilderError::Claim {
                pod: pod_name.clone(),
                claim: claim.name_any(),
                problem,
            };
            let results = allocation_results(claim);
            if results.is_empty() {
                return Err(problem(format!(
                    "pod claim {pod_claim} is scheduled but its claim has no allocated devices"
                )));
            }
            if let Some(other) = results.iter().find(|r| r.driver != self.driver_name()) {
                return Err(problem(format!(
                    "device {} is from driver {}, not {}",
                    other.device,
                    other.driver,
                    self.driver_name()
                )));
            }
            let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
            if !reserved.iter().any(|r| r.uid == uid && r.resource == "pods") {
                return Err(problem(format!(
                    "not reserved for the pod (reservedFor: {:?})",
                    reserved.iter().map(|r| format!("{}/{}", r.resource, r.name)).collect::<Vec<_>>()
                )));
            }
            // The pod's node must be one the allocation reaches (the scheduler's filter; a claim
            // allocated before the pod, shared or external, must pull the pod to its node).
            let selector = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.node_selector.as_ref());
            if let (Some(selector), Some(node)) = (selector, node_name(pod)) {
                let nodes: Api<Node> = Api::all(self.inner.ctx.client().clone());
                let node_obj = nodes.get(node).await.map_err(api_error(format!("get node {node}")))?;
                let shown = || serde_json::to_string(selector).unwrap_or_default();
                match node_selector_admits(selector, &node_obj) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(problem(format!(
                            "the pod was scheduled to node {node}, which the claim's allocation does not reach (its nodeSelector: {})",
                            shown()
                        )));
                    }
                    Err(e) => {
                        return Err(problem(format!(
                            "the claim's allocation has a nodeSelector no node can be matched against ({e}): {}",
                            shown()
                        )));
                    }
                }
            }
            let lines = allocation_env(self.driver_name(), claim).map_err(&problem)?;
            check_env(&parse_env(&lines.join("\n")), env).map_err(|e| {
                problem(format!("the allocation's configuration would not give the expected env: {e}"))
            })?;
        }
        Ok(claims)
    }
}
