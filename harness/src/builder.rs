//! Objects for DRA specs and the checks on them (upstream's `utils.Builder`): a DeviceClass for
//! the driver, ResourceClaims and ResourceClaimTemplates with the default request and opaque
//! configuration, test pods with inline and external claims, waits for pods and claims, and
//! env checks inside containers.
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
    core::v1::{Container, Pod},
    resource::v1::{
        DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
        ResourceSlice,
    },
};
use kube::{
    Api, ResourceExt as _,
    api::{AttachParams, DeleteParams, ListParams, PostParams},
    runtime::watcher,
};
use serde_json::json;
use tokio::io::AsyncReadExt as _;

use crate::{
    driver::Driver,
    framework::Ctx,
    manifests::PART_OF_LABEL,
    plugin::env_for_result,
    wait::{self, Attempt, Verdict, WaitError},
};

/// The test pods' image (present on the nodes; never pulled).
pub const BUSYBOX_IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
/// The test pods' command: sleep until SIGTERM, then exit at once (upstream's
/// `InfiniteSleepCommand`).
pub const INFINITE_SLEEP: &str = "trap exit TERM; while true; do sleep 1; done";
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

/// What an exec in a container produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// Whether the command exited with 0.
    pub success: bool,
    /// The status message for a failure (e.g. `command terminated with non-zero exit code`).
    pub message: String,
}

/// Runs `command` in a container and collects stdout, stderr and the exit status (kube's
/// `Api::exec`; stdout and stderr are drained and the status taken before joining).
pub async fn exec(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    container: &str,
    command: &[&str],
) -> Result<ExecOutput, BuilderError> {
    let fail = |reason: String| BuilderError::Exec {
        pod: format!("{namespace}/{pod}"),
        container: container.to_owned(),
        command: command.iter().map(|s| s.to_string()).collect(),
        reason,
    };
    let run = async {
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let params = AttachParams::default().container(container).stdin(false).stdout(true).stderr(true);
        let mut process = api.exec(pod, command.to_vec(), &params).await.map_err(|e| fail(e.to_string()))?;
        let stdout = process.stdout();
        let stderr = process.stderr();
        let status = process.take_status();
        let read = |stream: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| async move {
            let mut buf = Vec::new();
            if let Some(mut s) = stream {
                s.read_to_end(&mut buf).await?;
            }
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
        };
        let (out, err) = tokio::join!(read(stdout), read(stderr));
        let status = match status {
            Some(status) => status.await,
            None => None,
        };
        process.join().await.map_err(|e| fail(e.to_string()))?;
        let (success, message) = match status {
            Some(s) => (s.status.as_deref() == Some("Success"), s.message.unwrap_or_default()),
            None => (false, "no exit status received".to_owned()),
        };
        Ok(ExecOutput {
            stdout: out.map_err(|e| fail(format!("reading stdout: {e}")))?,
            stderr: err.map_err(|e| fail(format!("reading stderr: {e}")))?,
            success,
            message,
        })
    };
    match tokio::time::timeout(EXEC_TIMEOUT, run).await {
        Ok(result) => result,
        Err(_) => Err(fail(format!("did not finish within {EXEC_TIMEOUT:?}"))),
    }
}

