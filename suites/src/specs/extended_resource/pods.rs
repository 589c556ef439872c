//! The specs that run one pod with extended resources backed by DRA: upstream's
//! `extendedResourceTest` (a pod with two init containers and a sidecar before the main
//! container), the quota spec built on the same pod, and the three-container variants.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use harness::{
    builder::Builder,
    framework::{Ctx, SpecResult},
    wait::{self, Verdict},
};
use k8s_openapi::{
    api::core::v1::{Container, Pod, ResourceQuota},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{Api, ResourceExt as _, api::PostParams};
use serde_json::json;

use super::{
    DEVICE_CLASS_PREFIX, container_name, containers_mut, expect_extended, first_container, quantities,
    set_resources, setup,
};

/// How long the quota controller may take to fill in the status (upstream: 1 minute; the usage
/// after the pods: gomega's default of 1 s is too tight for us, so the same minute).
const QUOTA_TIMEOUT: Duration = Duration::from_secs(60);

/// The name of the sidecar (restartable init container) of [`init_container_pod`].
fn sidecar_name(main: &str) -> String {
    format!("{main}-sidecar")
}

/// Upstream's pod of `extendedResourceTest`: the builder's pod with `res` on its container, and
/// three init containers copied from it: `-init` (with `res2`) running `init`, `-sidecar`
/// (restart policy Always, `res`) running `sidecar`, `-init-1` (`res`) running `init_1`.
fn init_container_pod(
    b: &Builder,
    res: &BTreeMap<String, Quantity>,
    res2: &BTreeMap<String, Quantity>,
    [init, sidecar, init_1]: [&str; 3],
) -> anyhow::Result<Pod> {
    let mut pod = b.pod();
    let main = first_container(&mut pod)?;
    set_resources(main, res);
    let copy = |suffix: &str, command: &str, res: &BTreeMap<String, Quantity>| -> Container {
        let mut c = main.clone();
        c.name.push_str(suffix);
        c.command = Some(vec!["sh".to_owned(), "-c".to_owned(), command.to_owned()]);
        set_resources(&mut c, res);
        c
    };
    let mut side = copy("-sidecar", sidecar, res);
    side.restart_policy = Some("Always".to_owned());
    let inits = vec![copy("-init", init, res2), side, copy("-init-1", init_1, res)];
    pod.spec.as_mut().context("pod without spec")?.init_containers = Some(inits);
    Ok(pod)
}

/// Upstream's `extendedResourceTest`: one device of each of `resources` for the main container,
/// the sidecar and the second init container, two of each for the first init container (which,
/// like the second, must find its env to succeed); the main container must have `env` (request
/// names of the claim, e.g. `container_3_request_0`). Beyond upstream: [`expect_extended`] on the
/// pod, and the sidecar has its request's env too.
async fn extended_resource_test(b: &Builder, resources: &[String], env: &[&str]) -> SpecResult {
    let one: Vec<(&str, &str)> = resources.iter().map(|r| (r.as_str(), "1")).collect();
    let two: Vec<(&str, &str)> = resources.iter().map(|r| (r.as_str(), "2")).collect();
    let pod = init_container_pod(
        b,
        &quantities(&one),
        &quantities(&two),
        [
            "env|grep container_1_request_0=true",
            // Upstream's loop, with the test pods' `trap exit TERM` (harness::builder::INFINITE_SLEEP):
            // the sidecar's shell, PID 1, would ignore SIGTERM and hold the pod's deletion for
            // its 30 s grace period. It sleeps in the background and waits, so that the trap
            // ends the sleep at once rather than after up to 5 s.
            "trap exit TERM; while true; do env; env|grep container_1_request_0=true; echo $?; sleep 5 & wait; done",
            "env|grep container_3_request_0=true",
        ],
    )?;
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    let main = container_name(&running, 0)?;
    let sidecar = sidecar_name(&main);
    expect_extended(b, &running, &[(&main, env), (&sidecar, &["container_1_request_0"])]).await?;
    Ok(())
}

/// The quota's status as `name -> quantity` strings, for comparison.
fn quota_map(map: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<String, String> {
    map.into_iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

/// Waits until the quota's status shows `hard` and `used`.
async fn wait_quota(
    api: &Api<ResourceQuota>,
    name: &str,
    hard: &BTreeMap<String, String>,
    used: &BTreeMap<String, String>,
    what: &str,
) -> anyhow::Result<()> {
    wait::existing(api, name, format!("ResourceQuota {name} {what}"), QUOTA_TIMEOUT, |q| {
        let status = q.status.as_ref();
        let h = quota_map(status.and_then(|s| s.hard.as_ref()));
        let u = quota_map(status.and_then(|s| s.used.as_ref()));
        Verdict::done_if(&h == hard && &u == used)
    })
    .await?;
    Ok(())
}

/// "must run a pod with extended resource with resource quota".
pub async fn quota(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("quota");
    let class = b.class_with_extended_resource(&resource);
    let class_name = class.name_any();
    let implicit = format!("{DEVICE_CLASS_PREFIX}{class_name}");
    let keys = [
        "count/resourceclaims.resource.k8s.io".to_owned(),
        format!("requests.{resource}"),
        format!("requests.{implicit}"),
        format!("{class_name}.deviceclass.resource.k8s.io/devices"),
    ];
    let hard: BTreeMap<String, String> = keys.iter().map(|k| (k.clone(), "10".to_owned())).collect();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": { "name": "test-quota", "namespace": ctx.namespace() },
        "spec": { "hard": hard },
    }))?;
    let api: Api<ResourceQuota> = Api::namespaced(ctx.client().clone(), ctx.namespace());
    api.create(&PostParams::default(), &quota).await.context("create ResourceQuota test-quota")?;
    ctx.delete_at_cleanup(api.clone(), "test-quota");

    // Creating pods before the quota controller initialized the status fails.
    let zero: BTreeMap<String, String> = keys.iter().map(|k| (k.clone(), "0".to_owned())).collect();
    wait_quota(&api, "test-quota", &hard, &zero, "to be initialized with zero usage").await?;

    b.create_class(&class).await?;
    let res = quantities(&[(resource.as_str(), "1"), (implicit.as_str(), "1")]);
    let pod = init_container_pod(
        &b,
        &res,
        &res,
        [
            "env|grep request_0=true",
            "env|grep container_1_request_0=true; sleep 1",
            "env|grep request_0=true",
        ],
    )?;
    b.create_pod(&pod).await?;
    let running = b.wait_running(&pod).await?;
    let main = container_name(&running, 0)?;
    expect_extended(&b, &running, &[(&main, &["container_3_request_0", "container_3_request_1"])]).await?;

    // A claim for the same class consumes the same extended resource.
    let mut claim = b.external_claim();
    let request = claim
        .spec
        .as_mut()
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
        .context("claim without an exact request")?;
    request.device_class_name = class_name.clone();
    let pod2 = b.pod_external(&claim.name_any());
    b.create_claim(&claim).await?;
    b.create_pod(&pod2).await?;
    b.test_pod(&pod2, &[]).await?;

    // Upstream's count: the external claim 1 device; the pod's sidecar and main container 1
    // each of both names (the other init containers reuse theirs); its claim 4 devices, 2 of
    // them not counted through the pod yet. 5 in all; 2 claims.
    let mut used: BTreeMap<String, String> = keys.iter().map(|k| (k.clone(), "5".to_owned())).collect();
    used.insert(keys[0].clone(), "2".to_owned());
    wait_quota(&api, "test-quota", &hard, &used, "to count 2 claims and 5 devices").await?;
    Ok(())
}

