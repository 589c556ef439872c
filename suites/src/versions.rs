//! The Kubernetes versions `dra-e2e` has spec texts for, and the feature gates of each that the
//! specs name ([`Label::gate`](harness::framework::Label::gate)), with their dependencies: what
//! upstream's `framework.WithFeatureGate` reads from the e2e binary's own feature gates.
//!
//! The values are those of `k8s.io/kubernetes/pkg/features` at each version, as its default
//! feature gate reports them (`GetAll()` and `Dependencies()`): `cargo xtask upstream-specs V`
//! writes them to `suites/upstream/gates-V.txt`, and a test here checks every table against it.
//! The parity test checks the texts they compose against upstream's dry run of the same version
//! (`suites/upstream/specs-V.txt`).

use harness::framework::{Gate, GateTable, Stability};

/// Every version, oldest first; the first is the default.
pub const TABLES: &[GateTable] = &[V1_37_2, V1_38_0_BETA_0];

/// The default version's table, the first (`--list` without `--k8s-version` uses it).
#[cfg(test)]
pub const DEFAULT: &GateTable = &TABLES[0];

const fn gate(
    name: &'static str,
    stability: Stability,
    default: bool,
    depends_on: &'static [&'static str],
) -> Gate {
    Gate { name, stability, default, depends_on }
}

/// The gates of Kubernetes v1.37.2 that the specs name, with what they depend on.
pub const V1_37_2: GateTable = GateTable {
    version: "v1.37.2",
    gates: &[
        gate("DRAConsumableCapacity", Stability::Beta, true, &["DynamicResourceAllocation"]),
        gate(
            "DRADeviceCompatibilityGroups",
            Stability::Alpha,
            false,
            &["DRAPartitionableDevices", "DynamicResourceAllocation"],
        ),
        gate("DRADeviceTaintRules", Stability::Ga, true, &["DRADeviceTaints"]),
        gate("DRADeviceTaints", Stability::Ga, true, &["DynamicResourceAllocation"]),
        gate("DRAExtendedResource", Stability::Ga, true, &["DynamicResourceAllocation"]),
        gate("DRANodeAllocatableResources", Stability::Alpha, false, &["DynamicResourceAllocation"]),
        gate(
            "DRAOptionalNodeOperations",
            Stability::Alpha,
            false,
            &["DynamicResourceAllocation", "NodeDeclaredFeatures"],
        ),
        gate("DRAPartitionableDevices", Stability::Beta, true, &["DynamicResourceAllocation"]),
        gate(
            "DRAPartitionableDevicesType",
            Stability::Alpha,
            false,
            &["DRAPartitionableDevices", "DRAResourcePoolStatus", "DynamicResourceAllocation"],
        ),
        gate("DRAPrioritizedList", Stability::Ga, true, &["DynamicResourceAllocation"]),
        gate("DRAResourceClaimDeviceStatus", Stability::Ga, true, &[]),
        gate("DRAResourcePoolStatus", Stability::Alpha, false, &["DynamicResourceAllocation"]),
        gate(
            "DRAWorkloadResourceClaims",
            Stability::Beta,
            false,
            &["DynamicResourceAllocation", "GenericWorkload"],
        ),
        gate("DynamicResourceAllocation", Stability::Ga, true, &[]),
        gate("GenericWorkload", Stability::Beta, false, &[]),
        gate(
            "InPlacePodLevelResourcesVerticalScaling",
            Stability::Beta,
            true,
            &["InPlacePodVerticalScaling", "NodeDeclaredFeatures", "PodLevelResources"],
        ),
        gate("InPlacePodVerticalScaling", Stability::Ga, true, &[]),
        gate("NodeDeclaredFeatures", Stability::Ga, true, &[]),
        gate("PodLevelResources", Stability::Beta, true, &[]),
        gate("ResourceHealthStatus", Stability::Beta, true, &["DynamicResourceAllocation"]),
        gate("ResourceHealthStatusMessage", Stability::Beta, true, &["ResourceHealthStatus"]),
    ],
    removed: &[],
};

