//! Waiting with a timeout that says what it waited for and what it saw last.
//!
//! - [`objects`] / [`object`]: watch objects (kube-rs `watcher`, so changes are seen at once,
//!   no polling) until a condition on them holds;
//! - [`poll`]: call an async check at an interval until it is done, for conditions that cannot
//!   be watched (exec output, call logs of several nodes, API errors).
//!
//! Every wait ends with a [`WaitError`] naming what it waited for, after how long, and the last
//! state it saw (the objects' status, or the last check's note).
//!
//! Inside a spec's body every wait also watches the spec's cancellation
//! ([`spec_runner::current_cancellation`]): a spec that times out or fails at once
//! ([`Ctx::fail_now`](spec_runner::Ctx::fail_now)) stops waiting at once, with
//! [`WaitError::Cancelled`], instead of running on until the runner aborts it.
//!
//! ```no_run
//! # async fn f(pods: kube::Api<k8s_openapi::api::core::v1::Pod>) -> Result<(), harness::wait::WaitError> {
//! use std::time::Duration;
//! use harness::wait::{self, Verdict};
//! let pod = wait::object(&pods, "tester-1", "pod tester-1 to be scheduled", Duration::from_secs(60), |pod| {
//!     match pod.and_then(|p| p.spec.as_ref()).and_then(|s| s.node_name.as_ref()) {
//!         Some(_) => Verdict::Done,
//!         None => Verdict::Pending,
//!     }
//! })
//! .await?;
//! # Ok(()) }
//! ```

use std::{collections::BTreeMap, fmt::Debug, future::Future, time::Duration};

use futures::{StreamExt as _, TryStreamExt as _};
use kube::{
    Api, Resource, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::time::Instant;

/// Longest description of the last seen state in an error.
const MAX_LAST_SEEN: usize = 4000;

/// What a condition says about the current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The condition holds; the wait ends successfully.
    Done,
    /// Not yet; keep waiting.
    Pending,
    /// It can never hold any more (e.g. a pod that must stay pending got scheduled); the wait
    /// ends with this reason.
    Fail(String),
}

impl Verdict {
    /// [`Verdict::Done`] if `done`, else [`Verdict::Pending`].
    pub fn done_if(done: bool) -> Self {
        if done { Verdict::Done } else { Verdict::Pending }
    }
}

/// The result of one check of [`poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt<T> {
    /// Done, with the value the wait returns.
    Done(T),
    /// Not yet; the text says what the check saw (it ends up in the timeout error).
    Retry(String),
    /// It can never succeed; the wait ends with this reason.
    Fail(String),
}

/// A wait that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The condition did not hold in time.
    #[error("timed out after {timeout:?} waiting for {what}; last seen: {last}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        timeout: Duration,
        /// The last state seen.
        last: String,
    },
    /// The condition reported that it can never hold.
    #[error("gave up waiting for {what}: {reason}; last seen: {last}")]
    Failed {
        /// What was waited for.
        what: String,
        /// Why it can never hold.
        reason: String,
        /// The state that made it give up.
        last: String,
    },
    /// The spec was cancelled (timed out, failed at once, interrupted) while waiting.
    #[error("stopped waiting for {what} after {after:?}: the spec was cancelled; last seen: {last}")]
    Cancelled {
        /// What was waited for.
        what: String,
        /// How long it had waited.
        after: Duration,
        /// The last state seen.
        last: String,
    },
}

/// Completes when `token` is cancelled; never without one.
async fn cancelled(token: Option<&tokio_util::sync::CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

impl WaitError {
    /// What the wait was for.
    pub fn what(&self) -> &str {
        match self {
            WaitError::Timeout { what, .. }
            | WaitError::Failed { what, .. }
            | WaitError::Cancelled { what, .. } => what,
        }
    }

    /// The last state seen.
    pub fn last_seen(&self) -> &str {
        match self {
            WaitError::Timeout { last, .. }
            | WaitError::Failed { last, .. }
            | WaitError::Cancelled { last, .. } => last,
        }
    }
}

/// Cuts `text` to at most [`MAX_LAST_SEEN`] bytes (on a character boundary).
fn truncate(mut text: String) -> String {
    if text.len() > MAX_LAST_SEEN {
        let mut cut = MAX_LAST_SEEN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// A short description of an object for "last seen": its kind, name, deletion timestamp and
/// status as compact JSON (everything if it has no status).
pub fn describe<K: Resource + Serialize>(obj: &K) -> String
where
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let name = match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", obj.meta().name.as_deref().unwrap_or_default()),
        None => obj.meta().name.clone().unwrap_or_default(),
    };
    let value = serde_json::to_value(obj).unwrap_or_default();
    let body = match value.get("status") {
        Some(status) => format!("status={status}"),
        None => match value.get("spec") {
            Some(spec) => format!("spec={spec}"),
            None => value.to_string(),
        },
    };
    let deleting = obj
        .meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| format!(" (deleting since {})", t.0))
        .unwrap_or_default();
    format!("{kind} {name}{deleting} {body}")
}

