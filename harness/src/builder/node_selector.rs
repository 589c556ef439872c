//! A `NodeSelector` (a claim's `status.allocation.nodeSelector`, a pod's required node affinity)
//! matched against a Node as the API defines it, following `k8s.io/component-helpers`
//! `scheduling/corev1/nodeaffinity` (`NewNodeSelector` and `Match`):
//!
//! - the terms are ORed; a term with neither `matchExpressions` nor `matchFields` is left out,
//!   so it matches nothing (and a selector without terms matches no node);
//! - within a term, every requirement must hold (ANDed);
//! - `matchExpressions` on the node's labels: `In`, `NotIn` (holds when the label is absent),
//!   `Exists`, `DoesNotExist`, `Gt` and `Lt` (the label's value, an integer, compared with the
//!   requirement's one value; a label that is absent or no integer does not hold);
//! - `matchFields` on the node's fields, of which only `metadata.name` exists (another field reads
//!   as the empty string): `In` and `NotIn` with exactly one value;
//! - a requirement that is not well formed (an unknown operator, a bad label key or value, the
//!   wrong number of values, a `Gt`/`Lt` value that is no integer) makes the selector invalid:
//!   [`NodeSelectorMatcher::parse`] says what is wrong with each, as the scheduler refuses it.

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// Why a node selector cannot be used: one sentence per bad requirement, with its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the node selector is invalid: {}", problems.join("; "))]
pub struct InvalidNodeSelector {
    /// Each bad requirement: `nodeSelectorTerms[i].matchExpressions[j].key: ...`.
    pub problems: Vec<String>,
}

/// A parsed node selector that tells which nodes it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorMatcher {
    terms: Vec<Term>,
}

/// One non-empty term: its label and field requirements (`None`: the term has none of them).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    labels: Option<Vec<LabelRequirement>>,
    fields: Option<Vec<FieldRequirement>>,
}

/// A requirement on one label.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

/// A requirement on one field: its value equals `value` (`In`) or does not (`NotIn`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    key: String,
    equal: bool,
    value: String,
}

/// The only node field a selector can name.
const NAME_FIELD: &str = "metadata.name";
/// The longest label name and value.
const LABEL_MAX: usize = 63;
/// The longest DNS subdomain (a label key's prefix).
const SUBDOMAIN_MAX: usize = 253;

impl NodeSelectorMatcher {
    /// Parses `selector`; fails naming every requirement that is not well formed.
    pub fn parse(selector: &NodeSelector) -> Result<Self, InvalidNodeSelector> {
        let mut problems = Vec::new();
        let mut terms = Vec::new();
        for (i, term) in selector.node_selector_terms.iter().enumerate() {
            if let Some(term) = parse_term(term, &format!("nodeSelectorTerms[{i}]"), &mut problems) {
                terms.push(term);
            }
        }
        if problems.is_empty() {
            Ok(NodeSelectorMatcher { terms })
        } else {
            Err(InvalidNodeSelector { problems })
        }
    }

    /// Whether some term matches `node`.
    pub fn matches(&self, node: &Node) -> bool {
        let empty = Default::default();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        let name = node.metadata.name.as_deref().unwrap_or_default();
        self.terms.iter().any(|term| {
            let labels_hold = term.labels.as_ref().is_none_or(|rs| rs.iter().all(|r| r.holds(labels)));
            // As upstream: a node without a name has no fields, and then fields are not checked.
            let fields_hold =
                name.is_empty() || term.fields.as_ref().is_none_or(|rs| rs.iter().all(|r| r.holds(name)));
            labels_hold && fields_hold
        })
    }
}

/// Whether `selector` admits `node`, as the scheduler decides it; an invalid selector is an error.
pub fn node_selector_admits(selector: &NodeSelector, node: &Node) -> Result<bool, InvalidNodeSelector> {
    Ok(NodeSelectorMatcher::parse(selector)?.matches(node))
}

