//! The run's client (`KubeBackend::connect`, with the run identity's stamping, as a run builds
//! it) when its connection breaks in the middle of a request: a proxy ([`support::cut_proxy`])
//! closes the connection before forwarding a request, or after the API server
//! ([`support::fake_api`]) did it. Each write must end done exactly once, with the caller seeing
//! what it would have seen without the cut.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;
use spec_runner::{ClusterBackend as _, KubeBackend};
use support::{
    cut_proxy::{Cut, CutProxy},
    fake_api::FakeApi,
};

/// Upper bound of every request here (the client's own budget is 60 s).
const TIMEOUT: Duration = Duration::from_secs(30);

/// The fake API, the proxy in front of it, and ConfigMaps through the run's client of the proxy.
struct Setup {
    fake: FakeApi,
    proxy: CutProxy,
    api: Api<ConfigMap>,
    client: kube::Client,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let fake = FakeApi::default();
    let proxy = CutProxy::start(fake.client()).await;
    let dir = tempfile::tempdir().unwrap();
    let backend = KubeBackend::connect(Some(&proxy.kubeconfig(dir.path()))).await.unwrap();
    let backend = backend.with_run_identity("run-1");
    let client = backend.client();
    let api = Api::namespaced(client.clone(), "fake");
    // The client resends only once it has had an answer.
    assert!(api.get_opt("none").await.unwrap().is_none());
    Setup { fake, proxy, api, client, _dir: dir }
}

fn config_map(name: Option<&str>, generate_name: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: name.map(str::to_owned),
            generate_name: generate_name.map(str::to_owned),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..ConfigMap::default()
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, future).await.unwrap_or_else(|_| panic!("{what} took over {TIMEOUT:?}"))
}

#[tokio::test]
async fn a_named_create_is_done_once_wherever_its_connection_breaks() {
    for cut in [Cut::BeforeForwarding, Cut::AfterForwarding] {
        let s = setup().await;
        s.proxy.cut_next(Method::POST, cut);
        let created =
            within("the create", s.api.create(&PostParams::default(), &config_map(Some("c"), None)))
                .await
                .unwrap_or_else(|e| panic!("{cut:?}: {e}"));
        assert_eq!(s.proxy.cut().len(), 1, "{cut:?}: the proxy cut the create");
        let objects = s.fake.objects();
        assert_eq!(objects.len(), 1, "{cut:?}: {objects:?}");
        assert_eq!(created.metadata.uid.as_deref(), objects["c"]["metadata"]["uid"].as_str(), "{cut:?}");
        assert_eq!(created.data, Some([("k".to_owned(), "v".to_owned())].into()));
        assert_eq!(s.proxy.forwarded(&Method::POST).len(), 1, "{cut:?}: the API server got one create");
    }
}

#[tokio::test]
async fn a_create_with_a_generated_name_leaves_no_duplicate_wherever_its_connection_breaks() {
    for cut in [Cut::BeforeForwarding, Cut::AfterForwarding] {
        let s = setup().await;
        s.proxy.cut_next(Method::POST, cut);
        let created =
            within("the create", s.api.create(&PostParams::default(), &config_map(None, Some("g-"))))
                .await
                .unwrap_or_else(|e| panic!("{cut:?}: {e}"));
        let objects = s.fake.objects();
        assert_eq!(objects.len(), 1, "{cut:?}: one object, not a second one with another name: {objects:?}");
        let name = created.metadata.name.unwrap();
        assert!(name.starts_with("g-") && objects.contains_key(&name), "{cut:?}: {name} {objects:?}");
        assert_eq!(created.metadata.uid.as_deref(), objects[&name]["metadata"]["uid"].as_str());
        assert_eq!(objects[&name]["metadata"]["labels"]["dra-e2e.k8s.io/run"], "run-1", "still stamped");
    }
}

