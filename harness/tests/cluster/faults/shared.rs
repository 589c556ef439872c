//! The proxy pod faults of `faults.rs` on the run's shared proxy pods: the shared pod of the
//! spec's node deleted before the kubelet prepares (every driver on it moves to the one
//! replacement, as its own identity bound to the new pod, and a driver started later runs there
//! too), while a NodePrepareResources is blocked, after the prepare and while an unprepare is
//! blocked; and a shared pod that is not replaced, whose spec fails at once and whose clean-up
//! still ends with nothing left.

use harness::builder::Builder;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;

use super::*;
use crate::driver::record_driver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_deleted_shared_proxy_pod_is_replaced_while_the_kubelet_prepares() {
    run_alone_and_check("shared proxy pod deleted", |ctx, c| proxy_pod_deleted_body(ctx, c, Proxies::Shared))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_shared_proxy_pod_lost_after_prepare_keeps_the_prepared_claims() {
    run_alone_and_check("shared proxy pod lost after prepare", |ctx, c| {
        lost_after_prepare_body(ctx, c, Proxies::Shared)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_shared_proxy_pod_lost_during_unprepare_lets_it_complete_after_the_move() {
    run_alone_and_check("shared proxy pod lost during unprepare", |ctx, c| {
        lost_during_unprepare_body(ctx, c, Proxies::Shared)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_shared_proxy_pod_without_replacement_fails_the_spec_at_once_and_its_cleanup_ends() {
    not_replaced(Proxies::Shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn every_driver_on_a_lost_shared_proxy_pod_moves_to_its_replacement() {
    run_alone_and_check("shared proxy pod lost before the prepare", lost_before_prepare_body).await;
}

/// The pod the identity of `driver`'s plugin on `node` names (SelfSubjectReview: name, UID).
async fn identity_pod(driver: &Driver, node: &str) -> anyhow::Result<(String, String)> {
    let client = driver.client(node).context("no plugin client")?.clone();
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let extra = review.status.and_then(|s| s.user_info).and_then(|u| u.extra).unwrap_or_default();
    let one = |key: &str| extra.get(key).and_then(|v| v.first()).cloned().unwrap_or_default();
    Ok((one("authentication.kubernetes.io/pod-name"), one("authentication.kubernetes.io/pod-uid")))
}

/// Runs a pod with a claim of the builder's driver and checks that its prepare went through
/// the replacement (calls from `first_call` on), then deletes it and waits until the claim is
/// unprepared.
async fn prepared_after_the_move(
    b: &Builder,
    driver: &Driver,
    node: &str,
    first_call: u64,
) -> anyhow::Result<()> {
    let (pod, template) = b.pod_inline();
    b.create_template(&template).await?;
    b.create_pod(&pod).await?;
    let running = b.test_pod(&pod, &[("admin_x", "y"), ("user_a", "b")]).await?;
    let claim = the_prepared_claim(driver, node)?;
    let log = driver.calls(node).log();
    let history = harness::calls::ClaimCalls::of(&log, &claim.uid);
    anyhow::ensure!(
        history.prepares().all(|c| c.id >= first_call),
        "claim {claim:?} of driver {} was prepared before the move (#{first_call}): {history}",
        driver.name()
    );
    b.delete_pod_and_wait(&running).await?;
    let uid = claim.uid.clone();
    let unprepared = move |log: &CallLog| !harness::calls::ClaimCalls::of(log, &uid).is_prepared();
    driver.calls(node).wait_for("the claim unprepared", unprepared, T).await?;
    anyhow::ensure!(
        driver.prepared_claims(node).is_empty(),
        "still prepared: {:?}",
        driver.prepared_claims(node)
    );
    Ok(())
}

async fn lost_before_prepare_body(ctx: Ctx, created: Created) -> SpecResult {
    record(&created, &ctx);
    let (first, node) = start_driver(&ctx, &created, Proxies::Shared).await?;
    let second = Driver::start(
        &ctx,
        first.nodes(),
        Proxies::Shared.config(resources::node_local(1)).name_suffix("-second"),
    )
    .await?;
    record_driver(&created, &ctx, &second);
    let lost = first.proxy_pod(&node).context("no proxy pod")?;
    assert_eq!(second.proxy_pod(&node).context("no proxy pod")?.uid(), lost.uid(), "one shared pod");

    // The shared pod goes before any pod asks for a claim: both plugins move to the one
    // replacement, and each acts as its own ServiceAccount bound to the replacement.
    let moved = lose_proxy_pod(&ctx, &first, &node, None).await?;
    let replacement = first.proxy_pod(&node).context("no replacement")?;
    let second_moved =
        harness::wait::poll("the second driver's plugin to move too", T, Duration::from_millis(50), || {
            let moves = second.proxy_moves(&node);
            async move {
                match moves.first() {
                    Some(moved) => Attempt::Done(moved.clone()),
                    None => Attempt::Retry("no move yet".to_owned()),
                }
            }
        })
        .await?;
    tracing::info!("{moved}; {second_moved}");
    assert_eq!(second_moved.to, moved.to, "both drivers move to the one replacement");
    assert_eq!(second.proxy_pod(&node).unwrap().uid(), replacement.uid());
    for driver in [&first, &second] {
        let identity = identity_pod(driver, &node).await?;
        assert_eq!(
            identity,
            (replacement.name_any(), replacement.uid().unwrap_or_default()),
            "{}",
            driver.name()
        );
    }
    for (driver, moved) in [(&first, &moved), (&second, &second_moved)] {
        let from = moved.first_call;
        driver
            .calls(&node)
            .wait_for("registration through the replacement", move |log| registered_since(log, from), T)
            .await?;
    }

    // A driver started now runs in the replacement at once.
    let third = Driver::start(
        &ctx,
        first.nodes(),
        Proxies::Shared.config(resources::node_local(1)).name_suffix("-third"),
    )
    .await?;
    record_driver(&created, &ctx, &third);
    assert_eq!(third.proxy_pod(&node).unwrap().uid(), replacement.uid());
    assert!(third.proxy_moves(&node).is_empty());

    // Each driver prepares and unprepares its claim through the replacement.
    for (driver, first_call) in [(&first, moved.first_call), (&second, second_moved.first_call), (&third, 0)]
    {
        let b = Builder::start(&ctx, driver, Some(json!({"x": "y"}))).await?;
        created.add("DeviceClass", b.class_name());
        prepared_after_the_move(&b, driver, &node, first_call).await?;
    }
    Ok(())
}
