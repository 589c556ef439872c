//! Bad input and its exit code: the error every command returns for what the user must fix
//! (the floor every module may import; `main` prints it as one sentence and exits with 2).

/// Bad input from the user (a missing file, no cluster to talk to, a flag for the wrong
/// provider): one sentence, and `cargo xtask` exits with 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(String);

impl UsageError {
    /// The error with this sentence.
    pub fn new(sentence: impl Into<String>) -> Self {
        Self(sentence.into())
    }
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The exit code of a usage error.
pub const USAGE_EXIT: u8 = 2;
