//! Running commands in the proxy pod: collected output ([`Runner::output`]), long-running
//! processes with their output logged ([`Runner::run_logged`]), CDI files through exec
//! ([`PodFiles`]) and the `hostpathplugin` proxy processes ([`ProxyProcess`]).
//!
//! [`PodExec`] runs commands in a pod's container through the API server (kube's WebSocket exec;
//! no stdin, no TTY). [`LocalRunner`] runs the same commands on this machine, for tests and for
//! plugins whose "pod" is the local host. Commands are argv vectors; nothing variable is ever
//! spliced into shell text (scripts take their values as positional parameters).
//!
//! Closing an exec stream from this side does not end the remote process (checked on containerd
//! 2.3 / Kubernetes 1.37: the process keeps running after the client disconnects), so
//! [`ProxyProcess`] finds what it starts by its arguments and kills it explicitly. A stream that
//! breaks between the kubelet and the runtime does end it: the runtime kills the exec'd process
//! when the node's kubelet restarts, so [`ProxyProcess`] runs the proxy as a child of the exec'd
//! script, which outlives it.
//!
//! A node's kubelet restart breaks every exec stream through it. Such a stream ends here at once
//! with an error ([`collect`] explains why that needs care with kube's streams), and
//! [`Runner::output`]'s commands must be idempotent: [`PodExec`] runs a command again whose stream
//! broke, since it cannot know whether the command ran.

mod files;
mod local;
mod proxy;
mod stream;

use std::{fmt, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, BufReader};

pub use files::{MAX_FILE_SIZE, PodFiles};
pub use local::LocalRunner;
pub use proxy::{ProxyControl, ProxyProcess, ProxyProcessConfig};
pub use stream::{Collected, collect};

use crate::tunnel::{PodRef, check_pod};
use stream::follow;

/// How long a command run with [`Runner::output`] may take by default.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exit code (0 = success).
    Code(i32),
    /// Ended without an exit code (signal, or a runtime error), with the description.
    Other(String),
}

impl ExitStatus {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        *self == ExitStatus::Code(0)
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(code) => write!(f, "exit code {code}"),
            ExitStatus::Other(what) => f.write_str(what),
        }
    }
}

/// What a command printed and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// Standard output (lossy UTF-8).
    pub stdout: String,
    /// Standard error (lossy UTF-8).
    pub stderr: String,
    /// How it ended.
    pub status: ExitStatus,
}

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum PodExecError {
    /// The command could not be started.
    #[error("cannot run `{command}` in {place}: {reason}")]
    Start {
        /// The command, shortened.
        command: String,
        /// Where (`pod ns/name container c` or `this machine`).
        place: String,
        /// Why.
        reason: String,
    },
    /// The command's stream broke or ended without an exit status.
    #[error("lost `{command}` in {place}: {reason}")]
    Stream {
        /// The command, shortened.
        command: String,
        /// Where.
        place: String,
        /// Why.
        reason: String,
    },
    /// The command did not finish in time.
    #[error("`{command}` in {place} did not finish within {timeout:?}")]
    Timeout {
        /// The command, shortened.
        command: String,
        /// Where.
        place: String,
        /// The limit.
        timeout: Duration,
    },
    /// The command ran but failed.
    #[error("`{command}` in {place} failed with {status}: {stderr}")]
    Failed {
        /// The command, shortened.
        command: String,
        /// Where.
        place: String,
        /// How it ended.
        status: ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// An argument is too long for one exec argument.
    #[error("argument of {len} bytes is too long for `{command}` (limit {limit} bytes)")]
    TooLong {
        /// The command, shortened.
        command: String,
        /// The argument's length.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

/// Runs commands somewhere (a pod's container, or this machine).
#[async_trait]
pub trait Runner: Send + Sync + fmt::Debug + 'static {
    /// Runs `argv` to completion (within the runner's timeout) and collects its output. `argv`
    /// must be idempotent: a runner may run it again when its stream broke (see [`PodExec`]).
    async fn output(&self, argv: Vec<String>) -> Result<ExecOutput, PodExecError>;

    /// Runs `argv` until it ends, passing each output line to `on_line` and logging it at debug
    /// level with `name` (unless `on_line` says not to). Dropping the future disconnects from the process (it may keep
    /// running, see the module docs).
    async fn run_logged(
        &self,
        argv: Vec<String>,
        name: &str,
        on_line: &OnLine,
    ) -> Result<ExitStatus, PodExecError>;

    /// Where commands run, for messages.
    fn place(&self) -> String;

    /// Runs `argv` and fails unless it exits with code 0.
    async fn checked(&self, argv: Vec<String>) -> Result<ExecOutput, PodExecError> {
        let command = show_command(&argv);
        let output = self.output(argv).await?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(PodExecError::Failed {
                command,
                place: self.place(),
                status: output.status,
                stderr: output.stderr.trim().to_string(),
            })
        }
    }
}

/// The command for messages: arguments longer than 60 characters are shortened.
pub fn show_command(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.chars().count() > 60 {
                format!("{}…({} bytes)", a.chars().take(40).collect::<String>(), a.len())
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Turns the exec status object into an exit status.
fn exit_status(status: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> ExitStatus {
    if status.status.as_deref() == Some("Success") {
        return ExitStatus::Code(0);
    }
    let code = status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|causes| causes.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.trim().parse().ok());
    match code {
        Some(code) => ExitStatus::Code(code),
        None => ExitStatus::Other(status.message.clone().unwrap_or_else(|| format!("{status:?}"))),
    }
}

/// Called with every output line of a [`Runner::run_logged`] process.
/// Returns whether the line goes to the log (a heartbeat, say, does not).
pub type OnLine = dyn Fn(&str) -> bool + Send + Sync;

/// Passes every line of `reader` to `on_line` and logs it at debug level unless `on_line` says not to.
async fn log_lines(
    reader: Option<impl AsyncRead + Unpin>,
    name: &str,
    stream: &'static str,
    on_line: &OnLine,
) {
    let Some(reader) = reader else { return };
    let mut lines = BufReader::new(reader).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if on_line(&line) {
                    tracing::debug!(process = name, stream, "{line}");
                }
            }
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(process = name, stream, error = %e, "cannot read output");
                return;
            }
        }
    }
}

