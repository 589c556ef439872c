//! Two instances of one driver on one node at the same time (a rolling update): each has its own
//! sockets, named after its pod UID as upstream's helper names them, and both share one
//! `ClaimState`, so the kubelet may prepare a claim through one and unprepare it through the
//! other, and the two never work on the same claim at once.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{
    path::{Path, PathBuf},
    sync::{Arc, atomic::Ordering},
};

use crate::common::*;
use harness::{
    plugin::{
        ClaimSource, ClaimState, FileOps, KubeletPlugin, Listener, MemoryClaims, PluginConfig,
        PluginListeners,
    },
    proxied,
};
use tempfile::TempDir;

const OLD_UID: &str = "0a0a0a0a-1111-2222-3333-444444444444";
const NEW_UID: &str = "0b0b0b0b-5555-6666-7777-888888888888";

/// One instance: its plugin and socket paths.
struct Instance {
    plugin: KubeletPlugin,
    reg_socket: PathBuf,
    dra_socket: PathBuf,
}

/// `<dir>/plugins/<driver>`, `<dir>/plugins_registry` and `<dir>/cdi`, shared by both instances.
fn node_dirs() -> (TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("dra").tempdir().unwrap();
    for d in
        [dir.path().join("plugins").join(DRIVER), dir.path().join("plugins_registry"), dir.path().join("cdi")]
    {
        std::fs::create_dir_all(d).unwrap();
    }
    let cdi = dir.path().join("cdi");
    (dir, cdi)
}

async fn start_instance(
    root: &Path,
    uid: &str,
    claims: Arc<dyn ClaimSource>,
    files: Arc<dyn FileOps>,
    state: ClaimState,
) -> Instance {
    let config = PluginConfig::new(DRIVER, NODE, root.join("cdi"))
        .dra_endpoint(root.join("plugins").join(DRIVER).join("dra.sock").display().to_string())
        .rolling_update_uid(uid);
    let (dra, registration) = proxied::sockets(&config);
    let plugin = KubeletPlugin::builder(config.dra_endpoint(&dra))
        .claim_source(claims)
        .file_ops(files)
        .claim_state(state)
        .start(PluginListeners { registration: Listener::unix(&registration), dra: Listener::unix(&dra) })
        .await
        .unwrap();
    Instance { plugin, reg_socket: registration.into(), dra_socket: dra.into() }
}

fn cdi_file(cdi: &Path, uid: &str, request: &str) -> PathBuf {
    cdi.join(format!("{DRIVER}-{uid}-{request}.json"))
}

#[tokio::test]
async fn the_new_instance_unprepares_what_the_old_one_prepared() {
    let (dir, cdi) = node_dirs();
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("c", "uid-c", &[("r", "device-00")]));
    let claims: Arc<dyn ClaimSource> = Arc::new(memory);
    let files = Arc::new(CountingFiles::default());
    let state = ClaimState::default();
    let old = start_instance(dir.path(), OLD_UID, claims.clone(), files.clone(), state.clone()).await;
    let new = start_instance(dir.path(), NEW_UID, claims, files.clone(), state).await;

    // Separate sockets, each advertising its own DRA endpoint.
    assert_ne!(old.reg_socket, new.reg_socket);
    assert_ne!(old.dra_socket, new.dra_socket);
    assert!(old.dra_socket.ends_with(format!("dra-{OLD_UID}.sock")));
    assert!(new.reg_socket.display().to_string().contains(NEW_UID));
    let old_reg = register_like_kubelet(&old.reg_socket).await;
    let new_reg = register_like_kubelet(&new.reg_socket).await;
    assert_eq!(old_reg.info.endpoint, old.dra_socket.display().to_string());
    assert_eq!(new_reg.info.endpoint, new.dra_socket.display().to_string());

    let old_dra = DraClient::connect(&old.dra_socket, &old_reg.chosen).await;
    let new_dra = DraClient::connect(&new.dra_socket, &new_reg.chosen).await;
    let prepared = old_dra.prepare(&[claim_ref("c", "uid-c")]).await.unwrap();
    assert!(prepared["uid-c"].is_ok(), "{prepared:?}");
    assert!(cdi_file(&cdi, "uid-c", "r").exists());
    assert_eq!(new.plugin.prepared_claims(), old.plugin.prepared_claims());

    // Preparing again through the new instance is idempotent: nothing is rewritten.
    let again = new_dra.prepare(&[claim_ref("c", "uid-c")]).await.unwrap();
    assert_eq!(again["uid-c"], prepared["uid-c"]);
    assert_eq!(files.writes.load(Ordering::SeqCst), 1);

    // The old instance goes away; the new one unprepares and removes the CDI file.
    old.plugin.stop().await;
    let unprepared = new_dra.unprepare(&[claim_ref("c", "uid-c")]).await.unwrap();
    assert_eq!(unprepared["uid-c"], "");
    assert!(!cdi_file(&cdi, "uid-c", "r").exists());
    assert!(new.plugin.prepared_claims().is_empty());
    assert_eq!(files.removes.load(Ordering::SeqCst), 1);
    new.plugin.stop().await;
}

