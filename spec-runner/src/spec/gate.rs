//! Feature gates per Kubernetes version, and how a [`Label::gate`] becomes labels.
//!
//! Upstream's `framework.WithFeatureGate(X)` (`test/e2e/framework/ginkgowrapper.go`, the same
//! at v1.37.2 and v1.38.0-beta.0) looks the gate up in the feature gates of the Kubernetes
//! version the e2e binary is built from and adds
//!
//! - the label `FeatureGate:X`, shown `[FeatureGate:X]` in place;
//! - its stability (`Alpha`, `Beta`, `Deprecated`; nothing for GA), at the end of the text;
//! - `Feature:OffByDefault` when the gate is off by default, at the end;
//! - the hidden label `BetaOffByDefault` for a beta gate that is off by default;
//! - the same for every gate X depends on, recursively, except that the dependency's own
//!   `FeatureGate:D` label goes to the end too.
//!
//! A gate a version no longer has (removed after GA) cannot be named there, so upstream's
//! specs drop it: here a [`GateTable`] lists it as removed and it contributes nothing.

use std::fmt;

use crate::{cluster::preflight::KubeVersion, spec::label::Label};

/// A feature gate's maturity (upstream's `featuregate.PreRelease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stability {
    /// `ALPHA`: rendered `[Alpha]`.
    Alpha,
    /// `BETA`: rendered `[Beta]`.
    Beta,
    /// GA: no label.
    Ga,
    /// `DEPRECATED`: rendered `[Deprecated]`.
    Deprecated,
}

impl Stability {
    /// The label upstream adds for it (mixed case, as the framework writes it).
    pub fn label(self) -> Option<&'static str> {
        match self {
            Self::Alpha => Some("Alpha"),
            Self::Beta => Some("Beta"),
            Self::Ga => None,
            Self::Deprecated => Some("Deprecated"),
        }
    }
}

/// One feature gate at one Kubernetes version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// The gate's name, e.g. `DRADeviceTaints`.
    pub name: &'static str,
    /// Its stability at this version.
    pub stability: Stability,
    /// Whether it is on by default at this version.
    pub default: bool,
    /// The gates it depends on at this version (upstream's `Dependencies()`), in upstream's order.
    pub depends_on: &'static [&'static str],
}

/// The feature gates of one Kubernetes version that specs name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateTable {
    /// The Kubernetes version, as its release tag: `v1.37.2`, `v1.38.0-beta.0`.
    pub version: &'static str,
    /// The gates the version has.
    pub gates: &'static [Gate],
    /// Gates the version no longer has; a [`Label::gate`] naming one adds nothing.
    pub removed: &'static [&'static str],
}

/// A gate a [`GateTable`] neither has nor lists as removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "feature gate {gate:?} is not in the gate table of Kubernetes {version} (add it, or list it as removed)"
)]
pub struct UnknownGate {
    /// The gate.
    pub gate: String,
    /// The table's version.
    pub version: &'static str,
}

impl GateTable {
    /// The gate `name`, if the version has it.
    pub fn get(&self, name: &str) -> Option<&Gate> {
        self.gates.iter().find(|g| g.name == name)
    }

    /// The version as `major.minor.patch`.
    pub fn kube_version(&self) -> Option<KubeVersion> {
        KubeVersion::parse(self.version)
    }

    /// The labels `framework.WithFeatureGate(name)` adds at this version (see the module
    /// documentation); nothing for a removed gate.
    pub fn expand(&self, name: &str) -> Result<Vec<Label>, UnknownGate> {
        let mut out = Vec::new();
        self.add(name, true, &mut out, 0)?;
        Ok(out)
    }

    fn add(&self, name: &str, direct: bool, out: &mut Vec<Label>, depth: usize) -> Result<(), UnknownGate> {
        let unknown = || UnknownGate { gate: name.to_owned(), version: self.version };
        let Some(gate) = self.get(name) else {
            return if self.removed.contains(&name) { Ok(()) } else { Err(unknown()) };
        };
        // Upstream's tables have no cycles; a wrong table of ours must not recurse forever.
        if depth > self.gates.len() {
            return Err(unknown());
        }
        let label = format!("FeatureGate:{}", gate.name);
        out.push(if direct { Label::from(label) } else { Label::trailing_owned(label) });
        if let Some(level) = gate.stability.label() {
            out.push(Label::trailing(level));
        }
        if !gate.default {
            out.push(Label::trailing("Feature:OffByDefault"));
            if gate.stability == Stability::Beta {
                out.push(Label::hidden("BetaOffByDefault"));
            }
        }
        for dep in gate.depends_on {
            self.add(dep, false, out, depth + 1)?;
        }
        Ok(())
    }
}

