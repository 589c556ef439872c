//! Where the run's own Docker engine keeps things, and dockerd's command line.
//!
//! State (the data root with images and containers, logs, the PID record, the shim) lives in
//! `/var/lib/dra-e2e/docker`, beside the local cluster's `/var/lib/dra-e2e/local`; sockets and
//! dockerd's exec root in `/run/dra-e2e-docker`. That is not below `/run/dra-e2e` on purpose: the
//! local cluster's `cluster down` unmounts and removes all of `/run/dra-e2e`, which must not take a
//! running engine with it. `DRA_E2E_DOCKER_STATE` and `DRA_E2E_DOCKER_RUN` move both (the real
//! engine test runs its engine in a temporary directory that way).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

use super::shim;

/// The default state directory.
pub const DEFAULT_STATE: &str = "/var/lib/dra-e2e/docker";
/// The default run directory.
pub const DEFAULT_RUN: &str = "/run/dra-e2e-docker";

/// The directories and files of one engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineLayout {
    /// Persistent state: data root, logs, PID record, shim (`$DRA_E2E_DOCKER_STATE`, else
    /// [`DEFAULT_STATE`]).
    pub state: PathBuf,
    /// Runtime files: the API socket, dockerd's pidfile and exec root (`$DRA_E2E_DOCKER_RUN`,
    /// else [`DEFAULT_RUN`]); removed when the engine stops.
    pub run: PathBuf,
}

impl EngineLayout {
    /// The layout the environment asks for.
    pub fn from_env() -> Self {
        let dir = |var: &str, default: &str| {
            std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Self {
            state: dir("DRA_E2E_DOCKER_STATE", DEFAULT_STATE),
            run: dir("DRA_E2E_DOCKER_RUN", DEFAULT_RUN),
        }
    }

    /// Images, containers, volumes and networks (`--data-root`); kept across runs unless purged.
    pub fn data_root(&self) -> PathBuf {
        self.state.join("data")
    }
    /// dockerd's and its containerd's runtime state (`--exec-root`).
    pub fn exec_root(&self) -> PathBuf {
        self.run.join("exec")
    }
    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.run.join("docker.sock")
    }
    /// What docker and kind get as `DOCKER_HOST`.
    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }
    /// dockerd's own pidfile (`--pidfile`).
    pub fn pidfile(&self) -> PathBuf {
        self.run.join("dockerd.pid")
    }
    /// The PID record (PID and start time) of the dockerd this project started.
    pub fn pids(&self) -> PathBuf {
        self.state.join("pids")
    }
    /// dockerd's log (containerd's output goes there too).
    pub fn logs(&self) -> PathBuf {
        self.state.join("logs")
    }
    /// The capability shim and the binary it runs.
    pub fn shim_dir(&self) -> PathBuf {
        self.state.join("bin")
    }
    /// dockerd's configuration file (`--config-file`), so that /etc/docker/daemon.json is not read.
    pub fn config_file(&self) -> PathBuf {
        self.state.join("daemon.json")
    }
    /// Held while a `cargo xtask docker` command changes the engine.
    pub fn lock_file(&self) -> PathBuf {
        self.state.join("lock")
    }
    /// libnetwork's store, which names the engine's networks (and so its bridges, `br-<id>`).
    pub fn network_store(&self) -> PathBuf {
        self.data_root().join("network/files/local-kv.db")
    }

    /// The cgroup (below every hierarchy's root) all of the engine's containers live in:
    /// `dra-e2e-docker` for the default layout, with a hash of the state directory otherwise, so
    /// that two engines never share one.
    pub fn cgroup_parent(&self) -> String {
        if self.state == Path::new(DEFAULT_STATE) {
            return "dra-e2e-docker".into();
        }
        let digest = Sha256::digest(self.state.as_os_str().as_encoded_bytes());
        let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!("dra-e2e-docker-{hex}")
    }

    /// The directories whose mounts and processes belong to the engine.
    pub fn roots(&self) -> [PathBuf; 2] {
        [self.state.clone(), self.run.clone()]
    }
}

