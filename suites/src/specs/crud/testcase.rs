//! The generic CRUD test of one API resource, step for step what upstream's
//! `TestResource` (test/e2e/framework/conformance/conformance.go) does, with
//! typed objects instead of unstructured ones:
//!
//! 1. discovery of the group version lists the resource;
//! 2. watches (cluster-wide, and in the namespace for namespaced resources),
//!    filtered by a label unique to the spec, sync and see nothing;
//! 3. create (field validation `Strict`), get, update (retried on conflicts;
//!    the resource version must grow), and for resources with status: update
//!    the status and get it through the `status` subresource;
//! 4. per spec patch (strategic merge, apply, JSON merge, JSON patch): delete,
//!    wait until gone, create again, patch; per status patch the same, with
//!    an update of the spec before patching the status;
//! 5. list with the label selector (in the namespace, and in all namespaces
//!    for namespaced resources): exactly the test object;
//! 6. delete the collection by label selector; the object must really be gone.
//!
//! After every step the watches must catch up (their cache holds exactly the
//! object, or nothing after deletes), the events they saw since the previous
//! step must fit the step (e.g. `^add,(update,)*$` after a create, all about
//! the object) and resource versions must never decrease. Unlike upstream,
//! which only compares names when content verification is off (as it is for
//! the DRA types), every returned object is also checked for the field the
//! step set: the case's `check_*` functions.

use std::{fmt::Debug, time::Duration};

use anyhow::{Context as _, bail, ensure};
use harness::framework::Ctx;
use k8s_openapi::serde::{Serialize, de::DeserializeOwned};
use kube::{
    Api, Resource, ResourceExt as _,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{conditions, wait::await_condition},
};
use serde_json::Value;

use super::recorder::{Expect, Recorder, object_id, parse_resource_version};

/// The label every test object carries, for the watches, List and DeleteCollection.
pub(super) const TEST_LABEL: &str = "e2e-test.kubernetes.io";

/// How long the watches may take to catch up after a step.
const CACHE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long event delivery may lag behind the cache (upstream: 5 s).
const EVENTS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a deleted object may take to disappear (upstream's ensureNotFound: 30 s).
const GONE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long updates are retried on conflicts and throttling.
const RETRY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a single API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A patch type upstream's `ResourceTestcase` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PatchType {
    /// `application/strategic-merge-patch+json`.
    StrategicMerge,
    /// Server-side apply, field manager `test-apply`, forced.
    Apply,
    /// `application/merge-patch+json` (RFC 7386).
    JsonMerge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
}

impl PatchType {
    fn name(self) -> &'static str {
        match self {
            Self::StrategicMerge => "application/strategic-merge-patch+json",
            Self::Apply => "application/apply-patch+yaml",
            Self::JsonMerge => "application/merge-patch+json",
            Self::Json => "application/json-patch+json",
        }
    }
}

/// One patch: its type and its JSON text.
#[derive(Debug, Clone)]
pub(super) struct PatchData {
    /// The patch type.
    pub(super) kind: PatchType,
    /// JSON text; for all but JSON patches, `apiVersion`, `kind`, name,
    /// namespace and UID of the object are added before sending.
    pub(super) data: String,
}

impl PatchData {
    /// A patch of this type with this JSON text.
    pub(super) fn new(kind: PatchType, data: impl Into<String>) -> Self {
        Self { kind, data: data.into() }
    }
}

/// A check of a returned object; says what is wrong.
pub(super) type Check<K> = Box<dyn Fn(&K) -> anyhow::Result<()> + Send + Sync>;
/// A modification of an object.
pub(super) type Modify<K> = Box<dyn Fn(&mut K) + Send + Sync>;

/// The status part of a test case.
pub(super) struct StatusCase<K> {
    /// Adds a status to the object (after the spec update).
    pub(super) update: Modify<K>,
    /// Checks that the object carries that status.
    pub(super) check: Check<K>,
    /// Patches of the `status` subresource with the same effect.
    pub(super) patches: Vec<PatchData>,
}

