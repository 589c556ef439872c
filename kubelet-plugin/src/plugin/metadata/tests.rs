use super::*;
use rstest::rstest;

fn sample() -> DeviceMetadata {
    DeviceMetadata {
        metadata: MetadataObjectMeta {
            name: "my-claim".into(),
            namespace: "ns".into(),
            uid: "0b1c-uid".into(),
            generation: 1,
        },
        pod_claim_name: None,
        requests: vec![DeviceMetadataRequest {
            name: "my-request".into(),
            devices: vec![MetadataDevice::test_driver("d.k8s.io", "node-1", "device-00")],
        }],
        ..Default::default()
    }
}

/// The JSON upstream's pretty encoder writes for such an object (field names and order of
/// the v1beta1 Go types, `creationTimestamp` omitted as zero, map keys sorted).
const V1BETA1: &str = r#"{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "my-claim",
    "namespace": "ns",
    "uid": "0b1c-uid",
    "generation": 1
  },
  "requests": [
    {
      "name": "my-request",
      "devices": [
        {
          "driver": "d.k8s.io",
          "pool": "node-1",
          "name": "device-00",
          "attributes": {
            "device": {
              "string": "device-00"
            },
            "driverName": {
              "string": "d.k8s.io"
            },
            "pool": {
              "string": "node-1"
            }
          }
        }
      ]
    }
  ]
}
"#;

#[test]
fn stream_has_one_object_per_version_in_order() {
    let stream = sample().encode_stream(&[MetadataVersion::V1beta1, MetadataVersion::V1alpha1]).unwrap();
    let text = String::from_utf8(stream.clone()).unwrap();
    assert!(text.starts_with(V1BETA1), "{text}");
    assert_eq!(&text[V1BETA1.len()..], V1BETA1.replace("v1beta1", "v1alpha1"));
    let decoded = DeviceMetadata::decode_stream(&stream).unwrap();
    let versions: Vec<MetadataVersion> = decoded.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, [MetadataVersion::V1beta1, MetadataVersion::V1alpha1]);
    assert_eq!(decoded[0].1, sample().for_version(MetadataVersion::V1beta1));
    assert!(decoded[0].1.validate().is_empty());
    assert_eq!(decoded[0].1.requests[0].devices[0].string_attribute("pool"), Some("node-1"));
}

#[test]
fn pod_claim_name_and_network_data_field_names() {
    let mut md = sample();
    md.pod_claim_name = Some("my-inline-claim".into());
    md.requests[0].devices[0].network_data =
        Some(NetworkDeviceData { interface_name: Some("eth1".into()), ..Default::default() });
    let value = serde_json::to_value(md.for_version(MetadataVersion::V1beta1)).unwrap();
    assert_eq!(value["podClaimName"], "my-inline-claim");
    assert_eq!(value["requests"][0]["devices"][0]["networkData"]["interfaceName"], "eth1");
    assert!(value["metadata"].get("creationTimestamp").is_none());
}

#[test]
fn decoding_skips_unknown_versions_and_kinds() {
    let future = r#"{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v2","whatever":[1]}"#;
    let other = r#"{"kind":"Other","apiVersion":"metadata.resource.k8s.io/v1beta1"}"#;
    let stream = format!("{future}\n{other}\n{V1BETA1}");
    let decoded = DeviceMetadata::decode_stream(stream.as_bytes()).unwrap();
    assert_eq!(decoded.len(), 1);
    assert_eq!(decoded[0].0, MetadataVersion::V1beta1);
    let err = DeviceMetadata::decode_stream(future.as_bytes()).unwrap_err();
    assert!(matches!(err, MetadataDecodeError::NoKnownVersion { .. }), "{err}");
    let err = DeviceMetadata::decode_stream(b"{\"kind\": ").unwrap_err();
    assert!(matches!(err, MetadataDecodeError::Json { index: 0, .. }), "{err}");
    let bad = r#"{"kind":"DeviceMetadata","apiVersion":"metadata.resource.k8s.io/v1beta1","requests":{}}"#;
    let err = DeviceMetadata::decode_stream(bad.as_bytes()).unwrap_err();
    assert!(matches!(err, MetadataDecodeError::Object { index: 0, .. }), "{err}");
}

#[rstest]
#[case(&[], Err(MetadataConfigError::NoVersion))]
#[case(&[MetadataVersion::V1alpha1], Err(MetadataConfigError::LatestMissing))]
#[case(&[MetadataVersion::V1beta1], Ok(vec![MetadataVersion::V1beta1]))]
#[case(
    &[MetadataVersion::V1beta1, MetadataVersion::V1alpha1, MetadataVersion::V1beta1],
    Ok(vec![MetadataVersion::V1beta1, MetadataVersion::V1alpha1])
)]
fn config_versions(
    #[case] versions: &[MetadataVersion],
    #[case] expected: Result<Vec<MetadataVersion>, MetadataConfigError>,
) {
    assert_eq!(MetadataConfig::new("/data", versions).map(|c| c.versions), expected);
}

#[test]
fn paths_on_the_node_and_in_containers() {
    let config =
        MetadataConfig::new("/var/lib/kubelet/plugins/d.k8s.io", &[MetadataVersion::V1beta1]).unwrap();
    assert_eq!(
        config.host_file("ns", "claim", "req"),
        Path::new("/var/lib/kubelet/plugins/d.k8s.io/dra-device-metadata/ns_claim/req/metadata.json")
    );
    assert_eq!(
        resource_claim_file_path("d.k8s.io", "claim", "req"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim/req/d.k8s.io-metadata.json"
    );
    assert_eq!(
        resource_claim_template_file_path("d.k8s.io", "pod-claim", "req"),
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/pod-claim/req/d.k8s.io-metadata.json"
    );
    assert_eq!(
        cdi_spec_path(Path::new("/cdi"), "d.k8s.io", "uid", "req"),
        Path::new("/cdi/d.k8s.io_metadata_uid_req.json")
    );
    assert_eq!(cdi_device_id("d.k8s.io", "uid", "req"), "d.k8s.io/metadata=uid_req");
}

#[rstest]
#[case("a1b2_req", "0.3.0")]
#[case("1ab2_req", "0.5.0")]
fn cdi_spec_mounts_read_only(#[case] device: &str, #[case] version: &str) {
    let spec = cdi_spec("d.k8s.io", device.into(), Path::new("/host/metadata.json"), "/in/c.json".into());
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(
        json,
        format!(
            r#"{{"cdiVersion":"{version}","kind":"d.k8s.io/metadata","devices":[{{"name":"{device}","containerEdits":{{"mounts":[{{"hostPath":"/host/metadata.json","containerPath":"/in/c.json","options":["ro","bind"]}}]}}}}],"containerEdits":{{}}}}"#
        )
    );
}

#[test]
fn validation_names_each_problem() {
    let mut md = sample();
    md.pod_claim_name = Some("Not_A_Label".into());
    md.requests.push(DeviceMetadataRequest { name: String::new(), devices: Vec::new() });
    let device = &mut md.requests[0].devices[0];
    device.driver = format!("{}.k8s.io", "x".repeat(60));
    device.pool = "a/b/-c".into();
    device.name = "Device".into();
    let problems = md.validate();
    assert_eq!(problems.len(), 5, "{problems:#?}");
    for needle in ["podClaimName", "requests[1].name", ".driver", ".pool", ".name \"Device\""] {
        assert!(problems.iter().any(|p| p.contains(needle)), "{needle}: {problems:#?}");
    }
    assert!(sample().validate().is_empty());
}
