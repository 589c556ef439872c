//! What the cluster tests share to run specs of their own against the cluster: the admin
//! kubeconfig (`DRA_E2E_KUBECONFIG`), a run of a registry, and a run of one spec that must pass.

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use harness::framework::{
    ClusterBackend as _, Ctx, KubeBackend, Output, Registry, RunOptions, RunReport, Selection, SpecResult,
    init_tracing, run_with_backend,
};
use kube::Client;
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

/// Runs every spec of `registry` against the cluster; returns the report, the run's output and
/// the admin client.
pub(crate) async fn run(registry: Registry) -> (RunReport, String, Client) {
    init_tracing();
    let backend = Arc::new(KubeBackend::connect(Some(&kubeconfig())).await.expect("connect to the cluster"));
    let client = backend.client();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (output, buffer) = Output::capture();
    let options = RunOptions {
        artifacts: dir.path().join("artifacts"),
        default_timeout: Duration::from_secs(300),
        namespace_timeout: Duration::from_secs(120),
        output,
        ..RunOptions::default()
    };
    let report =
        run_with_backend(registry, &Selection::all(), options, backend, CancellationToken::new()).await;
    (report, buffer.contents(), client)
}

/// Runs `body` as the one spec `container name` and fails the test, with the run's output,
/// unless it passed.
pub(crate) async fn run_one_spec<F, Fut>(container: &str, name: &str, body: F)
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = SpecResult> + Send + 'static,
{
    let mut reg = Registry::new();
    reg.describe(container, |r| {
        r.it(name, body);
    });
    let (report, output, _) = run(reg).await;
    assert_eq!((report.passed(), report.failed(), report.skipped()), (1, 0, 0), "{output}");
}
