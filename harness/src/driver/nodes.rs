//! Which nodes a driver runs on (upstream's `Nodes` / `NewNodes(f, min, max)`).

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};

use crate::framework::{ClusterAccess, KubeVersion, SpecError, SpecResult, kubelet_min_version};

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

/// Why a usable node's kubelet is too old for a spec that needs `min` (its
/// `KubeletMinVersion` label), or `None` if it is new enough.
pub fn too_old_reason(node: &Node, min: KubeVersion) -> Option<String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let reported =
        node.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| i.kubelet_version.as_str());
    match reported.and_then(KubeVersion::parse) {
        Some(version) if version >= min => None,
        _ => Some(format!(
            "{name} runs kubelet {}, older than the spec's KubeletMinVersion {}.{}",
            reported.unwrap_or("of no reported version"),
            min.major,
            min.minor
        )),
    }
}

/// The features a node declares in `status.declaredFeatures` (what its kubelet has turned on
/// among the features the scheduler asks about, e.g. `DRAOptionalNodeOperations`).
pub fn declared_features(node: &Node) -> &[String] {
    node.status.as_ref().and_then(|s| s.declared_features.as_deref()).unwrap_or_default()
}

/// Why a usable node does not declare `feature`, or `None` if it does; names its kubelet version
/// and what it declares instead.
pub fn undeclared_reason(node: &Node, feature: &str) -> Option<String> {
    let declared = declared_features(node);
    if declared.iter().any(|f| f == feature) {
        return None;
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let kubelet = node.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| i.kubelet_version.as_str());
    Some(format!(
        "{name} (kubelet {}) does not declare {feature} (declares {})",
        kubelet.filter(|v| !v.is_empty()).unwrap_or("of no reported version"),
        if declared.is_empty() { "nothing".to_owned() } else { declared.join(", ") }
    ))
}

/// What a spec needs of a node besides being usable ([`unusable_reason`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeNeeds<'a> {
    /// The oldest kubelet it can use (its `KubeletMinVersion` label, upstream's
    /// `WithKubeletMinVersion`).
    pub kubelet: Option<KubeVersion>,
    /// A feature the node must declare in `status.declaredFeatures`.
    pub declares: Option<&'a str>,
}

