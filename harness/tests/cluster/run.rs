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
    let counts = (report.passed(), report.failed(), report.skipped());
    assert_eq!(counts, (1, 0, 0), "{}", explain(&report, &output));
}

/// A failed assertion's message on a run: first one line per spec that did not pass (its
/// outcome's message) and the run's own error, then the run's whole output, so that the start
/// of the message (what a CI excerpt shows) says what went wrong.
pub(crate) fn explain(report: &RunReport, output: &str) -> String {
    use harness::framework::Outcome;
    let mut lines: Vec<String> = report
        .specs
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Passed => None,
            Outcome::Skipped { reason } => Some(format!("SKIPPED {}: {reason}", s.full_text)),
            Outcome::Failed { kind, message, .. } => {
                Some(format!("FAILED ({}) {}: {message}", kind.as_str(), s.full_text))
            }
        })
        .collect();
    if let Some(error) = &report.error {
        lines.push(format!("the run failed: {error}"));
    }
    if report.interrupted {
        lines.push("the run was interrupted".to_owned());
    }
    if lines.is_empty() {
        lines.push(format!("every spec passed (exit code {})", report.exit_code()));
    }
    format!("{}\n---- the run's output ----\n{output}", lines.join("\n"))
}
