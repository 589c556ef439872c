//! Progress output: one line per finished spec, the failure with its
//! captured log, and the closing summary.

use std::{
    fmt::Write as _,
    io::Write,
    sync::{Arc, Mutex, PoisonError},
};

use crate::{
    cluster::preflight::ClusterInfo,
    report::outcome::{Outcome, RunReport, SpecReport},
    select::partition::elsewhere_shard,
};

/// Where progress lines go (stdout by default; tests capture them).
#[derive(Clone)]
pub struct Output(Arc<Mutex<Box<dyn Write + Send>>>);

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Output")
    }
}

impl Default for Output {
    fn default() -> Self {
        Self::stdout()
    }
}

/// What an [`Output::capture`] collected.
#[derive(Clone, Default, Debug)]
pub struct OutputBuffer(Arc<Mutex<Vec<u8>>>);

impl OutputBuffer {
    /// Everything written so far.
    pub fn contents(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for OutputBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Output {
    /// Standard output.
    pub fn stdout() -> Self {
        Self::new(std::io::stdout())
    }

    /// Any writer.
    pub fn new(writer: impl Write + Send + 'static) -> Self {
        Self(Arc::new(Mutex::new(Box::new(writer))))
    }

    /// An output that keeps everything in memory.
    pub fn capture() -> (Self, OutputBuffer) {
        let buffer = OutputBuffer::default();
        (Self::new(buffer.clone()), buffer)
    }

    /// Writes a block at once, so blocks of parallel specs never interleave.
    pub(crate) fn block(&self, text: &str) {
        let mut w = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Progress output is best effort: a closed stdout must not stop the run.
        let _ = w.write_all(text.as_bytes());
        let _ = w.flush();
    }
}

/// How much a run prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Verbosity {
    /// `--succinct`: one character per spec that passed (`•`) or was skipped (`S`), as ginkgo's
    /// succinct mode; failures and flaky passes in full.
    Succinct,
    /// A line per spec, failures with their captured log.
    #[default]
    Normal,
    /// `-v`: also each spec's start, phases and steps as they happen.
    Verbose,
}

/// ` (+ 5.10s deferred checks)`: how long the spec's settling deferred checks ran after its slot
/// was released (the longest, as they run at the same time), and `, 29.80s observed` when an
/// observation (which no later spec waits for) ran longer; empty without any, or when they
/// took less than would show (`0.00s`).
fn deferred_suffix(report: &SpecReport) -> String {
    let longest = |settles: bool| {
        report.deferred.iter().filter(|c| c.settles == settles).map(|c| c.duration).max().unwrap_or_default()
    };
    let (settling, observed) = (longest(true), longest(false));
    let shows = |d: std::time::Duration| d >= std::time::Duration::from_millis(5);
    match (shows(settling), shows(observed) && observed > settling) {
        (_, true) => format!(
            " (+ {:.2}s deferred checks, {:.2}s observed)",
            settling.as_secs_f64(),
            observed.as_secs_f64()
        ),
        (true, false) => format!(" (+ {:.2}s deferred checks)", settling.as_secs_f64()),
        (false, false) => String::new(),
    }
}

fn attempt_suffix(report: &SpecReport, repeat: u32) -> String {
    if repeat > 1 { format!(" (attempt {}/{repeat})", report.attempt) } else { String::new() }
}

/// The block for one finished spec.
pub(crate) fn spec_block(
    report: &SpecReport,
    repeat: u32,
    flake_attempts: u32,
    verbosity: Verbosity,
) -> String {
    if verbosity == Verbosity::Succinct {
        match &report.outcome {
            Outcome::Passed if report.tries <= 1 => return "•".to_owned(),
            Outcome::Skipped { .. } => return "S".to_owned(),
            // In full, on a line of its own.
            Outcome::Passed | Outcome::Failed { .. } => {
                return format!("\n{}", spec_block(report, repeat, flake_attempts, Verbosity::Normal));
            }
        }
    }
    let mut block = outcome_block(report, repeat, flake_attempts);
    if verbosity == Verbosity::Verbose && !report.phases.is_empty() {
        let _ = writeln!(block, "  phases: {}", report.phases.line());
    }
    block
}

/// The outcome line of a finished spec, with a failure's details and log.
fn outcome_block(report: &SpecReport, repeat: u32, flake_attempts: u32) -> String {
    let secs = report.duration.as_secs_f64();
    let text = format!("{}{}{}", report.full_text, attempt_suffix(report, repeat), deferred_suffix(report));
    match &report.outcome {
        // ginkgo's words for a spec that passed on a retry.
        Outcome::Passed if report.tries > 1 => {
            format!("PASS [{secs:>8.2}s] {text} [FLAKEY TEST - TOOK {} ATTEMPTS TO PASS]\n", report.tries)
        }
        Outcome::Passed => format!("PASS [{secs:>8.2}s] {text}\n"),
        Outcome::Skipped { reason } => format!("SKIP [{secs:>8.2}s] {text} -- {reason}\n"),
        Outcome::Failed { kind, details, .. } => {
            let retrying = if report.tries < flake_attempts {
                format!(" (try {} of {flake_attempts}, retrying)", report.tries)
            } else {
                String::new()
            };
            let mut out = format!("FAIL [{secs:>8.2}s] {text}{retrying}\n");
            let _ = writeln!(out, "  {} failure:", kind.as_str());
            for line in details.lines() {
                let _ = writeln!(out, "    {line}");
            }
            if let Some(dir) = &report.artifacts {
                let _ = writeln!(out, "  artifacts: {}", dir.display());
            }
            if report.log.is_empty() {
                out.push_str("  (nothing captured in the spec's log)\n");
            } else {
                out.push_str("  ---- captured log ----\n");
                for line in report.log.lines() {
                    let _ = writeln!(out, "  {line}");
                }
                out.push_str("  ---- end of captured log ----\n");
            }
            out
        }
    }
}

/// The closing lines: failed specs, interruption, and `N passed, N failed, N skipped in T`.
pub(crate) fn summary(report: &RunReport, not_run: usize) -> String {
    let mut out = String::new();
    let failed: Vec<_> = report.specs.iter().filter(|s| s.outcome.is_failed()).collect();
    if !failed.is_empty() {
        let _ = writeln!(
            out,
            "\nSummarizing {} failure{}:",
            failed.len(),
            if failed.len() == 1 { "" } else { "s" }
        );
        for s in failed {
            if let Outcome::Failed { kind, message, .. } = &s.outcome {
                let _ = writeln!(
                    out,
                    "  FAIL {}{} [{}]: {message}",
                    s.full_text,
                    attempt_suffix(s, report.repeat),
                    kind.as_str()
                );
            }
        }
    }
    let flaky: Vec<_> = report.specs.iter().filter(|s| s.is_flaky()).collect();
    if !flaky.is_empty() {
        let _ = writeln!(out, "\n{} flaky (passed on a retry):", flaky.len());
        for s in flaky {
            let _ = writeln!(
                out,
                "  FLAKY {}{} ({} attempts)",
                s.full_text,
                attempt_suffix(s, report.repeat),
                s.tries
            );
            for failure in &s.earlier_failures {
                let _ = writeln!(out, "    {failure}");
            }
        }
    }
    if report.interrupted {
        let _ = writeln!(out, "\nInterrupted: {not_run} spec run(s) did not start.");
    } else if not_run > 0 {
        let _ = writeln!(out, "\n--fail-fast: {not_run} spec run(s) did not start after a failure.");
    }
    out.push_str(&crate::report::rounds::table(report));
    let elsewhere = report
        .specs
        .iter()
        .filter(|s| matches!(&s.outcome, Outcome::Skipped { reason } if elsewhere_shard(reason).is_some()))
        .count();
    if elsewhere > 0 {
        let _ = writeln!(out, "{elsewhere} of the skipped spec runs are other shards' (--partition).");
    }
    let phases = report.phase_sums();
    if !phases.is_empty() {
        let _ = writeln!(out, "Phases (summed over the spec runs): {}", phases.line());
    }
    let _ = writeln!(out, "{}", report.summary_line());
    out
}
/// How a run was started, for its first lines.
pub(crate) struct RunHeader<'a> {
    pub(crate) selected: usize,
    pub(crate) total: usize,
    pub(crate) procs: usize,
    pub(crate) procs_is_default: bool,
    pub(crate) repeat: u32,
    pub(crate) randomize_all: bool,
    pub(crate) seed: u64,
    pub(crate) cluster: &'a ClusterInfo,
    /// The partition described, and how many selected specs are other shards'.
    pub(crate) shard: Option<(String, usize)>,
}

