//! The command lines and configuration files of the cluster's components, in start order: etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet. Flags follow
//! hack/local-up-cluster.sh, narrowed to loopback: every listener binds 127.0.0.1, pods get no
//! default route, and there is no kube-proxy or DNS.

use std::{fs, path::Path};

use anyhow::{Context, Result};

use super::{
    nodes::{self, NodeDirs, NodeSpec},
    old_kubelet::OldKubelet,
    pki::{self, Pki},
};

use crate::cluster_config::ClusterConfig;
use crate::common::{
    build::Binaries,
    images,
    layout::{Layout, ports},
    process::ProcessSpec,
};

/// The service CIDR; nothing routes it (no kube-proxy), it only gives Services their IPs.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The pods' DNS server: an address in the service range that nothing serves, so a lookup fails
/// at once inside the machine instead of going out (pods have no default route either).
pub const CLUSTER_DNS: &str = "10.0.0.10";
/// The CNI bridge interface that containerd's bridge plugin creates (inside each node's network
/// namespace; older versions of this cluster created it in the host's).
pub const BRIDGE: &str = "dra-e2e0";
/// The Debian directory of the CNI plugins (package containernetworking-plugins).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Runs `program args` through nsenter with the namespace options `enter` (which ends in `--`).
fn entered(
    name: String,
    enter: Vec<String>,
    program: &Path,
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> ProcessSpec {
    let mut all = enter;
    all.push(p(program));
    all.extend(args);
    ProcessSpec { name, program: "nsenter".into(), args: all, env }
}

fn p(path: impl AsRef<Path>) -> String {
    path.as_ref().display().to_string()
}

fn arg(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

/// Extra `--name=value` flags from kind.yaml (verbosity, vmodule) for one component.
fn extra_args(args: &[(String, String)]) -> Vec<String> {
    args.iter().map(|(k, v)| arg(k, v)).collect()
}

/// etcd, data under the state directory, no fsync (a throw-away test cluster).
/// It runs in the control-plane node's network namespace, like every control-plane component.
pub fn etcd(bins: &Binaries, layout: &Layout, cp: &NodeSpec) -> ProcessSpec {
    let client = format!("http://127.0.0.1:{}", ports::ETCD_CLIENT);
    let peer = format!("http://127.0.0.1:{}", ports::ETCD_PEER);
    entered(
        "etcd".into(),
        nodes::enter_net(cp),
        &bins.kube(),
        vec![
            "etcd".into(),
            arg("name", "dra-e2e"),
            arg("data-dir", p(layout.etcd_data())),
            arg("listen-client-urls", &client),
            arg("advertise-client-urls", &client),
            arg("listen-peer-urls", &peer),
            arg("initial-advertise-peer-urls", &peer),
            arg("initial-cluster", format!("dra-e2e={peer}")),
            arg("unsafe-no-fsync", true),
            arg("log-level", "warn"),
        ],
        vec![],
    )
}

/// kube-apiserver, serving on every address of the control-plane node's namespace (its loopback
/// and the node IP, which it advertises).
pub fn apiserver(bins: &Binaries, pki: &Pki, cluster: &ClusterConfig, cp: &NodeSpec) -> ProcessSpec {
    let mut args = vec![
        "kube-apiserver".into(),
        arg("bind-address", "0.0.0.0"),
        arg("advertise-address", cp.ip),
        arg("secure-port", ports::APISERVER),
        arg("etcd-servers", format!("http://127.0.0.1:{}", ports::ETCD_CLIENT)),
        arg("storage-media-type", "application/vnd.kubernetes.protobuf"),
        arg("client-ca-file", p(pki.client_ca())),
        arg("tls-cert-file", p(pki.file("apiserver.crt"))),
        arg("tls-private-key-file", p(pki.file("apiserver.key"))),
        arg("kubelet-client-certificate", p(pki.cert(pki::APISERVER_KUBELET_CLIENT))),
        arg("kubelet-client-key", p(pki.key(pki::APISERVER_KUBELET_CLIENT))),
        arg("kubelet-certificate-authority", p(pki.server_ca())),
        arg("kubelet-preferred-address-types", "InternalIP,Hostname"),
        arg("service-account-key-file", p(pki.file("sa.pub"))),
        arg("service-account-signing-key-file", p(pki.file("sa.key"))),
        arg("service-account-issuer", "https://kubernetes.default.svc"),
        arg("service-cluster-ip-range", SERVICE_CIDR),
        arg("authorization-mode", "Node,RBAC"),
        arg(
            "enable-admission-plugins",
            "NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,Priority,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,ResourceQuota,NodeRestriction",
        ),
        arg("allow-privileged", true),
        arg("requestheader-client-ca-file", p(pki.file("request-header-ca.crt"))),
        arg("requestheader-allowed-names", "system:auth-proxy"),
        arg("requestheader-username-headers", "X-Remote-User"),
        arg("requestheader-group-headers", "X-Remote-Group"),
        arg("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
        arg("proxy-client-cert-file", p(pki.file("auth-proxy.crt"))),
        arg("proxy-client-key-file", p(pki.file("auth-proxy.key"))),
        arg("profiling", false),
    ];
    let gates = cluster.feature_gates_flag();
    if !gates.is_empty() {
        args.push(arg("feature-gates", gates));
    }
    let runtime_config = cluster.runtime_config_flag();
    if !runtime_config.is_empty() {
        args.push(arg("runtime-config", runtime_config));
    }
    entered("kube-apiserver".into(), nodes::enter_net(cp), &bins.kube(), args, vec![])
}

/// kube-controller-manager with every controller (the resourceclaim controller among them).
pub fn controller_manager(
    bins: &Binaries,
    layout: &Layout,
    pki: &Pki,
    cluster: &ClusterConfig,
    cp: &NodeSpec,
) -> ProcessSpec {
    let kubeconfig = p(pki::kubeconfig_path(layout, pki::CONTROLLER_MANAGER));
    let mut args = vec![
        "kube-controller-manager".into(),
        arg("kubeconfig", &kubeconfig),
        arg("authentication-kubeconfig", &kubeconfig),
        arg("authorization-kubeconfig", &kubeconfig),
        arg("bind-address", "127.0.0.1"),
        arg("secure-port", ports::CONTROLLER_MANAGER),
        arg("service-account-private-key-file", p(pki.file("sa.key"))),
        arg("root-ca-file", p(pki.server_ca())),
        arg("cluster-signing-cert-file", p(pki.client_ca())),
        arg("cluster-signing-key-file", p(pki.file("client-ca.key"))),
        arg("use-service-account-credentials", true),
        arg("controllers", "*"),
        arg("leader-elect", false),
        arg("profiling", false),
    ];
    let gates = cluster.feature_gates_flag();
    if !gates.is_empty() {
        args.push(arg("feature-gates", gates));
    }
    args.extend(extra_args(&cluster.controller_manager_args));
    entered("kube-controller-manager".into(), nodes::enter_net(cp), &bins.kube(), args, vec![])
}

/// kube-scheduler, configured by a KubeSchedulerConfiguration file.
pub fn scheduler(
    bins: &Binaries,
    layout: &Layout,
    cluster: &ClusterConfig,
    cp: &NodeSpec,
) -> Result<ProcessSpec> {
    let kubeconfig = p(pki::kubeconfig_path(layout, pki::SCHEDULER));
    let config = layout.config().join("scheduler.yaml");
    write(
        &config,
        &format!(
            "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
leaderElection:
  leaderElect: false
"
        ),
    )?;
    let mut args = vec![
        "kube-scheduler".into(),
        arg("config", p(&config)),
        arg("authentication-kubeconfig", &kubeconfig),
        arg("authorization-kubeconfig", &kubeconfig),
        arg("bind-address", "127.0.0.1"),
        arg("secure-port", ports::SCHEDULER),
    ];
    let gates = cluster.feature_gates_flag();
    if !gates.is_empty() {
        args.push(arg("feature-gates", gates));
    }
    args.extend(extra_args(&cluster.scheduler_args));
    Ok(entered("kube-scheduler".into(), nodes::enter_net(cp), &bins.kube(), args, vec![]))
}

/// The xtask binary copied into the state directory, which the forwarder runs from (so a
/// rebuild of xtask never replaces the file of a running forwarder).
pub fn forwarder(layout: &Layout, cp: &NodeSpec) -> Result<ProcessSpec> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], ports::APISERVER));
    netns_forwarder(layout, "apiserver-forward", &cp.netns_path(), addr, addr)
}

