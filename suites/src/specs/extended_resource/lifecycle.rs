//! The specs about what happens around a pod with extended resources: its claim goes away when
//! the pod completes or fails, devices are not overcommitted, an invalid name is rejected, the
//! claim status maps containers to requests, a request of zero needs no claim, and a pod waits
//! for the class that backs its resource.

use std::time::Duration;

use anyhow::Context as _;
use harness::{
    builder::{BuilderError, allocation_results, extended_resource_claim_name, phase},
    calls::{Method, UNPREPARE_TIMEOUT},
    framework::{Ctx, SpecResult},
    wait::{self, Verdict},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt as _, api::ListParams};

use super::{
    super::kubelet::checks::{self, POD_START_TIMEOUT, claims},
    container_name, expect_extended, first_container, quantities, set_resources, setup,
};

/// How long the claim may take to show up in the pod status, and to go away after the pod
/// terminated (upstream: 1 minute each).
const CLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// "must cleanup extended resource claims when pods complete".
pub async fn cleanup_complete(ctx: Ctx) -> SpecResult {
    cleanup(
        ctx,
        "echo 'Pod started with extended resource'; sleep 2; echo 'Pod completed successfully'",
        false,
    )
    .await
}

/// "must cleanup extended resource claims when pods fail".
pub async fn cleanup_fail(ctx: Ctx) -> SpecResult {
    cleanup(ctx, "echo 'Pod started with extended resource'; sleep 2; echo 'Pod failing now'; exit 1", true)
        .await
}

/// Upstream's `runExtendedClaimCleanup`: a pod with one device of an extended resource runs
/// `script` and terminates (fails when `fails`); the claim the scheduler made for it must be
/// deleted. Beyond upstream: the kubelet prepared the claim, the container ended with the
/// script's exit code, and the kubelet unprepared the claim.
async fn cleanup(ctx: Ctx, script: &str, fails: bool) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("cleanup");
    let class = b.class_with_extended_resource(&resource);
    let mut pod = b.pod();
    let c = first_container(&mut pod)?;
    set_resources(c, &quantities(&[(resource.as_str(), "1")]));
    c.command = Some(vec!["/bin/sh".to_owned()]);
    c.args = Some(vec!["-c".to_owned(), script.to_owned()]);
    b.create_class(&class).await?;
    b.create_pod(&pod).await?;
    b.wait_running(&pod).await?;

    let named = b
        .wait_pod(&pod, "to name its extended resource claim", CLAIM_TIMEOUT, |p| {
            Verdict::done_if(extended_resource_claim_name(p).is_some())
        })
        .await?;
    let claim = b.extended_resource_claim(&named).await?.context("the pod status names no claim")?;
    let (claim_name, uid) = (claim.name_any(), claim.uid().unwrap_or_default());
    expect!(!allocation_results(&claim).is_empty(), "extended resource claim {claim_name} is not allocated");

    let terminated = if fails {
        b.wait_pod(&pod, "to fail", POD_START_TIMEOUT, |p| match phase(p) {
            "Failed" => Verdict::Done,
            "Succeeded" => Verdict::Fail("the pod succeeded".to_owned()),
            _ => Verdict::Pending,
        })
        .await?
    } else {
        checks::wait_succeeded(&b, &pod).await?
    };
    let exit = terminated
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(|s| s.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    let want = if fails { 1 } else { 0 };
    expect!(exit == Some(want), "the container should have exited with {want}, got {exit:?}");

    let what = format!("extended resource claim {claim_name} to be deleted after the pod terminated");
    wait::gone(&claims(&ctx), &claim_name, what, CLAIM_TIMEOUT).await?;
    let calls = driver.calls(&node);
    let history = calls.claim(&uid);
    expect!(history.prepared() >= 1, "the kubelet never prepared claim {claim_name}: {history}");
    calls.wait_unprepared(&uid, UNPREPARE_TIMEOUT).await?;
    Ok(())
}

/// "must prevent overcommitment of extended resources": a pod takes all ten devices, a second
/// one stays unschedulable until the first is gone. Beyond upstream: the first pod's claim has
/// all ten devices and is unprepared before the second pod runs.
pub async fn overcommitment(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("overcommitment");
    let class = b.class_with_extended_resource(&resource);
    let res = quantities(&[(resource.as_str(), "10")]);
    let mut pod1 = b.pod();
    set_resources(first_container(&mut pod1)?, &res);
    b.create_class(&class).await?;
    b.create_pod(&pod1).await?;
    let running = b.wait_running(&pod1).await?;
    let container = container_name(&running, 0)?;
    let claim1 = expect_extended(&b, &running, &[(&container, &["container_0_request_0"])]).await?;
    let devices = allocation_results(&claim1).len();
    expect!(devices == 10, "the first pod's claim should have all 10 devices, it has {devices}");

    let mut pod2 = b.pod();
    set_resources(first_container(&mut pod2)?, &res);
    b.create_pod(&pod2).await?;
    b.wait_unschedulable(&pod2).await?;

    b.delete_pod_and_wait(&pod1).await?;
    driver.calls(&node).wait_unprepared(&claim1.uid().unwrap_or_default(), UNPREPARE_TIMEOUT).await?;
    let running = b.wait_running(&pod2).await?;
    let claim2 = expect_extended(&b, &running, &[(&container, &["container_0_request_0"])]).await?;
    expect!(claim2.uid() != claim1.uid(), "the second pod got the first pod's claim {}", claim1.name_any());
    Ok(())
}

