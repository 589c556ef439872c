//! Which nodes a driver runs on (upstream's `Nodes` / `NewNodes(f, min, max)`).

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};

use crate::framework::{Ctx, SpecError, SpecResult};

/// The nodes chosen for a spec: ready, schedulable, untainted; sorted by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Nodes {
    names: Vec<String>,
    extra: Vec<String>,
    objects: Vec<Node>,
}

/// Why a node cannot be used, or `None` if it can: not ready, unschedulable, or a
/// `NoSchedule`/`NoExecute` taint (a test pod tolerates none), as upstream's
/// `GetBoundedReadySchedulableNodes` decides.
pub fn unusable_reason(node: &Node) -> Option<String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if !ready {
        return Some(format!("{name} is not ready"));
    }
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Some(format!("{name} is unschedulable (cordoned)"));
    }
    if let Some(taint) = spec
        .and_then(|s| s.taints.as_ref())
        .and_then(|ts| ts.iter().find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute"))
    {
        return Some(format!("{name} has taint {}:{}", taint.key, taint.effect));
    }
    None
}

/// A node selection that cannot be satisfied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{required} ready schedulable nodes required, the cluster has {usable}{}", if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join("; ")) })]
pub struct TooFewNodes {
    /// Nodes needed (including reserved ones).
    pub required: usize,
    /// Usable nodes found.
    pub usable: usize,
    /// Why the other nodes were not usable.
    pub reasons: Vec<String>,
}

impl Nodes {
    /// Nodes from names (for tests and specs that pick nodes themselves); sorted.
    pub fn from_names(mut names: Vec<String>, extra: Vec<String>) -> Self {
        names.sort();
        Nodes { names, extra, objects: Vec::new() }
    }

    /// Chooses between `min` and `max` usable nodes (sorted by name, the first ones win) plus
    /// `reserved` extra nodes that the driver leaves alone (upstream's `NumReservedNodes`, taken
    /// first). Fails with [`TooFewNodes`] if fewer than `min + reserved` are usable.
    pub fn choose(all: &[Node], min: usize, max: usize, reserved: usize) -> Result<Nodes, TooFewNodes> {
        let mut usable: Vec<&Node> = Vec::new();
        let mut reasons = Vec::new();
        for node in all {
            match unusable_reason(node) {
                None => usable.push(node),
                Some(reason) => reasons.push(reason),
            }
        }
        usable.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        if usable.len() < min + reserved {
            return Err(TooFewNodes { required: min + reserved, usable: usable.len(), reasons });
        }
        usable.truncate(max.max(min) + reserved);
        let extra: Vec<String> =
            usable.iter().take(reserved).map(|n| n.metadata.name.clone().unwrap_or_default()).collect();
        let chosen: Vec<Node> = usable.into_iter().skip(reserved).cloned().collect();
        let mut nodes = Nodes::from_names(
            chosen.iter().map(|n| n.metadata.name.clone().unwrap_or_default()).collect(),
            extra,
        );
        nodes.objects = chosen;
        Ok(nodes)
    }

    /// Lists the cluster's nodes and [`Nodes::choose`]s; a spec is skipped (with the reason)
    /// when the cluster has too few usable nodes.
    ///
    /// ```no_run
    /// # async fn body(ctx: harness::framework::Ctx) -> harness::framework::SpecResult {
    /// let nodes = harness::driver::Nodes::select(&ctx, 2, 8).await?; // skips on a one-node cluster
    /// # Ok(()) }
    /// ```
    pub async fn select(ctx: &Ctx, min: usize, max: usize) -> SpecResult<Nodes> {
        Self::select_reserving(ctx, min, max, 0).await
    }

    /// [`Nodes::select`] with `reserved` extra nodes set aside ([`Nodes::extra`]).
    pub async fn select_reserving(ctx: &Ctx, min: usize, max: usize, reserved: usize) -> SpecResult<Nodes> {
        let list = Api::<Node>::all(ctx.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| SpecError::Failed(anyhow::Error::new(e).context("list nodes")))?;
        let nodes =
            Nodes::choose(&list.items, min, max, reserved).map_err(|e| SpecError::skip(e.to_string()))?;
        tracing::info!(nodes = ?nodes.names, extra = ?nodes.extra, "selected nodes");
        Ok(nodes)
    }

