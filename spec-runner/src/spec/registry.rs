//! Explicit spec registration: containers (`describe`/`context`) and specs (`it`).

use std::{collections::HashSet, future::Future, sync::Arc, time::Duration};

use futures::{FutureExt as _, future::BoxFuture};

use crate::{
    cluster::preflight::KubeVersion,
    spec::ctx::Ctx,
    spec::error::SpecResult,
    spec::gate::GateTable,
    spec::info::{SpecInfo, join_nonempty},
    spec::label::{ALWAYS_TRAILING, Label},
    spec::requirements::{Precheck, Requirement},
};

/// A spec body, type-erased and shareable (a spec may run several times with `--repeat`).
pub(crate) type Body = Arc<dyn Fn(Ctx) -> BoxFuture<'static, SpecResult> + Send + Sync>;

/// All registered specs, in registration order.
///
/// A spec's full text is composed as upstream's e2e framework composes it
/// (`test/e2e/framework/ginkgowrapper.go`): each container's text followed by its in-place
/// labels as `[label]`, then the spec's name followed by its own in-place labels, then every
/// [`Label::trailing`] label of the containers and the spec, sorted, each once, left out
/// where the text before already shows it. A container whose whole text is `[sig-<name>]` is
/// upstream's `SIGDescribe("<name>")`: its text is the label `sig-<name>`.
///
/// ```
/// use std::time::Duration;
/// use spec_runner::{Ctx, Label, Registry};
///
/// let mut reg = Registry::new();
/// reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
///     r.context("control plane", |r| {
///         r.it("supports claim and class parameters", async |_ctx: Ctx| Ok(()))
///             .labels(["ConformanceCandidate"]);
///     });
///     r.context_with_labels("kubelet", ["Feature:DynamicResourceAllocation"], |r| {
///         r.it("registers plugin", async |_ctx| Ok(())).timeout(Duration::from_secs(300));
///     });
///     let gate = [Label::new("FeatureGate:X"), Label::trailing("Alpha")];
///     r.context_with_labels("control plane", gate, |r| {
///         r.it("reports", async |_ctx| Ok(())).label("KubeletMinVersion:1.37");
///     });
/// });
/// let texts: Vec<_> = reg.specs().map(|s| s.full_text().to_owned()).collect();
/// assert_eq!(texts, [
///     "[sig-node] [DRA] control plane supports claim and class parameters [ConformanceCandidate]",
///     "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] registers plugin",
///     "[sig-node] [DRA] control plane [FeatureGate:X] reports [KubeletMinVersion:1.37] [Alpha]",
/// ]);
/// assert_eq!(reg.specs().next().unwrap().labels(), ["sig-node", "DRA", "ConformanceCandidate"]);
/// ```
///
/// Bodies are `Fn(Ctx) -> impl Future<Output = SpecResult> + Send`: an async
/// closure that captures nothing (`async |ctx| { ... }`), or, to capture
/// parameters (table-driven specs), `move |ctx| { let p = p.clone(); async move { ... } }`.
#[derive(Default)]
pub struct Registry {
    specs: Vec<SpecDef>,
    containers: Vec<Container>,
    /// Requirements of every spec registered after them at the top level.
    top_requirements: Vec<Requirement>,
    problems: Vec<String>,
    hooks: SuiteHooks,
    /// Top-level containers registered so far, and the one being registered.
    top_level: (usize, Option<usize>),
    /// The feature gates of the Kubernetes version the texts are for ([`Registry::for_version`]).
    gates: Option<&'static GateTable>,
}

/// A hook run for every spec before its body ([`Registry::before_each`]).
pub(crate) type SpecHook = Arc<dyn Fn(&Ctx) + Send + Sync>;

/// What a suite adds to every run: API requirements checked at preflight and hooks that run for
/// every spec. The runner itself knows no API group and no kind beyond pods and events.
#[derive(Default, Clone)]
pub(crate) struct SuiteHooks {
    /// `(group version, what to tell the user when it is not served)`.
    pub(crate) required_apis: Vec<(String, String)>,
    /// Run for every spec once its [`Ctx`] exists, before its body.
    pub(crate) before_each: Vec<SpecHook>,
}

struct Container {
    text: String,
    labels: Vec<Label>,
    /// Requirements of every spec registered in it from now on ([`Registry::requires`]).
    requirements: Vec<Requirement>,
}

