//! Serving pre-established connections (port-forward tunnels are
//! `tokio::io::DuplexStream`s) instead of a Unix socket.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::*;
use harness::{
    calls::Method,
    grpc::registration,
    plugin::{KubeletPlugin, Listener, PluginConfig, PluginListeners},
};
use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tonic::transport::{Channel, Endpoint};

/// A channel over one already-established client end.
async fn duplex_channel(client: DuplexStream) -> Channel {
    let slot = Arc::new(Mutex::new(Some(client)));
    Endpoint::from_static("http://tunnel")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let client = slot.lock().unwrap().take();
            async move {
                client.map(TokioIo::new).ok_or_else(|| std::io::Error::other("the tunnel was already used"))
            }
        }))
        .await
        .unwrap()
}

// Paused time: the idle wait below costs no wall-clock time, yet any
// handshake or idle timer in the server would fire during it.
#[tokio::test(start_paused = true)]
async fn serves_idle_pre_established_tunnels_until_stopped() {
    let p = paths();
    let (reg_tx, reg_listener) = Listener::channel(10);
    let (dra_tx, dra_listener) = Listener::channel(10);
    let endpoint = format!("/var/lib/kubelet/plugins/{DRIVER}/dra.sock");
    let plugin = KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir).dra_endpoint(&endpoint))
        .start(PluginListeners { registration: reg_listener, dra: dra_listener })
        .await
        .unwrap();

    // Pre-establish connections before any client uses them.
    let (reg_client, reg_server) = tokio::io::duplex(64 * 1024);
    reg_tx.send(reg_server).await.unwrap();
    let (dra_client, dra_server) = tokio::io::duplex(64 * 1024);
    dra_tx.send(dra_server).await.unwrap();

    // The kubelet may come much later.
    tokio::time::sleep(Duration::from_secs(600)).await;

    let mut reg =
        registration::registration_client::RegistrationClient::new(duplex_channel(reg_client).await);
    let info = within("GetInfo", reg.get_info(registration::InfoRequest {})).await.unwrap().into_inner();
    assert_eq!(info.endpoint, endpoint);
    within(
        "NotifyRegistrationStatus",
        reg.notify_registration_status(registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }),
    )
    .await
    .unwrap();
    assert!(plugin.is_registered());

    let dra = DraClient::V1(harness::grpc::dra_v1::dra_plugin_client::DraPluginClient::new(
        duplex_channel(dra_client).await,
    ));
    // An idle gap between calls on the same connection.
    tokio::time::sleep(Duration::from_secs(600)).await;
    let result = within("unprepare", dra.unprepare(&[claim_ref("c", "uid")])).await.unwrap();
    assert_eq!(result["uid"], "");
    assert_eq!(plugin.calls().count(Method::NodeUnprepareResources), 1);
    assert_eq!(plugin.calls().count(Method::GetInfo), 1);

    // Stop closes the tunnels and stops accepting new ones.
    within("stop", plugin.stop()).await;
    assert!(reg_tx.is_closed() && dra_tx.is_closed());
    let (_late_client, late_server) = tokio::io::duplex(1024);
    assert!(reg_tx.send(late_server).await.is_err());
    let err = within("GetInfo after stop", reg.get_info(registration::InfoRequest {})).await.unwrap_err();
    assert_ne!(err.code(), tonic::Code::Ok);
}
