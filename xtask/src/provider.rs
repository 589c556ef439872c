//! The cluster providers behind one type: `cluster up`, `down` and `status` and `e2e` ask a
//! [`Provider`], not a `match` of their own.

use std::path::PathBuf;

use crate::{kind, local, overrides::Overrides, usage::UsageError};

/// Which kind of cluster to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provider {
    /// The embedded cluster built from official Kubernetes Go modules (no Docker): the nodes
    /// kind.yaml lists, each a real kubelet in its own namespaces.
    #[default]
    Local,
    /// A kind cluster created from the repository's kind.yaml (needs docker and kind).
    Kind,
}

impl Provider {
    /// Brings the cluster up (idempotent) and returns its kubeconfig path. `nodes` is the local
    /// cluster's node count (default: kind.yaml's); `overrides` are gates and API versions on top
    /// of kind.yaml's; `registry` adds the registry (`localhost:5000`, or 5001 for a kind cluster not named kind); `dry_run` prints
    /// kind's commands instead.
    pub async fn up(
        self,
        kind: &kind::KindOptions,
        nodes: Option<usize>,
        overrides: Option<Overrides>,
        registry: bool,
        dry_run: bool,
    ) -> anyhow::Result<PathBuf> {
        match self {
            Provider::Local => local::up(nodes, overrides, registry).await,
            Provider::Kind => kind::up(kind, overrides.unwrap_or_default(), registry, dry_run).await,
        }
    }

    /// Imports image archives (checked before by [`crate::image_archive::check`]) into
    /// every node's containerd; `dry_run` prints kind's commands instead (kind provider).
    pub async fn load(
        self,
        kind: &kind::KindOptions,
        archives: &[PathBuf],
        dry_run: bool,
    ) -> anyhow::Result<()> {
        match self {
            Provider::Local if dry_run => {
                Err(UsageError::new("--dry-run is only for the kind provider").into())
            }
            Provider::Local => local::load(archives).await,
            Provider::Kind => kind::load_archives(kind, archives, dry_run).await,
        }
    }

    /// Stops the cluster and removes everything it created.
    pub async fn down(self, kind: &kind::KindOptions, dry_run: bool) -> anyhow::Result<()> {
        match self {
            Provider::Local => local::down().await,
            Provider::Kind => kind::down(kind, dry_run).await,
        }
    }

    /// Prints what runs; whether everything does.
    pub async fn status(self, kind: &kind::KindOptions) -> anyhow::Result<bool> {
        match self {
            Provider::Local => local::status().await,
            Provider::Kind => kind::status(kind).await,
        }
    }
}
