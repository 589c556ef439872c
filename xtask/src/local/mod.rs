//! The local provider: a real single-node Kubernetes built from official Go modules and run as
//! child processes of xtask (no Docker, no registry): etcd → kube-apiserver → RBAC →
//! kube-controller-manager → kube-scheduler → containerd (CDI on) → images → kubelet, all on
//! 127.0.0.1, pods without a default route, no kube-proxy and no DNS.

mod build;
mod components;
mod host;
mod images;
mod layout;
mod pki;
mod process;
mod teardown;
mod wait;

use std::{fs, path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    rbac::v1::ClusterRoleBinding,
    resource::v1::ResourceClaimTemplate,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

pub use layout::Layout;

use self::{
    build::{Binaries, Versions},
    layout::{NODE_NAME, ports},
    process::Supervisor,
};
use crate::{
    cli::repo_root,
    cluster_config::ClusterConfig,
    kube_api::{client_for, node_is_ready},
    progress::Step,
};

/// Component names in start order.
const START_ORDER: [&str; 6] =
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet"];

/// The local cluster of this repository.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    layout: Layout,
    sup: Supervisor,
}

impl LocalCluster {
    /// The local cluster with the default layout.
    pub fn new() -> Result<Self> {
        let layout = Layout::from_env(repo_root())?;
        let sup = Supervisor::new(layout.pids(), layout.logs());
        Ok(Self { layout, sup })
    }

    /// The admin kubeconfig of the cluster.
    pub fn kubeconfig(&self) -> PathBuf {
        self.layout.kubeconfig()
    }

    /// Whether every component runs.
    fn all_running(&self) -> bool {
        START_ORDER.iter().all(|name| self.sup.is_running(name))
    }

    /// Whether the cluster runs and its apiserver is ready.
    pub async fn is_up(&self) -> bool {
        self.all_running() && readyz(self.kubeconfig()).await.unwrap_or(false)
    }

