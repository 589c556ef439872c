//! What the cluster tests that run one spec of their own share: the admin kubeconfig
//! (`DRA_E2E_KUBECONFIG`) and a run of that one spec that must pass.

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use harness::framework::{
    Ctx, KubeBackend, Output, Registry, RunOptions, Selection, SpecResult, init_tracing, run_with_backend,
};
use tokio_util::sync::CancellationToken;

/// The admin kubeconfig `cargo xtask test` gives the cluster tests.
pub(crate) fn kubeconfig() -> PathBuf {
    match std::env::var_os("DRA_E2E_KUBECONFIG") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "DRA_E2E_KUBECONFIG is not set: run these tests through `cargo xtask test`, or set it to an admin kubeconfig"
        ),
    }
}

/// Runs `body` as the one spec `container name` of a run against the cluster and fails the test,
/// with the run's output, unless it passed.
pub(crate) async fn run_one_spec<F, Fut>(container: &str, name: &str, body: F)
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = SpecResult> + Send + 'static,
{
    init_tracing();
    let backend = Arc::new(KubeBackend::connect(Some(&kubeconfig())).await.expect("connect to the cluster"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (output, buffer) = Output::capture();
    let options = RunOptions {
        artifacts: dir.path().join("artifacts"),
        default_timeout: Duration::from_secs(400),
        namespace_timeout: Duration::from_secs(120),
        output,
        ..RunOptions::default()
    };
    let mut reg = Registry::new();
    reg.describe(container, |r| {
        r.it(name, body);
    });
    let report = run_with_backend(reg, &Selection::all(), options, backend, CancellationToken::new()).await;
    let output = buffer.contents();
    assert_eq!((report.passed(), report.failed(), report.skipped()), (1, 0, 0), "{output}");
}
