//! What the run's client does with a request whose connection broke after it was (or may have
//! been) sent: the API server may have done it, and its answer is lost. Per verb:
//!
//! | request | sent again? | how |
//! |---|---|---|
//! | GET, HEAD (get, list, watch) | yes | as it is: reading twice does no harm |
//! | POST to a collection: a create | yes, after a look-up | every create carries a token label ([`CREATE_TOKEN_LABEL`], a request's own kept); a named one is looked up by name, one with `generateName` by its token; found with the token, it is the answer (`201`); not found, the create is sent again; found without it (not ours), the create is sent again and the API server's `409 AlreadyExists` is the answer |
//! | other POSTs (subresources: eviction, binding, token; reviews; `dryRun`) | yes | as it is: nothing is stored, or a second one is refused |
//! | PUT with `metadata.resourceVersion` | yes | a `409 Conflict` to the second is checked against the stored object: when it is what the PUT wrote (status for `/status`, all but status and server-kept metadata for the object), the stored object is the answer (`200`), else the `409` |
//! | PUT without a resourceVersion | yes | as it is: it writes the same again |
//! | PATCH: merge, strategic merge, apply | yes | as it is: applying it twice gives what applying it once did |
//! | PATCH: JSON patch of `replace` and `add` to object members only | yes | as it is, for the same reason |
//! | PATCH: other JSON patches (`test`, `remove`, `move`, `copy`, `add` to an array) | no | the broken connection is the caller's error: done twice, they do something else or fail |
//! | DELETE | yes | a `404` to the second means the first (or another) deleted it: answered as done (`200`, a `Status` of success) |
//!
//! Look-ups are the run's own bookkeeping: they go with the run's identity (an impersonating
//! client's `Impersonate-*` headers are left out), and only an object carrying the request's own
//! token, which no other request has, is adopted.

use bytes::Bytes;
use http::{Method, StatusCode, header};
use http_body_util::BodyExt as _;
use kube::{Client, client::Body};
use serde_json::Value;

/// Label with a token per create request: a create whose answer was lost (the API server went
/// away) may still have made its object, which is then found by it.
pub(crate) const CREATE_TOKEN_LABEL: &str = "dra-e2e.k8s.io/create-token";

/// A request as the reconnecting client sends it, and sends it again.
pub(crate) struct Resendable {
    parts: http::request::Parts,
    body: Bytes,
    verb: Verb,
}

/// What a request is, as far as sending it again goes (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verb {
    /// Sent again as it is.
    Again,
    /// A create of an object: its name if it has one, and its token.
    Create { name: Option<String>, token: String },
    /// A PUT with a resourceVersion; `status`: of the `/status` subresource.
    ConditionalUpdate { status: bool },
    /// A DELETE.
    Delete,
    /// Not sent again once it may have been done.
    Once,
}

impl Resendable {
    /// `parts` and `body` of a request, with a token label added to a create.
    pub(crate) fn new(parts: http::request::Parts, body: Bytes) -> Self {
        let mut body = body;
        let verb = verb(&parts, &mut body);
        Self { parts, body, verb }
    }

    /// The request's method, for logs.
    pub(crate) fn method(&self) -> &Method {
        &self.parts.method
    }

    /// The request's URI, for logs.
    pub(crate) fn uri(&self) -> &http::Uri {
        &self.parts.uri
    }

    /// Whether it may be sent again once its answer was lost.
    pub(crate) fn after_lost_answer(&self) -> bool {
        self.verb != Verb::Once
    }

    /// Sends it (once).
    pub(crate) async fn send(&self, client: &Client) -> Result<http::Response<Body>, kube::Error> {
        client.send(self.request(self.parts.method.clone(), self.parts.uri.clone(), self.body.clone())?).await
    }

