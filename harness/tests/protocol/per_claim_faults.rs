//! Injected per-claim faults (`Calls::fail_claim`) as the kubelet's own gRPC stack sees them:
//! the call succeeds, the claim's entry in the answer carries the injected `error`, the other
//! claims of the call are handled as usual, and the plugin leaves the failed claim as it was;
//! also through a plugin in forward mode (the interposer's), whose driver never sees the claim.

use std::sync::Arc;

use harness::{
    calls::{ClaimOutcome, Method},
    grpc::dra_v1,
    plugin::{ClaimId, Forward, KubeletPlugin, Listener, MemoryClaims, PluginConfig, PluginListeners},
};

use crate::{
    clients::{Call, Client},
    common::*,
};

const INJECTED: &str = "injected per-claim error (protocol test)";

fn claim(name: &str) -> (String, String, String) {
    (NS.to_owned(), name.to_owned(), format!("uid-{name}"))
}

fn id(name: &str) -> ClaimId {
    ClaimId { name: name.to_owned(), uid: format!("uid-{name}") }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_client_gets_the_injected_claim_error_in_a_successful_answer() {
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("a", "uid-a", &[("req", "device-00")]));
    memory.insert(allocated_claim("b", "uid-b", &[("req", "device-01")]));
    let t = TestPlugin::start(Arc::new(memory), Arc::new(CountingFiles::default()), |c| c).await;
    let calls = t.plugin.calls();
    let _prepare = calls.fail_claim_next(Method::NodePrepareResources.for_claim_uid("uid-a"), 1, INJECTED);
    let unprepare = calls.fail_claim(Method::NodeUnprepareResources.for_claim_name("b"), INJECTED);
    let both = vec![claim("a"), claim("b")];

    // grpc-go with a `unix:` target: the kubelet's DRA client.
    let answers = Client::GoUnix
        .run(
            &t.dra_socket,
            &[Call::PrepareV1(both.clone()), Call::PrepareV1(both.clone()), Call::UnprepareV1(both.clone())],
        )
        .await;
    let first: dra_v1::NodePrepareResourcesResponse = answers[0].ok();
    claim_a_failed_claim_b_prepared(&first);
    // "Next 1": the retry prepares the claim.
    let second: dra_v1::NodePrepareResourcesResponse = answers[1].ok();
    assert_eq!((second.claims["uid-a"].error.as_str(), second.claims["uid-b"].error.as_str()), ("", ""));
    assert_eq!(second.claims["uid-a"].devices.len(), 1, "{second:?}");
    // Until cleared: b's unprepare fails, a's goes through; b stays prepared with its CDI file.
    let unprepared: dra_v1::NodeUnprepareResourcesResponse = answers[2].ok();
    assert_eq!(unprepared.claims["uid-a"].error, "");
    assert_eq!(unprepared.claims["uid-b"].error, INJECTED);
    assert_eq!(t.plugin.prepared_claims(), [id("b")]);
    assert!(t.cdi_file("uid-b", "req").exists() && !t.cdi_file("uid-a", "req").exists());

    let answers = Client::GoUnix.run(&t.dra_socket, &[Call::UnprepareV1(vec![claim("b")])]).await;
    let still: dra_v1::NodeUnprepareResourcesResponse = answers[0].ok();
    assert_eq!(still.claims["uid-b"].error, INJECTED);
    unprepare.clear();
    let answers = Client::GoUnix.run(&t.dra_socket, &[Call::UnprepareV1(vec![claim("b")])]).await;
    let done: dra_v1::NodeUnprepareResourcesResponse = answers[0].ok();
    assert_eq!(done.claims["uid-b"].error, "");
    assert!(t.plugin.prepared_claims().is_empty());
    assert!(!t.cdi_file("uid-b", "req").exists());

    // The log tells injected claim errors from real ones, per claim; no call failed.
    let log = calls.log();
    assert_eq!(
        log.count(Method::NodePrepareResources.failed()) + log.count(Method::NodeUnprepareResources.failed()),
        0
    );
    let a = calls.claim("uid-a");
    assert_eq!(
        a.to_string(),
        format!(
            "#1 NodePrepareResources -> failed for the claim ({INJECTED}) [injected]; \
             #2 NodePrepareResources -> OK; #3 NodeUnprepareResources -> OK"
        )
    );
    let b = calls.claim("uid-b");
    assert_eq!((b.prepared(), b.unprepare_failures(), b.unprepared()), (2, 2, 1), "{b}");
    assert!(
        b.unprepares()
            .take(2)
            .all(|c| c.injected() && c.outcome == ClaimOutcome::ClaimFailed(INJECTED.to_owned()))
    );
    assert!(b.prepares().all(|c| !c.injected()), "{b}");
    t.plugin.stop().await;
}

