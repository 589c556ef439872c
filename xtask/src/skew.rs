//! Version skew: which kubelet version each node runs, and what an older kubelet accepts.
//!
//! A node's kubelet version comes from, in this order: `cluster up --kubelet-version V1,V2,…`
//! (V1 for the first worker, V2 for the second, …; workers without an entry and the control plane
//! keep the cluster's version), the node's `image: kindest/node:vX.Y.Z` in kind.yaml's node list,
//! and the pinned Kubernetes version. So `--kubelet-version v1.34.4` is one old worker
//! (`kind-worker`) beside workers at the cluster's version: a mixed cluster is one flag away.
//!
//! An older kubelet refuses to start on a feature gate it does not know, so each kubelet gets only
//! the gates of kind.yaml that its version knows; the known gates are read from the kubelet's own
//! `--help` (the `--feature-gates` list), cached with its build.

use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::common::kube_version::KubeVersion;

/// The repository of kind's node images; its tag is the node's Kubernetes version.
pub const KIND_NODE_IMAGE: &str = "kindest/node";

/// `--kubelet-version`: one release per worker, in order (empty entries are not allowed; old
/// kubelets are built from published `k8s.io/kubernetes` modules, so no pre-release).
pub fn parse_flag(text: &str) -> Result<Vec<KubeVersion>> {
    let versions: Vec<KubeVersion> = text
        .split(',')
        .map(|entry| {
            KubeVersion::parse_release(entry)
                .map_err(|e| anyhow::anyhow!("--kubelet-version: {e} (write e.g. v1.34.4,v1.35.4)"))
        })
        .collect::<Result<_>>()?;
    if versions.is_empty() {
        bail!("--kubelet-version needs at least one version");
    }
    Ok(versions)
}

/// The release of a kind node image `kindest/node:vX.Y.Z[@sha256:…]`; `None` for another image.
pub fn image_version(image: &str) -> Option<KubeVersion> {
    let without_digest = image.split('@').next()?;
    let (repo, tag) = without_digest.rsplit_once(':')?;
    let repo = repo.strip_prefix("docker.io/").unwrap_or(repo);
    if repo != KIND_NODE_IMAGE {
        return None;
    }
    KubeVersion::parse_release(tag).ok()
}

/// Each node's kubelet version, control plane first: the flag's entries for the workers, else the
/// node's kind.yaml image, else `cluster`. Fails when the control plane would differ from
/// `cluster` (its components are the cluster's version) or the flag names more workers than
/// there are. `cluster` is a release (see [`KubeVersion::release`]).
pub fn node_versions(
    cluster: &KubeVersion,
    node_count: usize,
    images: &[Option<String>],
    flag: &[KubeVersion],
) -> Result<Vec<KubeVersion>> {
    let workers = node_count.saturating_sub(1);
    if flag.len() > workers {
        bail!(
            "--kubelet-version lists {} versions, but the cluster has {workers} workers (one version per worker, in order)",
            flag.len()
        );
    }
    let mut versions = Vec::with_capacity(node_count);
    for index in 0..node_count {
        let from_image = images.get(index).and_then(Option::as_deref).and_then(image_version);
        let version = match index.checked_sub(1).and_then(|worker| flag.get(worker)) {
            Some(v) => v.clone(),
            None => from_image.unwrap_or_else(|| cluster.clone()),
        };
        if index == 0 && version != *cluster {
            bail!(
                "the control-plane node runs the cluster's components at {cluster}; kind.yaml's image for it says {version} (give old versions to workers only)"
            );
        }
        versions.push(version);
    }
    Ok(versions)
}

/// The gate names of a kubelet's `--help` (`--feature-gates` lists one `Name=true|false
/// (STAGE - default=…)` per line).
pub fn gates_from_help(help: &str) -> Vec<String> {
    let mut gates: Vec<String> = help
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once('=')?;
            let known = rest.starts_with("true|false") || rest.starts_with("false|true");
            (known && !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()))
                .then(|| name.to_string())
        })
        .collect();
    gates.sort();
    gates.dedup();
    gates
}

/// `gates` split into those the kubelet knows (kept) and those it does not (left out).
pub fn known_gates(
    gates: &BTreeMap<String, bool>,
    known: &[String],
) -> (BTreeMap<String, bool>, Vec<String>) {
    let mut kept = BTreeMap::new();
    let mut dropped = Vec::new();
    for (name, on) in gates {
        if known.iter().any(|k| k == name) {
            kept.insert(name.clone(), *on);
        } else {
            dropped.push(name.clone());
        }
    }
    (kept, dropped)
}