/// A registered spec: its description and its body.
pub(crate) struct SpecDef {
    pub(crate) info: SpecInfo,
    pub(crate) body: Body,
    /// Decided before the spec's namespace is created (its containers' first).
    pub(crate) requirements: Vec<Requirement>,
}

/// `text [l1] [l2]` with the in-place labels only.
fn render(text: &str, labels: &[Label]) -> String {
    let mut out = text.trim().to_owned();
    for l in labels.iter().filter(|l| l.is_in_place()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push('[');
        out.push_str(l.name());
        out.push(']');
    }
    out
}

/// The label of a container text `[sig-<name>]` (upstream's `SIGDescribe`).
fn sig_label(text: &str) -> Option<&str> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
    let sig = inner.strip_prefix("sig-")?;
    let valid =
        !sig.is_empty() && sig.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    valid.then_some(inner)
}

/// The registry is unusable; every problem is listed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid spec registration: {}", problems.join("; "))]
pub struct RegistryError {
    /// One sentence per problem.
    pub problems: Vec<String>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose texts are those of Kubernetes `gates.version`: every
    /// [`Label::gate`] is expanded with that version's feature gates.
    pub fn for_version(gates: &'static GateTable) -> Self {
        Self { gates: Some(gates), ..Self::default() }
    }

