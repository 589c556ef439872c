//! Tests of the call assertions, waits and fault guards on a log filled by hand (the layer that
//! fills it from real gRPC traffic is tested in `tests/plugin_*.rs`).

use std::time::Duration;

use super::*;

const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const PREPARE_V1BETA1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

fn ok() -> CallStatus {
    CallStatus { code: tonic::Code::Ok, message: String::new() }
}

fn claim(uid: &str) -> Vec<ClaimRef> {
    vec![ClaimRef { namespace: "ns".into(), name: format!("claim-{uid}"), uid: uid.into() }]
}

/// Records a finished call.
fn call(calls: &Calls, method: &str, claims: Vec<ClaimRef>) {
    let id = calls.start_call(method, claims, None);
    calls.finish_call(id, ok(), false);
}

#[test]
fn counts_any_version_one_version_and_one_claim() {
    let calls = Calls::named("the kubelet of node n1");
    call(&calls, PREPARE_V1, claim("a"));
    call(&calls, PREPARE_V1BETA1, claim("b"));
    call(&calls, GET_INFO, vec![]);
    assert_eq!(calls.count(Method::NodePrepareResources), 2);
    assert_eq!(calls.count(DraApi::V1.prepare()), 1);
    assert_eq!(calls.count(DraApi::V1beta1.unprepare()), 0);
    assert_eq!(calls.count(Method::NodePrepareResources.for_claim_uid("b")), 1);
    assert_eq!(calls.count(Method::NodePrepareResources.for_claim_name("claim-a")), 1);
    assert_eq!(calls.log().claim_uid("claim-b").unwrap(), "b");
    let text = calls.log().claim_uid("claim-c").unwrap_err().to_string();
    assert!(text.contains("expected a call that names claim claim-c, got 0"), "{text}");
    assert_eq!(calls.claim("a").prepares().count(), 1);
}

#[test]
fn expectations_pass_when_they_hold() {
    let calls = Calls::new();
    call(&calls, PREPARE_V1, claim("a"));
    call(&calls, PREPARE_V1, claim("a"));
    calls.expect_count(Method::NodePrepareResources, 2).unwrap();
    calls.expect_at_least(Method::NodePrepareResources, 1).unwrap();
    calls.expect_at_least(Method::NodePrepareResources, 2).unwrap();
    calls.expect_none(Method::NodeUnprepareResources).unwrap();
    calls.expect_none(DraApi::V1beta1.prepare()).unwrap();
    calls.log().expect_count(Method::NodePrepareResources.for_claim_uid("a"), 2).unwrap();
}

