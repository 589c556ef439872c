//! Forward mode: the plugin registers like any other but passes every DRA and health call on
//! to another plugin (a real driver) and answers with that plugin's exact response or error.
//!
//! The forwarding is by gRPC service, not by message: each forwarded service is a
//! [`Forwarder`] that hands the kubelet's HTTP/2 request unchanged to a
//! [`tonic::transport::Channel`] to the driver's DRA endpoint and streams the driver's response
//! back (so unary calls and the health stream work alike). It sits behind the same recording
//! layer as the plugin's own services, so the call log records forwarded calls and fault guards
//! fail them before they reach the driver. Per-claim faults apply to the `DRAPlugin` services'
//! prepare and unprepare calls ([`forward_claims`](super::forward_claims)).

use std::{convert::Infallible, marker::PhantomData, task::Poll};

use futures::future::BoxFuture;
use tonic::{body::Body, server::NamedService, transport::Channel};

use super::forward_claims::{self, DRA_V1, DRA_V1BETA1, DraMessages};
use crate::{
    calls::ClaimFaults,
    grpc::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1},
};

/// Where a plugin in forward mode sends the calls: a channel to the driver's DRA endpoint and
/// the `supported_versions` the driver advertised, which the plugin advertises in its place.
///
/// ```no_run
/// # async fn f(plugin_versions: Vec<String>) {
/// use kubelet_plugin::plugin::Forward;
/// let channel = tonic::transport::Endpoint::from_static("http://localhost").connect_lazy();
/// let forward = Forward::new(channel, plugin_versions);
/// assert!(!forward.versions().is_empty());
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Forward {
    channel: Channel,
    versions: Vec<String>,
}

impl Forward {
    /// Forwards to `channel`, advertising `versions` (the driver's, as its `GetInfo` said).
    pub fn new(channel: Channel, versions: Vec<String>) -> Self {
        Forward { channel, versions }
    }

    /// The versions advertised in place of the driver.
    pub fn versions(&self) -> &[String] {
        &self.versions
    }

    /// Whether the driver advertised `version` (e.g. `v1.DRAPlugin`).
    pub(crate) fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    /// The forwarder of the service named by `N`.
    pub(crate) fn forwarder<N: ServiceName>(&self) -> Forwarder<N> {
        Forwarder { channel: self.channel.clone(), name: PhantomData }
    }
}

/// A gRPC service name for a [`Forwarder`].
pub(crate) trait ServiceName: Send + Sync + 'static {
    /// The full name (`package.Service`).
    const NAME: &'static str;
    /// The `supported_versions` entry of the service.
    const VERSION: &'static str;
    /// Its calls that name claims, where per-claim faults apply (none for health).
    const CLAIM_MESSAGES: Option<&'static DraMessages> = None;
}

/// `DRAPlugin` v1.
pub(crate) struct DraV1Service;
impl ServiceName for DraV1Service {
    const NAME: &'static str = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin";
    const VERSION: &'static str = dra_v1::SERVICE_VERSION;
    const CLAIM_MESSAGES: Option<&'static DraMessages> = Some(&DRA_V1);
}

/// `DRAPlugin` v1beta1.
pub(crate) struct DraV1beta1Service;
impl ServiceName for DraV1beta1Service {
    const NAME: &'static str = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin";
    const VERSION: &'static str = dra_v1beta1::SERVICE_VERSION;
    const CLAIM_MESSAGES: Option<&'static DraMessages> = Some(&DRA_V1BETA1);
}

/// `DRAResourceHealth` v1.
pub(crate) struct HealthV1Service;
impl ServiceName for HealthV1Service {
    const NAME: &'static str = "v1.DRAResourceHealth";
    const VERSION: &'static str = health_v1::SERVICE_VERSION;
}

/// `DRAResourceHealth` v1alpha1.
pub(crate) struct HealthV1alpha1Service;
impl ServiceName for HealthV1alpha1Service {
    const NAME: &'static str = "v1alpha1.DRAResourceHealth";
    const VERSION: &'static str = health_v1alpha1::SERVICE_VERSION;
}

/// Passes each request of one service to the driver and its response back, unchanged (but for
/// injected per-claim faults). A request the driver cannot be reached for is answered with
/// `UNAVAILABLE` and the reason.
pub(crate) struct Forwarder<N> {
    channel: Channel,
    name: PhantomData<fn() -> N>,
}

impl<N> Clone for Forwarder<N> {
    fn clone(&self) -> Self {
        Forwarder { channel: self.channel.clone(), name: PhantomData }
    }
}

impl<N: ServiceName> NamedService for Forwarder<N> {
    const NAME: &'static str = N::NAME;
}