/// The gates of Kubernetes v1.38.0-beta.0 that the specs name: `DynamicResourceAllocation` is
/// gone (so is every dependency on it); `DRAPartitionableDevices` and `DRAConsumableCapacity` are GA.
pub const V1_38_0_BETA_0: GateTable = GateTable {
    version: "v1.38.0-beta.0",
    gates: &[
        gate("DRAConsumableCapacity", Stability::Ga, true, &[]),
        gate("DRADeviceCompatibilityGroups", Stability::Alpha, false, &["DRAPartitionableDevices"]),
        gate("DRADeviceTaintRules", Stability::Ga, true, &["DRADeviceTaints"]),
        gate("DRADeviceTaints", Stability::Ga, true, &[]),
        gate("DRAExtendedResource", Stability::Ga, true, &[]),
        gate("DRANodeAllocatableResources", Stability::Alpha, false, &[]),
        gate("DRAOptionalNodeOperations", Stability::Alpha, false, &["NodeDeclaredFeatures"]),
        gate("DRAPartitionableDevices", Stability::Ga, true, &[]),
        gate(
            "DRAPartitionableDevicesType",
            Stability::Alpha,
            false,
            &["DRAPartitionableDevices", "DRAResourcePoolStatus"],
        ),
        gate("DRAPrioritizedList", Stability::Ga, true, &[]),
        gate("DRAResourceClaimDeviceStatus", Stability::Ga, true, &[]),
        gate("DRAResourcePoolStatus", Stability::Alpha, false, &[]),
        gate("DRAWorkloadResourceClaims", Stability::Beta, false, &["GenericWorkload"]),
        gate("GenericWorkload", Stability::Beta, false, &[]),
        gate(
            "InPlacePodLevelResourcesVerticalScaling",
            Stability::Beta,
            true,
            &["NodeDeclaredFeatures", "PodLevelResources"],
        ),
        gate("NodeDeclaredFeatures", Stability::Ga, true, &[]),
        gate("PodLevelResources", Stability::Beta, true, &[]),
        gate("ResourceHealthStatus", Stability::Beta, true, &[]),
        gate("ResourceHealthStatusMessage", Stability::Beta, true, &["ResourceHealthStatus"]),
    ],
    removed: &["DynamicResourceAllocation"],
};

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, path::Path};

    use super::*;

    #[test]
    fn versions_are_distinct_and_every_dependency_is_known() {
        for (i, table) in TABLES.iter().enumerate() {
            assert!(TABLES[..i].iter().all(|t| t.version != table.version), "{table} twice");
            assert!(table.kube_version().is_some(), "{table}");
            for gate in table.gates {
                assert!(
                    !table.removed.contains(&gate.name),
                    "{table}: {} is both there and removed",
                    gate.name
                );
                for dep in gate.depends_on {
                    assert!(table.expand(dep).is_ok(), "{table}: {} depends on unknown {dep}", gate.name);
                }
            }
        }
        assert_eq!(DEFAULT.version, "v1.37.2");
    }

    /// `suites/upstream/gates-V.txt` as `name -> (stability, default, sorted dependencies)`.
    fn upstream_gates(version: &str) -> HashMap<String, (String, bool, Vec<String>)> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream").join(format!("gates-{version}.txt"));
        let content = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e}; `cargo xtask upstream-specs {version}` writes it", path.display())
        });
        content
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 4, "{}: {l:?}", path.display());
                let deps = f[3].split(',').filter(|d| !d.is_empty()).map(str::to_owned).collect();
                (f[0].to_owned(), (f[1].to_owned(), f[2] == "true", deps))
            })
            .collect()
    }

    #[test]
    fn tables_are_upstreams_gates() {
        for table in TABLES {
            let upstream = upstream_gates(table.version);
            for gate in table.gates {
                let stability = match gate.stability {
                    Stability::Alpha => "ALPHA",
                    Stability::Beta => "BETA",
                    Stability::Ga => "GA",
                    Stability::Deprecated => "DEPRECATED",
                };
                let mut deps: Vec<String> = gate.depends_on.iter().map(|d| (*d).to_owned()).collect();
                deps.sort();
                assert_eq!(
                    upstream.get(gate.name),
                    Some(&(stability.to_owned(), gate.default, deps)),
                    "{table}: gate {}",
                    gate.name
                );
            }
            for gone in table.removed {
                assert!(
                    !upstream.contains_key(*gone),
                    "{table}: {gone} is listed as removed but upstream has it"
                );
            }
        }
    }
}