#[test]
fn a_failed_expect_count_names_scope_expectation_and_carries_the_call_log() {
    let calls = Calls::named("the kubelet of node n1 (driver d.k8s.io)");
    call(&calls, PREPARE_V1, claim("a"));
    let err = calls.expect_count(Method::NodePrepareResources, 2).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "the kubelet of node n1 (driver d.k8s.io): expected exactly 2 call(s) of NodePrepareResources, got 1"
        ),
        "{text}"
    );
    assert!(text.contains("call log (1 calls):"), "{text}");
    assert!(text.contains("#1 +") && text.contains(&format!("{PREPARE_V1} -> OK")), "{text}");
    assert_eq!(err.log().records.len(), 1);
    match err {
        CallsError::Unexpected { actual, .. } => assert_eq!(actual, 1),
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn failed_expect_at_least_and_expect_none() {
    let calls = Calls::new();
    call(&calls, PREPARE_V1, claim("a"));
    let text = calls.expect_at_least(Method::NodePrepareResources, 3).unwrap_err().to_string();
    assert!(text.starts_with("expected at least 3 call(s) of NodePrepareResources, got 1"), "{text}");
    let text = calls.expect_none(Method::NodePrepareResources.for_claim_uid("a")).unwrap_err().to_string();
    assert!(text.starts_with("expected no call of NodePrepareResources for claim UID a, got 1"), "{text}");
    assert!(text.contains(PREPARE_V1), "{text}");
}

#[test]
fn fail_next_counts_down_and_its_guard_clears_the_rest() {
    let calls = Calls::new();
    let guard = calls.fail_next(Method::GetInfo, 2, tonic::Status::unavailable("x"));
    assert!(calls.take_failure(GET_INFO, &[]).is_some());
    assert!(calls.take_failure(GET_INFO, &[]).is_some());
    assert!(calls.take_failure(GET_INFO, &[]).is_none());
    drop(guard);

    let guard = calls.fail_next(Method::GetInfo, 5, tonic::Status::unavailable("x"));
    assert!(calls.take_failure(GET_INFO, &[]).is_some());
    guard.clear();
    assert!(calls.take_failure(GET_INFO, &[]).is_none());
    let nothing = calls.fail_next(Method::GetInfo, 0, tonic::Status::unavailable("x"));
    assert!(calls.take_failure(GET_INFO, &[]).is_none());
    drop(nothing);
}

#[test]
fn fail_lasts_until_its_guard_goes_and_only_its_own_fault_goes() {
    let calls = Calls::new();
    let v1 = calls.fail(DraApi::V1.prepare(), tonic::Status::unknown("injected error"));
    let any = calls.fail(Method::NodePrepareResources, tonic::Status::unknown("injected error"));
    for _ in 0..3 {
        assert!(calls.take_failure(PREPARE_V1, &[]).is_some());
    }
    drop(any);
    assert!(calls.take_failure(PREPARE_V1, &[]).is_some(), "the v1 fault stays");
    assert!(calls.take_failure(PREPARE_V1BETA1, &[]).is_none(), "the any-version fault went");
    v1.clear();
    assert!(calls.take_failure(PREPARE_V1, &[]).is_none());
}

#[test]
fn delay_adds_up_and_goes_with_its_guard() {
    let calls = Calls::new();
    let a = calls.delay(Method::NodePrepareResources, Duration::from_millis(10));
    let b = calls.delay(Method::NodePrepareResources.for_claim_uid("a"), Duration::from_millis(5));
    assert_eq!(calls.admission(PREPARE_V1, &claim("a")).delay, Duration::from_millis(15));
    assert_eq!(calls.admission(PREPARE_V1, &claim("b")).delay, Duration::from_millis(10));
    drop(a);
    assert_eq!(calls.admission(PREPARE_V1, &claim("a")).delay, Duration::from_millis(5));
    b.clear();
    assert_eq!(calls.admission(PREPARE_V1, &claim("a")).delay, Duration::ZERO);
}

#[tokio::test]
async fn clear_all_removes_faults_and_releases_blocks_whoever_holds_the_guards() {
    let calls = Calls::new();
    let failing = calls.fail(Method::NodePrepareResources, tonic::Status::unknown("injected error"));
    let delayed = calls.delay(Method::GetInfo, Duration::from_secs(5));
    let blocked = calls.block(Method::NodePrepareResources);
    let mut held = calls.admission(PREPARE_V1, &[]).blocks;
    assert_eq!(held.len(), 1);
    calls.clear_all();
    assert!(calls.take_failure(PREPARE_V1, &[]).is_none());
    assert_eq!(calls.admission(GET_INFO, &[]).delay, Duration::ZERO);
    // The block's channel closed: a held call goes on.
    let released = tokio::time::timeout(Duration::from_secs(1), held[0].changed()).await;
    assert!(matches!(released, Ok(Err(_))), "the held call was not released");
    // The guards are harmless afterwards.
    drop((failing, delayed, blocked));
}

#[tokio::test]
async fn waits_return_when_the_condition_holds_and_fail_with_the_log() {
    let calls = Calls::named("node n1");
    let waiter = {
        let calls = calls.clone();
        tokio::spawn(async move {
            calls.wait_at_least(Method::NodePrepareResources, 2, Duration::from_secs(5)).await
        })
    };
    call(&calls, PREPARE_V1, claim("a"));
    call(&calls, PREPARE_V1BETA1, claim("a"));
    let log = waiter.await.unwrap().unwrap();
    assert_eq!(log.count(Method::NodePrepareResources), 2);

    let err =
        calls.wait_at_least(Method::NodeUnprepareResources, 1, Duration::from_millis(20)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "node n1: timed out after 20ms waiting for at least 1 call(s) of NodeUnprepareResources"
        ),
        "{text}"
    );
    assert!(text.contains(PREPARE_V1BETA1), "{text}");
}

#[tokio::test]
async fn eventually_names_the_callers_location() {
    let calls = Calls::new();
    call(&calls, GET_INFO, vec![]);
    let err =
        calls.eventually(|c| c.count(Method::GetInfo) >= 2, Duration::from_millis(20)).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("src/calls/tests.rs"), "{text}");
    assert!(text.contains("/pluginregistration.Registration/GetInfo -> OK"), "{text}");
}

#[tokio::test]
async fn wait_unprepared_waits_for_a_successful_unprepare_after_the_prepare() {
    let calls = Calls::new();
    let unprepare = DraApi::V1.unprepare().name().to_owned();
    let id = calls.start_call(PREPARE_V1, claim("a"), None);
    calls.update_call(id, |r| {
        r.response = Some(serde_json::json!({"claims": {"a": {"devices": [], "error": ""}}}))
    });
    calls.finish_call(id, ok(), false);
    assert!(calls.wait_unprepared("a", Duration::from_millis(20)).await.is_err());
    let id = calls.start_call(&unprepare, claim("a"), None);
    calls.update_call(id, |r| r.response = Some(serde_json::json!({"claims": {"a": {"error": ""}}})));
    calls.finish_call(id, ok(), false);
    let history = calls.wait_unprepared("a", Duration::from_secs(1)).await.unwrap();
    assert_eq!((history.prepared(), history.unprepared()), (1, 1));
    assert!(!history.is_prepared());
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef { namespace: "ns".into(), name: format!("claim-{uid}"), uid: uid.into() }
}

