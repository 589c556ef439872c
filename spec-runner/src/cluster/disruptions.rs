//! What happened to the cluster during a run that a failing spec's message should name, so that a
//! failure caused by a restart says so: the API server not answering or not ready (its `/readyz`
//! probed every second: a restarted API server answers some requests before it is ready, and
//! refuses others then, its authorizer's caches still empty), and a node's kubelet starting
//! again (the `Starting` event the kubelet records on its Node each time it starts). Watched from the run's start to its end;
//! a failed spec's message gets the disruptions that overlapped it
//! ([`Disruptions::during`]).

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Event;
use kube::{Api, api::ListParams};
use tokio_util::task::AbortOnDropHandle;

/// How often the API server is probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one probe may take before the API server counts as not answering.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the kubelets' `Starting` events are listed (in probe rounds).
const EVENTS_EVERY: u32 = 5;

/// One disruption: from when to when (`None`: still going on), and what.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Disruption {
    from: SystemTime,
    to: Option<SystemTime>,
    what: String,
}

/// The disruptions seen so far; watching stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Disruptions {
    seen: Arc<Mutex<Vec<Disruption>>>,
    /// When the last probe that got its answer (or gave up) was sent.
    probed: tokio::sync::watch::Receiver<SystemTime>,
    _task: AbortOnDropHandle<()>,
}

impl Disruptions {
    /// Starts watching the cluster behind `client` (one that does not send a request again: an
    /// outage must show); kubelet starts before `since` do not count.
    pub(crate) fn watch(client: kube::Client, since: SystemTime) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (probed_tx, probed) = tokio::sync::watch::channel(SystemTime::UNIX_EPOCH);
        let task = tokio::spawn(watch(client, since, seen.clone(), probed_tx));
        Disruptions { seen, probed, _task: AbortOnDropHandle::new(task) }
    }

    /// One sentence per disruption that overlapped `from..=to` (a spec's run), with the times
    /// relative to `from`. Waits first (a few seconds at most) for a probe sent after `to`, so an
    /// outage that began just before the spec ended is seen.
    pub(crate) async fn during(&self, from: SystemTime, to: SystemTime) -> Vec<String> {
        let mut probed = self.probed.clone();
        let _ = tokio::time::timeout(
            PROBE_EVERY + PROBE_TIMEOUT + Duration::from_secs(1),
            probed.wait_for(|at| *at >= to),
        )
        .await;
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        describe(&seen, from, to)
    }
}