    /// The chosen node names, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The reserved nodes (not used by the driver).
    pub fn extra(&self) -> &[String] {
        &self.extra
    }

    /// The chosen Node objects as listed, when selected from the cluster.
    pub fn objects(&self) -> &[Node] {
        &self.objects
    }

    /// Number of chosen nodes.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no node was chosen.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};
    use rstest::rstest;

    use super::*;

    fn node(name: &str, ready: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    fn cordoned(name: &str) -> Node {
        let mut n = node(name, true);
        n.spec = Some(NodeSpec { unschedulable: Some(true), ..Default::default() });
        n
    }

    fn tainted(name: &str, effect: &str) -> Node {
        let mut n = node(name, true);
        n.spec = Some(NodeSpec {
            taints: Some(vec![Taint { key: "k".into(), effect: effect.into(), ..Default::default() }]),
            ..Default::default()
        });
        n
    }

    fn cluster() -> Vec<Node> {
        vec![
            node("d", true),
            node("b", true),
            node("x", false),
            cordoned("y"),
            tainted("z", "NoSchedule"),
            tainted("c", "PreferNoSchedule"),
            node("a", true),
        ]
    }

    #[rstest]
    #[case(1, 1, 0, &["a"], &[])]
    #[case(1, 8, 0, &["a", "b", "c", "d"], &[])]
    #[case(2, 2, 0, &["a", "b"], &[])]
    #[case(2, 3, 1, &["b", "c", "d"], &["a"])]
    fn chooses_usable_nodes_sorted(
        #[case] min: usize,
        #[case] max: usize,
        #[case] reserved: usize,
        #[case] names: &[&str],
        #[case] extra: &[&str],
    ) {
        let nodes = Nodes::choose(&cluster(), min, max, reserved).unwrap();
        assert_eq!(nodes.names(), names);
        assert_eq!(nodes.extra(), extra);
        assert_eq!(nodes.objects().len(), names.len());
    }

    #[test]
    fn too_few_nodes_says_why() {
        let err = Nodes::choose(&cluster(), 5, 8, 0).unwrap_err();
        assert_eq!(err.required, 5);
        assert_eq!(err.usable, 4);
        assert_eq!(
            err.to_string(),
            "5 ready schedulable nodes required, the cluster has 4 (x is not ready; y is unschedulable (cordoned); z has taint k:NoSchedule)"
        );
        let one = Nodes::choose(&[node("127.0.0.1", true)], 2, 8, 0).unwrap_err();
        assert_eq!(one.to_string(), "2 ready schedulable nodes required, the cluster has 1");
    }

    /// kind's default cluster (and the local cluster's): the tainted control plane is never
    /// chosen, specs asking for up to 4 nodes get the three workers.
    #[test]
    fn a_kind_cluster_gives_its_workers_not_the_control_plane() {
        let mut control_plane = node("kind-control-plane", true);
        control_plane.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "node-role.kubernetes.io/control-plane".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let all = [
            control_plane,
            node("kind-worker", true),
            node("kind-worker2", true),
            node("kind-worker3", true),
        ];
        let nodes = Nodes::choose(&all, 1, 4, 0).unwrap();
        assert_eq!(nodes.names(), ["kind-worker", "kind-worker2", "kind-worker3"]);
        let err = Nodes::choose(&all, 4, 4, 0).unwrap_err();
        assert!(
            err.to_string()
                .contains("kind-control-plane has taint node-role.kubernetes.io/control-plane:NoSchedule"),
            "{err}"
        );
    }

    #[test]
    fn from_names_sorts() {
        let n = Nodes::from_names(vec!["b".into(), "a".into()], vec![]);
        assert_eq!(n.names(), ["a", "b"]);
        assert_eq!(n.len(), 2);
    }
}
