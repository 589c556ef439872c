//! What a container sees of its devices: the environment the CDI specs inject, read by exec and
//! checked against the claims' allocations.

use super::*;

/// Runs `command` in a container and collects stdout, stderr and the exit status, within
/// [`EXEC_TIMEOUT`]. Through [`PodExec`](crate::podexec::PodExec): a command whose stream broke
/// (the node's kubelet restarted) ends at once and runs again, so `command` must only read.
pub async fn exec(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    container: &str,
    command: &[&str],
) -> Result<ExecOutput, BuilderError> {
    use crate::podexec::{ExitStatus, PodExec, Runner as _};
    let target = crate::tunnel::PodRef {
        namespace: namespace.to_owned(),
        name: pod.to_owned(),
        uid: None,
        container: container.to_owned(),
    };
    let runner = PodExec::new(client.clone(), target).timeout(EXEC_TIMEOUT);
    let output = runner.output(command.iter().map(|s| s.to_string()).collect()).await.map_err(|e| {
        BuilderError::Exec {
            pod: format!("{namespace}/{pod}"),
            container: container.to_owned(),
            command: command.iter().map(|s| s.to_string()).collect(),
            reason: e.to_string(),
        }
    })?;
    let message = match &output.status {
        ExitStatus::Code(0) => String::new(),
        ExitStatus::Code(code) => format!("command terminated with non-zero exit code {code}"),
        ExitStatus::Other(what) => what.clone(),
    };
    Ok(ExecOutput { stdout: output.stdout, stderr: output.stderr, success: output.status.success(), message })
}

/// What an exec in a container produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// Whether the command exited with 0.
    pub success: bool,
    /// The status message for a failure (e.g. `command terminated with non-zero exit code`).
    pub message: String,
}