/// `env` output as variables (lines without `=` are ignored; a later line wins).
pub fn parse_env(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Lines of `env` output that the test driver sets (`admin_*`, `user_*`, `claim_*`), sorted
/// (upstream's `envLineRE`).
pub fn driver_env_lines(output: &str) -> Vec<String> {
    let mut lines: Vec<String> = output
        .lines()
        .filter(|line| {
            let Some((key, _)) = line.split_once('=') else { return false };
            ["admin_", "user_", "claim_"].iter().any(|p| {
                key.strip_prefix(p)
                    .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            })
        })
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Checks that `env` holds every `(name, value)` of `expected`; returns what is wrong.
pub fn check_env(env: &BTreeMap<String, String>, expected: &[(&str, &str)]) -> Result<(), String> {
    let problems: Vec<String> = expected
        .iter()
        .filter_map(|(k, v)| match env.get(*k) {
            Some(actual) if actual == v => None,
            Some(actual) => Some(format!("{k}={actual}, expected {k}={v}")),
            None => Some(format!("{k} is not set, expected {k}={v}")),
        })
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// The restricted pod security context of upstream's `MakePod(..., LevelRestricted, ...)`.
fn restricted_pod_security() -> serde_json::Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": NON_ROOT_USER,
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

/// The restricted container security context.
fn restricted_container_security() -> serde_json::Value {
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
    })
}

/// The pod's claim names: pod claim name -> ResourceClaim name (from
/// `status.resourceClaimStatuses` for templates; `None` if not generated yet or not needed).
pub fn pod_claim_names(pod: &Pod) -> BTreeMap<String, Option<String>> {
    let statuses: BTreeMap<String, Option<String>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .map(|ss| ss.iter().map(|s| (s.name.clone(), s.resource_claim_name.clone())).collect())
        .unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .map(|claims| {
            claims
                .iter()
                .map(|c| {
                    let resolved = match &c.resource_claim_name {
                        Some(name) => Some(name.clone()),
                        None => statuses.get(&c.name).cloned().flatten(),
                    };
                    (c.name.clone(), resolved)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The env the test driver's plugin puts into containers for this claim's allocation results of
/// `driver` (what the kubelet would inject), as `name=value` lines, sorted.
pub fn allocation_env(driver: &str, claim: &ResourceClaim) -> Result<Vec<String>, String> {
    let Some(devices) =
        claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref())
    else {
        return Err("not allocated".to_owned());
    };
    let configs = devices.config.clone().unwrap_or_default();
    let mut env = Vec::new();
    for result in devices.results.iter().flatten().filter(|r| r.driver == driver) {
        env.extend(env_for_result(driver, &claim.name_any(), &configs, result)?);
    }
    env.sort();
    env.dedup();
    Ok(env)
}

/// The objects of a spec, without API access: names, class, claims, templates and pods as
/// upstream's Builder makes them. [`Builder`] dereferences to it.
#[derive(Debug)]
pub struct Objects {
    namespace: String,
    driver_name: String,
    name_suffix: String,
    class_parameters: Option<serde_json::Value>,
    pod_counter: AtomicUsize,
    claim_counter: AtomicUsize,
}

impl Objects {
    /// Objects for `driver_name` (with the driver's `name_suffix`) in `namespace`.
    pub fn new(
        namespace: impl Into<String>,
        driver_name: impl Into<String>,
        name_suffix: impl Into<String>,
        class_parameters: Option<serde_json::Value>,
    ) -> Self {
        Objects {
            namespace: namespace.into(),
            driver_name: driver_name.into(),
            name_suffix: name_suffix.into(),
            class_parameters,
            pod_counter: AtomicUsize::new(0),
            claim_counter: AtomicUsize::new(0),
        }
    }

    /// The spec's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The driver name.
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// The class name: `<namespace><suffix>-class`.
    pub fn class_name(&self) -> String {
        format!("{}{}-class", self.namespace, self.name_suffix)
    }

    /// The DeviceClass: CEL selector `device.driver == "<driver>"`, plus the class parameters as
    /// opaque configuration for the driver.
    pub fn class(&self) -> DeviceClass {
        let mut spec = json!({
            "selectors": [{ "cel": { "expression": format!("device.driver == \"{}\"", self.driver_name) } }],
        });
        if let Some(params) = &self.class_parameters {
            spec["config"] = json!([{ "opaque": { "driver": self.driver_name, "parameters": params } }]);
        }
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": { "name": self.class_name() },
            "spec": spec,
        }))
        .unwrap_or_default()
    }

    /// The claim parameters (`{"a":"b"}`).
    pub fn parameters(&self) -> serde_json::Value {
        json!({"a": "b"})
    }

    /// The env the claim parameters produce: `user_a=b`.
    pub fn parameters_env(&self) -> Vec<(String, String)> {
        vec![("user_a".to_owned(), "b".to_owned())]
    }

    /// One request `my-request` for the class, plus the claim parameters as opaque config.
    pub fn claim_spec(&self) -> ResourceClaimSpec {
        serde_json::from_value(json!({
            "devices": {
                "requests": [{ "name": REQUEST_NAME, "exactly": { "deviceClassName": self.class_name() } }],
                "config": [{ "opaque": { "driver": self.driver_name, "parameters": self.parameters() } }],
            },
        }))
        .unwrap_or_default()
    }

    /// An external claim `external-claim<suffix>` (then `-2`, `-3`, ...).
    pub fn external_claim(&self) -> ResourceClaim {
        let n = self.claim_counter.fetch_add(1, Ordering::SeqCst) + 1;
        let mut name = format!("external-claim{}", self.name_suffix);
        if n > 1 {
            name.push_str(&format!("-{n}"));
        }
        let mut claim = ResourceClaim { spec: Some(self.claim_spec()), ..Default::default() };
        claim.metadata.name = Some(name);
        claim.metadata.namespace = Some(self.namespace.clone());
        claim
    }

    /// A pod `tester<suffix>-<n>` without claims: one busybox container that sleeps until
    /// SIGTERM, restricted security context, restart policy Never.
    pub fn pod(&self) -> Pod {
        let n = self.pod_counter.fetch_add(1, Ordering::SeqCst) + 1;
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("tester{}-{n}", self.name_suffix),
                "namespace": self.namespace,
            },
            "spec": {
                "restartPolicy": "Never",
                "securityContext": restricted_pod_security(),
                "containers": [{
                    "name": "write-pod",
                    "image": BUSYBOX_IMAGE,
                    "command": ["/bin/sh", "-c", INFINITE_SLEEP],
                    "securityContext": restricted_container_security(),
                }],
            },
        }))
        .unwrap_or_default()
    }

    /// A pod whose container uses an inline claim `my-inline-claim` from a template named like
    /// the pod, and that template.
    pub fn pod_inline(&self) -> (Pod, ResourceClaimTemplate) {
        let mut pod = self.pod();
        let name = pod.name_any();
        use_claim(
            &mut pod,
            INLINE_CLAIM_NAME,
            json!({ "name": INLINE_CLAIM_NAME, "resourceClaimTemplateName": name }),
        );
        let template = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": { "spec": self.claim_spec() },
        }))
        .unwrap_or_default();
        (pod, template)
    }

    /// [`Objects::pod_inline`] with three containers using the claim.
    pub fn pod_inline_multiple(&self) -> (Pod, ResourceClaimTemplate) {
        let (mut pod, template) = self.pod_inline();
        triple_container(&mut pod);
        (pod, template)
    }

    /// A pod whose container uses the existing claim `claim` (pod claim `resource-claim`).
    pub fn pod_external(&self, claim: &str) -> Pod {
        let mut pod = self.pod();
        use_claim(
            &mut pod,
            EXTERNAL_CLAIM_NAME,
            json!({ "name": EXTERNAL_CLAIM_NAME, "resourceClaimName": claim }),
        );
        pod
    }

    /// [`Objects::pod_external`] with three containers using the claim.
    pub fn pod_external_multiple(&self, claim: &str) -> Pod {
        let mut pod = self.pod_external(claim);
        triple_container(&mut pod);
        pod
    }
}

