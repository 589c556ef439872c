//! Where a spec's time went: queued (waiting to start: a serial spec for the specs before it to
//! settle and for every worker slot, another spec for a free slot), set-up (from the body's start until the harness says its driver is
//! ready, [`Ctx::setup_done`](crate::Ctx::setup_done)), body (the rest of the body), cleanup (the
//! cleanups, the namespace's deletion request included) and deferred checks (after the worker slot
//! was released: the namespace and deleted objects gone, …; wall time, the checks run at once). Printed per spec with `-v`, summed in the run's summary,
//! written as JUnit properties and as ginkgo report entries named `phase:<name>`.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use crate::duration;

/// The phases of one spec run; `None` for a phase the spec did not reach or does not have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// From when the runner reached the spec until it had its worker slot (before its first try).
    pub queued: Option<Duration>,
    /// From the body's start until its set-up was marked done (driver plugins registered).
    pub setup: Option<Duration>,
    /// The body after its set-up (the whole body when it marked none).
    pub body: Option<Duration>,
    /// The cleanups, the namespace's deletion request included.
    pub cleanup: Option<Duration>,
    /// Checks run after the spec's worker slot was released.
    pub deferred: Option<Duration>,
}

impl Phases {
    /// The names of the phases as reports carry them, in order.
    pub const NAMES: [&'static str; 5] = ["queued", "setup", "body", "cleanup", "deferred"];

    /// `(name, duration)` of every phase that has one, in order (`queued`, `setup`, `body`,
    /// `cleanup`, `deferred`).
    pub fn entries(&self) -> impl Iterator<Item = (&'static str, Duration)> {
        Self::NAMES
            .into_iter()
            .zip([self.queued, self.setup, self.body, self.cleanup, self.deferred])
            .filter_map(|(name, d)| d.map(|d| (name, d)))
    }

    /// Whether no phase has a duration (a spec that was never started, or skipped before it).
    pub fn is_empty(&self) -> bool {
        self.entries().next().is_none()
    }

    /// `set-up 3.2s, body 10.1s, cleanup 5.0s`; empty when [`is_empty`](Self::is_empty).
    pub fn line(&self) -> String {
        self.entries()
            .map(|(name, d)| format!("{} {}", display_name(name), duration::display(d)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Adds `other`'s phases to these (a phase is present in the sum when it is in either).
    pub fn add(&mut self, other: &Phases) {
        let sum = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or_default() + b.unwrap_or_default()),
        };
        self.queued = sum(self.queued, other.queued);
        self.setup = sum(self.setup, other.setup);
        self.body = sum(self.body, other.body);
        self.cleanup = sum(self.cleanup, other.cleanup);
        self.deferred = sum(self.deferred, other.deferred);
    }
}

/// How a phase is written for people.
fn display_name(name: &str) -> &str {
    if name == "setup" { "set-up" } else { name }
}

/// The mark the harness sets when a spec's set-up is done; shared by a spec's [`Ctx`](crate::Ctx)
/// clones and the runner.
#[derive(Debug, Default)]
pub(crate) struct SetupMark(Mutex<Option<Instant>>);

impl SetupMark {
    /// Marks set-up done now; a later mark (a second driver) moves the end of set-up later.
    pub(crate) fn mark(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    fn get(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Splits a body that ran from `start` to `end` into set-up and body.
    pub(crate) fn split(&self, start: Instant, end: Instant) -> (Option<Duration>, Duration) {
        match self.get().map(|m| m.clamp(start, end)) {
            Some(m) => (Some(m - start), end - m),
            None => (None, end - start),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_sums_name_only_present_phases() {
        let mut a = Phases {
            queued: None,
            setup: Some(Duration::from_millis(3200)),
            body: Some(Duration::from_secs(10)),
            cleanup: Some(Duration::from_secs(5)),
            deferred: None,
        };
        assert_eq!(a.line(), "set-up 3.2s, body 10s, cleanup 5s");
        assert!(Phases::default().is_empty());
        assert_eq!(Phases::default().line(), "");
        a.add(&Phases { body: Some(Duration::from_secs(1)), ..Phases::default() });
        assert_eq!(a.body, Some(Duration::from_secs(11)));
        assert_eq!(a.setup, Some(Duration::from_millis(3200)));
        assert_eq!(a.deferred, None);
        let names: Vec<&str> = a.entries().map(|(n, _)| n).collect();
        assert_eq!(names, ["setup", "body", "cleanup"]);
        a.add(&Phases { queued: Some(Duration::from_millis(500)), ..Phases::default() });
        assert_eq!(a.line(), "queued 500ms, set-up 3.2s, body 11s, cleanup 5s");
    }

    #[tokio::test(start_paused = true)]
    async fn the_mark_splits_the_body() {
        let mark = SetupMark::default();
        let start = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(mark.split(start, Instant::now()), (None, Duration::from_secs(2)));
        mark.mark();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(mark.split(start, Instant::now()), (Some(Duration::from_secs(2)), Duration::from_secs(3)));
    }
}
