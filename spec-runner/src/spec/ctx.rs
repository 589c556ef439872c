//! [`Ctx`]: what a spec body gets.

use std::{
    fmt::Debug,
    future::Future,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::Context as _;
use kube::{Api, Resource, api::DeleteParams};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    cluster::preflight::ClusterInfo,
    run::artifacts::ArtifactSource,
    run::cleanup::CleanupStack,
    run::phases::SetupMark,
    spec::error::{SpecError, SpecResult},
};

/// The per-spec context: admin client, the spec's own namespace, a unique
/// suffix for cluster-scoped names, cancellation and the cleanup stack.
///
/// Cheap to clone; all clones are the same spec.
///
/// ```no_run
/// # use spec_runner::{Ctx, SpecResult};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{Api, api::PostParams};
///
/// async fn body(ctx: Ctx) -> SpecResult {
///     ctx.cluster().require_nodes(1)?; // skipped, not failed, on an empty cluster
///     let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), ctx.namespace());
///     let mut cm = ConfigMap::default();
///     cm.metadata.name = Some(ctx.unique_name("settings"));
///     api.create(&PostParams::default(), &cm).await?;
///     // namespaced objects go with the namespace; cluster-scoped ones need a cleanup:
///     ctx.defer("say goodbye", async move {
///         tracing::info!("bye");
///         Ok(())
///     });
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct Ctx {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    stream_client: kube::Client,
    namespace: String,
    suffix: String,
    full_text: String,
    labels: Vec<String>,
    attempt: u32,
    cluster: Arc<ClusterInfo>,
    token: CancellationToken,
    cleanups: Arc<CleanupStack>,
    cleanup_timeout: Duration,
    sources: Mutex<Vec<Arc<dyn ArtifactSource>>>,
    artifacts_dir: PathBuf,
    deadline: Instant,
    /// Cancelled by [`Ctx::fail_now`]; the message is the spec's failure.
    fail_now: CancellationToken,
    fail_message: Mutex<Option<String>>,
    setup: Arc<SetupMark>,
    run: Arc<crate::run::shared::RunShared>,
}

tokio::task_local! {
    /// The cancellation token of the spec whose body runs in this task.
    static BODY_TOKEN: CancellationToken;
}

/// Runs `fut` (a spec's body) with `token` as the task's spec cancellation, which
/// [`current_cancellation`] finds.
pub(crate) fn with_body_token<F: Future>(
    token: CancellationToken,
    fut: F,
) -> impl Future<Output = F::Output> {
    BODY_TOKEN.scope(token, fut)
}

/// The cancellation token of the spec whose body runs in the current task (cancelled when the
/// spec times out, fails at once with [`Ctx::fail_now`], or the run is interrupted); `None`
/// outside a spec's body (its cleanups, tasks it spawned, code outside the runner). Waits watch
/// it so that a cancelled spec stops waiting at once.
pub fn current_cancellation() -> Option<CancellationToken> {
    BODY_TOKEN.try_with(CancellationToken::clone).ok()
}

/// Everything the runner knows when it creates a [`Ctx`].
pub(crate) struct CtxParts {
    pub(crate) client: kube::Client,
    pub(crate) stream_client: kube::Client,
    pub(crate) namespace: String,
    pub(crate) suffix: String,
    pub(crate) full_text: String,
    pub(crate) labels: Vec<String>,
    pub(crate) attempt: u32,
    pub(crate) cluster: Arc<ClusterInfo>,
    pub(crate) token: CancellationToken,
    pub(crate) cleanups: Arc<CleanupStack>,
    pub(crate) cleanup_timeout: Duration,
    pub(crate) artifacts_dir: PathBuf,
    pub(crate) deadline: Instant,
    pub(crate) setup: Arc<SetupMark>,
    pub(crate) run: Arc<crate::run::shared::RunShared>,
}

impl Ctx {
    pub(crate) fn new(p: CtxParts) -> Self {
        Self {
            inner: Arc::new(Inner {
                client: p.client,
                stream_client: p.stream_client,
                namespace: p.namespace,
                suffix: p.suffix,
                full_text: p.full_text,
                labels: p.labels,
                attempt: p.attempt,
                cluster: p.cluster,
                token: p.token,
                cleanups: p.cleanups,
                cleanup_timeout: p.cleanup_timeout,
                sources: Mutex::default(),
                artifacts_dir: p.artifacts_dir,
                deadline: p.deadline,
                fail_now: CancellationToken::new(),
                fail_message: Mutex::new(None),
                setup: p.setup,
                run: p.run,
            }),
        }
    }

    /// The admin client.
    pub fn client(&self) -> &kube::Client {
        &self.inner.client
    }

    /// The admin client for port-forward tunnels and exec: its connections set `TCP_NODELAY`
    /// (see [`nodelay_client`](crate::nodelay_client)).
    pub fn stream_client(&self) -> &kube::Client {
        &self.inner.stream_client
    }

    /// The spec's own namespace (created before the body runs, deleted last).
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// A random suffix unique to this spec run (8 lower-case letters and digits).
    pub fn suffix(&self) -> &str {
        &self.inner.suffix
    }