impl fmt::Display for GateTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.version)
    }
}

/// Which of the known versions a run targets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// `--k8s-version` names a version without spec texts here.
    #[error("Kubernetes version {given:?} is not one this binary has spec texts for; use one of: {}", known.join(", "))]
    Unknown {
        /// The flag's value.
        given: String,
        /// The versions there are.
        known: Vec<&'static str>,
    },
}

/// The table for `--k8s-version` (exact tag, with or without the leading `v`).
pub fn table_for_flag(tables: &'static [GateTable], given: &str) -> Result<&'static GateTable, VersionError> {
    let wanted = given.trim();
    let wanted = wanted.strip_prefix('v').unwrap_or(wanted);
    tables.iter().find(|t| t.version.trim_start_matches('v') == wanted).ok_or_else(|| VersionError::Unknown {
        given: given.to_owned(),
        known: tables.iter().map(|t| t.version).collect(),
    })
}

/// The table for a cluster's `gitVersion` (`/version`): the same tag, else the newest table of
/// the same minor version; `None` when no table has that minor version.
pub fn table_for_server(tables: &'static [GateTable], git_version: &str) -> Option<&'static GateTable> {
    let exact = git_version.split('+').next().unwrap_or(git_version);
    if let Some(t) = tables.iter().find(|t| t.version == exact) {
        return Some(t);
    }
    let minor = KubeVersion::parse(git_version)?.minor_version();
    tables.iter().rev().find(|t| t.kube_version().is_some_and(|v| v.minor_version() == minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: GateTable = GateTable {
        version: "v1.99.0",
        gates: &[
            Gate { name: "Base", stability: Stability::Ga, default: true, depends_on: &[] },
            Gate { name: "Mid", stability: Stability::Beta, default: false, depends_on: &["Base", "Gone"] },
            Gate { name: "Top", stability: Stability::Alpha, default: false, depends_on: &["Mid"] },
        ],
        removed: &["Gone"],
    };
    const TABLES: &[GateTable] = &[
        GateTable { version: "v1.37.2", gates: &[], removed: &[] },
        GateTable { version: "v1.38.0-beta.0", gates: &[], removed: &[] },
    ];

    fn shown(labels: &[Label]) -> Vec<String> {
        labels
            .iter()
            .map(|l| match (l.is_trailing(), l.is_shown()) {
                (true, _) => format!("trailing {}", l.name()),
                (false, true) => format!("in place {}", l.name()),
                (false, false) => format!("hidden {}", l.name()),
            })
            .collect()
    }

    #[test]
    fn expands_a_gate_and_its_dependencies_as_upstream() {
        assert_eq!(
            shown(&TABLE.expand("Top").unwrap()),
            [
                "in place FeatureGate:Top",
                "trailing Alpha",
                "trailing Feature:OffByDefault",
                "trailing FeatureGate:Mid",
                "trailing Beta",
                "trailing Feature:OffByDefault",
                "hidden BetaOffByDefault",
                "trailing FeatureGate:Base",
            ]
        );
        assert_eq!(shown(&TABLE.expand("Base").unwrap()), ["in place FeatureGate:Base"]);
        assert_eq!(TABLE.expand("Gone").unwrap(), []);
        assert_eq!(
            TABLE.expand("Typo").unwrap_err().to_string(),
            "feature gate \"Typo\" is not in the gate table of Kubernetes v1.99.0 (add it, or list it as removed)"
        );
    }

    #[test]
    fn picks_the_table_of_a_flag_or_a_server() {
        assert_eq!(table_for_flag(TABLES, "v1.38.0-beta.0").unwrap().version, "v1.38.0-beta.0");
        assert_eq!(table_for_flag(TABLES, "1.37.2").unwrap().version, "v1.37.2");
        assert_eq!(
            table_for_flag(TABLES, "v1.36.0").unwrap_err().to_string(),
            "Kubernetes version \"v1.36.0\" is not one this binary has spec texts for; use one of: v1.37.2, v1.38.0-beta.0"
        );
        let server = |v| table_for_server(TABLES, v).map(|t| t.version);
        assert_eq!(server("v1.37.2"), Some("v1.37.2"));
        assert_eq!(server("v1.37.5+k3s1"), Some("v1.37.2"));
        assert_eq!(server("v1.38.0-beta.0.41+0123abcd"), Some("v1.38.0-beta.0"));
        assert_eq!(server("v1.36.3"), None);
    }
}
