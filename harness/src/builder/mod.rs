//! Objects for DRA specs and the checks on them (upstream's `utils.Builder`): a DeviceClass for
//! the driver, ResourceClaims and ResourceClaimTemplates with the default request and opaque
//! configuration, test pods with inline and external claims or several of either
//! ([`Builder::pod_with_claims`]), waits for pods and claims, and env checks inside containers.
//!
//! ```no_run
//! # async fn body(ctx: harness::framework::Ctx, driver: harness::driver::Driver) -> harness::framework::SpecResult {
//! use harness::builder::Builder;
//! let b = Builder::start(&ctx, &driver, None).await?;     // creates the DeviceClass
//! let (pod, template) = b.pod_inline();
//! b.create_template(&template).await?;
//! b.create_pod(&pod).await?;
//! b.test_pod(&pod, &[]).await?;                          // running + user_a=b (scheduled + allocation without kubelet)
//! # Ok(()) }
//! ```
//!
//! Names follow upstream: class `<namespace><suffix>-class`, pods `tester<suffix>-<n>`, inline
//! claim templates named like their pod, external claims `external-claim<suffix>[-<n>]`, request
//! `my-request`, claim parameters `{"a":"b"}` (env `user_a=b`), class parameters as given (env
//! `admin_<k>=<v>`).
//!
//! [`Builder::start`] registers a teardown on the [`Ctx`] that, before the driver goes away,
//! deletes the test pods and waits until they are gone, then deletes the claims, waits until
//! the plugins have unprepared them and until they are gone (upstream's order).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Container, Node, Pod},
    resource::v1::{
        DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
        ResourceSlice,
    },
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use serde_json::json;

mod checks;
mod claim_pods;
mod env;
mod node_selector;
mod objects;
mod pods;
mod workloads;

pub use claim_pods::PodWithClaims;
pub use env::{ExecOutput, allocation_env, check_env, driver_env_lines, exec, parse_env};
pub use node_selector::{InvalidNodeSelector, NodeSelectorMatcher, node_selector_admits};
pub use objects::Objects;
pub use pods::{
    allocation_results, condition, env_checking_init_container, extended_resource_claim_name, is_allocated,
    node_name, phase, pod_claim_names, prepared_results,
};
pub use workloads::POD_GROUP_TEMPLATE;

use crate::{
    driver::Driver,
    framework::Ctx,
    manifests::PART_OF_LABEL,
    plugin::env_for_result,
    wait::{self, Attempt, Verdict, WaitError},
};

/// The test pods' image (present on the nodes; never pulled).
pub const BUSYBOX_IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
pub use crate::manifests::INFINITE_SLEEP;
/// Name of the request in claims made by the builder.
pub const REQUEST_NAME: &str = "my-request";
/// Name of the pod claim of [`Objects::pod_inline`].
pub const INLINE_CLAIM_NAME: &str = "my-inline-claim";
/// Name of the pod claim of [`Objects::pod_external`].
pub const EXTERNAL_CLAIM_NAME: &str = "resource-claim";
/// Name of the container that uses the claim.
pub const CLAIM_CONTAINER: &str = "with-resource";
/// The non-root user of restricted pods (upstream's `DefaultNonRootUser`).
pub const NON_ROOT_USER: i64 = 1000;

