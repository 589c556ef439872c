//! Go commands that download modules (`go build`, `go mod download`, `go mod tidy`) run again
//! when a download broke on the way: Go retries none. Depends on nothing else of xtask, so both
//! the builds (`common::build`) and the module side (`gomod`) use it without an import cycle.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Output, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

/// How often a Go command runs in all when its module downloads keep breaking on the way.
const ATTEMPTS: usize = 3;

/// The pause before each further attempt.
pub(crate) const PAUSES: [Duration; ATTEMPTS - 1] = [Duration::from_secs(5), Duration::from_secs(20)];

/// The Go command `make` builds, run with its output captured; run again (up to [`ATTEMPTS`]
/// in all) when it failed on a download that broke on the way ([`download_broke`]). The last
/// run's output, whatever it was; an error only when `go` could not be started.
pub(crate) fn go_output_with_retries(what: &str, make: impl Fn() -> Command) -> Result<Output> {
    with_retries(what, &PAUSES, || make().output())
}

/// Runs `run` until it succeeds, fails for another reason than a broken download, or has run
/// once more than there are `pauses` (waiting each before the next attempt); says on stderr why
/// it runs again.
pub(crate) fn with_retries(
    what: &str,
    pauses: &[Duration],
    run: impl Fn() -> std::io::Result<Output>,
) -> Result<Output> {
    let mut attempt = 1;
    loop {
        let out = run().with_context(|| format!("run {what} (is Go installed?)"))?;
        let broke = (!out.status.success())
            .then(|| download_broke(&String::from_utf8_lossy(&[out.stdout.as_slice(), &out.stderr].concat())))
            .flatten();
        match broke {
            Some(line) if attempt <= pauses.len() => {
                let pause = pauses[attempt - 1];
                eprintln!(
                    "warning: {what}: a module download broke on the way ({line}); running it again in {} \
                     (attempt {} of {})",
                    crate::progress::human(pause),
                    attempt + 1,
                    pauses.len() + 1
                );
                std::thread::sleep(pause);
                attempt += 1;
            }
            _ => return Ok(out),
        }
    }
}

/// The first line of a Go command's output that says a download from the module proxy (or a
/// VCS host) broke on the way: its connection timed out or was reset, or the proxy answered
/// 5xx. Go retries none of these; a module that does not exist (404, 410), a checksum mismatch
/// or a compile error is not one of them.
fn download_broke(output: &str) -> Option<String> {
    const BROKE: [&str; 8] = [
        "TLS handshake timeout",
        "i/o timeout",
        "connection reset by peer",
        "unexpected EOF",
        "502 Bad Gateway",
        "503 Service Unavailable",
        "504 Gateway Timeout",
        "Client.Timeout exceeded",
    ];
    output
        .lines()
        .find(|line| {
            // `Get "https://…"` as go prints it, `Get \"https://…\"` inside `-json`'s Error.
            let fetching =
                line.contains("Get \"http") || line.contains(r#"Get \"http"#) || line.contains("dial tcp");
            fetching && BROKE.iter().any(|sign| line.contains(sign))
        })
        .map(|line| line.trim().to_owned())
}

/// Runs `command` with its stderr shown as it comes and also kept (its stdout as configured).
pub(crate) fn run_teeing_stderr(mut command: Command) -> std::io::Result<Output> {
    let mut child = command.stderr(Stdio::piped()).spawn()?;
    let mut kept = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).split(b'\n') {
            let mut line = line?;
            line.push(b'\n');
            let _ = std::io::stderr().write_all(&line);
            kept.extend_from_slice(&line);
        }
    }
    let status = child.wait()?;
    Ok(Output { status, stdout: Vec::new(), stderr: kept })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_downloads_that_broke_on_the_way_are_run_again() {
        let tls = r#"cmd/kube/main.go:14:2: go.etcd.io/etcd/server/v3@v3.7.0: Get "https://proxy.golang.org/go.etcd.io/etcd/server/v3/@v/v3.7.0.zip": net/http: TLS handshake timeout"#;
        assert_eq!(download_broke(&format!("go: downloading x\n{tls}\n")).as_deref(), Some(tls));
        let reset = r#"go: k8s.io/api@v0.37.2: Get "https://proxy.golang.org/k8s.io/api/@v/v0.37.2.mod": read tcp 10.0.0.2:4242->1.2.3.4:443: read: connection reset by peer"#;
        assert!(download_broke(reset).is_some());
        let json = r#"	"Error": "Get \"https://proxy.golang.org/k8s.io/kubernetes/@v/v1.37.2.zip\": net/http: TLS handshake timeout""#;
        assert_eq!(download_broke(json).as_deref(), Some(json.trim()));
        let dns = "go: example.com/m@v1.0.0: dial tcp: lookup proxy.golang.org: i/o timeout";
        assert!(download_broke(dns).is_some());
        // What running again cannot mend.
        let gone = r#"go: example.com/m@v9.9.9: reading https://proxy.golang.org/example.com/m/@v/v9.9.9.info: 404 Not Found"#;
        assert_eq!(download_broke(gone), None);
        assert_eq!(download_broke("verifying example.com/m@v1.0.0: checksum mismatch"), None);
        assert_eq!(download_broke("./main.go:3:2: undefined: x (unexpected EOF in a comment)"), None);
    }

    /// A real command that fails the first time on a broken download and then succeeds runs
    /// twice; one that fails on anything else runs once.
    #[test]
    fn a_command_runs_again_only_after_a_broken_download() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let script = format!(
            r#"echo x >> {0}; [ "$(wc -l < {0})" -ge 2 ] && exit 0; echo 'Get "https://proxy.golang.org/m/@v/v1.zip": net/http: TLS handshake timeout' >&2; exit 1"#,
            count.display()
        );
        let out =
            with_retries("test", &[Duration::ZERO; 2], || Command::new("sh").args(["-c", &script]).output())
                .unwrap();
        assert!(out.status.success());
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 2);

        let other = dir.path().join("other");
        let script = format!("echo x >> {}; echo 'undefined: x' >&2; exit 1", other.display());
        let out =
            with_retries("test", &[Duration::ZERO; 2], || Command::new("sh").args(["-c", &script]).output())
                .unwrap();
        assert!(!out.status.success());
        assert_eq!(std::fs::read_to_string(&other).unwrap().lines().count(), 1);
    }

    #[test]
    fn stderr_is_kept_while_it_is_shown() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; exit 3"]).stdout(Stdio::null());
        let out = run_teeing_stderr(command).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    }
}
