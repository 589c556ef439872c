//! A label-filtered watch of one resource that keeps a cache and records
//! informer-style events, the Rust counterpart of the informers and the event
//! recorder upstream's `TestResource` (test/e2e/framework/conformance) uses.
//!
//! A kube-rs [`watcher()`] feeds a cache keyed by `namespace/name`. Every change
//! of the cache is recorded as `add`, `update` or `delete` (a re-list after a
//! watch restart is diffed against the cache, as client-go's `Replace` does).
//! The spec waits until the cache has caught up with what it just did, then
//! checks the recorded events against a pattern such as `^add,(update,)*$`
//! and that resource versions never went backwards.

use std::{collections::BTreeMap, fmt::Debug, sync::Arc, time::Duration};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::{
    Api, Resource, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
use regex::Regex;
use tokio::{sync::watch, task::JoinHandle};

/// What kind of change an event is, named as upstream's event list prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EventType {
    /// A new object appeared.
    Add,
    /// A known object changed.
    Update,
    /// A known object disappeared.
    Delete,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recorded {
    /// add, update or delete.
    pub(super) kind: EventType,
    /// `namespace/name, uid` of the object (`old; new` if an update changed it).
    pub(super) id: String,
    /// `metadata.resourceVersion` of the old object (if any), then the new one (if any).
    pub(super) resource_versions: Vec<String>,
}

/// The sequence of event types as upstream renders it: `add,update,delete,`.
pub(super) fn types(events: &[Recorded]) -> String {
    events.iter().map(|e| format!("{},", e.kind.as_str())).collect()
}

/// `namespace/name, uid` (or `name, uid` for cluster-scoped objects), as
/// upstream's event IDs read.
pub(super) fn object_id<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    let uid = meta.uid.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}, {uid}"),
        _ => format!("{name}, {uid}"),
    }
}

fn cache_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

/// Parses a resource version as upstream's `HaveValidResourceVersion` accepts
/// it: a non-negative decimal integer of at most 128 bits.
pub(super) fn parse_resource_version(rv: &str) -> anyhow::Result<u128> {
    if rv.is_empty() || !rv.bytes().all(|b| b.is_ascii_digit()) {
        bail!("resourceVersion {rv:?} is not a non-negative decimal integer");
    }
    rv.parse().with_context(|| format!("resourceVersion {rv:?} needs more than 128 bits"))
}

/// What the cache should hold once it has caught up.
#[derive(Debug, Clone)]
pub(super) enum Expect {
    /// Nothing (after a delete).
    Empty,
    /// Exactly this object, at this resource version or newer.
    One {
        /// `metadata.namespace` (`None` for cluster-scoped objects).
        namespace: Option<String>,
        /// `metadata.name`.
        name: String,
        /// The resource version the caller saw last.
        resource_version: u128,
    },
}

struct State<K> {
    synced: bool,
    cache: BTreeMap<String, K>,
    relist: Option<BTreeMap<String, K>>,
    events: Vec<Recorded>,
    last_error: Option<String>,
}

impl<K: Resource + Clone> State<K> {
    fn record(&mut self, kind: EventType, old: Option<&K>, new: Option<&K>) {
        let ids: Vec<String> = [old, new].into_iter().flatten().map(object_id).collect();
        let id = match ids.as_slice() {
            [a, b] if a != b => format!("{a}; {b}"),
            [a, ..] => a.clone(),
            [] => String::new(),
        };
        let resource_versions =
            [old, new].into_iter().flatten().map(|o| o.resource_version().unwrap_or_default()).collect();
        self.events.push(Recorded { kind, id, resource_versions });
    }

    fn apply(&mut self, event: watcher::Event<K>) {
        match event {
            watcher::Event::Init => self.relist = Some(BTreeMap::new()),
            watcher::Event::InitApply(obj) => {
                self.relist.get_or_insert_default().insert(cache_key(&obj), obj);
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let old = std::mem::take(&mut self.cache);
                for (key, obj) in &listed {
                    match old.get(key) {
                        None => self.record(EventType::Add, None, Some(obj)),
                        Some(before) if before.resource_version() != obj.resource_version() => {
                            self.record(EventType::Update, Some(before), Some(obj));
                        }
                        Some(_) => {}
                    }
                }
                for (key, obj) in &old {
                    if !listed.contains_key(key) {
                        self.record(EventType::Delete, Some(obj), None);
                    }
                }
                self.cache = listed;
                self.synced = true;
                self.last_error = None;
            }
            watcher::Event::Apply(obj) => {
                match self.cache.insert(cache_key(&obj), obj.clone()) {
                    Some(before) => self.record(EventType::Update, Some(&before), Some(&obj)),
                    None => self.record(EventType::Add, None, Some(&obj)),
                }
                self.last_error = None;
            }
            watcher::Event::Delete(obj) => {
                self.cache.remove(&cache_key(&obj));
                self.record(EventType::Delete, Some(&obj), None);
                self.last_error = None;
            }
        }
    }

