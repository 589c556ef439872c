//! The cluster settings both providers share, read from the repository's `kind.yaml`.
//!
//! kind applies `kind.yaml` itself; the local provider reads the same file through
//! [`ClusterConfig::load`] (usually of [`default_path`]) so that
//! feature gates, runtime-config and the component arguments are identical in both clusters. Only
//! what the local provider needs is read here; kind's own checks of the file are in
//! `xtask/kind-check` (run by the tests below).

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail, ensure};
use serde::Deserialize;
use serde_yaml::Value;

/// The file name of the kind configuration at the repository root.
pub const FILE_NAME: &str = "kind.yaml";

/// The top-level key that must stay last in `kind.yaml`: CI lanes add feature gates by appending
/// indented lines to the file.
pub const FEATURE_GATES_KEY: &str = "featureGates";

/// The kubeadm API version whose patches apply: kind 0.33 generates `kubeadm.k8s.io/v1beta4`
/// documents for Kubernetes 1.36 and later, and ignores patches that name another version.
pub const KUBEADM_API_VERSION: &str = "kubeadm.k8s.io/v1beta4";

/// What the local provider takes from `kind.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `featureGates`: gate name to state, for every component.
    pub feature_gates: BTreeMap<String, bool>,
    /// `runtimeConfig`: API group/version to value, for the apiserver's `--runtime-config`.
    pub runtime_config: BTreeMap<String, String>,
    /// kube-scheduler arguments (`ClusterConfiguration.scheduler.extraArgs`), name without dashes.
    pub scheduler_args: Vec<(String, String)>,
    /// kube-controller-manager arguments (`ClusterConfiguration.controllerManager.extraArgs`).
    pub controller_manager_args: Vec<(String, String)>,
    /// kubelet arguments (`nodeRegistration.kubeletExtraArgs` of Init- and JoinConfiguration,
    /// which must agree because the local provider gives every kubelet the same arguments).
    pub kubelet_args: Vec<(String, String)>,
    /// The roles of `nodes`, in order (`control-plane`, `worker`); kind's default (one control
    /// plane) when the file lists none.
    pub node_roles: Vec<String>,
    /// The `image` of each of `nodes`, in order (`kindest/node:vX.Y.Z` sets that node's kubelet
    /// version for the local provider, see [`crate::skew`]).
    pub node_images: Vec<Option<String>>,
}

/// The path of `kind.yaml` in this repository.
pub fn default_path() -> PathBuf {
    crate::repo::repo_root().join(FILE_NAME)
}

/// The subset of kind's v1alpha4 `Cluster` read here (kind-check decodes the file strictly).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KindFile {
    kind: String,
    api_version: String,
    #[serde(default)]
    feature_gates: BTreeMap<String, bool>,
    #[serde(default)]
    runtime_config: BTreeMap<String, String>,
    #[serde(default)]
    kubeadm_config_patches: Vec<String>,
    #[serde(default)]
    nodes: Vec<KindNode>,
}

/// One entry of kind's `nodes` (only the role and the image are read here).
#[derive(Debug, Deserialize)]
struct KindNode {
    role: String,
    #[serde(default)]
    image: Option<String>,
}