/// Watches the objects `config` selects (field/label selectors) until `condition` returns
/// [`Verdict::Done`] for the current set, for at most `timeout`. Returns the set it accepted.
///
/// The condition is checked once the initial list is complete and after every change. Watch
/// errors are retried with backoff (and reported as the last seen state if the wait times out).
pub async fn objects<K, F>(
    api: &Api<K>,
    config: watcher::Config,
    what: impl Into<String>,
    timeout: Duration,
    mut condition: F,
) -> Result<Vec<K>, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
    K::DynamicType: Default,
    F: FnMut(&[K]) -> Verdict,
{
    let what = what.into();
    let _waiting = spec_runner::waiting(what.clone(), Some(timeout));
    let deadline = Instant::now() + timeout;
    let mut stream = watcher(api.clone(), config.clone()).default_backoff().boxed();
    let mut current: BTreeMap<String, K> = BTreeMap::new();
    let mut init: BTreeMap<String, K> = BTreeMap::new();
    let mut initialized = false;
    let mut last_error: Option<String> = None;
    let key = |obj: &K| {
        obj.uid().unwrap_or_else(|| format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()))
    };
    let describe_all = |current: &BTreeMap<String, K>, last_error: &Option<String>| {
        let mut text = if current.is_empty() {
            "no matching object".to_owned()
        } else {
            current.values().map(describe).collect::<Vec<_>>().join("; ")
        };
        if let Some(e) = last_error {
            text.push_str(&format!(" (last watch error: {e})"));
        }
        truncate(text)
    };
    let cancel = spec_runner::current_cancellation();
    let started = Instant::now();
    loop {
        let next = tokio::select! {
            biased;
            () = cancelled(cancel.as_ref()) => {
                let last = describe_all(&current, &last_error);
                return Err(WaitError::Cancelled { what, after: started.elapsed(), last });
            }
            next = tokio::time::timeout_at(deadline, stream.try_next()) => next,
        };
        let event = match next {
            Err(_) => {
                let last = if initialized {
                    describe_all(&current, &last_error)
                } else {
                    format!(
                        "the initial list did not complete{}",
                        last_error.map(|e| format!(": {e}")).unwrap_or_default()
                    )
                };
                return Err(WaitError::Timeout { what, timeout, last });
            }
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => {
                // The watcher stream never ends on its own; treat it like an error.
                last_error = Some("watch stream ended".to_owned());
                stream = watcher(api.clone(), config.clone()).default_backoff().boxed();
                continue;
            }
            Ok(Err(e)) => {
                tracing::debug!(%what, error = %e, "watch error while waiting");
                last_error = Some(e.to_string());
                continue;
            }
        };
        match event {
            watcher::Event::Init => init.clear(),
            watcher::Event::InitApply(obj) => {
                init.insert(key(&obj), obj);
            }
            watcher::Event::InitDone => {
                current = std::mem::take(&mut init);
                initialized = true;
            }
            watcher::Event::Apply(obj) => {
                current.insert(key(&obj), obj);
            }
            watcher::Event::Delete(obj) => {
                current.remove(&key(&obj));
            }
        }
        if !initialized {
            continue;
        }
        let list: Vec<K> = current.values().cloned().collect();
        match condition(&list) {
            Verdict::Done => return Ok(list),
            Verdict::Pending => {}
            Verdict::Fail(reason) => {
                return Err(WaitError::Failed { what, reason, last: describe_all(&current, &last_error) });
            }
        }
    }
}

/// Watches one object until `condition` returns [`Verdict::Done`] for it (`None`: it does not
/// exist), for at most `timeout`. Returns the object as last seen (`None` if it is gone).
pub async fn object<K, F>(
    api: &Api<K>,
    name: &str,
    what: impl Into<String>,
    timeout: Duration,
    mut condition: F,
) -> Result<Option<K>, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
    K::DynamicType: Default,
    F: FnMut(Option<&K>) -> Verdict,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let found = objects(api, config, what, timeout, |objs| condition(objs.first())).await?;
    Ok(found.into_iter().next())
}

