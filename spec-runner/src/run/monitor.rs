//! What every running spec is doing right now, for progress reports (`--poll-progress-after`,
//! SIGUSR1) and for the messages after Ctrl-C: its phase (body, artifacts, which cleanup), its
//! last step ([`step`]), its last log line and what it waits for ([`waiting`]).
//!
//! The runner keeps one [`SpecState`] per running spec in the run's [`Monitor`], and makes it the
//! task-local "current spec" of the spec's body and of each of its cleanups. [`waiting`] and
//! [`step`] find it there; outside a spec (or in tasks a spec spawns itself) they do nothing.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    future::Future,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{task::futures::TaskLocalFuture, time::Instant};

use crate::{duration::display, report::progress::Output, run::capture};

tokio::task_local! {
    static CURRENT: Arc<SpecState>;
}

static NEXT_WAIT: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The specs running in a run. Cheap to clone; all clones are the same run.
#[derive(Clone, Default)]
pub struct Monitor(Arc<Mutex<BTreeMap<u64, Arc<SpecState>>>>);

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Monitor({} running)", lock(&self.0).len())
    }
}

/// Where a spec is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Creating the spec's namespace.
    Setup,
    /// The spec's body.
    Body,
    /// The body was cancelled (timeout, Ctrl-C) and has not returned yet.
    Cancelling,
    /// Collecting the artifacts of a failed spec.
    Artifacts,
    /// Running a cleanup.
    Cleanup(String),
    /// Its slot released, waiting for its deferred checks (their names).
    Deferred(String),
}

/// One wait in progress.
struct Wait {
    id: u64,
    what: String,
    timeout: Option<Duration>,
    since: Instant,
}

/// What a spec still has to clean up (its cleanup stack), for the status after Ctrl-C.
pub(crate) trait PendingCleanups: Send + Sync {
    /// What is registered and has not run yet, in the order it will run.
    fn pending(&self) -> Vec<String>;
}

/// What one running spec is doing.
pub(crate) struct SpecState {
    log_id: u64,
    full_text: String,
    name: String,
    started: Instant,
    phase: Mutex<(Phase, Instant)>,
    step: Mutex<Option<(String, Instant)>>,
    waits: Mutex<Vec<Wait>>,
    /// Time spent in each finished wait, by what it waited for.
    waited: Mutex<BTreeMap<String, Duration>>,
    cleanups: Arc<dyn PendingCleanups>,
    /// Where `-v` prints phases and steps as they happen.
    verbose: Option<Output>,
}

