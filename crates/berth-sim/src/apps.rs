//! apps/v1 at the API: Deployments and ReplicaSets defaulted and validated as the real server
//! does, and the label selectors they (and admission policies) use. Their controllers are in
//! `workloads.rs`.

use serde_json::{Value, json};

use crate::{error::Cause, selector::LabelSelector};

/// The label that ties a ReplicaSet and its pods to one template of their Deployment.
pub const TEMPLATE_HASH: &str = "pod-template-hash";

/// Fills in what the real server defaults for a Deployment or ReplicaSet (but its pod
/// template's spec, which `builtin.rs` defaults as a pod's).
pub fn default_on_create(resource: &str, object: &mut Value) {
    let spec = &mut object["spec"];
    if spec["replicas"].is_null() {
        spec["replicas"] = json!(1);
    }
    if resource == "deployments" {
        if spec["strategy"]["type"].is_null() {
            spec["strategy"]["type"] = json!("RollingUpdate");
        }
        if spec["strategy"]["type"] == "RollingUpdate" {
            for key in ["maxUnavailable", "maxSurge"] {
                if spec["strategy"]["rollingUpdate"][key].is_null() {
                    spec["strategy"]["rollingUpdate"][key] = json!("25%");
                }
            }
        }
        if spec["revisionHistoryLimit"].is_null() {
            spec["revisionHistoryLimit"] = json!(10);
        }
        if spec["progressDeadlineSeconds"].is_null() {
            spec["progressDeadlineSeconds"] = json!(600);
        }
    }
}

/// The status the strategies start a new object with: a Deployment's fields are all
/// optional, a ReplicaSet's `replicas` is not.
pub fn new_status(resource: &str) -> Value {
    match resource {
        "deployments" => json!({}),
        _ => json!({"replicas": 0}),
    }
}

/// A label selector object (`matchLabels`, `matchExpressions`) as the string form
/// `kubectl get -l` takes, which the Scale subresource reports.
pub fn selector_string(selector: &Value) -> String {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for expression in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expression["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = expression["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match expression["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

/// Whether a label selector object selects `labels` (a JSON map); `{}` selects everything.
pub(crate) fn selects(selector: &Value, labels: &Value) -> bool {
    let labels = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    LabelSelector::parse(&selector_string(selector)).is_ok_and(|s| s.matches(&labels))
}

/// A map as Go's `%#v` prints a `map[string]string`, as validation messages show it.
fn go_map(labels: &Value) -> String {
    let entries: Vec<String> = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k:?}:{:?}", v.as_str().unwrap_or_default()))
        .collect();
    format!("map[string]string{{{}}}", entries.join(", "))
}

/// What the real server refuses in a Deployment or ReplicaSet, in its words.
pub fn validate(object: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let spec = &object["spec"];
    if let Some(replicas) = spec["replicas"].as_i64().filter(|r| *r < 0) {
        causes.push(Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            field: "spec.replicas".into(),
        });
    }
    let selector = &spec["selector"];
    let template_labels = &spec["template"]["metadata"]["labels"];
    if !selector.is_object() {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: "spec.selector".into(),
        });
    } else if selector_string(selector).is_empty() {
        causes.push(Cause {
            reason: "FieldValueInvalid".into(),
            message: "Invalid value: \"null\": empty selector is invalid for deployment".into(),
            field: "spec.selector".into(),
        });
    } else if !selects(selector, template_labels) {
        causes.push(Cause {
            reason: "FieldValueInvalid".into(),
            message: format!(
                "Invalid value: {}: `selector` does not match template `labels`",
                go_map(template_labels)
            ),
            field: "spec.template.metadata.labels".into(),
        });
    }
    let pod_spec = &spec["template"]["spec"];
    if pod_spec["containers"].as_array().is_none_or(Vec::is_empty) {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: "spec.template.spec.containers".into(),
        });
    }
    if let Some(policy) = pod_spec["restartPolicy"].as_str()
        && policy != "Always"
    {
        causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!("Unsupported value: \"{policy}\": supported values: \"Always\""),
            field: "spec.template.spec.restartPolicy".into(),
        });
    }
    if let Some(kind) = spec["strategy"]["type"].as_str()
        && !["Recreate", "RollingUpdate"].contains(&kind)
    {
        causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: \"{kind}\": supported values: \"Recreate\", \"RollingUpdate\""
            ),
            field: "spec.strategy.type".into(),
        });
    }
    causes
}

/// apps/v1 selectors cannot change.
pub fn update_forbidden(old: &Value, new: &Value) -> Option<Cause> {
    (old["spec"]["selector"] != new["spec"]["selector"]).then(|| Cause {
        reason: "FieldValueInvalid".into(),
        message: format!(
            "Invalid value: {}: field is immutable",
            serde_json::to_string(&new["spec"]["selector"]).unwrap_or_default()
        ),
        field: "spec.selector".into(),
    })
}
