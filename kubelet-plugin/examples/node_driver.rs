//! A complete DRA driver for one node, built on `kubelet-plugin`: it publishes the node's devices
//! in a ResourceSlice, registers with the kubelet, prepares the claims the scheduler allocated on
//! its devices (a CDI spec per claim, which sets `claim_<claim>_<request>=true` in the
//! containers), and on Ctrl-C or SIGTERM unregisters and deletes its ResourceSlice. It registers
//! with the kubelet first and publishes the slice after that, as upstream's drivers do, and
//! publishes it again whenever it is gone (a restarting kubelet deletes its node's slices).
//!
//! ```text
//! cargo run -p kubelet-plugin --example node_driver -- \
//!     --driver-name example.dra.test --node-name worker-1 --devices 4
//! ```
//!
//! `--static-cdi` makes its CDI devices static, as many real drivers' are: one CDI spec file
//! (`<cdi dir>/<driver-name>-static.json`, kind `<driver-name>/device`, a device per device of
//! the node that sets `<DEVICE>=<device>`) written when it starts and removed when it stops;
//! prepare answers `<driver-name>/device=<device>` and writes no file, unprepare removes none.
//!
//! `--optional-devices` also publishes devices of DRA's optional features, each kind with the
//! attribute `kind` (the plain devices get `kind: plain`): three partitions (`partition-0..2`,
//! `kind: partition`) that consume 4Gi each of the counter set `shared-memory` (8Gi, in a second
//! slice of the pool), so two fit at a time; a device shared by capacity (`shared-0`, `kind:
//! shared`, `allowMultipleAllocations`, 8Gi of `memory` with a request policy); and a device
//! tainted `example.dra-e2e.test/unhealthy=true:NoSchedule` (`tainted-0`, `kind: tainted`).
//!
//! `--break skip-unprepare` or `--break fail-unprepare` makes it a broken driver on purpose: it
//! leaves the claim's CDI spec file behind on unprepare while answering OK, or fails every
//! `NodeUnprepareResources`. `cargo xtask example-driver deploy` runs it as a DaemonSet.
//!
//! It must run where the kubelet's plugin directories are (`/var/lib/kubelet`, `/var/run/cdi`);
//! if that directory is reached at another path on this host (e.g. a node of dra-e2e's local
//! cluster), give that path as `--kubelet-dir` and the kubelet's as `--kubelet-dir-in-node`.
//! A DeviceClass selecting `device.driver == "<driver-name>"` makes the devices claimable.
//! The cluster test `kubelet-plugin/tests/node_driver.rs` runs this file against a real kubelet.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use async_trait::async_trait;
use clap::{Parser, ValueEnum};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use kubelet_plugin::{
    calls::{FaultGuard, Method},
    plugin::{
        FileOps, FileOpsError, KubeClaims, KubeletPlugin, Listener, LocalDirFiles, PluginConfig,
        PluginListeners,
    },
};
use tokio::task::JoinHandle;

/// Flags of the example driver.
#[derive(Debug, Clone, Parser)]
pub struct Args {
    /// The driver name, e.g. `example.dra.test`.
    #[arg(long)]
    pub driver_name: String,
    /// The node this driver serves (a DaemonSet sets `NODE_NAME` from `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// How many devices (`device-00`, `device-01`, ...) the node offers.
    #[arg(long, default_value_t = 4)]
    pub devices: usize,
    /// The kubelet's root directory, as seen by this process.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// The same directory as the kubelet sees it (default: `--kubelet-dir`).
    #[arg(long)]
    pub kubelet_dir_in_node: Option<PathBuf>,
    /// Where the container runtime reads CDI specs, as seen by this process.
    #[arg(long, default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The kubeconfig (default: `$KUBECONFIG`, `~/.kube/config` or the in-cluster config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Break the driver on purpose (default: it works).
    #[arg(long = "break", value_enum)]
    pub brk: Option<Break>,
    /// Static CDI devices: one spec for all devices, written at start; none per claim.
    #[arg(long)]
    pub static_cdi: bool,
    /// Also publish devices of the optional features: partitions of a shared counter, a device
    /// shared by capacity, a tainted device (each kind with attribute `kind`).
    #[arg(long)]
    pub optional_devices: bool,
}

/// How `--break` breaks the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Break {
    /// `NodeUnprepareResources` answers OK but the claim's CDI spec file stays.
    SkipUnprepare,
    /// `NodeUnprepareResources` fails with an error.
    FailUnprepare,
}