/// Reads `reader` to the end (lossy UTF-8).
async fn read_all(reader: Option<impl AsyncRead + Unpin>) -> String {
    let mut buf = Vec::new();
    if let Some(mut reader) = reader
        && let Err(e) = reader.read_to_end(&mut buf).await
    {
        tracing::debug!(error = %e, "cannot read command output");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// How long [`PodExec`] waits at most before it runs a command again whose stream broke.
const MAX_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Runs commands in one container of a pod through the API server's exec.
///
/// [`Runner::output`] runs a command again when its stream broke or could not be opened for a
/// reason that passes (the node's kubelet restarting: its streams break, and then it refuses
/// them or does not know the pod yet), until the command's timeout is used up; a command whose
/// pod is gone is not run again. A stream that breaks ends at once with
/// [`PodExecError::Stream`] instead of waiting (see [`collect`]).
#[derive(Clone)]
pub struct PodExec {
    pods: Api<Pod>,
    pod: PodRef,
    timeout: Duration,
}

impl fmt::Debug for PodExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodExec").field("pod", &self.pod).field("timeout", &self.timeout).finish()
    }
}

/// Whether a failed attempt may be made again.
enum Again {
    Yes,
    No,
}

impl PodExec {
    /// Commands in `pod.container` of `pod`, with the admin `client`.
    pub fn new(client: kube::Client, pod: PodRef) -> Self {
        PodExec { pods: Api::namespaced(client, &pod.namespace), pod, timeout: DEFAULT_EXEC_TIMEOUT }
    }

    /// Limits [`Runner::output`] commands to `timeout` (default [`DEFAULT_EXEC_TIMEOUT`]),
    /// runs again included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The pod.
    pub fn pod(&self) -> &PodRef {
        &self.pod
    }

    async fn attach(&self, argv: &[String]) -> Result<kube::api::AttachedProcess, (PodExecError, Again)> {
        let params =
            AttachParams::default().container(&self.pod.container).stdin(false).stdout(true).stderr(true);
        let attached = self.pods.exec(&self.pod.name, argv.to_vec(), &params).await;
        attached.map_err(|e| {
            let again = match &e {
                // Refused by a kubelet that does not know the pod (yet), or by the API server:
                // the pod decides.
                kube::Error::Api(status) if status.code == 404 => Again::Yes,
                kube::Error::Api(status) if status.code >= 500 || status.code == 429 => Again::Yes,
                kube::Error::Api(_) => Again::No,
                // No answer, a broken connection, a failed upgrade.
                _ => Again::Yes,
            };
            let error = PodExecError::Start {
                command: show_command(argv),
                place: self.place(),
                reason: e.to_string(),
            };
            (error, again)
        })
    }