    /// What a stopped cluster would have left behind: running processes of its binaries, mounts
    /// below its paths, listening ports, its bridge and the kubelet's cgroups. Empty when clean.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for name in START_ORDER {
            if self.sup.is_running(name) {
                left.push(format!("{name} still runs"));
            }
        }
        let builds = self.layout.cache.join("bin");
        for pid in teardown::processes_running_from(&builds) {
            left.push(format!("process {pid} runs a binary built under {}", builds.display()));
        }
        for mount in teardown::mounts_below(&teardown::cluster_mount_roots(&self.layout)) {
            left.push(format!("mount {}", mount.display()));
        }
        for (port, owner) in ports::ALL {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                left.push(format!("port {port} ({owner}) is still in use"));
            }
        }
        if std::path::Path::new("/sys/class/net").join(components::BRIDGE).exists() {
            left.push(format!("network bridge {}", components::BRIDGE));
        }
        if let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") {
            for h in hierarchies.filter_map(|e| e.ok()) {
                if h.path().join("kubepods").exists() {
                    left.push(format!("cgroup {}", h.path().join("kubepods").display()));
                }
            }
        }
        for dir in [self.layout.kubelet_root(), self.layout.run.clone(), self.layout.containerd_root()] {
            if dir.exists() {
                left.push(format!("directory {}", dir.display()));
            }
        }
        left
    }

    /// Brings the cluster up; does nothing but report when it already runs.
    pub async fn up(&self) -> Result<PathBuf> {
        let total = std::time::Instant::now();
        host::require_root()?;
        if self.all_running() && self.admin_client().await.is_ok() {
            eprintln!("the local cluster already runs");
            self.print_kubeconfig();
            return Ok(self.kubeconfig());
        }
        if !self.sup.recorded().is_empty() || self.layout.state.join("config").exists() {
            eprintln!("==> found state of an earlier local cluster: cleaning it up first");
            self.down().await?;
        }
        let step =
            Step::start("check host prerequisites (root, go, libseccomp-dev, CNI plugins, busybox-static)");
        host::ensure_packages()?;
        check_ports_free()?;
        check_kubelet_root_free(&self.layout)?;
        step.done();

        let versions = Versions::read(&self.layout)?;
        let bins = build::ensure(&self.layout, &versions)?;
        fs::create_dir_all(&self.layout.state)?;
        fs::write(self.layout.state.join("bin-dir"), bins.dir.display().to_string())?;
        // Logs of the previous run stay until now, for debugging.
        if let Some(problem) = teardown::remove_dir(&self.layout.logs()) {
            bail!("{problem}");
        }

        match self.start(&bins, &versions).await {
            Ok(()) => {
                eprintln!(
                    "==> local cluster up: Kubernetes {} on node {NODE_NAME} ({} in all)",
                    versions.kubernetes,
                    crate::progress::human(total.elapsed())
                );
                self.print_kubeconfig();
                Ok(self.kubeconfig())
            }
            Err(err) => {
                eprintln!(
                    "==> cluster up failed; stopping what was started (logs stay in {})",
                    self.layout.logs().display()
                );
                if let Err(down_err) = self.down().await {
                    eprintln!("warning: clean-up after the failed start also failed: {down_err:#}");
                }
                Err(err)
            }
        }
    }

    fn print_kubeconfig(&self) {
        println!("{}", self.kubeconfig().display());
        eprintln!("    export KUBECONFIG={}", self.kubeconfig().display());
    }

    async fn start(&self, bins: &Binaries, versions: &Versions) -> Result<()> {
        let cluster = ClusterConfig::load(&repo_root().join("kind.yaml"))
            .context("read feature gates and runtime-config from kind.yaml")?;
        let step = Step::start("generate certificates and kubeconfigs");
        let pki = pki::ensure(&self.layout)?;
        step.done();
        for dir in [self.layout.kubelet_root(), self.layout.cdi_dir(), self.layout.run.clone()] {
            fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        }

        let step = Step::start(format!("start etcd {}", versions.etcd));
        self.sup.start(&components::etcd(bins, &self.layout))?;
        wait::until("healthy", Duration::from_secs(60), Some((&self.sup, "etcd")), etcd_healthy).await?;
        step.done();

        let step = Step::start("start kube-apiserver");
        self.sup.start(&components::apiserver(bins, &pki, &cluster))?;
        let kubeconfig = self.kubeconfig();
        wait::until("ready (/readyz)", Duration::from_secs(120), Some((&self.sup, "kube-apiserver")), || {
            readyz(kubeconfig.clone())
        })
        .await?;
        let client = self.admin_client().await?;
        grant_apiserver_kubelet_access(&client).await?;
        step.done();

        let step = Step::start("start kube-controller-manager");
        self.sup.start(&components::controller_manager(bins, &self.layout, &pki, &cluster))?;
        wait::until("healthy", Duration::from_secs(90), Some((&self.sup, "kube-controller-manager")), || {
            component_healthz(ports::CONTROLLER_MANAGER)
        })
        .await?;
        step.done();

        let step = Step::start("start kube-scheduler");
        self.sup.start(&components::scheduler(bins, &self.layout, &cluster)?)?;
        wait::until("healthy", Duration::from_secs(90), Some((&self.sup, "kube-scheduler")), || {
            component_healthz(ports::SCHEDULER)
        })
        .await?;
        step.done();

        let step = Step::start(format!("start containerd {} (CDI on)", versions.containerd));
        self.sup.start(&components::containerd(bins, &self.layout)?)?;
        let socket = self.layout.containerd_socket();
        let ctr_bins = bins.clone();
        wait::until(
            "serving on its socket",
            Duration::from_secs(60),
            Some((&self.sup, "containerd")),
            || {
                let (bins, socket) = (ctr_bins.clone(), socket.clone());
                async move { Ok(images::ctr(&bins, &socket, &["version"]).is_ok()) }
            },
        )
        .await?;
        step.done();

        let step = Step::start(
            "build and import the pause, busybox, hostpathplugin and sample device plugin images",
        );
        images::build_and_import(bins, &self.layout)?;
        step.done();

        let step = Step::start(format!("start kubelet {} (cgroup v1 allowed)", versions.kubernetes));
        host::save_sysctls(&self.layout)?;
        self.sup.start(&components::kubelet(bins, &self.layout, &pki, &cluster)?)?;
        let nodes: Api<Node> = Api::all(client.clone());
        wait::until(
            &format!("node {NODE_NAME} Ready"),
            Duration::from_secs(180),
            Some((&self.sup, "kubelet")),
            || node_ready(nodes.clone()),
        )
        .await?;
        step.done();

        let step = Step::start("check that the resourceclaim controller generates claims");
        let probe = ClaimControllerProbe::new(client.clone());
        let result = wait::until(
            "a ResourceClaim generated for a probe pod",
            Duration::from_secs(90),
            Some((&self.sup, "kube-controller-manager")),
            || probe.claim_generated(),
        )
        .await;
        probe.clean_up().await;
        result?;
        step.done();
        Ok(())
    }

    /// A client with the admin kubeconfig.
    pub async fn admin_client(&self) -> Result<Client> {
        client_for(&self.kubeconfig()).await
    }

    /// Stops every process the cluster started (by recorded PID) and removes its containers,
    /// mounts, cgroups, bridge, sockets and state. Safe to run at any point, also twice.
    pub async fn down(&self) -> Result<()> {
        host::require_root()?;
        let step = Step::start("stop the local cluster");
        let mut problems: Vec<String> = Vec::new();
        let bin_dir = fs::read_to_string(self.layout.state.join("bin-dir")).ok().map(PathBuf::from);
        let grace = Duration::from_secs(15);

        if let Err(e) = self.sup.stop("kubelet", grace) {
            problems.push(format!("{e:#}"));
        }
        if let Some(dir) = &bin_dir
            && self.sup.is_running("containerd")
        {
            let endpoint = format!("unix://{}", self.layout.containerd_socket().display());
            let out = std::process::Command::new(dir.join("kube"))
                .args(["cri-reset", "--endpoint", &endpoint, "--timeout", "2m"])
                .output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => problems.push(format!(
                    "removing pods through the CRI failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => problems.push(format!("cannot run kube cri-reset: {e}")),
            }
        }
        for name in ["containerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"] {
            if let Err(e) = self.sup.stop(name, grace) {
                problems.push(format!("{e:#}"));
            }
        }
        // Anything else recorded (none today) goes too.
        for name in self.sup.recorded() {
            if let Err(e) = self.sup.stop(&name, grace) {
                problems.push(format!("{e:#}"));
            }
        }
        if let Some(dir) = &bin_dir {
            problems.extend(teardown::delete_leftover_containers(&self.layout, &dir.join("runc")));
            for pid in teardown::processes_running_from(dir) {
                if let Ok(start_time) = process::read_start_time(pid)
                    && let Err(e) = process::stop_process(
                        process::ProcessRecord { pid, start_time },
                        Duration::from_secs(5),
                    )
                {
                    problems.push(format!("leftover process {pid}: {e:#}"));
                }
            }
        }
        problems.extend(teardown::unmount_all(&self.layout));
        problems.extend(teardown::remove_kubepods_cgroups());
        problems.extend(teardown::remove_bridge());
        if let Err(e) = host::restore_sysctls(&self.layout) {
            problems.push(format!("{e:#}"));
        }
        for dir in [self.layout.kubelet_root(), self.layout.cdi_dir(), self.layout.run.clone()] {
            problems.extend(teardown::remove_dir(&dir));
        }
        problems.extend(teardown::remove_device_mount_sources(&self.layout));
        problems.extend(teardown::remove_state_except_logs(&self.layout)?);
        problems.extend(self.leftovers());
        if problems.is_empty() {
            step.done();
            Ok(())
        } else {
            step.finish("incomplete");
            bail!("cluster down could not remove everything:\n  {}", problems.join("\n  "))
        }
    }

    /// Prints which components run, with their PIDs, and whether the node is Ready.
    pub async fn status(&self) -> Result<bool> {
        let mut all = true;
        for name in START_ORDER {
            match self.sup.record(name).filter(|r| process::is_alive(*r)) {
                Some(r) => println!("{name:<24} running (pid {})", r.pid),
                None => {
                    all = false;
                    println!("{name:<24} not running");
                }
            }
        }
        if self.sup.is_running("kube-apiserver")
            && let Ok(client) = self.admin_client().await
        {
            let ready = node_ready(Api::all(client)).await.unwrap_or(false);
            println!("node {NODE_NAME:<19} {}", if ready { "Ready" } else { "not Ready" });
            all &= ready;
        }
        println!("kubeconfig               {}", self.kubeconfig().display());
        Ok(all)
    }
}