    fn matches(&self, expect: &Expect) -> bool {
        match expect {
            Expect::Empty => self.cache.is_empty(),
            Expect::One { namespace, name, resource_version } => {
                let mut objects = self.cache.values();
                let (Some(obj), None) = (objects.next(), objects.next()) else { return false };
                let meta = obj.meta();
                meta.name.as_deref() == Some(name.as_str())
                    && meta.namespace.as_deref().filter(|ns| !ns.is_empty()) == namespace.as_deref()
                    && meta
                        .resource_version
                        .as_deref()
                        .and_then(|rv| parse_resource_version(rv).ok())
                        .is_some_and(|rv| rv >= *resource_version)
            }
        }
    }

    fn describe_cache(&self) -> String {
        if self.cache.is_empty() {
            return "nothing".to_owned();
        }
        self.cache
            .values()
            .map(|o| {
                format!("{} at resourceVersion {}", object_id(o), o.resource_version().unwrap_or_default())
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn describe_error(&self) -> String {
        self.last_error.as_deref().map(|e| format!("; last watch error: {e}")).unwrap_or_default()
    }
}

/// A running, label-filtered watch with its cache and recorded events. The
/// watch stops when the recorder is dropped.
pub(super) struct Recorder<K> {
    what: String,
    state: Arc<watch::Sender<State<K>>>,
    task: JoinHandle<()>,
    last_resource_version: Option<u128>,
}

impl<K> Drop for Recorder<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Recorder<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts watching `api` for objects with `label_selector`; `what` names
    /// the watch in messages ("cluster-wide watch of resourceclaims").
    pub(super) fn start(api: Api<K>, label_selector: &str, what: String) -> Self {
        let state = Arc::new(watch::Sender::new(State {
            synced: false,
            cache: BTreeMap::new(),
            relist: None,
            events: Vec::new(),
            last_error: None,
        }));
        let config = watcher::Config::default().labels(label_selector);
        let task_state = Arc::clone(&state);
        let task_what = what.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
            while let Some(item) = stream.next().await {
                match item {
                    Ok(event) => task_state.send_modify(|s| s.apply(event)),
                    Err(err) => {
                        tracing::warn!("{task_what}: {err}; retrying");
                        task_state.send_modify(|s| s.last_error = Some(err.to_string()));
                    }
                }
            }
        });
        Self { what, state, task, last_resource_version: None }
    }

    /// Waits until the initial list is done.
    pub(super) async fn wait_synced(&self, timeout: Duration) -> anyhow::Result<()> {
        let mut rx = self.state.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|s| s.synced)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => bail!("{}: the watch task ended", self.what),
            Err(_) => {
                bail!(
                    "{}: the initial list did not complete within {timeout:?}{}; is the API server healthy?",
                    self.what,
                    self.state.borrow().describe_error()
                )
            }
        }
    }

    /// Waits until the cache holds what `expect` says.
    pub(super) async fn wait_cache(
        &self,
        expect: &Expect,
        after: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let mut rx = self.state.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|s| s.matches(expect))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => bail!("{}: the watch task ended", self.what),
            Err(_) => {
                let state = self.state.borrow();
                bail!(
                    "{}: after {after}, waited {timeout:?} for the cache to hold {}, it holds {}{}",
                    self.what,
                    describe_expect(expect),
                    state.describe_cache(),
                    state.describe_error()
                )
            }
        }
    }

    /// Waits until the events recorded since the last [`Recorder::take_events`]
    /// match `pattern` (over [`types`]) and all concern the object `id`.
    pub(super) async fn wait_events(
        &self,
        pattern: &str,
        id: &str,
        after: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let re = Regex::new(pattern).with_context(|| format!("event pattern {pattern:?}"))?;
        let fits = |events: &[Recorded]| re.is_match(&types(events)) && events.iter().all(|e| e.id == id);
        let mut rx = self.state.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|s| fits(&s.events))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => bail!("{}: the watch task ended", self.what),
            Err(_) => {
                let state = self.state.borrow();
                bail!(
                    "{}: after {after}, waited {timeout:?} for events matching {pattern:?}, all about {id}; got {:?}: {}{}",
                    self.what,
                    types(&state.events),
                    describe_events(&state.events),
                    state.describe_error()
                )
            }
        }
    }

    /// Takes the recorded events and checks that every resource version in
    /// them is valid and none is smaller than the one before (across calls).
    pub(super) fn take_events(&mut self, after: &str) -> anyhow::Result<Vec<Recorded>> {
        let mut events = Vec::new();
        self.state.send_modify(|s| events = std::mem::take(&mut s.events));
        for event in &events {
            for rv in &event.resource_versions {
                let next = parse_resource_version(rv).with_context(|| {
                    format!("{}: after {after}: {:?} event of {}", self.what, event.kind, event.id)
                })?;
                if let Some(previous) = self.last_resource_version
                    && next < previous
                {
                    bail!(
                        "{}: after {after}: resourceVersion {next} in {:?} event of {} is smaller than the previous {previous}",
                        self.what,
                        event.kind,
                        event.id
                    );
                }
                self.last_resource_version = Some(next);
            }
        }
        Ok(events)
    }
}