impl Break {
    /// The flag's value, as `--break` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Break::SkipUnprepare => "skip-unprepare",
            Break::FailUnprepare => "fail-unprepare",
        }
    }
}

/// Local files, except that removing a CDI spec file (`<cdi dir>/*.json`) does nothing: the
/// file system of `--break skip-unprepare`. Temporary files are still removed.
#[derive(Debug)]
struct KeepSpecFiles {
    cdi_dir: PathBuf,
}

#[async_trait]
impl FileOps for KeepSpecFiles {
    async fn write(&self, path: &Path, contents: &[u8]) -> Result<(), FileOpsError> {
        LocalDirFiles.write(path, contents).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<(), FileOpsError> {
        LocalDirFiles.rename(from, to).await
    }

    async fn remove(&self, path: &Path) -> Result<(), FileOpsError> {
        let spec_file =
            path.parent() == Some(self.cdi_dir.as_path()) && path.extension().is_some_and(|e| e == "json");
        if spec_file {
            println!("skip-unprepare: leaving {} in place", path.display());
            return Ok(());
        }
        LocalDirFiles.remove(path).await
    }

    async fn mkdir_all(&self, path: &Path) -> Result<(), FileOpsError> {
        LocalDirFiles.mkdir_all(path).await
    }

    async fn remove_all(&self, path: &Path) -> Result<(), FileOpsError> {
        LocalDirFiles.remove_all(path).await
    }
}

/// A running driver: its plugin and its ResourceSlice.
pub struct NodeDriver {
    /// The kubelet plugin (its calls, claims and health).
    pub plugin: KubeletPlugin,
    slices: Api<ResourceSlice>,
    /// The names of its ResourceSlices (one, or two with `--optional-devices`).
    names: Vec<String>,
    plugin_dir: PathBuf,
    /// The static CDI spec file (`--static-cdi`), removed when the driver stops.
    static_spec: Option<PathBuf>,
    /// Publishes the slice again when it is gone.
    keeper: Option<JoinHandle<()>>,
    /// The failure of `--break fail-unprepare`, in effect while the driver runs.
    _fault: Option<FaultGuard>,
}

/// The kubelet has a minute to register a plugin in upstream's helper; so does this driver.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the driver checks that its ResourceSlice is still there.
const SLICE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// The bound of one API request of the driver.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

impl NodeDriver {
    /// Starts the plugin (broken as `--break` says), waits until the kubelet registered it, then
    /// publishes the ResourceSlice and keeps it published; on failure, what was started is
    /// stopped again.
    pub async fn start(args: &Args) -> anyhow::Result<NodeDriver> {
        let client = client(args.kubeconfig.as_ref()).await?;
        let plugin_dir = args.kubelet_dir.join("plugins").join(&args.driver_name);
        let registry_dir = args.kubelet_dir.join("plugins_registry");
        for dir in [&plugin_dir, &registry_dir, &args.cdi_dir] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // The endpoint the kubelet dials, in its own view of the file system.
        let in_node = args.kubelet_dir_in_node.as_ref().unwrap_or(&args.kubelet_dir);
        let endpoint = in_node.join("plugins").join(&args.driver_name).join("dra.sock");

        let config = PluginConfig::new(&args.driver_name, &args.node_name, &args.cdi_dir)
            .dra_endpoint(endpoint.display().to_string())
            .static_cdi(args.static_cdi);
        let static_spec = if args.static_cdi { Some(write_static_spec(args)?) } else { None };
        let mut builder =
            KubeletPlugin::builder(config).claim_source(Arc::new(KubeClaims::new(client.clone())));
        if args.brk == Some(Break::SkipUnprepare) {
            builder = builder.file_ops(Arc::new(KeepSpecFiles { cdi_dir: args.cdi_dir.clone() }));
        }
        let started = builder
            .start(PluginListeners {
                registration: Listener::unix(registry_dir.join(format!("{}-reg.sock", args.driver_name))),
                dra: Listener::unix(plugin_dir.join("dra.sock")),
            })
            .await;
        let plugin = match started {
            Ok(plugin) => plugin,
            Err(e) => {
                let _ = std::fs::remove_dir(&plugin_dir);
                if let Some(spec) = &static_spec {
                    let _ = std::fs::remove_file(spec);
                }
                return Err(e).context("starting the kubelet plugin");
            }
        };
        let fault = (args.brk == Some(Break::FailUnprepare)).then(|| {
            plugin.calls().fail(
                Method::NodeUnprepareResources,
                tonic::Status::internal("the example driver runs with --break fail-unprepare"),
            )
        });
        let slice = format!("{}-{}", args.node_name, args.driver_name.replace('.', "-"));
        let bodies = resource_slices(args, &slice);
        let mut driver = NodeDriver {
            plugin,
            slices: Api::all(client),
            names: bodies.iter().map(|(name, _)| name.clone()).collect(),
            plugin_dir,
            static_spec,
            keeper: None,
            _fault: fault,
        };
        // From here on, a failure stops what was started. Register first, then publish.
        if let Err(e) = driver.plugin.wait_registered(REGISTRATION_TIMEOUT).await {
            driver.stop().await;
            return Err(e)
                .context(format!("waiting for the kubelet of {} to register the plugin", args.node_name));
        }
        for (name, body) in &bodies {
            if let Err(e) = publish(&driver.slices, name, body).await {
                driver.stop().await;
                return Err(e);
            }
        }
        driver.keeper = Some(tokio::spawn(keep_published(driver.slices.clone(), bodies)));
        Ok(driver)
    }