impl<N: ServiceName> tower::Service<http::Request<Body>> for Forwarder<N> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let channel = self.channel.clone();
        let messages = N::CLAIM_MESSAGES.and_then(|m| m.for_path(request.uri().path()));
        let faults = request.extensions().get::<ClaimFaults>().cloned();
        Box::pin(async move {
            Ok(match (messages, faults) {
                (Some(messages), Some(faults)) => {
                    forward_claims::forward(channel, messages, &faults, request).await
                }
                _ => forward_claims::send(channel, request).await,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tonic::Status;

    use super::*;
    use crate::{
        calls::Method,
        grpc::registration::{InfoRequest, registration_client::RegistrationClient},
        plugin::{ConnectionSender, KubeletPlugin, Listener, PluginConfig, PluginListeners},
    };

    #[test]
    fn forwarded_service_names_are_the_generated_ones() {
        type DraV1 = dra_v1::dra_plugin_server::DraPluginServer<super::super::dra::DraV1>;
        type DraV1beta1 = dra_v1beta1::dra_plugin_server::DraPluginServer<super::super::dra::DraV1beta1>;
        assert_eq!(DraV1Service::NAME, <DraV1 as NamedService>::NAME);
        assert_eq!(DraV1beta1Service::NAME, <DraV1beta1 as NamedService>::NAME);
        assert_eq!(<Forwarder<HealthV1Service> as NamedService>::NAME, "v1.DRAResourceHealth");
        assert_eq!(HealthV1alpha1Service::NAME, "v1alpha1.DRAResourceHealth");
    }

    /// A channel whose every connection is an in-memory pipe handed to `server`.
    fn channel_to(server: ConnectionSender) -> Channel {
        server.channel()
    }

    /// A plugin on in-memory listeners: (plugin, its DRA server, its registration server).
    async fn plugin(forward: Option<Forward>) -> (KubeletPlugin, ConnectionSender, ConnectionSender) {
        let (dra, dra_listener) = Listener::channel(4);
        let (reg, reg_listener) = Listener::channel(4);
        let config =
            PluginConfig::new("drv.test", "node", "/nonexistent").dra_endpoint("/plugins/drv.test/dra.sock");
        let mut builder = KubeletPlugin::builder(config);
        if let Some(forward) = forward {
            builder = builder.forward(forward);
        }
        let plugin =
            builder.start(PluginListeners { registration: reg_listener, dra: dra_listener }).await.unwrap();
        (plugin, dra, reg)
    }

    fn claims() -> Vec<dra_v1::Claim> {
        vec![dra_v1::Claim { namespace: "ns".into(), name: "claim".into(), uid: "uid-1".into() }]
    }

    #[tokio::test]
    async fn a_forwarding_plugin_answers_with_the_drivers_response_records_it_and_fails_on_demand() {
        let (driver, driver_dra, _driver_reg) = plugin(None).await;
        let forward = Forward::new(channel_to(driver_dra.clone()), vec![dra_v1::SERVICE_VERSION.to_owned()]);
        let (interposer, dra, reg) = plugin(Some(forward)).await;

        let info =
            RegistrationClient::new(channel_to(reg)).get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.supported_versions, [dra_v1::SERVICE_VERSION]);
        assert_eq!(info.name, "drv.test");

        // The driver's own error (it has no claims), unchanged.
        let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(channel_to(dra.clone()));
        let direct = dra_v1::dra_plugin_client::DraPluginClient::new(channel_to(driver_dra))
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: claims() })
            .await
            .unwrap_err();
        let forwarded = client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: claims() })
            .await
            .unwrap_err();
        assert_eq!((forwarded.code(), forwarded.message()), (direct.code(), direct.message()));
        // The driver's success: an unknown claim is unprepared.
        let unprepared = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: claims() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(unprepared.claims["uid-1"].error, "");
        assert_eq!(interposer.calls().count(Method::NodePrepareResources), 1);
        assert_eq!(interposer.calls().count(Method::NodeUnprepareResources.succeeded()), 1);
        assert_eq!(driver.calls().count(Method::NodePrepareResources), 2);

        // A fault answers in place of the driver, which never sees the call.
        let fault = interposer.calls().fail(Method::NodeUnprepareResources, Status::internal("injected"));
        let failed = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: claims() })
            .await
            .unwrap_err();
        assert_eq!((failed.code(), failed.message()), (tonic::Code::Internal, "injected"));
        assert_eq!(driver.calls().count(Method::NodeUnprepareResources), 1);
        drop(fault);

        // A per-claim fault answers that claim with its error, in place of the driver, and
        // forwards the call's other claims alone.
        let claim_fault = interposer.calls().fail_claim_next(Method::NodePrepareResources, 1, "claim failed");
        let answered = client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: claims() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answered.claims["uid-1"].error, "claim failed");
        assert_eq!(driver.calls().count(Method::NodePrepareResources), 2, "the driver never saw it");
        drop(claim_fault);
        let _one = interposer.calls().fail_claim(Method::NodePrepareResources.for_claim_uid("uid-1"), "one");
        let other = dra_v1::Claim { namespace: "ns".into(), name: "other".into(), uid: "uid-2".into() };
        let both = [claims(), vec![other]].concat();
        let driver_error = client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: both })
            .await
            .unwrap_err();
        assert_eq!(driver_error.code(), direct.code(), "the driver's answer for the other claim, unchanged");
        let log = driver.calls().log();
        let last = log.records.last().unwrap();
        assert_eq!(last.claims.iter().map(|c| c.uid.as_str()).collect::<Vec<_>>(), ["uid-2"]);
        let recorded = interposer.calls().log();
        assert_eq!(recorded.count(Method::NodePrepareResources.for_claim_uid("uid-1").injected()), 2);

        // Not advertised by the driver: not served.
        let beta = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel_to(dra))
            .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest { claims: Vec::new() })
            .await
            .unwrap_err();
        assert_eq!(beta.code(), tonic::Code::Unimplemented);

        // The driver gone: UNAVAILABLE with the reason.
        driver.stop().await;
        let gone = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: claims() })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::Unavailable, "{gone:?}");
        interposer.stop().await;
    }
}