/// `xtask netns-forward` as the component `name`: listens on `listen` in the host's namespace and
/// connects to `connect` inside `netns`. It runs from a copy of the running xtask of its own
/// (`<state>/bin/xtask-<name>`), so that starting a second forwarder never writes to the file a
/// running one executes.
pub fn netns_forwarder(
    layout: &Layout,
    name: &str,
    netns: &Path,
    listen: std::net::SocketAddr,
    connect: std::net::SocketAddr,
) -> Result<ProcessSpec> {
    let file =
        if name == "apiserver-forward" { "xtask-netns-forward".to_string() } else { format!("xtask-{name}") };
    let copy = layout.state.join("bin").join(file);
    crate::repo::copy_running_xtask(&copy)?;
    Ok(ProcessSpec {
        name: name.into(),
        program: copy,
        args: vec![
            "netns-forward".into(),
            arg("netns", p(netns)),
            arg("listen", listen),
            arg("connect", connect),
        ],
        env: vec![],
    })
}

/// A node's containerd with the CRI plugin: CDI on, our pause image pinned as the sandbox, the
/// node's CNI bridge, and every path of its own under the node's state and run directories. It
/// runs inside the node (its mount and network namespaces).
pub fn containerd(bins: &Binaries, layout: &Layout, node: &NodeSpec) -> Result<ProcessSpec> {
    let dirs = NodeDirs::new(layout, node);
    fs::create_dir_all(dirs.cni_conf_dir())?;
    write(&dirs.cni_conf_dir().join("10-dra-e2e.conflist"), &cni_conflist(&dirs, node))?;
    let config = dirs.config().join("containerd.toml");
    write(&config, &containerd_config(&dirs, &bins.runc()))?;
    // containerd finds its shim and runc on PATH: put the shim we built first.
    let path = format!("{}:{}", p(&bins.dir), std::env::var("PATH").unwrap_or_default());
    Ok(entered(
        node.containerd(),
        nodes::enter_node(layout, node),
        &bins.containerd(),
        vec![arg("config", p(&config))],
        vec![("PATH".into(), path)],
    ))
}

