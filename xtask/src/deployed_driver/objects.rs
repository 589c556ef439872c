//! A driver's manifests as typed objects: multi-document YAML read in order, each document
//! checked to be the kind its place says; applied server-side (forced: `deploy` owns them) and
//! deleted, a missing object being fine.

use anyhow::{Context, Result, bail};
use kube::{
    Api, Resource,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde::{Deserialize as _, Serialize, de::DeserializeOwned};

/// The documents of the YAML `text` (named `file` in messages), empty ones left out.
pub fn documents(text: &str, file: &str) -> Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(doc).with_context(|| format!("{file} is not YAML"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The kind of a document, `?` when it names none.
pub fn kind_of(doc: &serde_json::Value) -> &str {
    doc.get("kind").and_then(|k| k.as_str()).unwrap_or("?")
}

/// The next document of `docs` as a `kind`, or an error naming `file` and what it holds instead.
pub fn next<T: DeserializeOwned>(
    docs: &mut impl Iterator<Item = serde_json::Value>,
    kind: &str,
    file: &str,
) -> Result<T> {
    let doc = docs.next().with_context(|| format!("{file} lacks its {kind}"))?;
    let found = kind_of(&doc);
    if found != kind {
        bail!("{file}: expected a {kind}, found a {found}");
    }
    serde_json::from_value(doc).with_context(|| format!("{file}: its {kind}"))
}

/// Applies `object` server-side as `manager`, forced.
pub async fn apply<K>(api: &Api<K>, object: &K, manager: &str) -> Result<()>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object.meta().name.clone().context("an object without a name")?;
    api.patch(&name, &PatchParams::apply(manager).force(), &Patch::Apply(object))
        .await
        .with_context(|| format!("apply {} {name}", K::kind(&Default::default())))?;
    Ok(())
}

/// Deletes the object `name` (in the background); one that is not there is fine.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("delete {} {name}", K::kind(&Default::default()))),
    }
}

/// Deletes every object `selector` selects (in the background); none is fine.
pub async fn delete_labelled<K>(api: &Api<K>, selector: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let list = api
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("list the {}s labelled {selector}", K::kind(&Default::default())))?;
    for object in list.items {
        if let Some(name) = object.metadata.name {
            delete(api, &name).await?;
        }
    }
    Ok(())
}

/// The name of an object, empty when it has none (deleting it then finds nothing).
pub fn name_of<K: Resource>(object: &K) -> String {
    object.meta().name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};

    use super::*;

    #[test]
    fn documents_come_in_order_and_each_must_be_its_kind() {
        let text = "# a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: n}\n---\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: s, namespace: n}\n";
        let docs = documents(text, "m.yaml").unwrap();
        assert_eq!(docs.iter().map(kind_of).collect::<Vec<_>>(), ["Namespace", "ServiceAccount"]);
        let mut it = docs.clone().into_iter();
        let ns: Namespace = next(&mut it, "Namespace", "m.yaml").unwrap();
        assert_eq!(name_of(&ns), "n");
        let sa: ServiceAccount = next(&mut it, "ServiceAccount", "m.yaml").unwrap();
        assert_eq!(name_of(&sa), "s");
        let err = next::<Namespace>(&mut it, "Namespace", "m.yaml").unwrap_err().to_string();
        assert_eq!(err, "m.yaml lacks its Namespace");
        let mut it = docs.into_iter();
        let err = next::<ServiceAccount>(&mut it, "ServiceAccount", "m.yaml").unwrap_err().to_string();
        assert_eq!(err, "m.yaml: expected a ServiceAccount, found a Namespace");
        assert!(documents("a: [", "bad.yaml").unwrap_err().to_string().contains("bad.yaml is not YAML"));
    }
}