impl SpecState {
    pub(crate) fn new(
        log_id: u64,
        full_text: &str,
        name: &str,
        cleanups: Arc<dyn PendingCleanups>,
        verbose: Option<Output>,
    ) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            log_id,
            full_text: full_text.to_owned(),
            name: name.to_owned(),
            started: now,
            phase: Mutex::new((Phase::Setup, now)),
            step: Mutex::new(None),
            waits: Mutex::new(Vec::new()),
            waited: Mutex::new(BTreeMap::new()),
            cleanups,
            verbose,
        })
    }

    /// The finished waits that took at least `at_least` in all, longest first: what the spec
    /// waited for, and how long.
    pub(crate) fn waited(&self, at_least: Duration) -> Vec<(String, Duration)> {
        let mut waited: Vec<(String, Duration)> = lock(&self.waited)
            .iter()
            .filter(|(_, d)| **d >= at_least)
            .map(|(w, d)| (w.clone(), *d))
            .collect();
        waited.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        waited
    }

    /// Enters a phase (and says so with `-v`).
    pub(crate) fn set_phase(&self, phase: Phase) {
        let line = match &phase {
            Phase::Setup => None,
            Phase::Body => Some("running the body".to_owned()),
            Phase::Cancelling => Some("cancelled; waiting for the body to return".to_owned()),
            Phase::Artifacts => Some("collecting artifacts".to_owned()),
            Phase::Cleanup(what) => Some(format!("cleanup: {what}")),
            Phase::Deferred(what) => Some(format!("deferred checks: {what}")),
        };
        *lock(&self.phase) = (phase, Instant::now());
        if let Some(line) = line {
            self.verbose_line(&line);
        }
    }

    /// With `-v`: one line about this spec, as it happens.
    pub(crate) fn verbose_line(&self, line: &str) {
        if let Some(out) = &self.verbose {
            out.block(&format!("  [{}] {line}\n", self.name));
        }
    }

    /// Runs `fut` with this spec as the current one (for [`waiting`] and [`step`]).
    pub(crate) fn scope<F: Future>(self: &Arc<Self>, fut: F) -> TaskLocalFuture<Arc<Self>, F> {
        CURRENT.scope(self.clone(), fut)
    }

    /// The progress report of this spec (ginkgo's layout: spec, node, step, then the waits).
    pub(crate) fn report(&self) -> String {
        let now = Instant::now();
        let mut out = format!("  {} (Spec Runtime: {})\n", self.full_text, display(now - self.started));
        let (phase, since) = lock(&self.phase).clone();
        let node = match &phase {
            Phase::Setup => "[BeforeEach] creating the spec's namespace".to_owned(),
            Phase::Body => "[It]".to_owned(),
            Phase::Cancelling => "[It] (cancelled, waiting for it to return)".to_owned(),
            Phase::Artifacts => "[ReportAfterEach] collecting artifacts".to_owned(),
            Phase::Cleanup(what) => format!("[DeferCleanup] {what}"),
            Phase::Deferred(what) => format!("[DeferCleanup] (deferred checks) {what}"),
        };
        let _ = writeln!(out, "    In {node} (Node Runtime: {})", display(now - since));
        if let Some((step, since)) = lock(&self.step).as_ref() {
            let _ = writeln!(out, "    At [By Step] {step} (Step Runtime: {})", display(now - *since));
        }
        if let Some(line) = capture::last_line(self.log_id) {
            let _ = writeln!(out, "    Last log line: {}", line.trim_end());
        }
        let waits = lock(&self.waits);
        if waits.is_empty() {
            out.push_str("    Not in a wait the harness knows of.\n");
        }
        for wait in waits.iter() {
            let limit = wait.timeout.map(|t| format!(" (timeout {})", display(t))).unwrap_or_default();
            let _ = writeln!(out, "    Waiting {} for: {}{limit}", display(now - wait.since), wait.what);
        }
        out
    }

    /// After Ctrl-C: what this spec is doing and what cleanups come after it.
    fn cleanup_status(&self) -> String {
        let now = Instant::now();
        let (phase, since) = lock(&self.phase).clone();
        let doing = match &phase {
            Phase::Setup => "creating its namespace".to_owned(),
            Phase::Body | Phase::Cancelling => "waiting for the cancelled body to return".to_owned(),
            Phase::Artifacts => "collecting artifacts".to_owned(),
            Phase::Cleanup(what) => format!("cleanup {what:?}"),
            Phase::Deferred(what) => format!("deferred checks {what:?}"),
        };
        let mut line = format!("  {}: {doing} (for {})", self.full_text, display(now - since));
        if let Some(wait) = lock(&self.waits).last() {
            let _ = write!(line, ", waiting {} for: {}", display(now - wait.since), wait.what);
        }
        let pending = self.cleanups.pending();
        if !pending.is_empty() {
            let _ = write!(line, "; then {} more cleanup(s): {}", pending.len(), quoted(&pending));
        }
        line.push('\n');
        line
    }

    /// The cleanup steps not done yet: the one running (if any) and those after it.
    fn left(&self) -> Vec<String> {
        let (phase, since) = lock(&self.phase).clone();
        let mut left = Vec::new();
        match phase {
            Phase::Cleanup(what) => {
                left.push(format!("{what:?} (running for {})", display(Instant::now() - since)));
            }
            Phase::Deferred(what) => {
                left.push(format!(
                    "deferred checks {what:?} (running for {})",
                    display(Instant::now() - since)
                ));
            }
            _ => {}
        }
        left.extend(self.cleanups.pending().iter().map(|w| format!("{w:?}")));
        left
    }
}

fn quoted(items: &[String]) -> String {
    items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(", ")
}

impl Monitor {
    pub(crate) fn add(&self, state: &Arc<SpecState>) {
        lock(&self.0).insert(state.log_id, state.clone());
    }

    pub(crate) fn remove(&self, state: &SpecState) {
        lock(&self.0).remove(&state.log_id);
    }

    fn running(&self) -> Vec<Arc<SpecState>> {
        lock(&self.0).values().cloned().collect()
    }

    /// How many specs are running.
    pub fn running_count(&self) -> usize {
        lock(&self.0).len()
    }

    /// A progress report of every running spec, under `title` (SIGUSR1 prints it).
    pub fn report(&self, title: &str) -> String {
        let running = self.running();
        let mut out = format!("\n{title}: {} spec(s) running\n", running.len());
        for spec in running {
            out.push_str(&spec.report());
        }
        out
    }

    /// After Ctrl-C, every few seconds: what each running spec is cleaning up.
    pub fn cleanup_status(&self, interrupted: Duration) -> String {
        let running = self.running();
        if running.is_empty() {
            return format!("Interrupted {} ago; no spec is running any more.\n", display(interrupted));
        }
        let mut out = format!(
            "Interrupted {} ago; still cleaning up {} spec(s) (press Ctrl-C again to stop at once):\n",
            display(interrupted),
            running.len()
        );
        for spec in running {
            out.push_str(&spec.cleanup_status());
        }
        out
    }