fn containerd_config(dirs: &NodeDirs, runc: &Path) -> String {
    let runc = p(runc);
    let root = p(dirs.containerd_root());
    let state = p(dirs.containerd_state());
    let socket = p(dirs.containerd_socket());
    let runc_root = p(dirs.runc_root());
    let cni_conf = p(dirs.cni_conf_dir());
    let registry_hosts = p(dirs.config().join("certs.d"));
    let sandbox = images::PAUSE;
    format!(
        r#"# Written by `cargo xtask cluster up --provider local`.
version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{root}/opt"

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox}"
  # Registry hosts (<registry>/hosts.toml), read at every pull: `cluster up --registry` adds
  # localhost:5000 here without restarting containerd.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{registry_hosts}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # Without CAP_SYS_RESOURCE (as on the CI VMs) no process may lower its OOM score below its
  # parent's; the kubelet asks -998 for pod sandboxes. Clamp to containerd's own score instead.
  restrict_oom_score_adj = true
  # containerd drops the kubelet's hugepages limits by default; the nodes report hugepages
  # (`cluster up --node-hugepages`), so the containers get their limits as the pods do.
  disable_hugetlb_controller = false
  # /var/run/cdi is the node's own directory (a bind mount in the node's mount namespace).
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}", "/opt/cni/bin"]
    conf_dir = "{cni_conf}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = "{runc}"
      Root = "{runc_root}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
    )
}

/// A bridge network in the node's namespace without gateway or masquerading, and no routes:
/// pods of one node reach each other on the bridge and nothing else. (The kubelet never needs
/// pod IPs: exec and port-forward go through the CRI inside the pod's network namespace.)
fn cni_conflist(dirs: &NodeDirs, node: &NodeSpec) -> String {
    let ipam_dir = p(dirs.cni_ipam_dir());
    let subnet = node.pod_cidr();
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "dra-e2e",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{ipam_dir}",
        "ranges": [[{{ "subnet": "{subnet}" }}]]
      }}
    }}
  ]
}}
"#
    )
}

/// How often the local cluster's kubelets sync every pod (the kubelet's default: 1m). A pod whose
/// NodePrepareResources failed is tried again only at its next sync, 1 to 1.5 periods later (the
/// kubelet ends that sync without an error, so its 10 s back-off does not apply): with the
/// default, specs that wait for that retry ("must retry NodePrepareResources", "blocks new pod
/// after force-delete") wait 60-90 s for the timer alone. The kind lane keeps the default.
pub const KUBELET_SYNC_FREQUENCY: &str = "10s";

/// How often the local cluster's kubelets compute their node's status (the default: 10s). A
/// device plugin's devices appear in the node's allocatable, and go from it, only then; the
/// status is still posted only when it changed or every `nodeStatusReportFrequency` (5m, the
/// default this field would otherwise lower to its own value).
pub const KUBELET_NODE_STATUS_UPDATE_FREQUENCY: &str = "2s";

