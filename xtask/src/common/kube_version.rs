//! The one Kubernetes version type: the pinned release, `--k8s-version`, `--kubelet-version`, a
//! checkout's `git describe`, a kind node image's tag. A semantic version (the `semver` crate)
//! written with or without a leading `v` and printed with it, ordered as semver orders (the
//! pre-release v1.38.0-beta.0 before its release v1.38.0).

use std::{fmt, str::FromStr};

/// A Kubernetes version: `v1.34.4`, `v1.38.0-beta.0`, a checkout's `v1.38.0-alpha.0-12-gabc`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion(semver::Version);

impl KubeVersion {
    /// The release `vMAJOR.MINOR.PATCH`.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self(semver::Version::new(major, minor, patch))
    }

    /// Parses any Kubernetes version (`v1.37.2`, `1.38.0-beta.0`, `v1.38.0-alpha.0.5+abc`);
    /// surrounding white space and the leading `v` are optional.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        Self::parse_as(text, Wanted::Version)
    }

    /// Parses a release (`v1.34.4`): a pre-release or build metadata is an error.
    pub fn parse_release(text: &str) -> Result<Self, VersionError> {
        let version = Self::parse_as(text, Wanted::Release)?;
        if !version.is_release() {
            return Err(VersionError::new(text, Wanted::Release, true));
        }
        Ok(version)
    }

    /// Parses a version k8s.io/kubernetes is published at (`v1.37.2`, `v1.38.0-beta.0`): major
    /// 1, a pre-release allowed, no build metadata. It names Go modules and cache directories.
    pub fn parse_tag(text: &str) -> Result<Self, VersionError> {
        let version = Self::parse_as(text, Wanted::Tag)?;
        if version.major() != 1 || !version.0.build.is_empty() {
            return Err(VersionError::new(text, Wanted::Tag, true));
        }
        Ok(version)
    }

    fn parse_as(text: &str, wanted: Wanted) -> Result<Self, VersionError> {
        let trimmed = text.trim();
        let bare = trimmed.strip_prefix('v').unwrap_or(trimmed);
        semver::Version::parse(bare).map(Self).map_err(|_| VersionError::new(text, wanted, false))
    }

    /// The major version (1).
    pub fn major(&self) -> u64 {
        self.0.major
    }

    /// The minor version (37 of v1.37.2).
    pub fn minor(&self) -> u64 {
        self.0.minor
    }

    /// Whether this is a release: no pre-release, no build metadata.
    pub fn is_release(&self) -> bool {
        self.0.pre.is_empty() && self.0.build.is_empty()
    }

    /// The release this version belongs to: v1.38.0 for v1.38.0-beta.0 (version skew is about
    /// releases); itself for a release.
    pub fn release(&self) -> Self {
        Self::new(self.0.major, self.0.minor, self.0.patch)
    }

    /// The version Kubernetes publishes its staging modules (k8s.io/api, …) at for this one:
    /// v0.MINOR.PATCH with the same pre-release (v0.38.0-beta.0 for v1.38.0-beta.0).
    pub fn staging(&self) -> Self {
        let mut staging = self.release();
        staging.0.major = 0;
        staging.0.pre = self.0.pre.clone();
        staging
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl FromStr for KubeVersion {
    type Err = VersionError;

    fn from_str(text: &str) -> Result<Self, VersionError> {
        Self::parse(text)
    }
}

/// What a parse asked for, for its error's sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Version,
    Release,
    Tag,
}

/// Text that is not the Kubernetes version asked for; displays as one sentence naming the text
/// and an example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionError {
    text: String,
    wanted: Wanted,
    /// Whether the text is a version, only not of the kind asked for.
    parsed: bool,
}

impl VersionError {
    fn new(text: &str, wanted: Wanted, parsed: bool) -> Self {
        Self { text: text.trim().to_string(), wanted, parsed }
    }
}

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = &self.text;
        match (self.wanted, self.parsed) {
            (Wanted::Release, true) => {
                write!(f, "{text:?} is a pre-release or build, not a Kubernetes release such as v1.34.4")
            }
            (Wanted::Release, false) => write!(f, "{text:?} is not a Kubernetes release such as v1.34.4"),
            (Wanted::Tag, _) => {
                write!(f, "{text:?} is not a Kubernetes release tag such as v1.37.2 or v1.38.0-beta.0")
            }
            (Wanted::Version, _) => {
                write!(f, "{text:?} is not a Kubernetes version such as v1.37.2 or v1.38.0-beta.0")
            }
        }
    }
}

