//! Progress lines for long steps: one line when a step starts and one with its elapsed time when it
//! ends, so a user watching a cold build or a cluster start knows what is happening.

use std::time::{Duration, Instant};

/// A running step; prints its outcome and elapsed time when finished.
#[derive(Debug)]
pub struct Step {
    name: String,
    started: Instant,
}

impl Step {
    /// Starts a step and prints `==> name ...`.
    pub fn start(name: impl Into<String>) -> Self {
        let name = name.into();
        eprintln!("==> {name} ...");
        Self { name, started: Instant::now() }
    }

    /// Prints `    name: done (1.2s)` and returns the elapsed time.
    pub fn done(self) -> Duration {
        self.finish("done")
    }

    /// Prints `    name: <outcome> (1.2s)`, e.g. "cached" or "already running".
    pub fn finish(self, outcome: &str) -> Duration {
        let elapsed = self.started.elapsed();
        eprintln!("    {}: {outcome} ({})", self.name, human(elapsed));
        elapsed
    }
}

/// Formats a duration the way the progress lines show it: `0.4s`, `12.3s`, `4m05s`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_millis(400)), "0.4s");
        assert_eq!(human(Duration::from_secs_f64(12.34)), "12.3s");
        assert_eq!(human(Duration::from_secs(245)), "4m05s");
    }
}