#[tokio::test]
async fn a_create_of_a_name_someone_else_took_stays_refused() {
    let s = setup().await;
    s.fake.put(json!({"metadata": {"name": "c"}, "data": {"theirs": "1"}}));
    s.proxy.cut_next(Method::POST, Cut::AfterForwarding);
    let error = within("the create", s.api.create(&PostParams::default(), &config_map(Some("c"), None)))
        .await
        .expect_err("the name is taken");
    assert!(matches!(&error, kube::Error::Api(status) if status.code == 409), "{error}");
    assert_eq!(s.fake.objects()["c"]["data"], json!({"theirs": "1"}), "their object is left as it was");
}

#[tokio::test]
async fn an_update_is_done_once_and_a_lost_race_stays_a_conflict() {
    let s = setup().await;
    let created = s.api.create(&PostParams::default(), &config_map(Some("c"), None)).await.unwrap();
    let mut update = created.clone();
    update.data = Some([("k".to_owned(), "new".to_owned())].into());
    s.proxy.cut_next(Method::PUT, Cut::AfterForwarding);
    let updated = within("the update", s.api.replace("c", &PostParams::default(), &update)).await.unwrap();
    assert_eq!(updated.data, update.data);
    assert_eq!(s.fake.objects()["c"]["data"], json!({"k": "new"}));

    // Written from the stale object: someone else's write is in between.
    let mut stale = created;
    stale.data = Some([("k".to_owned(), "stale".to_owned())].into());
    s.proxy.cut_next(Method::PUT, Cut::AfterForwarding);
    let error =
        within("the update", s.api.replace("c", &PostParams::default(), &stale)).await.expect_err("stale");
    assert!(matches!(&error, kube::Error::Api(status) if status.code == 409), "{error}");
    assert_eq!(s.fake.objects()["c"]["data"], json!({"k": "new"}));
}

#[tokio::test]
async fn a_delete_whose_answer_was_lost_is_done() {
    let s = setup().await;
    s.api.create(&PostParams::default(), &config_map(Some("c"), None)).await.unwrap();
    s.proxy.cut_next(Method::DELETE, Cut::AfterForwarding);
    within("the delete", s.api.delete("c", &DeleteParams::default())).await.unwrap();
    assert!(s.fake.objects().is_empty());
    assert_eq!(s.proxy.forwarded(&Method::DELETE).len(), 2, "sent again, answered 404");
}

#[tokio::test]
async fn patches_are_sent_again_only_when_twice_is_once() {
    let s = setup().await;
    s.api.create(&PostParams::default(), &config_map(Some("c"), None)).await.unwrap();
    s.proxy.cut_next(Method::PATCH, Cut::AfterForwarding);
    let merge = Patch::Merge(json!({"data": {"m": "1"}}));
    let patched = within("the patch", s.api.patch("c", &PatchParams::default(), &merge)).await.unwrap();
    assert_eq!(patched.data.unwrap()["m"], "1");
    assert_eq!(s.proxy.forwarded(&Method::PATCH).len(), 2);

    // A test-and-set: done twice, its test fails; the broken connection is the caller's.
    let test_and_set = json!([
        {"op": "test", "path": "/data/m", "value": "1"},
        {"op": "replace", "path": "/data/m", "value": "2"},
    ]);
    let request = http::Request::patch(format!("{}/c", support::fake_api::CONFIGMAPS))
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .body(kube::client::Body::from(serde_json::to_vec(&test_and_set).unwrap()))
        .unwrap();
    s.proxy.cut_next(Method::PATCH, Cut::AfterForwarding);
    let error = within("the patch", s.client.send(request)).await.expect_err("not sent again");
    assert!(!matches!(error, kube::Error::Api(_)), "{error}");
    assert_eq!(s.proxy.forwarded(&Method::PATCH).len(), 3, "sent once");
    assert_eq!(s.fake.objects()["c"]["data"]["m"], "2", "it was done");
}
