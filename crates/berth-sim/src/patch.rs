//! The patch types the API server accepts besides server-side apply: JSON merge patch
//! (RFC 7386), JSON patch (RFC 6902, incl. `test`), and strategic merge patch for built-in
//! types (lists merged by their patch merge keys, `$patch` directives).

use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

/// The patch content types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let base = content_type.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml"
            | "application/apply-patch+json"
            | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Applies a JSON merge patch. As in the API server: a patch that is not an object or an
/// array is `Invalid JSON Patch` (400); an array replaces the whole document (RFC 7386), which
/// then cannot be decoded as an object (422 on the field `patch`).
pub fn merge(target: &mut Value, patch: &Value) -> ApiResult<()> {
    match patch {
        Value::Object(_) => {
            json_patch::merge(target, patch);
            Ok(())
        }
        Value::Array(_) => Err(ApiError::invalid(
            "",
            "",
            "",
            vec![crate::error::Cause {
                reason: "FieldValueInvalid".to_owned(),
                message: format!(
                    "Invalid value: {:?}: couldn't get version/kind; json parse error: json: cannot unmarshal array into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
                    patch.to_string()
                ),
                field: "patch".to_owned(),
            }],
        )),
        _ => Err(ApiError::bad_request("Invalid JSON Patch")),
    }
}

/// Applies an RFC 6902 JSON patch; a failed `test` or a bad path is an error the API server
/// reports as 422 (test) or 500-free 422/400.
pub fn json(target: &mut Value, patch: &Value) -> ApiResult<()> {
    // As in the API server's JSON patch library, `test` of a missing path against `null`
    // passes (kube's finalizer helper relies on it when there are no finalizers yet).
    let mut patch = patch.clone();
    if let Value::Array(ops) = &mut patch {
        ops.retain(|op| {
            let missing = op["path"]
                .as_str()
                .is_some_and(|p| target.pointer(p).is_none());
            !(op["op"] == "test" && op["value"].is_null() && missing)
        });
    }
    let operations: json_patch::Patch = serde_json::from_value(patch).map_err(|e| {
        ApiError::bad_request(format!(
            "the server rejected our request due to an error in our request: {e}"
        ))
    })?;
    json_patch::patch(target, &operations).map_err(|e| ApiError::Invalid {
        message: format!("the server rejected our request due to an error in our request: {e}"),
        kind: String::new(),
        name: String::new(),
        group: String::new(),
        causes: vec![],
    })
}

/// The patch merge key of a list field of a built-in type, if the list merges by key.
/// `element` disambiguates `ports` (container ports merge by `containerPort`, service ports by
/// `port`).
pub fn merge_key(field: &str, element: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" | "addresses" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" | "podIPs" | "hostIPs" => Some("ip"),
        "ports" => Some(
            if element.is_some_and(|e| e.get("containerPort").is_some()) {
                "containerPort"
            } else {
                "port"
            },
        ),
        _ => None,
    }
}

/// Lists of primitives that merge as sets.
fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

/// Applies a strategic merge patch to a built-in object.
pub fn strategic(target: &mut Value, patch: &Value) -> ApiResult<()> {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            strategic_map(t, p);
            Ok(())
        }
        _ => Err(ApiError::bad_request(
            "the strategic merge patch must be a JSON object",
        )),
    }
}

fn strategic_map(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch.clone();
        replaced.remove("$patch");
        *target = replaced;
        return;
    }
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) =
                (target.get_mut(field), value.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if value.is_null() {
            target.remove(key);
            continue;
        }
        match (target.get_mut(key), value) {
            (Some(Value::Object(t)), Value::Object(p)) => strategic_map(t, p),
            (Some(Value::Array(t)), Value::Array(p)) => strategic_list(key, t, p),
            (_, Value::Object(p)) => {
                let mut fresh = Map::new();
                strategic_map(&mut fresh, p);
                target.insert(key.clone(), Value::Object(fresh));
            }
            (_, Value::Array(p)) => {
                let mut fresh = vec![];
                strategic_list(key, &mut fresh, p);
                target.insert(key.clone(), Value::Array(fresh));
            }
            _ => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

fn strategic_list(field: &str, target: &mut Vec<Value>, patch: &[Value]) {
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *target = patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .cloned()
            .collect();
        return;
    }
    if is_set_list(field) {
        for value in patch {
            if !target.contains(value) {
                target.push(value.clone());
            }
        }
        return;
    }
    let Some(key) = merge_key(field, patch.first().or(target.first())) else {
        *target = patch.to_vec();
        return;
    };
    for element in patch {
        let id = element.get(key);
        let position = target.iter().position(|t| t.get(key) == id && id.is_some());
        let delete = element.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                target.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let (Value::Object(t), Value::Object(p)) = (&mut target[i], element) {
                    strategic_map(t, p);
                }
            }
            (None, false) => {
                let mut fresh = Map::new();
                if let Value::Object(p) = element {
                    strategic_map(&mut fresh, p);
                }
                target.push(Value::Object(fresh));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_containers_by_name_and_env_by_name() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ]}});
        strategic(
            &mut pod,
            &json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "c:1"}
            ]}}),
        )
        .unwrap();
        assert_eq!(
            pod,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                {"name": "c", "image": "c:1"}
            ]}})
        );
    }

    #[test]
    fn strategic_ports_conditions_finalizers_and_directives() {
        let mut obj = json!({
            "metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "spec": {"ports": [{"containerPort": 80, "name": "http"}], "tolerations": [{"key": "a"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        });
        strategic(&mut obj, &json!({
            "metadata": {"finalizers": ["b", "a"], "labels": {"x": null}},
            "spec": {"ports": [{"containerPort": 80, "protocol": "TCP"}], "tolerations": [{"key": "b"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Scheduled", "status": "True"}]}
        })).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(obj["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(
            obj["spec"]["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}])
        );
        assert_eq!(
            obj["spec"]["tolerations"],
            json!([{"key": "b"}]),
            "lists without a merge key are replaced"
        );
        assert_eq!(obj["status"]["conditions"][0]["status"], "True");
        assert_eq!(obj["status"]["conditions"].as_array().unwrap().len(), 2);

        strategic(
            &mut obj,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["b"]));
        strategic(
            &mut obj,
            &json!({"metadata": {"labels": {"$patch": "replace", "z": "3"}}}),
        )
        .unwrap();
        assert_eq!(obj["metadata"]["labels"], json!({"z": "3"}));
    }

    #[test]
    fn json_patch_test_of_a_missing_path_against_null_passes() {
        let mut obj = json!({"metadata": {"name": "a"}});
        let add = json!([{"op": "test", "path": "/metadata/finalizers", "value": null}, {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]);
        json(&mut obj, &add).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["x"]));
        assert_eq!(
            json(&mut obj, &add).unwrap_err().code(),
            422,
            "now the path exists and is not null"
        );
    }

    #[test]
    fn json_patch_test_op_guards_the_change() {
        let mut obj = json!({"metadata": {"finalizers": ["a"]}});
        let guarded = json!([{"op": "test", "path": "/metadata/finalizers", "value": ["a"]}, {"op": "remove", "path": "/metadata/finalizers/0"}]);
        json(&mut obj, &guarded).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!([]));
        let err = json(&mut obj, &guarded).unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!([]),
            "a failed test changes nothing"
        );
    }
}
