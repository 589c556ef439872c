//! Device metadata as the kubelet and the container runtime see it: prepare writes the
//! metadata file and a CDI spec that mounts it, returns the mount's CDI ID with the request's
//! first device, and unprepare removes both.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions unwrap too

use std::{collections::BTreeMap, sync::Arc};

use crate::common::*;
use harness::plugin::{
    CdiSpec, LocalDirFiles, MemoryClaims, MetadataConfig, MetadataVersion,
    metadata::{self, DeviceMetadata},
};

#[tokio::test]
async fn prepare_writes_and_unprepare_removes_device_metadata() {
    let data = tempfile::tempdir().unwrap();
    let versions = [MetadataVersion::V1beta1, MetadataVersion::V1alpha1];
    let config = MetadataConfig::new(data.path(), &versions).unwrap();
    let claims = MemoryClaims::new();
    claims.insert(allocated_claim("direct", "uid-1", &[("req0", "device-00"), ("req1", "device-01")]));
    let mut generated = allocated_claim("pod-x-claim", "uid-2", &[("my-request/sub", "device-02")]);
    generated.metadata.annotations = Some(BTreeMap::from([(
        metadata::POD_CLAIM_NAME_ANNOTATION.to_owned(),
        "my-inline-claim".to_owned(),
    )]));
    claims.insert(generated);
    let meta = config.clone();
    let t = TestPlugin::start(Arc::new(claims), Arc::new(LocalDirFiles), move |c| {
        c.metadata(Some(meta)).health_resend_interval(None)
    })
    .await;
    let registered = register_like_kubelet(&t.reg_socket).await;
    let dra = DraClient::connect(&t.dra_socket, &registered.chosen).await;
    let refs = [claim_ref("direct", "uid-1"), claim_ref("pod-x-claim", "uid-2")];
    let results = within("prepare", dra.prepare(&refs)).await.unwrap();

    for (uid, claim, request, device, container_path, pod_claim) in [
        (
            "uid-1",
            "direct",
            "req0",
            "device-00",
            metadata::resource_claim_file_path(DRIVER, "direct", "req0"),
            None,
        ),
        (
            "uid-1",
            "direct",
            "req1",
            "device-01",
            metadata::resource_claim_file_path(DRIVER, "direct", "req1"),
            None,
        ),
        (
            "uid-2",
            "pod-x-claim",
            "my-request",
            "device-02",
            metadata::resource_claim_template_file_path(DRIVER, "my-inline-claim", "my-request"),
            Some("my-inline-claim".to_owned()),
        ),
    ] {
        let devices = results[uid].clone().unwrap();
        let returned = devices.iter().find(|d| d.device_name == device).unwrap();
        assert_eq!(
            returned.cdi_device_ids,
            [format!("{DRIVER}/test=claim-{uid}-{request}"), metadata::cdi_device_id(DRIVER, uid, request)]
        );
        let host_file = config.host_file(NS, claim, request);
        let objects = DeviceMetadata::decode_stream(&std::fs::read(&host_file).unwrap()).unwrap();
        assert_eq!(objects.iter().map(|(v, _)| *v).collect::<Vec<_>>(), versions);
        let md = &objects[0].1;
        assert_eq!(
            (md.metadata.name.as_str(), md.metadata.namespace.as_str(), md.metadata.uid.as_str()),
            (claim, NS, uid)
        );
        assert_eq!(md.metadata.generation, 1);
        assert_eq!(md.pod_claim_name, pod_claim);
        // The request as allocated: with its subrequest.
        let want_request = if uid == "uid-2" { "my-request/sub" } else { request };
        assert_eq!(md.requests.len(), 1);
        assert_eq!(md.requests[0].name, want_request);
        assert_eq!(md.requests[0].devices, [metadata::MetadataDevice::test_driver(DRIVER, NODE, device)]);
        assert!(md.validate().is_empty());

        let spec_path = metadata::cdi_spec_path(&t.cdi_dir, DRIVER, uid, request);
        let spec: CdiSpec = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
        assert_eq!(spec.kind, format!("{DRIVER}/metadata"));
        assert_eq!(spec.devices[0].name, metadata::cdi_device_name(uid, request));
        let mount = &spec.devices[0].container_edits.mounts[0];
        assert_eq!(mount.host_path, host_file.display().to_string());
        assert_eq!(mount.container_path, container_path);
        assert_eq!(mount.options, ["ro", "bind"]);
    }

    let unprepared = within("unprepare", dra.unprepare(&refs)).await.unwrap();
    assert_eq!((unprepared["uid-1"].as_str(), unprepared["uid-2"].as_str()), ("", ""));
    assert!(!config.claim_dir(NS, "direct").exists());
    assert!(!config.claim_dir(NS, "pod-x-claim").exists());
    let left: Vec<_> = std::fs::read_dir(&t.cdi_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "CDI specs left: {left:?}");
    t.plugin.stop().await;
}
