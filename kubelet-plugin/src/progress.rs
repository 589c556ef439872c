//! How the plugin's waits reach a progress reporter, without depending on one.
//!
//! The waits of [`calls`](crate::calls) (`wait_for`, `wait_prepared`, ...) can take minutes; a test
//! runner that prints progress reports wants to name them ("waiting for the kubelet's calls: ...").
//! The runner installs a [`WaitReporter`] once per process with [`set_wait_reporter`]; every wait
//! calls it on entry and drops what it returns when the wait ends. Without a reporter, waits
//! report nothing.
//!
//! ```
//! use std::time::Duration;
//!
//! /// Logs every wait of the plugin's call API.
//! struct LogWaits;
//!
//! impl kubelet_plugin::progress::WaitReporter for LogWaits {
//!     fn waiting(&self, what: String, timeout: Option<Duration>) -> kubelet_plugin::progress::WaitToken {
//!         eprintln!("waiting for {what} (at most {timeout:?})");
//!         Box::new(())
//!     }
//! }
//!
//! kubelet_plugin::progress::set_wait_reporter(LogWaits);
//! ```

use std::{any::Any, sync::OnceLock, time::Duration};

/// What a [`WaitReporter`] hands out for one wait; dropped when the wait ends.
pub type WaitToken = Box<dyn Any + Send>;

/// Told about each wait of the plugin's call API (see the module docs).
pub trait WaitReporter: Send + Sync + 'static {
    /// A wait for `what` (at most `timeout`, if known) starts in the current task; it ends when
    /// the returned token is dropped.
    fn waiting(&self, what: String, timeout: Option<Duration>) -> WaitToken;
}

static REPORTER: OnceLock<Box<dyn WaitReporter>> = OnceLock::new();

/// Installs the process's reporter; false (and `reporter` unused) when one is installed already.
pub fn set_wait_reporter(reporter: impl WaitReporter) -> bool {
    let mut installed = false;
    REPORTER.get_or_init(|| {
        installed = true;
        Box::new(reporter)
    });
    installed
}

/// Reports a wait for `what` to the installed reporter, if any; the wait ends when the result
/// is dropped.
#[must_use = "the wait ends when the token is dropped"]
pub(crate) fn waiting(what: impl FnOnce() -> String, timeout: Option<Duration>) -> Option<WaitToken> {
    REPORTER.get().map(|reporter| reporter.waiting(what(), timeout))
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    /// A wait's description and whether it has ended.
    type Seen = (String, Arc<AtomicBool>);

    /// Records waits, and which of them have ended.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Seen>>>);

    struct Ends(Arc<AtomicBool>);

    impl Drop for Ends {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    impl WaitReporter for Recorder {
        fn waiting(&self, what: String, _: Option<Duration>) -> WaitToken {
            let ended = Arc::new(AtomicBool::new(false));
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push((what, ended.clone()));
            Box::new(Ends(ended))
        }
    }

    #[test]
    fn the_first_reporter_sees_each_wait_begin_and_end() {
        let recorder = Recorder::default();
        assert!(set_wait_reporter(recorder.clone()));
        assert!(!set_wait_reporter(Recorder::default()), "a second reporter is refused");
        let token = waiting(|| "the kubelet's calls: x".to_owned(), Some(Duration::from_secs(1)));
        let seen = |i: usize| {
            let waits = recorder.0.lock().unwrap_or_else(|e| e.into_inner());
            (waits[i].0.clone(), waits[i].1.load(Ordering::SeqCst))
        };
        assert_eq!(seen(0), ("the kubelet's calls: x".to_owned(), false));
        drop(token);
        assert!(seen(0).1, "the wait ended with its token");
    }
}
