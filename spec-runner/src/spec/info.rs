//! The description of a registered spec ([`SpecInfo`]): its texts, labels, timeout and place.

use std::time::Duration;

use crate::spec::label::Label;

/// The description of a registered spec.
#[derive(Debug, Clone)]
pub struct SpecInfo {
    pub(super) index: usize,
    /// The top-level container (ginkgo shuffles these by default), or `None` at the top level.
    pub(super) top_level: Option<usize>,
    pub(super) container_text: String,
    pub(super) name: String,
    pub(super) own_labels: Vec<Label>,
    pub(super) inherited_labels: Vec<Label>,
    pub(super) labels: Vec<String>,
    pub(super) full_text: String,
    pub(super) timeout: Option<Duration>,
    /// Why the spec runs alone although it is not `[Serial]` ([`crate::SpecHandle::runs_alone`]).
    pub(super) alone: Option<String>,
    /// What the spec asserts, for `--list -v` ([`crate::SpecHandle::description`]).
    pub(super) description: Option<String>,
    /// Specs of a higher priority start first ([`crate::Registry::with_priority`]).
    pub(super) priority: i32,
}

impl SpecInfo {
    /// Container texts, the name and every `[label]`, as upstream's framework renders them
    /// (see [`Registry`](crate::Registry)): `[sig-node] [DRA] control plane [FeatureGate:X] reports [Alpha]`.
    pub fn full_text(&self) -> &str {
        &self.full_text
    }

    /// What ginkgo's default randomization shuffles as one unit: the spec's top-level container,
    /// or the spec itself when it is registered outside any container.
    pub(crate) fn shuffle_group(&self) -> (usize, usize) {
        match self.top_level {
            Some(container) => (container, usize::MAX),
            None => (usize::MAX, self.index),
        }
    }

    /// The spec's own text (the `it` text, without containers and labels).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All labels: inherited from containers first, then the spec's own.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The spec's own timeout, if it overrides `--timeout`.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Position in registration order.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether the spec carries the `Serial` label.
    pub fn is_serial(&self) -> bool {
        self.labels.iter().any(|l| l.eq_ignore_ascii_case("Serial"))
    }

    /// Whether the spec runs alone: `[Serial]`, or declared so with
    /// [`SpecHandle::runs_alone`](crate::SpecHandle::runs_alone). Such specs run before the others,
    /// each on a settled cluster and holding every worker slot.
    pub fn runs_alone(&self) -> bool {
        self.is_serial() || self.alone.is_some()
    }

    /// Why the spec runs alone although it is not `[Serial]`, if it was declared so.
    pub fn alone_because(&self) -> Option<&str> {
        self.alone.as_deref()
    }

    /// Its priority: the run starts specs of a higher priority before those of a lower one, in
    /// the seed's order within one priority (ginkgo's `SpecPriority`). 0 unless declared.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// What the spec asserts, if it was described ([`SpecHandle::description`](crate::SpecHandle::description)).
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// Renders the full text and the label list from the texts and labels.
    pub(super) fn render(&mut self) {
        let mut labels: Vec<String> = Vec::new();
        let mut trailing: Vec<&str> = Vec::new();
        for l in self.inherited_labels.iter().chain(&self.own_labels) {
            if !labels.iter().any(|have| have.as_str() == l.name()) {
                labels.push(l.name().to_owned());
            }
            if l.is_trailing() && !trailing.contains(&l.name()) {
                trailing.push(l.name());
            }
        }
        trailing.sort_unstable();
        let mut leaf = vec![self.name.clone()];
        leaf.extend(self.own_labels.iter().filter(|l| l.is_in_place()).map(|l| format!("[{}]", l.name())));
        for l in trailing {
            let text = format!("[{l}]");
            // Upstream never repeats at the end what the text before already shows.
            if !self.container_text.contains(&text) && !leaf.contains(&text) {
                leaf.push(text);
            }
        }
        self.full_text = join_nonempty([self.container_text.clone(), join_nonempty(leaf)]);
        self.labels = labels;
    }
}

/// The parts that are not empty, joined by spaces.
pub(super) fn join_nonempty(parts: impl IntoIterator<Item = String>) -> String {
    parts.into_iter().filter(|p| !p.is_empty()).collect::<Vec<_>>().join(" ")
}