/// Asks the API server whether it is ready: `None` if it is, else what it said.
async fn probe(client: &kube::Client) -> Option<String> {
    let request = match http::Request::get("/readyz").body(Vec::new()) {
        Ok(request) => request,
        Err(e) => return Some(e.to_string()),
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
        Ok(Ok(_)) => None,
        Ok(Err(kube::Error::Api(status))) => Some(format!("not ready: /readyz answered {}", status.code)),
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

async fn watch(
    client: kube::Client,
    since: SystemTime,
    seen: Arc<Mutex<Vec<Disruption>>>,
    probed: tokio::sync::watch::Sender<SystemTime>,
) {
    let events: Api<Event> = Api::all(client.clone());
    let starting = ListParams::default().fields("involvedObject.kind=Node,reason=Starting");
    let mut round = 0u32;
    let mut counted: Vec<(String, SystemTime)> = Vec::new();
    loop {
        let asked = SystemTime::now();
        let failure = probe(&client).await;
        record_probe(&mut seen.lock().unwrap_or_else(PoisonError::into_inner), asked, failure);
        probed.send_replace(asked);
        if round.is_multiple_of(EVENTS_EVERY)
            && let Ok(Ok(list)) = tokio::time::timeout(PROBE_TIMEOUT, events.list(&starting)).await
        {
            for event in list.items {
                let node = event.involved_object.name.clone().unwrap_or_default();
                let Some(at) = event_time(&event).filter(|at| *at >= since) else { continue };
                let key = (event.metadata.uid.clone().unwrap_or_default(), at);
                if counted.contains(&key) {
                    continue;
                }
                counted.push(key);
                seen.lock().unwrap_or_else(PoisonError::into_inner).push(Disruption {
                    from: at,
                    to: Some(at),
                    what: format!("the kubelet of node {node} started again"),
                });
            }
        }
        round = round.wrapping_add(1);
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// Opens a disruption at the first failed probe, closes it at the next answer.
fn record_probe(seen: &mut Vec<Disruption>, at: SystemTime, failure: Option<String>) {
    let open = seen.iter_mut().rev().find(|d| d.to.is_none());
    match (open, failure) {
        (Some(open), None) => open.to = Some(at),
        (None, Some(error)) => seen.push(Disruption {
            from: at,
            to: None,
            what: format!("the API server did not answer or was not ready ({error})"),
        }),
        _ => {}
    }
}

/// When a kubelet's event happened (its last occurrence).
fn event_time(event: &Event) -> Option<SystemTime> {
    let t = event
        .last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0))?;
    Some(SystemTime::from(t))
}

fn describe(seen: &[Disruption], from: SystemTime, to: SystemTime) -> Vec<String> {
    // Event times carry whole seconds: a start in the spec's first second counts. A probe sees
    // an outage up to a round late: one that began just after the spec's end counts too.
    let early = from.checked_sub(Duration::from_secs(1)).unwrap_or(from);
    let to = to + PROBE_EVERY + Duration::from_secs(1);
    let into = |t: SystemTime| match t.duration_since(from) {
        Ok(d) => format!("{:.1} s into the spec", d.as_secs_f64()),
        Err(e) => format!("{:.1} s before the spec", e.duration().as_secs_f64()),
    };
    seen.iter()
        .filter(|d| d.from <= to && d.to.is_none_or(|end| end >= early))
        .map(|d| match d.to {
            Some(end) if end == d.from => format!("{} at {} ({})", d.what, clock(d.from), into(d.from)),
            Some(end) => format!(
                "{} from {} to {} ({} to {})",
                d.what,
                clock(d.from),
                clock(end),
                into(d.from),
                into(end)
            ),
            None => format!("{} from {} on ({})", d.what, clock(d.from), into(d.from)),
        })
        .collect()
}

/// `HH:MM:SS` UTC.
fn clock(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn a_failed_probe_opens_a_disruption_and_the_next_answer_closes_it() {
        let mut seen = Vec::new();
        record_probe(&mut seen, at(10), None);
        assert!(seen.is_empty());
        record_probe(&mut seen, at(11), Some("connection refused".into()));
        record_probe(&mut seen, at(12), Some("connection refused".into()));
        assert_eq!(seen.len(), 1, "one outage, not one per probe");
        assert_eq!(seen[0].to, None);
        record_probe(&mut seen, at(30), None);
        assert_eq!(seen[0].to, Some(at(30)));
        record_probe(&mut seen, at(40), Some("timeout".into()));
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn a_spec_gets_the_disruptions_that_overlapped_it() {
        let seen = vec![
            Disruption { from: at(11), to: Some(at(30)), what: "the API server did not answer (x)".into() },
            Disruption { from: at(50), to: Some(at(50)), what: "the kubelet of node n started again".into() },
            Disruption { from: at(90), to: None, what: "the API server did not answer (y)".into() },
        ];
        assert!(describe(&seen, at(0), at(8)).is_empty(), "before the outage");
        assert_eq!(describe(&seen, at(0), at(9)).len(), 1, "a probe may see an outage a round late");
        assert!(describe(&seen, at(32), at(47)).is_empty(), "between them");
        let during = describe(&seen, at(20), at(60));
        assert_eq!(during.len(), 2, "{during:?}");
        assert!(during[0].starts_with("the API server did not answer (x) from "), "{during:?}");
        assert!(during[0].ends_with("(9.0 s before the spec to 10.0 s into the spec)"), "{during:?}");
        assert!(during[1].ends_with("(30.0 s into the spec)"), "{during:?}");
        let ongoing = describe(&seen, at(95), at(99));
        assert_eq!(ongoing.len(), 1);
        assert!(ongoing[0].contains(" on (5.0 s before the spec)"), "{ongoing:?}");
    }
}
