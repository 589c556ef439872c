//! Artifacts of failed specs: the folder layout and [`ArtifactSource`]s.
//!
//! `<artifacts>/<spec name>[-attempt-N]/` holds what the backend collects
//! from the cluster (`events.yaml`, `pods.yaml`, `logs/<pod>/<container>.log`), one
//! sub-folder per registered [`ArtifactSource`] (the suite's kinds, a driver's recorded calls),
//! `failure.txt` and `spec.log`.
//! Cluster state is collected before the cleanups run.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use async_trait::async_trait;

use crate::{
    cluster::backend::{ArtifactRequest, ClusterBackend},
    duration, names,
};

/// Something that can add files to a failed spec's artifacts, e.g. the
/// Driver's recorded gRPC calls. Register it with
/// [`Ctx::artifact_source`](crate::Ctx::artifact_source).
///
/// ```
/// use std::path::Path;
/// use spec_runner::ArtifactSource;
///
/// struct Notes(String);
///
/// #[async_trait::async_trait]
/// impl ArtifactSource for Notes {
///     fn name(&self) -> &str {
///         "notes"
///     }
///     async fn collect(&self, dir: &Path) -> anyhow::Result<()> {
///         tokio::fs::write(dir.join("notes.txt"), &self.0).await?;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait ArtifactSource: Send + Sync {
    /// A short name; also the name of the sub-folder `collect` writes into.
    fn name(&self) -> &str;

    /// Writes files into `dir` (created before the call). Errors are logged
    /// and listed in the spec's `failure.txt`; they never change the outcome.
    async fn collect(&self, dir: &Path) -> anyhow::Result<()>;
}

/// The artifact folder of a spec run: `<name>[-attempt-A][-try-T]` (`--repeat`, and the retries
/// of `--flake-attempts` after the first try).
pub(crate) fn spec_dir(root: &Path, full_text: &str, attempt: u32, repeat: u32, try_number: u32) -> PathBuf {
    let mut name = names::dir_name(full_text);
    if repeat > 1 {
        name.push_str(&format!("-attempt-{attempt}"));
    }
    if try_number > 1 {
        name.push_str(&format!("-try-{try_number}"));
    }
    root.join(name)
}

/// Empties (or creates) a spec's artifact folder, so no file of an earlier run stays.
pub(crate) async fn fresh_dir(dir: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    tokio::fs::create_dir_all(dir).await
}

/// Cluster state and the spec's artifact sources of a failed spec, bounded by the artifact timeout.
pub(crate) async fn collect(
    backend: &dyn ClusterBackend,
    limit: Duration,
    sources: &[std::sync::Arc<dyn ArtifactSource>],
    namespace: &str,
    dir: &Path,
) -> Vec<String> {
    if let Err(e) = fresh_dir(dir).await {
        let problem = format!("cannot create the artifact folder {}: {e}", dir.display());
        tracing::error!("{problem}");
        return vec![problem];
    }
    let request = ArtifactRequest { namespace, dir };
    let mut problems = match tokio::time::timeout(limit, backend.collect_artifacts(request)).await {
        Ok(problems) => problems,
        Err(_) => {
            vec![format!("collecting cluster artifacts did not finish within {}", duration::display(limit))]
        }
    };
    for source in sources {
        let name = source.name().to_owned();
        let sub = dir.join(names::dir_name(&name));
        let result = match tokio::fs::create_dir_all(&sub).await {
            Ok(()) => match tokio::time::timeout(limit, source.collect(&sub)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err(format!("did not finish within {}", duration::display(limit))),
            },
            Err(e) => Err(format!("cannot create {}: {e}", sub.display())),
        };
        if let Err(e) = result {
            tracing::warn!("artifact source {name:?} failed: {e}");
            problems.push(format!("artifact source {name:?}: {e}"));
        }
    }
    tracing::info!("collected artifacts into {}", dir.display());
    problems
}