/// "must reject pod with invalid extended resource name": the API server refuses the pod as
/// invalid (beyond upstream: naming the resource).
pub async fn invalid_name(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let mut pod = b.pod();
    set_resources(first_container(&mut pod)?, &quantities(&[("invalid_resource_name", "1")]));
    match b.create_pod(&pod).await {
        Ok(_) => fail!("the API server accepted pod {} with resource invalid_resource_name", pod.name_any()),
        Err(BuilderError::Api { source: kube::Error::Api(s), .. })
            if s.code == 422 && s.reason == "Invalid" =>
        {
            expect!(
                s.message.contains("invalid_resource_name"),
                "the rejection should name the resource: {}",
                s.message
            );
        }
        Err(e) => fail!("expected the pod to be rejected as Invalid (422), got: {e}"),
    }
    Ok(())
}

/// "must accurately populate ExtendedResourceClaimStatus": two devices of one resource and one
/// of another; the status maps both to requests `container-0-request-<i>` of the container.
/// Beyond upstream: each mapped request exists in the claim for the resource's class with the
/// requested count, and got that many devices.
pub async fn claim_status(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let resources = [b.extended_resource_name("claimstatus0"), b.extended_resource_name("claimstatus1")];
    let counts = [2u64, 1];
    let mut pod = b.pod();
    let res = quantities(&[(resources[0].as_str(), "2"), (resources[1].as_str(), "1")]);
    set_resources(first_container(&mut pod)?, &res);
    let classes =
        [b.class_with_extended_resource(&resources[0]), b.class_with_extended_resource(&resources[1])];
    for class in &classes {
        b.create_class(class).await?;
    }
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    let container = container_name(&running, 0)?;
    let claim =
        expect_extended(&b, &running, &[(&container, &["container_0_request_0", "container_0_request_1"])])
            .await?;

    let status = running
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .context("the pod status has no extendedResourceClaimStatus")?;
    expect!(!status.resource_claim_name.is_empty(), "extendedResourceClaimStatus names no claim");
    let mappings = &status.request_mappings;
    expect!(mappings.len() == res.len(), "expected {} request mappings, got {mappings:?}", res.len());
    let requests = claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.clone());
    let requests = requests.unwrap_or_default();
    for (i, m) in mappings.iter().enumerate() {
        expect!(
            m.container_name == container,
            "mapping {i} names container {}, not {container}",
            m.container_name
        );
        let Some(r) = resources.iter().position(|r| *r == m.resource_name) else {
            fail!("mapping {i} names resource {}, which the pod does not request", m.resource_name);
        };
        let want = format!("container-0-request-{i}");
        expect!(m.request_name == want, "mapping {i} names request {}, expected {want}", m.request_name);
        let Some(exactly) =
            requests.iter().find(|q| q.name == m.request_name).and_then(|q| q.exactly.as_ref())
        else {
            fail!("claim {} has no exact request {}", claim.name_any(), m.request_name);
        };
        let class = classes[r].name_any();
        let count = exactly.count.and_then(|c| u64::try_from(c).ok());
        expect!(
            exactly.device_class_name == class && count == Some(counts[r]),
            "request {} should ask for {} devices of class {class}, it asks for {count:?} of {}",
            m.request_name,
            counts[r],
            exactly.device_class_name
        );
        let got = allocation_results(&claim).iter().filter(|a| a.request == m.request_name).count();
        expect!(
            got as u64 == counts[r],
            "request {} got {got} devices, expected {}",
            m.request_name,
            counts[r]
        );
    }
    Ok(())
}

/// "must run a pod with extended resource requesting zero": the pod runs without a claim.
/// Beyond upstream: no claim exists in the namespace and the kubelet of the driver's node was
/// not asked to prepare anything (the pod itself may run on any node).
pub async fn zero(ctx: Ctx) -> SpecResult {
    let (driver, b, node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("zero");
    b.create_class(&b.class_with_extended_resource(&resource)).await?;
    let mut pod = b.pod();
    set_resources(first_container(&mut pod)?, &quantities(&[(resource.as_str(), "0")]));
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    let status = running.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    expect!(status.is_none(), "a request of zero should need no claim, the pod status has {status:?}");
    let list = claims(&ctx).list(&ListParams::default()).await.context("list ResourceClaims")?;
    let names: Vec<String> = list.items.iter().map(|c| c.name_any()).collect();
    expect!(names.is_empty(), "no claim should exist, found {names:?}");
    driver.calls(&node).expect_none(Method::NodePrepareResources).context("the pod has no claim")?;
    Ok(())
}

/// "must process extended resource after Device Class creation": unschedulable without the
/// class, runs once it exists.
pub async fn class_later(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("after-device-class-creation");
    let mut pod: Pod = b.pod();
    set_resources(first_container(&mut pod)?, &quantities(&[(resource.as_str(), "1")]));
    b.create_pod(&pod).await?;
    b.wait_unschedulable(&pod).await.context("pod should be unschedulable before device class creation")?;
    b.create_class(&b.class_with_extended_resource(&resource)).await?;
    let running = b.wait_running(&pod).await?;
    let container = container_name(&running, 0)?;
    expect_extended(&b, &running, &[(&container, &["container_0_request_0"])]).await?;
    Ok(())
}