#[test]
fn fail_claim_fails_only_the_claims_it_names_and_only_per_claim() {
    let calls = Calls::new();
    let id = calls.start_call(PREPARE_V1, [claim("a"), claim("b")].concat(), None);
    let guard = calls.fail_claim(Method::NodePrepareResources.for_claim_uid("a"), "disk full");
    // A per-claim fault never fails the whole call, nor delays it.
    assert!(calls.take_failure(PREPARE_V1, &claim("a")).is_none());
    assert_eq!(calls.admission(PREPARE_V1, &claim("a")).delay, Duration::ZERO);
    assert_eq!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("a")).as_deref(), Some("disk full"));
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("b")).is_none());
    assert!(
        calls.take_claim_failure(id, DraApi::V1.unprepare().name(), &claim_ref("a")).is_none(),
        "another method"
    );
    // Until cleared: every answer for the claim.
    assert!(calls.take_claim_failure(id, PREPARE_V1BETA1, &claim_ref("a")).is_some());
    guard.clear();
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("a")).is_none());
    // A whole-call fault is not a per-claim one either.
    let whole = calls.fail(Method::NodePrepareResources, tonic::Status::unknown("injected error"));
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("a")).is_none());
    drop(whole);
}

#[test]
fn fail_claim_next_counts_claim_answers_and_goes_with_its_guard_or_clear_all() {
    let calls = Calls::new();
    let id = calls.start_call(PREPARE_V1, [claim("a"), claim("b")].concat(), None);
    // Without a claim in the filter: every claim of a matching call, n answers in all.
    let any = calls.fail_claim_next(Method::NodePrepareResources, 3, "x");
    for uid in ["a", "b", "a"] {
        assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref(uid)).is_some(), "{uid}");
    }
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("b")).is_none());
    drop(any);
    let nothing = calls.fail_claim_next(Method::NodePrepareResources, 0, "x");
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("a")).is_none());
    drop(nothing);
    let dropped = calls.fail_claim_next(Method::NodePrepareResources, 5, "x");
    drop(dropped);
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("a")).is_none());
    let cleared = calls.fail_claim(Method::NodePrepareResources.for_claim_name("claim-b"), "x");
    calls.clear_all();
    assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("b")).is_none());
    drop(cleared);
}

#[test]
fn injected_claim_errors_are_recorded_per_claim() {
    let calls = Calls::named("node n1");
    let _failing = calls.fail_claim_next(Method::NodePrepareResources.for_claim_uid("a"), 1, "disk full");
    let answer = |a: &str| {
        serde_json::json!({"claims": {
            "a": {"devices": [], "error": a},
            "b": {"devices": [], "error": ""},
        }})
    };
    for _ in 0..2 {
        let id = calls.start_call(PREPARE_V1, [claim("a"), claim("b")].concat(), None);
        let error = calls.take_claim_failure(id, PREPARE_V1, &claim_ref("a")).unwrap_or_default();
        assert!(calls.take_claim_failure(id, PREPARE_V1, &claim_ref("b")).is_none());
        calls.update_call(id, |r| r.response = Some(answer(&error)));
        calls.finish_call(id, ok(), false);
    }
    let log = calls.log();
    assert_eq!(log.records[0].injected_claims, ["a"]);
    assert!(log.records[1].injected_claims.is_empty());
    assert_eq!(
        (log.succeeded(Method::NodePrepareResources), log.injected(Method::NodePrepareResources)),
        (2, 0)
    );
    assert!(log.to_string().contains("-> OK"), "{log}");
    assert!(log.to_string().contains("[injected for claim UID(s) a]"), "{log}");

    let a = calls.claim("a");
    assert_eq!((a.prepare_failures(), a.prepared()), (1, 1));
    assert!(a.calls[0].injected && !a.calls[1].injected);
    assert_eq!(a.calls[0].outcome, ClaimOutcome::ClaimFailed("disk full".into()));
    assert_eq!(
        a.to_string(),
        "#1 NodePrepareResources -> failed for the claim (disk full) [injected]; #2 NodePrepareResources -> OK"
    );
    let b = calls.claim("b");
    assert_eq!((b.prepare_failures(), b.prepared()), (0, 2));
    assert!(b.calls.iter().all(|c| !c.injected), "{b}");
}
