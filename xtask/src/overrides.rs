//! Feature gates, API versions and worker kubelet versions a cluster gets on top of `kind.yaml`'s:
//! what upstream's CI lanes do by appending lines to kind.yaml's `featureGates`, as `cluster up
//! --feature-gates A=true,B=true --runtime-config group/version=true`, and version skew as
//! `--kubelet-version v1.34.4` (see [`crate::skew`]). The local cluster records them with its
//! state, so a later `cluster up` knows whether the running cluster already has them.

use std::{collections::BTreeMap, fmt, path::Path};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    cluster_config::{ClusterConfig, FEATURE_GATES_KEY},
    common::kube_version::KubeVersion,
    skew,
};

/// The flags `cluster up` takes on top of kind.yaml (`--feature-gates`, `--runtime-config`,
/// `--kubelet-version`, `--k8s-version`, `--k8s-source`) as given, before [`OverrideArgs::parse`]
/// checks them; the command line's help describes each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverrideArgs {
    /// `--feature-gates`: gates in addition to kind.yaml's, `A=true,B=false`.
    pub feature_gates: Option<String>,
    /// `--runtime-config`: API versions in addition to kind.yaml's, `group/version=true`.
    pub runtime_config: Option<String>,
    /// `--kubelet-version`: the workers' kubelet versions, in order (`v1.34.4,v1.35.4`).
    pub kubelet_version: Option<String>,
    /// `--k8s-version`: the Kubernetes release the cluster runs (local provider).
    pub k8s_version: Option<String>,
    /// `--k8s-source`: the Kubernetes checkout the cluster is built from (local provider).
    pub k8s_source: Option<std::path::PathBuf>,
    /// `--node-cpus`: the CPUs each node reports (local provider); 0: the machine's own.
    pub node_cpus: Option<usize>,
    /// `--node-hugepages`: the 2 MiB hugepages the nodes report (local provider), `512Mi`; 0: the
    /// machine's own pool, left as it is.
    pub node_hugepages: Option<String>,
}

impl OverrideArgs {
    /// The overrides these flags ask for; `None` when neither flag is given.
    pub fn parse(&self) -> Result<Option<Overrides>> {
        if self.feature_gates.is_none()
            && self.runtime_config.is_none()
            && self.kubelet_version.is_none()
            && self.k8s_version.is_none()
            && self.k8s_source.is_none()
            && self.node_cpus.is_none()
            && self.node_hugepages.is_none()
        {
            return Ok(None);
        }
        if self.k8s_version.is_some() && self.k8s_source.is_some() {
            bail!("--k8s-version and --k8s-source both name the Kubernetes to build: give one");
        }
        let mut overrides = Overrides::default();
        if let Some(version) = self.k8s_version.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
            overrides.k8s_version = Some(crate::common::kube_module::parse_version(version)?);
        }
        // The default said explicitly is the default: a cluster up with it is the same cluster.
        overrides.node_cpus = self.node_cpus.filter(|&cpus| cpus != DEFAULT_NODE_CPUS);
        if let Some(size) = &self.node_hugepages {
            let mib = parse_hugepages_size(size).context("--node-hugepages")?;
            overrides.node_hugepages_mib = Some(mib).filter(|&mib| mib != DEFAULT_NODE_HUGEPAGES_MIB);
        }
        if let Some(dir) = &self.k8s_source {
            // Absolute, so the record means the same from any directory.
            overrides.k8s_source = Some(std::path::absolute(dir).unwrap_or_else(|_| dir.clone()));
        }
        if let Some(versions) = self.kubelet_version.as_deref().filter(|v| !v.trim().is_empty()) {
            overrides.kubelet_versions = skew::parse_flag(versions)?;
        }
        for (name, value) in pairs(self.feature_gates.as_deref().unwrap_or_default(), "--feature-gates")? {
            let on = value.parse::<bool>().map_err(|_| {
                anyhow::anyhow!(
                    "--feature-gates: {name}={value} is not a gate state; write {name}=true or {name}=false"
                )
            })?;
            overrides.feature_gates.insert(name, on);
        }
        for (api, value) in pairs(self.runtime_config.as_deref().unwrap_or_default(), "--runtime-config")? {
            ensure!(
                api.contains('/') || api == "api" || api == "apis",
                "--runtime-config: {api:?} is not an API group/version (e.g. scheduling.k8s.io/v1beta1=true)"
            );
            overrides.runtime_config.insert(api, value);
        }
        Ok(Some(overrides))
    }
}

