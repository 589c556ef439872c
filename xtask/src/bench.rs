//! `cargo xtask bench suites [--kubeconfig PATH] [dra-e2e flags: --focus, --skip, -p, ...]`: runs
//! a selection of the suites like `cargo xtask e2e` (with `--json-report`), reads the report and
//! prints where the time went: the wall time, the phase sums (`phase:*` report entries), the
//! slowest specs with what they waited for longest (`wait:*` entries, the waits progress reports
//! name) and the driver set-up time's p50 and p99 (`phase:setup`). It measures; nothing in it
//! asserts a duration.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::{e2e, usage::UsageError};

/// How many of the slowest specs the summary lists.
const SLOWEST: usize = 10;
/// How many waits it lists per slow spec.
const WAITS_PER_SPEC: usize = 3;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Report {
    run_time: u64,
    spec_reports: Vec<Spec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Spec {
    leaf_node_text: String,
    state: String,
    run_time: u64,
    #[serde(default)]
    report_entries: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    name: String,
    value: EntryValue,
}

#[derive(Deserialize)]
struct EntryValue {
    #[serde(rename = "AsJSON")]
    as_json: String,
}

impl Spec {
    /// Seconds of the entries whose names start with `prefix`, by the rest of the name.
    fn entries(&self, prefix: &str) -> Vec<(&str, f64)> {
        self.report_entries
            .iter()
            .filter_map(|e| Some((e.name.strip_prefix(prefix)?, e.value.as_json.parse().ok()?)))
            .collect()
    }
}

/// What `cargo xtask bench suites` runs (its command line, checked by clap in `cli::runner`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SuitesOptions {
    /// The cluster (`--kubeconfig`; else `KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
    /// `dra-e2e`'s flags as given, without `--kubeconfig` and without `--json-report` (the bench
    /// adds its own).
    pub runner_args: Vec<String>,
}

/// `cargo xtask bench suites ...`: runs the selection, prints the summary, exits with dra-e2e's
/// exit code.
pub async fn run(options: SuitesOptions) -> Result<ExitCode> {
    let Some(kubeconfig) = options.kubeconfig.or_else(|| std::env::var_os("KUBECONFIG").map(Into::into))
    else {
        let message =
            "cargo xtask bench suites needs a running cluster: pass --kubeconfig PATH (or set KUBECONFIG)";
        return Err(UsageError::new(message).into());
    };
    let repo = crate::repo::repo_root();
    let runner = e2e::build_runner(&repo, e2e::Build::Binary)?;
    let dir = tempfile::tempdir().context("create a folder for the report")?;
    let report_path = dir.path().join("bench.json");
    let mut runner_args = options.runner_args;
    runner_args.extend(["--json-report".to_owned(), report_path.display().to_string()]);
    let code = e2e::run_runner(&runner, &kubeconfig, &runner_args).await?;
    let report = read(&report_path)?;
    print!("{}", summary(&report));
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn read(path: &Path) -> Result<Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read the run's report {}", path.display()))?;
    let mut reports: Vec<Report> =
        serde_json::from_str(&text).with_context(|| format!("parse the run's report {}", path.display()))?;
    reports.pop().context("the run's report holds no suite")
}

