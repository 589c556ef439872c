//! Per-claim faults in forward mode ([`Calls::fail_claim`](crate::calls::Calls::fail_claim)):
//! the one fault API applies to a forwarded `NodePrepareResources` / `NodeUnprepareResources`
//! as it does to the plugin's own DRA service. A claim an injected fault matches is answered
//! with the fault's per-claim `error` and never reaches the driver (so, like the plugin's own
//! service, the driver leaves it as it was); the call's other claims are forwarded in a request
//! of their own, and the driver's answer for them is passed on with the injected answers added.
//! A call no fault matches is forwarded byte for byte, as every other call.

use std::convert::Infallible;

use bytes::{BufMut as _, Bytes, BytesMut};
use http_body_util::{BodyExt as _, StreamBody};
use prost::Message as _;
use tonic::{Status, body::Body, transport::Channel};
use tower::ServiceExt as _;

use crate::{
    calls::{ClaimFaults, ClaimRef},
    grpc::{dra_v1, dra_v1beta1},
};

/// The length of a gRPC message frame's header: the compressed flag and the length.
const FRAME_HEADER: usize = 5;

/// A re-encoded message, or why the bytes were no message of the type.
type Encoded = Result<Vec<u8>, prost::DecodeError>;
/// Which claims (by UID) a request keeps.
type Keep<'a> = &'a dyn Fn(&str) -> bool;
/// The injected per-claim errors of a call: `(claim UID, error)`.
type ClaimErrors<'a> = &'a [(String, String)];

/// The claims of one method's request and the per-claim answers of its response, as encoded
/// protobuf messages (without gRPC framing).
pub(crate) struct ClaimMessages {
    /// The claims a request names.
    claims: fn(&[u8]) -> Result<Vec<ClaimRef>, prost::DecodeError>,
    /// The request with only the claims whose UID `keep` accepts.
    retain: fn(&[u8], Keep<'_>) -> Encoded,
    /// The response with an answer carrying `error` added for each `(uid, error)`.
    add_errors: fn(&[u8], ClaimErrors<'_>) -> Encoded,
}

/// The per-claim messages of a `DRAPlugin` service: prepare and unprepare.
pub(crate) struct DraMessages {
    prepare: ClaimMessages,
    unprepare: ClaimMessages,
}

impl DraMessages {
    /// The messages of the method at `path`, if it names claims.
    pub(crate) fn for_path(&'static self, path: &str) -> Option<&'static ClaimMessages> {
        if path.ends_with("/NodePrepareResources") {
            Some(&self.prepare)
        } else if path.ends_with("/NodeUnprepareResources") {
            Some(&self.unprepare)
        } else {
            None
        }
    }
}

macro_rules! claim_messages {
    ($api:ident, $request:ident, $response:ident, $answer:ident) => {
        ClaimMessages {
            claims: |bytes| {
                let request = $api::$request::decode(bytes)?;
                Ok(request
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef { namespace: c.namespace, name: c.name, uid: c.uid })
                    .collect())
            },
            retain: |bytes, keep| {
                let mut request = $api::$request::decode(bytes)?;
                request.claims.retain(|c| keep(&c.uid));
                Ok(request.encode_to_vec())
            },
            add_errors: |bytes, errors| {
                let mut response = $api::$response::decode(bytes)?;
                for (uid, error) in errors {
                    // Prepare answers also have devices: none.
                    #[allow(clippy::needless_update)]
                    let answer = $api::$answer { error: error.clone(), ..Default::default() };
                    response.claims.insert(uid.clone(), answer);
                }
                Ok(response.encode_to_vec())
            },
        }
    };
}

/// `DRAPlugin` v1.
pub(crate) static DRA_V1: DraMessages = DraMessages {
    prepare: claim_messages!(
        dra_v1,
        NodePrepareResourcesRequest,
        NodePrepareResourcesResponse,
        NodePrepareResourceResponse
    ),
    unprepare: claim_messages!(
        dra_v1,
        NodeUnprepareResourcesRequest,
        NodeUnprepareResourcesResponse,
        NodeUnprepareResourceResponse
    ),
};

/// `DRAPlugin` v1beta1.
pub(crate) static DRA_V1BETA1: DraMessages = DraMessages {
    prepare: claim_messages!(
        dra_v1beta1,
        NodePrepareResourcesRequest,
        NodePrepareResourcesResponse,
        NodePrepareResourceResponse
    ),
    unprepare: claim_messages!(
        dra_v1beta1,
        NodeUnprepareResourcesRequest,
        NodeUnprepareResourcesResponse,
        NodeUnprepareResourceResponse
    ),
};

/// Sends `request` to the driver over `channel`; a driver that cannot be reached is answered
/// with `UNAVAILABLE` and the reason.
pub(crate) async fn send(channel: Channel, request: http::Request<Body>) -> http::Response<Body> {
    let path = request.uri().path().to_owned();
    match channel.oneshot(request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::warn!(%path, error = %e, "cannot forward the call to the driver");
            Status::unavailable(format!("forward {path} to the driver: {e}")).into_http()
        }
    }
}

/// Forwards `request` (a call of `messages`' method) with the per-claim `faults` applied: see
/// the module documentation. A request that cannot be decoded is forwarded unchanged.
pub(crate) async fn forward(
    channel: Channel,
    messages: &ClaimMessages,
    faults: &ClaimFaults,
    request: http::Request<Body>,
) -> http::Response<Body> {
    let (parts, body) = request.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(status) => {
            return Status::cancelled(format!("reading the request failed: {}", status.message()))
                .into_http();
        }
    };
    let rebuilt = |bytes: Bytes| http::Request::from_parts(parts.clone(), grpc_body(Some(bytes), None));
    let Some(claims) = unframe(&bytes).and_then(|message| (messages.claims)(message).ok()) else {
        tracing::warn!("cannot decode the request's claims: forwarded without per-claim faults");
        return send(channel, rebuilt(bytes)).await;
    };
    let errors: Vec<(String, String)> = claims
        .iter()
        .filter_map(|claim| faults.take(claim).map(|error| (claim.uid.clone(), error)))
        .collect();
    if errors.is_empty() {
        return send(channel, rebuilt(bytes)).await;
    }
    let injected = |uid: &str| errors.iter().any(|(failed, _)| failed == uid);
    if claims.iter().all(|claim| injected(&claim.uid)) {
        // Nothing to forward: the answer is the injected errors alone.
        let answer = (messages.add_errors)(&[], &errors).unwrap_or_default();
        return ok_response(frame(&answer));
    }
    let message = unframe(&bytes).unwrap_or_default();
    let Ok(reduced) = (messages.retain)(message, &|uid| !injected(uid)) else {
        return send(channel, rebuilt(bytes)).await;
    };
    let response = send(channel, rebuilt(frame(&reduced))).await;
    add_injected(response, messages, &errors).await
}

