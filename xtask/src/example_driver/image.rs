//! The driver's image: the dev-profile `node_driver` example with the shared libraries it loads,
//! written as a Docker archive (imported into every node by [`deployed_driver::load`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::{
    common::{images, layout::Layout, shared_libs},
    deployed_driver, e2e,
    progress::Step,
};

/// How the example is built: with every workspace member selected, so that its dependencies get
/// the features the workspace's tests unify to and `cargo xtask test` reuses what
/// `cargo test --workspace` and the runner's build compiled (`-p kubelet-plugin` alone unifies
/// fewer features and compiled tokio, tonic and the plugin crate again: 26 s in the driver lane).
const BUILD_ARGS: [&str; 5] = ["build", "--quiet", "--workspace", "--example", "node_driver"];

/// Builds the example (`cargo build --workspace --example node_driver`) and returns it.
fn build_binary(repo: &Path) -> Result<PathBuf> {
    let step = Step::start("build the example driver (cargo build --workspace --example node_driver)");
    let status = crate::repo::cargo_command(repo)
        .args(BUILD_ARGS)
        .status()
        .context("run cargo build for the example driver")?;
    if !status.success() {
        bail!("building the example driver failed");
    }
    step.done();
    Ok(e2e::target_dir(repo).join("debug").join("examples").join("node_driver"))
}

/// Builds the binary and its image archive (under the local cluster's image directory);
/// returns the archive and its sha256.
pub fn build(repo: &Path) -> Result<(PathBuf, String)> {
    let binary = build_binary(repo)?;
    let libs = shared_libs::of(&binary)?;
    let dir = Layout::from_env(repo.to_path_buf())?.images();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let archive = dir.join("example-driver.tar");
    images::write_linked_binary_image(super::IMAGE, &binary, &libs, &archive)?;
    let digest = deployed_driver::archive_digest(&archive)?;
    Ok((archive, digest))
}
