//! Runs the built `dra-e2e kubelet-plugin` and talks to it like the kubelet, and as gRPC
//! clients of other stacks do (gRPC's C core, grpc-go with a passthrough target).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../kubelet-plugin/tests/clients/mod.rs"]
mod clients;

use std::{path::Path, process::Stdio, time::Duration};

use harness::grpc::{dra_v1, registration};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    net::UnixStream,
    process::Command,
};
use tonic::transport::{Channel, Endpoint};

const TIMEOUT: Duration = Duration::from_secs(20);
const DRIVER: &str = "cmd-test.dra-e2e.k8s.io";

async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {TIMEOUT:?} waiting for {what}"))
}

async fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}

/// A running `dra-e2e kubelet-plugin` and its sockets.
struct Running {
    _dir: tempfile::TempDir,
    child: tokio::process::Child,
    reg_socket: std::path::PathBuf,
    dra_socket: std::path::PathBuf,
}

impl Running {
    /// Ctrl-C: the process stops and removes its sockets.
    async fn stop(mut self) {
        let pid = self.child.id().expect("the plugin is running").to_string();
        let killed = Command::new("kill").args(["-INT", &pid]).status().await.unwrap();
        assert!(killed.success());
        let status = within("the plugin to exit", self.child.wait()).await.unwrap();
        assert!(status.success(), "{status}");
        assert!(!self.reg_socket.exists(), "registration socket left behind");
        assert!(!self.dra_socket.exists(), "DRA socket left behind");
    }
}

/// Starts `dra-e2e kubelet-plugin` without a kubeconfig and waits for its ready line.
async fn start() -> Running {
    let dir = tempfile::Builder::new().prefix("dra-cmd").tempdir().unwrap();
    let plugin_dir = dir.path().join("plugins").join(DRIVER);
    let registry_dir = dir.path().join("plugins_registry");
    let cdi_dir = dir.path().join("cdi");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dra-e2e"))
        .arg("kubelet-plugin")
        .args(["--driver-name", DRIVER, "--node-name", "node-1"])
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .arg("--registry-dir")
        .arg(&registry_dir)
        .arg("--cdi-dir")
        .arg(&cdi_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = within("the ready line", stdout.next_line()).await.unwrap().unwrap();
    assert!(ready.starts_with("kubelet plugin ready:"), "{ready}");

    Running {
        _dir: dir,
        child,
        reg_socket: registry_dir.join(format!("{DRIVER}-reg.sock")),
        dra_socket: plugin_dir.join("dra.sock"),
    }
}

#[tokio::test]
async fn kubelet_plugin_serves_get_info_and_stops_on_ctrl_c() {
    let running = start().await;
    let (reg_socket, dra_socket) = (&running.reg_socket, &running.dra_socket);
    let mut client = registration::registration_client::RegistrationClient::new(
        within("connecting", unix_channel(reg_socket)).await,
    );
    let mut request = tonic::Request::new(registration::InfoRequest {});
    request.set_timeout(Duration::from_secs(1));
    let info = within("GetInfo", client.get_info(request)).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, dra_socket.display().to_string());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    );

    // Without a kubeconfig prepare fails with a clear error.
    let mut dra =
        dra_v1::dra_plugin_client::DraPluginClient::new(within("connecting", unix_channel(dra_socket)).await);
    let err = within(
        "prepare",
        dra.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim { namespace: "ns".into(), uid: "uid".into(), name: "claim".into() }],
        }),
    )
    .await
    .unwrap_err();
    assert!(err.message().contains("no kubeconfig"), "{}", err.message());

    running.stop().await;
}

/// Every listener of the standalone plugin answers clients whose `:authority` h2 alone rejects.
#[rstest::rstest]
#[case::c_core(clients::Client::CCore)]
#[case::grpc_go_passthrough(clients::Client::GoPassthrough)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_plugin_answers_c_core_and_passthrough_clients(#[case] client: clients::Client) {
    use clients::Call;
    let running = start().await;
    let answers = client.run(&running.reg_socket, &[Call::GetInfo]).await;
    let info: registration::PluginInfo = answers[0].ok();
    assert_eq!(info.name, DRIVER);

    let claims = vec![("ns".to_owned(), "claim".to_owned(), "uid".to_owned())];
    let answers = client
        .run(
            &running.dra_socket,
            &[Call::PrepareV1(claims.clone()), Call::UnprepareV1(claims), Call::WatchV1],
        )
        .await;
    assert_eq!(answers[0].code, tonic::Code::Unknown);
    assert!(answers[0].message.contains("no kubeconfig"), "{}", answers[0].message);
    let unprepared: dra_v1::NodeUnprepareResourcesResponse = answers[1].ok();
    assert_eq!(unprepared.claims["uid"].error, "");
    let _: harness::grpc::health_v1::NodeWatchResourcesResponse = answers[2].ok();
    running.stop().await;
}