#[tokio::test]
async fn without_a_shared_state_the_other_instance_knows_nothing() {
    // Upstream's test driver: per-instance state, an unknown claim unprepares as a no-op and
    // its CDI file stays.
    let (dir, cdi) = node_dirs();
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("c", "uid-c", &[("r", "device-00")]));
    let claims: Arc<dyn ClaimSource> = Arc::new(memory);
    let files = Arc::new(CountingFiles::default());
    let old = start_instance(dir.path(), OLD_UID, claims.clone(), files.clone(), ClaimState::default()).await;
    let new = start_instance(dir.path(), NEW_UID, claims, files.clone(), ClaimState::default()).await;
    let old_dra = DraClient::connect(&old.dra_socket, "v1.DRAPlugin").await;
    let new_dra = DraClient::connect(&new.dra_socket, "v1.DRAPlugin").await;
    assert!(old_dra.prepare(&[claim_ref("c", "uid-c")]).await.unwrap()["uid-c"].is_ok());
    assert_eq!(new_dra.unprepare(&[claim_ref("c", "uid-c")]).await.unwrap()["uid-c"], "");
    assert!(cdi_file(&cdi, "uid-c", "r").exists());
    assert_eq!(old.plugin.prepared_claims().len(), 1);
    old.plugin.stop().await;
    new.plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepares_of_one_claim_through_both_instances_write_once() {
    let (dir, _cdi) = node_dirs();
    let memory = MemoryClaims::new();
    memory.insert(allocated_claim("c", "uid-c", &[("r", "device-00")]));
    let claims: Arc<dyn ClaimSource> = Arc::new(memory);
    let files = Arc::new(CountingFiles::default());
    let state = ClaimState::default();
    let old = start_instance(dir.path(), OLD_UID, claims.clone(), files.clone(), state.clone()).await;
    let new = start_instance(dir.path(), NEW_UID, claims, files.clone(), state).await;
    let clients = [
        DraClient::connect(&old.dra_socket, "v1.DRAPlugin").await,
        DraClient::connect(&new.dra_socket, "v1beta1.DRAPlugin").await,
    ];
    let mut set = tokio::task::JoinSet::new();
    for i in 0..10 {
        let dra = clients[i % 2].clone();
        set.spawn(async move { dra.prepare(&[claim_ref("c", "uid-c")]).await });
    }
    for result in within("10 prepares through two instances", set.join_all()).await {
        assert!(result.unwrap()["uid-c"].is_ok());
    }
    assert_eq!(files.writes.load(Ordering::SeqCst), 1);
    old.plugin.stop().await;
    new.plugin.stop().await;
}
