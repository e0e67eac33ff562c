//! OpenAPI v3 documents, enough for kubectl: it reads them to learn that the server validates
//! fields itself (`fieldValidation` on PATCH) and, for `kubectl explain`, a CRD's schema.

use serde_json::{Map, Value, json};

use crate::resources::{Behaviour, Registry, ResourceType};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per group/version.
pub fn index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    let mut seen = std::collections::BTreeSet::new();
    for t in registry.all() {
        if seen.insert((t.group.clone(), t.version.clone())) {
            let path = gv_path(&t.group, &t.version);
            paths.insert(path.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", registry_hash(registry))}));
        }
    }
    json!({"paths": paths})
}

/// Changes when the set of served types changes, so kubectl's cache notices new CRDs.
fn registry_hash(registry: &Registry) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for t in registry.all() {
        (&t.group, &t.version, &t.resource).hash(&mut hasher);
        t.schema
            .as_ref()
            .map(|s| s.root.to_string())
            .hash(&mut hasher);
    }
    format!("{:016X}", hasher.finish())
}

fn schema_name(t: &ResourceType) -> String {
    let reversed: Vec<&str> = t.group.split('.').rev().collect();
    let prefix = if t.group.is_empty() {
        "io.k8s.api.core".to_owned()
    } else {
        reversed.join(".")
    };
    format!("{prefix}.{}.{}", t.version, t.kind)
}

/// The document of one group/version.
pub fn group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types: Vec<_> = registry
        .all()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for t in types {
        let gvk = json!([{"group": t.group, "version": t.version, "kind": t.kind}]);
        let base = if t.namespaced {
            format!(
                "/{}/namespaces/{{namespace}}/{}",
                gv_path(&t.group, &t.version),
                t.resource
            )
        } else {
            format!("/{}/{}", gv_path(&t.group, &t.version), t.resource)
        };
        let field_validation = json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let name = schema_name(t);
        let reference = json!({"$ref": format!("#/components/schemas/{name}")});
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
        if t.behaviour == Behaviour::Review {
            paths.insert(base, json!({"post": {"x-kubernetes-group-version-kind": gvk[0], "parameters": [field_validation], "responses": ok}}));
        } else {
            paths.insert(base.clone(), json!({
                "post": {"x-kubernetes-group-version-kind": gvk[0], "parameters": [field_validation.clone()], "responses": ok},
            }));
            paths.insert(format!("{base}/{{name}}"), json!({
                "get": {"x-kubernetes-group-version-kind": gvk[0], "responses": ok},
                "put": {"x-kubernetes-group-version-kind": gvk[0], "parameters": [field_validation.clone()], "responses": ok},
                "patch": {"x-kubernetes-group-version-kind": gvk[0], "parameters": [field_validation.clone()], "responses": ok},
            }));
        }
        let mut schema = t.schema.as_ref().map(|s| s.root.clone()).unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        if let Value::Object(map) = &mut schema {
            map.insert("x-kubernetes-group-version-kind".into(), gvk);
            let properties = map.entry("properties").or_insert_with(|| json!({}));
            properties["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
            properties["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
            properties["metadata"] = json!({"type": "object", "description": "Standard object's metadata.", "x-kubernetes-preserve-unknown-fields": true});
        }
        schemas.insert(name, schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-berth-sim"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}
