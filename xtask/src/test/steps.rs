//! The steps of `cargo xtask test` as they end, and how the run ends: each step's outcome and
//! cost goes into the closing table ([`super::table`]). Ctrl-C (SIGINT) reaches the step that
//! is running (same process group; a dra-e2e, in a group of its own, from xtask, which passes it
//! on: [`crate::e2e::run_runner`]), which ends; that step is marked interrupted whatever it
//! returned, every step after it that was skipped is listed as not run (the clusters still go
//! down), and the run exits 130. The disk falling below its floor stops the run the same way,
//! but is a failed step of its own, not an interrupt.

use std::{
    future::Future,
    process::ExitCode,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::Result;

use super::{
    budget::StepStart,
    clip,
    disk::DiskWatch,
    table::{self, Outcome, StepResult},
};

/// The exit code of an interrupted run (128 + SIGINT), as dra-e2e's.
pub(crate) const INTERRUPTED: u8 = 130;

/// Why no further step starts: Ctrl-C, or the disk below its floor.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stop {
    /// Set by either.
    pub any: Arc<AtomicBool>,
    /// When Ctrl-C came.
    signalled: Arc<OnceLock<Instant>>,
}

impl Stop {
    /// A stop set by SIGINT, from now on for as long as the process runs.
    pub(crate) fn on_ctrl_c() -> Self {
        let stop = Self::default();
        let (any, signalled) = (stop.any.clone(), stop.signalled.clone());
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
            Ok(mut sigint) => {
                tokio::spawn(async move {
                    if sigint.recv().await.is_some() {
                        eprintln!(
                            "==> interrupted: finishing the running step, then taking the clusters down"
                        );
                        let _ = signalled.set(Instant::now());
                        any.store(true, Ordering::SeqCst);
                    }
                });
            }
            Err(e) => eprintln!("warning: cannot listen for Ctrl-C ({e}); it will kill the run"),
        }
        stop
    }

    /// Whether steps may still start.
    pub(crate) fn go_on(&self) -> bool {
        !self.any.load(Ordering::SeqCst)
    }

    /// When Ctrl-C came, if it did.
    fn signalled(&self) -> Option<Instant> {
        self.signalled.get().copied()
    }
}

/// Something a step that passed may tell the table (what it counted).
pub(crate) trait Note {
    /// The note, if any.
    fn note(self) -> Option<String>;
}

impl Note for () {
    fn note(self) -> Option<String> {
        None
    }
}

impl Note for String {
    fn note(self) -> Option<String> {
        Some(self)
    }
}

/// The steps that ended, in order.
pub(crate) struct Steps {
    outcomes: Vec<Outcome>,
    stop: Stop,
    disk: Option<DiskWatch>,
}

impl Steps {
    /// No step yet; `disk` samples the free space during each.
    pub(crate) fn new(stop: Stop, disk: Option<DiskWatch>) -> Self {
        Self { outcomes: Vec::new(), stop, disk }
    }

    /// Whether steps may still start.
    pub(crate) fn go_on(&self) -> bool {
        self.stop.go_on()
    }