/// Watches one object until `condition` returns [`Verdict::Done`] for it, for at most
/// `timeout`; while it does not exist (yet), the wait goes on. Returns the object as last seen.
pub async fn existing<K, F>(
    api: &Api<K>,
    name: &str,
    what: impl Into<String>,
    timeout: Duration,
    mut condition: F,
) -> Result<K, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
    K::DynamicType: Default,
    F: FnMut(&K) -> Verdict,
{
    let what = what.into();
    let found =
        object(api, name, what.clone(), timeout, |obj| obj.map_or(Verdict::Pending, &mut condition)).await?;
    found.ok_or_else(|| WaitError::Failed { what, reason: format!("{name} is gone"), last: String::new() })
}

/// Waits until the object `name` does not exist (any more).
pub async fn gone<K>(
    api: &Api<K>,
    name: &str,
    what: impl Into<String>,
    timeout: Duration,
) -> Result<(), WaitError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
    K::DynamicType: Default,
{
    object(api, name, what, timeout, |obj| Verdict::done_if(obj.is_none())).await.map(|_| ())
}

/// Calls `check` until it returns [`Attempt::Done`], at most every `interval` (the first call is
/// immediate), for at most `timeout`. A check that is still running at the deadline is
/// abandoned.
pub async fn poll<T, F, Fut>(
    what: impl Into<String>,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<T, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let what = what.into();
    let _waiting = spec_runner::waiting(what.clone(), Some(timeout));
    let deadline = Instant::now() + timeout;
    let mut last = "nothing yet (the first check did not finish)".to_owned();
    let cancel = spec_runner::current_cancellation();
    let begun = Instant::now();
    loop {
        let started = Instant::now();
        let attempt = tokio::select! {
            biased;
            () = cancelled(cancel.as_ref()) => {
                return Err(WaitError::Cancelled { what, after: begun.elapsed(), last });
            }
            attempt = tokio::time::timeout_at(deadline, check()) => attempt,
        };
        match attempt {
            Ok(Attempt::Done(value)) => return Ok(value),
            Ok(Attempt::Retry(seen)) => last = truncate(seen),
            Ok(Attempt::Fail(reason)) => return Err(WaitError::Failed { what, reason, last }),
            Err(_) => return Err(WaitError::Timeout { what, timeout, last }),
        }
        let next = started + interval;
        if next >= deadline {
            // One last check right at the deadline would be no better than this one.
            return Err(WaitError::Timeout { what, timeout, last });
        }
        tokio::select! {
            biased;
            () = cancelled(cancel.as_ref()) => {
                return Err(WaitError::Cancelled { what, after: begun.elapsed(), last });
            }
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use k8s_openapi::api::core::v1::{Pod, PodStatus};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn poll_returns_the_value_once_done() {
        let n = Arc::new(AtomicU32::new(0));
        let got = poll("three tries", Duration::from_secs(10), Duration::from_millis(100), || {
            let n = n.clone();
            async move {
                match n.fetch_add(1, Ordering::SeqCst) {
                    2 => Attempt::Done("ok"),
                    i => Attempt::Retry(format!("try {i}")),
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(got, "ok");
        assert_eq!(n.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn poll_timeout_names_what_and_last_seen() {
        let err =
            poll::<(), _, _>("the answer", Duration::from_secs(1), Duration::from_millis(300), || async {
                Attempt::Retry("still 41".to_owned())
            })
            .await
            .unwrap_err();
        assert_eq!(err.what(), "the answer");
        assert_eq!(err.last_seen(), "still 41");
        assert_eq!(err.to_string(), "timed out after 1s waiting for the answer; last seen: still 41");
    }

    #[tokio::test(start_paused = true)]
    async fn poll_fail_ends_the_wait_at_once() {
        let err = poll::<(), _, _>("x", Duration::from_secs(60), Duration::from_secs(1), || async {
            Attempt::Fail("pod got scheduled".to_owned())
        })
        .await
        .unwrap_err();
        assert!(
            matches!(err, WaitError::Failed { ref reason, .. } if reason == "pod got scheduled"),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn poll_abandons_a_hanging_check() {
        let err =
            poll::<(), _, _>("hang", Duration::from_secs(2), Duration::from_secs(1), std::future::pending)
                .await
                .unwrap_err();
        assert!(matches!(err, WaitError::Timeout { .. }));
    }

    #[test]
    fn describes_objects_with_status() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.status = Some(PodStatus { phase: Some("Pending".into()), ..Default::default() });
        assert_eq!(describe(&pod), r#"Pod ns/p status={"phase":"Pending"}"#);
    }

    #[test]
    fn truncates_long_descriptions() {
        let long = "é".repeat(MAX_LAST_SEEN);
        let t = truncate(long);
        assert!(t.len() <= MAX_LAST_SEEN + 3);
        assert!(t.ends_with("..."));
    }
}