/// A node's kubelet: cgroup v1 allowed (`failCgroupV1: false`), cgroupfs driver under the node's
/// own cgroup root, listeners on the node IP and the node's loopback only, its serving
/// certificate, low eviction thresholds (small CI disks), no image garbage collection of the
/// imported images, shorter pod sync and node status periods ([`KUBELET_SYNC_FREQUENCY`],
/// [`KUBELET_NODE_STATUS_UPDATE_FREQUENCY`]), and the feature gates of kind.yaml. Runs inside the node; the control plane
/// of a multi-node cluster is registered with kind's NoSchedule taint.
///
/// With `old`, the node runs that older kubelet (version skew) with the same configuration (every
/// field of it exists since v1.31) but only the gates of kind.yaml that its version knows: an
/// unknown gate is a startup error. The gates left out are printed.
pub fn kubelet(
    bins: &Binaries,
    layout: &Layout,
    pki: &Pki,
    cluster: &ClusterConfig,
    node: &NodeSpec,
    node_count: usize,
    old: Option<&OldKubelet>,
) -> Result<ProcessSpec> {
    let dirs = NodeDirs::new(layout, node);
    let config = dirs.config().join("kubelet.yaml");
    let (program, mut args, gates) = match old {
        None => (bins.kube(), vec!["kubelet".to_string()], cluster.feature_gates.clone()),
        Some(old) => {
            let (kept, dropped) = crate::skew::known_gates(&cluster.feature_gates, &old.gates);
            if !dropped.is_empty() {
                eprintln!(
                    "    kubelet {} on {} does not know the gates {}: left out of its configuration",
                    old.version,
                    node.name,
                    dropped.join(", ")
                );
            }
            (old.binary.clone(), Vec::new(), kept)
        }
    };
    let gates: String = gates.iter().map(|(name, on)| format!("  {name}: {on}\n")).collect();
    let gates =
        if gates.is_empty() { "featureGates: {}\n".to_string() } else { format!("featureGates:\n{gates}") };
    write(
        &config,
        &format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
rotateCertificates: false
serverTLSBootstrap: false
tlsCertFile: {tls_cert}
tlsPrivateKeyFile: {tls_key}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS:
- {CLUSTER_DNS}
resolvConf: \"\"
runtimeRequestTimeout: 2m
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: {sync}
nodeStatusUpdateFrequency: {status_update}
nodeStatusReportFrequency: 5m
{gates}",
            address = node.ip,
            sync = KUBELET_SYNC_FREQUENCY,
            status_update = KUBELET_NODE_STATUS_UPDATE_FREQUENCY,
            port = ports::KUBELET,
            healthz = ports::KUBELET_HEALTHZ,
            socket = p(dirs.containerd_socket()),
            cgroup_root = node.cgroup_root(),
            tls_cert = p(pki.kubelet_serving_cert(&node.name)),
            tls_key = p(pki.kubelet_serving_key(&node.name)),
            client_ca = p(pki.client_ca()),
        ),
    )?;
    args.extend([
        arg("config", p(&config)),
        arg("kubeconfig", p(pki::node_kubeconfig_path(layout, &node.name))),
        arg("hostname-override", &node.name),
        arg("node-ip", node.ip),
        arg("root-dir", "/var/lib/kubelet"),
    ]);
    if node.control_plane && node_count > 1 {
        args.push(arg("register-with-taints", CONTROL_PLANE_TAINT));
    }
    args.extend(extra_args(&cluster.kubelet_args));
    Ok(entered(node.kubelet(), nodes::enter_node(layout, node), &program, args, vec![]))
}

/// kind's control-plane label (set by xtask after registration: the kubelet may not set
/// `kubernetes.io` labels on itself).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// kind's control-plane taint, which single-node clusters do not get.
pub const CONTROL_PLANE_TAINT: &str = "node-role.kubernetes.io/control-plane:NoSchedule";

fn write(path: &Path, contents: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, contents).with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_config_has_no_route_gateway_or_masquerade() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let node = &nodes::cluster_nodes(2)[1];
        let conf: serde_json::Value =
            serde_json::from_str(&cni_conflist(&NodeDirs::new(&layout, node), node)).unwrap();
        assert_eq!(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["isGateway"], false);
        assert_eq!(bridge["ipMasq"], false);
        assert!(bridge["ipam"].get("routes").is_none());
    }

    #[test]
    fn containerd_config_keeps_to_our_paths() {
        let layout = Layout::from_env(crate::repo::repo_root()).unwrap();
        let dirs = NodeDirs::new(&layout, &nodes::cluster_nodes(1)[0]);
        let config = containerd_config(&dirs, Path::new("/cache/bin/runc"));
        assert!(config.contains("enable_cdi = true"));
        assert!(config.contains("restrict_oom_score_adj = true"));
        assert!(config.contains("disable_hugetlb_controller = false"));
        assert!(config.contains("BinaryName = \"/cache/bin/runc\""));
        assert!(config.contains(&format!("sandbox = \"{}\"", images::PAUSE)));
        for forbidden in ["/var/lib/containerd", "/run/containerd", "/opt/containerd\""] {
            assert!(!config.contains(forbidden), "{forbidden} in\n{config}");
        }
    }
}
