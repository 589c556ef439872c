//! Spec labels: validation and `key: value` label sets, as ginkgo has them.
//!
//! A label is free text without the characters `&|!,()/` (they are operators
//! of the label filter) and without `[` `]` (labels are rendered as `[label]`
//! in the spec text). A label `Key:Value` is also the member `value` of the
//! label set `key` (both trimmed, compared case-insensitively), so
//! `Feature:DynamicResourceAllocation` can be selected by
//! `Feature: isSubsetOf {DynamicResourceAllocation}`.
//!
//! Where a label shows in the spec text follows upstream's e2e framework
//! (`test/e2e/framework/ginkgowrapper.go`): most labels are rendered `[label]`
//! right after the text of the container or spec that declares them; a
//! [`Label::trailing`] one is rendered once, sorted with the others, at the very
//! end of each spec's text.

use std::borrow::Cow;

/// The labels upstream's framework always renders at the end of the spec text (its
/// `leafNodeLabels`, plus the feature gate stability levels it adds there). Declared on a
/// container, they must be [`Label::trailing`].
pub(crate) const ALWAYS_TRAILING: &[&str] = &[
    "Alpha",
    "Beta",
    "Conformance",
    "Deprecated",
    "Disruptive",
    "Feature:OffByDefault",
    "Flaky",
    "NodeConformance",
    "Serial",
    "Slow",
];

/// A label of a container or spec, and where the spec text shows it.
///
/// `&str` and `String` convert into in-place labels. Upstream's `framework.WithFeatureGate(X)`
/// is [`Label::gate`]: the registry expands it with the feature gates of the Kubernetes version
/// it composes texts for. By hand, for an alpha gate that is off by default and depends on
/// `DynamicResourceAllocation` at that version, that would be
///
/// ```
/// use spec_runner::Label;
///
/// const GATE: [Label; 4] = [
///     Label::new("FeatureGate:X"),
///     Label::trailing("Alpha"),
///     Label::trailing("Feature:OffByDefault"),
///     Label::trailing("FeatureGate:DynamicResourceAllocation"),
/// ];
/// # assert!(GATE[1].is_trailing() && !GATE[0].is_trailing());
/// # assert!(Label::gate("X").is_gate());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    name: Cow<'static, str>,
    trailing: bool,
    hidden: bool,
    /// `framework.WithFeatureGate(name)`: expanded by the registry's [`GateTable`](crate::GateTable).
    gate: bool,
}

impl Label {
    /// A label rendered `[name]` right after the text of the container or spec declaring it.
    pub const fn new(name: &'static str) -> Self {
        Self { name: Cow::Borrowed(name), trailing: false, hidden: false, gate: false }
    }

    /// A label that selects (`--label-filter`) but is not shown in the text (upstream's plain
    /// `ginkgo.Label`, e.g. the `BetaOffByDefault` that `framework.WithFeatureGate` adds for a
    /// beta gate that is off by default).
    pub const fn hidden(name: &'static str) -> Self {
        Self { name: Cow::Borrowed(name), trailing: false, hidden: true, gate: false }
    }

    /// A label rendered `[name]` at the end of the text of every spec it applies to, sorted with
    /// the other trailing labels, and left out there when the text before already shows
    /// `[name]` (upstream: stability levels, `Feature:OffByDefault`, `Serial`, `Slow`,
    /// `Conformance`, and the feature gates a gate depends on).
    pub const fn trailing(name: &'static str) -> Self {
        Self { name: Cow::Borrowed(name), trailing: true, hidden: false, gate: false }
    }

    /// [`Label::trailing`] with a computed name.
    pub(crate) fn trailing_owned(name: String) -> Self {
        Self { name: Cow::Owned(name), trailing: true, hidden: false, gate: false }
    }

