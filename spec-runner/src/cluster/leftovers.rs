//! Leftovers of runs that are gone: objects labelled [`RUN_LABEL`] whose run's Lease expired or
//! no longer exists, or whose Lease's holder process on this machine is gone (see [`crate::cluster::run_identity`]). A run looks for them before its specs start
//! and removes them (`--keep-leftovers` only reports); `dra-e2e cleanup` does the same on demand.
//!
//! Objects of a live run (its Lease renewed within its duration, its holder process not known to
//! be dead: see [`crate::cluster::holder`]) are never touched, nor objects without the label
//! (older builds, other people). The objects are listed before the Leases: a
//! run creates its Lease before any object, so a run seen through one of its objects has its
//! Lease listed too, and a run that starts meanwhile is never taken for gone.
//!
//! Every resource the API server serves (aggregated discovery) is listed by the label, so new
//! kinds of objects need no change here. Removal order, and why:
//! 1. the run's namespaces (background deletion: from now on nothing new starts in them);
//! 2. every pod in those namespaces, and the run's pods elsewhere, force-deleted (grace period 0):
//!    a pod with a claim of a driver that is gone cannot be unprepared, so the kubelet would hold
//!    it (and with it its namespace) for ever; forcing only removes it from the API, the kubelet
//!    still stops its containers;
//! 3. the run's other namespaced objects outside its namespaces;
//! 4. cluster-scoped objects, users before what they use: DeviceTaintRules,
//!    ValidatingAdmissionPolicyBindings, ValidatingAdmissionPolicies, ClusterRoleBindings,
//!    ClusterRoles, ResourceSlices, DeviceClasses, then any other kind;
//! 5. the run's Lease, last, so that a removal cut short is found again by the next run;
//! 6. then it waits (up to a timeout) until the namespaces are gone (their claims lose their
//!    finalizers once their pods are gone) and says what still holds one up.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    time::Duration,
};

use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Namespace, core::v1::Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams},
    discovery::{Discovery, Scope, verbs},
};

use crate::cluster::{
    holder::{HOLDER_ANNOTATION, Holder, start_of},
    run_identity::{LEASE_NAMESPACE, RUN_INFO_ANNOTATION, RUN_LABEL, expired_for},
};

/// Looking for or removing leftovers failed.
#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// The call.
        what: String,
        /// Its error.
        #[source]
        source: kube::Error,
    },
}

/// One object of a gone run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// Its kind's resource.
    pub resource: ApiResource,
    /// Its namespace (namespaced kinds).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl Leftover {
    /// `Kind namespace/name`.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.resource.kind, self.name),
            None => format!("{} {}", self.resource.kind, self.name),
        }
    }

    fn order(&self) -> usize {
        const ORDER: [&str; 9] = [
            "Namespace",
            "Pod",
            "DeviceTaintRule",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ClusterRoleBinding",
            "ClusterRole",
            "ResourceSlice",
            "DeviceClass",
        ];
        match self.resource.kind.as_str() {
            "Lease" => ORDER.len() + 2,
            kind => ORDER.iter().position(|k| *k == kind).unwrap_or(if self.namespace.is_some() {
                2
            } else {
                ORDER.len() + 1
            }),
        }
    }
}

/// The objects of one gone run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoneRun {
    /// Its run id.
    pub run_id: String,
    /// Why it counts as gone: "Lease expired 40s ago (pid 7 on host h, ...)" or "no Lease".
    pub why: String,
    /// Its objects (objects inside its namespaces are only counted: they go with the namespace).
    pub objects: Vec<Leftover>,
    /// How many of its objects are inside its namespaces.
    pub inside_namespaces: usize,
}

/// What [`find`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Gone runs with objects, oldest run id first.
    pub runs: Vec<GoneRun>,
    /// Live runs other than this one that have objects (never touched), by run id.
    pub live_runs: BTreeSet<String>,
}

impl Leftovers {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// A report: each gone run and its objects.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for run in &self.runs {
            let _ = writeln!(out, "  run {} ({}): {} objects", run.run_id, run.why, run.objects.len());
            for object in &run.objects {
                let _ = writeln!(out, "    {}", object.describe());
            }
            if run.inside_namespaces > 0 {
                let _ = writeln!(
                    out,
                    "    (and {} labelled objects inside those namespaces)",
                    run.inside_namespaces
                );
            }
        }
        out
    }
}

