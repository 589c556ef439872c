//! `dra-e2e kubelet-plugin`: runs the in-process DRA kubelet plugin as a
//! standalone process on a node (or against a local kubelet), serving the
//! registration socket `<registry-dir>/<driver>-reg.sock` and the DRA socket
//! `<plugin-dir>/dra.sock` until Ctrl-C (or SIGTERM).

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use harness::plugin::{
    ClaimSource, KubeClaims, KubeletPlugin, Listener, NoClaims, PluginConfig, PluginListeners,
};

/// Flags of `dra-e2e kubelet-plugin`.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeletPluginArgs {
    /// DRA driver name, e.g. `test-driver.example.com`.
    #[arg(long)]
    pub driver_name: String,
    /// Name of the node this plugin serves.
    #[arg(long)]
    pub node_name: String,
    /// Directory for the DRA socket `dra.sock` (the kubelet's view:
    /// `/var/lib/kubelet/plugins/<driver>`).
    #[arg(long)]
    pub plugin_dir: PathBuf,
    /// The kubelet's plugin registry directory (`/var/lib/kubelet/plugins_registry`).
    #[arg(long)]
    pub registry_dir: PathBuf,
    /// Where CDI spec files are written (`/var/run/cdi`).
    #[arg(long)]
    pub cdi_dir: PathBuf,
    /// Kubeconfig for reading ResourceClaims; without it NodePrepareResources
    /// fails with a clear error and everything else works.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

impl KubeletPluginArgs {
    /// `<registry-dir>/<driver>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver_name))
    }

    /// `<plugin-dir>/dra.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
}

async fn claim_source(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Arc<dyn ClaimSource>> {
    let Some(path) = kubeconfig else {
        tracing::warn!("no --kubeconfig: NodePrepareResources will fail, everything else works");
        return Ok(Arc::new(NoClaims));
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading kubeconfig {}", path.display()))?;
    let client = kube::Client::try_from(config)
        .with_context(|| format!("creating an API client from {}", path.display()))?;
    Ok(Arc::new(KubeClaims::new(client)))
}

/// Waits for Ctrl-C or SIGTERM.
async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// Runs the plugin until Ctrl-C or SIGTERM, then stops it and removes its sockets.
pub async fn run(args: KubeletPluginArgs) -> anyhow::Result<()> {
    for dir in [&args.plugin_dir, &args.registry_dir, &args.cdi_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating directory {}", dir.display()))?;
    }
    let claims = claim_source(args.kubeconfig.as_ref()).await?;
    let registration = args.registration_socket();
    let dra = args.dra_socket();
    let config = PluginConfig::new(&args.driver_name, &args.node_name, &args.cdi_dir);
    let plugin = KubeletPlugin::builder(config)
        .claim_source(claims)
        .start(PluginListeners { registration: Listener::unix(&registration), dra: Listener::unix(&dra) })
        .await
        .context("starting the kubelet plugin")?;
    // One line on stdout so that callers (and tests) know the sockets are up.
    println!("kubelet plugin ready: registration={} dra={}", registration.display(), dra.display());

    let result = shutdown_signal().await;
    tracing::info!("stopping");
    plugin.stop().await;
    result
}
