//! Waiting for a component of the local cluster to become ready: the shared poll loop, stopped at
//! once when the component's process exits, with the component's last log lines and the path of
//! its full log in every failure.

use std::{future::Future, time::Duration};

use anyhow::Result;

use crate::common::process::Supervisor;
use crate::wait::{Probe, poll_until};

/// How often a readiness check is repeated.
const POLL: Duration = Duration::from_millis(250);

/// Polls `check` until it returns `Ok(true)`, the timeout expires, or the component (if given)
/// stops running.
pub async fn until<F, Fut>(
    what: &str,
    timeout: Duration,
    component: Option<(&Supervisor, &str)>,
    mut check: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let result = poll_until(what, timeout, POLL, || {
        let checked = check();
        async move {
            let seen = match checked.await {
                Ok(true) => return Ok(Probe::Done(())),
                Ok(false) => "not ready yet".to_string(),
                Err(e) => format!("error: {e:#}"),
            };
            match component {
                Some((sup, name)) if !sup.is_running(name) => {
                    Ok(Probe::Abort(format!("{name} exited (last check: {seen})")))
                }
                _ => Ok(Probe::Pending(seen)),
            }
        }
    })
    .await;
    match (result, component) {
        (Ok(()), _) => Ok(()),
        (Err(e), Some((sup, name))) => Err(sup.failure(name, &format!("{e:#}"))),
        (Err(e), None) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use anyhow::anyhow;

    use super::*;

    #[tokio::test]
    async fn times_out_with_the_last_observation() {
        let err = until("the moon rising", Duration::from_millis(600), None, || async {
            Err::<bool, _>(anyhow!("it is cloudy"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("the moon rising"), "{err}");
        assert!(err.contains("it is cloudy"), "{err}");
    }

    #[tokio::test]
    async fn returns_once_ready() {
        let mut n = 0;
        until("three polls", Duration::from_secs(10), None, || {
            n += 1;
            let ready = n >= 3;
            async move { Ok(ready) }
        })
        .await
        .unwrap();
        assert_eq!(n, 3);
    }

    #[tokio::test]
    async fn notices_an_exited_component() {
        let dir = tempfile::tempdir().unwrap();
        let sup = Supervisor::new(dir.path().join("pids"), dir.path().join("logs"));
        let spec = crate::common::process::ProcessSpec {
            name: "quitter".into(),
            program: "sh".into(),
            args: vec!["-c".into(), "echo 'fatal: bad flag'; exit 3".into()],
            env: vec![],
        };
        sup.start(&spec).ok();
        let err = until("healthz", Duration::from_secs(20), Some((&sup, "quitter")), || async { Ok(false) })
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("quitter exited"), "{err}");
        assert!(err.contains("fatal: bad flag"), "{err}");
        assert!(err.contains("quitter.log"), "{err}");
    }
}