impl ClusterConfig {
    /// Reads and parses the kind configuration at `path`.
    pub fn load(path: &Path) -> anyhow::Result<ClusterConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the kind configuration {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("invalid kind configuration {}", path.display()))
    }

    /// Parses the text of a kind configuration (kind.x-k8s.io/v1alpha4 `Cluster`).
    ///
    /// Fails if `featureGates` is not the last top-level key, if a kubeadm patch is malformed, or
    /// if the control-plane and worker kubelets would get different arguments.
    pub fn parse(text: &str) -> anyhow::Result<ClusterConfig> {
        ensure_feature_gates_last(text)?;
        let file: KindFile = serde_yaml::from_str(text).context("not a kind cluster configuration")?;
        ensure!(
            file.kind == "Cluster" && file.api_version == "kind.x-k8s.io/v1alpha4",
            "expected kind Cluster of apiVersion kind.x-k8s.io/v1alpha4, found kind {:?} apiVersion {:?}",
            file.kind,
            file.api_version
        );

        let node_images: Vec<Option<String>> = file.nodes.iter().map(|n| n.image.clone()).collect();
        let node_roles = if file.nodes.is_empty() {
            vec!["control-plane".to_string()]
        } else {
            file.nodes.into_iter().map(|n| n.role).collect()
        };
        ensure!(
            node_roles.first().map(String::as_str) == Some("control-plane")
                && node_roles.iter().filter(|r| *r == "control-plane").count() == 1
                && node_roles.iter().all(|r| r == "control-plane" || r == "worker"),
            "the local provider runs one control plane, listed first, and workers; kind.yaml lists nodes {node_roles:?}"
        );
        let mut config = ClusterConfig {
            feature_gates: file.feature_gates,
            runtime_config: file.runtime_config,
            node_roles,
            node_images,
            ..ClusterConfig::default()
        };
        let mut init_kubelet = Vec::new();
        let mut join_kubelet = Vec::new();
        for (index, patch) in file.kubeadm_config_patches.iter().enumerate() {
            let doc: Value = serde_yaml::from_str(patch)
                .with_context(|| format!("kubeadmConfigPatches[{index}] is not YAML"))?;
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            let api_version = doc.get("apiVersion").and_then(Value::as_str);
            let is_kubeadm =
                matches!(kind, "ClusterConfiguration" | "InitConfiguration" | "JoinConfiguration");
            // kind applies a patch without apiVersion to every version, and one with another
            // version to none of the v1beta4 documents it generates for Kubernetes 1.37.
            if !is_kubeadm || api_version.is_some_and(|v| v != KUBEADM_API_VERSION) {
                continue;
            }
            let at = |field: &str| format!("kubeadmConfigPatches[{index}] ({kind}) {field}");
            match kind {
                "ClusterConfiguration" => {
                    merge_args(
                        &mut config.scheduler_args,
                        extra_args(
                            doc.get("scheduler").and_then(|s| s.get("extraArgs")),
                            &at("scheduler.extraArgs"),
                        )?,
                    );
                    merge_args(
                        &mut config.controller_manager_args,
                        extra_args(
                            doc.get("controllerManager").and_then(|s| s.get("extraArgs")),
                            &at("controllerManager.extraArgs"),
                        )?,
                    );
                }
                _ => {
                    let args = extra_args(
                        doc.get("nodeRegistration").and_then(|s| s.get("kubeletExtraArgs")),
                        &at("nodeRegistration.kubeletExtraArgs"),
                    )?;
                    let target =
                        if kind == "InitConfiguration" { &mut init_kubelet } else { &mut join_kubelet };
                    merge_args(target, args);
                }
            }
        }
        config.kubelet_args = agree(init_kubelet, join_kubelet)?;
        Ok(config)
    }

    /// The `--feature-gates` value: `A=true,B=false`, sorted by name (as kind renders it).
    pub fn feature_gates_flag(&self) -> String {
        self.feature_gates.iter().map(|(name, on)| format!("{name}={on}")).collect::<Vec<_>>().join(",")
    }

    /// The apiserver's `--runtime-config` value: `resource.k8s.io/v1beta1=true,...`, sorted (as kind
    /// renders it).
    pub fn runtime_config_flag(&self) -> String {
        self.runtime_config.iter().map(|(api, value)| format!("{api}={value}")).collect::<Vec<_>>().join(",")
    }
}

/// Renders the settings as the command-line flags they become, one component per line.
impl fmt::Display for ClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = |args: &[(String, String)]| {
            args.iter().map(|(name, value)| format!("--{name}={value}")).collect::<Vec<_>>().join(" ")
        };
        writeln!(f, "feature gates (all components): {}", self.feature_gates_flag())?;
        writeln!(f, "apiserver: --runtime-config={}", self.runtime_config_flag())?;
        writeln!(f, "scheduler: {}", flags(&self.scheduler_args))?;
        writeln!(f, "controller-manager: {}", flags(&self.controller_manager_args))?;
        write!(f, "kubelet: {}", flags(&self.kubelet_args))
    }
}