/// The gates a Kubernetes component lists in its `--help` (`binary args… --help`).
pub fn listed_gates(binary: &Path, args: &[&str]) -> Result<Vec<String>> {
    let out = Command::new(binary)
        .args(args)
        .arg("--help")
        .output()
        .with_context(|| format!("run {} --help", binary.display()))?;
    let help = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let gates = gates_from_help(&help);
    if gates.is_empty() {
        bail!(
            "{} --help lists no feature gates ({}); cannot tell which gates it accepts",
            binary.display(),
            out.status
        );
    }
    Ok(gates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> KubeVersion {
        KubeVersion::parse(text).unwrap()
    }

    #[test]
    fn the_flag_is_a_list_of_releases() {
        assert_eq!(parse_flag("v1.34.4").unwrap(), [v("v1.34.4")]);
        assert_eq!(parse_flag("v1.34.4, 1.35.4").unwrap(), [v("v1.34.4"), v("v1.35.4")]);
        let err = parse_flag("v1.34.4,,v1.35.4").unwrap_err().to_string();
        assert_eq!(
            err,
            "--kubelet-version: \"\" is not a Kubernetes release such as v1.34.4 (write e.g. v1.34.4,v1.35.4)"
        );
        for bad in ["v1.34", "latest", "v1.34.x", "v1.34.4-rc.0"] {
            let err = parse_flag(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("--kubelet-version: {bad:?} is ")), "{err}");
            assert!(!err.contains('\n'), "one sentence: {err}");
        }
    }

    #[test]
    fn kind_images_give_versions() {
        assert_eq!(image_version("kindest/node:v1.34.4"), Some(v("v1.34.4")));
        assert_eq!(image_version("docker.io/kindest/node:v1.35.4@sha256:abc"), Some(v("v1.35.4")));
        assert_eq!(image_version("example.com/node:v1.34.4"), None);
        assert_eq!(image_version("kindest/node:latest"), None);
        assert_eq!(image_version("kindest/node:v1.35.0-alpha.1"), None);
    }

    #[test]
    fn the_flag_maps_to_workers_in_order_and_wins_over_images() {
        let cluster = &v("v1.37.2");
        let c = || cluster.clone();
        let none = [None, None, None, None];
        assert_eq!(node_versions(cluster, 4, &none, &[v("v1.34.4")]).unwrap(), [c(), v("v1.34.4"), c(), c()]);
        assert_eq!(
            node_versions(cluster, 4, &none, &[c(), v("v1.35.4")]).unwrap(),
            [c(), c(), v("v1.35.4"), c()]
        );
        let images = [None, Some("kindest/node:v1.36.3".into()), None, Some("kindest/node:v1.34.4".into())];
        assert_eq!(node_versions(cluster, 4, &images, &[]).unwrap(), [c(), v("v1.36.3"), c(), v("v1.34.4")]);
        assert_eq!(
            node_versions(cluster, 4, &images, &[v("v1.35.4")]).unwrap(),
            [c(), v("v1.35.4"), c(), v("v1.34.4")]
        );
        let err = node_versions(cluster, 2, &none, &[v("v1.34.4"), v("v1.34.4")]).unwrap_err().to_string();
        assert!(err.contains("1 workers"), "{err}");
        let old_cp = [Some("kindest/node:v1.34.4".to_string())];
        let err = node_versions(cluster, 1, &old_cp, &[]).unwrap_err().to_string();
        assert!(err.contains("control-plane"), "{err}");
    }

    #[test]
    fn gates_come_from_the_help_text() {
        let help = "      --feature-gates colonSeparatedMultimapStringString   A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:
                                                                  APIResponseCompression=true|false (BETA - default=true)
                                                                  AllAlpha=true|false (ALPHA - default=false)
                                                                  DRAConsumableCapacity=true|false (ALPHA - default=false)
      --file-check-frequency duration                             Duration between checking config files for new data (DEPRECATED: ...)
      --v Level                                                   number for the log level verbosity";
        assert_eq!(gates_from_help(help), ["APIResponseCompression", "AllAlpha", "DRAConsumableCapacity"]);
        let gates: BTreeMap<String, bool> =
            [("DRAConsumableCapacity".into(), true), ("DRADeviceCompatibilityGroups".into(), true)].into();
        let (kept, dropped) = known_gates(&gates, &gates_from_help(help));
        assert_eq!(kept, [("DRAConsumableCapacity".to_string(), true)].into());
        assert_eq!(dropped, ["DRADeviceCompatibilityGroups"]);
    }
}
