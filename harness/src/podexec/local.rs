//! Commands on this machine, with the same interface as [`PodExec`](super::PodExec).

use std::{process::Stdio, time::Duration};

use async_trait::async_trait;
use tokio::process::Command;

use super::{
    DEFAULT_EXEC_TIMEOUT, ExecOutput, ExitStatus, OnLine, PodExecError, Runner, log_lines, read_all,
    show_command,
};

/// Runs commands as child processes of this process (for tests, and for a "proxy pod" that is
/// the local host). Unlike a pod exec, dropping a [`Runner::run_logged`] future kills the child.
#[derive(Clone, Debug)]
pub struct LocalRunner {
    timeout: Duration,
}

impl Default for LocalRunner {
    fn default() -> Self {
        LocalRunner { timeout: DEFAULT_EXEC_TIMEOUT }
    }
}

impl LocalRunner {
    /// A runner with the default timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Limits [`Runner::output`] commands to `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn spawn(&self, argv: &[String]) -> Result<tokio::process::Child, PodExecError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(PodExecError::Start {
                command: String::new(),
                place: self.place(),
                reason: "empty command".into(),
            });
        };
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| PodExecError::Start {
                command: show_command(argv),
                place: self.place(),
                reason: e.to_string(),
            })
    }

    fn status(
        &self,
        argv: &[String],
        status: std::io::Result<std::process::ExitStatus>,
    ) -> Result<ExitStatus, PodExecError> {
        use std::os::unix::process::ExitStatusExt as _;
        let status = status.map_err(|e| PodExecError::Stream {
            command: show_command(argv),
            place: self.place(),
            reason: e.to_string(),
        })?;
        Ok(match (status.code(), status.signal()) {
            (Some(code), _) => ExitStatus::Code(code),
            (None, Some(signal)) => ExitStatus::Other(format!("killed by signal {signal}")),
            (None, None) => ExitStatus::Other(status.to_string()),
        })
    }
}

#[async_trait]
impl Runner for LocalRunner {
    async fn output(&self, argv: Vec<String>) -> Result<ExecOutput, PodExecError> {
        let mut child = self.spawn(&argv)?;
        let run = async {
            let (stdout, stderr, status) =
                tokio::join!(read_all(child.stdout.take()), read_all(child.stderr.take()), child.wait());
            Ok(ExecOutput { stdout, stderr, status: self.status(&argv, status)? })
        };
        tokio::time::timeout(self.timeout, run).await.map_err(|_| PodExecError::Timeout {
            command: show_command(&argv),
            place: self.place(),
            timeout: self.timeout,
        })?
    }

    async fn run_logged(
        &self,
        argv: Vec<String>,
        name: &str,
        on_line: &OnLine,
    ) -> Result<ExitStatus, PodExecError> {
        let mut child = self.spawn(&argv)?;
        let (_, _, status) = tokio::join!(
            log_lines(child.stdout.take(), name, "stdout", on_line),
            log_lines(child.stderr.take(), name, "stderr", on_line),
            child.wait()
        );
        self.status(&argv, status)
    }

    fn place(&self) -> String {
        "this machine".into()
    }
}