    /// After a second Ctrl-C: the cleanup steps each running spec did not get to.
    pub fn left_behind(&self) -> String {
        let mut out = String::new();
        for spec in self.running() {
            let left = spec.left();
            if left.is_empty() {
                let _ = writeln!(out, "  {}: no cleanup left", spec.full_text);
            } else {
                let _ = writeln!(out, "  {}: {}", spec.full_text, left.join(", "));
            }
        }
        if out.is_empty() {
            "No spec was running; nothing is left to clean up.\n".to_owned()
        } else {
            format!("Cleanup steps not done:\n{out}")
        }
    }
}

/// Marks the current spec as waiting for `what` (at most `timeout`, if known) until the returned
/// guard is dropped: progress reports and the Ctrl-C messages name the wait. Every wait of the
/// harness calls this on entry; outside a spec it does nothing.
///
/// ```
/// # async fn f() {
/// let _waiting = spec_runner::waiting("pod web to be running", Some(std::time::Duration::from_secs(300)));
/// // ... the wait ...
/// # }
/// ```
#[must_use = "the wait ends when the guard is dropped"]
pub fn waiting(what: impl Into<String>, timeout: Option<Duration>) -> WaitGuard {
    let state = CURRENT.try_with(Clone::clone).ok();
    let id = NEXT_WAIT.fetch_add(1, Ordering::Relaxed);
    if let Some(state) = &state {
        lock(&state.waits).push(Wait { id, what: what.into(), timeout, since: Instant::now() });
    }
    WaitGuard { state, id }
}

/// Ends a wait of [`waiting`] when dropped.
pub struct WaitGuard {
    state: Option<Arc<SpecState>>,
    id: u64,
}

impl std::fmt::Debug for WaitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitGuard").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if let Some(state) = &self.state {
            let mut waits = lock(&state.waits);
            if let Some(at) = waits.iter().position(|w| w.id == self.id) {
                let wait = waits.remove(at);
                *lock(&state.waited).entry(wait.what).or_default() += wait.since.elapsed();
            }
        }
    }
}

/// Starts a step of the current spec (ginkgo's `By`): logged, named by progress reports until
/// the next step, and printed as it happens with `-v`. Outside a spec it only logs.
pub fn step(what: impl Into<String>) {
    let what = what.into();
    tracing::info!("STEP: {what}");
    let _ = CURRENT.try_with(|state| {
        *lock(&state.step) = Some((what.clone(), Instant::now()));
        state.verbose_line(&format!("STEP: {what}"));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<SpecState> {
        SpecState::new(0, "[x] spec one", "spec one", Arc::new(Pending(Vec::new())), None)
    }

    #[tokio::test(start_paused = true)]
    async fn waits_and_steps_show_in_the_report_while_they_last() {
        let state = state();
        state.set_phase(Phase::Body);
        let s = state.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(state.scope(async move {
            step("create the pod");
            let _outer = waiting("pod web to be running", Some(Duration::from_secs(300)));
            {
                let _inner = waiting("the kubelet", None);
            }
            let _ = rx.await;
        }));
        tokio::time::sleep(Duration::from_secs(41)).await;
        let report = s.report();
        assert!(report.contains("[x] spec one (Spec Runtime: 41s)"), "{report}");
        assert!(report.contains("In [It] (Node Runtime: 41s)"), "{report}");
        assert!(report.contains("At [By Step] create the pod (Step Runtime: 41s)"), "{report}");
        assert!(report.contains("Waiting 41s for: pod web to be running (timeout 5m)"), "{report}");
        assert!(!report.contains("kubelet"), "ended waits are gone: {report}");
        tx.send(()).unwrap();
        task.await.unwrap();
        assert!(s.report().contains("Not in a wait the harness knows of."));
    }

    /// A spec's cleanups that have not run yet.
    struct Pending(Vec<String>);

    impl PendingCleanups for Pending {
        fn pending(&self) -> Vec<String> {
            self.0.clone()
        }
    }

    #[test]
    fn waiting_outside_a_spec_does_nothing() {
        let guard = waiting("nothing", None);
        assert!(guard.state.is_none());
        step("a step outside any spec");
    }

    #[tokio::test(start_paused = true)]
    async fn left_behind_names_the_running_cleanup_and_the_pending_ones() {
        let stack = Arc::new(Pending(vec!["delete DeviceClass c".into(), "delete namespace ns".into()]));
        let state = SpecState::new(0, "[x] spec two", "spec two", stack, None);
        state.set_phase(Phase::Cleanup("hang".into()));
        let monitor = Monitor::default();
        monitor.add(&state);
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(
            monitor.left_behind(),
            "Cleanup steps not done:\n  [x] spec two: \"hang\" (running for 7s), \"delete DeviceClass c\", \"delete namespace ns\"\n"
        );
        let status = monitor.cleanup_status(Duration::from_secs(9));
        assert!(
            status.contains("[x] spec two: cleanup \"hang\" (for 7s); then 2 more cleanup(s)"),
            "{status}"
        );
        monitor.remove(&state);
        assert_eq!(monitor.running_count(), 0);
    }
}
