//! What a node's CDI spec files define, read through a busybox pod on the node that mounts the
//! node's `/etc` and `/var/run/cdi` read-only: every file of `/etc/cdi` and `/var/run/cdi` in one
//! exec, parsed into the fully qualified device IDs (`vendor/class=name`) and their env edits.

use std::collections::{BTreeMap, BTreeSet};

use harness::{
    builder::{BUSYBOX_IMAGE, INFINITE_SLEEP, POD_START_TIMEOUT, exec},
    framework::Ctx,
    wait::{self, Verdict},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use serde_json::{Value, json};

/// The reader's container.
const CONTAINER: &str = "reader";
/// Where the reader sees the node's `/etc` and `/var/run/cdi`.
const MOUNTS: [&str; 2] = ["/node-etc/cdi", "/node-run-cdi"];
/// Marks the start of a file in the exec's output.
const MARK: &str = "==> dra-e2e cdi file ";

/// One CDI device a node's spec files define.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiDevice {
    /// The file that defines it, as the node sees it.
    pub file: String,
    /// The env edits a container gets with it (the device's and its spec's), `NAME=value`.
    pub env: Vec<String>,
}

/// The CDI devices of a node: fully qualified ID -> where it is defined and its env edits.
pub type CdiDevices = BTreeMap<String, CdiDevice>;

/// A pod on the node that reads its CDI spec files; deleted with the spec's namespace.
pub struct CdiReader {
    ctx: Ctx,
    pod: String,
    node: String,
}

impl CdiReader {
    /// Starts the reader pod on `node` and waits until it runs.
    pub async fn start(ctx: &Ctx, node: &str) -> anyhow::Result<CdiReader> {
        let pods: Api<Pod> = Api::namespaced(ctx.client().clone(), ctx.namespace());
        let pod = reader_pod(node);
        let created = pods.create(&PostParams::default(), &pod).await?;
        let name = created.metadata.name.unwrap_or_default();
        ctx.delete_at_cleanup(pods.clone(), name.clone());
        wait::existing(
            &pods,
            &name,
            format!("the CDI reader pod on node {node} to run"),
            POD_START_TIMEOUT,
            |p| match harness::builder::phase(p) {
                "Running" => Verdict::Done,
                "Succeeded" | "Failed" => Verdict::Fail("the CDI reader pod terminated".to_owned()),
                _ => Verdict::Pending,
            },
        )
        .await?;
        Ok(CdiReader { ctx: ctx.clone(), pod: name, node: node.to_owned() })
    }

    /// The node's CDI devices now (one exec).
    pub async fn devices(&self) -> anyhow::Result<CdiDevices> {
        let script = format!(
            "for f in {}; do [ -f \"$f\" ] && {{ echo '{MARK}'\"$f\"; cat \"$f\"; echo; }}; done; true",
            MOUNTS.map(|m| format!("{m}/*")).join(" ")
        );
        let out = exec(self.ctx.client(), self.ctx.namespace(), &self.pod, CONTAINER, &["sh", "-c", &script])
            .await?;
        if !out.success {
            anyhow::bail!(
                "reading the CDI spec files of node {} failed: {} {}",
                self.node,
                out.message,
                out.stderr
            );
        }
        Ok(parse_files(&out.stdout))
    }
}

/// The reader pod: busybox on `node`, the node's `/etc` and `/var/run/cdi` mounted read-only.
fn reader_pod(node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "generateName": "cdi-reader-" },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{
                "name": CONTAINER,
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", INFINITE_SLEEP],
                "volumeMounts": [
                    { "name": "etc", "mountPath": "/node-etc", "readOnly": true },
                    { "name": "run-cdi", "mountPath": MOUNTS[1], "readOnly": true },
                ],
            }],
            "volumes": [
                { "name": "etc", "hostPath": { "path": "/etc", "type": "Directory" } },
                { "name": "run-cdi", "hostPath": { "path": "/var/run/cdi", "type": "DirectoryOrCreate" } },
            ],
        },
    }))
    .unwrap_or_default()
}

/// The devices of the files in the reader's output; a file that is neither JSON nor YAML, or
/// has no `kind`, defines nothing.
fn parse_files(output: &str) -> CdiDevices {
    let mut devices = CdiDevices::new();
    for chunk in output.split(MARK).skip(1) {
        let (path, text) = chunk.split_once('\n').unwrap_or((chunk, ""));
        let file = path.replacen(MOUNTS[0], "/etc/cdi", 1).replacen(MOUNTS[1], "/var/run/cdi", 1);
        let spec: Option<Value> =
            serde_json::from_str(text).ok().or_else(|| serde_yaml::from_str::<Value>(text).ok());
        let Some(spec) = spec else { continue };
        let Some(kind) = spec.get("kind").and_then(Value::as_str) else { continue };
        let spec_env = env_edits(spec.get("containerEdits"));
        for device in spec.get("devices").and_then(Value::as_array).into_iter().flatten() {
            let Some(name) = device.get("name").and_then(Value::as_str) else { continue };
            let mut env = spec_env.clone();
            env.extend(env_edits(device.get("containerEdits")));
            devices.insert(format!("{kind}={name}"), CdiDevice { file: file.clone(), env });
        }
    }
    devices
}

fn env_edits(edits: Option<&Value>) -> Vec<String> {
    let env = edits.and_then(|e| e.get("env")).and_then(Value::as_array);
    env.into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
}

/// The IDs of `ids` that `devices` defines, with their files: `id (in file)`.
pub fn still_defined<'a>(devices: &CdiDevices, ids: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    ids.into_iter().filter_map(|id| devices.get(id).map(|d| format!("{id} (in {})", d.file))).collect()
}

/// The IDs `after` defines that `before` did not.
pub fn new_ids(before: &CdiDevices, after: &CdiDevices) -> BTreeSet<String> {
    after.keys().filter(|id| !before.contains_key(*id)).cloned().collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn files_become_device_ids_with_their_env() {
        let output = format!(
            "{MARK}/node-run-cdi/a.json\n{}\n{MARK}/node-etc/cdi/b.yaml\n{}\n{MARK}/node-run-cdi/junk\nnot a spec\n",
            r#"{"cdiVersion":"0.5.0","kind":"k8s.d.example.com/claim","containerEdits":{"env":["S=1"]},
                "devices":[{"name":"uid-dev0","containerEdits":{"env":["A=b"]}}]}"#,
            "cdiVersion: 0.6.0\nkind: vendor.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n    env: [G=0]\n",
        );
        let devices = parse_files(&output);
        assert_eq!(devices.len(), 2);
        let claim = &devices["k8s.d.example.com/claim=uid-dev0"];
        assert_eq!(
            (claim.file.as_str(), claim.env.clone()),
            ("/var/run/cdi/a.json", vec!["S=1".into(), "A=b".into()])
        );
        assert_eq!(devices["vendor.com/gpu=gpu0"].file, "/etc/cdi/b.yaml");
        let gone = still_defined(&devices, &["vendor.com/gpu=gpu0".to_owned(), "x/y=z".to_owned()]);
        assert_eq!(gone, ["vendor.com/gpu=gpu0 (in /etc/cdi/b.yaml)"]);
        let fewer: CdiDevices = devices.iter().take(1).map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(new_ids(&fewer, &devices).into_iter().collect::<Vec<_>>(), ["vendor.com/gpu=gpu0"]);
    }
}
