//! Finding a real driver on a node from its proxy pod: its registration socket among the
//! node's `plugins_registry` sockets (the one whose `GetInfo` names the driver), and from its
//! answer the DRA endpoint and versions the interposer forwards to and advertises.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use super::{
    InterposerError,
    dial::{self, DIAL_BINARY},
};
use crate::{
    driver::{ForwardError, ForwardResolver},
    grpc::registration::{DRA_PLUGIN_TYPE, InfoRequest, PluginInfo, registration_client::RegistrationClient},
    plugin::Forward,
    podexec::{PodExec, Runner as _},
    proxied::{PLUGINS_DIR, REGISTRY_DIR, rolling_update_registration_file},
    tunnel::PodRef,
};

/// How long one `GetInfo` of a candidate socket may take (the kubelet gives it 1 s; exec adds
/// a round trip through the API server).
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists the sockets of a directory, one path a line (the directory as `$1`).
const LIST_SOCKETS: &str = r#"for f in "$1"/*; do if [ -S "$f" ]; then echo "$f"; fi; done"#;

/// The interposer's [`ForwardResolver`]: finds the driver `driver` through the node's proxy pod.
pub struct FindDriver {
    /// Exec into the proxy pods.
    pub client: kube::Client,
    /// The real driver's name.
    pub driver: String,
}

impl std::fmt::Debug for FindDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FindDriver").field("driver", &self.driver).finish_non_exhaustive()
    }
}

#[async_trait]
impl ForwardResolver for FindDriver {
    async fn resolve(&self, node: &str, pod: &Pod) -> Result<Forward, ForwardError> {
        self.find(node, pod).await.map_err(|e| Box::new(e) as ForwardError)
    }
}

impl FindDriver {
    async fn find(&self, node: &str, pod: &Pod) -> Result<Forward, InterposerError> {
        let impossible = |reason: String| InterposerError::Impossible {
            driver: self.driver.clone(),
            node: node.to_owned(),
            reason,
        };
        let pod_ref = PodRef::from_pod(pod).map_err(|e| impossible(e.to_string()))?;
        let shown = format!("{}/{}", pod_ref.namespace, pod_ref.name);
        let exec = PodExec::new(self.client.clone(), pod_ref.clone());
        let has_dialer = exec
            .output(vec!["test".into(), "-x".into(), DIAL_BINARY.into()])
            .await
            .map_err(|e| impossible(format!("cannot look for {DIAL_BINARY} in proxy pod {shown}: {e}")))?;
        if !has_dialer.status.success() {
            return Err(impossible(format!(
                "the proxy pod {shown} has no {DIAL_BINARY} (its image predates the interposer; rebuild and load the proxy image)"
            )));
        }
        let listed = exec
            .output(vec!["sh".into(), "-c".into(), LIST_SOCKETS.into(), "sh".into(), REGISTRY_DIR.into()])
            .await
            .map_err(|e| impossible(format!("cannot list the sockets in {REGISTRY_DIR}: {e}")))?;
        let own = own_registration_socket(&self.driver, pod);
        let candidates: Vec<&str> = listed
            .stdout
            .lines()
            .map(str::trim)
            .filter(|s| !s.is_empty() && Some(*s) != own.as_deref())
            .collect();
        let mut tried = Vec::new();
        for socket in candidates {
            match get_info(&self.client, &pod_ref, socket).await {
                Ok(info) if info.name == self.driver && info.r#type == DRA_PLUGIN_TYPE => {
                    let dir = format!("{PLUGINS_DIR}/{}/", self.driver);
                    if !info.endpoint.starts_with(&dir) {
                        return Err(impossible(format!(
                            "its DRA endpoint {} is outside {dir}, the only plugin directory the proxy pod mounts",
                            info.endpoint
                        )));
                    }
                    tracing::info!(driver = %self.driver, %node, registration = %socket, endpoint = %info.endpoint, versions = ?info.supported_versions, "found the driver to interpose");
                    let channel = dial::channel(self.client.clone(), pod_ref.clone(), info.endpoint.clone());
                    return Ok(Forward::new(channel, info.supported_versions));
                }
                Ok(info) => tried.push(format!("{socket}: driver {:?} ({})", info.name, info.r#type)),
                Err(e) => tried.push(format!("{socket}: {e}")),
            }
        }
        Err(impossible(format!(
            "no registration socket in the node's {REGISTRY_DIR} answers GetInfo with driver {} (tried: {})",
            self.driver,
            if tried.is_empty() { "none".to_owned() } else { tried.join("; ") }
        )))
    }
}

/// The registration socket the interposer's own plugin uses in `pod` (a rolling-update name
/// after the pod's UID, see [`crate::proxied::sockets`]).
fn own_registration_socket(driver: &str, pod: &Pod) -> Option<String> {
    let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    Some(format!("{REGISTRY_DIR}/{}", rolling_update_registration_file(REGISTRY_DIR, driver, uid)))
}

/// `GetInfo` of the registration socket `socket` in `pod`, over one exec connection.
async fn get_info(client: &kube::Client, pod: &PodRef, socket: &str) -> Result<PluginInfo, String> {
    let call = async {
        let channel = dial::channel(client.clone(), pod.clone(), socket.to_owned());
        RegistrationClient::new(channel).get_info(InfoRequest {}).await.map(tonic::Response::into_inner)
    };
    match tokio::time::timeout(GET_INFO_TIMEOUT, call).await {
        Ok(Ok(info)) => Ok(info),
        Ok(Err(status)) => Err(format!("GetInfo failed: {}: {}", status.code(), status.message())),
        Err(_) => Err(format!("GetInfo got no answer within {GET_INFO_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_socket_is_named_after_the_pod_uid() {
        let mut pod = Pod::default();
        assert_eq!(own_registration_socket("h3.example.test", &pod), None);
        pod.metadata.uid = Some("1234".into());
        assert_eq!(
            own_registration_socket("h3.example.test", &pod).as_deref(),
            Some("/var/lib/kubelet/plugins_registry/h3.example.test-1234-reg.sock")
        );
    }
}