/// dockerd's configuration file: only where dockerd before 23.0 keeps its identity key, which
/// would otherwise be `/etc/docker/key.json` (outside the engine's directories, and shared with
/// the system's dockerd, so both would report the same ID).
pub fn daemon_json(layout: &EngineLayout) -> String {
    let key = layout.state.join("key.json");
    let json = serde_json::json!({ "deprecated-key-path": key.to_string_lossy() });
    format!("{json}\n")
}

/// dockerd's arguments: the engine's own paths and socket, no changes to the host's network
/// (no iptables rules, no docker0 bridge, no forwarding or masquerading; user networks such as
/// kind's and port publishing through docker-proxy still work), its cgroup parent, and the
/// capability shim as the default runtime when `shim` is given.
pub fn dockerd_args(layout: &EngineLayout, shim: Option<&Path>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut pair = |flag: &str, value: OsString| {
        let mut arg = OsString::from(format!("--{flag}="));
        arg.push(value);
        args.push(arg);
    };
    pair("config-file", layout.config_file().into());
    pair("data-root", layout.data_root().into());
    pair("exec-root", layout.exec_root().into());
    pair("pidfile", layout.pidfile().into());
    pair("host", layout.docker_host().into());
    pair("cgroup-parent", format!("/{}", layout.cgroup_parent()).into());
    for (flag, value) in
        [("iptables", "false"), ("bridge", "none"), ("ip-forward", "false"), ("ip-masq", "false")]
    {
        pair(flag, value.into());
    }
    if let Some(shim) = shim {
        let mut runtime = OsString::from(format!("{}=", shim::RUNTIME_NAME));
        runtime.push(shim);
        pair("add-runtime", runtime);
        pair("default-runtime", shim::RUNTIME_NAME.into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> EngineLayout {
        EngineLayout { state: DEFAULT_STATE.into(), run: DEFAULT_RUN.into() }
    }

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap_or_default()).collect()
    }

    #[test]
    fn dockerd_gets_its_own_paths_and_leaves_the_host_network_alone() {
        let args = strings(dockerd_args(&layout(), None));
        assert_eq!(
            args,
            [
                "--config-file=/var/lib/dra-e2e/docker/daemon.json",
                "--data-root=/var/lib/dra-e2e/docker/data",
                "--exec-root=/run/dra-e2e-docker/exec",
                "--pidfile=/run/dra-e2e-docker/dockerd.pid",
                "--host=unix:///run/dra-e2e-docker/docker.sock",
                "--cgroup-parent=/dra-e2e-docker",
                "--iptables=false",
                "--bridge=none",
                "--ip-forward=false",
                "--ip-masq=false",
            ]
        );
    }

    #[test]
    fn the_shim_becomes_the_default_runtime_only_when_given() {
        let shim = Path::new("/var/lib/dra-e2e/docker/bin/dra-e2e-runc");
        let args = strings(dockerd_args(&layout(), Some(shim)));
        assert_eq!(
            args[args.len() - 2..],
            [
                "--add-runtime=dra-e2e-runc=/var/lib/dra-e2e/docker/bin/dra-e2e-runc",
                "--default-runtime=dra-e2e-runc",
            ]
        );
        assert!(!strings(dockerd_args(&layout(), None)).iter().any(|a| a.contains("runtime")));
    }

    #[test]
    fn the_configuration_file_keeps_the_key_in_the_state_directory() {
        assert_eq!(
            daemon_json(&layout()),
            "{\"deprecated-key-path\":\"/var/lib/dra-e2e/docker/key.json\"}\n"
        );
    }

    #[test]
    fn another_state_directory_gets_another_cgroup() {
        assert_eq!(layout().cgroup_parent(), "dra-e2e-docker");
        let other = EngineLayout { state: "/tmp/x/state".into(), run: "/tmp/x/run".into() };
        let parent = other.cgroup_parent();
        assert!(
            parent.starts_with("dra-e2e-docker-") && parent.len() == "dra-e2e-docker-".len() + 8,
            "{parent}"
        );
        assert_eq!(parent, other.cgroup_parent(), "stable");
        assert_eq!(other.docker_host(), "unix:///tmp/x/run/docker.sock");
        // The engine's socket path must fit a sockaddr_un (108 bytes).
        assert!(layout().socket().as_os_str().len() < 108);
    }
}