    /// Sends it again after its answer was lost (see the module docs for each verb).
    pub(crate) async fn resend(&self, client: &Client) -> Result<http::Response<Body>, kube::Error> {
        match &self.verb {
            Verb::Create { name, token } => {
                if let Some(object) = self.look_up_create(client, name.as_deref(), token).await? {
                    tracing::info!(uri = %self.parts.uri, "a create whose answer was lost had been done; taking the object it made");
                    return answer(StatusCode::CREATED, &object);
                }
                self.send(client).await
            }
            Verb::ConditionalUpdate { status } => {
                let response = self.send(client).await?;
                if response.status() != StatusCode::CONFLICT {
                    return Ok(response);
                }
                let (parts, conflict) = collect(response).await?;
                match self.get(client, self.parts.uri.path().to_owned()).await? {
                    Some(stored) if same_write(&self.body, &stored, *status) => {
                        tracing::info!(uri = %self.parts.uri, "an update whose answer was lost had been done; taking the stored object");
                        answer(StatusCode::OK, &stored)
                    }
                    _ => Ok(http::Response::from_parts(parts, Body::from(conflict.to_vec()))),
                }
            }
            Verb::Delete => {
                let response = self.send(client).await?;
                if response.status() != StatusCode::NOT_FOUND {
                    return Ok(response);
                }
                tracing::info!(uri = %self.parts.uri, "a delete whose answer was lost: the object is gone");
                answer(
                    StatusCode::OK,
                    &serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    }),
                )
            }
            Verb::Again | Verb::Once => self.send(client).await,
        }
    }

    /// The object the create made if it was made: by name, or by its token.
    async fn look_up_create(
        &self,
        client: &Client,
        name: Option<&str>,
        token: &str,
    ) -> Result<Option<Value>, kube::Error> {
        let collection = self.parts.uri.path().trim_end_matches('/');
        let found = match name {
            Some(name) => self.get(client, format!("{collection}/{name}")).await?,
            None => {
                let selector = format!("{}%3D{token}", CREATE_TOKEN_LABEL.replace('/', "%2F"));
                let list = self.get(client, format!("{collection}?labelSelector={selector}")).await?;
                list.and_then(|list| first_item(&list))
            }
        };
        Ok(found.filter(|object| object["metadata"]["labels"][CREATE_TOKEN_LABEL] == token))
    }

    /// GETs `path_and_query` with the run's identity: the object, or `None` when the API server
    /// answered anything but `200` (not found, not readable, not a stored resource).
    async fn get(&self, client: &Client, path_and_query: String) -> Result<Option<Value>, kube::Error> {
        let uri: http::Uri = path_and_query
            .parse()
            .map_err(|e: http::uri::InvalidUri| kube::Error::HttpError(http::Error::from(e)))?;
        let mut request = self.request(Method::GET, uri, Bytes::new())?;
        let headers = request.headers_mut();
        let impersonating: Vec<header::HeaderName> =
            headers.keys().filter(|k| k.as_str().starts_with("impersonate-")).cloned().collect();
        for name in impersonating.iter().chain([&header::CONTENT_TYPE, &header::CONTENT_LENGTH]) {
            headers.remove(name);
        }
        headers.insert(header::ACCEPT, header::HeaderValue::from_static("application/json"));
        let response = client.send(request).await?;
        if response.status() != StatusCode::OK {
            return Ok(None);
        }
        let (_, body) = collect(response).await?;
        Ok(serde_json::from_slice(&body).ok())
    }

    /// A copy of the request's headers with `method`, `uri` and `body`.
    fn request(
        &self,
        method: Method,
        uri: http::Uri,
        body: Bytes,
    ) -> Result<http::Request<Body>, kube::Error> {
        let mut request = http::Request::builder().method(method).uri(uri).version(self.parts.version);
        if let Some(headers) = request.headers_mut() {
            headers.clone_from(&self.parts.headers);
        }
        request.body(Body::from(body.to_vec())).map_err(kube::Error::HttpError)
    }
}

/// What `parts` is; a create's `body` gets its token label.
fn verb(parts: &http::request::Parts, body: &mut Bytes) -> Verb {
    let path = parts.uri.path();
    match parts.method {
        Method::POST if crate::cluster::run_identity::is_collection(path) && !dry_run(&parts.uri) => {
            create(body).unwrap_or(Verb::Again)
        }
        Method::PUT if resource_version(body).is_some() => {
            Verb::ConditionalUpdate { status: path.trim_end_matches('/').ends_with("/status") }
        }
        Method::PATCH if is_json_patch(&parts.headers) && !idempotent_json_patch(body) => Verb::Once,
        Method::DELETE => Verb::Delete,
        _ => Verb::Again,
    }
}

fn dry_run(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| q.split('&').any(|pair| pair.starts_with("dryRun=")))
}