/// The driver's `response` to the reduced request, with the injected per-claim `errors` added
/// when it succeeded; otherwise unchanged.
async fn add_injected(
    response: http::Response<Body>,
    messages: &ClaimMessages,
    errors: &[(String, String)],
) -> http::Response<Body> {
    let (parts, body) = response.into_parts();
    if Status::from_header_map(&parts.headers).is_some() {
        // Trailers-only: the driver failed the whole call.
        return http::Response::from_parts(parts, body);
    }
    let collected = match body.collect().await {
        Ok(collected) => collected,
        Err(status) => return status.into_http(),
    };
    let trailers = collected.trailers().cloned();
    let bytes = collected.to_bytes();
    let succeeded =
        trailers.as_ref().and_then(Status::from_header_map).is_some_and(|s| s.code() == tonic::Code::Ok);
    let answer = unframe(&bytes).and_then(|message| (messages.add_errors)(message, errors).ok());
    match answer {
        Some(answer) if succeeded => {
            http::Response::from_parts(parts, grpc_body(Some(frame(&answer)), trailers))
        }
        _ => http::Response::from_parts(parts, grpc_body(Some(bytes), trailers)),
    }
}

/// A successful gRPC response with one message.
fn ok_response(message: Bytes) -> http::Response<Body> {
    let mut response = http::Response::new(Body::empty());
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    *response.body_mut() = grpc_body(Some(message), Some(trailers));
    response
}

/// A body of `data` (if any) and then `trailers` (if any).
fn grpc_body(data: Option<Bytes>, trailers: Option<http::HeaderMap>) -> Body {
    let frames: Vec<Result<http_body::Frame<Bytes>, Infallible>> = data
        .map(http_body::Frame::data)
        .into_iter()
        .chain(trailers.map(http_body::Frame::trailers))
        .map(Ok)
        .collect();
    Body::new(StreamBody::new(futures::stream::iter(frames)))
}

/// The message of a body that is exactly one uncompressed gRPC frame.
fn unframe(bytes: &[u8]) -> Option<&[u8]> {
    let (header, message) = bytes.split_at_checked(FRAME_HEADER)?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    (header[0] == 0 && usize::try_from(length).ok() == Some(message.len())).then_some(message)
}

/// `message` as one uncompressed gRPC frame.
fn frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(FRAME_HEADER + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(message);
    framed.freeze()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn frames_round_trip_and_odd_bodies_are_not_messages() {
        let framed = frame(b"abc");
        assert_eq!(unframe(&framed), Some(&b"abc"[..]));
        assert_eq!(unframe(&framed[..4]), None);
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert_eq!(unframe(&compressed), None);
        let mut two = framed.to_vec();
        two.extend_from_slice(&framed);
        assert_eq!(unframe(&two), None);
    }

    #[test]
    fn a_request_keeps_the_claims_asked_for_and_a_response_gains_the_errors() {
        let claim =
            |uid: &str| dra_v1::Claim { namespace: "ns".into(), name: format!("c-{uid}"), uid: uid.into() };
        let request =
            dra_v1::NodePrepareResourcesRequest { claims: vec![claim("a"), claim("b")] }.encode_to_vec();
        let prepare =
            DRA_V1.for_path("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources").unwrap();
        let uids: Vec<String> = (prepare.claims)(&request).unwrap().into_iter().map(|c| c.uid).collect();
        assert_eq!(uids, ["a", "b"]);
        let reduced = (prepare.retain)(&request, &|uid| uid == "b").unwrap();
        let reduced = dra_v1::NodePrepareResourcesRequest::decode(&reduced[..]).unwrap();
        assert_eq!(reduced.claims, [claim("b")]);

        let answered = dra_v1::NodePrepareResourcesResponse {
            claims: [("b".to_owned(), dra_v1::NodePrepareResourceResponse::default())].into(),
        };
        let merged =
            (prepare.add_errors)(&answered.encode_to_vec(), &[("a".into(), "injected".into())]).unwrap();
        let merged = dra_v1::NodePrepareResourcesResponse::decode(&merged[..]).unwrap();
        assert_eq!((merged.claims["a"].error.as_str(), merged.claims["b"].error.as_str()), ("injected", ""));

        let unprepare = DRA_V1BETA1
            .for_path("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources")
            .unwrap();
        let only = (unprepare.add_errors)(&[], &[("a".into(), "e".into())]).unwrap();
        let only = dra_v1beta1::NodeUnprepareResourcesResponse::decode(&only[..]).unwrap();
        assert_eq!(only.claims["a"].error, "e");
        assert!(DRA_V1.for_path("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Other").is_none());
    }
}