impl std::error::Error for VersionError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> KubeVersion {
        KubeVersion::parse(text).unwrap()
    }

    #[test]
    fn parses_with_or_without_the_v_and_prints_with_it() {
        assert_eq!(v("v1.34.4"), KubeVersion::new(1, 34, 4));
        assert_eq!(v(" 1.34.4\n"), KubeVersion::new(1, 34, 4));
        assert_eq!(v("1.36.3").to_string(), "v1.36.3");
        assert_eq!(v("v1.38.0-beta.0").to_string(), "v1.38.0-beta.0");
        assert_eq!(v("v1.38.0-alpha.0.5+abcdef").to_string(), "v1.38.0-alpha.0.5+abcdef");
        assert_eq!("v1.37.2".parse::<KubeVersion>().unwrap(), v("1.37.2"));
        let version = v("v1.37.2-rc.1");
        assert_eq!((version.major(), version.minor()), (1, 37));
    }

    #[test]
    fn orders_as_semver_with_a_pre_release_before_its_release() {
        assert!(v("v1.34.10") > v("v1.34.9"));
        assert!(v("v1.37.0") > v("v1.36.3"));
        assert!(v("v1.38.0-alpha.1") < v("v1.38.0-beta.0"));
        assert!(v("v1.38.0-beta.0") < v("v1.38.0-rc.0"));
        assert!(v("v1.38.0-rc.0") < v("v1.38.0"));
        assert!(v("v1.37.2") < v("v1.38.0-beta.0"));
    }

    #[test]
    fn a_pre_release_belongs_to_its_release() {
        assert_eq!(v("v1.38.0-beta.0").release(), v("v1.38.0"));
        assert_eq!(v("v1.38.0-alpha.0-12-gabcdef-dirty").release(), v("v1.38.0"));
        assert_eq!(v("v1.37.2").release(), v("v1.37.2"));
        assert!(v("v1.37.2").is_release());
        assert!(!v("v1.38.0-beta.0").is_release());
        assert!(!v("v1.38.0+abc").is_release());
    }

    #[test]
    fn staging_modules_are_at_v0_of_the_same_release() {
        assert_eq!(v("v1.38.0-beta.0").staging().to_string(), "v0.38.0-beta.0");
        assert_eq!(v("v1.37.2").staging().to_string(), "v0.37.2");
    }

    #[test]
    fn releases_and_tags_are_narrower() {
        assert_eq!(KubeVersion::parse_release("1.34.4").unwrap(), v("v1.34.4"));
        for ok in ["v1.37.2", "v1.38.0-beta.0", "v1.38.0-rc.1", "1.38.0"] {
            assert_eq!(KubeVersion::parse_tag(ok).unwrap(), v(ok), "{ok}");
        }
        for bad in ["v2.0.0", "v1.38.0+abc", "v1.37", "v1.37.2/../x", "v1.38.0-beta 0", "v1.037.0"] {
            assert!(KubeVersion::parse_tag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_input_is_one_sentence_naming_it() {
        for bad in ["v1.34", "latest", "v1.34.x", "", "vv1.34.4", "v1.38-beta.0"] {
            let err = KubeVersion::parse(bad).unwrap_err().to_string();
            assert_eq!(err, format!("{bad:?} is not a Kubernetes version such as v1.37.2 or v1.38.0-beta.0"));
        }
        let err = KubeVersion::parse_release("v1.34.4-rc.0").unwrap_err().to_string();
        assert_eq!(
            err,
            "\"v1.34.4-rc.0\" is a pre-release or build, not a Kubernetes release such as v1.34.4"
        );
        let err = KubeVersion::parse_release(" latest ").unwrap_err().to_string();
        assert_eq!(err, "\"latest\" is not a Kubernetes release such as v1.34.4");
        let err = KubeVersion::parse_tag("v2.0.0").unwrap_err().to_string();
        assert_eq!(err, "\"v2.0.0\" is not a Kubernetes release tag such as v1.37.2 or v1.38.0-beta.0");
    }
}
