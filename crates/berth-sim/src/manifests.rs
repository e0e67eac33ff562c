//! Creating the objects of a multi-document YAML manifest through any client, resolving each
//! kind through the API server's discovery (what `kubectl create -f` does). `berth dev` uses
//! it for `examples/` and `deploy/rbac/`, tests for the RBAC the README documents.

use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, GroupVersionKind, PostParams},
    discovery::{Scope, pinned_kind},
};

/// Creates every object in `text` (YAML documents separated by `---`), in order; objects
/// without a namespace that need one go to `default_namespace`. Returns `kind/name` of each.
pub async fn create_all(
    client: &Client,
    text: &str,
    default_namespace: &str,
) -> Result<Vec<String>, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    let mut created = vec![];
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        let object: DynamicObject =
            serde_json::from_value(document).map_err(|e| format!("not an object: {e}"))?;
        let types = object
            .types
            .clone()
            .ok_or("an object without apiVersion and kind")?;
        let gvk = GroupVersionKind::try_from(&types).map_err(|e| e.to_string())?;
        let (resource, capabilities) = pinned_kind(client, &gvk)
            .await
            .map_err(|e| format!("{} {}: {e}", types.api_version, types.kind))?;
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                object.namespace().as_deref().unwrap_or(default_namespace),
                &resource,
            ),
        };
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("{}/{}: {e}", types.kind, object.name_any()))?;
        created.push(format!(
            "{}/{}",
            types.kind.to_lowercase(),
            object.name_any()
        ));
    }
    Ok(created)
}
