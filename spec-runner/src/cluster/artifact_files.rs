//! The files a failed spec's cluster artifacts are written as: lists in YAML (`events.yaml`,
//! `pods.yaml`, artifact sources' lists) and container logs.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::LogParams};
use serde::Serialize;

/// Container logs are cut after this many bytes (the API server's `limitBytes`).
const LOG_LIMIT_BYTES: i64 = 10 << 20;

#[derive(Serialize)]
struct List<'a, T> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    items: &'a [T],
}

/// Writes `items` as a `v1 List` in YAML, without `managedFields` (as `kubectl get -o yaml`), to
/// `dir/file`; for artifact sources. The error says what failed (listing, serializing, writing).
pub async fn write_list<T: Serialize>(
    dir: &Path,
    file: &str,
    items: Result<Vec<T>, kube::Error>,
) -> Result<(), String> {
    let items = items.map_err(|e| format!("list failed: {e}"))?;
    let items: Vec<serde_json::Value> = items
        .iter()
        .map(|item| {
            let mut value = serde_json::to_value(item).map_err(|e| format!("cannot serialize: {e}"))?;
            if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                meta.remove("managedFields");
            }
            Ok(value)
        })
        .collect::<Result<_, String>>()?;
    let yaml = serde_yaml::to_string(&List { api_version: "v1", kind: "List", items: &items })
        .map_err(|e| format!("cannot serialize: {e}"))?;
    tokio::fs::write(dir.join(file), yaml)
        .await
        .map_err(|e| format!("cannot write {}: {e}", dir.join(file).display()))
}

/// `logs/<pod>/<container>.log` for every container (init and ephemeral
/// ones too), plus `<container>.previous.log` for restarted containers.
pub(crate) async fn pod_logs(client: &Client, ns: &str, pod: &Pod, logs_dir: &Path) -> Result<(), String> {
    let Some(name) = pod.metadata.name.as_deref() else { return Ok(()) };
    let dir = logs_dir.join(name);
    tokio::fs::create_dir_all(&dir).await.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let mut restarts: BTreeMap<String, i32> = BTreeMap::new();
    for s in
        [&status.init_container_statuses, &status.container_statuses, &status.ephemeral_container_statuses]
            .into_iter()
            .flatten()
            .flatten()
    {
        restarts.insert(s.name.clone(), s.restart_count);
    }
    let containers = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .chain(spec.containers.into_iter().map(|c| c.name))
        .chain(spec.ephemeral_containers.unwrap_or_default().into_iter().map(|c| c.name));
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    for container in containers {
        let mut runs = vec![(false, format!("{container}.log"))];
        if restarts.get(&container).copied().unwrap_or(0) > 0 {
            runs.push((true, format!("{container}.previous.log")));
        }
        for (previous, file) in runs {
            let params = LogParams {
                container: Some(container.clone()),
                previous,
                timestamps: true,
                limit_bytes: Some(LOG_LIMIT_BYTES),
                ..LogParams::default()
            };
            // A container that never started has no log; say so in the file.
            let text = api.logs(name, &params).await.unwrap_or_else(|e| format!("(no log: {e})\n"));
            let path = dir.join(file);
            tokio::fs::write(&path, text)
                .await
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(())
}
