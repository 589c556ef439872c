//! The command lines and configuration files of the cluster's components, in start order: etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet. Flags follow
//! hack/local-up-cluster.sh, narrowed to loopback: every listener binds 127.0.0.1, pods get no
//! default route, and there is no kube-proxy or DNS.

use std::{fs, path::Path};

use anyhow::{Context, Result};

use super::{
    build::Binaries,
    images,
    layout::{Layout, NODE_NAME, ports},
    pki::{self, Pki},
    process::ProcessSpec,
};
use crate::cluster_config::ClusterConfig;

/// The service CIDR; nothing routes it (no kube-proxy), it only gives Services their IPs.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The pod CIDR of the CNI bridge; chosen to clash with nothing on the machine.
pub const POD_CIDR: &str = "10.88.0.0/16";
/// The pods' DNS server: an address in the service range that nothing serves, so a lookup fails
/// at once inside the machine instead of going out (pods have no default route either).
pub const CLUSTER_DNS: &str = "10.0.0.10";
/// The CNI bridge interface that containerd's bridge plugin creates.
pub const BRIDGE: &str = "dra-e2e0";
/// The Debian directory of the CNI plugins (package containernetworking-plugins).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

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
pub fn etcd(bins: &Binaries, layout: &Layout) -> ProcessSpec {
    let client = format!("http://127.0.0.1:{}", ports::ETCD_CLIENT);
    let peer = format!("http://127.0.0.1:{}", ports::ETCD_PEER);
    ProcessSpec {
        name: "etcd",
        program: bins.kube(),
        args: vec![
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
        env: vec![],
    }
}

/// kube-apiserver.
pub fn apiserver(bins: &Binaries, pki: &Pki, cluster: &ClusterConfig) -> ProcessSpec {
    let mut args = vec![
        "kube-apiserver".into(),
        arg("bind-address", "127.0.0.1"),
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
    ProcessSpec { name: "kube-apiserver", program: bins.kube(), args, env: vec![] }
}

/// kube-controller-manager with every controller (the resourceclaim controller among them).
pub fn controller_manager(
    bins: &Binaries,
    layout: &Layout,
    pki: &Pki,
    cluster: &ClusterConfig,
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
    ProcessSpec { name: "kube-controller-manager", program: bins.kube(), args, env: vec![] }
}

/// kube-scheduler, configured by a KubeSchedulerConfiguration file.
pub fn scheduler(bins: &Binaries, layout: &Layout, cluster: &ClusterConfig) -> Result<ProcessSpec> {
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
    Ok(ProcessSpec { name: "kube-scheduler", program: bins.kube(), args, env: vec![] })
}

/// containerd with the CRI plugin: CDI on, our pause image pinned as the sandbox, the CNI bridge
/// from the state directory, and every path of its own under the state and run directories (no
/// /var/lib/containerd, /run/containerd, /opt/containerd or NRI socket of the machine is touched).
pub fn containerd(bins: &Binaries, layout: &Layout) -> Result<ProcessSpec> {
    fs::create_dir_all(layout.cni_conf_dir())?;
    write(&layout.cni_conf_dir().join("10-dra-e2e.conflist"), &cni_conflist(layout))?;
    let config = layout.config().join("containerd.toml");
    write(&config, &containerd_config(layout, &bins.runc()))?;
    // containerd finds its shim and runc on PATH: put the shim we built first.
    let path = format!("{}:{}", p(&bins.dir), std::env::var("PATH").unwrap_or_default());
    Ok(ProcessSpec {
        name: "containerd",
        program: bins.containerd(),
        args: vec![arg("config", p(&config))],
        env: vec![("PATH".into(), path)],
    })
}

fn containerd_config(layout: &Layout, runc: &Path) -> String {
    let runc = p(runc);
    let root = p(layout.containerd_root());
    let state = p(layout.containerd_state());
    let socket = p(layout.containerd_socket());
    let runc_root = p(layout.runc_root());
    let cni_conf = p(layout.cni_conf_dir());
    let cdi = p(layout.cdi_dir());
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

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # Without CAP_SYS_RESOURCE (as on the CI VMs) no process may lower its OOM score below its
  # parent's; the kubelet asks -998 for pod sandboxes. Clamp to containerd's own score instead.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "{cdi}"]
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

/// A bridge network without gateway or masquerading, and no routes: pods reach each other on the
/// bridge and nothing else. (The kubelet never needs pod IPs: exec and port-forward go through the
/// CRI inside the pod's network namespace.)
fn cni_conflist(layout: &Layout) -> String {
    let ipam_dir = p(layout.state.join("cni-ipam"));
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
        "ranges": [[{{ "subnet": "{POD_CIDR}" }}]]
      }}
    }}
  ]
}}
"#
    )
}

/// The kubelet: cgroup v1 allowed (`failCgroupV1: false`), cgroupfs driver, loopback-only
/// listeners, our serving certificate, low eviction thresholds (small CI disks), no image garbage
/// collection of the imported images, and the feature gates of kind.yaml.
pub fn kubelet(bins: &Binaries, layout: &Layout, pki: &Pki, cluster: &ClusterConfig) -> Result<ProcessSpec> {
    let config = layout.config().join("kubelet.yaml");
    let gates: String = cluster.feature_gates.iter().map(|(name, on)| format!("  {name}: {on}\n")).collect();
    let gates =
        if gates.is_empty() { "featureGates: {}\n".to_string() } else { format!("featureGates:\n{gates}") };
    write(
        &config,
        &format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
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
{gates}",
            port = ports::KUBELET,
            healthz = ports::KUBELET_HEALTHZ,
            socket = p(layout.containerd_socket()),
            tls_cert = p(pki.file("kubelet-serving.crt")),
            tls_key = p(pki.file("kubelet-serving.key")),
            client_ca = p(pki.client_ca()),
        ),
    )?;
    let mut args = vec![
        "kubelet".into(),
        arg("config", p(&config)),
        arg("kubeconfig", p(pki::kubeconfig_path(layout, pki::KUBELET))),
        arg("hostname-override", NODE_NAME),
        arg("root-dir", p(layout.kubelet_root())),
    ];
    args.extend(extra_args(&cluster.kubelet_args));
    Ok(ProcessSpec { name: "kubelet", program: bins.kube(), args, env: vec![] })
}

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
        let layout = Layout::from_env(crate::cli::repo_root()).unwrap();
        let conf: serde_json::Value = serde_json::from_str(&cni_conflist(&layout)).unwrap();
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["isGateway"], false);
        assert_eq!(bridge["ipMasq"], false);
        assert!(bridge["ipam"].get("routes").is_none());
    }

    #[test]
    fn containerd_config_keeps_to_our_paths() {
        let layout = Layout::from_env(crate::cli::repo_root()).unwrap();
        let config = containerd_config(&layout, Path::new("/cache/bin/runc"));
        assert!(config.contains("enable_cdi = true"));
        assert!(config.contains("restrict_oom_score_adj = true"));
        assert!(config.contains("BinaryName = \"/cache/bin/runc\""));
        assert!(config.contains(&format!("sandbox = \"{}\"", images::PAUSE)));
        for forbidden in ["/var/lib/containerd", "/run/containerd", "/opt/containerd\""] {
            assert!(!config.contains(forbidden), "{forbidden} in\n{config}");
        }
    }
}
