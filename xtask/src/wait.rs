//! Waiting with a deadline: poll a probe until it reports done, stop early when it reports that
//! waiting is pointless, and on timeout say what was awaited and what the last probe saw.

use std::{future::Future, time::Duration};

use anyhow::bail;
use tokio::time::Instant;
use tracing::debug;

/// What one probe of [`poll_until`] saw.
#[derive(Debug)]
pub enum Probe<T> {
    /// The condition holds; the wait returns this value.
    Done(T),
    /// Not yet; the text describes what the probe saw (it ends up in the timeout error).
    Pending(String),
    /// It will never happen (for example the process being waited for exited): stop at once
    /// with this description.
    Abort(String),
}

/// Probes every `interval` until the probe reports [`Probe::Done`] or `timeout` has passed.
///
/// A probe error counts as "not yet" (an API server that is still starting is normal); the timeout
/// error names `what` was waited for and what the last probe saw.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Probe<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = "nothing yet (no probe finished)".to_string();
    loop {
        match tokio::time::timeout_at(deadline, probe()).await {
            Ok(Ok(Probe::Done(value))) => return Ok(value),
            Ok(Ok(Probe::Pending(seen))) => last = seen,
            Ok(Ok(Probe::Abort(why))) => bail!("gave up waiting for {what}: {why}"),
            Ok(Err(err)) => last = format!("error: {err:#}"),
            Err(_) => break,
        }
        debug!("waiting for {what}: {last}");
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep_until((now + interval).min(deadline)).await;
    }
    bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn poll_until_returns_when_done_and_names_what_it_waited_for() {
        let mut calls = 0;
        let value = poll_until("three probes", Duration::from_secs(30), Duration::from_millis(1), || {
            calls += 1;
            let n = calls;
            async move { Ok(if n >= 3 { Probe::Done(n) } else { Probe::Pending(format!("probe {n}")) }) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);

        let err = poll_until::<(), _, _>(
            "the moon to turn blue",
            Duration::from_millis(50),
            Duration::from_millis(5),
            || async { anyhow::bail!("still white") },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "timed out after 50ms waiting for the moon to turn blue; last seen: error: still white"
            ),
            "{err}"
        );

        let err = poll_until::<(), _, _>(
            "a probe that hangs",
            Duration::from_millis(20),
            Duration::from_millis(5),
            std::future::pending::<anyhow::Result<Probe<()>>>,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("waiting for a probe that hangs; last seen: nothing yet"), "{err}");
    }

    #[tokio::test]
    async fn abort_stops_at_once_with_the_reason() {
        let err = poll_until::<(), _, _>(
            "a process",
            Duration::from_secs(60),
            Duration::from_millis(5),
            || async { Ok(Probe::Abort("it exited".into())) },
        )
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(err, "gave up waiting for a process: it exited");
    }
}