fn secs(ns: u64) -> f64 {
    Duration::from_nanos(ns).as_secs_f64()
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

/// What the bench prints after the run.
fn summary(report: &Report) -> String {
    let mut out = String::from("\n== bench suites ==\n");
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &report.spec_reports {
        *states.entry(s.state.as_str()).or_default() += 1;
    }
    let states: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let _ = writeln!(
        out,
        "wall time {:.1}s; {} spec runs: {}",
        secs(report.run_time),
        report.spec_reports.len(),
        states.join(", ")
    );

    let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &report.spec_reports {
        for (phase, v) in s.entries("phase:") {
            *sums.entry(phase).or_default() += v;
        }
    }
    let order = ["queued", "setup", "body", "cleanup", "deferred"];
    let phases: Vec<String> =
        order.iter().filter_map(|p| sums.get(p).map(|v| format!("{p} {v:.1}s"))).collect();
    let _ = writeln!(
        out,
        "phase sums: {}",
        if phases.is_empty() { "none".to_owned() } else { phases.join(", ") }
    );

    // Waiting to start: a serial spec for the specs before it to settle and for every slot (the
    // price of running it on a quiet cluster), another spec for a free slot.
    let queued = |serial: bool| -> (f64, usize) {
        let waits: Vec<f64> = report
            .spec_reports
            .iter()
            .filter(|s| s.leaf_node_text.contains("[Serial]") == serial)
            .flat_map(|s| s.entries("phase:queued"))
            .map(|(_, v)| v)
            .collect();
        (waits.iter().sum(), waits.len())
    };
    let ((serial, serial_n), (others, others_n)) = (queued(true), queued(false));
    let _ = writeln!(
        out,
        "queued: {serial:.1}s by {serial_n} serial specs (the specs before them settling, every slot free), \
         {others:.1}s by {others_n} others (a free slot)"
    );

    let mut setups: Vec<f64> =
        report.spec_reports.iter().flat_map(|s| s.entries("phase:setup")).map(|(_, v)| v).collect();
    setups.sort_by(f64::total_cmp);
    match (quantile(&setups, 0.5), quantile(&setups, 0.99)) {
        (Some(p50), Some(p99)) => {
            let _ = writeln!(out, "driver set-up over {} specs: p50 {p50:.1}s, p99 {p99:.1}s", setups.len());
        }
        _ => out.push_str("driver set-up: no spec deployed a driver\n"),
    }

    let mut skipped: Vec<f64> =
        report.spec_reports.iter().filter(|s| s.state == "skipped").map(|s| secs(s.run_time)).collect();
    skipped.sort_by(f64::total_cmp);
    if let (Some(p50), Some(max)) = (quantile(&skipped, 0.5), skipped.last()) {
        let _ = writeln!(out, "skipped specs: {}, p50 {p50:.3}s, longest {max:.3}s", skipped.len());
    }

    let mut slow: Vec<&Spec> = report.spec_reports.iter().collect();
    slow.sort_by_key(|s| std::cmp::Reverse(s.run_time));
    let _ = writeln!(out, "slowest {}:", SLOWEST.min(slow.len()));
    for s in slow.iter().take(SLOWEST) {
        let phases: Vec<String> = s.entries("phase:").iter().map(|(p, v)| format!("{p} {v:.1}s")).collect();
        let _ = writeln!(
            out,
            "  {:>7.1}s {} {} [{}]",
            secs(s.run_time),
            s.state,
            s.leaf_node_text,
            phases.join(", ")
        );
        let mut waits = s.entries("wait:");
        waits.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (what, v) in waits.iter().take(WAITS_PER_SPEC) {
            let _ = writeln!(out, "           waited {v:.1}s for {what}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, v: f64) -> Entry {
        Entry { name: name.into(), value: EntryValue { as_json: format!("{v}") } }
    }

    fn spec(text: &str, secs: u64, entries: Vec<Entry>) -> Spec {
        Spec {
            leaf_node_text: text.into(),
            state: "passed".into(),
            run_time: secs * 1_000_000_000,
            report_entries: entries,
        }
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((quantile(&v, 0.5), quantile(&v, 0.99)), (Some(50.0), Some(99.0)));
        assert_eq!(quantile(&[3.0], 0.99), Some(3.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_summary_sums_phases_and_names_the_longest_waits() {
        let report = Report {
            run_time: 60_000_000_000,
            spec_reports: vec![
                spec("fast", 2, vec![entry("phase:body", 2.0)]),
                spec(
                    "slow",
                    40,
                    vec![
                        entry("phase:setup", 10.0),
                        entry("phase:body", 25.0),
                        entry("phase:cleanup", 5.0),
                        entry("wait:pod tester-1 to run", 20.0),
                        entry("wait:the plugins to register", 9.0),
                    ],
                ),
            ],
        };
        let text = summary(&report);
        assert!(text.contains("wall time 60.0s; 2 spec runs: 2 passed\n"), "{text}");
        assert!(!text.contains("skipped specs"), "{text}");
        assert!(text.contains("phase sums: setup 10.0s, body 27.0s, cleanup 5.0s\n"), "{text}");
        assert!(text.contains("driver set-up over 1 specs: p50 10.0s, p99 10.0s\n"), "{text}");
        let slow = text.find("40.0s passed slow").unwrap();
        assert!(slow < text.find("2.0s passed fast").unwrap(), "{text}");
        assert!(text.contains("waited 20.0s for pod tester-1 to run\n"), "{text}");
    }

    #[test]
    fn the_wait_to_start_is_split_between_serial_specs_and_the_others() {
        let report = Report {
            run_time: 100_000_000_000,
            spec_reports: vec![
                spec("one [Serial]", 10, vec![entry("phase:queued", 0.5), entry("phase:body", 9.0)]),
                spec("two [Serial]", 10, vec![entry("phase:queued", 5.25), entry("phase:body", 9.0)]),
                spec("parallel", 3, vec![entry("phase:queued", 2.0), entry("phase:body", 3.0)]),
            ],
        };
        let text = summary(&report);
        assert!(text.contains("phase sums: queued 7.8s, body 21.0s\n"), "{text}");
        assert!(
            text.contains("queued: 5.8s by 2 serial specs (the specs before them settling, every slot free), 2.0s by 1 others (a free slot)\n"),
            "{text}"
        );
    }

    #[test]
    fn skipped_specs_are_summed_apart() {
        let mut quick = spec("needs two nodes", 0, vec![]);
        quick.state = "skipped".into();
        quick.run_time = 12_000_000;
        let mut slow = spec("needs a gate", 0, vec![]);
        slow.state = "skipped".into();
        slow.run_time = 5_100_000_000;
        let report =
            Report { run_time: 6_000_000_000, spec_reports: vec![quick, slow, spec("runs", 1, vec![])] };
        let text = summary(&report);
        assert!(text.contains("3 spec runs: 1 passed, 2 skipped\n"), "{text}");
        assert!(text.contains("skipped specs: 2, p50 0.012s, longest 5.100s\n"), "{text}");
    }
}