    fn lost(&self, argv: &[String], reason: impl fmt::Display) -> PodExecError {
        PodExecError::Stream { command: show_command(argv), place: self.place(), reason: reason.to_string() }
    }

    /// One run of `argv`: its output, or the failure and whether to run it again.
    async fn attempt(&self, argv: &[String]) -> Result<ExecOutput, (PodExecError, Again)> {
        let process = self.attach(argv).await?;
        let collected = collect(process).await;
        let status = collected.status.map_err(|reason| (self.lost(argv, reason), Again::Yes))?;
        Ok(ExecOutput {
            stdout: String::from_utf8_lossy(&collected.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&collected.stderr).into_owned(),
            status: exit_status(&status),
        })
    }
}

impl PodExecError {
    /// The same failure, its reason followed by `why` it is final (its pod or container gone).
    fn because(self, why: &str) -> Self {
        match self {
            PodExecError::Start { command, place, reason } => {
                PodExecError::Start { command, place, reason: format!("{reason}; {why}") }
            }
            PodExecError::Stream { command, place, reason } => {
                PodExecError::Stream { command, place, reason: format!("{reason}; {why}") }
            }
            other => other,
        }
    }
}

#[async_trait]
impl Runner for PodExec {
    async fn output(&self, argv: Vec<String>) -> Result<ExecOutput, PodExecError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let timed_out = || PodExecError::Timeout {
            command: show_command(&argv),
            place: self.place(),
            timeout: self.timeout,
        };
        let mut delay = Duration::from_millis(100);
        loop {
            let (error, again) = match tokio::time::timeout_at(deadline, self.attempt(&argv)).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(output)) => {
                    tracing::trace!(command = %show_command(&argv), ?output, "exec done");
                    return Ok(output);
                }
                Ok(Err(failed)) => failed,
            };
            if matches!(again, Again::No) {
                return Err(error);
            }
            if let Err(gone) = check_pod(&self.pods, &self.pod).await {
                tracing::debug!(command = %show_command(&argv), %error, %gone, "exec failed; its pod is gone");
                return Err(error.because(&gone));
            }
            if tokio::time::Instant::now() + delay >= deadline {
                return Err(error);
            }
            tracing::debug!(command = %show_command(&argv), %error, retry_in = ?delay, "exec failed; running it again");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_RETRY_DELAY);
        }
    }

    async fn run_logged(
        &self,
        argv: Vec<String>,
        name: &str,
        on_line: &OnLine,
    ) -> Result<ExitStatus, PodExecError> {
        // Only starting is bounded: the process itself may run for as long as it likes.
        let process = tokio::time::timeout(self.timeout, self.attach(&argv))
            .await
            .map_err(|_| PodExecError::Timeout {
                command: show_command(&argv),
                place: self.place(),
                timeout: self.timeout,
            })?
            .map_err(|(error, _)| error)?;
        let status = follow(process, name, on_line).await.map_err(|reason| self.lost(&argv, reason))?;
        Ok(exit_status(&status))
    }

    fn place(&self) -> String {
        format!("pod {} container {}", self.pod.display(), self.pod.container)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
    use rstest::rstest;

    use super::*;

    fn failure(causes: Vec<StatusCause>, message: &str) -> Status {
        Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            message: Some(message.into()),
            details: Some(StatusDetails { causes: Some(causes), ..Default::default() }),
            ..Default::default()
        }
    }

    fn cause(reason: &str, message: &str) -> StatusCause {
        StatusCause { reason: Some(reason.into()), message: Some(message.into()), field: None }
    }

    #[rstest]
    #[case::success(Status { status: Some("Success".into()), ..Default::default() }, ExitStatus::Code(0))]
    #[case::exit_code(failure(vec![cause("ExitCode", "3")], "command terminated with non-zero exit code"), ExitStatus::Code(3))]
    #[case::no_code(failure(vec![], "runtime error"), ExitStatus::Other("runtime error".into()))]
    fn exit_status_from_status(#[case] status: Status, #[case] expected: ExitStatus) {
        assert_eq!(exit_status(&status), expected);
    }

    #[test]
    fn show_command_shortens_long_arguments() {
        let argv = vec!["sh".to_string(), "x".repeat(100)];
        assert_eq!(show_command(&argv), format!("sh {}…(100 bytes)", "x".repeat(40)));
    }
}
