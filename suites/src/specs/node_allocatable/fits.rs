//! What the node allocatable specs need of the nodes, decided from the nodes' allocatable CPU
//! and hugepages before anything is deployed (see [`Registry::requires`]): the pod's CPU with
//! what its claims add (upstream's expected pod cgroup request, which is what the scheduler and
//! the API server count) against the node the devices go to, the first of the nodes
//! [`Nodes::select`] chooses (the set-up's own call, made from the spec's [`Precheck`]). Where
//! this is not exact (other pods' requests on the node, a resize the kubelet cannot actuate on
//! cgroup v1) the specs still decide at run time.
//!
//! [`Registry::requires`]: harness::framework::Registry::requires

use harness::{
    driver::Nodes,
    framework::{Precheck, SpecError, SpecResult},
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;

use super::{
    cases::{CgroupCase, ResizeCase},
    cgroups::{milli, milli_cpu},
};

/// The node the devices would be published on, as the spec's set-up chooses it (1 to 4 usable
/// nodes, the first); skipped as the set-up is when there is none.
async fn devices_node(pre: &Precheck) -> SpecResult<Node> {
    let nodes = Nodes::select(pre, 1, 4).await?;
    nodes.objects().first().cloned().ok_or_else(|| SpecError::skip("no usable node"))
}

/// A node's allocatable quantity of `resource`, as the API reports it (`""` when it has none).
fn allocatable(node: &Node, resource: &str) -> String {
    let list = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    list.and_then(|a| a.get(resource)).map(|q| q.0.clone()).unwrap_or_default()
}

/// Skips unless `node` has `milli_cpu` allocatable for the pod (`what` says which pod).
fn require_cpu(node: &Node, milli_cpu: i128, reason: impl FnOnce(&str) -> String) -> SpecResult {
    let cpu = allocatable(node, "cpu");
    if milli(&cpu).is_ok_and(|have| have >= milli_cpu) {
        return Ok(());
    }
    Err(SpecError::skip(reason(&cpu)))
}

/// A cgroup spec: skips when the devices' node lacks `hugepages-2Mi` (for the hugepages cases,
/// with the set-up's reason) or cannot fit the pod's CPU with what its claims add.
pub(super) async fn cgroup_case_fits(pre: Precheck, case: CgroupCase) -> SpecResult {
    let node = devices_node(&pre).await?;
    let name = node.name_any();
    if case.hugepages.is_some() {
        let hugepages = allocatable(&node, "hugepages-2Mi");
        if milli(&hugepages).unwrap_or(0) == 0 {
            let shown = if hugepages.is_empty() { "none" } else { hugepages.as_str() };
            return Err(SpecError::skip(format!(
                "Node {name} does not support hugepages-2Mi (allocatable: {shown})"
            )));
        }
    }
    let request = &case.pod_cgroup.cpu_req;
    require_cpu(&node, milli_cpu(request)?, |cpu| {
        format!(
            "no node can fit the pod with what its claims add: it requests {request} CPU and node {name}, \
             where the devices are, has {cpu} CPU allocatable (decided before deploying anything; \
             upstream's spec fails here: its pod never starts)"
        )
    })
}

/// A resize spec: skips when the devices' node cannot fit the resized pod's CPU with what its
/// claim adds (the API server refuses such a resize).
pub(super) async fn resize_case_fits(pre: Precheck, case: ResizeCase) -> SpecResult {
    let node = devices_node(&pre).await?;
    let name = node.name_any();
    let request = case.pod_allocated.0;
    require_cpu(&node, milli_cpu(request)?, |cpu| {
        format!(
            "the node cannot fit the resized pod: it would request {request} CPU with what its claim \
             adds and node {name}, where the devices are, has {cpu} CPU allocatable, so the API server \
             refuses the resize (decided before deploying anything; upstream's spec fails here the same way)"
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::specs::node_allocatable::cases::{cgroup_cases, resize_cases};

    fn node(cpu: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("kind-worker".into());
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some([("cpu".to_owned(), Quantity(cpu.into()))].into()),
            ..Default::default()
        });
        n
    }

    /// On 2-CPU nodes, the cases whose pod (or resized pod) requests more than 2 CPUs skip, the
    /// others run; on 8-CPU nodes all run.
    #[test]
    fn cpu_requests_decide_on_small_nodes_only() {
        let fits =
            |cpu: &str, request: &str| require_cpu(&node(cpu), milli_cpu(request).unwrap(), |c| c.to_owned());
        let small: Vec<&str> = cgroup_cases()
            .iter()
            .filter(|c| fits("2", c.pod_cgroup.cpu_req).is_err())
            .map(|c| c.name)
            .collect();
        assert_eq!(small.len(), 8, "{small:?}");
        assert!(!small.contains(&"pod-level resources specified, container-level limits omitted"));
        assert!(small.contains(&"unreferenced overhead claim"));
        let resized: Vec<&str> =
            resize_cases().iter().filter(|c| fits("2", c.pod_allocated.0).is_err()).map(|c| c.name).collect();
        assert_eq!(
            resized,
            [
                "pod-level resources resize with container level request/limit omitted",
                "Pod level resize, container level request/limit present"
            ]
        );
        assert!(cgroup_cases().iter().all(|c| fits("8", c.pod_cgroup.cpu_req).is_ok()));
        assert!(resize_cases().iter().all(|c| fits("8", c.pod_allocated.0).is_ok()));
        assert_eq!(fits("1500m", "2").unwrap_err().skip_reason(), Some("1500m"));
    }
}
