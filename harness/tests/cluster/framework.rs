//! The runner against a real cluster. Run through `cargo xtask test`, or:
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored framework::
//! ```
//!
//! Every test fails (never passes silently) when `DRA_E2E_KUBECONFIG` is unset.
// Helpers outside `#[test]` functions unwrap too: a panic there is a test failure.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{AsyncBufReadExt as _, StreamExt as _, TryStreamExt as _};
use harness::framework::{
    ArtifactSource, ClusterBackend, Ctx, FailureKind, KubeBackend, Outcome, Output, OutputBuffer,
    PreflightError, Registry, RunOptions, RunReport, Selection, SpecResult, init_tracing, run_with_backend,
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Pod, ServiceAccount},
    resource::v1::{DeviceClass, DeviceClassSpec, ResourceClaim},
};
use kube::{
    Api, Client,
    api::{ListParams, LogParams, ObjectMeta, PostParams},
    runtime::{WatchStreamExt as _, conditions, wait::await_condition, watcher},
};
use tokio::{io::AsyncBufReadExt as _, sync::Barrier, time::timeout};
use tokio_util::sync::CancellationToken;

use crate::run::kubeconfig;

/// The test pods' image (imported into the local cluster, never pulled).
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
/// Label the self-test binary puts on its namespaces and DeviceClasses.
const SELFTEST_LABEL: &str = "dra-e2e.k8s.io/selftest";

async fn backend() -> Arc<KubeBackend> {
    init_tracing();
    Arc::new(KubeBackend::connect(Some(&kubeconfig())).await.unwrap())
}

/// What specs created, for checks after the run.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<(String, String)>>>);

impl Seen {
    fn add(&self, kind: &str, name: &str) {
        self.0.lock().unwrap().push((kind.to_owned(), name.to_owned()));
    }
    fn all(&self, kind: &str) -> Vec<String> {
        self.0.lock().unwrap().iter().filter(|(k, _)| k == kind).map(|(_, n)| n.clone()).collect()
    }
}

struct Run {
    report: RunReport,
    output: OutputBuffer,
    dir: tempfile::TempDir,
    client: Client,
}

async fn run(registry: Registry, configure: impl FnOnce(&mut RunOptions)) -> Run {
    let backend = backend().await;
    let client = backend.client();
    let dir = tempfile::tempdir().unwrap();
    let (output, buffer) = Output::capture();
    let mut options = RunOptions {
        artifacts: dir.path().join("artifacts"),
        junit: Some(dir.path().join("junit.xml")),
        default_timeout: Duration::from_secs(180),
        namespace_timeout: Duration::from_secs(120),
        output,
        ..RunOptions::default()
    };
    configure(&mut options);
    let report =
        run_with_backend(registry, &Selection::all(), options, backend, CancellationToken::new()).await;
    Run { report, output: buffer, dir, client }
}

/// Asserts that the namespaces and DeviceClasses the specs created are gone
/// (right after the run: the runner waits for them).
async fn assert_nothing_left(client: &Client, seen: &Seen) {
    let namespaces = seen.all("Namespace");
    assert!(!namespaces.is_empty());
    for ns in namespaces {
        let left = Api::<Namespace>::all(client.clone()).get_opt(&ns).await.unwrap();
        assert!(left.is_none(), "namespace {ns} is left: {left:?}");
    }
    for class in seen.all("DeviceClass") {
        let left = Api::<DeviceClass>::all(client.clone()).get_opt(&class).await.unwrap();
        assert!(left.is_none(), "DeviceClass {class} is left");
    }
}

/// Creates a DeviceClass named after the spec and registers its deletion.
async fn create_class(ctx: &Ctx, seen: &Seen) -> SpecResult<String> {
    let classes: Api<DeviceClass> = Api::all(ctx.client().clone());
    let name = ctx.unique_name("framework-test");
    let class = DeviceClass {
        metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec::default()),
    };
    classes.create(&PostParams::default(), &class).await?;
    ctx.delete_at_cleanup(classes, name.clone());
    seen.add("DeviceClass", &name);
    Ok(name)
}

