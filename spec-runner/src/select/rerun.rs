//! `--rerun-failed FILE`: the specs that failed in an earlier run's JSON report (failed, timed
//! out, interrupted, panicked, aborted: in any round of a `--repeat` run, after its last
//! `--flake-attempts` try), by their full texts, to run again and nothing else.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use crate::report::ginkgo_json::{self, ReadError, ReportFile};

/// The specs to run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rerun {
    /// The report they come from.
    pub source: PathBuf,
    /// Their full texts.
    pub failed: BTreeSet<String>,
    /// How many specs the report lists in all.
    pub listed: usize,
}

impl Rerun {
    /// Reads the report's failed specs.
    pub fn read(path: &Path) -> Result<Self, ReadError> {
        Ok(Self::of_report(&ginkgo_json::read(path)?))
    }

    /// The failed specs of `file`.
    pub fn of_report(file: &ReportFile) -> Self {
        let failed = file.specs.iter().filter(|s| s.is_failure()).map(|s| s.full_text.clone()).collect();
        let listed = file.specs.iter().map(|s| s.full_text.as_str()).collect::<BTreeSet<_>>().len();
        Self { source: file.path.clone(), failed, listed }
    }

    /// `--rerun-failed r.json: no spec failed in it (of 150); nothing to run.`, when none did.
    pub fn nothing_to_run(&self) -> Option<String> {
        self.failed.is_empty().then(|| {
            format!(
                "--rerun-failed {}: no spec failed in it (of the {} it lists); nothing to run.",
                self.source.display(),
                self.listed
            )
        })
    }

    /// The sentence for failed specs that are not in the registry (`known` says whether one is).
    pub fn unknown(&self, known: impl Fn(&str) -> bool, version: Option<&str>) -> Option<String> {
        let unknown: Vec<&String> = self.failed.iter().filter(|t| !known(t)).collect();
        if unknown.is_empty() {
            return None;
        }
        let texts = match version {
            Some(version) => format!("the specs of this suite with the texts of Kubernetes {version}"),
            None => "the specs of this suite".to_owned(),
        };
        Some(format!(
            "--rerun-failed {}: {} of its {} failed specs are not among {texts} ({}); rerun with the suite and --k8s-version of the run that wrote it",
            self.source.display(),
            unknown.len(),
            self.failed.len(),
            unknown.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"[{"SpecReports":[
        {"LeafNodeType":"It","LeafNodeText":"a","State":"passed","NumAttempts":2},
        {"LeafNodeType":"It","LeafNodeText":"b","State":"failed","NumAttempts":1},
        {"LeafNodeType":"It","LeafNodeText":"c","State":"timedout","NumAttempts":1},
        {"LeafNodeType":"It","LeafNodeText":"d","State":"interrupted","NumAttempts":1},
        {"LeafNodeType":"It","LeafNodeText":"e","State":"skipped","NumAttempts":0},
        {"LeafNodeType":"It","LeafNodeText":"f","State":"passed","NumAttempts":1},
        {"LeafNodeType":"It","LeafNodeText":"f","State":"panicked","NumAttempts":1},
        {"LeafNodeType":"AfterSuite","LeafNodeText":"","State":"failed","NumAttempts":1}
    ]}]"#;

    #[test]
    fn exactly_the_failed_specs_of_any_round() {
        let rerun = Rerun::of_report(&ginkgo_json::parse(Path::new("r.json"), REPORT).unwrap());
        assert_eq!(rerun.failed.iter().map(String::as_str).collect::<Vec<_>>(), ["b", "c", "d", "f"]);
        assert_eq!(rerun.listed, 6);
        assert_eq!(rerun.nothing_to_run(), None);
        assert_eq!(rerun.unknown(|_| true, None), None);
        assert_eq!(
            rerun.unknown(|t| t != "c" && t != "f", Some("v1.37.2")).as_deref(),
            Some(
                "--rerun-failed r.json: 2 of its 4 failed specs are not among the specs of this suite with the texts of Kubernetes v1.37.2 (\"c\", \"f\"); rerun with the suite and --k8s-version of the run that wrote it"
            )
        );
    }

    #[test]
    fn none_failed_says_so() {
        let text = r#"[{"SpecReports":[{"LeafNodeText":"a","State":"passed","NumAttempts":1}]}]"#;
        let rerun = Rerun::of_report(&ginkgo_json::parse(Path::new("ok.json"), text).unwrap());
        assert_eq!(
            rerun.nothing_to_run().as_deref(),
            Some("--rerun-failed ok.json: no spec failed in it (of the 1 it lists); nothing to run.")
        );
    }
}
