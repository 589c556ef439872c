//! Tests of .github/workflows/e2e-kind.yaml: actionlint accepts it, and it has the triggers and
//! steps the kind job needs.

#![allow(clippy::unwrap_used, reason = "tests may unwrap")]

use std::path::{Path, PathBuf};

use super::KIND_VERSION;

/// actionlint, run through the Go module proxy so that nothing needs to be installed.
const ACTIONLINT: &str = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12";

fn workflow_path() -> PathBuf {
    crate::repo::repo_root().join(".github/workflows/e2e-kind.yaml")
}

fn actionlint(file: &Path) -> std::process::Output {
    std::process::Command::new("go")
        .args(["run", ACTIONLINT, "-no-color"])
        .arg(file)
        .current_dir(crate::repo::repo_root())
        .output()
        .unwrap_or_else(|err| {
            panic!("cannot run `go` ({err}): the workflow test runs actionlint with `go run` and needs Go on PATH (https://go.dev/dl/)")
        })
}

#[test]
fn workflow_passes_actionlint() {
    let output = actionlint(&workflow_path());
    assert!(
        output.status.success(),
        "actionlint reports problems in {}:\n{}{}",
        workflow_path().display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // ...and it does find problems: the same workflow with a broken expression fails.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(workflow_path()).unwrap();
    std::fs::write(&broken, text.replace("if: always()", "if: ${{ alwayz() }}")).unwrap();
    let output = actionlint(&broken);
    assert!(!output.status.success(), "actionlint accepted a broken workflow");
    assert!(String::from_utf8_lossy(&output.stdout).contains("alwayz"), "{output:?}");
}

fn step_named<'a>(steps: &'a [serde_yaml::Value], needle: &str) -> Vec<(usize, &'a serde_yaml::Value)> {
    steps
        .iter()
        .enumerate()
        .filter(|(_, step)| {
            let field =
                |key: &str| step.get(key).and_then(serde_yaml::Value::as_str).unwrap_or_default().to_string();
            field("run").contains(needle) || field("uses").starts_with(needle)
        })
        .collect()
}

#[test]
fn workflow_has_the_triggers_and_steps() {
    let text = std::fs::read_to_string(workflow_path()).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();

    let on = &doc["on"];
    assert!(on.get("pull_request").is_some(), "no pull_request trigger");
    let cron = on["schedule"][0]["cron"].as_str().unwrap();
    assert_eq!(cron.split_whitespace().count(), 5, "cron {cron:?}");

    // The kind version the workflow installs is the one xtask expects.
    assert_eq!(doc["env"]["KIND_VERSION"].as_str(), Some(KIND_VERSION));

    let jobs = doc["jobs"].as_mapping().unwrap();
    assert_eq!(jobs.len(), 1);
    let job = jobs.values().next().unwrap();
    assert!(job["runs-on"].as_str().unwrap().starts_with("ubuntu"));
    assert!(job["timeout-minutes"].as_u64().is_some(), "the job needs a timeout");
    let steps = job["steps"].as_sequence().unwrap();
    let first = |needle: &str| {
        let found = step_named(steps, needle);
        assert!(!found.is_empty(), "no step with {needle:?}");
        found[0]
    };

    first("dtolnay/rust-toolchain@");
    first("actions/setup-go@");
    let (kind_install, _) = first("go install \"sigs.k8s.io/kind@${KIND_VERSION}\"");

    // The workflow runs the kind lane of `cargo xtask test`, on the runner's Docker, with the
    // lane's cluster name.
    let (e2e, e2e_step) = first("cargo xtask test --lane kind");
    assert_eq!(e2e_step["run"].as_str().unwrap().trim(), "cargo xtask test --lane kind");
    assert_eq!(doc["env"]["DOCKER_HOST"].as_str(), Some("unix:///var/run/docker.sock"));
    assert_eq!(doc["env"]["KIND_CLUSTER_NAME"].as_str(), Some(crate::test::kind_lane::CLUSTER));
    assert!(kind_install < e2e, "kind is installed after the e2e step");
    assert!(e2e_step.get("if").is_none(), "the e2e step must run unconditionally");

    let (down, down_step) = first("cargo xtask cluster down --provider kind");
    assert!(down > e2e, "teardown must come after the e2e step");
    assert_eq!(down_step["if"].as_str(), Some("always()"), "teardown must run even after failure");

    let uploads = step_named(steps, "actions/upload-artifact@");
    let paths: Vec<&str> = uploads.iter().map(|(_, step)| step["with"]["path"].as_str().unwrap()).collect();
    // The lane's JUnit report and artifacts (the kind logs among them after a failure).
    let junit = format!("target/e2e/{}.xml", crate::test::kind_lane::JUNIT);
    assert_eq!(paths, [junit.as_str(), "target/e2e/artifacts"]);
    for (index, step) in &uploads {
        assert!(*index > e2e, "uploads come after the e2e step");
        assert_eq!(step["if"].as_str(), Some("always()"), "uploads must run even after failure");
    }
}
