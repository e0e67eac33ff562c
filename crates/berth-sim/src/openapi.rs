//! The OpenAPI documents kubectl reads: v3 per group/version (that the server validates fields
//! itself, `fieldValidation` on PATCH; `kubectl explain`) and v2, one document, as JSON or in
//! gnostic's protobuf (kubectl 1.27 and 1.28 need it for apply, diff, edit, replace and
//! explain). Built-in types have their full schemas, from k8s-openapi's, with the patch merge
//! keys the sim's strategic merge uses; a CRD's schema is its own.

use std::sync::OnceLock;

use serde_json::{Map, Value, json};

use crate::resources::{Behaviour, Registry, ResourceType};

const V2_REFS: &str = "#/definitions/";
const V3_REFS: &str = "#/components/schemas/";
const GVK: &str = "x-kubernetes-group-version-kind";

/// Every `$ref` under `value` with `V2_REFS` replaced by `prefix`.
fn rebase_refs(value: &mut Value, prefix: &str) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get_mut("$ref")
                && let Some(name) = reference.strip_prefix(V2_REFS)
            {
                *reference = format!("{prefix}{name}");
            }
            map.values_mut().for_each(|v| rebase_refs(v, prefix));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_refs(v, prefix)),
        _ => {}
    }
}

/// The strategic-merge metadata of a definition's list properties, as the real schemas carry
/// it (`x-kubernetes-patch-merge-key`, `x-kubernetes-patch-strategy`).
fn add_patch_metadata(definition: &mut Value) {
    let Some(properties) = definition["properties"].as_object_mut() else {
        return;
    };
    for (field, property) in properties.iter_mut() {
        if property["type"] != "array" {
            continue;
        }
        let item = property["items"]["$ref"].as_str().unwrap_or_default();
        let example = item
            .ends_with(".ContainerPort")
            .then(|| json!({"containerPort": 0}));
        if let Some(key) = crate::patch::merge_key(field, example.as_ref()) {
            property["x-kubernetes-patch-merge-key"] = json!(key);
            property["x-kubernetes-patch-strategy"] = json!("merge");
        }
    }
}

/// The built-in definitions with references under `prefix`, made once per prefix.
fn builtin_schemas(prefix: &'static str) -> &'static Map<String, Value> {
    static V2: OnceLock<Map<String, Value>> = OnceLock::new();
    static V3: OnceLock<Map<String, Value>> = OnceLock::new();
    let cell = if prefix == V2_REFS { &V2 } else { &V3 };
    cell.get_or_init(|| {
        let mut schemas = crate::typed::definitions().schemas.clone();
        for definition in schemas.values_mut() {
            add_patch_metadata(definition);
            rebase_refs(definition, prefix);
        }
        schemas
    })
}

/// The group/version/kind a root definition is for, as its extension lists them.
fn gvk_of(t: &ResourceType) -> Value {
    json!({"group": t.group, "version": t.version, "kind": t.kind})
}

/// Adds `t`'s group/version/kind to the definition's extension list.
fn mark_root(definition: &mut Value, t: &ResourceType) {
    let gvk = gvk_of(t);
    match definition[GVK].as_array_mut() {
        Some(list) if !list.contains(&gvk) => list.push(gvk),
        Some(_) => {}
        None => definition[GVK] = json!([gvk]),
    }
}

/// A type's definition name and root schema: a built-in's from k8s-openapi, else (custom
/// resources, reviews) its own schema or an open object.
fn root_of(t: &ResourceType) -> (String, Option<Value>) {
    if !t.is_custom
        && let Some(name) = crate::typed::definitions().name_of(&t.group, &t.resource)
    {
        return (name.to_owned(), None);
    }
    let mut schema =
        t.schema.as_ref().map(|s| s.root.clone()).unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
    if let Value::Object(map) = &mut schema {
        let properties = map.entry("properties").or_insert_with(|| json!({}));
        properties["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
        properties["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
        properties["metadata"] = json!({"type": "object", "description": "Standard object's metadata.", "x-kubernetes-preserve-unknown-fields": true});
    }
    (schema_name(t), Some(schema))
}

/// `/openapi/v2`: every served type's definition in one Swagger 2.0 document.
pub fn v2(registry: &Registry) -> Value {
    let mut definitions = builtin_schemas(V2_REFS).clone();
    for t in registry.all() {
        let (name, own) = root_of(t);
        let definition = definitions
            .entry(name)
            .or_insert_with(|| own.unwrap_or_default());
        mark_root(definition, t);
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-berth-sim"},
        "paths": {},
        "definitions": definitions,
    })
}

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
    let mut schemas = builtin_schemas(V3_REFS).clone();
    for t in types {
        let gvk = gvk_of(t);
        let (name, own) = root_of(t);
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
        let reference = json!({"$ref": format!("{V3_REFS}{name}")});
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
        if t.behaviour == Behaviour::Review {
            paths.insert(base, json!({"post": {"x-kubernetes-group-version-kind": gvk, "parameters": [field_validation], "responses": ok}}));
        } else {
            paths.insert(base.clone(), json!({
                "post": {"x-kubernetes-group-version-kind": gvk, "parameters": [field_validation.clone()], "responses": ok},
            }));
            paths.insert(format!("{base}/{{name}}"), json!({
                "get": {"x-kubernetes-group-version-kind": gvk, "responses": ok},
                "put": {"x-kubernetes-group-version-kind": gvk, "parameters": [field_validation.clone()], "responses": ok},
                "patch": {"x-kubernetes-group-version-kind": gvk, "parameters": [field_validation.clone()], "responses": ok},
            }));
        }
        let definition = schemas
            .entry(name)
            .or_insert_with(|| own.unwrap_or_default());
        mark_root(definition, t);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-berth-sim"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}
