//! Which specs run: `--focus`, `--skip` and `--label-filter`, as ginkgo has them; the full
//! texts of `--rerun-failed`; and of those, the share of `--partition`.

use std::collections::BTreeSet;

use regex::RegexSet;

use crate::{
    report::ginkgo_json::ReadError,
    select::label_filter::{LabelFilter, LabelFilterError, regex_reason},
    select::partition::{Partition, PartitionError, elsewhere_reason},
    spec::info::SpecInfo,
};

/// The selection of specs to run.
///
/// A spec is selected if its full text matches any `--focus` regex (or there is
/// none), matches no `--skip` regex, its labels satisfy the label filter, and it is one of the
/// names given ([`with_names`](Self::with_names)), if any. With a
/// [`Partition`], the run runs its shard of the selected specs ([`split`](Self::split)).
#[derive(Debug, Clone)]
pub struct Selection {
    focus: Option<RegexSet>,
    skip: Option<RegexSet>,
    labels: LabelFilter,
    names: Option<BTreeSet<String>>,
    partition: Option<Partition>,
}

/// A `--focus`, `--skip`, `--label-filter`, `--partition`, `--timings` or `--rerun-failed`
/// argument cannot be used.
#[derive(Debug, thiserror::Error)]
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
    /// `--partition` (with `--timings`).
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// The report of `--timings` or `--rerun-failed`.
    #[error("{flag}: {source}")]
    Report {
        /// The flag.
        flag: &'static str,
        /// Why its report cannot be used.
        source: ReadError,
    },
}

impl Default for Selection {
    fn default() -> Self {
        Self { focus: None, skip: None, labels: LabelFilter::match_all(), names: None, partition: None }
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
            names: None,
            partition: None,
        })
    }

    /// Only the specs with these full texts (`--rerun-failed`), of those the rest selects.
    pub fn with_names(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.names = Some(names.into_iter().collect());
        self
    }

    /// The run runs `partition`'s shard of the selected specs.
    pub fn with_partition(mut self, partition: Partition) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The partition, if the run has one.
    pub fn partition(&self) -> Option<&Partition> {
        self.partition.as_ref()
    }

    /// Whether the spec is selected (before the partition).
    pub fn matches(&self, spec: &SpecInfo) -> bool {
        self.matches_text(spec.full_text(), spec.labels())
    }

    /// Whether a spec with this full text and labels is selected (before the partition).
    pub fn matches_text<S: AsRef<str>>(&self, full_text: &str, labels: &[S]) -> bool {
        self.focus.as_ref().is_none_or(|f| f.is_match(full_text))
            && !self.skip.as_ref().is_some_and(|s| s.is_match(full_text))
            && self.labels.matches(labels)
            && self.names.as_ref().is_none_or(|names| names.contains(full_text))
    }

    /// Of `selected` (the selected specs, in registration order), the ones this run's shard
    /// runs, and the others with why they are skipped (`in shard K of N`); without a partition
    /// all of them run.
    pub fn split<T>(&self, selected: Vec<T>, info: impl Fn(&T) -> &SpecInfo) -> (Vec<T>, Vec<(T, String)>) {
        let Some(partition) = &self.partition else { return (selected, Vec::new()) };
        let shards = partition.assign(&selected.iter().map(&info).collect::<Vec<_>>());
        let (mine, total) = (partition.shard().index, partition.shard().total);
        let (mut here, mut elsewhere) = (Vec::new(), Vec::new());
        for (spec, shard) in selected.into_iter().zip(shards) {
            if shard == mine {
                here.push(spec);
            } else {
                elsewhere.push((spec, elsewhere_reason(shard, total)));
            }
        }
        (here, elsewhere)
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