/// The first lines of a run: the seed, what runs against which cluster.
pub(crate) fn header(h: &RunHeader<'_>) -> String {
    let ready = h.cluster.ready_nodes().count();
    let mut line = format!("Random Seed: {}", h.seed);
    if h.randomize_all {
        line.push_str(" - will randomize all specs");
    }
    line.push_str(&format!("\nRunning {} of {} specs", h.selected, h.total));
    if h.repeat > 1 {
        line.push_str(&format!(" {} times", h.repeat));
    }
    let default = if h.procs_is_default { " (the default -p; -p 1 runs one at a time)" } else { "" };
    line.push_str(&format!(
        ", {} in parallel{default}, against {} ({}, {ready} ready node{})\n",
        h.procs,
        h.cluster.server,
        h.cluster.server_version,
        if ready == 1 { "" } else { "s" }
    ));
    if let Some((partition, elsewhere)) = &h.shard {
        line.push_str(&format!(
            "This run is {partition}; the {elsewhere} selected specs of the other shards are reported as skipped.\n"
        ));
    }
    if h.selected == 0 && h.shard.is_some() {
        line.push_str("No selected spec is in this shard.\n");
    } else if h.selected == 0 {
        line.push_str("No spec matches the selection (--focus, --skip, --label-filter).\n");
    }
    line
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::report::outcome::{CheckReport, Outcome};

    fn with_checks(checks: &[(f64, bool)]) -> SpecReport {
        SpecReport {
            full_text: "s".into(),
            labels: vec![],
            index: 0,
            attempt: 1,
            outcome: Outcome::Passed,
            started: std::time::SystemTime::UNIX_EPOCH,
            duration: Duration::from_secs(1),
            log: String::new(),
            artifacts: None,
            tries: 1,
            earlier_failures: vec![],
            phases: Default::default(),
            waits: Vec::new(),
            deferred: checks
                .iter()
                .map(|&(secs, settles)| CheckReport {
                    what: "x".into(),
                    duration: Duration::from_secs_f64(secs),
                    error: None,
                    settles,
                })
                .collect(),
        }
    }

    #[test]
    fn observations_show_apart_from_the_checks_a_serial_spec_waits_for() {
        assert_eq!(deferred_suffix(&with_checks(&[])), "");
        assert_eq!(deferred_suffix(&with_checks(&[(5.1, true), (2.0, false)])), " (+ 5.10s deferred checks)");
        assert_eq!(
            deferred_suffix(&with_checks(&[(5.1, true), (29.8, false)])),
            " (+ 5.10s deferred checks, 29.80s observed)"
        );
    }
}
