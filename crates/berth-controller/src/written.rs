//! Writes whose answer the operator reads only for the written object's resourceVersion.
//!
//! The API server answers a create or a patch with the whole object: a pod of a kind with its
//! containers, a workspace with its managed fields. `Api<K>` decodes that answer into `K`,
//! which the operator then dropped: at 10 000 starts, decoding the answers of status writes
//! and pod creates was about 8 % of its CPU (`bench/scale.md`). Here the answer is read for
//! `metadata.resourceVersion` only; the rest is skipped by the JSON reader, not built.
//! Refusals are kube's `Error::Api` with the API server's `Status`, as from `Api<K>`.

use kube::{
    Client, Resource,
    api::{Patch, PatchParams, PostParams},
    core::Request,
};
use serde::{Deserialize, Serialize};

/// The part of a write's answer the operator reads.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    metadata: AnswerMeta,
}

#[derive(Deserialize, Default)]
struct AnswerMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

/// Creates `object` in `namespace`; returns the created object's resourceVersion.
pub async fn create<K>(
    client: &Client,
    namespace: &str,
    params: &PostParams,
    object: &K,
) -> kube::Result<Option<String>>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let mut request = Request::new(K::url_path(&(), Some(namespace)))
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("create");
    answered(client, request).await
}

/// Patches `K` `name` in `namespace`, or its `subresource` (`status`); returns the object's
/// resourceVersion after.
pub async fn patch<K, P>(
    client: &Client,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
    params: &PatchParams,
    patch: &Patch<P>,
) -> kube::Result<Option<String>>
where
    K: Resource<DynamicType = ()>,
    P: Serialize,
{
    let target = Request::new(K::url_path(&(), Some(namespace)));
    let mut request = match subresource {
        Some(subresource) => target.patch_subresource(subresource, name, params, patch),
        None => target.patch(name, params, patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert(match subresource {
        Some(_) => "patch_subresource",
        None => "patch",
    });
    answered(client, request).await
}

async fn answered(
    client: &Client,
    request: http::Request<Vec<u8>>,
) -> kube::Result<Option<String>> {
    let answer: Answer = client.request(request).await?;
    Ok(answer.metadata.resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_for_its_resource_version_only() {
        // A pod's answer: the spec and status are skipped, whatever they hold.
        let text = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","resourceVersion":"42",
            "managedFields":[{"manager":"berth","fieldsV1":{"f:spec":{}}}]},
            "spec":{"containers":[{"name":"c","image":"i","env":[{"name":"X","value":"y"}]}]},
            "status":{"phase":"Pending"}}"#;
        let answer: Answer = serde_json::from_str(text).unwrap();
        assert_eq!(answer.metadata.resource_version.as_deref(), Some("42"));
        // An answer without metadata (no API server sends one) reads as no version.
        let bare: Answer = serde_json::from_str("{}").unwrap();
        assert_eq!(bare.metadata.resource_version, None);
    }
}
