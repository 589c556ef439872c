//! The kubelet plugin registration service (`pluginregistration.Registration`).
//!
//! The kubelet's plugin watcher dials the registration socket, calls `GetInfo`
//! (with a 1 s timeout), validates the answer, picks the first entry of
//! `supported_versions` it knows, and reports the outcome with
//! `NotifyRegistrationStatus`.

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::grpc::registration::{
    self, DRA_PLUGIN_TYPE, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The last registration status the kubelet sent, shared with the plugin handle.
pub(crate) type StatusSender = watch::Sender<Option<RegistrationStatus>>;

/// `Registration` server.
#[derive(Clone, Debug)]
pub(crate) struct RegistrationService {
    pub info: PluginInfo,
    pub status: StatusSender,
}

impl RegistrationService {
    pub(crate) fn new(driver: &str, endpoint: &str, versions: &[&str], status: StatusSender) -> Self {
        RegistrationService {
            info: PluginInfo {
                r#type: DRA_PLUGIN_TYPE.to_string(),
                name: driver.to_string(),
                endpoint: endpoint.to_string(),
                supported_versions: versions.iter().map(|v| v.to_string()).collect(),
            },
            status,
        }
    }
}

#[tonic::async_trait]
impl registration::registration_server::Registration for RegistrationService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let registered = status.plugin_registered;
        let error = status.error.clone();
        if registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
        } else {
            tracing::warn!(driver = %self.info.name, %error, "kubelet rejected the registration");
        }
        self.status.send_replace(Some(status));
        if !registered {
            // Upstream's helper answers a failed registration with an error.
            return Err(Status::unknown(format!("failed registration process: {error}")));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
