//! Which specs run: `--focus`, `--skip` and `--label-filter`, as ginkgo has them.

use regex::RegexSet;

use crate::{
    select::label_filter::{LabelFilter, LabelFilterError, regex_reason},
    spec::info::SpecInfo,
};

/// The selection of specs to run.
///
/// A spec runs if its full text matches any `--focus` regex (or there is
/// none), matches no `--skip` regex, and its labels satisfy the label filter.
#[derive(Debug, Clone)]
pub struct Selection {
    focus: Option<RegexSet>,
    skip: Option<RegexSet>,
    labels: LabelFilter,
}

/// A `--focus`, `--skip` or `--label-filter` argument does not parse.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SelectionError {
    /// A regex of `--focus` or `--skip`.
    #[error("invalid --{flag} regex {regex:?}: {reason}")]
    Regex {
        /// `focus` or `skip`.
        flag: &'static str,
        /// The regex as given.
        regex: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The label filter expression.
    #[error("invalid --label-filter: {0}")]
    LabelFilter(#[from] LabelFilterError),
}

impl Default for Selection {
    fn default() -> Self {
        Self { focus: None, skip: None, labels: LabelFilter::match_all() }
    }
}

impl Selection {
    /// Everything.
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses the flags; the error names the flag and the offending value.
    pub fn new(
        focus: &[String],
        skip: &[String],
        label_filter: Option<&str>,
    ) -> Result<Self, SelectionError> {
        Ok(Self {
            focus: regex_set("focus", focus)?,
            skip: regex_set("skip", skip)?,
            labels: LabelFilter::parse(label_filter.unwrap_or(""))?,
        })
    }

    /// Whether the spec is selected.
    pub fn matches(&self, spec: &SpecInfo) -> bool {
        self.matches_text(spec.full_text(), spec.labels())
    }

    /// Whether a spec with this full text and labels is selected.
    pub fn matches_text<S: AsRef<str>>(&self, full_text: &str, labels: &[S]) -> bool {
        self.focus.as_ref().is_none_or(|f| f.is_match(full_text))
            && !self.skip.as_ref().is_some_and(|s| s.is_match(full_text))
            && self.labels.matches(labels)
    }
}

fn regex_set(flag: &'static str, regexes: &[String]) -> Result<Option<RegexSet>, SelectionError> {
    if regexes.is_empty() {
        return Ok(None);
    }
    for r in regexes {
        if let Err(e) = regex::Regex::new(r) {
            return Err(SelectionError::Regex { flag, regex: r.clone(), reason: regex_reason(&e) });
        }
    }
    RegexSet::new(regexes).map(Some).map_err(|e| SelectionError::Regex {
        flag,
        regex: regexes.join(" | "),
        reason: regex_reason(&e),
    })
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const CP: &str =
        "[sig-node] [DRA] control plane supports claim and class parameters [ConformanceCandidate]";
    const KUBELET: &str =
        "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] must retry NodePrepareResources";
    const SLOW: &str =
        "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] sequential update [Slow]";

    fn sel(focus: &[&str], skip: &[&str], labels: Option<&str>) -> Selection {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Selection::new(&owned(focus), &owned(skip), labels).unwrap()
    }

    #[rstest]
    #[case(&[], &[], [true, true, true])]
    #[case(&["DRA"], &[], [true, true, true])]
    #[case(&["control plane"], &[], [true, false, false])]
    #[case(&["control plane", "NodePrepare"], &[], [true, true, false])]
    #[case(&[], &["Slow"], [true, true, false])]
    #[case(&[], &["Slow", "control"], [false, true, false])]
    #[case(&["kubelet"], &["Slow"], [false, true, false])]
    // focus and skip are regexes, not substrings: `[Slow]` is a character class
    #[case(&[r"\[Slow\]"], &[], [false, false, true])]
    #[case(&["^\\[sig-node\\] \\[DRA\\] control"], &[], [true, false, false])]
    // skip wins over focus
    #[case(&["DRA"], &["DRA"], [false, false, false])]
    fn focus_and_skip(#[case] focus: &[&str], #[case] skip: &[&str], #[case] expected: [bool; 3]) {
        let s = sel(focus, skip, None);
        let got = [CP, KUBELET, SLOW].map(|t| s.matches_text(t, &[] as &[&str]));
        assert_eq!(got, expected);
    }

    #[test]
    fn label_filter_combines_with_focus() {
        let s = sel(&["kubelet"], &[], Some("!Slow"));
        assert!(s.matches_text(KUBELET, &["DRA"]));
        assert!(!s.matches_text(SLOW, &["DRA", "Slow"]));
        assert!(!s.matches_text(CP, &["DRA"]));
    }

    #[rstest]
    #[case(&["a["], &[], "invalid --focus regex \"a[\": unclosed character class")]
    #[case(&["ok"], &["(x"], "invalid --skip regex \"(x\": unclosed group")]
    fn invalid_regexes_name_the_flag(#[case] focus: &[&str], #[case] skip: &[&str], #[case] message: &str) {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let err = Selection::new(&owned(focus), &owned(skip), None).unwrap_err();
        assert_eq!(err.to_string(), message);
    }

    #[test]
    fn invalid_label_filter_is_one_line() {
        let err = Selection::new(&[], &[], Some("DRA &&")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid --label-filter: operator '&&' is missing its right-hand operand (at column 5 of \"DRA &&\")"
        );
    }
}