/// The term, or `None` when it is empty (left out) or not well formed (its problems added).
fn parse_term(term: &NodeSelectorTerm, path: &str, problems: &mut Vec<String>) -> Option<Term> {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return None;
    }
    let before = problems.len();
    let labels = (!expressions.is_empty()).then(|| {
        let path = format!("{path}.matchExpressions");
        expressions
            .iter()
            .enumerate()
            .filter_map(|(j, r)| parse_label_requirement(r, &format!("{path}[{j}]"), problems))
            .collect()
    });
    let fields = (!fields.is_empty()).then(|| {
        let path = format!("{path}.matchFields");
        fields
            .iter()
            .enumerate()
            .filter_map(|(j, r)| parse_field_requirement(r, &format!("{path}[{j}]"), problems))
            .collect()
    });
    (problems.len() == before).then_some(Term { labels, fields })
}

fn parse_label_requirement(
    r: &NodeSelectorRequirement,
    path: &str,
    problems: &mut Vec<String>,
) -> Option<LabelRequirement> {
    let before = problems.len();
    let values = r.values.clone().unwrap_or_default();
    if let Err(e) = check_label_key(&r.key) {
        problems.push(format!("{path}.key: {:?} is not a label key: {e}", r.key));
    }
    let one_integer = |problems: &mut Vec<String>| {
        if values.len() != 1 {
            problems.push(format!("{path}.values: {} needs exactly one value, got {values:?}", r.operator));
        }
        let parsed: Vec<Option<i64>> = values.iter().map(|v| v.parse().ok()).collect();
        for (k, v) in values.iter().enumerate() {
            if parsed[k].is_none() {
                problems
                    .push(format!("{path}.values[{k}]: {v:?} is not an integer, which {} needs", r.operator));
            }
        }
        parsed.first().copied().flatten().unwrap_or_default()
    };
    let op = match r.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                problems.push(format!("{path}.values: {} needs at least one value", r.operator));
            }
            if r.operator == "In" { LabelOp::In(values.clone()) } else { LabelOp::NotIn(values.clone()) }
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                problems.push(format!("{path}.values: {} takes no values, got {values:?}", r.operator));
            }
            if r.operator == "Exists" { LabelOp::Exists } else { LabelOp::DoesNotExist }
        }
        "Gt" => LabelOp::Gt(one_integer(problems)),
        "Lt" => LabelOp::Lt(one_integer(problems)),
        other => {
            problems.push(format!(
                "{path}.operator: {other:?} is not supported (In, NotIn, Exists, DoesNotExist, Gt, Lt)"
            ));
            LabelOp::Exists
        }
    };
    for (k, v) in values.iter().enumerate() {
        if let Err(e) = check_label_value(v) {
            problems.push(format!("{path}.values[{k}]: {v:?} is not a label value: {e}"));
        }
    }
    (problems.len() == before).then(|| LabelRequirement { key: r.key.clone(), op })
}

fn parse_field_requirement(
    r: &NodeSelectorRequirement,
    path: &str,
    problems: &mut Vec<String>,
) -> Option<FieldRequirement> {
    let equal = match r.operator.as_str() {
        "In" => true,
        "NotIn" => false,
        other => {
            problems.push(format!("{path}.operator: {other:?} is not supported for fields (In, NotIn)"));
            return None;
        }
    };
    match r.values.as_deref().unwrap_or_default() {
        [value] => Some(FieldRequirement { key: r.key.clone(), equal, value: value.clone() }),
        values => {
            problems
                .push(format!("{path}.values: a field requirement needs exactly one value, got {values:?}"));
            None
        }
    }
}

impl LabelRequirement {
    fn holds(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        let integer = || value.and_then(|v| v.parse::<i64>().ok());
        match &self.op {
            LabelOp::In(values) => value.is_some_and(|v| values.contains(v)),
            LabelOp::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            LabelOp::Gt(bound) => integer().is_some_and(|v| v > *bound),
            LabelOp::Lt(bound) => integer().is_some_and(|v| v < *bound),
        }
    }
}

