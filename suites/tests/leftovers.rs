//! Cluster test (`#[ignore]`d; `cargo xtask test` runs it with `DRA_E2E_KUBECONFIG`): leftovers
//! of a killed run. A run SIGKILLed mid-spec (its driver's RBAC, namespace and a pod with a claim
//! exist) leaves its objects behind; at once (its Lease not expired yet: its holder process on this
//! machine is gone), `dra-e2e cleanup --keep-leftovers` reports them and removes nothing, and the
//! next run reports and removes them, while a third, live run on the same cluster is untouched and
//! passes. Objects without a run identity are
//! never touched; objects of a run without a Lease are removed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use harness::framework::{LEASE_DURATION, LEASE_NAMESPACE, RUN_LABEL, lease_name};
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    coordination::v1::Lease,
    core::v1::{Namespace, Pod},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
    resource::v1::{DeviceClass, ResourceSlice},
};
use kube::{
    Api, Client, Resource, ResourceExt as _,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    process::{Child, Command},
};

const BIN: &str = env!("CARGO_BIN_EXE_dra-e2e");
/// A kubelet spec: a driver with RBAC and admission policies, then a pod with a claim.
const KILLED_FOCUS: &str = r"kubelet \[Feature:DynamicResourceAllocation\] must call NodePrepareResources even if not used by any container";
/// A short control-plane spec (a namespace, a DeviceClass, claims).
const LIVE_FOCUS: &str = r"\] control plane supports claim and class parameters";
/// How often the live run repeats LIVE_FOCUS (about 7 s each): it must outlive A's Lease
/// (30 s) and B's sweep.
const LIVE_REPEAT: &str = "10";
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

fn kubeconfig() -> PathBuf {
    PathBuf::from(std::env::var("DRA_E2E_KUBECONFIG").expect("DRA_E2E_KUBECONFIG names the cluster"))
}

async fn client() -> Client {
    let kc = Kubeconfig::read_from(kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

/// A `dra-e2e` child process; its stdout is collected line by line.
struct Run {
    child: Child,
    id: String,
    stdout: Arc<Mutex<Vec<String>>>,
}

impl Run {
    /// Starts `dra-e2e args` and waits for the line naming its run identity.
    async fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout: Arc<Mutex<Vec<String>>> = Arc::default();
        let (id_tx, id_rx) = tokio::sync::oneshot::channel();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let collected = stdout.clone();
        tokio::spawn(async move {
            let mut id_tx = Some(id_tx);
            let prefix = format!("Run {RUN_LABEL}=");
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.strip_prefix(&prefix)
                    && let Some(tx) = id_tx.take()
                {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_owned());
                }
                collected.lock().unwrap().push(line);
            }
        });
        let id = tokio::time::timeout(Duration::from_secs(60), id_rx)
            .await
            .expect("the run names its identity within 60s")
            .expect("the run names its identity before its output ends");
        Self { child, id, stdout }
    }

    async fn wait(&mut self) -> i32 {
        let status =
            tokio::time::timeout(RUN_TIMEOUT, self.child.wait()).await.expect("the run ends").unwrap();
        // Let the reader take the last lines.
        tokio::time::sleep(Duration::from_millis(200)).await;
        status.code().unwrap_or(-1)
    }

    fn output(&self) -> String {
        self.stdout.lock().unwrap().join("\n")
    }
}