/// What to test for one resource (upstream's `ResourceTestcase`).
pub(super) struct ResourceTestcase<K> {
    /// The plural resource name, as discovery lists it.
    pub(super) plural: &'static str,
    /// The object to create, without name, namespace and test label.
    pub(super) initial: K,
    /// Checks that a created object carries the initial content.
    pub(super) check_initial: Check<K>,
    /// Changes the object, ideally the spec (labels for immutable specs).
    pub(super) update_spec: Modify<K>,
    /// Checks that an object carries the change of `update_spec`.
    pub(super) check_updated: Check<K>,
    /// Patches of the object with the same effect as `update_spec`.
    pub(super) spec_patches: Vec<PatchData>,
    /// Status tests, for resources with a `status` subresource.
    pub(super) status: Option<StatusCase<K>>,
}

/// Whether discovery of `group_version` lists `plural`.
pub(super) async fn discovery_lists(ctx: &Ctx, group_version: &str, plural: &str) -> anyhow::Result<bool> {
    let resources = within(CALL_TIMEOUT, "discovery", ctx.client().list_api_group_resources(group_version))
        .await?
        .with_context(|| format!("get /apis/{group_version}"))?;
    Ok(resources.resources.iter().any(|r| r.name == plural))
}

/// Runs the CRUD test. `api` is the API for the object (namespaced to the
/// spec's namespace or cluster-wide), `all` the API across all namespaces
/// (the same as `api` for cluster-scoped resources).
pub(super) async fn test_resource<K>(
    ctx: &Ctx,
    api: Api<K>,
    all: Api<K>,
    namespaced: bool,
    tc: ResourceTestcase<K>,
) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let group_version = K::api_version(&()).into_owned();
    let kind = K::kind(&()).into_owned();
    let plural = tc.plural;
    let resource_type =
        format!("{} resource {plural:?}", if namespaced { "namespaced" } else { "cluster-scoped" });
    let label_value = ctx.namespace().to_owned();
    let selector = format!("{TEST_LABEL}={label_value}");

    // The desired object: upstream names namespaced objects "test" and makes
    // cluster-scoped names unique; here with the spec's suffix.
    let mut desired = tc.initial.clone();
    let name = if namespaced { "test".to_owned() } else { ctx.unique_name("test") };
    desired.meta_mut().name = Some(name.clone());
    desired.meta_mut().namespace = namespaced.then(|| ctx.namespace().to_owned());
    desired.labels_mut().insert(TEST_LABEL.to_owned(), label_value.clone());
    let namespace = desired.meta().namespace.clone();

    tracing::info!("Get {group_version}");
    ensure!(
        discovery_lists(ctx, &group_version, plural).await?,
        "API {group_version} does not include {plural}; the cluster does not serve {kind}"
    );

    // Watches, cluster-wide and in the namespace.
    let mut recorders = vec![Recorder::start(
        all.clone(),
        &selector,
        format!("cluster-wide watch of {plural} with {selector}"),
    )];
    if namespaced {
        recorders.push(Recorder::start(
            api.clone(),
            &selector,
            format!("watch of {plural} in namespace {} with {selector}", ctx.namespace()),
        ));
    }
    for r in &mut recorders {
        r.wait_synced(CACHE_TIMEOUT).await?;
        r.wait_cache(&Expect::Empty, "the initial list", CACHE_TIMEOUT).await?;
        let events = r.take_events("the initial list")?;
        ensure!(events.is_empty(), "no events expected from the initial list, got {events:?}");
    }
    let mut t = Steps { api: &api, recorders, name: &name, namespace, resource_type: &resource_type };

    // Create. The cleanup is registered first, so that the object cannot be
    // left behind even if the answer to the create call gets lost.
    ctx.delete_at_cleanup(api.clone(), name.clone());
    tracing::info!("Creating {kind} {name}");
    let mut existing = t.create_strict(&desired).await?;
    (tc.check_initial)(&existing).context("created object")?;
    t.verify("create", Some(&existing), &existing, "^add,(update,)*$").await?;
    let created_rv = parse_resource_version(&existing.resource_version().unwrap_or_default())?;

    // Get.
    tracing::info!("Getting {kind} {name}");
    existing = t.get().await?;
    (tc.check_initial)(&existing).context("object returned by get")?;
    t.verify("get", Some(&existing), &existing, "^(update,)*$").await?;

    // Update.
    existing = t.update(existing, &tc.update_spec, false).await?;
    (tc.check_updated)(&existing).context("object returned by update")?;
    t.verify("update", Some(&existing), &existing, "^(update,)+$").await?;
    let updated_rv = parse_resource_version(&existing.resource_version().unwrap_or_default())?;
    ensure!(
        updated_rv > created_rv,
        "resourceVersion should have increased during update and didn't (before: {created_rv}, after: {updated_rv})"
    );

    // Status update, then read it through the status subresource.
    let mut has_status = false;
    if let Some(status) = &tc.status {
        existing = t.update(existing, &status.update, true).await?;
        (status.check)(&existing).context("object returned by the status update")?;
        (tc.check_updated)(&existing).context("object returned by the status update")?;
        t.verify("update status", Some(&existing), &existing, "^(update,)+$").await?;

        tracing::info!("Getting {kind} {name} status");
        existing = within(CALL_TIMEOUT, "get status", api.get_status(&name))
            .await?
            .with_context(|| format!("get {resource_type} {name} status"))?;
        (status.check)(&existing).context("object returned by get status")?;
        t.verify("get status", Some(&existing), &existing, "^(update,)*$").await?;
        has_status = true;
    }

    // Spec patches, each on a fresh object.
    for patch in &tc.spec_patches {
        existing = t.recreate(&existing, &desired).await?;
        let what = format!("patch {}", patch.kind.name());
        existing = t.patch(&existing, patch, false).await?;
        (tc.check_updated)(&existing).with_context(|| format!("object returned by {what}"))?;
        t.verify(&what, Some(&existing), &existing, "^add,(update,)+$").await?;
        has_status = false;
    }

    // Status patches, each on a fresh object with the updated spec.
    if let Some(status) = &tc.status {
        for patch in &status.patches {
            existing = t.recreate(&existing, &desired).await?;
            existing = t.update(existing, &tc.update_spec, false).await?;
            let what = format!("patch {} status", patch.kind.name());
            existing = t.patch(&existing, patch, true).await?;
            (status.check)(&existing).with_context(|| format!("object returned by {what}"))?;
            (tc.check_updated)(&existing).with_context(|| format!("object returned by {what}"))?;
            t.verify(&what, Some(&existing), &existing, "^add,(update,)+$").await?;
            has_status = true;
        }
    }

    // List by label, in the namespace (or cluster-wide) ...
    tracing::info!("Listing {plural} with label selector {selector}");
    let lp = ListParams::default().labels(&selector);
    let items = within(CALL_TIMEOUT, "list", api.list(&lp))
        .await?
        .with_context(|| format!("list {resource_type}"))?
        .items;
    let listed = t.only_item(items, "list")?;
    (tc.check_updated)(&listed).context("listed object")?;
    if let (true, Some(status)) = (has_status, &tc.status) {
        (status.check)(&listed).context("listed object")?;
    }
    t.verify("list", Some(&listed), &existing, "^(update,)*$").await?;

    // ... and in all namespaces.
    if namespaced {
        tracing::info!("Listing {plural} in all namespaces with label selector {selector}");
        let items = within(CALL_TIMEOUT, "list in all namespaces", all.list(&lp))
            .await?
            .with_context(|| format!("list {resource_type} in all namespaces"))?
            .items;
        let listed = t.only_item(items, "list in all namespaces")?;
        (tc.check_updated)(&listed).context("object listed in all namespaces")?;
        t.verify("list all namespaces", Some(&listed), &existing, "^(update,)*$").await?;
    }

    // Delete the collection and make sure the object is really gone.
    tracing::info!("Deleting the collection of {plural} with label selector {selector}");
    within(CALL_TIMEOUT, "delete collection", api.delete_collection(&DeleteParams::default(), &lp))
        .await?
        .with_context(|| format!("delete collection of {resource_type}"))?;
    t.ensure_gone(&existing).await?;
    t.verify("delete collection", None, &existing, "^(update,)*delete,$").await?;
    Ok(())
}