/// Finds the objects of gone runs (never of `own_run`, nor of any run with a live Lease).
pub async fn find(client: &Client, own_run: Option<&str>) -> Result<Leftovers, LeftoverError> {
    let kube = |what: &str| {
        let what = what.to_owned();
        move |source| LeftoverError::Kube { what, source }
    };
    let discovery = Discovery::new(client.clone()).run_aggregated().await.map_err(kube("API discovery"))?;
    let labelled = ListParams::default().labels(RUN_LABEL);
    let mut by_run: BTreeMap<String, Vec<Leftover>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) || !caps.supports_operation(verbs::DELETE) {
                continue;
            }
            let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
            let list = match api.list_metadata(&labelled).await {
                Ok(list) => list,
                // Kinds that cannot be listed by us (or went away since discovery) hold nothing of ours.
                Err(kube::Error::Api(s)) if (403..=405).contains(&s.code) => continue,
                Err(source) => {
                    return Err(LeftoverError::Kube { what: format!("list {}", resource.plural), source });
                }
            };
            for object in list.items {
                let Some(run) = object.labels().get(RUN_LABEL).cloned() else { continue };
                let namespace =
                    (caps.scope == Scope::Namespaced).then(|| object.namespace().unwrap_or_default());
                // The same objects may be served under two groups (events): count them once.
                if !seen.insert((resource.kind.clone(), namespace.clone(), object.name_any())) {
                    continue;
                }
                by_run.entry(run).or_default().push(Leftover {
                    namespace,
                    name: object.name_any(),
                    resource: resource.clone(),
                });
            }
        }
    }
    // After the objects (see the module docs).
    let leases = Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
        .list(&labelled)
        .await
        .map_err(kube("list the runs' Leases"))?;
    let leases: BTreeMap<String, Lease> = leases
        .items
        .into_iter()
        .filter_map(|lease| Some((lease.labels().get(RUN_LABEL)?.clone(), lease)))
        .collect();
    let now = Timestamp::now();
    let here = Holder::current();
    let mut found = Leftovers::default();
    for (run_id, objects) in by_run {
        if Some(run_id.as_str()) == own_run {
            continue;
        }
        let why = match leases.get(&run_id) {
            None => "no Lease".to_owned(),
            Some(lease) => match expired_for(lease, now) {
                None => {
                    let info = lease.annotations().get(RUN_INFO_ANNOTATION).cloned().unwrap_or_default();
                    let dead = here.as_ref().and_then(|here| {
                        let holder = Holder::parse(lease.annotations().get(HOLDER_ANNOTATION)?)?;
                        holder.dead_reason(here, start_of)
                    });
                    match dead {
                        Some(reason) => format!("{reason}, its Lease not expired yet; {info}"),
                        None => {
                            found.live_runs.insert(run_id);
                            continue;
                        }
                    }
                }
                Some(ago) => {
                    let info = lease.annotations().get(RUN_INFO_ANNOTATION).cloned().unwrap_or_default();
                    format!("Lease expired {}s ago; {info}", ago.as_secs())
                }
            },
        };
        found.runs.push(gone_run(run_id, why, objects));
    }
    Ok(found)
}

/// Groups one run's objects: what is inside its namespaces is only counted; the rest in
/// removal order.
fn gone_run(run_id: String, why: String, objects: Vec<Leftover>) -> GoneRun {
    let namespaces: BTreeSet<String> =
        objects.iter().filter(|o| o.resource.kind == "Namespace").map(|o| o.name.clone()).collect();
    let (inside, mut objects): (Vec<_>, Vec<_>) =
        objects.into_iter().partition(|o| o.namespace.as_ref().is_some_and(|ns| namespaces.contains(ns)));
    objects.sort_by_key(|o| (o.order(), o.describe()));
    GoneRun { run_id, why, objects, inside_namespaces: inside.len() }
}