    /// How many steps failed so far (an interrupted one with its failure included).
    pub(crate) fn failed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o.result, StepResult::Failed(_) | StepResult::Interrupted(Some(_))))
            .count()
    }

    /// Records a step that ran from `started` until now: one that Ctrl-C came during is
    /// interrupted, whatever it returned.
    pub(crate) fn record<N: Note>(&mut self, name: &str, result: Result<N>, started: StepStart) {
        if let Err(e) = &result {
            eprintln!("==> step failed: {name}: {e:#}");
        }
        let result = if self.stop.signalled().is_some_and(|at| at >= started.at()) {
            StepResult::Interrupted(result.err())
        } else {
            match result {
                Ok(note) => StepResult::Passed(note.note()),
                Err(e) => StepResult::Failed(e),
            }
        };
        let lowest_free = self.disk.as_ref().and_then(DiskWatch::take_lowest);
        self.outcomes.push(Outcome { name: name.to_owned(), result, cost: started.cost(), lowest_free });
    }

    /// Records a step that did not start because the run was stopped; `false` when it may start.
    pub(crate) fn skipped(&mut self, name: &str) -> bool {
        if self.go_on() {
            return false;
        }
        self.not_run(name);
        true
    }

    /// Records a step that did not start because a step it needs failed (the table says "not
    /// run"; the failed step fails the run).
    pub(crate) fn not_run(&mut self, name: &str) {
        let cost = StepStart::now().cost();
        self.outcomes.push(Outcome {
            name: name.to_owned(),
            result: StepResult::NotRun,
            cost,
            lowest_free: None,
        });
    }

    /// Runs `step` as the step `name`, unless the run was stopped (then it did not run).
    pub(crate) async fn run<N: Note>(&mut self, name: &str, step: impl Future<Output = Result<N>>) {
        if self.skipped(name) {
            return;
        }
        let started = StepStart::now();
        let result = step.await;
        self.record(name, result, started);
    }

    /// Prints the table and what failed, interrupted or did not run; the run's exit code: 130
    /// after Ctrl-C, else 1 when a step failed, else 0.
    pub(crate) fn finish(mut self) -> ExitCode {
        if let Some(why) = self.disk.as_ref().and_then(DiskWatch::fell_below_floor) {
            self.record::<()>(
                "the disk kept its floor of free space",
                Err(anyhow::anyhow!("{why}")),
                StepStart::now(),
            );
        }
        eprint!("\n{}", table::step_table(&self.outcomes));
        let failed = self.outcomes.iter().filter(|o| matches!(o.result, StepResult::Failed(_))).count();
        eprintln!("{} steps, {failed} failed", self.outcomes.len());
        // Again after the table: CI's log keeps the end of the output, where the reason belongs.
        for outcome in &self.outcomes {
            if let StepResult::Failed(e) | StepResult::Interrupted(Some(e)) = &outcome.result {
                eprintln!("failed: {}: {}", outcome.name, clip(&format!("{e:#}"), 2000));
            }
        }
        if self.stop.signalled().is_some() {
            eprintln!("{}", self.interrupt_summary());
            return ExitCode::from(INTERRUPTED);
        }
        ExitCode::from(u8::from(failed > 0))
    }

    /// Which step Ctrl-C interrupted and which did not run.
    fn interrupt_summary(&self) -> String {
        let names = |f: fn(&StepResult) -> bool| -> Vec<&str> {
            self.outcomes.iter().filter(|o| f(&o.result)).map(|o| o.name.as_str()).collect()
        };
        let during = names(|r| matches!(r, StepResult::Interrupted(_)));
        let during = match during.first() {
            Some(step) => format!("interrupted (Ctrl-C) during the step \"{step}\""),
            None => "interrupted (Ctrl-C) between steps".to_owned(),
        };
        let not_run = names(|r| matches!(r, StepResult::NotRun));
        if not_run.is_empty() {
            format!("{during}; every later step ran")
        } else {
            format!("{during}; {} step(s) did not run: {}", not_run.len(), not_run.join("; "))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
pub(crate) mod tests {
    use std::{path::Path, time::Duration};

    use super::*;
    use crate::common::own_process::{Process, in_own_process};

    /// A step that runs `script` in `sh` to its end.
    async fn child_step(script: &str) -> Result<()> {
        let status =
            tokio::process::Command::new("sh").arg("-c").arg(script).kill_on_drop(true).status().await?;
        anyhow::ensure!(status.success(), "sh -c {script:?} failed ({status})");
        Ok(())
    }

    async fn wait_for(file: &Path) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !file.exists() {
            assert!(tokio::time::Instant::now() < deadline, "{} never appeared", file.display());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_interrupted_run_exits_130_naming_the_interrupted_step_and_those_not_run() {
        // A step that ends well when Ctrl-C reaches it (its child traps SIGINT and exits 0): the
        // old run counted no failed step and exited 0. The SIGINT to this process would reach
        // every other test's stand-in dra-e2e (run_runner passes it on): a process of its own.
        let test = "an_interrupted_run_exits_130_naming_the_interrupted_step_and_those_not_run";
        let Process::Own = in_own_process(module_path!(), test) else { return };
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let mut steps = Steps::new(Stop::on_ctrl_c(), None);
        steps.record("first", child_step("true").await, StepStart::now());
        assert!(steps.go_on());
        let t = StepStart::now();
        let script = format!(
            "trap 'kill $!; exit 0' INT; echo $$ > {}.tmp; mv {0}.tmp {0}; sleep 30 & wait",
            started.display()
        );
        let child = tokio::spawn(async move { child_step(&script).await });
        wait_for(&started).await;
        let child_pid: i32 = std::fs::read_to_string(&started).unwrap().trim().parse().unwrap();
        // Ctrl-C reaches the whole process group: this process and the step's child.
        for pid in [child_pid, i32::try_from(std::process::id()).unwrap()] {
            let pid = rustix::process::Pid::from_raw(pid).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        }
        let result = child.await.unwrap();
        assert!(result.is_ok(), "the step's child traps SIGINT and exits 0: {result:?}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while steps.go_on() {
            assert!(tokio::time::Instant::now() < deadline, "SIGINT never reached the run");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        steps.record("second", result, t);
        assert!(steps.skipped("third"));
        steps.record("clusters down", Ok(()), StepStart::now());
        let summary = steps.interrupt_summary();
        assert_eq!(summary, "interrupted (Ctrl-C) during the step \"second\"; 1 step(s) did not run: third");
        let results: Vec<&str> = steps.outcomes.iter().map(|o| table::result_word(&o.result)).collect();
        assert_eq!(results, ["ok", "INTERRUPTED", "not run", "ok"]);
        assert_eq!(steps.finish(), ExitCode::from(INTERRUPTED));
    }

    #[test]
    fn a_run_without_interrupt_exits_1_when_a_step_failed() {
        let mut steps = Steps::new(Stop::default(), None);
        steps.record("a", Ok(String::from("3 passed of 3 selected")), StepStart::now());
        assert!(!steps.skipped("b"));
        assert_eq!(table::result_word(&steps.outcomes[0].result), "ok");
        steps.record::<()>("c", Err(anyhow::anyhow!("broke")), StepStart::now());
        assert_eq!(steps.finish(), ExitCode::FAILURE);
        let mut steps = Steps::new(Stop::default(), None);
        steps.record("a", Ok(()), StepStart::now());
        assert_eq!(steps.finish(), ExitCode::SUCCESS);
    }

    #[test]
    fn a_step_that_a_failed_step_kept_from_running_is_listed_as_not_run() {
        let mut steps = Steps::new(Stop::default(), None);
        steps.record::<()>(
            "restart",
            Err(anyhow::anyhow!("cluster down could not remove everything")),
            StepStart::now(),
        );
        steps.not_run("the lane's suite");
        let results: Vec<(&str, &str)> =
            steps.outcomes.iter().map(|o| (o.name.as_str(), table::result_word(&o.result))).collect();
        assert_eq!(results, [("restart", "FAILED"), ("the lane's suite", "not run")]);
        assert_eq!(steps.finish(), ExitCode::FAILURE);
    }
}
