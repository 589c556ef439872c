//! The plugin as the kubelet sees it: registration, prepare/unprepare on v1 and
//! v1beta1, CDI output, the call log, fault injection, blocking, health streams.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

use crate::common::*;
use harness::{
    calls::Method,
    grpc::{health_v1, health_v1alpha1, registration},
    plugin::{CdiSpec, ClaimId, Health, MemoryClaims},
};
use rstest::rstest;
use tonic::Code;

const V1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const V1_UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
const V1BETA1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
const V1BETA1_UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

#[rstest]
#[case::v1(true, "v1.DRAPlugin", V1_PREPARE, V1_UNPREPARE)]
#[case::v1beta1_only(false, "v1beta1.DRAPlugin", V1BETA1_PREPARE, V1BETA1_UNPREPARE)]
#[tokio::test]
async fn kubelet_registers_prepares_and_unprepares(
    #[case] v1: bool,
    #[case] expected_service: &str,
    #[case] prepare_path: &str,
    #[case] unprepare_path: &str,
) {
    let claims = MemoryClaims::new();
    claims.insert(allocated_claim("my-claim", "uid-1", &[("my-request", "device-00")]));
    let files = Arc::new(CountingFiles::default());
    let t = TestPlugin::start(Arc::new(claims), files.clone(), |c| c.dra_v1(v1).health_resend_interval(None))
        .await;
    let plugin = &t.plugin;
    assert!(!plugin.is_registered());

    // Registration as the kubelet does it.
    let registered = register_like_kubelet(&t.reg_socket).await;
    assert_eq!(registered.info.name, DRIVER);
    assert_eq!(registered.info.endpoint, t.dra_socket.display().to_string());
    let mut expected_versions = vec![];
    if v1 {
        expected_versions.push("v1.DRAPlugin");
    }
    expected_versions.extend(["v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]);
    assert_eq!(registered.info.supported_versions, expected_versions);
    assert_eq!(registered.chosen, expected_service);
    within("registration", plugin.wait_registered(TIMEOUT)).await.unwrap();
    assert!(plugin.is_registered());

    // Prepare twice (idempotent), then unprepare.
    let dra = DraClient::connect(&t.dra_socket, &registered.chosen).await;
    let claim = [claim_ref("my-claim", "uid-1")];
    let first = within("prepare", dra.prepare(&claim)).await.unwrap();
    let devices = first["uid-1"].clone().unwrap();
    assert_eq!(
        devices,
        vec![Device {
            request_names: vec!["my-request".into()],
            pool_name: NODE.into(),
            device_name: "device-00".into(),
            cdi_device_ids: vec![format!("{DRIVER}/test=claim-uid-1-my-request")],
            share_id: v1.then(|| "share-device-00".to_string()),
        }]
    );
    let cdi_file = t.cdi_file("uid-1", "my-request");
    let spec: CdiSpec = serde_json::from_slice(&std::fs::read(&cdi_file).unwrap()).unwrap();
    assert_eq!(spec.version, "0.3.0");
    assert_eq!(spec.kind, format!("{DRIVER}/test"));
    assert_eq!(spec.devices.len(), 1);
    assert_eq!(spec.devices[0].name, "claim-uid-1-my-request");
    assert_eq!(
        spec.devices[0].container_edits.env,
        ["admin_x=y", "claim_my_claim_my_request=true", "user_a=b"]
    );
    assert_eq!(files.writes.load(Ordering::SeqCst), 1);
    assert_eq!(plugin.prepared_claims(), [ClaimId { name: "my-claim".into(), uid: "uid-1".into() }]);

    let second = within("second prepare", dra.prepare(&claim)).await.unwrap();
    assert_eq!(second, first);
    assert_eq!(files.writes.load(Ordering::SeqCst), 1, "second prepare must not rewrite");

    let unprepared = within("unprepare", dra.unprepare(&claim)).await.unwrap();
    assert_eq!(unprepared["uid-1"], "");
    assert!(!cdi_file.exists());
    assert!(plugin.prepared_claims().is_empty());
    // Unknown claim: success, nothing to do.
    let unknown = within("unprepare unknown", dra.unprepare(&[claim_ref("other", "uid-x")])).await.unwrap();
    assert_eq!(unknown["uid-x"], "");

    // The call log, exactly.
    let calls = plugin.calls();
    calls.eventually(|c| c.records.iter().all(|r| r.is_finished()), TIMEOUT).await.unwrap();
    let log = calls.log();
    assert_eq!(
        log.methods(),
        [GET_INFO, NOTIFY, prepare_path, prepare_path, unprepare_path, unprepare_path],
        "{log}"
    );
    assert!(log.records.iter().all(|r| r.succeeded() && !r.injected), "{log}");
    assert_eq!(calls.count(Method::GetInfo), 1);
    assert_eq!(calls.count(Method::NotifyRegistrationStatus), 1);
    assert_eq!(calls.count(Method::NodePrepareResources), 2);
    assert_eq!(calls.count(Method::Exact(prepare_path.into())), 2);
    assert_eq!(calls.count(Method::NodeUnprepareResources), 2);
    assert_eq!(calls.count(Method::NodeUnprepareResources.for_claim_uid("uid-x")), 1);
    assert_eq!(calls.count(Method::NodeWatchResources), 0);

    let prepare = &log.records[2];
    assert_eq!(
        prepare.request,
        Some(serde_json::json!({"claims": [{"namespace": NS, "uid": "uid-1", "name": "my-claim"}]}))
    );
    let response = prepare.response.as_ref().unwrap();
    assert_eq!(
        response["claims"]["uid-1"]["devices"][0]["cdi_device_ids"][0],
        format!("{DRIVER}/test=claim-uid-1-my-request")
    );
    assert_eq!(prepare.responses, 1);
    assert!(prepare.finished.unwrap() >= prepare.started);
    assert_eq!(log.records[1].request, Some(serde_json::json!({"plugin_registered": true, "error": ""})));

    calls.reset();
    assert_eq!(calls.count(Method::NodePrepareResources), 0);
    t.plugin.stop().await;
    assert!(!t.reg_socket.exists(), "registration socket must be removed on stop");
    assert!(!t.dra_socket.exists(), "DRA socket must be removed on stop");
}

/// `unprepare_claim` does what an unprepare call would, without a call in the log.
#[tokio::test]
async fn direct_unprepare_removes_the_claim_without_a_recorded_call() {
    let claims = MemoryClaims::new();
    claims.insert(allocated_claim("my-claim", "uid-1", &[("my-request", "device-00")]));
    let files = Arc::new(CountingFiles::default());
    let t = TestPlugin::start(Arc::new(claims), files, |c| c.health_resend_interval(None)).await;
    let registered = register_like_kubelet(&t.reg_socket).await;
    let dra = DraClient::connect(&t.dra_socket, &registered.chosen).await;
    within("prepare", dra.prepare(&[claim_ref("my-claim", "uid-1")]))
        .await
        .unwrap()
        .remove("uid-1")
        .unwrap()
        .unwrap();
    let cdi_file = t.cdi_file("uid-1", "my-request");
    assert!(cdi_file.exists());
    let before = t.plugin.calls().log().records.len();

    t.plugin.unprepare_claim(NS, "my-claim", "uid-1").await.unwrap();
    assert!(t.plugin.prepared_claims().is_empty());
    assert!(!cdi_file.exists());
    // Unknown claims are fine, as in NodeUnprepareResources.
    t.plugin.unprepare_claim(NS, "other", "uid-x").await.unwrap();
    assert_eq!(t.plugin.calls().log().records.len(), before, "{}", t.plugin.calls().log());
    assert_eq!(t.plugin.calls().count(Method::NodeUnprepareResources), 0);
    t.plugin.stop().await;
}

#[tokio::test]
async fn injected_failures_are_returned_and_counted() {
    let claims = MemoryClaims::new();
    claims.insert(allocated_claim("c", "uid-c", &[("r", "device-00")]));
    let t = TestPlugin::start(Arc::new(claims), Arc::new(CountingFiles::default()), |c| c).await;
    let calls = t.plugin.calls();

    let failing = calls.fail(Method::GetInfo, tonic::Status::unavailable("GetInfo is down"));
    let mut reg =
        registration::registration_client::RegistrationClient::new(unix_channel(&t.reg_socket).await);
    let err = within("GetInfo", reg.get_info(registration::InfoRequest {})).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "GetInfo is down");
    failing.clear();
    within("GetInfo", reg.get_info(registration::InfoRequest {})).await.unwrap();

    let dra = DraClient::connect(&t.dra_socket, "v1.DRAPlugin").await;
    let _failing = calls.fail_next(
        Method::NodePrepareResources,
        2,
        tonic::Status::resource_exhausted("no more devices"),
    );
    for _ in 0..2 {
        let err = within("prepare", dra.prepare(&[claim_ref("c", "uid-c")])).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert_eq!(err.message(), "no more devices");
    }
    let ok = within("prepare", dra.prepare(&[claim_ref("c", "uid-c")])).await.unwrap();
    assert!(ok["uid-c"].is_ok());

    let log = calls.log();
    assert_eq!(log.count(Method::GetInfo), 2, "{log}");
    assert_eq!(log.count(Method::GetInfo.injected()), 1, "{log}");
    assert_eq!(log.count(Method::NodePrepareResources), 3, "{log}");
    assert_eq!(log.count(Method::NodePrepareResources.injected()), 2, "{log}");
    assert_eq!(log.count(Method::NodePrepareResources.failed()), 2, "{log}");
    assert_eq!(log.count(Method::NodePrepareResources.succeeded()), 1, "{log}");
    let injected = &log.matching(Method::NodePrepareResources)[0];
    assert!(injected.injected);
    let status = injected.status.as_ref().unwrap();
    assert_eq!((status.code, status.message.as_str()), (Code::ResourceExhausted, "no more devices"));
    // The handler never ran for injected calls: one file write only.
    assert!(t.cdi_file("uid-c", "r").exists());
    t.plugin.stop().await;
}

#[tokio::test]
async fn delay_is_applied() {
    let claims = MemoryClaims::new();
    let t = TestPlugin::start(Arc::new(claims), Arc::new(CountingFiles::default()), |c| c).await;
    let delay = Duration::from_millis(200);
    let _delayed = t.plugin.calls().delay(Method::GetInfo, delay);
    let mut reg =
        registration::registration_client::RegistrationClient::new(unix_channel(&t.reg_socket).await);
    within("GetInfo", reg.get_info(registration::InfoRequest {})).await.unwrap();
    let log = t.plugin.calls().log();
    let took = log.records[0].duration().unwrap();
    assert!(took >= delay, "call took {took:?}, expected at least {delay:?}");
    t.plugin.stop().await;
}

#[tokio::test]
async fn blocked_prepare_holds_while_other_claims_and_methods_proceed() {
    let claims = MemoryClaims::new();
    claims.insert(allocated_claim("a", "uid-a", &[("r", "device-00")]));
    claims.insert(allocated_claim("b", "uid-b", &[("r", "device-01")]));
    let t = TestPlugin::start(Arc::new(claims), Arc::new(CountingFiles::default()), |c| c).await;
    let calls = t.plugin.calls().clone();
    let dra = DraClient::connect(&t.dra_socket, "v1.DRAPlugin").await;

    // Per claim: only claim a is held.
    let guard = calls.block(Method::NodePrepareResources.for_claim_uid("uid-a"));
    let held = tokio::spawn({
        let dra = dra.clone();
        async move { dra.prepare(&[claim_ref("a", "uid-a")]).await }
    });
    calls.wait_at_least(Method::NodePrepareResources.for_claim_uid("uid-a"), 1, TIMEOUT).await.unwrap();
    calls.eventually(|c| c.count(Method::NodePrepareResources.blocked()) == 1, TIMEOUT).await.unwrap();

    let other = within("prepare of claim b", dra.prepare(&[claim_ref("b", "uid-b")])).await.unwrap();
    assert!(other["uid-b"].is_ok());
    let mut reg =
        registration::registration_client::RegistrationClient::new(unix_channel(&t.reg_socket).await);
    within("GetInfo", reg.get_info(registration::InfoRequest {})).await.unwrap();
    assert!(!held.is_finished(), "the blocked prepare must still be held");
    assert!(!t.cdi_file("uid-a", "r").exists());
    assert!(t.cdi_file("uid-b", "r").exists());

    guard.release();
    let released = within("released prepare", held).await.unwrap().unwrap();
    assert!(released["uid-a"].is_ok());
    assert!(t.cdi_file("uid-a", "r").exists());
    assert_eq!(calls.log().count(Method::NodePrepareResources.blocked()), 0);

    // Per method: every prepare is held, unprepare proceeds; dropping the guard releases.
    let guard = calls.block(Method::NodePrepareResources);
    let held = tokio::spawn({
        let dra = dra.clone();
        async move { dra.prepare(&[claim_ref("b", "uid-b")]).await }
    });
    calls.eventually(|c| c.count(Method::NodePrepareResources.blocked()) == 1, TIMEOUT).await.unwrap();
    let unprepared = within("unprepare a", dra.unprepare(&[claim_ref("a", "uid-a")])).await.unwrap();
    assert_eq!(unprepared["uid-a"], "");
    assert!(!held.is_finished());
    drop(guard);
    within("prepare after drop", held).await.unwrap().unwrap();
    t.plugin.stop().await;
}

/// Reads health snapshots from either API version as (pool, device, health, message).
type Snapshot = Vec<(String, String, i32, String)>;

async fn next_snapshot<S>(stream: &mut S) -> Snapshot
where
    S: futures::Stream<Item = Result<Snapshot, tonic::Status>> + Unpin,
{
    use futures::StreamExt as _;
    within("a health snapshot", stream.next()).await.unwrap().unwrap()
}

async fn health_stream(
    version: &str,
    socket: &std::path::Path,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<Snapshot, tonic::Status>> + Send>> {
    use futures::StreamExt as _;
    let channel = unix_channel(socket).await;
    match version {
        "v1" => {
            let mut client = health_v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
            let stream = within(
                "NodeWatchResources",
                client.node_watch_resources(health_v1::NodeWatchResourcesRequest {}),
            )
            .await
            .unwrap()
            .into_inner();
            Box::pin(stream.map(|r| {
                r.map(|r| {
                    r.devices
                        .into_iter()
                        .map(|d| {
                            let id = d.device.unwrap_or_default();
                            (id.pool_name, id.device_name, d.health, d.message)
                        })
                        .collect()
                })
            }))
        }
        _ => {
            let mut client =
                health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel);
            let stream = within(
                "NodeWatchResources",
                client.node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {}),
            )
            .await
            .unwrap()
            .into_inner();
            Box::pin(stream.map(|r| {
                r.map(|r| {
                    r.devices
                        .into_iter()
                        .map(|d| {
                            let id = d.device.unwrap_or_default();
                            (id.pool_name, id.device_name, d.health, d.message)
                        })
                        .collect()
                })
            }))
        }
    }
}

