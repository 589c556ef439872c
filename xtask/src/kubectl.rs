//! `cargo xtask kubectl ARGS…`: kubectl of the cluster's pinned Kubernetes version, built from the
//! same Go module as the cluster and cached with its binaries. Every argument goes to kubectl as
//! is. Which cluster: kubectl's own `--kubeconfig` if given, else `$KUBECONFIG`, else the local
//! cluster's admin kubeconfig when that cluster is up; with none of them it is a usage error.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::{local, usage::UsageError};

/// Whether kubectl's arguments name a kubeconfig themselves.
fn names_kubeconfig(args: &[String]) -> bool {
    args.iter().take_while(|a| *a != "--").any(|a| a == "--kubeconfig" || a.starts_with("--kubeconfig="))
}

/// Runs kubectl with `args` and exits with its exit code.
pub async fn run(args: Vec<String>) -> Result<ExitCode> {
    let from_env = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    let local_kubeconfig = if names_kubeconfig(&args) || from_env {
        None
    } else {
        match local::running_kubeconfig().await? {
            Some(path) => Some(path),
            None => {
                return Err(UsageError::new(
                    "no local cluster is up and no kubeconfig was given: start one with `cargo xtask cluster up`, or pass --kubeconfig PATH or set KUBECONFIG",
                )
                .into());
            }
        }
    };
    let kubectl = local::kubectl_binary()?;
    let mut command = tokio::process::Command::new(&kubectl);
    command.args(&args);
    if let Some(path) = local_kubeconfig {
        command.env("KUBECONFIG", path);
    }
    let status = command.status().await.with_context(|| format!("run {}", kubectl.display()))?;
    Ok(match status.code() {
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_flag_is_kubectl_s_own() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(names_kubeconfig(&args(&["--kubeconfig", "/k", "get", "nodes"])));
        assert!(names_kubeconfig(&args(&["get", "nodes", "--kubeconfig=/k"])));
        assert!(!names_kubeconfig(&args(&["get", "nodes", "-o", "wide"])));
        assert!(!names_kubeconfig(&args(&["exec", "p", "--", "cat", "--kubeconfig"])));
    }
}
