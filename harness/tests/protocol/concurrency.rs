//! Prepares for different claims run in parallel: none waits for another.

use std::sync::{Arc, atomic::Ordering};

use crate::common::*;
use harness::{calls::Method, plugin::MemoryClaims};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_prepares_do_not_wait_for_each_other() {
    const N: usize = 50;
    let memory = MemoryClaims::new();
    for i in 0..N {
        memory.insert(allocated_claim(&format!("claim-{i}"), &format!("uid-{i}"), &[("r", "device-00")]));
    }
    let claims = Arc::new(GatedClaims::new(memory));
    // Reading claim-0 hangs until released.
    let gate = claims.gate("claim-0");
    let t = TestPlugin::start(claims.clone(), Arc::new(CountingFiles::default()), |c| c).await;
    let registered = register_like_kubelet(&t.reg_socket).await;
    // One connection, like the kubelet: all calls are multiplexed on it.
    let dra = DraClient::connect(&t.dra_socket, &registered.chosen).await;

    let waiting = claims.waiting.notified();
    let blocked = tokio::spawn({
        let dra = dra.clone();
        async move { dra.prepare(&[claim_ref("claim-0", "uid-0")]).await }
    });
    within("claim-0's read to start", waiting).await;

    let mut others = tokio::task::JoinSet::new();
    for i in 1..N {
        let dra = dra.clone();
        others.spawn(async move {
            let uid = format!("uid-{i}");
            let result = dra.prepare(&[claim_ref(&format!("claim-{i}"), &uid)]).await;
            (uid, result)
        });
    }
    let all = within("the other 49 prepares", others.join_all()).await;
    assert_eq!(all.len(), N - 1);
    for (uid, result) in all {
        let result = result.unwrap_or_else(|e| panic!("prepare {uid}: {e}"));
        assert!(result[&uid].is_ok(), "{uid}: {:?}", result[&uid]);
        assert!(t.cdi_file(&uid, "r").exists());
    }
    assert!(!blocked.is_finished(), "claim-0 must still be waiting for its read");
    assert_eq!(t.plugin.calls().log().count(Method::NodePrepareResources.in_progress()), 1);
    assert_eq!(t.plugin.prepared_claims().len(), N - 1);

    gate.notify_one();
    let result = within("claim-0's prepare", blocked).await.unwrap().unwrap();
    assert!(result["uid-0"].is_ok());
    assert_eq!(t.plugin.prepared_claims().len(), N);
    assert_eq!(claims.reads.load(Ordering::SeqCst), N);
    assert_eq!(t.plugin.calls().count(Method::NodePrepareResources), N);
    t.plugin.stop().await;
}

#[tokio::test]
async fn concurrent_prepares_of_the_same_claim_write_once() {
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("c", "uid-c", &[("r", "device-00")]));
    let files = Arc::new(CountingFiles::default());
    let t = TestPlugin::start(Arc::new(memory), files.clone(), |c| c).await;
    let dra = DraClient::connect(&t.dra_socket, "v1.DRAPlugin").await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let dra = dra.clone();
        set.spawn(async move { dra.prepare(&[claim_ref("c", "uid-c")]).await });
    }
    let results = within("10 prepares", set.join_all()).await;
    let first = results[0].as_ref().unwrap().clone();
    for r in &results {
        assert_eq!(r.as_ref().unwrap(), &first);
    }
    assert_eq!(files.writes.load(Ordering::SeqCst), 1);
    t.plugin.stop().await;
}
