//! `dra-e2e --list --k8s-version`: the texts of each version, and one sentence for an unknown one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn list(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dra-e2e")).arg("--list").args(args).output().unwrap()
}

#[test]
fn lists_the_texts_of_the_version_asked_for() {
    let resource_quota = "[sig-api-machinery] ResourceQuota should create a ResourceQuota and capture the life of a ResourceClaim";
    let old = list(&["--focus", "ResourceQuota should"]);
    assert!(old.status.success());
    assert_eq!(
        String::from_utf8(old.stdout).unwrap(),
        format!("{resource_quota} [FeatureGate:DynamicResourceAllocation] [DRA]\n")
    );
    let new = list(&["--k8s-version", "v1.38.0-beta.0", "--focus", "ResourceQuota should"]);
    assert!(new.status.success());
    assert_eq!(String::from_utf8(new.stdout).unwrap(), format!("{resource_quota} [DRA]\n"));
}

#[test]
fn an_unknown_version_is_one_sentence_and_exit_2() {
    let out = list(&["--k8s-version", "v1.36.0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: Kubernetes version \"v1.36.0\" is not one this binary has spec texts for; use one of: v1.37.2, v1.38.0-beta.0\n"
    );
}
