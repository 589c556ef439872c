//! `cargo xtask docker …` as clap parses it, converted into the plain
//! [`engine::DockerAction`] the engine runs. The doc comments are the help texts.

use clap::{Args, Subcommand};

use super::values::CapShimArg;
use crate::kind::engine;

/// `cargo xtask docker …`.
#[derive(Debug, Subcommand)]
pub enum DockerAction {
    /// Start the run's own dockerd (idempotent) and print its DOCKER_HOST.
    Up(DockerUpArgs),
    /// Stop it by its recorded PID and remove every process, mount and socket it left.
    Down(DockerDownArgs),
    /// Say whether it runs, and what an engine that died left behind.
    Status,
}

/// Options of `docker up`.
#[derive(Debug, Args)]
pub struct DockerUpArgs {
    /// Run containers through the capability shim: `auto` where root lacks a capability, `off` never.
    #[arg(long, value_enum, default_value_t)]
    pub cap_shim: CapShimArg,
}

/// Options of `docker down`.
#[derive(Debug, Args)]
pub struct DockerDownArgs {
    /// Also remove the data root (images, containers, networks), logs and shim.
    #[arg(long)]
    pub purge: bool,
}

impl From<DockerAction> for engine::DockerAction {
    fn from(action: DockerAction) -> Self {
        match action {
            DockerAction::Up(DockerUpArgs { cap_shim }) => Self::Up { cap_shim: cap_shim.into() },
            DockerAction::Down(DockerDownArgs { purge }) => Self::Down { purge },
            DockerAction::Status => Self::Status,
        }
    }
}
