//! The restart exceptions: the failures a restart step accepts because Kubernetes itself, not
//! the harness, makes a spec fail across the restart, each with its evidence, as the one table of
//! docs/restart-exceptions.md lists them. A failure is accepted only when a row names the step,
//! the spec (its whole full text, or `*` for a behaviour that can hit any spec of the step), the
//! node whose component restarted, and its pattern matches the failure's message. That the
//! cluster was disrupted excuses nothing by itself.

use anyhow::{Result, bail};
use regex::Regex;

use super::{
    doc_table::{self, Row, Table},
    report::ReportedSpec,
};

/// One exception.
#[derive(Debug)]
pub(crate) struct Exception {
    /// The restart step (its report stem: `restart-kubelet`, `restart-apiserver`).
    pub step: String,
    /// The spec's full text, exactly, or [`ANY_SPEC`].
    pub spec: String,
    /// The node whose component the step restarts.
    pub node: String,
    /// Searched in the failure's message.
    pub failure: Regex,
}

impl Row for Exception {
    const DOC: &'static str = "docs/restart-exceptions.md";
    const HEADING: &'static str = "## Exceptions";
    const COLUMNS: &'static [&'static str] =
        &["Step", "Spec", "Node", "Kubernetes behaviour", "Evidence", "Failure accepted"];

    fn from_cells(cells: Vec<String>, doc: &str) -> Result<Self> {
        let row = format!("the exception of {:?}", cells[1]);
        for (what, cell) in Self::COLUMNS.iter().zip(&cells) {
            if cell.is_empty() {
                bail!("{doc}: {row} has no {}", what.to_lowercase());
            }
        }
        let failure = doc_table::regex(&cells[5], "failure accepted", &row, doc)?;
        let mut cells = cells.into_iter();
        let mut next = || cells.next().unwrap_or_default();
        Ok(Self { step: next(), spec: next(), node: next(), failure })
    }
}

/// The Spec cell of a row whose Kubernetes behaviour can hit any spec the step runs (which
/// one depends on what was in flight when the component restarted): its failure pattern alone
/// must then pin the behaviour down.
pub(crate) const ANY_SPEC: &str = "*";

/// Every documented exception.
pub(crate) type Exceptions = Table<Exception>;