fn check_ports_free() -> Result<()> {
    check_ports(&ports::ALL)
}

fn check_ports(ports: &[(u16, &str)]) -> Result<()> {
    for &(port, owner) in ports {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!(
                "port {port} on 127.0.0.1, which {owner} needs, is in use by another process; stop that process (if it is a leftover of this cluster, run `cargo xtask cluster down --provider local`)"
            );
        }
    }
    Ok(())
}

/// Refuses to share /var/lib/kubelet with another kubelet.
fn check_kubelet_root_free(layout: &Layout) -> Result<()> {
    let root = layout.kubelet_root();
    let busy = fs::read_dir(&root).map(|mut d| d.next().is_some()).unwrap_or(false);
    if busy {
        bail!(
            "{} is not empty: another kubelet may use this machine; the local cluster needs that directory for itself (remove it if it is a leftover)",
            root.display()
        );
    }
    Ok(())
}

async fn etcd_healthy() -> Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", ports::ETCD_CLIENT)).await?;
    stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body.contains("\"health\":\"true\""))
}

async fn readyz(kubeconfig: PathBuf) -> Result<bool> {
    let client = client_for(&kubeconfig).await?;
    let text = client.request_text(http::Request::get("/readyz").body(Vec::new())?).await?;
    Ok(text.trim() == "ok")
}