/// The steps of one test, sharing the API, the watches and the object's identity.
struct Steps<'a, K> {
    api: &'a Api<K>,
    recorders: Vec<Recorder<K>>,
    name: &'a str,
    namespace: Option<String>,
    resource_type: &'a str,
}

impl<K> Steps<'_, K>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Checks a returned object's identity, then waits until every watch has
    /// caught up and its events since the previous step match `pattern` and
    /// concern `event_object`.
    async fn verify(
        &mut self,
        what: &str,
        returned: Option<&K>,
        event_object: &K,
        pattern: &str,
    ) -> anyhow::Result<()> {
        let expect = match returned {
            None => Expect::Empty,
            Some(obj) => {
                let meta = obj.meta();
                ensure!(
                    meta.name.as_deref() == Some(self.name),
                    "{what}: name in returned object is {:?}, expected {:?}",
                    meta.name,
                    self.name
                );
                ensure!(
                    meta.namespace.as_deref().filter(|ns| !ns.is_empty()) == self.namespace.as_deref(),
                    "{what}: namespace in returned object is {:?}, expected {:?}",
                    meta.namespace,
                    self.namespace
                );
                let rv = obj.resource_version().unwrap_or_default();
                let resource_version =
                    parse_resource_version(&rv).with_context(|| format!("{what}: returned object"))?;
                Expect::One {
                    namespace: self.namespace.clone(),
                    name: self.name.to_owned(),
                    resource_version,
                }
            }
        };
        let id = object_id(event_object);
        for r in &mut self.recorders {
            r.wait_cache(&expect, what, CACHE_TIMEOUT).await?;
            r.wait_events(pattern, &id, what, EVENTS_TIMEOUT).await?;
            let events = r.take_events(what)?;
            tracing::debug!("{what}: events {}", super::recorder::types(&events));
        }
        Ok(())
    }

    /// Creates with `fieldValidation=Strict`, which kube's `PostParams` cannot
    /// express.
    async fn create_strict(&self, obj: &K) -> anyhow::Result<K> {
        let path = K::url_path(&(), self.namespace.as_deref());
        let body = serde_json::to_vec(obj).context("encode the object")?;
        let mut request = kube::core::Request::new(path)
            .create(&PostParams::default(), body)
            .context("build the create request")?;
        let uri = request.uri().to_string();
        let separator = if uri.ends_with('?') {
            ""
        } else if uri.contains('?') {
            "&"
        } else {
            "?"
        };
        *request.uri_mut() =
            format!("{uri}{separator}fieldValidation=Strict").parse().context("create URI")?;
        within(CALL_TIMEOUT, "create", self.api.clone().into_client().request::<K>(request))
            .await?
            .with_context(|| format!("create initial {}", self.resource_type))
    }

    async fn get(&self) -> anyhow::Result<K> {
        within(CALL_TIMEOUT, "get", self.api.get(self.name))
            .await?
            .with_context(|| format!("get {} {}", self.resource_type, self.name))
    }

    /// Updates the object (or, with `status`, its status) with `modify`. On
    /// conflicts gets the object again and retries at once, on throttling or
    /// a busy server after a pause; gives up after [`RETRY_TIMEOUT`].
    async fn update(&self, mut existing: K, modify: &Modify<K>, status: bool) -> anyhow::Result<K> {
        let what = if status { "update status" } else { "update" };
        let deadline = tokio::time::Instant::now() + RETRY_TIMEOUT;
        loop {
            let mut object = existing.clone();
            modify(&mut object);
            tracing::info!("{what} of {}", self.name);
            let pp = PostParams::default();
            let result = if status {
                within(CALL_TIMEOUT, what, self.api.replace_status(self.name, &pp, &object)).await?
            } else {
                within(CALL_TIMEOUT, what, self.api.replace(self.name, &pp, &object)).await?
            };
            let err = match result {
                Ok(updated) => return Ok(updated),
                Err(err) => err,
            };
            let conflict = is_conflict(&err);
            if !conflict && !is_transient(&err) {
                return Err(err).with_context(|| format!("{what} {}", self.resource_type));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(err).with_context(|| {
                    format!("{what} {}: still failing after {RETRY_TIMEOUT:?}", self.resource_type)
                });
            }
            tracing::info!("{what} {}: {err}; retrying", self.resource_type);
            if conflict {
                existing = if status {
                    within(CALL_TIMEOUT, "get status", self.api.get_status(self.name))
                        .await?
                        .with_context(|| format!("get existing {} status", self.resource_type))?
                } else {
                    self.get().await?
                };
            } else {
                // Throttled or busy: there is no condition to wait for, only time.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// Deletes the object, waits until it is gone and the watches saw it go,
    /// then creates it again.
    async fn recreate(&mut self, existing: &K, desired: &K) -> anyhow::Result<K> {
        tracing::info!("Deleting {}", self.name);
        within(CALL_TIMEOUT, "delete", self.api.delete(self.name, &DeleteParams::default()))
            .await?
            .with_context(|| format!("delete updated {}", self.resource_type))?;
        self.ensure_gone(existing).await?;
        // Checked here, or there is no guarantee that the delete event is seen.
        self.verify("delete", None, existing, "^(update,)*delete,$").await?;
        tracing::info!("Creating {} again", self.name);
        within(CALL_TIMEOUT, "create again", self.api.create(&PostParams::default(), desired))
            .await?
            .with_context(|| format!("create {} again", self.resource_type))
    }

    /// Patches the object (or its status) with `fieldValidation=Strict`.
    async fn patch(&self, existing: &K, patch: &PatchData, status: bool) -> anyhow::Result<K> {
        let params = match patch.kind {
            PatchType::Apply => PatchParams::apply("test-apply").force(),
            _ => PatchParams::default(),
        }
        .validation_strict();
        let body = patch_body(existing, patch)?;
        tracing::info!(
            "Patching {}{} with {}: {}",
            self.name,
            if status { " status" } else { "" },
            patch.kind.name(),
            body
        );
        let patch_value: Patch<Value> = match patch.kind {
            PatchType::StrategicMerge => Patch::Strategic(body),
            PatchType::Apply => Patch::Apply(body),
            PatchType::JsonMerge => Patch::Merge(body),
            PatchType::Json => Patch::Json(serde_json::from_value(body).context("decode the JSON patch")?),
        };
        let call = async {
            if status {
                self.api.patch_status(self.name, &params, &patch_value).await
            } else {
                self.api.patch(self.name, &params, &patch_value).await
            }
        };
        within(CALL_TIMEOUT, "patch", call).await?.with_context(|| {
            format!(
                "patch {} {}{}",
                patch.kind.name(),
                self.resource_type,
                if status { " status" } else { "" }
            )
        })
    }

    /// Waits until the object is gone (not just marked for deletion), then
    /// checks that a GET really answers NotFound.
    async fn ensure_gone(&self, existing: &K) -> anyhow::Result<()> {
        let uid = existing.uid().unwrap_or_default();
        match tokio::time::timeout(
            GONE_TIMEOUT,
            await_condition(self.api.clone(), self.name, conditions::is_deleted(&uid)),
        )
        .await
        {
            Ok(result) => {
                result.with_context(|| {
                    format!("watch {} {} until it is gone", self.resource_type, self.name)
                })?;
            }
            Err(_) => bail!(
                "{} {} with UID {uid} was not removed within {GONE_TIMEOUT:?}; a finalizer may keep it",
                self.resource_type,
                self.name
            ),
        }
        match within(CALL_TIMEOUT, "get after delete", self.api.get(self.name)).await? {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err).context("unexpected error after GET"),
            Ok(obj) => bail!(
                "{} {} still exists after deletion: UID {:?}, resourceVersion {:?}",
                self.resource_type,
                self.name,
                obj.uid(),
                obj.resource_version()
            ),
        }
    }

    /// The only item of a list, which must be the test object.
    fn only_item(&self, items: Vec<K>, what: &str) -> anyhow::Result<K> {
        let names: Vec<String> = items.iter().map(object_id).collect();
        let mut items = items.into_iter();
        match (items.next(), items.next()) {
            (Some(item), None) => Ok(item),
            _ => bail!("{what}: should have listed exactly the test resource, got {names:?}"),
        }
    }
}

/// Builds the patch as upstream's `createPatchObject` does: the JSON text
/// plus `apiVersion`, `kind`, name, namespace and UID of the existing object
/// (the UID makes the patch fail on a replaced object). JSON patches are sent
/// as they are.
pub(super) fn patch_body<K: Resource<DynamicType = ()>>(
    existing: &K,
    patch: &PatchData,
) -> anyhow::Result<Value> {
    let mut body: Value =
        serde_json::from_str(&patch.data).with_context(|| format!("decode patch {:?}", patch.data))?;
    if patch.kind == PatchType::Json {
        return Ok(body);
    }
    let Some(object) = body.as_object_mut() else { bail!("patch {:?} is not a JSON object", patch.data) };
    object.insert("apiVersion".into(), K::api_version(&()).into_owned().into());
    object.insert("kind".into(), K::kind(&()).into_owned().into());
    let metadata = object.entry("metadata").or_insert_with(|| Value::Object(Default::default()));
    let Some(metadata) = metadata.as_object_mut() else {
        bail!("metadata in patch {:?} is not an object", patch.data)
    };
    let meta = existing.meta();
    metadata.insert("name".into(), meta.name.clone().unwrap_or_default().into());
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => {
            metadata.insert("namespace".into(), ns.into());
        }
        _ => {
            metadata.remove("namespace");
        }
    }
    metadata.insert("uid".into(), meta.uid.clone().unwrap_or_default().into());
    Ok(body)
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// Whether an error is worth retrying after a pause (throttling, server busy).
fn is_transient(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if matches!(status.code, 429 | 500 | 503 | 504))
}