/// The interposer's case: a plugin in forward mode in front of a driver. The injected claim is
/// answered by the forwarding plugin, the call's other claim is forwarded alone, and grpc-go (the
/// kubelet's client) reads the merged answer; a call of the injected claim alone never reaches
/// the driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarding_plugin_answers_the_injected_claim_and_forwards_the_others() {
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("a", "uid-a", &[("req", "device-00")]));
    memory.insert(allocated_claim("b", "uid-b", &[("req", "device-01")]));
    let driver = TestPlugin::start(Arc::new(memory), Arc::new(CountingFiles::default()), |c| c).await;
    let p = paths();
    let forward =
        Forward::new(unix_channel(&driver.dra_socket).await, vec![dra_v1::SERVICE_VERSION.to_owned()]);
    let interposer = KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir))
        .forward(forward)
        .start(PluginListeners {
            registration: Listener::unix(&p.reg_socket),
            dra: Listener::unix(&p.dra_socket),
        })
        .await
        .unwrap();
    let calls = interposer.calls();
    let _prepare = calls.fail_claim_next(Method::NodePrepareResources.for_claim_uid("uid-a"), 1, INJECTED);
    let _unprepare =
        calls.fail_claim_next(Method::NodeUnprepareResources.for_claim_uid("uid-a"), 1, INJECTED);

    let answers = Client::GoUnix
        .run(
            &p.dra_socket,
            &[
                Call::PrepareV1(vec![claim("a"), claim("b")]),
                Call::PrepareV1(vec![claim("a")]),
                Call::UnprepareV1(vec![claim("a")]),
            ],
        )
        .await;
    let first: dra_v1::NodePrepareResourcesResponse = answers[0].ok();
    claim_a_failed_claim_b_prepared(&first);
    let retried: dra_v1::NodePrepareResourcesResponse = answers[1].ok();
    assert_eq!((retried.claims["uid-a"].error.as_str(), retried.claims["uid-a"].devices.len()), ("", 1));
    let unprepared: dra_v1::NodeUnprepareResourcesResponse = answers[2].ok();
    assert_eq!(unprepared.claims["uid-a"].error, INJECTED);

    // The driver saw b alone, then a's retry, and no unprepare; a stays prepared there.
    let seen: Vec<Vec<String>> = driver
        .plugin
        .calls()
        .log()
        .records
        .iter()
        .filter(|r| r.method.contains("DRAPlugin"))
        .map(|r| r.claims.iter().map(|c| c.uid.clone()).collect())
        .collect();
    assert_eq!(seen, [vec!["uid-b".to_owned()], vec!["uid-a".to_owned()]]);
    assert_eq!(driver.plugin.prepared_claims(), [id("a"), id("b")]);
    // The forwarding plugin's log: the injected answers, per claim, in calls that succeeded.
    let a = calls.claim("uid-a");
    assert_eq!(
        a.to_string(),
        format!(
            "#1 NodePrepareResources -> failed for the claim ({INJECTED}) [injected]; \
             #2 NodePrepareResources -> OK; #3 NodeUnprepareResources -> failed for the claim ({INJECTED}) [injected]"
        )
    );
    assert_eq!(calls.claim("uid-b").prepared(), 1);
    interposer.stop().await;
    driver.plugin.stop().await;
}

/// The first prepare's answer: claim a failed with the injected error and no devices, claim b
/// prepared with its device.
fn claim_a_failed_claim_b_prepared(first: &dra_v1::NodePrepareResourcesResponse) {
    assert_eq!(first.claims["uid-a"].error, INJECTED);
    assert!(first.claims["uid-a"].devices.is_empty(), "{first:?}");
    assert_eq!(first.claims["uid-b"].error, "");
    assert_eq!(first.claims["uid-b"].devices.len(), 1, "{first:?}");
}