struct Inner {
    ctx: Ctx,
    driver: Driver,
    objects: Objects,
}

/// Makes, creates and checks the objects of a spec for one [`Driver`]. Cheap to clone; clones
/// share the name counters. The object makers are those of [`Objects`] (through `Deref`).
#[derive(Clone)]
pub struct Builder {
    inner: Arc<Inner>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder").field("driver", &self.inner.driver.name()).finish_non_exhaustive()
    }
}

impl std::ops::Deref for Builder {
    type Target = Objects;

    fn deref(&self) -> &Objects {
        &self.inner.objects
    }
}

impl Builder {
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

    /// The pod's claims, resolved and fetched: pod claim name -> ResourceClaim.
    pub async fn pod_claims(&self, pod: &Pod) -> Result<BTreeMap<String, ResourceClaim>, BuilderError> {
        let pod_name = pod.name_any();
        let mut out = BTreeMap::new();
        for (pod_claim, name) in pod_claim_names(pod) {
            let Some(name) = name else {
                return Err(BuilderError::Claim {
                    pod: format!("{}/{pod_name}", self.namespace()),
                    claim: pod_claim,
                    problem: "no ResourceClaim was generated for it (status.resourceClaimStatuses)"
                        .to_owned(),
                });
            };
            let claim =
                self.claims().get(&name).await.map_err(api_error(format!("get ResourceClaim {name}")))?;
            out.insert(pod_claim, claim);
        }
        Ok(out)
    }