/// `dra-e2e args` to its end: exit code and stdout.
async fn run_to_end(args: &[&str]) -> (i32, String) {
    let output = tokio::time::timeout(
        RUN_TIMEOUT,
        Command::new(BIN).args(args).arg("--kubeconfig").arg(kubeconfig()).kill_on_drop(true).output(),
    )
    .await
    .expect("the command ends")
    .unwrap();
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

fn kind<K: Resource<DynamicType = ()>>(namespaced: bool) -> (ApiResource, bool) {
    (ApiResource::erase::<K>(&()), namespaced)
}

/// `Kind ns/name` of every object labelled with `run_id`, of the kinds a kubelet spec creates.
async fn objects_of(client: &Client, run_id: &str) -> Vec<String> {
    let kinds: [(ApiResource, bool); 9] = [
        kind::<Namespace>(false),
        kind::<Pod>(true),
        kind::<ClusterRole>(false),
        kind::<ClusterRoleBinding>(false),
        kind::<ValidatingAdmissionPolicy>(false),
        kind::<ValidatingAdmissionPolicyBinding>(false),
        kind::<DeviceClass>(false),
        kind::<ResourceSlice>(false),
        kind::<Lease>(true),
    ];
    let mut found = Vec::new();
    for (resource, namespaced) in kinds {
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let list =
            api.list_metadata(&ListParams::default().labels(&format!("{RUN_LABEL}={run_id}"))).await.unwrap();
        for object in list.items {
            let ns = if namespaced {
                format!("{}/", object.namespace().unwrap_or_default())
            } else {
                String::new()
            };
            found.push(format!("{} {ns}{}", resource.kind, object.name_any()));
        }
    }
    found.sort();
    found
}

/// Waits until `done(objects of run_id)`.
async fn wait_for_objects(
    client: &Client,
    run_id: &str,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let objects = objects_of(client, run_id).await;
        if done(&objects) {
            return objects;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after 240s waiting for {what}; run {run_id} has {objects:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn has(objects: &[String], kind: &str) -> bool {
    objects.iter().any(|o| o.starts_with(&format!("{kind} ")))
}

async fn cluster_role(api: &Api<ClusterRole>, name: &str, run: Option<&str>) {
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: run.map(|r| [(RUN_LABEL.to_owned(), r.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..ClusterRole::default()
    };
    api.create(&PostParams::default(), &role).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_killed_runs_leftovers_are_removed_by_the_next_run_and_a_live_run_is_untouched() {
    let client = client().await;
    let roles = Api::<ClusterRole>::all(client.clone());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let suffix = format!("{:x}{nanos:x}", std::process::id());
    let plain = format!("dra-e2e-leftovers-test-plain-{suffix}");
    let orphan = format!("dra-e2e-leftovers-test-orphan-{suffix}");
    let orphan_run = format!("no-lease-{suffix}");
    cluster_role(&roles, &plain, None).await;

    let result = tokio::spawn(scenario(client.clone(), plain.clone(), orphan.clone(), orphan_run)).await;

    for name in [&plain, &orphan] {
        let _ = roles.delete(name, &DeleteParams::default()).await;
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn scenario(client: Client, plain: String, orphan: String, orphan_run: String) {
    let roles = Api::<ClusterRole>::all(client.clone());

    // A: SIGKILLed once its driver's RBAC, namespace and a pod of the spec exist.
    let mut killed = Run::start(&["--focus", KILLED_FOCUS]).await;
    wait_for_objects(&client, &killed.id, "the killed run's RBAC, namespace and pod", |o| {
        has(o, "ClusterRole") && has(o, "ClusterRoleBinding") && has(o, "Namespace") && has(o, "Pod")
    })
    .await;

    // C: a live run side by side, started while A still lives (a new run removes gone runs'
    // leftovers itself), long enough to outlive B's sweep.
    let mut live = Run::start(&["--focus", LIVE_FOCUS, "--repeat", LIVE_REPEAT]).await;
    wait_for_objects(&client, &live.id, "the live run's namespace", |o| has(o, "Namespace")).await;
    // After C's own sweep: a run without a Lease, whose objects the next run removes.
    cluster_role(&roles, &orphan, Some(&orphan_run)).await;

    killed.child.start_kill().unwrap();
    killed.child.wait().await.unwrap();
    let left = objects_of(&client, &killed.id).await;
    println!("killed run {} left {} objects: {left:?}", killed.id, left.len());
    assert!(left.iter().any(|o| o.starts_with("Lease ")), "{left:?}");

    // Its Lease has not expired (LEASE_DURATION after its last renewal), but its holder, a process
    // of this machine, is gone: the run is taken for gone at once.
    let lease =
        Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE).get(&lease_name(&killed.id)).await.unwrap();
    let renewed = lease.spec.and_then(|s| s.renew_time).unwrap().0;
    assert!(
        k8s_openapi::jiff::Timestamp::now().duration_since(renewed).as_secs_f64()
            < LEASE_DURATION.as_secs_f64(),
        "the killed run's Lease expired before the sweep: this no longer tests the dead holder"
    );

    // Report only.
    let (code, report) = run_to_end(&["cleanup", "--keep-leftovers"]).await;
    println!("cleanup --keep-leftovers:\n{report}");
    assert_eq!(code, 0, "{report}");
    assert!(report.contains(&format!("  run {} (its process (pid ", killed.id)), "{report}");
    assert!(report.contains("keeping them (--keep-leftovers)"), "{report}");
    assert!(!report.contains(&format!("  run {} ", live.id)), "{report}");
    let still = objects_of(&client, &killed.id).await;
    assert!(has(&still, "ClusterRole") && has(&still, "Namespace") && has(&still, "Lease"), "{still:?}");
    assert!(roles.get_opt(&orphan).await.unwrap().is_some(), "--keep-leftovers removed {orphan}");

    // B: the next run reports and removes A's leftovers, and passes.
    assert!(live.child.try_wait().unwrap().is_none(), "the live run ended before the next run's sweep");
    let started = Instant::now();
    let mut next = Run::start(&["--focus", LIVE_FOCUS]).await;
    let code = next.wait().await;
    let output = next.output();
    println!("next run ({:.1}s):\n{output}", started.elapsed().as_secs_f64());
    assert_eq!(code, 0, "{output}");
    assert!(output.contains(&format!("  run {} (its process (pid ", killed.id)), "{output}");
    for object in left.iter().filter(|o| !o.starts_with("Pod ")) {
        assert!(output.contains(&format!("    {object}")), "{object} not reported:\n{output}");
    }
    assert!(output.contains("Removed the leftovers of"), "{output}");
    assert!(!output.contains(&format!("  run {} ", live.id)), "{output}");
    assert_eq!(
        objects_of(&client, &killed.id).await,
        Vec::<String>::new(),
        "the killed run's objects remain"
    );
    assert!(
        Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
            .get_opt(&lease_name(&killed.id))
            .await
            .unwrap()
            .is_none()
    );
    for object in left.iter().filter_map(|o| o.strip_prefix("Namespace ")) {
        assert!(Api::<Namespace>::all(client.clone()).get_opt(object).await.unwrap().is_none(), "{object}");
    }
    // A run without a Lease is gone too; an object without a run identity is never touched.
    assert!(roles.get_opt(&orphan).await.unwrap().is_none(), "{orphan} (a run without Lease) remains");
    assert!(roles.get_opt(&plain).await.unwrap().is_some(), "{plain} (no run identity) was removed");

    // C was not disturbed: it passes, and leaves nothing (its Lease deleted on its clean exit).
    let code = live.wait().await;
    let output = live.output();
    assert_eq!(code, 0, "the live run failed:\n{output}");
    assert!(
        output
            .lines()
            .any(|l| l.starts_with("Live runs on this cluster (not touched): ") && l.contains(&killed.id)),
        "the live run did not see the killed run live at its start:\n{output}"
    );
    assert!(!output.contains(&format!("  run {} ", killed.id)), "{output}");
    assert_eq!(objects_of(&client, &live.id).await, Vec::<String>::new());
    assert_eq!(objects_of(&client, &next.id).await, Vec::<String>::new());
}
