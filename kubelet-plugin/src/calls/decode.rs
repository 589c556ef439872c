//! Decoding of gRPC message bodies for the call log.
//!
//! A gRPC body is a sequence of frames: one byte "compressed" flag, four bytes
//! big-endian length, then the protobuf message. The servers never compress,
//! so compressed frames are only described, not decoded.

use bytes::{Buf, BytesMut};
use prost::Message;
use serde::Serialize;

use super::{ClaimRef, DraApi, HealthApi, Method};
use crate::grpc::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration};

/// Decodes one protobuf message of a known type into JSON.
type DecodeFn = fn(&[u8]) -> serde_json::Value;

/// How the recorder treats one known method.
#[derive(Clone, Copy)]
pub(crate) struct MethodCodec {
    pub request: DecodeFn,
    pub response: DecodeFn,
}

fn json<M: Message + Default + Serialize>(bytes: &[u8]) -> serde_json::Value {
    match M::decode(bytes) {
        Ok(message) => serde_json::to_value(&message)
            .unwrap_or_else(|e| serde_json::Value::String(format!("<cannot encode as JSON: {e}>"))),
        Err(e) => serde_json::Value::String(format!("<undecodable {} bytes: {e}>", bytes.len())),
    }
}

macro_rules! codec {
    ($req:ty, $resp:ty) => {
        Some(MethodCodec { request: json::<$req>, response: json::<$resp> })
    };
}

/// The codec for a full method path, `None` for methods the plugin does not know.
pub(crate) fn codec_for(path: &str) -> Option<MethodCodec> {
    let is = |method: Method| method.matches(path);
    if is(Method::GetInfo) {
        codec!(registration::InfoRequest, registration::PluginInfo)
    } else if is(Method::NotifyRegistrationStatus) {
        codec!(registration::RegistrationStatus, registration::RegistrationStatusResponse)
    } else if is(DraApi::V1.prepare()) {
        codec!(dra_v1::NodePrepareResourcesRequest, dra_v1::NodePrepareResourcesResponse)
    } else if is(DraApi::V1.unprepare()) {
        codec!(dra_v1::NodeUnprepareResourcesRequest, dra_v1::NodeUnprepareResourcesResponse)
    } else if is(DraApi::V1beta1.prepare()) {
        codec!(dra_v1beta1::NodePrepareResourcesRequest, dra_v1beta1::NodePrepareResourcesResponse)
    } else if is(DraApi::V1beta1.unprepare()) {
        codec!(dra_v1beta1::NodeUnprepareResourcesRequest, dra_v1beta1::NodeUnprepareResourcesResponse)
    } else if is(HealthApi::V1alpha1.watch()) {
        codec!(health_v1alpha1::NodeWatchResourcesRequest, health_v1alpha1::NodeWatchResourcesResponse)
    } else if is(HealthApi::V1.watch()) {
        codec!(health_v1::NodeWatchResourcesRequest, health_v1::NodeWatchResourcesResponse)
    } else {
        None
    }
}

/// Splits complete gRPC frames off the front of `buf` and decodes each with
/// `decode`; an incomplete frame stays in `buf`.
pub(crate) fn drain_frames(buf: &mut BytesMut, decode: DecodeFn) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let compressed = buf[0] != 0;
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if buf.len() < 5 + len {
            break;
        }
        buf.advance(5);
        let payload = buf.split_to(len);
        if compressed {
            out.push(serde_json::Value::String(format!("<compressed message, {len} bytes>")));
        } else {
            out.push(decode(&payload));
        }
    }
    out
}

/// The claims named by a decoded DRA request (`{"claims": [{namespace, uid, name}]}`).
pub(crate) fn claims_of(request: &serde_json::Value) -> Vec<ClaimRef> {
    let Some(claims) = request.get("claims").and_then(|c| c.as_array()) else {
        return Vec::new();
    };
    let field = |claim: &serde_json::Value, name: &str| {
        claim.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_string()
    };
    claims
        .iter()
        .map(|claim| ClaimRef {
            namespace: field(claim, "namespace"),
            name: field(claim, "name"),
            uid: field(claim, "uid"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(message: &impl Message) -> Vec<u8> {
        let body = message.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn decodes_split_frames_and_claims() {
        let path = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
        let codec = codec_for(path).unwrap();
        let request = dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim { namespace: "ns".into(), uid: "u1".into(), name: "c1".into() }],
        };
        let bytes = frame(&request);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&bytes[..3]);
        assert!(drain_frames(&mut buf, codec.request).is_empty());
        buf.extend_from_slice(&bytes[3..]);
        let decoded = drain_frames(&mut buf, codec.request);
        assert_eq!(decoded.len(), 1);
        assert!(buf.is_empty());
        let claims = claims_of(&decoded[0]);
        assert_eq!(claims, vec![ClaimRef { namespace: "ns".into(), name: "c1".into(), uid: "u1".into() }]);
    }

    #[test]
    fn unknown_method_has_no_codec() {
        assert!(codec_for("/pluginregistration.Registration/Nope").is_none());
    }
}