/// `env` output as variables (lines without `=` are ignored; a later line wins).
pub fn parse_env(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Lines of `env` output that the test driver sets (`admin_*`, `user_*`, `claim_*`), sorted
/// (upstream's `envLineRE`).
pub fn driver_env_lines(output: &str) -> Vec<String> {
    let mut lines: Vec<String> = output
        .lines()
        .filter(|line| {
            let Some((key, _)) = line.split_once('=') else { return false };
            ["admin_", "user_", "claim_"].iter().any(|p| {
                key.strip_prefix(p)
                    .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            })
        })
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Checks that `env` holds every `(name, value)` of `expected`; returns what is wrong.
pub fn check_env(env: &BTreeMap<String, String>, expected: &[(&str, &str)]) -> Result<(), String> {
    let problems: Vec<String> = expected
        .iter()
        .filter_map(|(k, v)| match env.get(*k) {
            Some(actual) if actual == v => None,
            Some(actual) => Some(format!("{k}={actual}, expected {k}={v}")),
            None => Some(format!("{k} is not set, expected {k}={v}")),
        })
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// The env the test driver's plugin puts into containers for this claim's allocation results of
/// `driver` (what the kubelet would inject), as `name=value` lines, sorted.
pub fn allocation_env(driver: &str, claim: &ResourceClaim) -> Result<Vec<String>, String> {
    let Some(devices) =
        claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref())
    else {
        return Err("not allocated".to_owned());
    };
    let configs = devices.config.clone().unwrap_or_default();
    let mut env = Vec::new();
    for result in devices.results.iter().flatten().filter(|r| r.driver == driver) {
        env.extend(env_for_result(driver, &claim.name_any(), &configs, result)?);
    }
    env.sort();
    env.dedup();
    Ok(env)
}

impl Builder {
    /// Runs `env` in a container and returns its output (stderr must be empty).
    pub async fn container_env(&self, pod: &Pod, container: &str) -> Result<String, BuilderError> {
        let name = pod.name_any();
        let out = exec(self.inner.ctx.client(), self.namespace(), &name, container, &["env"]).await?;
        if !out.success || !out.stderr.is_empty() {
            return Err(BuilderError::Exec {
                pod: format!("{}/{name}", self.namespace()),
                container: container.to_owned(),
                command: vec!["env".to_owned()],
                reason: format!("failed ({}), stderr: {:?}", out.message, out.stderr),
            });
        }
        Ok(out.stdout)
    }

    /// Checks that the container's environment has every `(name, value)` (upstream's
    /// `TestContainerEnv` without full match).
    pub async fn expect_env(
        &self,
        pod: &Pod,
        container: &str,
        expected: &[(&str, &str)],
    ) -> Result<(), BuilderError> {
        let output = self.container_env(pod, container).await?;
        check_env(&parse_env(&output), expected).map_err(|problem| BuilderError::Env {
            pod: format!("{}/{}", self.namespace(), pod.name_any()),
            container: container.to_owned(),
            problem,
            env: output.clone(),
        })
    }

    /// Checks that the driver's variables in the container (`admin_*`, `user_*`, `claim_*`) are
    /// exactly `expected` (upstream's `TestContainerEnv` with full match).
    pub async fn expect_env_exact(
        &self,
        pod: &Pod,
        container: &str,
        expected: &[(&str, &str)],
    ) -> Result<(), BuilderError> {
        let output = self.container_env(pod, container).await?;
        let actual = driver_env_lines(&output);
        let mut want: Vec<String> = expected.iter().map(|(k, v)| format!("{k}={v}")).collect();
        want.sort();
        if actual == want {
            return Ok(());
        }
        Err(BuilderError::Env {
            pod: format!("{}/{}", self.namespace(), pod.name_any()),
            container: container.to_owned(),
            problem: format!("driver variables are {actual:?}, expected exactly {want:?}"),
            env: output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENV: &str = "PATH=/bin\nHOSTNAME=tester-1\nuser_a=b\nadmin_x=y\nclaim_external_claim_my_request=true\nweird\nEQ=a=b\n";

    #[test]
    fn parses_env_output() {
        let env = parse_env(ENV);
        assert_eq!(env["user_a"], "b");
        assert_eq!(env["EQ"], "a=b");
        assert!(!env.contains_key("weird"));
        assert_eq!(env.len(), 6);
    }

    #[test]
    fn driver_lines_are_the_prefixed_ones_sorted() {
        assert_eq!(driver_env_lines(ENV), ["admin_x=y", "claim_external_claim_my_request=true", "user_a=b"]);
        assert!(driver_env_lines("user-a=b\nusers=x\n").is_empty());
    }

    #[test]
    fn check_env_reports_missing_and_wrong_values() {
        let env = parse_env(ENV);
        assert!(check_env(&env, &[("user_a", "b"), ("admin_x", "y")]).is_ok());
        assert_eq!(
            check_env(&env, &[("user_a", "c"), ("admin_q", "y")]).unwrap_err(),
            "user_a=b, expected user_a=c; admin_q is not set, expected admin_q=y"
        );
    }

    #[test]
    fn allocation_env_is_what_the_plugin_would_inject() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": { "name": "external-claim", "namespace": "ns" },
            "spec": {},
            "status": { "allocation": { "devices": {
                "results": [{ "request": "my-request", "driver": "d.k8s.io", "pool": "p", "device": "device-00" }],
                "config": [
                    { "source": "FromClass", "opaque": { "driver": "d.k8s.io", "parameters": { "x": "y" } } },
                    { "source": "FromClaim", "opaque": { "driver": "d.k8s.io", "parameters": { "a": "b" } } },
                    { "source": "FromClaim", "opaque": { "driver": "other.k8s.io", "parameters": { "o": "p" } } },
                ],
            } } },
        }))
        .unwrap();
        assert_eq!(
            allocation_env("d.k8s.io", &claim).unwrap(),
            ["admin_x=y", "claim_external_claim_my_request=true", "user_a=b"]
        );
        let unallocated = ResourceClaim::default();
        assert_eq!(allocation_env("d.k8s.io", &unallocated).unwrap_err(), "not allocated");
    }
}