    /// The feature gate table the texts are composed with, if any.
    pub fn gate_table(&self) -> Option<&'static GateTable> {
        self.gates
    }

    /// The Kubernetes version the texts are for (`None` without a gate table), for specs whose
    /// structure changed between versions.
    pub fn target_version(&self) -> Option<KubeVersion> {
        self.gates.and_then(GateTable::kube_version)
    }

    /// Whether the texts are for Kubernetes `major.minor` or later (`false` without a gate table).
    pub fn targets_at_least(&self, major: u32, minor: u32) -> bool {
        self.target_version().is_some_and(|v| v.minor_version() >= (major, minor))
    }

    /// A container (ginkgo `Describe`): specs registered in `body` get `text` in front of their name.
    pub fn describe(&mut self, text: &str, body: impl FnOnce(&mut Registry)) {
        self.container(text, Vec::<String>::new(), body);
    }

    /// A container with labels, inherited by every spec inside: in-place ones rendered
    /// `text [label]...`, trailing ones at the end of each spec's text.
    pub fn describe_with_labels<I, S>(&mut self, text: &str, labels: I, body: impl FnOnce(&mut Registry))
    where
        I: IntoIterator<Item = S>,
        S: Into<Label>,
    {
        self.container(text, labels, body);
    }

    /// Same as [`Registry::describe`] (ginkgo `Context`).
    pub fn context(&mut self, text: &str, body: impl FnOnce(&mut Registry)) {
        self.container(text, Vec::<String>::new(), body);
    }

    /// Same as [`Registry::describe_with_labels`].
    pub fn context_with_labels<I, S>(&mut self, text: &str, labels: I, body: impl FnOnce(&mut Registry))
    where
        I: IntoIterator<Item = S>,
        S: Into<Label>,
    {
        self.container(text, labels, body);
    }

    fn container<I, S>(&mut self, text: &str, labels: I, body: impl FnOnce(&mut Registry))
    where
        I: IntoIterator<Item = S>,
        S: Into<Label>,
    {
        let mut labels = self.checked_labels(labels, text);
        let mut text = text.trim().to_owned();
        if let Some(sig) = sig_label(&text) {
            labels.insert(0, Label::from(sig));
            text.clear();
        }
        for l in labels.iter().filter(|l| l.is_in_place() && ALWAYS_TRAILING.contains(&l.name())) {
            self.problems.push(format!(
                "label {:?} of container {text:?} would follow the container text; upstream's framework renders it at the end of each spec's text, declare it as Label::trailing",
                l.name()
            ));
        }
        let outermost = self.containers.is_empty();
        if outermost {
            self.top_level.1 = Some(self.top_level.0);
            self.top_level.0 += 1;
        }
        self.containers.push(Container { text, labels, requirements: Vec::new() });
        body(self);
        self.containers.pop();
        if outermost {
            self.top_level.1 = None;
        }
    }

    fn checked_labels<I, S>(&mut self, labels: I, owner: &str) -> Vec<Label>
    where
        I: IntoIterator<Item = S>,
        S: Into<Label>,
    {
        let mut out = Vec::new();
        for l in labels {
            let l: Label = l.into();
            let expanded = if l.is_gate() {
                match self.gates.map(|t| t.expand(l.name())) {
                    Some(Ok(labels)) => labels,
                    Some(Err(problem)) => {
                        self.problems.push(format!("{problem} (in {owner:?})"));
                        continue;
                    }
                    None => {
                        self.problems.push(format!(
                            "feature gate {:?} in {owner:?} needs the gate table of a Kubernetes version (Registry::for_version)",
                            l.name()
                        ));
                        continue;
                    }
                }
            } else {
                vec![l]
            };
            for l in expanded {
                match l.validated() {
                    Ok(l) => out.push(l),
                    Err(problem) => self.problems.push(format!("{problem} (in {owner:?})")),
                }
            }
        }
        out
    }

    /// Registers a spec. Returns a handle to add labels or a timeout.
    pub fn it<F, Fut>(&mut self, name: &str, body: F) -> SpecHandle<'_>
    where
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = SpecResult> + Send + 'static,
    {
        let container_text = join_nonempty(self.containers.iter().map(|c| render(&c.text, &c.labels)));
        let inherited_labels: Vec<Label> =
            self.containers.iter().flat_map(|c| c.labels.iter().cloned()).collect();
        if name.trim().is_empty() {
            self.problems.push(format!("a spec in {container_text:?} has an empty name"));
        }
        let mut info = SpecInfo {
            index: self.specs.len(),
            top_level: self.top_level.1,
            container_text,
            name: name.trim().to_owned(),
            own_labels: Vec::new(),
            inherited_labels,
            labels: Vec::new(),
            full_text: String::new(),
            timeout: None,
            alone: None,
        };
        info.render();
        let body: Body = Arc::new(move |ctx| body(ctx).boxed());
        let requirements = (self.top_requirements.iter())
            .chain(self.containers.iter().flat_map(|c| c.requirements.iter()))
            .cloned()
            .collect();
        self.specs.push(SpecDef { info, body, requirements });
        let last = self.specs.len() - 1;
        SpecHandle { registry: self, index: last }
    }

    /// The registered specs, in registration order.
    pub fn specs(&self) -> impl Iterator<Item = &SpecInfo> {
        self.specs.iter().map(|s| &s.info)
    }

    /// Number of registered specs.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether no spec is registered.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Checks labels, names and that full texts are unique (they name
    /// artifact folders and JUnit test cases).
    pub fn validate(&self) -> Result<(), RegistryError> {
        let mut problems = self.problems.clone();
        let mut seen = HashSet::new();
        for s in &self.specs {
            if !seen.insert(s.info.full_text.as_str()) {
                problems.push(format!("two specs are named {:?}", s.info.full_text));
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(RegistryError { problems }) }
    }

    /// Every spec of this suite needs `group_version` (`resource.k8s.io/v1`): a cluster that
    /// does not serve it fails preflight with one sentence that ends with `hint`, and no spec runs.
    pub fn require_api(&mut self, group_version: impl Into<String>, hint: impl Into<String>) {
        self.hooks.required_apis.push((group_version.into(), hint.into()));
    }

    /// Every spec registered after this in the current container (all specs at the top level)
    /// requires what `requirement` decides, before anything is created for it: `Ok` runs the
    /// spec, a skip ([`SpecError::skip`](crate::SpecError::skip)) skips it in well under a second
    /// (no namespace is created), any other error fails it. Use it for what the cluster must
    /// have (nodes, their allocatable resources, gates), so a cluster without it costs nothing.
    pub fn requires<F, Fut>(&mut self, requirement: F)
    where
        F: Fn(Precheck) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = SpecResult> + Send + 'static,
    {
        let requirement: Requirement = Arc::new(move |pre| requirement(pre).boxed());
        match self.containers.last_mut() {
            Some(c) => c.requirements.push(requirement),
            None => self.top_requirements.push(requirement),
        }
    }

    /// Runs `hook` for every spec once its [`Ctx`] exists, before its body (a suite-wide
    /// `BeforeEach`), e.g. to register [`ArtifactSource`](crate::ArtifactSource)s of the kinds
    /// the suite works with.
    pub fn before_each(&mut self, hook: impl Fn(&Ctx) + Send + Sync + 'static) {
        self.hooks.before_each.push(Arc::new(hook));
    }

    pub(crate) fn into_parts(self) -> (Vec<SpecDef>, SuiteHooks) {
        (self.specs, self.hooks)
    }
}