/// A create of `body` (a JSON object with `metadata.name` or `metadata.generateName`) with its
/// token label set (the one it has kept); `None` when it is not such an object.
fn create(body: &mut Bytes) -> Option<Verb> {
    let mut object: Value = serde_json::from_slice(body).ok()?;
    let metadata = object.get("metadata")?;
    let name = metadata.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).map(str::to_owned);
    let generated = metadata.get("generateName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    if name.is_none() && !generated {
        return None;
    }
    let kept = metadata["labels"][CREATE_TOKEN_LABEL].as_str().map(str::to_owned);
    let token = kept.unwrap_or_else(crate::names::unique_suffix);
    crate::cluster::run_identity::add_label(&mut object, CREATE_TOKEN_LABEL, &token)?;
    *body = Bytes::from(serde_json::to_vec(&object).ok()?);
    Some(Verb::Create { name, token })
}

fn resource_version(body: &[u8]) -> Option<String> {
    let object: Value = serde_json::from_slice(body).ok()?;
    object["metadata"]["resourceVersion"].as_str().filter(|v| !v.is_empty()).map(str::to_owned)
}

fn is_json_patch(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json-patch+json"))
}

/// Whether applying the JSON patch `body` twice does what applying it once does: only `replace`
/// operations, and `add`s to object members (not to an array: `/-` or an index).
fn idempotent_json_patch(body: &[u8]) -> bool {
    let Ok(Value::Array(operations)) = serde_json::from_slice::<Value>(body) else { return false };
    operations.iter().all(|operation| {
        let path = operation["path"].as_str().unwrap_or_default();
        let last = path.rsplit('/').next().unwrap_or_default();
        match operation["op"].as_str() {
            Some("replace") => true,
            Some("add") => last != "-" && last.parse::<usize>().is_err(),
            _ => false,
        }
    })
}

/// Whether the stored object is what the PUT of `sent` wrote: its status for a `/status` PUT,
/// everything but the status and the metadata the API server keeps itself for the object.
fn same_write(sent: &[u8], stored: &Value, status: bool) -> bool {
    let Ok(sent) = serde_json::from_slice::<Value>(sent) else { return false };
    if status {
        return sent.get("status") == stored.get("status");
    }
    let written = |object: &Value| {
        let mut object = object.clone();
        if let Some(fields) = object.as_object_mut() {
            fields.remove("status");
        }
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            for kept in ["resourceVersion", "managedFields", "generation"] {
                metadata.remove(kept);
            }
        }
        object
    };
    written(&sent) == written(stored)
}

/// The first item of a list, with the list's `apiVersion` and its `kind` without `List` (an
/// item of a list has neither).
fn first_item(list: &Value) -> Option<Value> {
    let mut item = list["items"].as_array()?.first()?.clone();
    let kind = list["kind"].as_str()?.strip_suffix("List")?;
    let object = item.as_object_mut()?;
    object.insert("apiVersion".to_owned(), list["apiVersion"].clone());
    object.insert("kind".to_owned(), kind.into());
    Some(item)
}

/// An answer of `status` with `object` as its JSON body.
fn answer(status: StatusCode, object: &Value) -> Result<http::Response<Body>, kube::Error> {
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    http::Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .map_err(kube::Error::HttpError)
}