fn describe_expect(expect: &Expect) -> String {
    match expect {
        Expect::Empty => "nothing".to_owned(),
        Expect::One { namespace: Some(ns), name, resource_version } => {
            format!("exactly {ns}/{name} at resourceVersion {resource_version} or newer")
        }
        Expect::One { namespace: None, name, resource_version } => {
            format!("exactly {name} at resourceVersion {resource_version} or newer")
        }
    }
}

fn describe_events(events: &[Recorded]) -> String {
    if events.is_empty() {
        return "no events".to_owned();
    }
    events
        .iter()
        .map(|e| format!("{} {} ({})", e.kind.as_str(), e.id, e.resource_versions.join(" -> ")))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::DeviceClass;

    use super::*;

    fn class(name: &str, uid: &str, rv: &str) -> DeviceClass {
        let mut c = DeviceClass::default();
        c.metadata.name = Some(name.to_owned());
        c.metadata.uid = Some(uid.to_owned());
        c.metadata.resource_version = Some(rv.to_owned());
        c
    }

    fn state() -> State<DeviceClass> {
        State { synced: false, cache: BTreeMap::new(), relist: None, events: Vec::new(), last_error: None }
    }

    #[test]
    fn records_informer_style_events() {
        let mut s = state();
        s.apply(watcher::Event::Init);
        s.apply(watcher::Event::InitDone);
        assert!(s.synced);
        assert_eq!(types(&s.events), "");
        s.apply(watcher::Event::Apply(class("a", "u1", "5")));
        s.apply(watcher::Event::Apply(class("a", "u1", "6")));
        assert!(s.matches(&Expect::One { namespace: None, name: "a".into(), resource_version: 6 }));
        assert!(!s.matches(&Expect::One { namespace: None, name: "a".into(), resource_version: 7 }));
        assert!(!s.matches(&Expect::Empty));
        s.apply(watcher::Event::Delete(class("a", "u1", "7")));
        assert!(s.matches(&Expect::Empty));
        assert_eq!(types(&s.events), "add,update,delete,");
        assert!(s.events.iter().all(|e| e.id == "a, u1"), "{:?}", s.events);
        assert_eq!(s.events[1].resource_versions, ["5", "6"]);
    }

    #[test]
    fn relists_are_diffed_against_the_cache() {
        let mut s = state();
        s.apply(watcher::Event::Apply(class("a", "u1", "5")));
        s.apply(watcher::Event::Apply(class("b", "u2", "6")));
        s.events.clear();
        s.apply(watcher::Event::Init);
        s.apply(watcher::Event::InitApply(class("a", "u1", "5")));
        s.apply(watcher::Event::InitApply(class("c", "u3", "9")));
        s.apply(watcher::Event::InitDone);
        assert_eq!(types(&s.events), "add,delete,");
        assert_eq!(s.events[0].id, "c, u3");
        assert_eq!(s.events[1].id, "b, u2");
    }

    #[test]
    fn resource_versions_must_be_decimal_integers() {
        assert_eq!(parse_resource_version("123").ok(), Some(123));
        assert!(parse_resource_version("").is_err());
        assert!(parse_resource_version("-1").is_err());
        assert!(parse_resource_version("+1").is_err());
        assert!(parse_resource_version("12a").is_err());
        assert!(parse_resource_version(&"9".repeat(40)).is_err());
    }
}