    /// Stops keeping the slice published, stops the plugin (removing its sockets and directory),
    /// removes the static CDI spec (`--static-cdi`) and deletes the ResourceSlices.
    pub async fn stop(self) {
        if let Some(keeper) = &self.keeper {
            keeper.abort();
        }
        self.plugin.stop().await;
        if let Some(spec) = &self.static_spec
            && let Err(e) = std::fs::remove_file(spec)
        {
            eprintln!("could not remove the static CDI spec {}: {e}", spec.display());
        }
        // Only if empty: the kubelet may keep files of its own there.
        let _ = std::fs::remove_dir(&self.plugin_dir);
        for name in &self.names {
            match self.slices.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => eprintln!("could not delete ResourceSlice {name}: {e}"),
            }
        }
    }

    /// The name of its (first) ResourceSlice, the one with the devices.
    pub fn slice(&self) -> &str {
        self.names.first().map_or("", String::as_str)
    }
}

/// Creates or updates the slice (server-side apply), bounded by [`REQUEST_TIMEOUT`].
async fn publish(slices: &Api<ResourceSlice>, name: &str, body: &serde_json::Value) -> anyhow::Result<()> {
    let (params, patch) = (PatchParams::apply("node-driver").force(), Patch::Apply(body));
    let apply = slices.patch(name, &params, &patch);
    tokio::time::timeout(REQUEST_TIMEOUT, apply)
        .await
        .with_context(|| format!("publishing ResourceSlice {name}: no answer within {REQUEST_TIMEOUT:?}"))?
        .with_context(|| format!("publishing ResourceSlice {name}"))?;
    Ok(())
}

/// Every [`SLICE_CHECK_INTERVAL`], reads each slice and publishes it again if it is gone; runs
/// until aborted. Failures are logged and retried at the next check.
async fn keep_published(slices: Api<ResourceSlice>, bodies: Vec<(String, serde_json::Value)>) {
    loop {
        tokio::time::sleep(SLICE_CHECK_INTERVAL).await;
        for (name, body) in &bodies {
            keep_one(&slices, name, body).await;
        }
    }
}

/// Publishes the slice again if it is gone.
async fn keep_one(slices: &Api<ResourceSlice>, name: &str, body: &serde_json::Value) {
    match tokio::time::timeout(REQUEST_TIMEOUT, slices.get_opt(name)).await {
        Ok(Ok(Some(_))) => return,
        Ok(Ok(None)) => {}
        Ok(Err(e)) => return eprintln!("checking ResourceSlice {name}: {e}"),
        Err(_) => return eprintln!("checking ResourceSlice {name}: no answer within {REQUEST_TIMEOUT:?}"),
    }
    match publish(slices, name, body).await {
        Ok(()) => println!("ResourceSlice {name} was gone; published it again"),
        Err(e) => eprintln!("ResourceSlice {name} is gone and could not be published again: {e:#}"),
    }
}

/// The names of the node's devices: `device-00`, `device-01`, ..., and with
/// `--optional-devices` those of [`optional_devices`].
fn device_names(args: &Args) -> Vec<String> {
    devices(args).iter().filter_map(|d| d["name"].as_str().map(str::to_owned)).collect()
}

/// The counter set of the partitions (`--optional-devices`).
const COUNTER_SET: &str = "shared-memory";

