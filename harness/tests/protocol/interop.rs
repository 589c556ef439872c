//! The plugin serves every gRPC client the kubelet's own libraries serve, on every listener: the
//! same calls from gRPC's C core (grpcio with stubs generated from the plugin crate's protos,
//! whose `:authority` for a Unix socket is the percent-encoded path), from grpc-go with a
//! passthrough target (the percent-encoded absolute path) and from grpc-go with a `unix:` target
//! (`localhost`, the kubelet's DRA connection). Needs `go` and `python3` (with venv) on PATH;
//! grpcio and grpcio-tools come from PyPI into a venv under the target directory.

use std::sync::Arc;

use harness::{
    calls::Method,
    grpc::{dra_v1, health_v1, health_v1alpha1, registration::PluginInfo},
    plugin::{Health, MemoryClaims},
};
use rstest::rstest;

use crate::{
    clients::{Call, Client},
    common::*,
};

fn claims(names: impl IntoIterator<Item = String>) -> Vec<(String, String, String)> {
    names.into_iter().map(|name| (NS.to_owned(), name.clone(), format!("uid-{name}"))).collect()
}

#[rstest]
#[case::c_core(Client::CCore)]
#[case::grpc_go_passthrough(Client::GoPassthrough)]
#[case::grpc_go_unix(Client::GoUnix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_the_kubelet_apis_is_answered(#[case] client: Client) {
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("claim-a", "uid-claim-a", &[("req", "device-00")]));
    let files = Arc::new(CountingFiles::default());
    let t = TestPlugin::start(Arc::new(memory), files.clone(), |c| c).await;
    t.plugin.health().set(NODE, "device-00", Health::Unhealthy, "overheated");

    // Registration.
    let answers = client.run(&t.reg_socket, &[Call::GetInfo, Call::NotifyRegistered]).await;
    let info: PluginInfo = answers[0].ok();
    assert_eq!((info.r#type.as_str(), info.name.as_str()), ("DRAPlugin", DRIVER));
    assert_eq!(info.endpoint, t.dra_socket.display().to_string());
    let _: harness::grpc::registration::RegistrationStatusResponse = answers[1].ok();
    within("registration", t.plugin.wait_registered(TIMEOUT)).await.unwrap();

    // DRA and health, one connection.
    let known = claims(["claim-a".to_owned()]);
    let unknown = claims(["claim-unknown".to_owned()]);
    let answers = client
        .run(
            &t.dra_socket,
            &[
                Call::PrepareV1(known.clone()),
                Call::PrepareV1beta1(known.clone()),
                Call::PrepareV1(unknown.clone()),
                Call::UnprepareV1(unknown.clone()),
                Call::UnprepareV1(known.clone()),
                Call::WatchV1,
                Call::WatchV1alpha1,
            ],
        )
        .await;
    let prepared: dra_v1::NodePrepareResourcesResponse = answers[0].ok();
    let result = &prepared.claims["uid-claim-a"];
    assert_eq!(result.error, "");
    assert_eq!(result.devices.len(), 1);
    assert_eq!(
        (result.devices[0].device_name.as_str(), result.devices[0].request_names[0].as_str()),
        ("device-00", "req")
    );
    let beta: dra_v1::NodePrepareResourcesResponse = answers[1].ok();
    assert_eq!(beta.claims["uid-claim-a"].error, "", "v1beta1 prepares the same claim again");

    // A claim the source cannot read fails the call, naming the claim (as upstream's driver).
    assert_eq!(answers[2].code, tonic::Code::Unknown, "{answers:?}");
    assert!(answers[2].message.contains("dra-test/claim-unknown"), "{:?}", answers[2].message);
    // Unpreparing a claim never prepared succeeds per claim, as upstream's helper does.
    let unprepared: dra_v1::NodeUnprepareResourcesResponse = answers[3].ok();
    assert_eq!(unprepared.claims["uid-claim-unknown"].error, "");
    let unprepared: dra_v1::NodeUnprepareResourcesResponse = answers[4].ok();
    assert_eq!(unprepared.claims["uid-claim-a"].error, "");
    // The CDI spec was written (once: the second prepare found the claim prepared) and removed.
    assert_eq!(files.writes.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!t.cdi_file("uid-claim-a", "req").exists());

    // Both health streams start with the current snapshot.
    let v1: health_v1::NodeWatchResourcesResponse = answers[5].ok();
    let v1alpha1: health_v1alpha1::NodeWatchResourcesResponse = answers[6].ok();
    let device =
        |d: Option<&health_v1::DeviceIdentifier>| d.map(|d| (d.pool_name.clone(), d.device_name.clone()));
    assert_eq!(v1.devices.len(), 1, "{v1:?}");
    assert_eq!(device(v1.devices[0].device.as_ref()), Some((NODE.to_owned(), "device-00".to_owned())));
    assert_eq!(v1.devices[0].message, "overheated");
    assert_eq!(v1alpha1.devices.len(), 1, "{v1alpha1:?}");

    let calls = t.plugin.calls();
    assert_eq!(calls.count(Method::NodePrepareResources), 3);
    assert_eq!(calls.count(Method::NodeUnprepareResources), 2);
    assert_eq!(calls.count(Method::NodeWatchResources), 2);
    t.plugin.stop().await;
}

#[rstest]
#[case::c_core(Client::CCore)]
#[case::grpc_go_passthrough(Client::GoPassthrough)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_are_answered_and_the_plugin_keeps_answering(#[case] client: Client) {
    let t = TestPlugin::start(Arc::new(MemoryClaims::new()), Arc::new(CountingFiles::default()), |c| c).await;
    let many = claims((0..10_000).map(|i| format!("claim-{i:05}")));
    // One claim whose name makes the request 32 MiB.
    let huge = vec![(NS.to_owned(), "x".repeat(32 << 20), "uid-huge".to_owned())];
    let answers = client
        .run(
            &t.dra_socket,
            &[
                Call::UnprepareV1(many.clone()),
                Call::PrepareV1(huge),
                Call::PrepareV1(many.clone()),
                Call::UnprepareV1(claims(["after".to_owned()])),
            ],
        )
        .await;

    // 10,000 claims: one result each.
    let unprepared: dra_v1::NodeUnprepareResourcesResponse = answers[0].ok();
    assert_eq!(unprepared.claims.len(), 10_000);
    assert!(unprepared.claims.values().all(|c| c.error.is_empty()));
    // 32 MiB: refused with a status (above the server's 4 MiB message limit; tonic's code is
    // OUT_OF_RANGE where grpc-go's is RESOURCE_EXHAUSTED), not a reset connection.
    assert_eq!(answers[1].code, tonic::Code::OutOfRange, "{:?}", answers[1].message);
    assert!(answers[1].message.contains("too large"), "{:?}", answers[1].message);
    // The same connection goes on.
    assert_eq!(answers[2].code, tonic::Code::Unknown, "unknown claims: {:?}", answers[2].message);
    assert!(answers[2].message.contains("dra-test/claim-0"), "{:?}", answers[2].message);
    let after: dra_v1::NodeUnprepareResourcesResponse = answers[3].ok();
    assert_eq!(after.claims["uid-after"].error, "");
    t.plugin.stop().await;
}