impl Table<Exception> {
    /// The row that accepts `failed` in the restart step `step`, which restarted a component of
    /// `node`.
    pub(crate) fn accepting(&self, step: &str, node: &str, failed: &ReportedSpec) -> Option<&Exception> {
        self.rows.iter().find(|row| {
            row.step == step
                && row.node == node
                && (row.spec == failed.name || row.spec == ANY_SPEC)
                && row.failure.is_match(&failed.message)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    const ROW: &str = "| `restart-kubelet` | `[sig-node] [DRA] kubelet must manage ResourceSlices` | `kind-worker` | \
        the kubelet deletes its node's slices as it starts | pkg/kubelet/x.go:12 | `slices of node kind-worker changed` |\n";

    fn doc(rows: &str) -> String {
        format!(
            "# Restart exceptions\n\n## Exceptions\n\n| Step | Spec | Node | Kubernetes behaviour | Evidence | Failure accepted |\n|---|---|---|---|---|---|\n{rows}"
        )
    }

    fn failed(name: &str, message: &str) -> ReportedSpec {
        ReportedSpec { name: name.into(), state: "failed".into(), message: message.into(), node: "It".into() }
    }

    #[test]
    fn a_failure_is_accepted_only_when_step_spec_node_and_message_match() {
        let exceptions = Exceptions::parse(&doc(ROW), "x.md".into()).unwrap();
        let spec = "[sig-node] [DRA] kubelet must manage ResourceSlices";
        let message =
            "the slices of node kind-worker changed while it ran; while it ran, the cluster was disrupted: …";
        assert!(exceptions.accepting("restart-kubelet", "kind-worker", &failed(spec, message)).is_some());
        assert!(exceptions.accepting("restart-apiserver", "kind-worker", &failed(spec, message)).is_none());
        assert!(exceptions.accepting("restart-kubelet", "kind-worker2", &failed(spec, message)).is_none());
        assert!(
            exceptions
                .accepting("restart-kubelet", "kind-worker", &failed(&format!("{spec} 2"), message))
                .is_none()
        );
        let disrupted_only = "timed out; while it ran, the cluster was disrupted: the kubelet of node kind-worker started again";
        assert!(
            exceptions.accepting("restart-kubelet", "kind-worker", &failed(spec, disrupted_only)).is_none()
        );
    }

    #[test]
    fn a_row_without_evidence_is_refused() {
        let row = ROW.replace("pkg/kubelet/x.go:12", "");
        let err = format!("{:#}", Exceptions::parse(&doc(&row), "x.md".into()).unwrap_err());
        assert!(err.contains("has no evidence"), "{err}");
    }

    #[test]
    fn the_documented_force_deletion_row_accepts_only_the_reconcile_loop_s_late_unprepare() {
        // The row of docs/restart-exceptions.md, against the failure the step saw (2026-12-07).
        let exceptions = Exceptions::load(&crate::repo::repo_root()).unwrap();
        let spec = "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] must unprepare resources for force-deleted pod";
        let timeout = "the kubelet of node kind-worker (driver dra-must-unprepare-resou-wkvv7.k8s.io): timed out after 60s \
            waiting for a successful NodeUnprepareResources for claim UID 665a722d-46c7-410a-aca6-de01a61f708e\ncall log (10 calls):\n  …";
        let restarted = "; while it ran, the cluster was disrupted: the kubelet of node kind-worker started again at 16:00:23 (3.2 s into the spec)";
        let seen = failed(spec, &format!("{timeout}{restarted}"));
        assert!(exceptions.accepting("restart-kubelet", "kind-worker", &seen).is_some());
        // Not without the restart, not on another node, not for another failure of the spec.
        assert!(exceptions.accepting("restart-kubelet", "kind-worker", &failed(spec, timeout)).is_none());
        assert!(exceptions.accepting("restart-apiserver", "kind-control-plane", &seen).is_none());
        let other = format!("claims still prepared on node kind-worker: [..]{restarted}");
        assert!(exceptions.accepting("restart-kubelet", "kind-worker", &failed(spec, &other)).is_none());
    }

    #[test]
    fn a_row_for_any_spec_accepts_only_its_failure() {
        let row = "| `restart-kubelet` | `*` | `kind-worker` | the kubelet deletes its node's slices as it starts | \
            pkg/kubelet/x.go:12 | `(?s)the slices changed.*kubelet of node kind-worker started again` |\n";
        let exceptions = Exceptions::parse(&doc(row), "x.md".into()).unwrap();
        let seen = "the slices changed after the new instance went away: …; while it ran, the cluster was disrupted: the kubelet of node kind-worker started again";
        for spec in ["[sig-node] [DRA] kubelet failed update", "[sig-node] [DRA] kubelet rolling update"] {
            assert!(exceptions.accepting("restart-kubelet", "kind-worker", &failed(spec, seen)).is_some());
        }
        let other = "gave up waiting for pod tester-1 to run; while it ran, the cluster was disrupted: the kubelet of node kind-worker started again";
        assert!(
            exceptions.accepting("restart-kubelet", "kind-worker", &failed("[sig-node] x", other)).is_none()
        );
        assert!(
            exceptions.accepting("restart-apiserver", "kind-worker", &failed("[sig-node] x", seen)).is_none()
        );
    }

    #[test]
    fn the_documented_rows_for_any_spec_accept_the_failures_the_cold_run_saw_and_no_other() {
        // Shortened from the cold run of 66bdfca (2026-12-07): two pods whose container start the
        // restart cancelled, and the slices the restarted kubelet wiped.
        let exceptions = Exceptions::load(&crate::repo::repo_root()).unwrap();
        let restarted = "\nwhile it ran, the cluster was disrupted: the kubelet of node kind-worker started again at 16:46:04 (17.9 s into the spec)";
        let cancelled = "gave up waiting for pod tester-1 to run: the pod terminated with phase Failed; last seen: Pod d/tester-1 \
            status={\"containerStatuses\":[{\"state\":{\"terminated\":{\"exitCode\":128,\"message\":\"failed to create containerd task: \
            failed to create shim task: context canceled\",\"reason\":\"StartError\"}}}],\"phase\":\"Failed\"}";
        let wiped = "the slices changed after the new instance went away: before [..], after [..]";
        let spec =
            |leaf: &str| format!("[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] {leaf}");
        let start_cancelled = "gave up waiting for pod tester-4 to run: the pod terminated with phase Failed; last seen: Pod d/tester-4 \
            status={\"containerStatuses\":[{\"state\":{\"terminated\":{\"exitCode\":128,\"message\":\"failed to start containerd task \
            \\\"7301d26c\\\": context canceled\",\"reason\":\"StartError\"}}}],\"phase\":\"Failed\"}";
        // The cold run of f04f202 (2026-12-08): one container of three whose start was cancelled.
        let exec_in_cancelled = "exec [\"env\"] in d/tester-1/with-resource-1: cannot run `env` in pod d/tester-1 container \
            with-resource-1: ApiError: container not found (\"with-resource-1\"): Failed to parse error data (Status { code: 500 }); \
            container with-resource-1 of pod d/tester-1 has terminated (reason StartError, exit code 128: failed to create \
            containerd task: failed to get task pid: context canceled) and restartPolicy Never does not start it again";
        for (leaf, message) in [
            ("on single node supports claim and class parameters", cancelled),
            ("on single node supports reusing resources", start_cancelled),
            (
                "on single node supports external claim referenced by multiple containers of multiple pods",
                exec_in_cancelled,
            ),
            ("failed update", wiped),
        ] {
            let seen = failed(&spec(leaf), &format!("{message}{restarted}"));
            assert!(exceptions.accepting("restart-kubelet", "kind-worker", &seen).is_some(), "{leaf}");
            // Not without the restart's line, not for another node's restart.
            assert!(
                exceptions
                    .accepting("restart-kubelet", "kind-worker", &failed(&spec(leaf), message))
                    .is_none()
            );
            assert!(exceptions.accepting("restart-kubelet", "kind-worker2", &seen).is_none());
        }
        let other = format!(
            "gave up waiting for pod tester-1 to run: the pod terminated with phase Failed; OOMKilled{restarted}"
        );
        assert!(
            exceptions.accepting("restart-kubelet", "kind-worker", &failed(&spec("x"), &other)).is_none()
        );
        // A container that ended otherwise is no cancelled start.
        let crashed = format!(
            "container c of pod d/tester-1 has terminated (reason Error, exit code 1: oops) and restartPolicy Never \
             does not start it again{restarted}"
        );
        assert!(
            exceptions.accepting("restart-kubelet", "kind-worker", &failed(&spec("x"), &crashed)).is_none()
        );
    }
}
