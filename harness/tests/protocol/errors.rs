//! Bad input and failure paths: the errors upstream returns, never a panic.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::sync::{Arc, atomic::Ordering};

use crate::common::*;
use harness::{
    calls::Method,
    grpc::{dra_v1, registration},
    plugin::{KubeletPlugin, Listener, MemoryClaims, NoClaims, PluginConfig, PluginError, PluginListeners},
};
use rstest::rstest;
use tonic::Code;

fn claims() -> MemoryClaims {
    let claims = MemoryClaims::new();
    claims.insert(allocated_claim("good", "uid-good", &[("r", "device-00")]));
    claims.insert(claim_with("unallocated", "uid-u", None));
    claims
}

#[rstest]
#[case::empty_name(
    "",
    "uid-good",
    "get resource claims: retrieve claim dra-test/: resource name may not be empty"
)]
#[case::empty_uid("good", "", "get resource claims: claim dra-test/good got replaced")]
#[case::unknown(
    "missing",
    "uid-m",
    "get resource claims: retrieve claim dra-test/missing: resourceclaims.resource.k8s.io \"missing\" not found"
)]
#[case::unallocated("unallocated", "uid-u", "get resource claims: claim dra-test/unallocated not allocated")]
#[case::uid_mismatch("good", "uid-old", "get resource claims: claim dra-test/good got replaced")]
#[tokio::test]
async fn prepare_rejects_bad_claims(
    #[case] name: &str,
    #[case] uid: &str,
    #[case] message: &str,
    #[values("v1.DRAPlugin", "v1beta1.DRAPlugin")] service: &str,
) {
    let t = TestPlugin::start(Arc::new(claims()), Arc::new(CountingFiles::default()), |c| c).await;
    let dra = DraClient::connect(&t.dra_socket, service).await;
    // A good claim first: the whole call fails anyway.
    let err = within("prepare", dra.prepare(&[claim_ref("good", "uid-good"), claim_ref(name, uid)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unknown);
    assert_eq!(err.message(), message);
    assert!(t.plugin.prepared_claims().is_empty());
    let log = t.plugin.calls().log();
    assert_eq!(log.count(Method::NodePrepareResources.failed()), 1, "{log}");
    assert_eq!(log.count(Method::NodePrepareResources.injected()), 0, "{log}");
    t.plugin.stop().await;
}

#[tokio::test]
async fn without_kubeconfig_prepare_fails_clearly_and_the_rest_works() {
    let t = TestPlugin::start(Arc::new(NoClaims), Arc::new(CountingFiles::default()), |c| c).await;
    let registered = register_like_kubelet(&t.reg_socket).await;
    let dra = DraClient::connect(&t.dra_socket, &registered.chosen).await;
    let err = within("prepare", dra.prepare(&[claim_ref("c", "uid-c")])).await.unwrap_err();
    assert_eq!(err.code(), Code::Unknown);
    assert!(err.message().contains("no kubeconfig: cannot read ResourceClaims"), "{}", err.message());
    let unprepared = within("unprepare", dra.unprepare(&[claim_ref("c", "uid-c")])).await.unwrap();
    assert_eq!(unprepared["uid-c"], "");
    t.plugin.stop().await;
}

#[tokio::test]
async fn per_claim_errors_go_into_the_claim_result() {
    let memory = claims();
    memory.insert(claim_with(
        "bad-params",
        "uid-bad",
        Some(allocation(
            &[("r", "device-01")],
            vec![opaque(DRIVER, "FromClaim", serde_json::json!({"a": 1}))],
        )),
    ));
    let files = Arc::new(CountingFiles::default());
    let t = TestPlugin::start(Arc::new(memory), files.clone(), |c| c).await;
    let dra = DraClient::connect(&t.dra_socket, "v1.DRAPlugin").await;
    let result =
        within("prepare", dra.prepare(&[claim_ref("good", "uid-good"), claim_ref("bad-params", "uid-bad")]))
            .await
            .unwrap();
    assert!(result["uid-good"].is_ok());
    let err = result["uid-bad"].clone().unwrap_err();
    assert!(err.starts_with("parameters in config #0: decoding user parameters: "), "{err}");

    // A failing write: per-claim error, no temporary file left behind.
    files.fail_writes.store(true, Ordering::SeqCst);
    t.plugin.calls().reset();
    let result = within("prepare", dra.prepare(&[claim_ref("good", "uid-good")])).await.unwrap();
    // Already prepared: cached, no write attempted.
    assert!(result["uid-good"].is_ok());
    let unprepared = within("unprepare", dra.unprepare(&[claim_ref("good", "uid-good")])).await.unwrap();
    assert_eq!(unprepared["uid-good"], "");
    let result = within("prepare", dra.prepare(&[claim_ref("good", "uid-good")])).await.unwrap();
    let err = result["uid-good"].clone().unwrap_err();
    assert!(err.starts_with("failed to write CDI file: write "), "{err}");
    assert!(err.contains("disk full (injected by test)"), "{err}");
    let file = t.cdi_file("uid-good", "r");
    assert!(!file.exists());
    assert!(!harness::plugin::tmp_path(&file).exists());
    assert!(t.plugin.prepared_claims().is_empty());
    t.plugin.stop().await;
}

#[tokio::test]
async fn unknown_methods_are_unimplemented() {
    let t =
        TestPlugin::start(Arc::new(claims()), Arc::new(CountingFiles::default()), |c| c.dra_v1beta1(false))
            .await;
    let unary = |socket: std::path::PathBuf, path: &'static str| async move {
        let mut grpc = tonic::client::Grpc::new(unix_channel(&socket).await);
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<
            dra_v1::NodePrepareResourcesRequest,
            dra_v1::NodePrepareResourcesResponse,
        >::default();
        grpc.unary(
            tonic::Request::new(dra_v1::NodePrepareResourcesRequest { claims: vec![] }),
            http::uri::PathAndQuery::from_static(path),
            codec,
        )
        .await
    };
    for (socket, path) in [
        (&t.dra_socket, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeFrobnicate"),
        // v1beta1 is switched off.
        (&t.dra_socket, "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"),
        // DRA methods are not on the registration server.
        (&t.reg_socket, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"),
        (&t.reg_socket, "/no.such.Service/Method"),
    ] {
        let err = within(path, unary(socket.clone(), path)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented, "{path}: {err}");
    }
    let log = t.plugin.calls().log();
    assert_eq!(log.records.len(), 4, "{log}");
    assert!(
        log.records.iter().all(|r| r.status.as_ref().is_some_and(|s| s.code == Code::Unimplemented)),
        "{log}"
    );
    // The server still works.
    let registered = register_like_kubelet(&t.reg_socket).await;
    assert_eq!(registered.chosen, "v1.DRAPlugin");
    assert_eq!(
        registered.info.supported_versions,
        ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    );
    t.plugin.stop().await;
}

#[tokio::test]
async fn failed_registration_is_an_error_and_recorded() {
    let t = TestPlugin::start(Arc::new(claims()), Arc::new(CountingFiles::default()), |c| c).await;
    let mut client =
        registration::registration_client::RegistrationClient::new(unix_channel(&t.reg_socket).await);
    let err = within(
        "NotifyRegistrationStatus",
        client.notify_registration_status(registration::RegistrationStatus {
            plugin_registered: false,
            error: "no handler for plugin type".into(),
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Unknown);
    assert_eq!(err.message(), "failed registration process: no handler for plugin type");
    assert!(!t.plugin.is_registered());
    let status = t.plugin.registration_status().unwrap();
    assert_eq!(status.error, "no handler for plugin type");
    let err = t.plugin.wait_registered(std::time::Duration::from_millis(50)).await.unwrap_err();
    assert!(err.to_string().contains("no handler for plugin type"), "{err}");
    t.plugin.stop().await;
}

#[tokio::test]
async fn stale_socket_files_are_replaced() {
    let p = paths();
    // Leftovers of a previous run: a socket nobody listens on and a plain file.
    drop(std::os::unix::net::UnixListener::bind(&p.reg_socket).unwrap());
    std::fs::write(&p.dra_socket, b"stale").unwrap();
    assert!(p.reg_socket.exists() && p.dra_socket.exists());
    let plugin = KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir))
        .start(PluginListeners {
            registration: Listener::unix(&p.reg_socket),
            dra: Listener::unix(&p.dra_socket),
        })
        .await
        .unwrap();
    let registered = register_like_kubelet(&p.reg_socket).await;
    assert_eq!(registered.info.endpoint, p.dra_socket.display().to_string());
    // The DRA socket answers too (no kubeconfig: prepare fails, but it is served).
    let dra = DraClient::connect(&p.dra_socket, &registered.chosen).await;
    let result = within("unprepare", dra.unprepare(&[claim_ref("c", "uid")])).await.unwrap();
    assert_eq!(result["uid"], "");
    plugin.stop().await;
    assert!(!p.reg_socket.exists());
    assert!(!p.dra_socket.exists());
}

#[tokio::test]
async fn invalid_configurations_are_rejected() {
    let p = paths();
    let err =
        KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir).dra_v1(false).dra_v1beta1(false))
            .start(PluginListeners {
                registration: Listener::unix(&p.reg_socket),
                dra: Listener::unix(&p.dra_socket),
            })
            .await
            .unwrap_err();
    assert!(matches!(err, PluginError::NoDraVersion), "{err}");

    let (_tx, dra) = Listener::channel(1);
    let err = KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir))
        .start(PluginListeners { registration: Listener::unix(&p.reg_socket), dra })
        .await
        .unwrap_err();
    assert!(matches!(err, PluginError::NoDraEndpoint), "{err}");

    // A directory where the socket should be.
    std::fs::create_dir(&p.reg_socket).unwrap();
    let err = KubeletPlugin::builder(PluginConfig::new(DRIVER, NODE, &p.cdi_dir))
        .start(PluginListeners {
            registration: Listener::unix(&p.reg_socket),
            dra: Listener::unix(&p.dra_socket),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, PluginError::Listen { server: "registration", .. }), "{err}");
    // The DRA server that had started is gone with its socket.
    assert!(!p.dra_socket.exists());
}