    /// Upstream's `TestPod`. Without kubelet: waits until the pod is scheduled and checks that
    /// each of its claims is allocated with devices of the driver, reserved for the pod, and that
    /// the allocation carries the configuration that yields `env` (what the plugin would
    /// inject). With kubelet: waits until the pod runs, checks in the recorded gRPC calls that
    /// the kubelet prepared each of its claims of this driver ([`Builder::expect_prepared`]),
    /// and checks `env` in every container through exec. Empty `env` means the claim
    /// parameters' env (`user_a=b`).
    pub async fn test_pod(&self, pod: &Pod, env: &[(&str, &str)]) -> Result<Pod, BuilderError> {
        let default_env = self.parameters_env();
        let env: Vec<(&str, &str)> = if env.is_empty() {
            default_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
        } else {
            env.to_vec()
        };
        if !self.inner.driver.with_kubelet() {
            let pod = self.wait_scheduled(pod).await?;
            self.check_allocations(&pod, &env).await?;
            return Ok(pod);
        }
        let pod = self.wait_running(pod).await?;
        self.expect_prepared(&pod).await?;
        let containers: Vec<String> = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        for container in containers {
            self.expect_env(&pod, &container, &env).await?;
        }
        Ok(pod)
    }

    /// Checks, for a pod that runs, what the kubelet of its node did with each of its claims that
    /// has devices of this driver (and does not skip `NodePrepareResources`), from the node's
    /// recorded gRPC calls: a `NodePrepareResources` call named the claim (by UID) and succeeded
    /// for it, the claim's last successful call is that prepare (not an unprepare), the devices
    /// returned are exactly the claim's allocated devices of this driver, and the plugin still
    /// holds the claim as prepared. Returns the claims.
    pub async fn expect_prepared(&self, pod: &Pod) -> Result<BTreeMap<String, ResourceClaim>, BuilderError> {
        let driver = &self.inner.driver;
        let pod_name = format!("{}/{}", self.namespace(), pod.name_any());
        let node = node_name(pod).unwrap_or_default().to_owned();
        let claims = self.pod_claims(pod).await?;
        for claim in claims.values() {
            let problem = |problem: String| BuilderError::Calls {
                pod: pod_name.clone(),
                claim: claim.name_any(),
                node: node.clone(),
                problem,
                log: driver.try_calls(&node).map(|c| c.log().to_string()).unwrap_or_default(),
            };
            let mut want = prepared_results(self.driver_name(), claim);
            if want.is_empty() {
                continue;
            }
            let calls = match driver.try_calls(&node) {
                Ok(calls) => calls,
                Err(e) => {
                    return Err(problem(format!("the pod runs where the driver's plugin does not: {e}")));
                }
            };
            let uid = claim.uid().unwrap_or_default();
            let history = calls.claim(&uid);
            let Some(last) = history.prepares().filter(|c| c.succeeded()).last() else {
                return Err(problem(format!(
                    "the kubelet never prepared it successfully (claim UID {uid}): {history}"
                )));
            };
            if !history.is_prepared() {
                return Err(problem(format!("the kubelet unprepared it after preparing it: {history}")));
            }
            let mut got: Vec<(String, String)> =
                last.devices.iter().map(|(pool, device, _)| (pool.clone(), device.clone())).collect();
            got.sort();
            got.dedup();
            want.sort();
            want.dedup();
            if got != want {
                return Err(problem(format!(
                    "NodePrepareResources #{} returned devices {got:?}, the allocation has {want:?}",
                    last.id
                )));
            }
            let id = crate::plugin::ClaimId { name: claim.name_any(), uid: uid.clone() };
            if !driver.prepared_claims(&node).contains(&id) {
                return Err(problem(format!(
                    "the plugin does not hold it as prepared (prepared: {:?})",
                    driver.prepared_claims(&node)
                )));
            }
        }
        Ok(claims)
    }

    /// Checks that every claim of the scheduled pod is allocated with devices of this driver,
    /// reserved for the pod, and yields `env`. Returns the claims.
    pub async fn check_allocations(
        &self,
        pod: &Pod,
        env: &[(&str, &str)],
    ) -> Result<BTreeMap<String, ResourceClaim>, BuilderError> {
        let pod_name = format!("{}/{}", self.namespace(), pod.name_any());
        let uid = pod.uid().unwrap_or_default();
        let claims = self.pod_claims(pod).await?;
        for (pod_claim, claim) in &claims {
            let problem = |problem: String| BuilderError::Claim {
                pod: pod_name.clone(),
                claim: claim.name_any(),
                problem,
            };
            let results = allocation_results(claim);
            if results.is_empty() {
                return Err(problem(format!(
                    "pod claim {pod_claim} is scheduled but its claim has no allocated devices"
                )));
            }
            if let Some(other) = results.iter().find(|r| r.driver != self.driver_name()) {
                return Err(problem(format!(
                    "device {} is from driver {}, not {}",
                    other.device,
                    other.driver,
                    self.driver_name()
                )));
            }
            let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
            if !reserved.iter().any(|r| r.uid == uid && r.resource == "pods") {
                return Err(problem(format!(
                    "not reserved for the pod (reservedFor: {:?})",
                    reserved.iter().map(|r| format!("{}/{}", r.resource, r.name)).collect::<Vec<_>>()
                )));
            }
            let lines = allocation_env(self.driver_name(), claim).map_err(&problem)?;
            check_env(&parse_env(&lines.join("\n")), env).map_err(|e| {
                problem(format!("the allocation's configuration would not give the expected env: {e}"))
            })?;
        }
        Ok(claims)
    }