/// Removes `leftovers` (see the module docs for the order) and waits up to `timeout` for their
/// namespaces to be gone. Returns what could not be removed (empty: all gone).
pub async fn remove(client: &Client, leftovers: &Leftovers, timeout: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    let background = DeleteParams::background();
    let force = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::background() };
    let mut namespaces = Vec::new();
    for run in &leftovers.runs {
        for object in &run.objects {
            let api = match &object.namespace {
                Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &object.resource),
                None => Api::<DynamicObject>::all_with(client.clone(), &object.resource),
            };
            let pod = object.resource.kind == "Pod" && object.resource.group.is_empty();
            match api.delete(&object.name, if pod { &force } else { &background }).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => problems.push(format!("delete {}: {e}", object.describe())),
            }
            if object.resource.kind == "Namespace" && object.resource.group.is_empty() {
                namespaces.push(object.name.clone());
                problems.extend(force_delete_pods(client, &object.name, &force).await);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    for namespace in namespaces {
        if let Err(e) = wait_gone(client, &namespace, deadline, &force).await {
            problems.push(e);
        }
    }
    problems
}

/// Force-deletes every pod in `namespace` (a gone run's namespace: all its pods are the run's).
async fn force_delete_pods(client: &Client, namespace: &str, force: &DeleteParams) -> Vec<String> {
    let api = Api::<Pod>::namespaced(client.clone(), namespace);
    let pods = match api.list_metadata(&ListParams::default()).await {
        Ok(pods) => pods.items,
        Err(e) => return vec![format!("list the pods in namespace {namespace}: {e}")],
    };
    let mut problems = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        match api.delete(&name, force).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => problems.push(format!("force-delete pod {namespace}/{name}: {e}")),
        }
    }
    problems
}

/// Waits until `namespace` is gone (force-deleting pods that show up in it meanwhile, as pods
/// being deleted gracefully do); the error says what holds it up.
async fn wait_gone(
    client: &Client,
    namespace: &str,
    deadline: tokio::time::Instant,
    force: &DeleteParams,
) -> Result<(), String> {
    let api = Api::<Namespace>::all(client.clone());
    let _waiting = crate::run::monitor::waiting(format!("leftover namespace {namespace} to be gone"), None);
    loop {
        let ns = match api.get_opt(namespace).await {
            Ok(None) => return Ok(()),
            Ok(Some(ns)) => ns,
            Err(e) => return Err(format!("get namespace {namespace}: {e}")),
        };
        if tokio::time::Instant::now() >= deadline {
            let holds: Vec<String> = ns
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.status == "True")
                .filter_map(|c| c.message)
                .collect();
            return Err(format!("namespace {namespace} is not gone yet ({})", holds.join("; ")));
        }
        let _ = force_delete_pods(client, namespace, force).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn object(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> Leftover {
        let resource = ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: if group.is_empty() { "v1".into() } else { format!("{group}/v1") },
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
        };
        Leftover { resource, namespace: namespace.map(str::to_owned), name: name.into() }
    }

    #[test]
    fn a_gone_run_is_removed_users_first_and_its_lease_last() {
        let objects = vec![
            object("coordination.k8s.io", "Lease", Some("kube-system"), "dra-e2e-run-r"),
            object("resource.k8s.io", "DeviceClass", None, "class"),
            object("rbac.authorization.k8s.io", "ClusterRole", None, "role"),
            object("", "Pod", Some("dra-a"), "inside"),
            object("", "ConfigMap", Some("other"), "outside"),
            object("rbac.authorization.k8s.io", "ClusterRoleBinding", None, "binding"),
            object("", "Namespace", None, "dra-a"),
            object("example.com", "Widget", None, "w"),
            object("resource.k8s.io", "ResourceSlice", None, "slice"),
        ];
        let run = gone_run("r".into(), "no Lease".into(), objects);
        let order: Vec<String> = run.objects.iter().map(Leftover::describe).collect();
        assert_eq!(
            order,
            [
                "Namespace dra-a",
                "ConfigMap other/outside",
                "ClusterRoleBinding binding",
                "ClusterRole role",
                "ResourceSlice slice",
                "DeviceClass class",
                "Widget w",
                "Lease kube-system/dra-e2e-run-r",
            ]
        );
        assert_eq!(run.inside_namespaces, 1);
        let report = Leftovers { runs: vec![run], live_runs: BTreeSet::new() }.describe();
        assert!(report.starts_with("  run r (no Lease): 8 objects\n    Namespace dra-a\n"), "{report}");
        assert!(report.ends_with("(and 1 labelled objects inside those namespaces)\n"), "{report}");
    }
}
