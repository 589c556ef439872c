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
    time::{Duration, SystemTime},
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
    /// RFC 3339; the Unix epoch for a spec that never started.
    #[serde(default)]
    start_time: String,
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

    /// The seconds of one `phase:` entry, 0 without it.
    fn phase(&self, name: &str) -> f64 {
        self.entries("phase:").iter().find(|(p, _)| *p == name).map_or(0.0, |(_, v)| *v)
    }

    /// When it started, if it did.
    fn started(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339_weak(&self.start_time).ok().filter(|t| *t > SystemTime::UNIX_EPOCH)
    }

    fn is_serial(&self) -> bool {
        self.leaf_node_text.contains("[Serial]")
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

    out.push_str(&serial_chain(report));

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

/// The serial specs one after another: how long each held the cluster (from its start to the
/// next serial spec's start, or for the last one to the first other spec's start), and the
/// most any passed one held it beyond its body, split into its set-up, its cleanups and the
/// rest (namespace, its pods going away, the next spec's start). Empty without serial specs.
fn serial_chain(report: &Report) -> String {
    let mut serial: Vec<(SystemTime, &Spec)> = report
        .spec_reports
        .iter()
        .filter(|s| s.is_serial())
        .filter_map(|s| Some((s.started()?, s)))
        .collect();
    if serial.is_empty() {
        return String::new();
    }
    serial.sort_by_key(|(at, _)| *at);
    let first_other = report.spec_reports.iter().filter(|s| !s.is_serial()).filter_map(Spec::started).min();
    let mut held = Vec::new();
    for (i, (at, spec)) in serial.iter().enumerate() {
        let next = match serial.get(i + 1) {
            Some((next, _)) => Some(*next),
            None => first_other.filter(|t| t > at),
        };
        let wall =
            next.map_or(secs(spec.run_time), |n| n.duration_since(*at).unwrap_or_default().as_secs_f64());
        held.push((wall, *spec));
    }
    let total: f64 = held.iter().map(|(w, _)| w).sum();
    let bodies: f64 = held.iter().map(|(_, s)| s.phase("body")).sum();
    let mut out = format!(
        "serial chain: {} specs held the cluster {total:.1}s (their bodies {bodies:.1}s)\n",
        held.len()
    );
    let most = held
        .iter()
        .filter(|(_, s)| s.state == "passed")
        .map(|(w, s)| (w - s.phase("body"), *w, *s))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((above, wall, s)) = most {
        let (setup, cleanup) = (s.phase("setup"), s.phase("cleanup"));
        let _ = writeln!(
            out,
            "  most above its body: {above:.1}s ({wall:.1}s held, body {:.1}s; set-up {setup:.1}s, cleanup {cleanup:.1}s, \
             the rest {:.1}s) {}",
            s.phase("body"),
            above - setup - cleanup,
            s.leaf_node_text
        );
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
            start_time: String::new(),
            run_time: secs * 1_000_000_000,
            report_entries: entries,
        }
    }

    fn started_at(mut spec: Spec, at: &str) -> Spec {
        spec.start_time = at.into();
        spec
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

    #[test]
    fn the_serial_chain_says_how_long_each_serial_spec_held_the_cluster() {
        let phases = |setup: f64, body: f64, cleanup: f64| {
            vec![entry("phase:setup", setup), entry("phase:body", body), entry("phase:cleanup", cleanup)]
        };
        let mut skipped = started_at(spec("c [Serial]", 2, phases(1.0, 0.5, 0.5)), "2026-12-06T10:00:18.5Z");
        skipped.state = "skipped".into();
        let report = Report {
            run_time: 60_000_000_000,
            spec_reports: vec![
                // Reported in registration order, not in the order they ran.
                started_at(spec("b [Serial]", 7, phases(2.0, 4.0, 1.0)), "2026-12-06T10:00:10Z"),
                started_at(spec("a [Serial]", 8, phases(1.5, 5.0, 1.5)), "2026-12-06T10:00:00.000000000Z"),
                skipped,
                started_at(spec("parallel", 3, phases(0.0, 3.0, 0.0)), "2026-12-06T10:00:21.5Z"),
                started_at(spec("never started [Serial]", 0, vec![]), "1970-01-01T00:00:00Z"),
            ],
        };
        let text = summary(&report);
        // a: 10 s, b: 8.5 s, c: until the parallel spec started, 3 s.
        assert!(
            text.contains("serial chain: 3 specs held the cluster 21.5s (their bodies 9.5s)\n"),
            "{text}"
        );
        // Passed specs only: a 5.0 s above its body, b 4.5 s, c (skipped) 2.5 s.
        assert!(
            text.contains(
                "  most above its body: 5.0s (10.0s held, body 5.0s; set-up 1.5s, cleanup 1.5s, the rest 2.0s) a [Serial]\n"
            ),
            "{text}"
        );
        assert!(
            !summary(&Report { run_time: 1, spec_reports: vec![spec("p", 1, vec![])] })
                .contains("serial chain")
        );
    }
}