    /// Upstream's `framework.WithFeatureGate(name)`: the registry expands it with the feature
    /// gate table of the Kubernetes version it registers for
    /// ([`Registry::for_version`](crate::Registry::for_version)): `[FeatureGate:name]` in place,
    /// then at the end of each spec's text the gate's stability (`[Alpha]`, `[Beta]`,
    /// `[Deprecated]`; nothing when GA), `[Feature:OffByDefault]` when it is off by default, and
    /// the gates it depends on, recursively. A gate the version has removed contributes nothing;
    /// one the table does not know is a registration problem.
    pub const fn gate(name: &'static str) -> Self {
        Self { name: Cow::Borrowed(name), trailing: false, hidden: false, gate: true }
    }

    /// Whether the label is a feature gate the registry expands ([`Label::gate`]).
    pub fn is_gate(&self) -> bool {
        self.gate
    }

    /// The label itself, without brackets.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the label is rendered at the end of the spec text.
    pub fn is_trailing(&self) -> bool {
        self.trailing
    }

    /// Whether the label is shown in the spec text at all.
    pub fn is_shown(&self) -> bool {
        !self.hidden
    }

    /// Whether the label is rendered right after the text of its container or spec.
    pub(crate) fn is_in_place(&self) -> bool {
        !self.trailing && !self.hidden
    }

    /// The same label, validated and trimmed.
    pub(crate) fn validated(self) -> Result<Self, String> {
        let name = validate(&self.name)?;
        Ok(Self { name: Cow::Owned(name), ..self })
    }
}

impl From<&str> for Label {
    fn from(name: &str) -> Self {
        Self { name: Cow::Owned(name.to_owned()), trailing: false, hidden: false, gate: false }
    }
}

impl From<String> for Label {
    fn from(name: String) -> Self {
        Self { name: Cow::Owned(name), trailing: false, hidden: false, gate: false }
    }
}

/// Characters a label must not contain.
const FORBIDDEN: &[char] = &['&', '|', '!', ',', '(', ')', '/', '[', ']'];

/// Checks a label and returns it trimmed, or says what is wrong with it.
pub(crate) fn validate(label: &str) -> Result<String, String> {
    let trimmed = label.trim();
    if trimmed.is_empty() {
        return Err("a label must not be empty".to_owned());
    }
    if let Some(c) = trimmed.chars().find(|c| FORBIDDEN.contains(c)) {
        return Err(format!(
            "label {label:?} contains {c:?}; labels must not contain any of & | ! , ( ) / [ ]"
        ));
    }
    if trimmed.starts_with(':') {
        return Err(format!("label {label:?} starts with ':'; a `key:value` label needs a key"));
    }
    if let Some((_, value)) = trimmed.split_once(':')
        && value.trim().is_empty()
    {
        return Err(format!("label {label:?} has an empty value after ':'"));
    }
    Ok(trimmed.to_owned())
}

/// The `(key, value)` of a `key:value` label, trimmed and lower-cased.
pub(crate) fn key_value(label: &str) -> Option<(String, String)> {
    let (key, value) = label.split_once(':')?;
    Some((key.trim().to_lowercase(), value.trim().to_lowercase()))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("Slow", Ok("Slow"))]
    #[case("  Feature:DynamicResourceAllocation ", Ok("Feature:DynamicResourceAllocation"))]
    #[case("KubeletMinVersion:1.34", Ok("KubeletMinVersion:1.34"))]
    #[case("", Err(()))]
    #[case("a&b", Err(()))]
    #[case("a/b", Err(()))]
    #[case("[Slow]", Err(()))]
    #[case(":x", Err(()))]
    #[case("Feature:", Err(()))]
    fn validates_labels(#[case] input: &str, #[case] expected: Result<&str, ()>) {
        assert_eq!(validate(input).map_err(|_| ()), expected.map(str::to_owned));
    }

    #[rstest]
    #[case("Feature:DRA", Some(("feature", "dra")))]
    #[case("Feature: A b ", Some(("feature", "a b")))]
    #[case("Slow", None)]
    fn splits_key_value(#[case] label: &str, #[case] expected: Option<(&str, &str)>) {
        assert_eq!(key_value(label), expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }
}