    /// `<base>-<suffix>`: a name for a cluster-scoped object no other spec uses.
    pub fn unique_name(&self, base: &str) -> String {
        format!("{base}-{}", self.inner.suffix)
    }

    /// The spec's full text.
    pub fn full_text(&self) -> &str {
        &self.inner.full_text
    }

    /// The spec's labels (inherited ones included).
    pub fn labels(&self) -> &[String] {
        &self.inner.labels
    }

    /// Which run of the spec this is (1-based; above 1 only with `--repeat`).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// What preflight found: API versions, nodes, kubelet and server versions.
    pub fn cluster(&self) -> &ClusterInfo {
        &self.inner.cluster
    }

    /// A skip with this reason: `return Err(ctx.skip("needs 2 nodes"))`.
    pub fn skip(&self, reason: impl Into<String>) -> SpecError {
        SpecError::skip(reason)
    }

    /// Skips unless `condition` holds.
    pub fn skip_unless(&self, condition: bool, reason: impl Into<String>) -> SpecResult {
        if condition { Ok(()) } else { Err(SpecError::skip(reason)) }
    }

    /// A token cancelled when the spec times out or the run is interrupted
    /// (Ctrl-C), and after its cleanups have run. Hand it to background
    /// tasks the spec starts. Cancelling it yourself has no effect on the spec.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.token.child_token()
    }

    /// Completes when the spec is cancelled (see [`Ctx::cancellation_token`]).
    pub async fn cancelled(&self) {
        self.inner.token.cancelled().await;
    }

    /// Whether the spec is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.token.is_cancelled()
    }

    /// Fails the spec at once with `message`, from anywhere (e.g. a background task that saw
    /// that the spec cannot succeed any more): the runner cancels the body as after a timeout
    /// (its waits stop, see [`current_cancellation`]), then runs the cleanups. The first
    /// message wins; after the body returned this has no effect.
    pub fn fail_now(&self, message: impl Into<String>) {
        let message = message.into();
        let mut slot = lock(&self.inner.fail_message);
        if slot.is_none() {
            tracing::error!("failing the spec at once: {message}");
            *slot = Some(message);
        }
        drop(slot);
        self.inner.fail_now.cancel();
    }

    /// Completes with the message of [`Ctx::fail_now`] once it was called.
    pub(crate) async fn failed_now(&self) -> String {
        self.inner.fail_now.cancelled().await;
        lock(&self.inner.fail_message).clone().unwrap_or_default()
    }

    /// When the spec's timeout expires.
    pub fn deadline(&self) -> Instant {
        self.inner.deadline
    }

    /// Time left before the spec's timeout.
    pub fn remaining(&self) -> Duration {
        self.inner.deadline.saturating_duration_since(Instant::now())
    }

    /// Registers a cleanup. Cleanups run after the body ends (also when it
    /// fails, panics, times out or the run is interrupted), last registered
    /// first, each with the default cleanup timeout, all of them together within the spec's
    /// clean-up bound (`--cleanup-bound`, see [`RunOptions::cleanup_bound`](crate::RunOptions::cleanup_bound)):
    /// once it is spent, the cleanups left get [`CLEANUP_ALLOWANCE`](crate::CLEANUP_ALLOWANCE)
    /// each. A failing cleanup fails the spec, and so does one the bound cut short. The future
    /// starts only when the cleanup runs.
    ///
    /// ```no_run
    /// # fn f(ctx: spec_runner::Ctx, api: kube::Api<k8s_openapi::api::core::v1::Node>) {
    /// ctx.defer("remove node label", async move {
    ///     // `?` converts any error into anyhow::Error
    ///     api.patch("n", &Default::default(), &kube::api::Patch::Merge(serde_json::json!({}))).await?;
    ///     Ok(())
    /// });
    /// # }
    /// ```
    pub fn defer<F>(&self, what: impl Into<String>, cleanup: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.inner.cleanups.push(what.into(), self.inner.cleanup_timeout, cleanup);
    }

    /// [`Ctx::defer`] with its own timeout.
    pub fn defer_with_timeout<F>(&self, what: impl Into<String>, timeout: Duration, cleanup: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.inner.cleanups.push(what.into(), timeout, cleanup);
    }

    /// Registers a cleanup that runs before every cleanup of [`Ctx::defer`] (in registration
    /// order): for what must stop before anything is torn down, such as faults injected into a
    /// driver's calls, without which pods could not be deleted.
    pub fn defer_first<F>(&self, what: impl Into<String>, cleanup: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.inner.cleanups.push_first(what.into(), self.inner.cleanup_timeout, cleanup);
    }

    /// Registers a deferred check: a pure wait on the cluster after the spec's body and
    /// cleanups (something going away, such as a namespace or a departed driver's
    /// ResourceSlices) that needs no worker slot. Deferred checks start after every cleanup has
    /// run (cleanups may register them too), once the spec's slot is released so that the next
    /// spec can start; they run at the same time, each bounded by `timeout` (so all of them end
    /// within the longest timeout; the clean-up bound does not apply), and one that fails
    /// or times out fails the spec (the report names it and says after how long). The run ends
    /// only when every deferred check has finished. Only for checks whose subject no later spec
    /// can see (its own namespace, objects with the spec's unique names). A `[Serial]` spec
    /// starts only once these checks of the specs before it ended (they settle the cluster);
    /// checks that only watch the cluster are [`Ctx::defer_observation`]s.
    ///
    /// ```no_run
    /// # fn f(ctx: spec_runner::Ctx) {
    /// ctx.defer_check("the driver's ResourceSlices to be gone", std::time::Duration::from_secs(60), async move {
    ///     // poll the cluster until they are gone
    ///     Ok(())
    /// });
    /// # }
    /// ```
    pub fn defer_check<F>(&self, what: impl Into<String>, timeout: Duration, check: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.inner.cleanups.checks.push(what.into(), timeout, check);
    }

    /// Registers an observation: a deferred check (see [`Ctx::defer_check`]: it runs the same
    /// way and fails the spec the same way) that only watches the cluster do something on its own
    /// and holds nothing a later spec could see, such as the kubelet wiping the ResourceSlices of
    /// a driver whose plugins went away (after its own 30 s grace). A `[Serial]` spec waits for
    /// the settling checks of the specs before it ([`Ctx::defer_check`], the namespace and
    /// objects gone), not for their observations.
    pub fn defer_observation<F>(&self, what: impl Into<String>, timeout: Duration, check: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.inner.cleanups.checks.push_observation(what.into(), timeout, check);
    }

    /// Registers a cleanup that deletes an object (usually cluster-scoped:
    /// DeviceClass, ClusterRole, ValidatingAdmissionPolicy, ResourceSlice), and a deferred check
    /// (see [`Ctx::defer_check`]) that waits until it is gone. Already-gone objects are fine.
    pub fn delete_at_cleanup<K>(&self, api: Api<K>, name: impl Into<String>)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        let name = name.into();
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let (cleanups, timeout) = (self.inner.cleanups.clone(), self.inner.cleanup_timeout);
        self.defer(format!("delete {kind} {name}"), async move {
            let Some(uid) = delete(&api, &kind, &name).await? else { return Ok(()) };
            let what = format!("{kind} {name} to be gone");
            cleanups.checks.push(what, timeout, async move { wait_gone(api, &kind, &name, &uid).await });
            Ok(())
        });
    }

    /// Marks the end of the spec's set-up (the harness calls it once its driver has every
    /// node's plugin registered): the report's `setup` phase runs from the body's start to the
    /// last such mark, the `body` phase from there. A spec that never marks has no set-up phase.
    pub fn setup_done(&self) {
        self.inner.setup.mark();
    }

    /// The run's value of type `T`, shared by every spec of the run: made with `T::default()`
    /// by the first spec that asks for it (so its first use does the work, e.g. creating
    /// objects, and registers their removal with [`Ctx::defer_to_run_end`]).
    pub fn run_shared<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.inner.run.get::<T>()
    }

    /// Registers a clean-up for the end of the run, for what a [`Ctx::run_shared`] value
    /// created: it runs once no spec of the run can run a body or a clean-up any more (beside
    /// the last deferred checks), also after an interrupt, last registered first, within
    /// `timeout`; one that fails fails the run. Unlike [`Ctx::defer`] it does not run when this
    /// spec ends.
    pub fn defer_to_run_end<F>(&self, what: impl Into<String>, timeout: Duration, cleanup: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.inner.run.push(what.into(), timeout, Box::pin(cleanup));
    }

    /// Adds files to this spec's artifacts if it fails (e.g. recorded gRPC calls).
    pub fn artifact_source(&self, source: Box<dyn ArtifactSource>) {
        lock(&self.inner.sources).push(Arc::from(source));
    }

    /// The folder this spec's artifacts go to if it fails (it may not exist yet).
    pub fn artifacts_dir(&self) -> &Path {
        &self.inner.artifacts_dir
    }

    pub(crate) fn sources(&self) -> Vec<Arc<dyn ArtifactSource>> {
        lock(&self.inner.sources).clone()
    }
}

impl crate::spec::requirements::ClusterAccess for Ctx {
    fn client(&self) -> &kube::Client {
        Ctx::client(self)
    }

    fn cluster(&self) -> &ClusterInfo {
        Ctx::cluster(self)
    }

    fn labels(&self) -> &[String] {
        Ctx::labels(self)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Deletes an object; returns its uid while it is still there (being deleted).
async fn delete<K>(api: &Api<K>, kind: &str, name: &str) -> anyhow::Result<Option<String>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(either) => Ok(either.left().and_then(|obj| obj.meta().uid.clone())),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::debug!("{kind} {name} was already gone");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("delete {kind} {name}")),
    }
}

/// Waits until the object with `uid` is gone (the caller bounds the wait).
async fn wait_gone<K>(api: Api<K>, kind: &str, name: &str, uid: &str) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let _waiting = crate::run::monitor::waiting(format!("{kind} {name} to be gone"), None);
    crate::cluster::kube_backend::await_deleted(api, name, uid).await;
    tracing::debug!("{kind} {name} is gone");
    Ok(())
}
