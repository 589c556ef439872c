//! What a spec body returns: [`SpecError`], failed or skipped.

use std::fmt;

/// The result of a spec body: `Ok(())` passes.
pub type SpecResult<T = ()> = Result<T, SpecError>;

/// Why a spec body did not pass: it failed, or it cannot run on this cluster.
///
/// `?` works on anything that converts into [`anyhow::Error`] (every
/// `std::error::Error + Send + Sync + 'static`, such as `kube::Error`, and
/// `anyhow::Error` itself, so `anyhow::Context` works too):
///
/// ```
/// use spec_runner::{SpecError, SpecResult, Skip};
/// fn parse(s: &str) -> SpecResult<u32> {
///     let n: u32 = s.parse()?; // ParseIntError -> SpecError::Failed
///     if n == 0 {
///         return Err(Skip::because("the cluster has no nodes"));
///     }
///     Ok(n)
/// }
/// assert!(parse("x").is_err());
/// assert!(parse("0").unwrap_err().is_skip());
/// ```
///
/// Like `anyhow::Error`, this type deliberately does not implement
/// `std::error::Error`: that is what lets it convert from every error type.
pub enum SpecError {
    /// The spec failed.
    Failed(anyhow::Error),
    /// The spec cannot run here (too few nodes, missing API, old kubelet...);
    /// it is reported as skipped with this reason, never as failed.
    Skipped(String),
}

impl SpecError {
    /// A failure with a message.
    pub fn fail(message: impl fmt::Display + fmt::Debug + Send + Sync + 'static) -> Self {
        Self::Failed(anyhow::Error::msg(message))
    }

    /// A skip with its reason (same as [`skip`]).
    pub fn skip(reason: impl Into<String>) -> Self {
        Self::Skipped(reason.into())
    }

    /// Whether this is a skip rather than a failure.
    pub fn is_skip(&self) -> bool {
        matches!(self, Self::Skipped(_))
    }

    /// The reason of a skip.
    pub fn skip_reason(&self) -> Option<&str> {
        match self {
            Self::Skipped(reason) => Some(reason),
            Self::Failed(_) => None,
        }
    }
}

impl<E: Into<anyhow::Error>> From<E> for SpecError {
    fn from(error: E) -> Self {
        Self::Failed(error.into())
    }
}

impl fmt::Display for SpecError {
    /// The failure with its causes on one line (`outer: inner: root`), or `skipped: reason`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(error) => write!(f, "{error:#}"),
            Self::Skipped(reason) => write!(f, "skipped: {reason}"),
        }
    }
}

impl fmt::Debug for SpecError {
    /// The failure with one "Caused by" line per cause, as `anyhow` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(error) => write!(f, "{error:?}"),
            Self::Skipped(reason) => write!(f, "skipped: {reason}"),
        }
    }
}

/// Constructor of skips: `return Err(Skip::because("needs 2 nodes, cluster has 1"))`.
#[derive(Debug, Clone, Copy)]
pub struct Skip;

impl Skip {
    /// A [`SpecError::Skipped`] with this reason.
    pub fn because(reason: impl Into<String>) -> SpecError {
        SpecError::Skipped(reason.into())
    }
}

/// A [`SpecError::Skipped`] with this reason: `return Err(skip("needs 2 nodes"))`.
pub fn skip(reason: impl Into<String>) -> SpecError {
    SpecError::Skipped(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube_error() -> Result<(), kube::Error> {
        Err(kube::Error::LinesCodecMaxLineLengthExceeded)
    }

    fn question_mark_on_kube() -> SpecResult {
        kube_error()?;
        Ok(())
    }

    fn question_mark_on_anyhow_with_context() -> SpecResult {
        use anyhow::Context as _;
        kube_error().context("list pods")?;
        Ok(())
    }

    #[derive(Debug, thiserror::Error)]
    #[error("our error")]
    struct Ours;

    fn question_mark_on_thiserror() -> SpecResult {
        Err(Ours)?;
        Ok(())
    }

    #[test]
    fn question_mark_converts_errors_into_failures() {
        assert!(matches!(question_mark_on_kube(), Err(SpecError::Failed(_))));
        let with_context = question_mark_on_anyhow_with_context().unwrap_err();
        assert_eq!(with_context.to_string(), "list pods: Error finding newline character");
        assert!(format!("{with_context:?}").contains("Caused by"));
        assert_eq!(question_mark_on_thiserror().unwrap_err().to_string(), "our error");
    }

    #[test]
    fn skips_are_distinct_from_failures() {
        let s = Skip::because("needs 2 nodes, cluster has 1");
        assert!(s.is_skip());
        assert_eq!(s.skip_reason(), Some("needs 2 nodes, cluster has 1"));
        assert_eq!(skip("x").to_string(), "skipped: x");
        assert!(!SpecError::fail("boom").is_skip());
    }
}