/// The top-level keys of a YAML mapping document, in file order.
pub fn top_level_keys(text: &str) -> anyhow::Result<Vec<String>> {
    let doc: serde_yaml::Mapping =
        serde_yaml::from_str(text).context("the document is not a YAML mapping")?;
    doc.keys()
        .map(|key| {
            key.as_str().map(str::to_owned).with_context(|| format!("top-level key {key:?} is not a string"))
        })
        .collect()
}

/// Checks that `featureGates` is the last top-level key, so that appended gate lines land in it.
pub fn ensure_feature_gates_last(text: &str) -> anyhow::Result<()> {
    let keys = top_level_keys(text)?;
    match keys.last() {
        Some(last) if last == FEATURE_GATES_KEY => Ok(()),
        Some(last) => bail!(
            "{FEATURE_GATES_KEY} must be the last top-level key of the kind configuration (CI appends \
             gates to it line by line), but the last key is {last:?}; move {FEATURE_GATES_KEY} to the end"
        ),
        None => {
            bail!("the kind configuration is empty; it needs at least a {FEATURE_GATES_KEY} entry at the end")
        }
    }
}

/// Reads kubeadm `extraArgs`: v1beta4's list of `{name, value}` or the older map form.
fn extra_args(value: Option<&Value>, what: &str) -> anyhow::Result<Vec<(String, String)>> {
    let string = |v: &Value, field: &str| -> anyhow::Result<String> {
        v.as_str().map(str::to_owned).with_context(|| {
            format!("{what}: {field} must be a string (quote numbers and booleans), found {v:?}")
        })
    };
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|item| {
                let name = item.get("name").with_context(|| format!("{what}: an entry has no name"))?;
                let value =
                    item.get("value").with_context(|| format!("{what}: entry {name:?} has no value"))?;
                Ok((string(name, "name")?, string(value, "value")?))
            })
            .collect(),
        Some(Value::Mapping(map)) => {
            map.iter().map(|(name, value)| Ok((string(name, "name")?, string(value, "value")?))).collect()
        }
        Some(other) => bail!("{what} must be a list of name/value entries, found {other:?}"),
    }
}

/// Adds `new` to `target`; an argument already present takes the new value (as kind merges).
fn merge_args(target: &mut Vec<(String, String)>, new: Vec<(String, String)>) {
    for (name, value) in new {
        match target.iter_mut().find(|(existing, _)| *existing == name) {
            Some(slot) => slot.1 = value,
            None => target.push((name, value)),
        }
    }
}