impl NodeNeeds<'_> {
    /// Why a usable node does not meet these needs, or `None` if it does.
    pub fn unmet_reason(&self, node: &Node) -> Option<String> {
        self.kubelet
            .and_then(|v| too_old_reason(node, v))
            .or_else(|| self.declares.and_then(|feature| undeclared_reason(node, feature)))
    }
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
        Self::choose_with(all, min, max, reserved, NodeNeeds::default())
    }

    /// [`Nodes::choose`] among the nodes that meet `needs` (reserved nodes too, since a spec may
    /// move its driver onto them).
    pub fn choose_with(
        all: &[Node],
        min: usize,
        max: usize,
        reserved: usize,
        needs: NodeNeeds<'_>,
    ) -> Result<Nodes, TooFewNodes> {
        let mut usable: Vec<&Node> = Vec::new();
        let mut reasons = Vec::new();
        for node in all {
            let reason = unusable_reason(node).or_else(|| needs.unmet_reason(node));
            match reason {
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
    /// when the cluster has too few usable nodes. A spec labelled `KubeletMinVersion:X` gets only
    /// nodes whose kubelet is at least X ([`NodeNeeds::kubelet`]). Works from a spec's body (a
    /// `Ctx`) and from its requirements (a `Precheck`) alike, so a requirement can decide on the
    /// very nodes the body will get.
    ///
    /// ```no_run
    /// # async fn body(ctx: harness::framework::Ctx) -> harness::framework::SpecResult {
    /// let nodes = harness::driver::Nodes::select(&ctx, 2, 8).await?; // skips on a one-node cluster
    /// # Ok(()) }
    /// ```
    pub async fn select(from: &impl ClusterAccess, min: usize, max: usize) -> SpecResult<Nodes> {
        Self::select_with(from, min, max, 0, None).await
    }

    /// [`Nodes::select`] with `reserved` extra nodes set aside ([`Nodes::extra`]).
    pub async fn select_reserving(
        from: &impl ClusterAccess,
        min: usize,
        max: usize,
        reserved: usize,
    ) -> SpecResult<Nodes> {
        Self::select_with(from, min, max, reserved, None).await
    }

    /// [`Nodes::select`] among the nodes that declare `feature` in `status.declaredFeatures`
    /// ([`NodeNeeds::declares`]).
    pub async fn select_declaring(
        from: &impl ClusterAccess,
        min: usize,
        max: usize,
        feature: &str,
    ) -> SpecResult<Nodes> {
        Self::select_with(from, min, max, 0, Some(feature)).await
    }

    /// Lists the cluster's nodes (a failure to list fails the spec).
    pub async fn list(from: &impl ClusterAccess) -> SpecResult<Vec<Node>> {
        let list = Api::<Node>::all(from.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| SpecError::Failed(anyhow::Error::new(e).context("list nodes")))?;
        Ok(list.items)
    }

    async fn select_with(
        from: &impl ClusterAccess,
        min: usize,
        max: usize,
        reserved: usize,
        declares: Option<&str>,
    ) -> SpecResult<Nodes> {
        let all = Self::list(from).await?;
        let needs = NodeNeeds { kubelet: kubelet_min_version(from.labels()), declares };
        let nodes = Nodes::choose_with(&all, min, max, reserved, needs)
            .map_err(|e| SpecError::skip(e.to_string()))?;
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
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint};
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

    fn with_kubelet(name: &str, version: &str) -> Node {
        let mut n = node(name, true);
        if let Some(status) = n.status.as_mut() {
            status.node_info = Some(NodeSystemInfo { kubelet_version: version.into(), ..Default::default() });
        }
        n
    }

    /// A skew cluster: an old kubelet on the first worker. A spec without a minimum gets it
    /// first; one that needs a newer kubelet gets the others, and is skipped with the reason
    /// when too few are left.
    #[test]
    fn a_kubelet_min_version_leaves_older_nodes_out() {
        let all = [
            with_kubelet("kind-worker", "v1.34.3"),
            with_kubelet("kind-worker2", "v1.37.2"),
            with_kubelet("kind-worker3", "v1.36.3"),
            node("no-version", true),
        ];
        let v = |text| NodeNeeds { kubelet: KubeVersion::parse(text), declares: None };
        let any = Nodes::choose_with(&all, 1, 1, 0, NodeNeeds::default()).unwrap();
        assert_eq!(any.names(), ["kind-worker"]);
        let v134 = Nodes::choose_with(&all, 1, 1, 0, v("1.34")).unwrap();
        assert_eq!(v134.names(), ["kind-worker"]);
        let v136 = Nodes::choose_with(&all, 1, 4, 0, v("1.36")).unwrap();
        assert_eq!(v136.names(), ["kind-worker2", "kind-worker3"]);
        let err = Nodes::choose_with(&all, 2, 2, 0, v("1.37")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "2 ready schedulable nodes required, the cluster has 1 (kind-worker runs kubelet v1.34.3, older than the spec's KubeletMinVersion 1.37; kind-worker3 runs kubelet v1.36.3, older than the spec's KubeletMinVersion 1.37; no-version runs kubelet of no reported version, older than the spec's KubeletMinVersion 1.37)"
        );
    }

    fn declaring(name: &str, version: &str, features: &[&str]) -> Node {
        let mut n = with_kubelet(name, version);
        if let Some(status) = n.status.as_mut() {
            status.declared_features = Some(features.iter().map(|f| f.to_string()).collect());
        }
        n
    }

    /// A skew cluster where only the v1.37 kubelets know the gate, one of them with it off: a
    /// spec that needs the feature declared gets the node that declares it, not the first
    /// worker; without such a node the reason names each node's kubelet and declared features.
    #[test]
    fn a_declared_feature_picks_the_nodes_that_declare_it() {
        let all = [
            with_kubelet("kind-worker", "v1.34.4"),
            declaring("kind-worker2", "v1.37.2", &["DRAOptionalNodeOperations", "Other"]),
            declaring("kind-worker3", "v1.37.2", &["Other"]),
        ];
        let needs = NodeNeeds { kubelet: None, declares: Some("DRAOptionalNodeOperations") };
        assert_eq!(Nodes::choose(&all, 1, 1, 0).unwrap().names(), ["kind-worker"]);
        assert_eq!(Nodes::choose_with(&all, 1, 1, 0, needs).unwrap().names(), ["kind-worker2"]);
        assert_eq!(Nodes::choose_with(&all, 1, 4, 0, needs).unwrap().names(), ["kind-worker2"]);
        let err = Nodes::choose_with(&all[..1], 1, 1, 0, needs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "1 ready schedulable nodes required, the cluster has 0 (kind-worker (kubelet v1.34.4) does not declare DRAOptionalNodeOperations (declares nothing))"
        );
        assert_eq!(
            undeclared_reason(&all[2], "DRAOptionalNodeOperations").as_deref(),
            Some(
                "kind-worker3 (kubelet v1.37.2) does not declare DRAOptionalNodeOperations (declares Other)"
            )
        );
        assert_eq!(undeclared_reason(&all[1], "DRAOptionalNodeOperations"), None);
        // Both needs at once: the kubelet version is checked first.
        let both = NodeNeeds { kubelet: KubeVersion::parse("1.38"), ..needs };
        assert!(both.unmet_reason(&all[1]).is_some_and(|r| r.contains("older than")));
    }

    #[test]
    fn from_names_sorts() {
        let n = Nodes::from_names(vec!["b".into(), "a".into()], vec![]);
        assert_eq!(n.names(), ["a", "b"]);
        assert_eq!(n.len(), 2);
    }
}
