//! Tests that send SIGINT or SIGTERM to the test process run in a process of their own: xtask
//! passes every SIGINT it receives on to each dra-e2e it runs, so in the shared test process the
//! signal would also reach the stand-in dra-e2e of every other test running at the time.

/// The variable that names the test a child process runs.
const VAR: &str = "XTASK_TEST_IN_OWN_PROCESS";

/// Where a test that calls [`in_own_process`] is.
pub(crate) enum Process {
    /// In its own process: the caller does the test's work.
    Own,
    /// In the shared test process, after the test ran and passed in its own; what that process
    /// wrote to stderr, for the caller to check what this process does (the signal's receiver
    /// alone cannot tell one SIGINT from two sent at once: the kernel merges pending ones).
    Ran {
        /// The stderr of the test's own process.
        stderr: String,
    },
}

/// Runs the test `name` of `module` (the caller's `module_path!()`) in a process of its own:
/// [`Process::Own`] in that process; elsewhere it starts this test binary on that one test,
/// asserts that it ran and passed, and returns [`Process::Ran`].
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
pub(crate) fn in_own_process(module: &str, name: &str) -> Process {
    // Test names leave out the crate: `xtask::e2e::tests` runs `e2e::tests::NAME`.
    let path = module.split_once("::").map_or(module, |(_, path)| path);
    let test = format!("{path}::{name}");
    if std::env::var(VAR).is_ok_and(|running| running == test) {
        return Process::Own;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads", "1"])
        .env(VAR, &test)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{test} in its own process: {}\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains("test result: ok. 1 passed"), "{test} did not run:\n{stdout}\n{stderr}");
    Process::Ran { stderr: stderr.into_owned() }
}