    /// Runs `env` in a container and returns its output (stderr must be empty).
    pub async fn container_env(&self, pod: &Pod, container: &str) -> Result<String, BuilderError> {
        let name = pod.name_any();
        let out = exec(self.inner.ctx.client(), self.namespace(), &name, container, &["env"]).await?;
        if !out.success || !out.stderr.is_empty() {
            return Err(BuilderError::Exec {
                pod: format!("{}/{name}", self.namespace()),
                container: container.to_owned(),
                command: vec!["env".to_owned()],
                reason: format!("failed ({}), stderr: {:?}", out.message, out.stderr),
            });
        }
        Ok(out.stdout)
    }

    /// Checks that the container's environment has every `(name, value)` (upstream's
    /// `TestContainerEnv` without full match).
    pub async fn expect_env(
        &self,
        pod: &Pod,
        container: &str,
        expected: &[(&str, &str)],
    ) -> Result<(), BuilderError> {
        let output = self.container_env(pod, container).await?;
        check_env(&parse_env(&output), expected).map_err(|problem| BuilderError::Env {
            pod: format!("{}/{}", self.namespace(), pod.name_any()),
            container: container.to_owned(),
            problem,
            env: output.clone(),
        })
    }

    /// Checks that the driver's variables in the container (`admin_*`, `user_*`, `claim_*`) are
    /// exactly `expected` (upstream's `TestContainerEnv` with full match).
    pub async fn expect_env_exact(
        &self,
        pod: &Pod,
        container: &str,
        expected: &[(&str, &str)],
    ) -> Result<(), BuilderError> {
        let output = self.container_env(pod, container).await?;
        let actual = driver_env_lines(&output);
        let mut want: Vec<String> = expected.iter().map(|(k, v)| format!("{k}={v}")).collect();
        want.sort();
        if actual == want {
            return Ok(());
        }
        Err(BuilderError::Env {
            pod: format!("{}/{}", self.namespace(), pod.name_any()),
            container: container.to_owned(),
            problem: format!("driver variables are {actual:?}, expected exactly {want:?}"),
            env: output,
        })
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

/// Adds a pod claim and makes the first container use it, renamed `with-resource`.
fn use_claim(pod: &mut Pod, name: &str, pod_claim: serde_json::Value) {
    if let Some(spec) = pod.spec.as_mut() {
        if let Ok(claim) = serde_json::from_value(pod_claim) {
            spec.resource_claims = Some(vec![claim]);
        }
        if let Some(c) = spec.containers.first_mut() {
            c.name = CLAIM_CONTAINER.to_owned();
            let resources = c.resources.get_or_insert_with(Default::default);
            resources.claims = serde_json::from_value(json!([{ "name": name }])).ok();
        }
    }
}

/// Copies the first container twice, named `<name>-1` and `<name>-2`.
fn triple_container(pod: &mut Pod) {
    if let Some(spec) = pod.spec.as_mut()
        && let Some(first) = spec.containers.first().cloned()
    {
        for i in 1..=2 {
            let mut c = first.clone();
            c.name = format!("{}-{i}", first.name);
            spec.containers.push(c);
        }
    }
}

/// The pod's node, once scheduled.
pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The pod's phase (`""` if unknown).
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// A pod condition by type.
pub fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

/// `(pool, device)` of the claim's allocation results of `driver` that the kubelet must prepare
/// (results whose `skipNodeOperations` names `NodePrepareResources` or `*` are left out).
pub fn prepared_results(driver: &str, claim: &ResourceClaim) -> Vec<(String, String)> {
    allocation_results(claim)
        .iter()
        .filter(|r| r.driver == driver)
        .filter(|r| {
            // A field of newer API versions: read it from JSON.
            let skips = serde_json::to_value(r)
                .ok()
                .and_then(|v| v.get("skipNodeOperations").cloned())
                .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
                .unwrap_or_default();
            !skips.iter().any(|s| s == "NodePrepareResources" || s == "*")
        })
        .map(|r| (r.pool.clone(), r.device.clone()))
        .collect()
}

/// The device allocation results of the claim (empty while it is not allocated).
pub fn allocation_results(claim: &ResourceClaim) -> &[DeviceRequestAllocationResult] {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
}

/// An init container made from `container` (same claims), named `<name>-init`, that succeeds
/// only if it sees the claim's `user_a=b` env, so that its pod can start only then.
pub fn env_checking_init_container(container: &Container) -> Container {
    let mut init = container.clone();
    init.name.push_str("-init");
    init.command = Some(vec!["sh".into(), "-c".into(), "env | grep user_a=b".into()]);
    init
}

/// Whether the claim has an allocation.
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodResourceClaimStatus, PodStatus};

