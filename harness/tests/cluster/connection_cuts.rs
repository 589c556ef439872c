//! The run's client when its connection to the real API server breaks in the middle of a write
//! (as when the API server is killed): a proxy in front of the API server
//! (`spec-runner/tests/support/cut_proxy.rs`, upstream: the admin client) closes the connection
//! before forwarding a request, or after the API server answered it. Each create must end with
//! its object there exactly once and the caller seeing success; so must an update and a delete.
//! The clients are the run's (`KubeBackend::connect` of a kubeconfig of the proxy) and one
//! derived from it as the plugins' are (`Impersonation::client`).
//!
//! ```text
//! DRA_E2E_KUBECONFIG=/var/lib/dra-e2e/local/admin.kubeconfig \
//!     cargo test -p harness --test cluster -- --ignored connection_cuts::
//! ```
#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, ensure};
use harness::{
    driver::Impersonation,
    framework::{ClusterBackend as _, KubeBackend},
};
use http::Method;
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace},
    resource::v1::{DeviceClass, DeviceClassSpec},
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::run::kubeconfig;

#[path = "../../../spec-runner/tests/support/cut_proxy.rs"]
mod cut_proxy;

use cut_proxy::{Cut, CutProxy};

/// Bound of each write here (the run's client waits up to 60 s for an API server that went away).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The label of what this file creates, so each check counts only its own objects.
const CASE_LABEL: &str = "dra-e2e.k8s.io/cut-case";

/// The admin client, straight to the API server.
async fn admin() -> Client {
    let config = Kubeconfig::read_from(kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

/// The proxy in front of the API server, and the run's client of it (it has had its first
/// answer: it sends again only after one).
async fn through_proxy(admin: &Client, dir: &std::path::Path) -> (CutProxy, Client) {
    let proxy = CutProxy::start(admin.clone()).await;
    let backend = KubeBackend::connect(Some(&proxy.kubeconfig(dir))).await.unwrap();
    let client = backend.client();
    client.apiserver_version().await.unwrap();
    (proxy, client)
}

/// A namespace of this test, deleted after `checks` whatever they found.
async fn in_namespace<F: Future<Output = anyhow::Result<()>>>(
    admin: &Client,
    checks: impl FnOnce(String) -> F,
) {
    let namespaces = Api::<Namespace>::all(admin.clone());
    let namespace = Namespace {
        metadata: ObjectMeta { generate_name: Some("dra-e2e-cuts-".into()), ..ObjectMeta::default() },
        ..Namespace::default()
    };
    let name = namespaces.create(&PostParams::default(), &namespace).await.unwrap().name_any();
    let checked = checks(name.clone()).await;
    let _ = namespaces.delete(&name, &DeleteParams::background()).await;
    checked.unwrap();
}

fn labels(case: &str) -> Option<BTreeMap<String, String>> {
    Some([(CASE_LABEL.to_owned(), case.to_owned())].into())
}

fn config_map(name: Option<String>, generate_name: Option<&str>, case: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name,
            generate_name: generate_name.map(str::to_owned),
            labels: labels(case),
            ..ObjectMeta::default()
        },
        data: Some([("case".to_owned(), case.to_owned())].into()),
        ..ConfigMap::default()
    }
}

/// Creates `object` through `api` with the next POST cut at `cut`; checks that the caller saw
/// success, that the cut happened and that `case`'s objects are exactly the one created.
async fn create_cut<K>(proxy: &CutProxy, api: &Api<K>, object: &K, cut: Cut, case: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let cuts = proxy.cut().len();
    proxy.cut_next(Method::POST, cut);
    let created = tokio::time::timeout(WRITE_TIMEOUT, api.create(&PostParams::default(), object))
        .await
        .with_context(|| format!("{case}: the create took over {WRITE_TIMEOUT:?}"))?
        .with_context(|| format!("{case}: the create whose connection was cut {cut:?} failed"))?;
    ensure!(proxy.cut().len() == cuts + 1, "{case}: the proxy did not cut the create");
    let found = api.list(&ListParams::default().labels(&format!("{CASE_LABEL}={case}"))).await?.items;
    let uids: Vec<_> = found.iter().map(|o| o.meta().uid.clone()).collect();
    ensure!(uids == [created.meta().uid.clone()], "{case}: want exactly the created object, found {uids:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_create_whose_connection_breaks_is_done_exactly_once() {
    let admin = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (proxy, client) = through_proxy(&admin, dir.path()).await;
    // A plugin's client is derived from the run's client this way (as another user).
    let impersonated = Impersonation {
        user: "dra-e2e-cut-test".to_owned(),
        groups: vec!["system:masters".to_owned()],
        extra: BTreeMap::new(),
    }
    .client(&client)
    .unwrap();
    in_namespace(&admin, |ns| async move {
        let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
        for cut in [Cut::BeforeForwarding, Cut::AfterForwarding] {
            let named = format!("named-{cut:?}").to_lowercase();
            create_cut(&proxy, &api, &config_map(Some(named.clone()), None, &named), cut, &named).await?;
            let generated = format!("generated-{cut:?}").to_lowercase();
            create_cut(&proxy, &api, &config_map(None, Some("cut-"), &generated), cut, &generated).await?;
        }
        let api = Api::<ConfigMap>::namespaced(impersonated, &ns);
        let case = "impersonated";
        create_cut(&proxy, &api, &config_map(None, Some("cut-"), case), Cut::AfterForwarding, case).await?;
        let posts = proxy.forwarded(&Method::POST).len();
        ensure!(posts == 5, "the API server got one create per case, {posts} in all");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: run via cargo xtask test"]
async fn a_device_class_survives_cuts_of_its_create_update_and_delete() {
    let admin = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (proxy, client) = through_proxy(&admin, dir.path()).await;
    let name = format!("dra-e2e-cut-{}", std::process::id());
    let case = name.as_str();
    let class = DeviceClass {
        metadata: ObjectMeta { name: Some(name.clone()), labels: labels(case), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec::default()),
    };
    let api = Api::<DeviceClass>::all(client);
    let checked = async {
        create_cut(&proxy, &api, &class, Cut::AfterForwarding, case).await?;
        let mut update = api.get(&name).await?;
        update.metadata.annotations = Some([("updated".to_owned(), "yes".to_owned())].into());
        proxy.cut_next(Method::PUT, Cut::AfterForwarding);
        let updated =
            tokio::time::timeout(WRITE_TIMEOUT, api.replace(&name, &PostParams::default(), &update))
                .await
                .context("the update took too long")?
                .context("the update whose connection was cut after the answer failed")?;
        ensure!(updated.annotations().get("updated").map(String::as_str) == Some("yes"), "{updated:?}");
        proxy.cut_next(Method::DELETE, Cut::AfterForwarding);
        tokio::time::timeout(WRITE_TIMEOUT, api.delete(&name, &DeleteParams::default()))
            .await
            .context("the delete took too long")?
            .context("the delete whose connection was cut after the answer failed")?;
        ensure!(api.get_opt(&name).await?.is_none(), "the class is still there");
        ensure!(proxy.cut().len() == 3, "cuts: {:?}", proxy.cut());
        Ok::<_, anyhow::Error>(())
    };
    let checked = checked.await;
    let _ = Api::<DeviceClass>::all(admin).delete(&name, &DeleteParams::default()).await;
    checked.unwrap();
}
