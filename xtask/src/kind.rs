//! The kind provider: a kind cluster created from the repository's kind.yaml.

use std::path::PathBuf;

use clap::Args;

/// Options of the kind provider.
#[derive(Debug, Args)]
pub struct KindArgs {
    /// Name of the kind cluster.
    #[arg(long, env = "KIND_CLUSTER_NAME", default_value = "dra-e2e")]
    pub name: String,
    /// Node image for kind (for example kindest/node:v1.37.2).
    #[arg(long, env = "KIND_NODE_IMAGE")]
    pub image: Option<String>,
    /// The kind version expected on PATH.
    #[arg(long, env = "KIND_VERSION")]
    pub kind_version: Option<String>,
}

/// Options of `build-node-image`.
#[derive(Debug, Args)]
pub struct BuildNodeImageArgs {
    /// A Kubernetes source tree.
    #[arg(long)]
    pub k8s_source: PathBuf,
    /// The image to build.
    #[arg(long, default_value = "dra/node:latest")]
    pub image: String,
}

/// Creates the kind cluster.
pub async fn up(_args: &KindArgs, _dry_run: bool) -> anyhow::Result<()> {
    anyhow::bail!("the kind provider is not implemented yet")
}

/// Deletes the kind cluster.
pub async fn down(_args: &KindArgs, _dry_run: bool) -> anyhow::Result<()> {
    anyhow::bail!("the kind provider is not implemented yet")
}

/// Says whether the kind cluster exists.
pub async fn status(_args: &KindArgs) -> anyhow::Result<()> {
    anyhow::bail!("the kind provider is not implemented yet")
}

/// Wraps `kind build node-image`.
pub async fn build_node_image(_args: &BuildNodeImageArgs) -> anyhow::Result<()> {
    anyhow::bail!("build-node-image is not implemented yet")
}