/// `A=x,B=y` into pairs; one clear sentence for a malformed entry.
fn pairs(text: &str, flag: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() && !value.trim().is_empty() => {
                Ok((key.trim().to_string(), value.trim().to_string()))
            }
            _ => bail!("{flag}: {entry:?} is not of the form NAME=VALUE"),
        })
        .collect()
}

/// Gates, API versions and worker kubelet versions on top of kind.yaml's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Gate name to state.
    pub feature_gates: BTreeMap<String, bool>,
    /// API group/version to value.
    pub runtime_config: BTreeMap<String, String>,
    /// The workers' kubelet versions, in worker order (`--kubelet-version`).
    pub kubelet_versions: Vec<KubeVersion>,
    /// The Kubernetes release of the cluster (`--k8s-version`); `None`: the pinned one.
    pub k8s_version: Option<KubeVersion>,
    /// The Kubernetes checkout the cluster is built from (`--k8s-source`).
    pub k8s_source: Option<std::path::PathBuf>,
    /// The CPUs each node reports (`--node-cpus`); `None`: [`DEFAULT_NODE_CPUS`].
    pub node_cpus: Option<usize>,
    /// The MiB of 2 MiB hugepages the nodes report (`--node-hugepages`); `None`:
    /// [`DEFAULT_NODE_HUGEPAGES_MIB`].
    pub node_hugepages_mib: Option<u64>,
}

/// The CPUs each local node reports without `--node-cpus` (see `local/node_cpus.rs`).
pub const DEFAULT_NODE_CPUS: usize = 8;

/// The size of a hugepage the local nodes report, in MiB (`hugepages-2Mi`).
pub const HUGEPAGE_MIB: u64 = 2;
/// The hugepages the local nodes report without `--node-hugepages`, in MiB (the Node Allocatable
/// hugepages specs ask for 202 MiB on one node; see `local/hugepages.rs`).
pub const DEFAULT_NODE_HUGEPAGES_MIB: u64 = 512;

/// `--node-hugepages`: `512Mi`, `1Gi` or `0` as MiB, a whole number of 2 MiB pages.
pub fn parse_hugepages_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let number: u64 = number.parse().with_context(|| format!("{text:?} does not start with a number"))?;
    let mib = match unit {
        "Mi" => number,
        "Gi" => number.saturating_mul(1024),
        "" if number == 0 => 0,
        _ => bail!("{text:?} is not a size in Mi or Gi (512Mi, 1Gi, or 0 for none)"),
    };
    ensure!(mib % HUGEPAGE_MIB == 0, "{text:?} is not a whole number of {HUGEPAGE_MIB} MiB hugepages");
    Ok(mib)
}

impl Overrides {
    /// Whether there is nothing to add.
    pub fn is_empty(&self) -> bool {
        self.feature_gates.is_empty()
            && self.runtime_config.is_empty()
            && self.kubelet_versions.is_empty()
            && self.k8s_version.is_none()
            && self.k8s_source.is_none()
            && self.node_cpus.is_none()
            && self.node_hugepages_mib.is_none()
    }

    /// The CPUs each local node reports: `--node-cpus`, or [`DEFAULT_NODE_CPUS`].
    pub fn node_cpus(&self) -> usize {
        self.node_cpus.unwrap_or(DEFAULT_NODE_CPUS)
    }

    /// The MiB of hugepages the local nodes report: `--node-hugepages`, or
    /// [`DEFAULT_NODE_HUGEPAGES_MIB`].
    pub fn node_hugepages_mib(&self) -> u64 {
        self.node_hugepages_mib.unwrap_or(DEFAULT_NODE_HUGEPAGES_MIB)
    }

    /// `config` with these settings added (an override wins over kind.yaml's value).
    pub fn apply(&self, mut config: ClusterConfig) -> ClusterConfig {
        config.feature_gates.extend(self.feature_gates.clone());
        config.runtime_config.extend(self.runtime_config.clone());
        config
    }

