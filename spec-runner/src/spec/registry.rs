//! Explicit spec registration: containers (`describe`/`context`) and specs (`it`).

use std::{collections::HashSet, future::Future, sync::Arc, time::Duration};

use futures::{FutureExt as _, future::BoxFuture};

use crate::{
    cluster::preflight::{ClusterInfo, KubeVersion},
    report::outcome::RunReport,
    run::after_run::AfterRun,
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
    /// The priority of the specs registered now ([`Registry::with_priority`]).
    priority: i32,
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
    /// Run once the run's summary is printed ([`Registry::after_run`]).
    pub(crate) after_run: Vec<AfterRun>,
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
            description: None,
            priority: self.priority,
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

    /// Gives every spec `body` registers the priority `priority` (ginkgo's `SpecPriority`
    /// decorator): a run starts specs of a higher priority before those of a lower one, and
    /// shuffles only within one priority. For specs that end long after they start (a long
    /// body, or a deferred check that waits on a cluster timer), so that their waits pass while
    /// shorter specs run instead of at the end of the run. Specs are 0 unless declared;
    /// [`SpecHandle::priority`] overrides it for one spec.
    pub fn with_priority(&mut self, priority: i32, body: impl FnOnce(&mut Registry)) {
        let outer = std::mem::replace(&mut self.priority, priority);
        body(self);
        self.priority = outer;
    }

    /// Runs `hook` for every spec once its [`Ctx`] exists, before its body (a suite-wide
    /// `BeforeEach`), e.g. to register [`ArtifactSource`](crate::ArtifactSource)s of the kinds
    /// the suite works with.
    pub fn before_each(&mut self, hook: impl Fn(&Ctx) + Send + Sync + 'static) {
        self.hooks.before_each.push(Arc::new(hook));
    }

    /// Runs `hook` once the run has ended and printed its summary (not when it stopped before
    /// its specs, e.g. at preflight), with the run's report and the cluster as preflight saw it:
    /// what it returns is printed after the summary; an error becomes the run's error (exit 2).
    /// For a suite's own report of the run, e.g. one it hands to someone else.
    pub fn after_run(
        &mut self,
        hook: impl Fn(&RunReport, &ClusterInfo) -> anyhow::Result<String> + Send + Sync + 'static,
    ) {
        self.hooks.after_run.push(Arc::new(hook));
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

    /// What the spec asserts, in a sentence or two; `--list -v` prints it under the spec's text.
    pub fn description(self, text: impl Into<String>) -> Self {
        self.registry.specs[self.index].info.description = Some(text.into());
        self
    }

    /// Sets this spec's priority (see [`Registry::with_priority`]).
    pub fn priority(self, priority: i32) -> Self {
        self.registry.specs[self.index].info.priority = priority;
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
mod tests;