/// The node's devices as published: `device-00`, ... (with `--optional-devices` attribute
/// `kind: plain`), and with it the devices of [`optional_devices`].
fn devices(args: &Args) -> Vec<serde_json::Value> {
    let plain = (0..args.devices).map(|i| {
        let mut device = serde_json::json!({ "name": format!("device-{i:02}") });
        if args.optional_devices {
            device["attributes"] = kind("plain");
        }
        device
    });
    let mut devices: Vec<serde_json::Value> = plain.collect();
    if args.optional_devices {
        devices.extend(optional_devices());
    }
    devices
}

/// The attributes `kind: <kind>`.
fn kind(kind: &str) -> serde_json::Value {
    serde_json::json!({ "kind": { "string": kind } })
}

/// The devices of `--optional-devices`: three partitions of [`COUNTER_SET`] (4Gi of its 8Gi
/// each), a device shared by capacity, a tainted device.
fn optional_devices() -> Vec<serde_json::Value> {
    let partition = |i: usize| {
        serde_json::json!({
            "name": format!("partition-{i}"),
            "attributes": kind("partition"),
            "consumesCounters": [{ "counterSet": COUNTER_SET, "counters": { "memory": { "value": "4Gi" } } }],
        })
    };
    let mut devices: Vec<serde_json::Value> = (0..3).map(partition).collect();
    devices.push(serde_json::json!({
        "name": "shared-0",
        "attributes": kind("shared"),
        "allowMultipleAllocations": true,
        "capacity": { "memory": {
            "value": "8Gi",
            "requestPolicy": { "default": "1Gi", "validRange": { "min": "1Gi" } },
        } },
    }));
    devices.push(serde_json::json!({
        "name": "tainted-0",
        "attributes": kind("tainted"),
        "taints": [{ "key": "example.dra-e2e.test/unhealthy", "value": "true", "effect": "NoSchedule" }],
    }));
    devices
}

/// Writes the static CDI spec of all devices (`--static-cdi`); returns its path.
fn write_static_spec(args: &Args) -> anyhow::Result<PathBuf> {
    let path = args.cdi_dir.join(format!("{}-static.json", args.driver_name));
    let spec = kubelet_plugin::plugin::static_spec(&args.driver_name, &device_names(args));
    let json = spec.to_json().context("encoding the static CDI spec")?;
    // Whole or not at all: the runtime may read the directory at any time.
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    println!("static CDI spec {} defines {} device(s)", path.display(), args.devices);
    Ok(path)
}

/// One pool named after the node: slice `name` with the devices and, with
/// `--optional-devices`, slice `<name>-counters` with the partitions' counter set.
fn resource_slices(args: &Args, name: &str) -> Vec<(String, serde_json::Value)> {
    let count = if args.optional_devices { 2 } else { 1 };
    let slice = |name: &str, content: (&str, serde_json::Value)| {
        let mut spec = serde_json::json!({
            "driver": args.driver_name,
            "nodeName": args.node_name,
            "pool": { "name": args.node_name, "generation": 1, "resourceSliceCount": count },
        });
        spec[content.0] = content.1;
        let body = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": { "name": name },
            "spec": spec,
        });
        (name.to_owned(), body)
    };
    let mut slices = vec![slice(name, ("devices", serde_json::Value::Array(devices(args))))];
    if args.optional_devices {
        let counters =
            serde_json::json!([{ "name": COUNTER_SET, "counters": { "memory": { "value": "8Gi" } } }]);
        slices.push(slice(&format!("{name}-counters"), ("sharedCounters", counters)));
    }
    slices
}

/// A client from `--kubeconfig`, or kube's defaults.
async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("finding a kubeconfig (give --kubeconfig)")?,
    };
    kube::Client::try_from(config).context("creating the API client")
}

/// Runs the driver until Ctrl-C or SIGTERM.
#[allow(dead_code)] // The cluster test includes this file and drives `NodeDriver` itself.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let cdi = if args.static_cdi { "static CDI devices" } else { "a CDI spec per claim" };
    let cdi = if args.optional_devices { format!("{cdi}, optional devices") } else { cdi.to_owned() };
    match args.brk {
        Some(brk) => {
            println!("{} starts broken on purpose: --break {} ({cdi})", args.driver_name, brk.as_str())
        }
        None => println!("{} starts with no break ({cdi})", args.driver_name),
    }
    let driver = NodeDriver::start(&args).await?;
    println!(
        "{} is registered and serves node {} (ResourceSlice {}); Ctrl-C stops it",
        args.driver_name,
        args.node_name,
        driver.slice()
    );
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    driver.stop().await;
    Ok(())
}