#[rstest]
#[case::v1alpha1("v1alpha1", "/v1alpha1.DRAResourceHealth/NodeWatchResources")]
#[case::v1("v1", "/v1.DRAResourceHealth/NodeWatchResources")]
#[tokio::test]
async fn health_stream_reports_changes(#[case] version: &str, #[case] path: &str) {
    let t = TestPlugin::start(Arc::new(MemoryClaims::new()), Arc::new(CountingFiles::default()), |c| {
        c.health_resend_interval(None)
    })
    .await;
    let health = t.plugin.health();
    health.set("pool-b", "device-00", Health::Healthy, "");
    let mut stream = health_stream(version, &t.dra_socket).await;
    let s =
        |pool: &str, device: &str, h: i32, m: &str| (pool.to_string(), device.to_string(), h, m.to_string());
    // HEALTHY = 1, UNHEALTHY = 2 in both versions.
    assert_eq!(next_snapshot(&mut stream).await, [s("pool-b", "device-00", 1, "")]);

    health.set("pool-a", "device-01", Health::Healthy, "fine");
    assert_eq!(
        next_snapshot(&mut stream).await,
        [s("pool-a", "device-01", 1, "fine"), s("pool-b", "device-00", 1, "")]
    );
    health.set("pool-a", "device-01", Health::Unhealthy, "ECC errors");
    assert_eq!(
        next_snapshot(&mut stream).await,
        [s("pool-a", "device-01", 2, "ECC errors"), s("pool-b", "device-00", 1, "")]
    );
    health.set("pool-a", "device-01", Health::Healthy, "recovered");
    assert_eq!(
        next_snapshot(&mut stream).await,
        [s("pool-a", "device-01", 1, "recovered"), s("pool-b", "device-00", 1, "")]
    );

    // The open stream is in the log, with 4 messages so far.
    let calls = t.plugin.calls();
    calls
        .eventually(|c| c.last(Method::NodeWatchResources).is_some_and(|r| r.responses == 4), TIMEOUT)
        .await
        .unwrap();
    let record = calls.log().last(Method::NodeWatchResources).cloned().unwrap();
    assert_eq!(record.method, path);
    assert!(!record.is_finished());
    assert_eq!(record.response.as_ref().unwrap()["devices"][0]["message"], "recovered");

    // Stopping the plugin ends the stream and the call.
    t.plugin.stop().await;
    use futures::StreamExt as _;
    let end = within("end of stream", stream.next()).await;
    assert!(!matches!(end, Some(Ok(_))), "no more snapshots after stop: {end:?}");
    let record = calls.log().last(Method::NodeWatchResources).cloned().unwrap();
    assert!(record.is_finished(), "{record:?}");
}

#[tokio::test]
async fn health_stream_resends_without_changes() {
    let t = TestPlugin::start(Arc::new(MemoryClaims::new()), Arc::new(CountingFiles::default()), |c| {
        c.health_resend_interval(Some(Duration::from_millis(20)))
    })
    .await;
    t.plugin.health().set("p", "d", Health::Unhealthy, "m");
    let mut stream = health_stream("v1", &t.dra_socket).await;
    for _ in 0..3 {
        let snapshot = next_snapshot(&mut stream).await;
        assert_eq!(snapshot, [("p".to_string(), "d".to_string(), 2, "m".to_string())]);
    }
    drop(stream);
    // The client went away: the recorded stream ends.
    t.plugin
        .calls()
        .eventually(|c| c.last(Method::NodeWatchResources).is_some_and(|r| r.is_finished()), TIMEOUT)
        .await
        .unwrap();
    t.plugin.stop().await;
}
