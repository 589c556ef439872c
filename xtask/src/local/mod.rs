//! The local provider: a real single-node Kubernetes built from official Go modules, run as child
//! processes of xtask (no Docker, no registry).

/// Brings the local cluster up.
pub async fn up() -> anyhow::Result<()> {
    anyhow::bail!("the local provider is not implemented yet")
}

/// Stops the local cluster.
pub async fn down() -> anyhow::Result<()> {
    anyhow::bail!("the local provider is not implemented yet")
}

/// Says what runs.
pub async fn status() -> anyhow::Result<()> {
    anyhow::bail!("the local provider is not implemented yet")
}