impl FieldRequirement {
    fn holds(&self, name: &str) -> bool {
        let value = if self.key == NAME_FIELD { name } else { "" };
        (value == self.value) == self.equal
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters, non-empty.
fn check_label_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name part is empty".to_owned());
    }
    if name.len() > LABEL_MAX {
        return Err(format!("the name part is longer than {LABEL_MAX} characters"));
    }
    let inner_ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err("the name part must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character".to_owned())
    }
}

/// A label key: a name, optionally behind a DNS subdomain prefix and `/`.
fn check_label_key(key: &str) -> Result<(), String> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        [name] => check_label_name(name),
        [prefix, name] => {
            check_subdomain(prefix).map_err(|e| format!("the prefix {e}"))?;
            check_label_name(name)
        }
        _ => Err("a label key has at most one '/'".to_owned()),
    }
}

/// Empty, or a label name.
fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() { Ok(()) } else { check_label_name(value) }
}

/// A lowercase RFC 1123 DNS subdomain: dot-separated labels of `[a-z0-9-]`, each starting and
/// ending alphanumeric, at most 253 characters.
fn check_subdomain(prefix: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if prefix.is_empty() {
        Err("is empty".to_owned())
    } else if prefix.len() > SUBDOMAIN_MAX {
        Err(format!("is longer than {SUBDOMAIN_MAX} characters"))
    } else if prefix.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("is not a lowercase DNS subdomain".to_owned())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn node(name: &str, labels: Value) -> Node {
        serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).unwrap()
    }

    fn selector(terms: Value) -> NodeSelector {
        serde_json::from_value(json!({ "nodeSelectorTerms": terms })).unwrap()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> Value {
        json!({ "key": key, "operator": op, "values": values })
    }

    /// The cases of upstream's `TestNodeSelectorMatch` and `TestPodMatchesNodeSelectorAndAffinityTerms`
    /// (the node affinity part), plus each operator's edge: `(case, terms, node, matches)`.
    #[test]
    fn matches_as_the_api_defines() {
        let host1 = || node("host_1", json!({}));
        let labelled = |labels: Value| node("machine1", labels);
        let cases: Vec<(&str, Value, Node, bool)> = vec![
            (
                "node matches field selector, but not labels",
                json!([{ "matchExpressions": [expr("label_1", "In", &["label_1_val"])],
                         "matchFields": [expr("metadata.name", "In", &["host_1"])] }]),
                host1(),
                false,
            ),
            (
                "node matches field selector and label selector",
                json!([{ "matchExpressions": [expr("label_1", "In", &["label_1_val"])],
                         "matchFields": [expr("metadata.name", "In", &["host_1"])] }]),
                node("host_1", json!({ "label_1": "label_1_val" })),
                true,
            ),
            (
                "second term matches",
                json!([{ "matchExpressions": [expr("label_1", "In", &["label_1_val"])] },
                       { "matchFields": [expr("metadata.name", "In", &["host_1"])] }]),
                host1(),
                true,
            ),
            ("a selector without terms matches nothing", json!([]), labelled(json!({ "foo": "bar" })), false),
            ("an empty term matches nothing", json!([{}]), labelled(json!({ "foo": "bar" })), false),
            (
                "empty matchExpressions match nothing",
                json!([{ "matchExpressions": [] }]),
                labelled(json!({ "foo": "bar" })),
                false,
            ),
            (
                "an empty term beside one that does not match",
                json!([{}, { "matchExpressions": [expr("foo", "In", &["baz"])] }]),
                labelled(json!({ "foo": "bar" })),
                false,
            ),
            (
                "In matches",
                json!([{ "matchExpressions": [expr("foo", "In", &["bar", "value2"])] }]),
                labelled(json!({ "foo": "bar" })),
                true,
            ),
            (
                "In does not match a missing label",
                json!([{ "matchExpressions": [expr("foo", "In", &["bar"])] }]),
                labelled(json!({})),
                false,
            ),
            (
                "Gt matches a larger integer",
                json!([{ "matchExpressions": [expr("kernel-version", "Gt", &["0204"])] }]),
                labelled(json!({ "kernel-version": "0206" })),
                true,
            ),
            (
                "Gt does not match an equal integer",
                json!([{ "matchExpressions": [expr("cpus", "Gt", &["4"])] }]),
                labelled(json!({ "cpus": "4" })),
                false,
            ),
            (
                "Gt does not match a label that is no integer",
                json!([{ "matchExpressions": [expr("cpus", "Gt", &["4"])] }]),
                labelled(json!({ "cpus": "many" })),
                false,
            ),
            (
                "Lt matches a smaller integer",
                json!([{ "matchExpressions": [expr("cpus", "Lt", &["4"])] }]),
                labelled(json!({ "cpus": "3" })),
                true,
            ),
            (
                "Lt does not match a missing label",
                json!([{ "matchExpressions": [expr("cpus", "Lt", &["4"])] }]),
                labelled(json!({})),
                false,
            ),
            (
                "NotIn matches another value",
                json!([{ "matchExpressions": [expr("mem-type", "NotIn", &["DDR", "DDR2"])] }]),
                labelled(json!({ "mem-type": "DDR3" })),
                true,
            ),
            (
                "NotIn matches a missing label",
                json!([{ "matchExpressions": [expr("mem-type", "NotIn", &["DDR"])] }]),
                labelled(json!({})),
                true,
            ),
            (
                "NotIn does not match a listed value",
                json!([{ "matchExpressions": [expr("mem-type", "NotIn", &["DDR"])] }]),
                labelled(json!({ "mem-type": "DDR" })),
                false,
            ),
            (
                "Exists matches",
                json!([{ "matchExpressions": [{ "key": "GPU", "operator": "Exists" }] }]),
                labelled(json!({ "GPU": "NVIDIA-GRID-K1" })),
                true,
            ),
            (
                "DoesNotExist matches a missing label",
                json!([{ "matchExpressions": [{ "key": "GPU", "operator": "DoesNotExist" }] }]),
                labelled(json!({ "foo": "bar" })),
                true,
            ),
            (
                "DoesNotExist does not match a present label",
                json!([{ "matchExpressions": [{ "key": "GPU", "operator": "DoesNotExist" }] }]),
                labelled(json!({ "GPU": "x" })),
                false,
            ),
            (
                "affinity that does not match the node's labels",
                json!([{ "matchExpressions": [expr("foo", "In", &["bar"])] }]),
                labelled(json!({ "foo": "baz" })),
                false,
            ),
            (
                "multiple matchExpressions ANDed that match",
                json!([{ "matchExpressions": [
                    { "key": "GPU", "operator": "Exists" },
                    expr("GPU", "NotIn", &["AMD", "INTER"]),
                ] }]),
                labelled(json!({ "GPU": "NVIDIA-GRID-K1" })),
                true,
            ),
            (
                "multiple matchExpressions ANDed that do not match",
                json!([{ "matchExpressions": [
                    { "key": "GPU", "operator": "Exists" },
                    expr("GPU", "In", &["AMD", "INTER"]),
                ] }]),
                labelled(json!({ "GPU": "NVIDIA-GRID-K1" })),
                false,
            ),
            (
                "multiple terms ORed",
                json!([{ "matchExpressions": [expr("foo", "In", &["bar", "value2"])] },
                       { "matchExpressions": [expr("diffkey", "In", &["wrong", "value2"])] }]),
                labelled(json!({ "foo": "bar" })),
                true,
            ),
            (
                "matchFields In matches the node's name",
                json!([{ "matchFields": [expr("metadata.name", "In", &["node_1"])] }]),
                node("node_1", json!({})),
                true,
            ),
            (
                "matchFields In does not match another name",
                json!([{ "matchFields": [expr("metadata.name", "In", &["node_1"])] }]),
                node("node_2", json!({})),
                false,
            ),
            (
                "matchFields NotIn matches another name",
                json!([{ "matchFields": [expr("metadata.name", "NotIn", &["node_1"])] }]),
                node("node_2", json!({})),
                true,
            ),
            (
                "two terms: matchFields does not match, but matchExpressions matches",
                json!([{ "matchFields": [expr("metadata.name", "In", &["node_1"])] },
                       { "matchExpressions": [expr("foo", "In", &["bar"])] }]),
                node("node_2", json!({ "foo": "bar" })),
                true,
            ),
            (
                "one term: matchFields does not match, but matchExpressions matches",
                json!([{ "matchFields": [expr("metadata.name", "In", &["node_1"])],
                         "matchExpressions": [expr("foo", "In", &["bar"])] }]),
                node("node_2", json!({ "foo": "bar" })),
                false,
            ),
            (
                "one term: both matchFields and matchExpressions match",
                json!([{ "matchFields": [expr("metadata.name", "In", &["node_1"])],
                         "matchExpressions": [expr("foo", "In", &["bar"])] }]),
                node("node_1", json!({ "foo": "bar" })),
                true,
            ),
            (
                "two terms: both matchFields and matchExpressions do not match",
                json!([{ "matchFields": [expr("metadata.name", "In", &["node_1"])] },
                       { "matchExpressions": [expr("foo", "In", &["not-match-to-bar"])] }]),
                node("node_2", json!({ "foo": "bar" })),
                false,
            ),
            (
                "a field other than metadata.name reads empty",
                json!([{ "matchFields": [expr("spec.unschedulable", "NotIn", &["true"])] }]),
                node("node_1", json!({})),
                true,
            ),
        ];
        for (case, terms, node, want) in cases {
            assert_eq!(node_selector_admits(&selector(terms), &node), Ok(want), "{case}");
        }
    }

    /// Upstream's invalid cases: each bad requirement is named with its path, and the selector is
    /// refused even when another term would match.
    #[test]
    fn invalid_selectors_are_refused_naming_each_problem() {
        let machine = node("host_1", json!({ "label_1": "label_1_val" }));
        let invalid = selector(json!([
            { "matchFields": [expr("metadata.name", "In", &["host_1", "host_2"])] },
            { "matchExpressions": [expr("label_1", "In", &["label_1_val"])],
              "matchFields": [expr("metadata.name", "In", &["host_1"])] },
            { "matchExpressions": [expr("invalid key", "In", &["label_value"])] },
        ]));
        let err = node_selector_admits(&invalid, &machine).unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(err.problems[0].starts_with("nodeSelectorTerms[0].matchFields[0].values: "), "{err}");
        assert!(err.problems[1].starts_with("nodeSelectorTerms[2].matchExpressions[0].key: "), "{err}");
        for (requirement, problem) in [
            (json!({ "key": "foo", "operator": "Exists", "values": ["bar", "baz"] }), "takes no values"),
            (expr("foo", "Gt", &["one"]), "is not an integer"),
            (expr("foo", "Lt", &["1", "2"]), "exactly one value"),
            (expr("foo", "In", &[]), "at least one value"),
            (expr("baz", "invalid", &["5"]), "is not supported"),
            (expr("foo", "In", &["-bad"]), "is not a label value"),
            (expr("Example.com/foo", "In", &["a"]), "not a lowercase DNS subdomain"),
            (expr("a/b/c", "In", &["a"]), "at most one '/'"),
        ] {
            let bad = selector(json!([{ "matchExpressions": [requirement] }]));
            let err = node_selector_admits(&bad, &machine).unwrap_err().to_string();
            assert!(err.contains(problem), "{problem:?} not in {err}");
        }
        let bad_field =
            selector(json!([{ "matchFields": [{ "key": "metadata.name", "operator": "Exists" }] }]));
        assert!(node_selector_admits(&bad_field, &machine).unwrap_err().to_string().contains("for fields"));
        let prefixed =
            selector(json!([{ "matchExpressions": [expr("kubernetes.io/hostname", "In", &["host_1"])] }]));
        assert_eq!(node_selector_admits(&prefixed, &machine), Ok(false));
    }
}