    /// The text kept with the local cluster's state (two lines, the flags' values).
    pub fn to_record(&self) -> String {
        let gates = self.feature_gates.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        let apis = self.runtime_config.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        let mut record = format!("feature-gates {}\nruntime-config {}\n", gates.join(","), apis.join(","));
        if !self.kubelet_versions.is_empty() {
            record.push_str(&format!("kubelet-version {}\n", self.kubelet_flag()));
        }
        if let Some(version) = &self.k8s_version {
            record.push_str(&format!("k8s-version {version}\n"));
        }
        if let Some(dir) = &self.k8s_source {
            record.push_str(&format!("k8s-source {}\n", dir.display()));
        }
        record.push_str(&format!("node-cpus {}\n", self.node_cpus()));
        record.push_str(&format!("node-hugepages {}Mi\n", self.node_hugepages_mib()));
        record
    }

    /// The `--kubelet-version` value: `v1.34.4,v1.35.4`.
    pub fn kubelet_flag(&self) -> String {
        self.kubelet_versions.iter().map(KubeVersion::to_string).collect::<Vec<_>>().join(",")
    }

    /// Reads what [`Overrides::to_record`] wrote.
    pub fn from_record(text: &str) -> Result<Overrides> {
        // A record without a line is of a cluster from before its flag: the machine's own.
        let mut args =
            OverrideArgs { node_cpus: Some(0), node_hugepages: Some("0".into()), ..OverrideArgs::default() };
        for line in text.lines() {
            match line.split_once(' ').unwrap_or((line, "")) {
                ("feature-gates", value) => args.feature_gates = Some(value.to_string()),
                ("runtime-config", value) => args.runtime_config = Some(value.to_string()),
                ("kubelet-version", value) => args.kubelet_version = Some(value.to_string()),
                ("k8s-version", value) => args.k8s_version = Some(value.to_string()),
                ("k8s-source", value) => args.k8s_source = Some(value.into()),
                ("node-cpus", value) => {
                    args.node_cpus = Some(
                        value
                            .trim()
                            .parse()
                            .with_context(|| format!("node-cpus {value:?} is not a number"))?,
                    )
                }
                ("node-hugepages", value) => args.node_hugepages = Some(value.to_string()),
                ("", _) => {}
                (other, _) => bail!("unknown line {other:?} in the recorded overrides"),
            }
        }
        Ok(args.parse()?.unwrap_or_default())
    }

    /// A kind configuration: the file at `kind_yaml` with these settings added to its
    /// `featureGates` and `runtimeConfig` (YAML re-rendered; comments are not kept). With
    /// `known_gates` (the node image's kubelet's list), the gates not in it are left out.
    pub fn kind_config(&self, kind_yaml: &Path, known_gates: Option<&[String]>) -> Result<String> {
        let text = std::fs::read_to_string(kind_yaml)
            .with_context(|| format!("cannot read the kind configuration {}", kind_yaml.display()))?;
        let mut doc: serde_yaml::Mapping = serde_yaml::from_str(&text)
            .with_context(|| format!("{} is not a YAML mapping", kind_yaml.display()))?;
        let mut section = |key: &str, entries: Vec<(String, serde_yaml::Value)>| {
            let value = doc
                .remove(key)
                .filter(|v| !v.is_null())
                .unwrap_or_else(|| serde_yaml::Value::Mapping(Default::default()));
            let serde_yaml::Value::Mapping(mut map) = value else {
                bail!("{key} of {} is not a mapping", kind_yaml.display());
            };
            for (name, value) in entries {
                map.insert(name.into(), value);
            }
            doc.insert(key.into(), serde_yaml::Value::Mapping(map));
            Ok(())
        };
        section(
            "runtimeConfig",
            self.runtime_config.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect(),
        )?;
        // Inserted last, so featureGates stays the last key, as CI lanes expect.
        section(
            FEATURE_GATES_KEY,
            self.feature_gates.iter().map(|(k, v)| (k.clone(), (*v).into())).collect(),
        )?;
        if let (Some(known), Some(serde_yaml::Value::Mapping(gates))) =
            (known_gates, doc.get_mut(FEATURE_GATES_KEY))
        {
            // kind.yaml names the gates of the pinned release; another release may have removed
            // or locked some of them, and a component refuses a gate it does not list.
            let mut dropped = Vec::new();
            gates.retain(|name, _| {
                let name = name.as_str().unwrap_or_default();
                let keep = known.iter().any(|k| k == name);
                if !keep {
                    dropped.push(name.to_string());
                }
                keep
            });
            if !dropped.is_empty() {
                eprintln!(
                    "    the node image's Kubernetes does not take the gates {} (removed or locked): left out",
                    dropped.join(", ")
                );
            }
        }
        // Worker i's image becomes kindest/node:V, as kind runs each node from its image.
        if !self.kubelet_versions.is_empty() {
            let Some(serde_yaml::Value::Sequence(nodes)) = doc.get_mut("nodes") else {
                bail!("--kubelet-version needs a node list in {}", kind_yaml.display());
            };
            let workers: Vec<&mut serde_yaml::Value> = nodes
                .iter_mut()
                .filter(|n| n.get("role").and_then(serde_yaml::Value::as_str) == Some("worker"))
                .collect();
            ensure!(
                self.kubelet_versions.len() <= workers.len(),
                "--kubelet-version lists {} versions, {} has {} workers",
                self.kubelet_versions.len(),
                kind_yaml.display(),
                workers.len()
            );
            for (node, version) in workers.into_iter().zip(&self.kubelet_versions) {
                if let serde_yaml::Value::Mapping(node) = node {
                    node.insert("image".into(), format!("{}:{version}", skew::KIND_NODE_IMAGE).into());
                }
            }
        }
        let rendered = serde_yaml::to_string(&doc).context("render the kind configuration")?;
        Ok(format!(
            "# Generated by `cargo xtask cluster up` from {} with {self}.\n{rendered}",
            kind_yaml.display()
        ))
    }
}