/// A response's head and whole body.
async fn collect(response: http::Response<Body>) -> Result<(http::response::Parts, Bytes), kube::Error> {
    let (parts, body) = response.into_parts();
    Ok((parts, body.collect().await?.to_bytes()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn parts(method: Method, uri: &str, content_type: &str) -> http::request::Parts {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, content_type)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn verb_of(method: Method, uri: &str, body: &str) -> (Verb, Value) {
        let mut bytes = Bytes::from(body.to_owned());
        let verb = verb(&parts(method, uri, "application/json"), &mut bytes);
        (verb, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    #[test]
    fn a_create_gets_a_token_and_keeps_its_own() {
        let (verb, body) =
            verb_of(Method::POST, "/api/v1/namespaces/n/configmaps", r#"{"metadata":{"name":"c"}}"#);
        let Verb::Create { name: Some(name), token } = verb else { panic!("{verb:?}") };
        assert_eq!(name, "c");
        assert_eq!(body["metadata"]["labels"][CREATE_TOKEN_LABEL], token.as_str());

        let own =
            format!(r#"{{"metadata":{{"generateName":"g-","labels":{{"{CREATE_TOKEN_LABEL}":"mine"}}}}}}"#);
        let (verb, _) = verb_of(Method::POST, "/api/v1/namespaces", &own);
        assert_eq!(verb, Verb::Create { name: None, token: "mine".into() });
    }

    #[test]
    fn what_is_not_a_create_of_an_object_is_sent_again_as_it_is() {
        let review = r#"{"spec":{"resourceAttributes":{"verb":"get"}}}"#;
        let (verb, body) =
            verb_of(Method::POST, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review);
        assert_eq!((verb, body), (Verb::Again, serde_json::from_str(review).unwrap()));
        let eviction = r#"{"metadata":{"name":"p"}}"#;
        assert_eq!(verb_of(Method::POST, "/api/v1/namespaces/n/pods/p/eviction", eviction).0, Verb::Again);
        let dry = verb_of(Method::POST, "/api/v1/namespaces/n/configmaps?dryRun=All", eviction).0;
        assert_eq!(dry, Verb::Again);
        assert_eq!(verb_of(Method::GET, "/api/v1/namespaces", "").0, Verb::Again);
    }

    #[test]
    fn updates_deletes_and_patches() {
        let conditional = r#"{"metadata":{"name":"c","resourceVersion":"7"}}"#;
        let put = |uri| verb_of(Method::PUT, uri, conditional).0;
        assert_eq!(put("/api/v1/namespaces/n/pods/p"), Verb::ConditionalUpdate { status: false });
        assert_eq!(put("/api/v1/namespaces/n/pods/p/status"), Verb::ConditionalUpdate { status: true });
        assert_eq!(verb_of(Method::PUT, "/api/v1/namespaces/n/pods/p", r#"{"metadata":{}}"#).0, Verb::Again);
        assert_eq!(verb_of(Method::DELETE, "/api/v1/namespaces/n", "").0, Verb::Delete);
        let patch = |body: &str| {
            let mut bytes = Bytes::from(body.to_owned());
            verb(&parts(Method::PATCH, "/api/v1/nodes/n", "application/json-patch+json"), &mut bytes)
        };
        assert_eq!(
            patch(r#"[{"op":"replace","path":"/spec/x","value":1},{"op":"add","path":"/a/b","value":2}]"#),
            Verb::Again
        );
        assert_eq!(patch(r#"[{"op":"add","path":"/spec/list/-","value":1}]"#), Verb::Once);
        assert_eq!(patch(r#"[{"op":"add","path":"/spec/list/0","value":1}]"#), Verb::Once);
        assert_eq!(
            patch(r#"[{"op":"test","path":"/a","value":1},{"op":"replace","path":"/a","value":2}]"#),
            Verb::Once
        );
        assert_eq!(patch(r#"[{"op":"remove","path":"/a"}]"#), Verb::Once);
        let mut merge = Bytes::from_static(br#"{"spec":{"x":1}}"#);
        let merge_patch = parts(Method::PATCH, "/api/v1/nodes/n", "application/merge-patch+json");
        assert_eq!(verb(&merge_patch, &mut merge), Verb::Again);
    }

    #[test]
    fn a_stored_object_is_the_update_s_write_when_all_but_server_kept_fields_match() {
        let sent = br#"{"metadata":{"name":"c","resourceVersion":"7"},"spec":{"x":1},"status":{"s":0}}"#;
        let stored = serde_json::json!({
            "metadata": {"name": "c", "resourceVersion": "9", "generation": 2, "managedFields": []},
            "spec": {"x": 1}, "status": {"s": 5},
        });
        assert!(same_write(sent, &stored, false), "the status is not the object's to write");
        assert!(!same_write(sent, &stored, true), "a status update wrote another status");
        let other = serde_json::json!({"metadata": {"name": "c", "resourceVersion": "9"}, "spec": {"x": 2}});
        assert!(!same_write(sent, &other, false), "someone else's write");
    }

    #[test]
    fn a_list_item_gets_its_kind() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "NamespaceList", "items": [{"metadata": {"name": "a"}}]});
        assert_eq!(
            first_item(&list),
            Some(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}))
        );
        assert_eq!(first_item(&serde_json::json!({"kind": "NamespaceList", "items": []})), None);
    }
}
