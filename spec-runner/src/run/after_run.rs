//! What a suite does once a run has ended and printed its summary ([`Registry::after_run`]
//! (crate::Registry::after_run)): its own report of the run, printed after the runner's and
//! written wherever the suite wants it.

use std::sync::Arc;

use crate::{
    cluster::preflight::ClusterInfo,
    report::{outcome::RunReport, progress::Output},
};

/// A hook run once the run's summary is printed: given the run's report and the cluster as
/// preflight saw it, it returns what to print after the summary, or why it failed.
pub(crate) type AfterRun = Arc<dyn Fn(&RunReport, &ClusterInfo) -> anyhow::Result<String> + Send + Sync>;

/// Runs `hooks` in registration order: prints what each returns (when not empty); a hook that
/// fails makes its error (in one line) the run's error, after any the run already had, so the
/// run exits with 2.
pub(crate) fn run_hooks(hooks: &[AfterRun], report: &mut RunReport, cluster: &ClusterInfo, output: &Output) {
    for hook in hooks {
        match hook(report, cluster) {
            Ok(text) if text.is_empty() => {}
            Ok(text) => output.block(&text),
            Err(e) => {
                let e = format!("{e:#}");
                report.error = Some(match report.error.take() {
                    Some(earlier) => format!("{earlier}; {e}"),
                    None => e,
                });
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn hooks_print_in_order_and_a_failing_one_becomes_the_run_s_error() {
        let (output, buffer) = Output::capture();
        let said: AfterRun = Arc::new(|report, cluster| {
            Ok(format!("{} spec(s) on {}\n", report.specs.len(), cluster.server_version))
        });
        let quiet: AfterRun = Arc::new(|_, _| Ok(String::new()));
        let failing: AfterRun = Arc::new(|_, _| Err(anyhow::anyhow!("cannot write x").context("summary")));
        let cluster = ClusterInfo { server_version: "v1.37.2".into(), ..ClusterInfo::default() };
        let mut report = RunReport::default();
        run_hooks(&[said.clone(), quiet.clone()], &mut report, &cluster, &output);
        assert_eq!(buffer.contents(), "0 spec(s) on v1.37.2\n");
        assert_eq!(report.error, None);
        assert_eq!(report.exit_code(), 0);
        report.error = Some("cannot write the JUnit report j.xml: gone".into());
        run_hooks(&[failing, said], &mut report, &cluster, &output);
        assert_eq!(
            report.error.as_deref(),
            Some("cannot write the JUnit report j.xml: gone; summary: cannot write x")
        );
        assert_eq!(report.exit_code(), 2);
        assert_eq!(
            buffer.contents(),
            "0 spec(s) on v1.37.2\n0 spec(s) on v1.37.2\n",
            "the hooks after it still run"
        );
    }
}