/// "... both implicit and explicit extended resource with one container two resources".
pub async fn implicit_and_explicit(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("one-container-two-resources");
    let mut class = b.class_with_extended_resource(&resource);
    // The implicit name's part after the `/` is the class name and must fit 63 bytes. Our
    // namespaces (`dra-<spec name part>-<suffix>`) are longer than upstream's `dra-<n>`, so
    // upstream's `<class>-one-container-two-resources` does not fit: a shorter class name.
    class.metadata.name = Some(format!("{}-two-resources", b.class_name()));
    let class = b.create_class(&class).await?;
    let implicit = format!("{DEVICE_CLASS_PREFIX}{}", class.name_any());
    extended_resource_test(&b, &[implicit, resource], &["container_3_request_0", "container_3_request_1"])
        .await
}

/// "... explicit extended resource with one container one resource".
pub async fn explicit_one(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let resource = b.extended_resource_name("one-container-one-resource");
    b.create_class(&b.class_with_extended_resource(&resource)).await?;
    extended_resource_test(&b, &[resource], &["container_3_request_0"]).await
}

/// "... implicit extended resource with one container one resource": the builder's default
/// class, which has no `extendedResourceName`.
pub async fn implicit_one(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let implicit = format!("{DEVICE_CLASS_PREFIX}{}", b.class_name());
    extended_resource_test(&b, &[implicit], &["container_3_request_0"]).await
}

