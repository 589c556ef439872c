//! An API server of ConfigMaps in memory, as a `kube::Client` (for [`super::cut_proxy`]'s
//! upstream): create (by name or `generateName`; `409 AlreadyExists`), get, list by one
//! `key=value` label selector, update with `resourceVersion` checks (`409 Conflict`), merge
//! patches and JSON patches (`replace`, `add`, `test` of object members), delete (`404`).
//! Every object gets a uid and a resourceVersion, as the API server gives them.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use kube::client::Body;
use serde_json::{Value, json};

/// The collection path of the fake's ConfigMaps.
pub const CONFIGMAPS: &str = "/api/v1/namespaces/fake/configmaps";

/// The store; cloned handles share it.
#[derive(Clone, Default)]
pub struct FakeApi {
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    /// The last resourceVersion and generated-name counter.
    counter: Arc<Mutex<u64>>,
}

type Answer = Result<http::Response<Body>, Box<dyn std::error::Error + Send + Sync>>;

impl FakeApi {
    /// A client whose every request this fake answers.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        kube::Client::new(
            tower::service_fn(move |request: http::Request<Body>| {
                let api = api.clone();
                async move { api.serve(request).await }
            }),
            "fake",
        )
    }

    /// The stored ConfigMaps, by name.
    pub fn objects(&self) -> BTreeMap<String, Value> {
        self.objects.lock().unwrap().clone()
    }

    /// Stores `object` as it is (someone else's object), with a uid and resourceVersion.
    pub fn put(&self, mut object: Value) {
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        self.stamp(&mut object, true);
        self.objects.lock().unwrap().insert(name, object);
    }

    fn next(&self) -> u64 {
        let mut counter = self.counter.lock().unwrap();
        *counter += 1;
        *counter
    }

    fn stamp(&self, object: &mut Value, new: bool) {
        let version = self.next();
        object["metadata"]["resourceVersion"] = version.to_string().into();
        if new {
            object["metadata"]["uid"] = format!("uid-{version}").into();
        }
        object["apiVersion"] = "v1".into();
        object["kind"] = "ConfigMap".into();
    }

    async fn serve(&self, request: http::Request<Body>) -> Answer {
        let (parts, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let path = parts.uri.path();
        let name =
            path.strip_prefix(CONFIGMAPS).and_then(|rest| rest.strip_prefix('/')).filter(|n| !n.is_empty());
        let content_type =
            parts.headers.get(http::header::CONTENT_TYPE).and_then(|t| t.to_str().ok()).unwrap_or_default();
        if !path.starts_with(CONFIGMAPS) {
            return status(StatusCode::NOT_FOUND, "NotFound", "not served by the fake");
        }
        let mut objects = self.objects.lock().unwrap();
        match (&parts.method, name) {
            (&Method::POST, None) => {
                let mut object: Value = serde_json::from_slice(&body)?;
                let name = match object["metadata"]["name"].as_str() {
                    Some(name) if !name.is_empty() => name.to_owned(),
                    _ => format!(
                        "{}{:05}",
                        object["metadata"]["generateName"].as_str().unwrap_or(""),
                        self.next()
                    ),
                };
                if objects.contains_key(&name) {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        &format!("configmaps \"{name}\" already exists"),
                    );
                }
                object["metadata"]["name"] = name.clone().into();
                self.stamp(&mut object, true);
                objects.insert(name, object.clone());
                json(StatusCode::CREATED, &object)
            }
            (&Method::GET, None) => {
                let selector = parts
                    .uri
                    .query()
                    .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("labelSelector=")));
                let selector = selector.map(|s| s.replace("%2F", "/").replace("%3D", "="));
                let wanted = selector.as_deref().and_then(|s| s.split_once('='));
                let items: Vec<Value> = objects
                    .values()
                    .filter(|o| wanted.is_none_or(|(k, v)| o["metadata"]["labels"][k] == v))
                    .map(|o| {
                        let mut item = o.clone();
                        let fields = item.as_object_mut().unwrap();
                        fields.remove("apiVersion");
                        fields.remove("kind");
                        item
                    })
                    .collect();
                let version = self.next().to_string();
                json(
                    StatusCode::OK,
                    &json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": version}, "items": items}),
                )
            }
            (method, Some(name)) => {
                let Some(stored) = objects.get(name).cloned() else {
                    return status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        &format!("configmaps \"{name}\" not found"),
                    );
                };
                match *method {
                    Method::GET => json(StatusCode::OK, &stored),
                    Method::DELETE => {
                        objects.remove(name);
                        json(StatusCode::OK, &stored)
                    }
                    Method::PUT => {
                        let mut object: Value = serde_json::from_slice(&body)?;
                        let sent = object["metadata"]["resourceVersion"].as_str().unwrap_or("");
                        if !sent.is_empty()
                            && object["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]
                        {
                            return status(StatusCode::CONFLICT, "Conflict", "the object has been modified");
                        }
                        object["metadata"]["uid"] = stored["metadata"]["uid"].clone();
                        self.stamp(&mut object, false);
                        objects.insert(name.to_owned(), object.clone());
                        json(StatusCode::OK, &object)
                    }
                    Method::PATCH => {
                        let mut object = stored;
                        let patch: Value = serde_json::from_slice(&body)?;
                        if content_type.starts_with("application/json-patch+json") {
                            if let Err(message) = json_patch(&mut object, &patch) {
                                return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message);
                            }
                        } else {
                            merge(&mut object, &patch);
                        }
                        self.stamp(&mut object, false);
                        objects.insert(name.to_owned(), object.clone());
                        json(StatusCode::OK, &object)
                    }
                    _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served by the fake"),
                }
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served by the fake"),
        }
    }
}

/// A JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let fields = target.as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            fields.remove(key);
        } else {
            merge(fields.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// The `replace`, `add` and `test` operations of a JSON patch (RFC 6902) on object members.
fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    for operation in patch.as_array().ok_or("a JSON patch is an array")? {
        let path = operation["path"].as_str().ok_or("an operation has a path")?;
        let (parent, member) = path.rsplit_once('/').ok_or("a path starts with /")?;
        match operation["op"].as_str() {
            Some("test") if target.pointer(path) != Some(&operation["value"]) => {
                return Err(format!("test of {path} failed"));
            }
            Some("test") => {}
            Some("replace" | "add") => {
                let parent =
                    target.pointer_mut(parent).and_then(Value::as_object_mut).ok_or("no such parent")?;
                parent.insert(member.to_owned(), operation["value"].clone());
            }
            other => return Err(format!("operation {other:?} is not served by the fake")),
        }
    }
    Ok(())
}

fn json(code: StatusCode, value: &Value) -> Answer {
    Ok(http::Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(value)?))?)
}

fn status(code: StatusCode, reason: &str, message: &str) -> Answer {
    json(
        code,
        &json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()}),
    )
}