/// How long a pod may take to start (upstream's `podStartTimeout`).
pub const POD_START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a pod may take to be scheduled or reported unschedulable (upstream's `PodStartShort`).
pub const POD_START_SHORT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a pod may take to be deleted (upstream's `PodDelete`).
pub const POD_DELETE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long each step of the builder's teardown may take (upstream: 1 min).
pub const TEARDOWN_STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an exec in a container may take.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the builder's API calls and checks.
#[derive(Debug, thiserror::Error)]
pub enum BuilderError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was attempted.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A wait failed.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// An exec failed or did not finish.
    #[error("exec {command:?} in {pod}/{container}: {reason}")]
    Exec {
        /// Namespace/name of the pod.
        pod: String,
        /// The container.
        container: String,
        /// The command.
        command: Vec<String>,
        /// What went wrong.
        reason: String,
    },
    /// A container's environment lacks an expected variable.
    #[error("container {container} of pod {pod}: {problem}\nits env output:\n{env}")]
    Env {
        /// Namespace/name of the pod.
        pod: String,
        /// The container.
        container: String,
        /// What is wrong.
        problem: String,
        /// The whole `env` output.
        env: String,
    },
    /// The recorded gRPC calls show that the kubelet did not prepare a claim of a running pod as
    /// expected.
    #[error("claim {claim} of pod {pod} on node {node}: {problem}\ncall log of the node:\n{log}")]
    Calls {
        /// Namespace/name of the pod.
        pod: String,
        /// The claim name.
        claim: String,
        /// The pod's node.
        node: String,
        /// What is wrong.
        problem: String,
        /// The node's whole call log.
        log: String,
    },
    /// A claim of a pod is not as expected.
    #[error("claim {claim} of pod {pod}: {problem}")]
    Claim {
        /// Namespace/name of the pod.
        pod: String,
        /// The claim name.
        claim: String,
        /// What is wrong.
        problem: String,
    },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BuilderError {
    let what = what.into();
    move |source| BuilderError::Api { what, source }
}

struct Inner {
    ctx: Ctx,
    driver: Driver,
    objects: Objects,
    /// Whether the spec created PodGroups (the teardown deletes them before the claims).
    pod_groups: std::sync::atomic::AtomicBool,
}

/// Makes, creates and checks the objects of a spec for one [`Driver`]. Cheap to clone; clones
/// share the name counters. The object makers delegate to [`Objects`].
#[derive(Clone)]
pub struct Builder {
    inner: Arc<Inner>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder").field("driver", &self.inner.driver.name()).finish_non_exhaustive()
    }
}

impl Builder {
    /// The object makers without a cluster behind them.
    pub fn objects(&self) -> &Objects {
        &self.inner.objects
    }

    /// The spec's namespace.
    pub fn namespace(&self) -> &str {
        self.inner.objects.namespace()
    }

    /// The driver name.
    pub fn driver_name(&self) -> &str {
        self.inner.objects.driver_name()
    }

    /// The class name: `<namespace><suffix>-class`.
    pub fn class_name(&self) -> String {
        self.inner.objects.class_name()
    }

    /// The DeviceClass: CEL selector `device.driver == "<driver>"`, plus the class parameters as
    /// opaque configuration for the driver.
    pub fn class(&self) -> DeviceClass {
        self.inner.objects.class()
    }

    /// `<driver>/resource-<suffix>` (see [`Objects::extended_resource_name`]).
    pub fn extended_resource_name(&self, suffix: &str) -> String {
        self.inner.objects.extended_resource_name(suffix)
    }

    /// A DeviceClass for the extended resource (see [`Objects::class_with_extended_resource`]).
    pub fn class_with_extended_resource(&self, extended_resource: &str) -> DeviceClass {
        self.inner.objects.class_with_extended_resource(extended_resource)
    }

    /// The claim parameters (`{"a":"b"}`).
    pub fn parameters(&self) -> serde_json::Value {
        self.inner.objects.parameters()
    }

    /// The env the claim parameters produce: `user_a=b`.
    pub fn parameters_env(&self) -> Vec<(String, String)> {
        self.inner.objects.parameters_env()
    }

    /// One request `my-request` for the class, plus the claim parameters as opaque config.
    pub fn claim_spec(&self) -> ResourceClaimSpec {
        self.inner.objects.claim_spec()
    }

    /// An external claim `external-claim<suffix>` (then `-2`, `-3`, ...).
    pub fn external_claim(&self) -> ResourceClaim {
        self.inner.objects.external_claim()
    }

    /// A pod `tester<suffix>-<n>` without claims: one busybox container that sleeps until
    /// SIGTERM, restricted security context, restart policy Never.
    pub fn pod(&self) -> Pod {
        self.inner.objects.pod()
    }

    /// A pod whose container uses an inline claim `my-inline-claim` from a template named like
    /// the pod, and that template.
    pub fn pod_inline(&self) -> (Pod, ResourceClaimTemplate) {
        self.inner.objects.pod_inline()
    }

    /// [`Objects::pod_inline`] with three containers using the claim.
    pub fn pod_inline_multiple(&self) -> (Pod, ResourceClaimTemplate) {
        self.inner.objects.pod_inline_multiple()
    }

    /// A pod whose container uses the existing claim `claim` (pod claim `resource-claim`).
    pub fn pod_external(&self, claim: &str) -> Pod {
        self.inner.objects.pod_external(claim)
    }

    /// [`Objects::pod_external`] with three containers using the claim.
    pub fn pod_external_multiple(&self, claim: &str) -> Pod {
        self.inner.objects.pod_external_multiple(claim)
    }

    /// A builder that creates nothing yet (see [`Builder::start`]).
    pub fn new(ctx: &Ctx, driver: &Driver, class_parameters: Option<serde_json::Value>) -> Self {
        Builder {
            inner: Arc::new(Inner {
                ctx: ctx.clone(),
                driver: driver.clone(),
                objects: Objects::new(
                    ctx.namespace(),
                    driver.name(),
                    &driver.config().name_suffix,
                    class_parameters,
                ),
                pod_groups: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Upstream's `NewBuilder`: creates the DeviceClass (with `class_parameters` as opaque
    /// class configuration, env `admin_<k>=<v>`) and registers the teardown (see the module
    /// documentation).
    pub async fn start(
        ctx: &Ctx,
        driver: &Driver,
        class_parameters: Option<serde_json::Value>,
    ) -> Result<Self, BuilderError> {
        let b = Self::new(ctx, driver, class_parameters);
        b.create_class(&b.class()).await?;
        b.register_teardown();
        Ok(b)
    }

    /// Registers the teardown that [`Builder::start`] registers (delete the test pods, then the
    /// claims, and wait until the plugins unprepared them), for a builder made with
    /// [`Builder::new`] whose class already exists, e.g. because it was created before the
    /// driver started. Register it after starting the driver, so that it runs before the
    /// driver's teardown.
    pub fn register_teardown(&self) {
        let this = self.clone();
        self.inner.ctx.defer_with_timeout(
            "delete test pods and claims before the driver goes away",
            TEARDOWN_STEP_TIMEOUT * 3 + Duration::from_secs(30),
            async move {
                this.tear_down().await?;
                Ok(())
            },
        );
    }

    /// [`Builder::start`] without creating the DeviceClass, for specs that create it themselves
    /// (e.g. through `resource.k8s.io/v1beta1`; create it before calling this, so that it is
    /// deleted after the teardown, as with [`Builder::start`]). Registers the same teardown.
    pub fn start_without_class(
        ctx: &Ctx,
        driver: &Driver,
        class_parameters: Option<serde_json::Value>,
    ) -> Self {
        let b = Self::new(ctx, driver, class_parameters);
        let this = b.clone();
        ctx.defer_with_timeout(
            "delete test pods and claims before the driver goes away",
            TEARDOWN_STEP_TIMEOUT * 3 + Duration::from_secs(30),
            async move {
                this.tear_down().await?;
                Ok(())
            },
        );
        b
    }

    /// The driver.
    pub fn driver(&self) -> &Driver {
        &self.inner.driver
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.inner.ctx.client().clone(), self.namespace())
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.inner.ctx.client().clone(), self.namespace())
    }

    /// Creates a DeviceClass and registers its deletion.
    pub async fn create_class(&self, class: &DeviceClass) -> Result<DeviceClass, BuilderError> {
        let api: Api<DeviceClass> = Api::all(self.inner.ctx.client().clone());
        let name = class.name_any();
        tracing::info!(class = %name, "creating DeviceClass");
        let created = api
            .create(&PostParams::default(), class)
            .await
            .map_err(api_error(format!("create DeviceClass {name}")))?;
        self.inner.ctx.delete_at_cleanup(api, name);
        Ok(created)
    }

    /// Creates a ResourceSlice and registers its deletion.
    pub async fn create_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, BuilderError> {
        let api: Api<ResourceSlice> = Api::all(self.inner.ctx.client().clone());
        let created = api
            .create(&PostParams::default(), slice)
            .await
            .map_err(api_error(format!("create ResourceSlice {}", slice.name_any())))?;
        self.inner.ctx.delete_at_cleanup(api, created.name_any());
        Ok(created)
    }

    /// Creates a ResourceClaim in the namespace (deleted by the teardown).
    pub async fn create_claim(&self, claim: &ResourceClaim) -> Result<ResourceClaim, BuilderError> {
        tracing::info!(claim = %claim.name_any(), "creating ResourceClaim");
        self.claims()
            .create(&PostParams::default(), claim)
            .await
            .map_err(api_error(format!("create ResourceClaim {}", claim.name_any())))
    }

    /// Creates a ResourceClaimTemplate in the namespace.
    pub async fn create_template(
        &self,
        template: &ResourceClaimTemplate,
    ) -> Result<ResourceClaimTemplate, BuilderError> {
        tracing::info!(template = %template.name_any(), "creating ResourceClaimTemplate");
        Api::<ResourceClaimTemplate>::namespaced(self.inner.ctx.client().clone(), self.namespace())
            .create(&PostParams::default(), template)
            .await
            .map_err(api_error(format!("create ResourceClaimTemplate {}", template.name_any())))
    }

    /// Creates a pod in the namespace (deleted by the teardown).
    pub async fn create_pod(&self, pod: &Pod) -> Result<Pod, BuilderError> {
        tracing::info!(pod = %pod.name_any(), "creating Pod");
        self.pods()
            .create(&PostParams::default(), pod)
            .await
            .map_err(api_error(format!("create Pod {}", pod.name_any())))
    }

    /// Waits until `condition` holds for the pod (which must exist), for at most `timeout`.
    pub async fn wait_pod<F>(
        &self,
        pod: &Pod,
        what: &str,
        timeout: Duration,
        mut condition: F,
    ) -> Result<Pod, BuilderError>
    where
        F: FnMut(&Pod) -> Verdict,
    {
        let name = pod.name_any();
        Ok(wait::existing(&self.pods(), &name, format!("pod {name} {what}"), timeout, &mut condition).await?)
    }

    /// Waits until the pod is scheduled (upstream's `WaitForPodScheduled`).
    pub async fn wait_scheduled(&self, pod: &Pod) -> Result<Pod, BuilderError> {
        self.wait_pod(pod, "to be scheduled", POD_START_TIMEOUT, |p| Verdict::done_if(node_name(p).is_some()))
            .await
    }

    /// Waits until the pod runs; fails at once if it terminates (upstream's
    /// `WaitForPodRunningInNamespace`).
    pub async fn wait_running(&self, pod: &Pod) -> Result<Pod, BuilderError> {
        self.wait_pod(pod, "to run", POD_START_TIMEOUT, |p| match phase(p) {
            "Running" => Verdict::Done,
            "Succeeded" | "Failed" => Verdict::Fail(format!("the pod terminated with phase {}", phase(p))),
            _ => Verdict::Pending,
        })
        .await
    }

    /// Waits until the scheduler reports the pod unschedulable; fails at once if it gets
    /// scheduled (upstream's `WaitForPodNameUnschedulableInNamespace`).
    pub async fn wait_unschedulable(&self, pod: &Pod) -> Result<Pod, BuilderError> {
        self.wait_pod(pod, "to be unschedulable", POD_START_SHORT_TIMEOUT, |p| {
            if node_name(p).is_some() {
                return Verdict::Fail("the pod got scheduled".to_owned());
            }
            Verdict::done_if(
                condition(p, "PodScheduled")
                    .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable")),
            )
        })
        .await
    }

    /// Waits until `condition` holds for the claim (which must exist), for at most `timeout`.
    pub async fn wait_claim<F>(
        &self,
        claim: &str,
        what: &str,
        timeout: Duration,
        mut condition: F,
    ) -> Result<ResourceClaim, BuilderError>
    where
        F: FnMut(&ResourceClaim) -> Verdict,
    {
        Ok(wait::existing(&self.claims(), claim, format!("claim {claim} {what}"), timeout, &mut condition)
            .await?)
    }

    /// Waits until the claim is allocated.
    pub async fn wait_allocated(&self, claim: &str) -> Result<ResourceClaim, BuilderError> {
        self.wait_claim(claim, "to be allocated", POD_DELETE_TIMEOUT, |c| Verdict::done_if(is_allocated(c)))
            .await
    }

    /// Waits until the claim is no longer allocated.
    pub async fn wait_deallocated(&self, claim: &str) -> Result<ResourceClaim, BuilderError> {
        self.wait_claim(claim, "to be deallocated", POD_DELETE_TIMEOUT, |c| {
            Verdict::done_if(!is_allocated(c))
        })
        .await
    }

    /// Waits until the pod does not exist.
    pub async fn wait_pod_gone(&self, pod: &str, timeout: Duration) -> Result<(), BuilderError> {
        wait::gone(&self.pods(), pod, format!("pod {pod} to be gone"), timeout).await?;
        Ok(())
    }

    /// Deletes the pod and waits until it is gone (upstream's `DeletePodAndWaitForNotFound`).
    pub async fn delete_pod_and_wait(&self, pod: &Pod) -> Result<(), BuilderError> {
        let name = pod.name_any();
        match self.pods().delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error(format!("delete Pod {name}"))(e)),
        }
        self.wait_pod_gone(&name, POD_DELETE_TIMEOUT).await
    }

    /// The teardown: test pods, then claims, as upstream's Builder does it.
    async fn tear_down(&self) -> Result<(), BuilderError> {
        let not_proxy = format!("{}!={}", PART_OF_LABEL.0, PART_OF_LABEL.1);
        let pods = self.pods();
        let list = pods
            .list(&ListParams::default().labels(&not_proxy))
            .await
            .map_err(api_error("list test pods"))?;
        for pod in list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            tracing::info!(pod = %pod.name_any(), "deleting test pod");
            match pods.delete(&pod.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(format!("delete Pod {}", pod.name_any()))(e)),
            }
        }
        wait::objects(
            &pods,
            watcher::Config::default().labels(&not_proxy),
            "test pods to be gone",
            TEARDOWN_STEP_TIMEOUT,
            |p| Verdict::done_if(p.is_empty()),
        )
        .await?;
        self.delete_pod_groups().await?;

        let claims = self.claims();
        let list = claims.list(&ListParams::default()).await.map_err(api_error("list ResourceClaims"))?;
        for claim in list.items.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
            tracing::info!(claim = %claim.name_any(), "deleting ResourceClaim");
            match claims.delete(&claim.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(format!("delete ResourceClaim {}", claim.name_any()))(e)),
            }
        }
        let driver = &self.inner.driver;
        if driver.with_kubelet() {
            for node in driver.node_names() {
                let what = format!(
                    "the claims prepared by driver {} on node {node} to be unprepared",
                    driver.name()
                );
                wait::poll(what, TEARDOWN_STEP_TIMEOUT, Duration::from_millis(250), || async {
                    let prepared = driver.prepared_claims(node);
                    if prepared.is_empty() {
                        Attempt::Done(())
                    } else {
                        Attempt::Retry(format!("still prepared: {prepared:?}"))
                    }
                })
                .await?;
            }
        }
        wait::objects(
            &claims,
            watcher::Config::default(),
            "claims to be deallocated and deleted",
            TEARDOWN_STEP_TIMEOUT,
            |c| Verdict::done_if(c.is_empty()),
        )
        .await?;
        Ok(())
    }
}
