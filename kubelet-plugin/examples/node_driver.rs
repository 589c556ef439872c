//! A complete DRA driver for one node, built on `kubelet-plugin`: it publishes the node's devices
//! in a ResourceSlice, registers with the kubelet, prepares the claims the scheduler allocated on
//! its devices (a CDI spec per claim, which sets `claim_<claim>_<request>=true` in the
//! containers), and on Ctrl-C or SIGTERM unregisters and deletes its ResourceSlice.
//!
//! ```text
//! cargo run -p kubelet-plugin --example node_driver -- \
//!     --driver-name example.dra.test --node-name worker-1 --devices 4
//! ```
//!
//! It must run where the kubelet's plugin directories are (`/var/lib/kubelet`, `/var/run/cdi`);
//! if that directory is reached at another path on this host (e.g. a node of dra-e2e's local
//! cluster), give that path as `--kubelet-dir` and the kubelet's as `--kubelet-dir-in-node`.
//! A DeviceClass selecting `device.driver == "<driver-name>"` makes the devices claimable.
//! The cluster test `kubelet-plugin/tests/node_driver.rs` runs this file against a real kubelet.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use kubelet_plugin::plugin::{KubeClaims, KubeletPlugin, Listener, PluginConfig, PluginListeners};

/// Flags of the example driver.
#[derive(Debug, Clone, Parser)]
pub struct Args {
    /// The driver name, e.g. `example.dra.test`.
    #[arg(long)]
    pub driver_name: String,
    /// The node this driver serves.
    #[arg(long)]
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
}

/// A running driver: its plugin and its ResourceSlice.
pub struct NodeDriver {
    /// The kubelet plugin (its calls, claims and health).
    pub plugin: KubeletPlugin,
    slices: Api<ResourceSlice>,
    slice: String,
    plugin_dir: PathBuf,
}

/// The kubelet has a minute to register a plugin in upstream's helper; so does this driver.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(60);

impl NodeDriver {
    /// Starts the plugin, publishes the ResourceSlice and waits until the kubelet registered the
    /// plugin; on failure, what was started is stopped again.
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
            .dra_endpoint(endpoint.display().to_string());
        let started = KubeletPlugin::builder(config)
            .claim_source(Arc::new(KubeClaims::new(client.clone())))
            .start(PluginListeners {
                registration: Listener::unix(registry_dir.join(format!("{}-reg.sock", args.driver_name))),
                dra: Listener::unix(plugin_dir.join("dra.sock")),
            })
            .await;
        let plugin = match started {
            Ok(plugin) => plugin,
            Err(e) => {
                let _ = std::fs::remove_dir(&plugin_dir);
                return Err(e).context("starting the kubelet plugin");
            }
        };
        let slice = format!("{}-{}", args.node_name, args.driver_name.replace('.', "-"));
        let driver = NodeDriver { plugin, slices: Api::all(client), slice, plugin_dir };
        // From here on, a failure stops what was started.
        let published = driver
            .slices
            .patch(
                &driver.slice,
                &PatchParams::apply("node-driver").force(),
                &Patch::Apply(resource_slice(args, &driver.slice)),
            )
            .await
            .with_context(|| format!("publishing ResourceSlice {}", driver.slice));
        if let Err(e) = published {
            driver.stop().await;
            return Err(e);
        }
        if let Err(e) = driver.plugin.wait_registered(REGISTRATION_TIMEOUT).await {
            driver.stop().await;
            return Err(e)
                .context(format!("waiting for the kubelet of {} to register the plugin", args.node_name));
        }
        Ok(driver)
    }

    /// Stops the plugin (removing its sockets and directory) and deletes the ResourceSlice.
    pub async fn stop(self) {
        self.plugin.stop().await;
        // Only if empty: the kubelet may keep files of its own there.
        let _ = std::fs::remove_dir(&self.plugin_dir);
        match self.slices.delete(&self.slice, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => eprintln!("could not delete ResourceSlice {}: {e}", self.slice),
        }
    }
}

/// One pool named after the node, in one slice, with `args.devices` devices.
fn resource_slice(args: &Args, name: &str) -> serde_json::Value {
    let devices: Vec<_> =
        (0..args.devices).map(|i| serde_json::json!({ "name": format!("device-{i:02}") })).collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": { "name": name },
        "spec": {
            "driver": args.driver_name,
            "nodeName": args.node_name,
            "pool": { "name": args.node_name, "generation": 1, "resourceSliceCount": 1 },
            "devices": devices,
        },
    })
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
    let driver = NodeDriver::start(&args).await?;
    println!("{} serves node {}; Ctrl-C stops it", args.driver_name, args.node_name);
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    driver.stop().await;
    Ok(())
}