/// Bounds an API call; the error says which call did not answer.
async fn within<T>(timeout: Duration, what: &str, call: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| anyhow::anyhow!("the API server did not answer the {what} call within {timeout:?}"))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
    use serde_json::json;

    use super::*;

    #[test]
    fn patches_carry_identity_like_upstream() -> anyhow::Result<()> {
        let mut claim = ResourceClaim::default();
        claim.metadata.name = Some("test".into());
        claim.metadata.namespace = Some("ns".into());
        claim.metadata.uid = Some("u1".into());
        let body =
            patch_body(&claim, &PatchData::new(PatchType::Apply, r#"{"metadata": {"labels": {"a": "b"}}}"#))?;
        assert_eq!(
            body,
            json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"labels": {"a": "b"}, "name": "test", "namespace": "ns", "uid": "u1"},
            })
        );

        let mut class = DeviceClass::default();
        class.metadata.name = Some("c".into());
        class.metadata.uid = Some("u2".into());
        let body = patch_body(&class, &PatchData::new(PatchType::StrategicMerge, r#"{"spec": {}}"#))?;
        assert_eq!(body["metadata"], json!({"name": "c", "uid": "u2"}));
        assert_eq!(body["spec"], json!({}));

        let json_patch = r#"[{"op": "add", "path": "/status/allocation", "value": {}}]"#;
        let body = patch_body(&claim, &PatchData::new(PatchType::Json, json_patch))?;
        assert_eq!(body, json!([{"op": "add", "path": "/status/allocation", "value": {}}]));
        Ok(())
    }
}