/// "... explicit extended resource with one container three resources".
pub async fn explicit_three(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let prefix = b.extended_resource_name("one-container-three-resources");
    let resources: Vec<String> = (0..3).map(|i| format!("{prefix}{i}")).collect();
    for r in &resources {
        b.create_class(&b.class_with_extended_resource(r)).await?;
    }
    extended_resource_test(
        &b,
        &resources,
        &["container_3_request_0", "container_3_request_1", "container_3_request_2"],
    )
    .await
}

/// The builder's pod with three containers `container0..2`; container `i` gets one device of
/// each resource of `per_container[i]`.
async fn three_container_pod(b: &Builder, per_container: [&[String]; 3]) -> anyhow::Result<Pod> {
    let mut pod = b.pod();
    let containers = containers_mut(&mut pod)?;
    let first = containers.first().cloned().context("pod without container")?;
    containers.truncate(0);
    for (i, resources) in per_container.iter().enumerate() {
        let mut c = first.clone();
        c.name = format!("container{i}");
        let one: Vec<(&str, &str)> = resources.iter().map(|r| (r.as_str(), "1")).collect();
        set_resources(&mut c, &quantities(&one));
        containers.push(c);
    }
    for r in per_container.iter().flat_map(|r| r.iter()) {
        b.create_class(&b.class_with_extended_resource(r)).await?;
    }
    Ok(pod)
}

/// Runs the pod and checks that container `i` has `container_<i>_request_<j>` for each of its
/// `counts[i]` resources.
async fn run_three_containers(b: &Builder, pod: &Pod, counts: [usize; 3]) -> SpecResult {
    b.create_pod(pod).await?;
    let running = b.wait_running(pod).await?;
    let names: Vec<Vec<String>> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| (0..*n).map(|j| format!("container_{i}_request_{j}")).collect())
        .collect();
    let refs: Vec<Vec<&str>> = names.iter().map(|v| v.iter().map(String::as_str).collect()).collect();
    let containers: Vec<String> = (0..3).map(|i| format!("container{i}")).collect();
    let env: Vec<(&str, &[&str])> =
        containers.iter().zip(&refs).map(|(c, r)| (c.as_str(), r.as_slice())).collect();
    expect_extended(b, &running, &env).await?;
    Ok(())
}

/// "... explicit extended resource with three containers one resource each".
pub async fn three_containers_one_each(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let prefix = b.extended_resource_name("three-containers-one-resource-each");
    let r: Vec<String> = (0..3).map(|i| format!("{prefix}{i}")).collect();
    let pod = three_container_pod(&b, [&r[0..1], &r[1..2], &r[2..3]]).await?;
    run_three_containers(&b, &pod, [1, 1, 1]).await
}

/// "... explicit extended resource with three containers multiple resources each".
pub async fn three_containers_multiple_each(ctx: Ctx) -> SpecResult {
    let (_driver, b, _node) = setup(&ctx).await?;
    let prefix = b.extended_resource_name("three-containers-multiple-resources-each");
    let r: Vec<String> = (0..6).map(|i| format!("{prefix}{i}")).collect();
    let pod = three_container_pod(&b, [&r[0..1], &r[1..3], &r[3..6]]).await?;
    run_three_containers(&b, &pod, [1, 2, 3]).await
}