/// The union of the control-plane (Init) and worker (Join) kubelet arguments; they must agree.
fn agree(init: Vec<(String, String)>, join: Vec<(String, String)>) -> anyhow::Result<Vec<(String, String)>> {
    let mut all = init;
    for (name, value) in join {
        match all.iter().find(|(existing, _)| *existing == name) {
            Some((_, other)) if *other != value => bail!(
                "kubelet argument {name:?} is {other:?} in InitConfiguration but {value:?} in JoinConfiguration; \
                 make them equal (the local provider runs a single kubelet)"
            ),
            Some(_) => {}
            None => all.push((name, value)),
        }
    }
    Ok(all)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests may unwrap; helpers outside #[test] functions too")]
mod tests {
    use std::{path::Path, process::Command, sync::OnceLock};

    use serde_json::Value as Json;

    use super::*;

    fn repo_kind_yaml() -> String {
        std::fs::read_to_string(default_path()).unwrap()
    }

    fn args(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    /// The gates the suites rely on. Every name is a gate of Kubernetes v1.37.2 that is not locked.
    const SUITE_GATES: &[&str] = &[
        "DRAConsumableCapacity",
        "DRADeviceBindingConditions",
        "DRADeviceCompatibilityGroups",
        "DRADeviceTaintRules",
        "DRADeviceTaints",
        "DRANodeAllocatableResources",
        "DRAOptionalNodeOperations",
        "DRAPartitionableDevices",
        "DRAPartitionableDevicesType",
        "DRAResourcePoolStatus",
        "ResourceHealthStatus",
        "ResourceHealthStatusMessage",
    ];

    /// Gates locked in v1.37: setting them is pointless, and DynamicResourceAllocation is removed in 1.38.
    const LOCKED_GATES: &[&str] = &[
        "DynamicResourceAllocation",
        "DRAAdminAccess",
        "DRAExtendedResource",
        "DRAPrioritizedList",
        "DRAResourceClaimDeviceStatus",
    ];

    #[test]
    fn repo_kind_yaml_loads_with_what_the_local_provider_needs() {
        let config = ClusterConfig::load(&default_path()).unwrap();
        for gate in SUITE_GATES {
            assert_eq!(config.feature_gates.get(*gate), Some(&true), "gate {gate}");
        }
        for gate in LOCKED_GATES {
            assert!(!config.feature_gates.contains_key(*gate), "locked gate {gate} must not be set");
        }
        assert_eq!(
            config.runtime_config_flag(),
            "resource.k8s.io/v1alpha3=true,resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
        );
        assert_eq!(config.scheduler_args[0], ("v".to_string(), "5".to_string()));
        let vmodule = &config.scheduler_args[1];
        assert_eq!(vmodule.0, "vmodule");
        for module in ["allocator*=6", "pools*=6", "dynamicresources=6", "dra_manager=6"] {
            assert!(vmodule.1.split(',').any(|m| m == module), "scheduler vmodule lacks {module}");
        }
        assert_eq!(config.controller_manager_args, args(&[("v", "5"), ("vmodule", "controller=6")]));
        assert_eq!(config.kubelet_args, args(&[("v", "5")]));
    }

    #[test]
    fn feature_gates_is_the_last_top_level_key() {
        let text = repo_kind_yaml();
        let keys = top_level_keys(&text).unwrap();
        assert_eq!(keys.last().map(String::as_str), Some(FEATURE_GATES_KEY), "keys: {keys:?}");
        ensure_feature_gates_last(&text).unwrap();
    }

    #[test]
    fn an_appended_gate_line_lands_in_feature_gates() {
        // What CI does: `cat kind.yaml; echo "  SomeGate: true"`.
        let text = repo_kind_yaml();
        assert!(text.ends_with('\n'), "kind.yaml must end with a newline so appended lines start a new line");
        let appended = format!("{text}  DRAListTypeAttributes: true\n");
        let config = ClusterConfig::parse(&appended).unwrap();
        assert_eq!(config.feature_gates.get("DRAListTypeAttributes"), Some(&true));
        assert_eq!(config.feature_gates.len(), SUITE_GATES.len() + 1);
    }

    #[test]
    fn node_roles_come_from_the_node_list() {
        let config = ClusterConfig::load(&default_path()).unwrap();
        assert_eq!(config.node_roles, ["control-plane", "worker", "worker", "worker"]);
        let none =
            ClusterConfig::parse("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nfeatureGates: {}\n")
                .unwrap();
        assert_eq!(none.node_roles, ["control-plane"], "kind's default is one control-plane node");
        let worker_first = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: worker\n- role: control-plane\nfeatureGates: {}\n";
        let err = ClusterConfig::parse(worker_first).unwrap_err().to_string();
        assert!(err.contains("one control plane, listed first"), "{err}");
    }

    #[test]
    fn feature_gates_not_last_is_rejected() {
        let text = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nfeatureGates:\n  A: true\nnodes:\n- role: control-plane\n";
        let err = ClusterConfig::parse(text).unwrap_err().to_string();
        assert!(err.contains("featureGates must be the last top-level key"), "{err}");
        assert!(err.contains("\"nodes\""), "{err}");
    }

    #[test]
    fn flags_are_sorted_and_comma_separated() {
        let config = ClusterConfig {
            feature_gates: [("B".to_string(), false), ("A".to_string(), true)].into(),
            runtime_config: [
                ("x/v1".to_string(), "true".to_string()),
                ("a/v1".to_string(), "false".to_string()),
            ]
            .into(),
            ..ClusterConfig::default()
        };
        assert_eq!(config.feature_gates_flag(), "A=true,B=false");
        assert_eq!(config.runtime_config_flag(), "a/v1=false,x/v1=true");
        assert_eq!(ClusterConfig::default().feature_gates_flag(), "");
    }

    #[test]
    fn patches_map_form_other_versions_and_overrides() {
        let text = r#"
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
  - |
    kind: ClusterConfiguration
    apiVersion: kubeadm.k8s.io/v1beta3
    scheduler:
      extraArgs:
        v: "9"
  - |
    kind: ClusterConfiguration
    scheduler:
      extraArgs:
        v: "2"
        vmodule: "a=1"
  - |
    kind: ClusterConfiguration
    apiVersion: kubeadm.k8s.io/v1beta4
    scheduler:
      extraArgs:
        - name: v
          value: "3"
  - |
    kind: JoinConfiguration
    nodeRegistration:
      kubeletExtraArgs:
        - name: v
          value: "4"
featureGates: {}
"#;
        let config = ClusterConfig::parse(text).unwrap();
        // v1beta3 ignored; the map form read; the later v1beta4 patch overrides by name.
        assert_eq!(config.scheduler_args, args(&[("v", "3"), ("vmodule", "a=1")]));
        assert!(config.controller_manager_args.is_empty());
        assert_eq!(config.kubelet_args, args(&[("v", "4")]));
    }

    #[test]
    fn disagreeing_kubelet_args_and_unquoted_values_are_errors() {
        let kubelet = |init: &str, join: &str| {
            format!(
                "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nkubeadmConfigPatches:\n\
                 - |\n  kind: InitConfiguration\n  nodeRegistration:\n    kubeletExtraArgs:\n    - name: v\n      value: {init}\n\
                 - |\n  kind: JoinConfiguration\n  nodeRegistration:\n    kubeletExtraArgs:\n    - name: v\n      value: {join}\n\
                 featureGates: {{}}\n"
            )
        };
        let err = ClusterConfig::parse(&kubelet("\"5\"", "\"4\"")).unwrap_err().to_string();
        assert!(err.contains("InitConfiguration") && err.contains("JoinConfiguration"), "{err}");
        let err = format!("{:#}", ClusterConfig::parse(&kubelet("5", "5")).unwrap_err());
        assert!(err.contains("must be a string"), "{err}");
        assert_eq!(
            ClusterConfig::parse(&kubelet("\"5\"", "\"5\"")).unwrap().kubelet_args,
            args(&[("v", "5")])
        );
    }

    #[test]
    fn wrong_kind_or_version_is_rejected() {
        let err = ClusterConfig::parse("kind: Pod\napiVersion: v1\nfeatureGates: {}\n").unwrap_err();
        assert!(err.to_string().contains("kind.x-k8s.io/v1alpha4"), "{err}");
        let err = ClusterConfig::load(Path::new("/nonexistent/kind.yaml")).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/kind.yaml"), "{err:#}");
    }

    #[test]
    fn display_lists_every_component() {
        let text = ClusterConfig::load(&default_path()).unwrap().to_string();
        for line in [
            "feature gates (all components): DRAConsumableCapacity=true",
            "apiserver: --runtime-config=",
            "scheduler: --v=5 --vmodule=",
            "controller-manager: --v=5",
            "kubelet: --v=5",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    // ---- kind's own loader (xtask/kind-check) --------------------------------------------------

    /// Builds xtask/kind-check once per test process and returns the binary's path.
    fn kind_check_binary() -> &'static Path {
        static BINARY: OnceLock<PathBuf> = OnceLock::new();
        BINARY.get_or_init(|| {
            let source = crate::repo::repo_root().join("xtask").join("kind-check");
            let out_dir = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
            let binary = out_dir.join("kind-check");
            // Build under a private name and rename, so concurrent test processes never run a
            // half-written binary.
            let partial = out_dir.join(format!("kind-check.{}.partial", std::process::id()));
            let status = Command::new("go")
                .args(["build", "-buildvcs=false", "-o"])
                .arg(&partial)
                .arg(".")
                .current_dir(&source)
                .status()
                .unwrap_or_else(|err| {
                    panic!(
                        "cannot run `go` ({err}): these tests check kind.yaml with kind's own loader in \
                         xtask/kind-check and need Go 1.26 on PATH (https://go.dev/dl/)"
                    )
                });
            assert!(status.success(), "`go build` of {} failed: {status}", source.display());
            std::fs::rename(&partial, &binary).unwrap();
            binary
        })
    }

    /// Runs kind-check on `text`; returns its JSON summary, or kind's error text.
    fn kind_check(text: &str) -> Result<Json, String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kind.yaml");
        std::fs::write(&file, text).unwrap();
        let output = Command::new(kind_check_binary()).arg(&file).output().unwrap();
        if output.status.success() {
            Ok(serde_json::from_slice(&output.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    #[test]
    fn kind_loads_the_repo_kind_yaml() {
        let summary =
            kind_check(&repo_kind_yaml()).unwrap_or_else(|err| panic!("kind rejects kind.yaml: {err}"));

        let roles: Vec<&str> =
            summary["nodes"].as_array().unwrap().iter().map(|n| n["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["control-plane", "worker", "worker", "worker"]);
        assert_eq!(summary["roles"], serde_json::json!({"control-plane": 1, "worker": 3}));

        let patches = summary["containerdConfigPatches"].as_array().unwrap();
        assert_eq!(patches.len(), 1);
        assert_eq!(
            patches[0]["parsed"]["plugins"]["io.containerd.cri.v1.runtime"]["enable_cdi"],
            Json::Bool(true)
        );
        assert_eq!(
            patches[0]["version"], 0,
            "a versioned patch would be skipped by kind on a version 2 config"
        );

        for api in ["resource.k8s.io/v1alpha3", "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"] {
            assert_eq!(summary["runtimeConfig"][api], "true", "runtimeConfig {api}");
        }
        for gate in SUITE_GATES {
            assert_eq!(summary["featureGates"][*gate], Json::Bool(true), "gate {gate}");
        }

        // kind sees the same settings the local provider reads.
        let ours = ClusterConfig::load(&default_path()).unwrap();
        let kinds_gates: BTreeMap<String, bool> =
            serde_json::from_value(summary["featureGates"].clone()).unwrap();
        assert_eq!(kinds_gates, ours.feature_gates);
        let kinds_runtime: BTreeMap<String, String> =
            serde_json::from_value(summary["runtimeConfig"].clone()).unwrap();
        assert_eq!(kinds_runtime, ours.runtime_config);

        let kubeadm: Vec<(&str, &str)> = summary["kubeadmConfigPatches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["kind"].as_str().unwrap(), p["apiVersion"].as_str().unwrap()))
            .collect();
        for kind in ["ClusterConfiguration", "InitConfiguration", "JoinConfiguration"] {
            assert!(
                kubeadm.contains(&(kind, KUBEADM_API_VERSION)),
                "no {kind} {KUBEADM_API_VERSION} patch in {kubeadm:?}"
            );
        }
    }

    #[test]
    fn kind_accepts_a_gate_appended_by_ci() {
        let appended = format!("{}  DRAListTypeAttributes: true\n", repo_kind_yaml());
        let summary = kind_check(&appended).unwrap();
        assert_eq!(summary["featureGates"]["DRAListTypeAttributes"], Json::Bool(true));
        assert_eq!(summary["featureGates"]["ResourceHealthStatus"], Json::Bool(true));
    }

    #[test]
    fn kind_check_reports_kinds_errors() {
        let unknown_field = repo_kind_yaml().replace("\nfeatureGates:", "\nbogusField: 1\nfeatureGates:");
        let err = kind_check(&unknown_field).unwrap_err();
        assert!(err.contains("unable to decode config") && err.contains("bogusField"), "{err}");

        let no_control_plane = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: worker\n";
        let err = kind_check(no_control_plane).unwrap_err();
        assert!(err.contains("must have at least one control-plane node"), "{err}");

        let err = kind_check("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha9\n").unwrap_err();
        assert!(err.contains("unknown apiVersion"), "{err}");
    }
}