/// As the flags that give it.
impl fmt::Display for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "kind.yaml's settings only");
        }
        let mut parts = Vec::new();
        if !self.feature_gates.is_empty() {
            let gates = self.feature_gates.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
            parts.push(format!("--feature-gates {}", gates.join(",")));
        }
        if !self.runtime_config.is_empty() {
            let apis = self.runtime_config.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
            parts.push(format!("--runtime-config {}", apis.join(",")));
        }
        if !self.kubelet_versions.is_empty() {
            parts.push(format!("--kubelet-version {}", self.kubelet_flag()));
        }
        if let Some(version) = &self.k8s_version {
            parts.push(format!("--k8s-version {version}"));
        }
        if let Some(dir) = &self.k8s_source {
            parts.push(format!("--k8s-source {}", dir.display()));
        }
        if let Some(cpus) = self.node_cpus {
            parts.push(format!("--node-cpus {cpus}"));
        }
        if let Some(mib) = self.node_hugepages_mib {
            parts.push(format!("--node-hugepages {mib}Mi"));
        }
        write!(f, "{}", parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(gates: Option<&str>, apis: Option<&str>) -> OverrideArgs {
        OverrideArgs {
            feature_gates: gates.map(String::from),
            runtime_config: apis.map(String::from),
            kubelet_version: None,
            k8s_version: None,
            k8s_source: None,
            node_cpus: None,
            node_hugepages: None,
        }
    }

    #[test]
    fn node_cpus_print_and_round_trip_through_the_record() {
        let none = args(None, None).parse().unwrap();
        assert_eq!(none, None, "no flag, no overrides");
        assert_eq!(Overrides::default().node_cpus(), DEFAULT_NODE_CPUS);
        let cpus = OverrideArgs { node_cpus: Some(0), ..args(None, None) }.parse().unwrap().unwrap();
        assert_eq!(cpus.node_cpus(), 0);
        assert_eq!(cpus.to_string(), "--node-cpus 0");
        assert_eq!(Overrides::from_record(&cpus.to_record()).unwrap(), cpus);
        assert!(Overrides::from_record("node-cpus many\n").is_err());
        // The default, given or not, is one cluster; a record from before the flag is not it.
        let eight = OverrideArgs { node_cpus: Some(DEFAULT_NODE_CPUS), ..args(None, None) }.parse().unwrap();
        assert_eq!(eight.unwrap_or_default(), Overrides::default());
        assert_eq!(Overrides::from_record(&Overrides::default().to_record()).unwrap(), Overrides::default());
        assert_eq!(Overrides::from_record("feature-gates \nruntime-config \n").unwrap().node_cpus(), 0);
    }

    #[test]
    fn hugepages_sizes_are_whole_pages_in_mi_or_gi() {
        assert_eq!(parse_hugepages_size("512Mi").unwrap(), 512);
        assert_eq!(parse_hugepages_size("1Gi").unwrap(), 1024);
        assert_eq!(parse_hugepages_size("0").unwrap(), 0);
        assert_eq!(parse_hugepages_size(" 0Mi ").unwrap(), 0);
        for bad in ["512", "3Mi", "1G", "Mi", "-2Mi", "2MiB", ""] {
            assert!(parse_hugepages_size(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn node_hugepages_print_and_round_trip_through_the_record() {
        let some = OverrideArgs { node_hugepages: Some("1Gi".into()), ..args(None, None) };
        let some = some.parse().unwrap().unwrap();
        assert_eq!(some.node_hugepages_mib(), 1024);
        assert_eq!(some.to_string(), "--node-hugepages 1024Mi");
        assert_eq!(Overrides::from_record(&some.to_record()).unwrap(), some);
        let default = OverrideArgs { node_hugepages: Some("512Mi".into()), ..args(None, None) };
        assert_eq!(default.parse().unwrap().unwrap_or_default(), Overrides::default());
        let bad = OverrideArgs { node_hugepages: Some("3Mi".into()), ..args(None, None) }.parse();
        assert!(format!("{:#}", bad.unwrap_err()).starts_with("--node-hugepages: "));
        // A record from before the flag is of a cluster that left the machine's pool alone.
        assert_eq!(Overrides::from_record("node-cpus 8\n").unwrap().node_hugepages_mib(), 0);
    }

    #[test]
    fn the_kubernetes_to_build_parses_prints_and_round_trips() {
        let version = OverrideArgs { k8s_version: Some("v1.38.0-beta.0".into()), ..args(None, None) };
        let parsed = version.parse().unwrap().unwrap();
        assert_eq!(parsed.to_string(), "--k8s-version v1.38.0-beta.0");
        assert_eq!(Overrides::from_record(&parsed.to_record()).unwrap(), parsed);
        let source = OverrideArgs { k8s_source: Some("/src/kubernetes".into()), ..args(None, None) };
        let parsed = source.parse().unwrap().unwrap();
        assert_eq!(parsed.to_string(), "--k8s-source /src/kubernetes");
        assert_eq!(Overrides::from_record(&parsed.to_record()).unwrap(), parsed);
        let err =
            OverrideArgs { k8s_version: Some("latest".into()), ..args(None, None) }.parse().unwrap_err();
        assert!(err.to_string().contains("not a Kubernetes release tag"), "{err}");
        // Written without the `v`, it is recorded and printed with it.
        let bare = OverrideArgs { k8s_version: Some("1.38.0-beta.0".into()), ..args(None, None) };
        assert_eq!(bare.parse().unwrap().unwrap().to_string(), "--k8s-version v1.38.0-beta.0");
        let both = OverrideArgs { k8s_source: Some("/src".into()), ..version };
        assert!(both.parse().unwrap_err().to_string().contains("give one"));
    }

    #[test]
    fn a_kind_config_for_another_release_leaves_out_the_gates_it_does_not_take() {
        let overrides = OverrideArgs {
            k8s_version: Some("v1.38.0-beta.0".into()),
            ..args(Some("GenericWorkload=true"), None)
        }
        .parse()
        .unwrap()
        .unwrap();
        let kind_yaml = crate::cluster_config::default_path();
        let all = crate::cluster_config::ClusterConfig::load(&kind_yaml).unwrap().feature_gates;
        assert!(all.contains_key("DRADeviceTaints"), "{all:?}");
        let known: Vec<String> = all
            .keys()
            .filter(|g| *g != "DRADeviceTaints")
            .cloned()
            .chain(["GenericWorkload".into()])
            .collect();
        let text = overrides.kind_config(&kind_yaml, Some(&known)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let derived = dir.path().join("kind.yaml");
        std::fs::write(&derived, &text).unwrap();
        let gates = crate::cluster_config::ClusterConfig::load(&derived).unwrap().feature_gates;
        assert!(!gates.contains_key("DRADeviceTaints"), "{text}");
        assert!(gates["GenericWorkload"], "{text}");
        assert_eq!(gates.len(), all.len(), "{text}");
        // Without a list, every gate stays.
        let text = overrides.kind_config(&kind_yaml, None).unwrap();
        assert!(text.contains("DRADeviceTaints"), "{text}");
    }

    #[test]
    fn kubelet_versions_parse_print_and_round_trip() {
        let parsed = OverrideArgs { kubelet_version: Some("v1.34.4,1.35.4".into()), ..args(None, None) }
            .parse()
            .unwrap()
            .unwrap();
        assert_eq!(parsed.kubelet_flag(), "v1.34.4,v1.35.4");
        assert_eq!(parsed.to_string(), "--kubelet-version v1.34.4,v1.35.4");
        assert!(!parsed.is_empty());
        assert_eq!(Overrides::from_record(&parsed.to_record()).unwrap(), parsed);
        // A record of a cluster without skew has no kubelet line.
        assert!(!Overrides::default().to_record().contains("kubelet"));
        let err =
            OverrideArgs { kubelet_version: Some("v1.34".into()), ..args(None, None) }.parse().unwrap_err();
        assert!(err.to_string().contains("--kubelet-version"), "{err}");
    }

    #[test]
    fn flags_parse_and_round_trip_through_the_record() {
        let parsed = args(
            Some("GenericWorkload=true, DRAWorkloadResourceClaims=true"),
            Some("scheduling.k8s.io/v1beta1=true"),
        )
        .parse()
        .unwrap()
        .unwrap();
        assert!(parsed.feature_gates["GenericWorkload"]);
        assert_eq!(parsed.runtime_config["scheduling.k8s.io/v1beta1"], "true");
        assert_eq!(Overrides::from_record(&parsed.to_record()).unwrap(), parsed);
        assert_eq!(
            parsed.to_string(),
            "--feature-gates DRAWorkloadResourceClaims=true,GenericWorkload=true --runtime-config scheduling.k8s.io/v1beta1=true"
        );
        assert_eq!(args(None, None).parse().unwrap(), None);
        assert_eq!(Overrides::from_record(&Overrides::default().to_record()).unwrap(), Overrides::default());
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        let err = args(Some("GenericWorkload"), None).parse().unwrap_err().to_string();
        assert!(err.contains("\"GenericWorkload\" is not of the form NAME=VALUE"), "{err}");
        let err = args(Some("GenericWorkload=yes"), None).parse().unwrap_err().to_string();
        assert!(err.contains("write GenericWorkload=true or GenericWorkload=false"), "{err}");
        let err = args(None, Some("scheduling=true")).parse().unwrap_err().to_string();
        assert!(err.contains("not an API group/version"), "{err}");
    }

    #[test]
    fn overrides_win_over_kind_yaml_and_keep_its_other_settings() {
        let base = ClusterConfig::load(&crate::cluster_config::default_path()).unwrap();
        let overrides =
            args(Some("GenericWorkload=true,DRADeviceTaints=false"), Some("scheduling.k8s.io/v1beta1=true"))
                .parse()
                .unwrap()
                .unwrap();
        let merged = overrides.apply(base.clone());
        assert!(merged.feature_gates["GenericWorkload"]);
        assert!(!merged.feature_gates["DRADeviceTaints"]);
        assert_eq!(
            merged.feature_gates["DRAResourcePoolStatus"],
            base.feature_gates["DRAResourcePoolStatus"]
        );
        assert_eq!(merged.runtime_config["scheduling.k8s.io/v1beta1"], "true");
        assert_eq!(merged.runtime_config["resource.k8s.io/v1beta1"], "true");
        assert_eq!(merged.kubelet_args, base.kubelet_args);
    }

    #[test]
    fn the_kind_config_is_kind_yaml_plus_the_overrides_and_parses_as_kind_yaml_does() {
        let overrides = args(Some("GenericWorkload=true"), Some("scheduling.k8s.io/v1beta1=true"))
            .parse()
            .unwrap()
            .unwrap();
        let text = overrides.kind_config(&crate::cluster_config::default_path(), None).unwrap();
        let parsed = ClusterConfig::parse(&text).unwrap();
        let base = ClusterConfig::load(&crate::cluster_config::default_path()).unwrap();
        assert_eq!(parsed, overrides.apply(base));
    }

    #[test]
    fn kubelet_versions_become_the_workers_kind_images() {
        let overrides = OverrideArgs { kubelet_version: Some("v1.34.4".into()), ..args(None, None) }
            .parse()
            .unwrap()
            .unwrap();
        let text = overrides.kind_config(&crate::cluster_config::default_path(), None).unwrap();
        let parsed = ClusterConfig::parse(&text).unwrap();
        assert_eq!(parsed.node_images, [None, Some("kindest/node:v1.34.4".to_string()), None, None]);
        let too_many = OverrideArgs {
            kubelet_version: Some("v1.34.4,v1.34.4,v1.34.4,v1.34.4".into()),
            ..args(None, None)
        };
        let err = too_many
            .parse()
            .unwrap()
            .unwrap()
            .kind_config(&crate::cluster_config::default_path(), None)
            .unwrap_err();
        assert!(err.to_string().contains("3 workers"), "{err}");
    }
}
