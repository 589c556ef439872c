//! The host skips of the lanes: the specs that skip on a lane's cluster, and why, as
//! docs/lanes.md's table "Host skips" documents them. A lane's step accepts a skipped spec only
//! when a row names the lane, matches the spec's full text and the skip's reason; any other skip
//! fails the step (a spec that skips where it should run tests nothing).

use anyhow::{Result, bail};
use regex::Regex;

use super::doc_table::{self, Row, Table};

/// Where the table is, from the repository's root.
pub(crate) const DOC: &str = "docs/lanes.md";

/// One row: on which lanes which specs skip, with which reason.
#[derive(Debug)]
pub(crate) struct HostSkip {
    /// The lanes (their report stems: `suites`, `kind`, …).
    pub lanes: Vec<String>,
    /// Searched in the spec's full text.
    pub spec: Regex,
    /// Searched in the skip's reason.
    pub reason: Regex,
}

impl Row for HostSkip {
    const DOC: &'static str = DOC;
    const HEADING: &'static str = "## Host skips";
    const COLUMNS: &'static [&'static str] = &["Lanes", "Spec", "Skip reason", "Why"];

    fn from_cells(cells: Vec<String>, doc: &str) -> Result<Self> {
        let lanes: Vec<String> = doc_table::list(&cells[0]).into_iter().map(String::from).collect();
        let row = format!("the host skip of {:?}", cells[1]);
        if lanes.is_empty() {
            bail!("{doc}: {row} names no lane");
        }
        let spec = doc_table::regex(&cells[1], "spec", &row, doc)?;
        let reason = doc_table::regex(&cells[2], "skip reason", &row, doc)?;
        Ok(Self { lanes, spec, reason })
    }
}

/// Every documented host skip.
pub(crate) type HostSkips = Table<HostSkip>;

impl Table<HostSkip> {
    /// Whether a row documents that `spec` skips on `lane` saying `reason`.
    pub(crate) fn documents(&self, lane: &str, spec: &str, reason: &str) -> bool {
        self.rows.iter().any(|row| {
            row.lanes.iter().any(|l| l == lane) && row.spec.is_match(spec) && row.reason.is_match(reason)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    const DOC: &str = "## Host skips\n\n| Lanes | Spec | Skip reason | Why |\n|---|---|---|---|\n\
        | `kind` | `GenericWorkload` | `feature gate \\w+ off` | the gates are off there |\n\
        | `suites`, `next-release` | `direct mapping` | `oom_score_adj` | root lacks CAP_SYS_RESOURCE |\n";

    #[test]
    fn a_skip_is_documented_only_for_its_lanes_spec_and_reason() {
        let skips = HostSkips::parse(DOC, "lanes.md".into()).unwrap();
        assert!(skips.documents(
            "kind",
            "[sig-node] GenericWorkload x",
            "the API server runs with feature gate GenericWorkload off"
        ));
        assert!(!skips.documents(
            "suites",
            "[sig-node] GenericWorkload x",
            "feature gate GenericWorkload off"
        ));
        assert!(!skips.documents("kind", "[sig-node] other", "feature gate GenericWorkload off"));
        assert!(!skips.documents("kind", "[sig-node] GenericWorkload x", "not run: the run was interrupted"));
        assert!(skips.documents(
            "next-release",
            "Guaranteed QoS pod with direct mapping",
            "oom_score_adj -997"
        ));
    }

    #[test]
    fn a_row_without_lanes_or_with_a_bad_pattern_is_refused() {
        let no_lane = DOC.replace("| `kind` |", "|  |");
        let err = format!("{:#}", HostSkips::parse(&no_lane, "lanes.md".into()).unwrap_err());
        assert!(err.contains("names no lane"), "{err}");
        let bad = DOC.replace("`oom_score_adj`", "`oom(`");
        let err = format!("{:#}", HostSkips::parse(&bad, "lanes.md".into()).unwrap_err());
        assert!(err.contains("the skip reason of the host skip of \"direct mapping\""), "{err}");
    }
}