    use super::*;

    const ENV: &str = "PATH=/bin\nHOSTNAME=tester-1\nuser_a=b\nadmin_x=y\nclaim_external_claim_my_request=true\nweird\nEQ=a=b\n";

    #[test]
    fn parses_env_output() {
        let env = parse_env(ENV);
        assert_eq!(env["user_a"], "b");
        assert_eq!(env["EQ"], "a=b");
        assert!(!env.contains_key("weird"));
        assert_eq!(env.len(), 6);
    }

    #[test]
    fn driver_lines_are_the_prefixed_ones_sorted() {
        assert_eq!(driver_env_lines(ENV), ["admin_x=y", "claim_external_claim_my_request=true", "user_a=b"]);
        assert!(driver_env_lines("user-a=b\nusers=x\n").is_empty());
    }

    #[test]
    fn check_env_reports_missing_and_wrong_values() {
        let env = parse_env(ENV);
        assert!(check_env(&env, &[("user_a", "b"), ("admin_x", "y")]).is_ok());
        assert_eq!(
            check_env(&env, &[("user_a", "c"), ("admin_q", "y")]).unwrap_err(),
            "user_a=b, expected user_a=c; admin_q is not set, expected admin_q=y"
        );
    }

    #[test]
    fn pod_claim_names_resolve_templates_through_the_status() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "p" },
            "spec": {
                "containers": [],
                "resourceClaims": [
                    { "name": "inline", "resourceClaimTemplateName": "t" },
                    { "name": "ext", "resourceClaimName": "external-claim" },
                ],
            },
        }))
        .unwrap();
        let names = pod_claim_names(&pod);
        assert_eq!(names["inline"], None);
        assert_eq!(names["ext"].as_deref(), Some("external-claim"));
        pod.status = Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "inline".into(),
                resource_claim_name: Some("p-inline-xyz".into()),
            }]),
            ..Default::default()
        });
        assert_eq!(pod_claim_names(&pod)["inline"].as_deref(), Some("p-inline-xyz"));
    }

    #[test]
    fn allocation_env_is_what_the_plugin_would_inject() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": { "name": "external-claim", "namespace": "ns" },
            "spec": {},
            "status": { "allocation": { "devices": {
                "results": [{ "request": "my-request", "driver": "d.k8s.io", "pool": "p", "device": "device-00" }],
                "config": [
                    { "source": "FromClass", "opaque": { "driver": "d.k8s.io", "parameters": { "x": "y" } } },
                    { "source": "FromClaim", "opaque": { "driver": "d.k8s.io", "parameters": { "a": "b" } } },
                    { "source": "FromClaim", "opaque": { "driver": "other.k8s.io", "parameters": { "o": "p" } } },
                ],
            } } },
        }))
        .unwrap();
        assert_eq!(
            allocation_env("d.k8s.io", &claim).unwrap(),
            ["admin_x=y", "claim_external_claim_my_request=true", "user_a=b"]
        );
        let unallocated = ResourceClaim::default();
        assert_eq!(allocation_env("d.k8s.io", &unallocated).unwrap_err(), "not allocated");
    }

    fn objects() -> Objects {
        Objects::new("dra-ns", "dra-ns.k8s.io", "", Some(json!({"x": "y"})))
    }

    #[test]
    fn class_selects_the_driver_and_carries_class_parameters() {
        let class = objects().class();
        assert_eq!(class.metadata.name.as_deref(), Some("dra-ns-class"));
        let spec = class.spec.clone().unwrap();
        let selectors = spec.selectors.clone().unwrap();
        assert_eq!(selectors[0].cel.as_ref().unwrap().expression, r#"device.driver == "dra-ns.k8s.io""#);
        let config = &spec.config.as_ref().unwrap()[0];
        let opaque = config.opaque.as_ref().unwrap();
        assert_eq!(opaque.driver, "dra-ns.k8s.io");
        assert_eq!(opaque.parameters.0, json!({"x": "y"}));
        let plain = Objects::new("dra-ns", "dra-ns.k8s.io", "-b", None).class();
        assert_eq!(plain.metadata.name.as_deref(), Some("dra-ns-b-class"));
        assert!(plain.spec.unwrap().config.is_none());
    }

    #[test]
    fn claims_have_the_default_request_and_parameters() {
        let o = objects();
        let claim = o.external_claim();
        assert_eq!(claim.metadata.name.as_deref(), Some("external-claim"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("dra-ns"));
        assert_eq!(o.external_claim().metadata.name.as_deref(), Some("external-claim-2"));
        let devices = claim.spec.unwrap().devices.unwrap();
        let request = &devices.requests.unwrap()[0];
        assert_eq!(request.name, REQUEST_NAME);
        assert_eq!(request.exactly.as_ref().unwrap().device_class_name, "dra-ns-class");
        let opaque = devices.config.unwrap()[0].opaque.clone().unwrap();
        assert_eq!((opaque.driver.as_str(), opaque.parameters.0), ("dra-ns.k8s.io", json!({"a": "b"})));
        assert_eq!(o.parameters_env(), [("user_a".to_owned(), "b".to_owned())]);
    }

    #[test]
    fn pods_are_restricted_sleepers_with_counted_names() {
        let o = objects();
        let pod = o.pod();
        assert_eq!(pod.metadata.name.as_deref(), Some("tester-1"));
        assert_eq!(o.pod().metadata.name.as_deref(), Some("tester-2"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some(BUSYBOX_IMAGE));
        assert_eq!(c.command.as_deref().unwrap(), ["/bin/sh", "-c", INFINITE_SLEEP]);
        assert!(spec.security_context.unwrap().run_as_non_root.unwrap());
    }

    #[test]
    fn inline_pods_use_a_template_named_like_the_pod() {
        let (pod, template) = objects().pod_inline_multiple();
        assert_eq!(template.metadata.name, pod.metadata.name);
        assert_eq!(template.metadata.namespace.as_deref(), Some("dra-ns"));
        let claim_spec = template.spec.unwrap().spec.unwrap();
        assert_eq!(claim_spec.devices.as_ref().unwrap().requests.as_ref().unwrap()[0].name, REQUEST_NAME);
        let spec = pod.spec.unwrap();
        let claim = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(claim.name, INLINE_CLAIM_NAME);
        assert_eq!(claim.resource_claim_template_name.as_deref(), Some("tester-1"));
        let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["with-resource", "with-resource-1", "with-resource-2"]);
        for c in &spec.containers {
            assert_eq!(c.resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name, INLINE_CLAIM_NAME);
        }
    }

    #[test]
    fn external_pods_reference_the_claim() {
        let pod = objects().pod_external("external-claim");
        let spec = pod.spec.unwrap();
        let claim = &spec.resource_claims.as_ref().unwrap()[0];
        assert_eq!(
            (claim.name.as_str(), claim.resource_claim_name.as_deref()),
            (EXTERNAL_CLAIM_NAME, Some("external-claim"))
        );
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(
            spec.containers[0].resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name,
            EXTERNAL_CLAIM_NAME
        );
        assert_eq!(objects().pod_external_multiple("c").spec.unwrap().containers.len(), 3);
    }

    #[test]
    fn restricted_security_contexts_parse() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {},
            "spec": {
                "securityContext": restricted_pod_security(),
                "containers": [{ "name": "c", "securityContext": restricted_container_security() }],
            },
        }))
        .unwrap();
        let spec = pod.spec.unwrap();
        let psc = spec.security_context.unwrap();
        assert_eq!((psc.run_as_non_root, psc.run_as_user), (Some(true), Some(NON_ROOT_USER)));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let csc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    }
}