/// A pod that prints a line and sleeps; returns once the line is in its log.
async fn start_logging_pod(ctx: &Ctx, line: &str) -> SpecResult {
    let ns = ctx.namespace();
    // Pods are refused until the service account controller made `default`.
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client().clone(), ns);
    timeout(
        Duration::from_secs(60),
        await_condition(accounts, "default", |sa: Option<&ServiceAccount>| sa.is_some()),
    )
    .await
    .map_err(|_| anyhow::anyhow!("timed out waiting for service account default in {ns}"))??;
    let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "logger"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("echo {line}; exec sleep 3600")],
            }],
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    timeout(Duration::from_secs(120), await_condition(pods.clone(), "logger", conditions::is_pod_running()))
        .await
        .map_err(|_| anyhow::anyhow!("timed out waiting for pod logger to run"))??;
    let params = LogParams { follow: true, container: Some("main".into()), ..LogParams::default() };
    let mut lines = pods.log_stream("logger", &params).await?.lines();
    let found = timeout(Duration::from_secs(60), async {
        while let Some(l) = lines.try_next().await? {
            if l.contains(line) {
                return Ok::<bool, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await
    .map_err(|_| anyhow::anyhow!("timed out waiting for {line:?} in the log of pod logger"))??;
    if !found {
        return Err(anyhow::anyhow!("the log of pod logger ended without {line:?}").into());
    }
    Ok(())
}

struct Note;

#[async_trait::async_trait]
impl ArtifactSource for Note {
    fn name(&self) -> &str {
        "recorded calls"
    }
    async fn collect(&self, dir: &Path) -> anyhow::Result<()> {
        tokio::fs::write(dir.join("calls.yaml"), "calls: []\n").await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn failing_spec_collects_artifacts_and_leaves_nothing_behind() {
    let seen = Seen::default();
    let s = seen.clone();
    let mut reg = Registry::new();
    harness::suite::configure(&mut reg);
    reg.describe_with_labels("[framework]", ["DRA"], |r| {
        r.it("creates a class, a claim and a pod, then fails", move |ctx: Ctx| {
            let seen = s.clone();
            async move {
                seen.add("Namespace", ctx.namespace());
                let class = create_class(&ctx, &seen).await?;
                let claims: Api<ResourceClaim> = Api::namespaced(ctx.client().clone(), ctx.namespace());
                let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "claim-0"},
                    "spec": {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": class}}]}},
                }))?;
                claims.create(&PostParams::default(), &claim).await?;
                ctx.artifact_source(Box::new(Note));
                start_logging_pod(&ctx, "hello-from-the-pod").await?;
                tracing::info!("framework-cluster-marker {class}");
                Err(anyhow::anyhow!("deliberate failure after creating DeviceClass {class}").into())
            }
        });
    });
    let run = run(reg, |_| {}).await;
    let out = run.output.contents();
    let explained = crate::run::explain(&run.report, &out);
    assert_eq!(run.report.exit_code(), 1, "{explained}");
    let spec = &run.report.specs[0];
    let class = &seen.all("DeviceClass")[0];
    // The body's error, as it returned it; where the cluster was disrupted while the spec ran
    // (an API server probe unanswered for 3 s on a loaded machine, say), the runner adds what
    // happened after it, and nothing else may follow.
    let expected = format!("deliberate failure after creating DeviceClass {class}");
    assert!(
        matches!(&spec.outcome, Outcome::Failed { kind: FailureKind::Error, message, .. }
        if message == &expected
            || message.strip_prefix(&expected).is_some_and(|rest| {
                rest.starts_with("; while it ran, the cluster was disrupted: ") && !rest.contains("; and ")
            })),
        "{explained}"
    );

    // the captured log: in the report, printed with the failure, in the JUnit system-out
    assert!(spec.log.contains("framework-cluster-marker"), "{}", spec.log);
    assert!(out.contains("---- captured log ----") && out.contains("framework-cluster-marker"), "{out}");
    let xml = std::fs::read_to_string(run.dir.path().join("junit.xml")).unwrap();
    let junit = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    assert_eq!((junit.tests, junit.failures), (1, 1));
    let case = &junit.test_suites[0].test_cases[0];
    assert_eq!(case.name.as_str(), "[framework] [DRA] creates a class, a claim and a pod, then fails");
    assert!(case.system_out.as_ref().unwrap().as_str().contains("framework-cluster-marker"));

    // the artifacts, collected before the cleanups deleted everything
    let dir = run.dir.path().join("artifacts/framework_DRA_creates_a_class_a_claim_and_a_pod_then_fails");
    assert_eq!(spec.artifacts.as_deref(), Some(dir.as_path()));
    let read =
        |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}; {out}"));
    assert!(read("failure.txt").contains("deliberate failure"));
    assert!(read("spec.log").contains("framework-cluster-marker"));
    let pods = read("pods.yaml");
    assert!(pods.contains("name: logger") && pods.contains("phase: Running"), "{pods}");
    assert!(!pods.contains("managedFields"));
    assert!(read("logs/logger/main.log").contains("hello-from-the-pod"));
    assert!(read("events.yaml").contains("logger"));
    // the suite's DRA objects (harness::suite::configure)
    assert!(read("dra-objects/resourceclaims.yaml").contains("name: claim-0"));
    let classes = read("dra-objects/deviceclasses.yaml");
    assert!(classes.contains(&format!("name: {class}")) && classes.contains("kind: List"), "{classes}");
    assert!(read("recorded_calls/calls.yaml").contains("calls"));

    assert_nothing_left(&run.client, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn passing_spec_leaves_nothing_behind() {
    let seen = Seen::default();
    let s = seen.clone();
    let mut reg = Registry::new();
    reg.it("creates a class and a config map, then passes", move |ctx: Ctx| {
        let seen = s.clone();
        async move {
            seen.add("Namespace", ctx.namespace());
            create_class(&ctx, &seen).await?;
            let maps: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), ctx.namespace());
            let map = ConfigMap {
                metadata: ObjectMeta { name: Some("settings".into()), ..ObjectMeta::default() },
                ..ConfigMap::default()
            };
            maps.create(&PostParams::default(), &map).await?;
            Ok(())
        }
    });
    let run = run(reg, |_| {}).await;
    assert_eq!(run.report.exit_code(), 0, "{}", crate::run::explain(&run.report, &run.output.contents()));
    assert_eq!(run.report.specs[0].outcome, Outcome::Passed);
    assert!(run.report.specs[0].artifacts.is_none());
    assert!(!run.dir.path().join("artifacts").exists());
    assert_nothing_left(&run.client, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_spec_waiting_on_the_cluster_gets_progress_reports_naming_its_wait() {
    let seen = Seen::default();
    let s = seen.clone();
    let mut reg = Registry::new();
    reg.it("waits for a pod nobody creates", move |ctx: Ctx| {
        let seen = s.clone();
        async move {
            seen.add("Namespace", ctx.namespace());
            harness::framework::step("watch for the pod");
            let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
            let waited = harness::wait::objects(
                &pods,
                watcher::Config::default(),
                "a pod in the spec's namespace",
                Duration::from_secs(3),
                |pods| harness::wait::Verdict::done_if(!pods.is_empty()),
            )
            .await;
            assert!(waited.is_err(), "nobody creates a pod, so the wait must time out: {waited:?}");
            Ok(())
        }
    });
    let run = run(reg, |o| {
        o.poll_progress_after = Some(Duration::from_millis(800));
        o.poll_progress_interval = Duration::from_millis(700);
    })
    .await;
    let out = run.output.contents();
    assert_eq!(run.report.exit_code(), 0, "{}", crate::run::explain(&run.report, &out));
    let reports: Vec<&str> = out.split("Automatically polling progress:\n").skip(1).collect();
    assert!(!reports.is_empty(), "a report after 0.8 s of a 3 s wait: {out}");
    // The first report may come while the namespace is still being created (a busy API server
    // takes more than 0.8 s): the one to check is the first made once the body's step began.
    let report = reports.iter().find(|r| r.contains("At [By Step] watch for the pod"));
    let Some(report) = report else { panic!("no progress report names the spec's step: {out}") };
    assert!(report.contains("waits for a pod nobody creates (Spec Runtime: "), "{report}");
    assert!(report.contains(" for: a pod in the spec's namespace (timeout 3s)"), "{report}");
    assert_nothing_left(&run.client, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn timed_out_spec_is_cancelled_and_cleaned_up() {
    let seen = Seen::default();
    let cancelled = Arc::new(AtomicBool::new(false));
    let (s, c) = (seen.clone(), cancelled.clone());
    let mut reg = Registry::new();
    harness::suite::configure(&mut reg);
    reg.it("creates a class, then hangs", move |ctx: Ctx| {
        let (seen, cancelled) = (s.clone(), c.clone());
        async move {
            seen.add("Namespace", ctx.namespace());
            create_class(&ctx, &seen).await?;
            ctx.cancelled().await;
            cancelled.store(true, Ordering::SeqCst);
            Ok(())
        }
    })
    .timeout(Duration::from_secs(5));
    let run = run(reg, |_| {}).await;
    assert_eq!(run.report.exit_code(), 1);
    assert!(matches!(run.report.specs[0].outcome, Outcome::Failed { kind: FailureKind::Timeout, .. }));
    assert!(cancelled.load(Ordering::SeqCst), "the body saw its cancellation token");
    // collected before the cleanup deleted the class
    let class = &seen.all("DeviceClass")[0];
    let classes = std::fs::read_to_string(
        run.dir.path().join("artifacts/creates_a_class_then_hangs/dra-objects/deviceclasses.yaml"),
    )
    .unwrap();
    assert!(classes.contains(&format!("name: {class}")), "{classes}");
    assert!(
        run.report.specs[0]
            .log
            .contains(&format!("cleanup{{what=delete DeviceClass {class}}}: cleanup done"))
    );
    assert_nothing_left(&run.client, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn four_procs_run_four_specs_at_once() {
    let seen = Seen::default();
    let barrier = Arc::new(Barrier::new(4));
    let mut reg = Registry::new();
    for i in 0..4 {
        let (seen, barrier) = (seen.clone(), barrier.clone());
        reg.it(&format!("meets the others {i}"), move |ctx: Ctx| {
            let (seen, barrier) = (seen.clone(), barrier.clone());
            async move {
                seen.add("Namespace", ctx.namespace());
                let maps: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), ctx.namespace());
                let map = ConfigMap {
                    metadata: ObjectMeta { name: Some("here".into()), ..ObjectMeta::default() },
                    ..ConfigMap::default()
                };
                maps.create(&PostParams::default(), &map).await?;
                // Passes only if all four specs are in their bodies at the same time.
                timeout(Duration::from_secs(60), barrier.wait()).await.map_err(|_| {
                    anyhow::anyhow!("timed out waiting for the 3 other specs to run at the same time")
                })?;
                Ok(())
            }
        });
    }
    let run = run(reg, |o| o.procs = 4).await;
    assert_eq!(run.report.passed(), 4, "{}", crate::run::explain(&run.report, &run.output.contents()));
    let mut namespaces = seen.all("Namespace");
    namespaces.sort();
    namespaces.dedup();
    assert_eq!(namespaces.len(), 4, "each spec has its own namespace");
    assert_nothing_left(&run.client, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn preflight_describes_the_cluster() {
    let backend = backend().await;
    let info = backend.preflight().await.unwrap();
    assert!(info.serves(harness::suite::DRA_API), "{info:?}");
    assert!(info.serves("v1"));
    assert!(info.server_version.starts_with("v1."), "{info:?}");
    assert!(info.ready_nodes().count() >= 1, "{info:?}");
    assert!(info.nodes.iter().all(|n| n.kubelet().is_some()), "{info:?}");
    assert!(info.require_nodes(1).is_ok());
    assert!(info.require_nodes(1000).unwrap_err().is_skip());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn unreachable_api_server_fails_preflight() {
    let _ = kubeconfig();
    let dir = tempfile::tempdir().unwrap();
    let bad = unreachable_kubeconfig(dir.path());
    let backend = KubeBackend::connect(Some(&bad)).await.unwrap();
    let error = timeout(Duration::from_secs(30), backend.preflight()).await.unwrap().unwrap_err();
    assert!(matches!(error, PreflightError::Unreachable { .. }), "{error}");
    assert!(error.to_string().starts_with("cannot reach the API server at https://127.0.0.1:1/"), "{error}");
}

/// The admin kubeconfig with the server moved to a port nothing listens on.
fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig()).unwrap()).unwrap();
    for cluster in config["clusters"].as_sequence_mut().unwrap() {
        cluster["cluster"]["server"] = "https://127.0.0.1:1".into();
    }
    let path = dir.join("unreachable.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// Builds `harness/examples/framework_selftest.rs` once and returns its path.
async fn selftest_binary() -> PathBuf {
    static BINARY: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    BINARY
        .get_or_init(|| async {
            tokio::task::spawn_blocking(|| {
                let mut cargo = std::process::Command::new(env!("CARGO"));
                cargo
                    .args([
                        "build",
                        // The workspace's feature unification, as every other build of the
                        // run: `-p harness` alone would build the harness library with other
                        // dependencies, and the next workspace build would rebuild it and
                        // everything above it.
                        "--workspace",
                        "--example",
                        "framework_selftest",
                        "--message-format=json",
                    ])
                    .current_dir(env!("CARGO_MANIFEST_DIR"))
                    .stderr(Stdio::inherit());
                for name in crate::cargo_env::test_only_vars() {
                    cargo.env_remove(name);
                }
                let output = cargo.output().unwrap();
                assert!(output.status.success(), "building the framework_selftest example failed");
                String::from_utf8(output.stdout)
                    .unwrap()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .filter(|m| {
                        m["reason"] == "compiler-artifact" && m["target"]["name"] == "framework_selftest"
                    })
                    .find_map(|m| m["executable"].as_str().map(PathBuf::from))
                    .expect("cargo reported no framework_selftest executable")
            })
            .await
            .unwrap()
        })
        .await
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn bad_flags_and_bad_clusters_exit_2_with_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let binary = selftest_binary().await;
    let bad = unreachable_kubeconfig(dir.path());
    let missing = dir.path().join("missing.kubeconfig");
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["--label-filter", "DRA &&"], "error: invalid --label-filter: operator '&&' is missing"),
        (vec!["--focus", "a["], "error: invalid --focus regex \"a[\": unclosed character class"),
        (vec!["--kubeconfig", missing.to_str().unwrap()], "error: cannot use the kubeconfig"),
        (
            vec!["--kubeconfig", bad.to_str().unwrap()],
            "error: cannot reach the API server at https://127.0.0.1:1/",
        ),
    ];
    for (args, message) in cases {
        let child = tokio::process::Command::new(&binary).args(&args).output();
        let output = timeout(Duration::from_secs(30), child).await.unwrap().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with(message), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
    let listed =
        tokio::process::Command::new(&binary).args(["--list", "--skip", "Slow"]).output().await.unwrap();
    assert_eq!(listed.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "[framework] [DRA] self-test waits with a DeviceClass 1\n[framework] [DRA] self-test waits with a DeviceClass 2\n"
    );
}

/// The self-test binary, running its specs (2 at a time) against the cluster.
async fn spawn_selftest(run_id: &str, dir: &Path, extra_env: &[(&str, &str)]) -> tokio::process::Child {
    let binary = selftest_binary().await;
    tokio::process::Command::new(&binary)
        .args(["--kubeconfig", kubeconfig().to_str().unwrap(), "-p", "2", "--timeout", "5m"])
        .arg("--junit")
        .arg(dir.join("junit.xml"))
        .arg("--artifacts")
        .arg(dir.join("artifacts"))
        .env("FRAMEWORK_SELFTEST_RUN", run_id)
        .envs(extra_env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits until both parallel specs of the self-test made their DeviceClass
/// (so they are in their bodies) and returns their namespaces.
async fn wait_for_selftest_specs(client: &Client, selector: &str) -> Vec<String> {
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let mut names = Vec::new();
    let mut stream = watcher(classes, watcher::Config::default().labels(selector)).applied_objects().boxed();
    let waited = timeout(Duration::from_secs(120), async {
        while let Some(class) = stream.try_next().await.unwrap() {
            let name = class.metadata.name.unwrap();
            if !names.contains(&name) {
                names.push(name);
            }
            if names.len() == 2 {
                return;
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for 2 DeviceClasses labelled {selector}; saw {names:?}");
    let namespaces: Vec<String> = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|ns| ns.metadata.name.unwrap())
        .collect();
    assert_eq!(namespaces.len(), 2, "{namespaces:?}");
    namespaces
}

fn sigint(child: &tokio::process::Child) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn sigint_cancels_running_specs_cleans_up_and_writes_the_report() {
    let client = backend().await.client();
    let dir = tempfile::tempdir().unwrap();
    let run_id = format!("sigint-{}", std::process::id());
    let selector = format!("{SELFTEST_LABEL}={run_id}");
    let child = spawn_selftest(&run_id, dir.path(), &[]).await;
    let spec_namespaces = wait_for_selftest_specs(&client, &selector).await;

    sigint(&child);
    let output = timeout(Duration::from_secs(180), child.wait_with_output()).await.unwrap().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(130), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("Interrupted (SIGINT): cancelling running specs"), "{stderr}");
    assert!(stdout.contains("interrupted (Ctrl-C) while running"), "{stdout}");
    assert!(
        stdout.trim_end().lines().last().unwrap().starts_with("0 passed, 2 failed, 1 skipped in "),
        "{stdout}"
    );

    let xml = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    let report = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    assert_eq!((report.tests, report.failures, report.skipped), (3, 2, 1), "{xml}");

    let classes: Api<DeviceClass> = Api::all(client.clone());
    let left_classes = classes.list(&ListParams::default().labels(&selector)).await.unwrap().items;
    assert!(left_classes.is_empty(), "DeviceClasses left: {left_classes:?}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in spec_namespaces {
        assert!(namespaces.get_opt(&ns).await.unwrap().is_none(), "namespace {ns} is left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn second_sigint_exits_at_once() {
    let client = backend().await.client();
    let dir = tempfile::tempdir().unwrap();
    let run_id = format!("sigint-twice-{}", std::process::id());
    let selector = format!("{SELFTEST_LABEL}={run_id}");
    // Each spec also registers a cleanup that hangs, so the run is still
    // cleaning up when the second SIGINT comes.
    let mut child = spawn_selftest(&run_id, dir.path(), &[("FRAMEWORK_SELFTEST_HANGING_CLEANUP", "1")]).await;
    let spec_namespaces = wait_for_selftest_specs(&client, &selector).await;

    sigint(&child);
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let first = timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            let found = line.contains("Interrupted (SIGINT): cancelling running specs");
            seen.push(line);
            if found {
                return;
            }
        }
    })
    .await;
    assert!(first.is_ok(), "timed out waiting for the first Ctrl-C message; stderr: {seen:?}");
    sigint(&child);
    let rest = timeout(Duration::from_secs(60), async {
        let mut rest = Vec::new();
        while let Some(line) = stderr.next_line().await.unwrap() {
            rest.push(line);
        }
        rest
    })
    .await
    .expect("timed out waiting for the self-test to exit after the second Ctrl-C");
    let status = timeout(Duration::from_secs(60), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("Interrupted twice (SIGINT, then SIGINT): exiting without cleanup.")),
        "{rest:?}"
    );
    assert!(!dir.path().join("junit.xml").exists(), "the second Ctrl-C skips the report");

    // The hanging cleanups kept the rest from running: delete what the self-test left.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for class in classes.list(&ListParams::default().labels(&selector)).await.unwrap().items {
        let name = class.metadata.name.unwrap();
        let _ = classes.delete(&name, &Default::default()).await;
    }
    for ns in &spec_namespaces {
        let _ = namespaces.delete(ns, &Default::default()).await;
    }
    for ns in &spec_namespaces {
        let gone = timeout(
            Duration::from_secs(120),
            await_condition(namespaces.clone(), ns, |n: Option<&Namespace>| n.is_none()),
        )
        .await;
        assert!(gone.is_ok(), "timed out waiting for namespace {ns} to be deleted");
    }
}