/// `/healthz` of a component's secure port (its serving certificate is self-signed; /healthz is
/// always allowed without credentials).
async fn component_healthz(port: u16) -> Result<bool> {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    config.accept_invalid_certs = true;
    let client = Client::try_from(config)?;
    let text = client.request_text(http::Request::get("/healthz").body(Vec::new())?).await?;
    Ok(text.trim() == "ok")
}

async fn node_ready(nodes: Api<Node>) -> Result<bool> {
    Ok(nodes.get_opt(NODE_NAME).await?.is_some_and(|node| node_is_ready(&node)))
}

/// The apiserver talks to the kubelet (exec, port-forward, logs) as user `kube-apiserver`.
async fn grant_apiserver_kubelet_access(client: &Client) -> Result<()> {
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kube-apiserver-kubelet-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver"}],
    }))?;
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    api.patch(
        "kube-apiserver-kubelet-admin",
        &PatchParams::apply("dra-e2e-xtask").force(),
        &Patch::Apply(&binding),
    )
    .await
    .context("create the kube-apiserver-kubelet-admin ClusterRoleBinding")?;
    Ok(())
}

/// Proves the resourceclaim controller works: a pod that no scheduler picks up (unknown
/// schedulerName) references a ResourceClaimTemplate, and the controller must generate its claim.
struct ClaimControllerProbe {
    templates: Api<ResourceClaimTemplate>,
    pods: Api<Pod>,
}

impl ClaimControllerProbe {
    const NAME: &str = "dra-e2e-claim-controller-probe";
    const NAMESPACE: &str = "default";

    fn new(client: Client) -> Self {
        Self {
            templates: Api::namespaced(client.clone(), Self::NAMESPACE),
            pods: Api::namespaced(client, Self::NAMESPACE),
        }
    }

    /// Creates the template and pod (idempotent) and says whether the claim was generated.
    async fn claim_generated(&self) -> Result<bool> {
        let template: ResourceClaimTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": Self::NAME},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "probe", "exactly": {"deviceClassName": Self::NAME}}
            ]}}},
        }))?;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": Self::NAME},
            "spec": {
                "schedulerName": "dra-e2e-no-scheduler",
                "resourceClaims": [{"name": "probe", "resourceClaimTemplateName": Self::NAME}],
                "containers": [{"name": "probe", "image": images::PAUSE, "resources": {"claims": [{"name": "probe"}]}}],
            },
        }))?;
        let params = PatchParams::apply("dra-e2e-xtask").force();
        self.templates.patch(Self::NAME, &params, &Patch::Apply(&template)).await?;
        let pod = self.pods.patch(Self::NAME, &params, &Patch::Apply(&pod)).await?;
        Ok(pod
            .status
            .and_then(|s| s.resource_claim_statuses)
            .is_some_and(|statuses| statuses.iter().any(|s| s.resource_claim_name.is_some())))
    }

    /// Deletes the probe's objects (the generated claim goes with the pod, its owner).
    async fn clean_up(&self) {
        let params = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        let _ = self.pods.delete(Self::NAME, &params).await;
        let _ = self.templates.delete(Self::NAME, &Default::default()).await;
    }
}

/// `cluster up --provider local`.
pub async fn up() -> Result<PathBuf> {
    LocalCluster::new()?.up().await
}

/// `cluster down --provider local`.
pub async fn down() -> Result<()> {
    LocalCluster::new()?.down().await
}

/// `cluster status --provider local`.
pub async fn status() -> Result<bool> {
    LocalCluster::new()?.status().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_names_the_port_and_its_component() {
        let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = check_ports(&[(port, "kube-apiserver")]).unwrap_err().to_string();
        assert!(err.contains(&format!("port {port}")), "{err}");
        assert!(err.contains("kube-apiserver"), "{err}");
        drop(taken);
        check_ports(&[(port, "kube-apiserver")]).unwrap();
    }
}