/// Returned by [`Registry::it`]: adds labels or a timeout to the spec just registered.
pub struct SpecHandle<'a> {
    registry: &'a mut Registry,
    index: usize,
}

impl SpecHandle<'_> {
    /// Adds labels: in-place ones rendered `name [label]...` in this order, trailing ones
    /// (sorted with the containers' trailing labels) after them.
    pub fn labels<I, S>(self, labels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<Label>,
    {
        let owner = self.registry.specs[self.index].info.full_text.clone();
        let labels = self.registry.checked_labels(labels, &owner);
        let info = &mut self.registry.specs[self.index].info;
        info.own_labels.extend(labels);
        info.render();
        self
    }

    /// Adds one label.
    pub fn label(self, label: impl Into<Label>) -> Self {
        self.labels([label.into()])
    }

    /// This spec requires what `requirement` decides before anything is created for it (see
    /// [`Registry::requires`]); checked after its containers' requirements.
    pub fn requires<F, Fut>(self, requirement: F) -> Self
    where
        F: Fn(Precheck) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = SpecResult> + Send + 'static,
    {
        let requirement: Requirement = Arc::new(move |pre| requirement(pre).boxed());
        self.registry.specs[self.index].requirements.push(requirement);
        self
    }

    /// Overrides the default `--timeout` for this spec.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.registry.specs[self.index].info.timeout = Some(timeout);
        self
    }

    /// The spec runs alone, as a `[Serial]` spec does, without the label (its name stays
    /// upstream's): for a spec that needs what other specs' pods would hold (a node's allocatable
    /// CPU, say), so that it waits for them instead of being refused. `why` says what it needs.
    pub fn runs_alone(self, why: impl Into<String>) -> Self {
        self.registry.specs[self.index].info.alone = Some(why.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn sample() -> Registry {
        let mut reg = Registry::new();
        reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
            r.context("control plane", |r| {
                r.it("supports claim and class parameters", async |_| Ok(()))
                    .labels(["ConformanceCandidate"]);
                r.it("supports reusing resources", async |_| Ok(()));
            });
            r.context_with_labels("kubelet", ["Feature:DynamicResourceAllocation"], |r| {
                r.it("must retry NodePrepareResources", async |_| Ok(()));
                r.context("with rolling update", |r| {
                    r.it("keeps slices", async |_| Ok(()))
                        .labels(["KubeletMinVersion:1.33", "Slow"])
                        .label("Serial")
                        .timeout(Duration::from_secs(600));
                });
            });
        });
        reg.describe("CRUD Tests", |r| {
            r.it("resource.k8s.io/v1 DeviceClass", async |_| Ok(())).labels(["Conformance", "DRA"]);
        });
        reg.it("top level", async |_| Ok(()));
        reg
    }

    #[rstest]
    #[case(0, "[sig-node] [DRA] control plane supports claim and class parameters [ConformanceCandidate]", &["sig-node", "DRA", "ConformanceCandidate"])]
    #[case(1, "[sig-node] [DRA] control plane supports reusing resources", &["sig-node", "DRA"])]
    #[case(2, "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] must retry NodePrepareResources", &["sig-node", "DRA", "Feature:DynamicResourceAllocation"])]
    #[case(3, "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] with rolling update keeps slices [KubeletMinVersion:1.33] [Slow] [Serial]", &["sig-node", "DRA", "Feature:DynamicResourceAllocation", "KubeletMinVersion:1.33", "Slow", "Serial"])]
    #[case(4, "CRUD Tests resource.k8s.io/v1 DeviceClass [Conformance] [DRA]", &["Conformance", "DRA"])]
    #[case(5, "top level", &[])]
    fn renders_full_text_and_inherits_labels(
        #[case] index: usize,
        #[case] text: &str,
        #[case] labels: &[&str],
    ) {
        let reg = sample();
        let spec = reg.specs().nth(index).unwrap();
        assert_eq!(spec.full_text(), text);
        assert_eq!(spec.labels(), labels);
        assert_eq!(spec.index(), index);
    }

    #[test]
    fn keeps_timeouts_and_serial() {
        let reg = sample();
        let spec = reg.specs().nth(3).unwrap();
        assert_eq!(spec.timeout(), Some(Duration::from_secs(600)));
        assert!(spec.is_serial());
        assert_eq!(spec.name(), "keeps slices");
        assert!(!reg.specs().next().unwrap().is_serial());
        assert!(spec.runs_alone() && !reg.specs().next().unwrap().runs_alone());
        assert!(reg.validate().is_ok());
    }

    #[test]
    fn a_spec_declared_to_run_alone_keeps_its_name_and_labels() {
        let mut reg = Registry::new();
        reg.it("needs the whole node", async |_| Ok(())).runs_alone("a node's allocatable CPU");
        let spec = reg.specs().next().unwrap();
        assert!(spec.runs_alone() && !spec.is_serial());
        assert_eq!(spec.full_text(), "needs the whole node");
        assert!(spec.labels().is_empty());
        assert_eq!(spec.alone_because(), Some("a node's allocatable CPU"));
    }

    #[test]
    fn reports_invalid_labels_and_duplicates() {
        let mut reg = Registry::new();
        reg.describe_with_labels("a", ["x|y"], |r| {
            r.it("b", async |_| Ok(())).labels(["[Slow]"]);
            r.it("b", async |_| Ok(()));
        });
        reg.it(" ", async |_| Ok(()));
        let err = reg.validate().unwrap_err();
        assert_eq!(err.problems.len(), 4, "{err}");
        assert!(err.to_string().contains("two specs are named \"a b\""), "{err}");
        assert!(err.to_string().contains("label \"x|y\" contains '|'"), "{err}");
    }

    /// Upstream's `control plane` context with `WithFeatureGate(DRAResourcePoolStatus)` and a
    /// nested context with two more gates (dra.go, v1.37.2): the container's gate stays in
    /// place, its level, `OffByDefault` and dependencies go to the end, sorted, once, and a
    /// dependency the text already shows is not repeated.
    #[test]
    fn renders_trailing_labels_at_the_end_sorted_once() {
        let gate = [
            Label::new("FeatureGate:DRAResourcePoolStatus"),
            Label::trailing("Alpha"),
            Label::trailing("Feature:OffByDefault"),
            Label::trailing("FeatureGate:DynamicResourceAllocation"),
        ];
        let mut reg = Registry::new();
        reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
            r.context_with_labels("control plane", gate.clone(), |r| {
                r.it("should filter by pool name", async |_| Ok(()));
            });
            r.context_with_labels("control plane views", gate, |r| {
                let typed = [
                    Label::new("FeatureGate:DRAPartitionableDevices"),
                    Label::trailing("Beta"),
                    Label::trailing("FeatureGate:DynamicResourceAllocation"),
                    Label::new("FeatureGate:DRAPartitionableDevicesType"),
                    Label::trailing("Alpha"),
                    Label::trailing("Feature:OffByDefault"),
                    Label::trailing("FeatureGate:DRAResourcePoolStatus"),
                ];
                r.context_with_labels("partitionable typed view", typed, |r| {
                    r.it("should report partitionSummary", async |_| Ok(()))
                        .labels([Label::new("KubeletMinVersion:1.36"), Label::trailing("Serial")]);
                });
            });
        });
        let specs: Vec<_> = reg.specs().collect();
        assert_eq!(
            specs[0].full_text(),
            "[sig-node] [DRA] control plane [FeatureGate:DRAResourcePoolStatus] should filter by pool name [Alpha] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation]"
        );
        assert_eq!(
            specs[0].labels(),
            [
                "sig-node",
                "DRA",
                "FeatureGate:DRAResourcePoolStatus",
                "Alpha",
                "Feature:OffByDefault",
                "FeatureGate:DynamicResourceAllocation"
            ]
        );
        assert_eq!(
            specs[1].full_text(),
            "[sig-node] [DRA] control plane views [FeatureGate:DRAResourcePoolStatus] partitionable typed view [FeatureGate:DRAPartitionableDevices] [FeatureGate:DRAPartitionableDevicesType] should report partitionSummary [KubeletMinVersion:1.36] [Alpha] [Beta] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation] [Serial]"
        );
        assert!(specs[1].is_serial());
        assert!(reg.validate().is_ok());
    }

    #[test]
    fn hidden_labels_select_but_are_not_shown() {
        let mut reg = Registry::new();
        let gate = [
            Label::new("FeatureGate:GenericWorkload"),
            Label::trailing("Beta"),
            Label::trailing("Feature:OffByDefault"),
            Label::hidden("BetaOffByDefault"),
        ];
        reg.context_with_labels("kubelet", gate, |r| {
            r.it("allocates devices for PodGroups", async |_| Ok(()));
        });
        let spec = reg.specs().next().unwrap();
        assert_eq!(
            spec.full_text(),
            "kubelet [FeatureGate:GenericWorkload] allocates devices for PodGroups [Beta] [Feature:OffByDefault]"
        );
        assert!(spec.labels().iter().any(|l| l == "BetaOffByDefault"), "{:?}", spec.labels());
        assert!(reg.validate().is_ok());
    }

    #[rstest]
    #[case("[sig-node]", Some("sig-node"))]
    #[case(" [sig-api-machinery] ", Some("sig-api-machinery"))]
    #[case("[sig-]", None)]
    #[case("[sig-node] [DRA]", None)]
    #[case("[DRA]", None)]
    #[case("sig-node", None)]
    fn recognizes_sig_containers(#[case] text: &str, #[case] expected: Option<&str>) {
        assert_eq!(sig_label(text), expected);
    }

    #[test]
    fn rejects_always_trailing_labels_in_place_on_containers() {
        let mut reg = Registry::new();
        reg.context_with_labels("control plane", ["FeatureGate:X", "Alpha"], |r| {
            r.it("a", async |_| Ok(()));
        });
        let err = reg.validate().unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert!(err.problems[0].contains("\"Alpha\" of container \"control plane\""), "{err}");
    }

    #[test]
    fn accepts_capturing_bodies() {
        let mut reg = Registry::new();
        for n in [1, 2] {
            let param = format!("param {n}");
            reg.it(&format!("table {n}"), move |_ctx| {
                let param = param.clone();
                async move {
                    assert!(!param.is_empty());
                    Ok(())
                }
            });
        }
        assert_eq!(reg.len(), 2);
    }

    /// The gates of two made-up versions: `Dep` is GA then removed, `X` beta then GA.
    const OLD: crate::GateTable = crate::GateTable {
        version: "v1.37.2",
        gates: &[
            crate::Gate { name: "Dep", stability: crate::Stability::Ga, default: true, depends_on: &[] },
            crate::Gate { name: "X", stability: crate::Stability::Beta, default: true, depends_on: &["Dep"] },
            crate::Gate { name: "Y", stability: crate::Stability::Alpha, default: false, depends_on: &["X"] },
        ],
        removed: &[],
    };
    const NEW: crate::GateTable = crate::GateTable {
        version: "v1.38.0",
        gates: &[
            crate::Gate { name: "X", stability: crate::Stability::Ga, default: true, depends_on: &[] },
            crate::Gate { name: "Y", stability: crate::Stability::Alpha, default: false, depends_on: &["X"] },
        ],
        removed: &["Dep"],
    };

    fn gated(table: &'static crate::GateTable) -> Vec<String> {
        let mut reg = Registry::for_version(table);
        reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
            r.context_with_labels("kubelet", [Label::gate("X")], |r| {
                r.it("a", async |_| Ok(())).label(Label::gate("Y"));
                r.it("b", async |_| Ok(())).label(Label::gate("Dep"));
            });
        });
        reg.validate().unwrap();
        reg.specs().map(|s| s.full_text().to_owned()).collect()
    }

    #[test]
    fn composes_gate_labels_with_the_versions_table() {
        assert_eq!(
            gated(&OLD),
            [
                "[sig-node] [DRA] kubelet [FeatureGate:X] a [FeatureGate:Y] [Alpha] [Beta] [Feature:OffByDefault] [FeatureGate:Dep]",
                "[sig-node] [DRA] kubelet [FeatureGate:X] b [FeatureGate:Dep] [Beta]",
            ]
        );
        assert_eq!(
            gated(&NEW),
            [
                "[sig-node] [DRA] kubelet [FeatureGate:X] a [FeatureGate:Y] [Alpha] [Feature:OffByDefault]",
                "[sig-node] [DRA] kubelet [FeatureGate:X] b",
            ]
        );
        let mut reg = Registry::for_version(&NEW);
        assert!(reg.targets_at_least(1, 38) && !reg.targets_at_least(1, 39));
        reg.it("c", async |_| Ok(())).label(Label::gate("Typo"));
        assert!(
            reg.validate()
                .unwrap_err()
                .to_string()
                .contains("\"Typo\" is not in the gate table of Kubernetes v1.38.0")
        );
        let mut reg = Registry::new();
        reg.it("d", async |_| Ok(())).label(Label::gate("X"));
        assert!(reg.validate().unwrap_err().to_string().contains("needs the gate table"));
    }
}
