//! What the real API server checks of a pod's containers beyond their names and of a claim's
//! size: resource quantities and their limits, volume mounts, environment sources, downward
//! API field paths, with its messages (`pkg/apis/core/validation/validation.go`).

use serde_json::Value;

use crate::{
    error::{Cause, invalid, not_supported},
    quantity::parse_milli,
};

fn required(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".to_owned(),
        message: if detail.is_empty() {
            "Required value".to_owned()
        } else {
            format!("Required value: {detail}")
        },
        field: field.to_owned(),
    }
}

/// Not a native resource (`cpu`, `memory`, `kubernetes.io/...`): `example.com/gpu`.
fn is_extended(resource: &str) -> bool {
    resource.contains('/')
        && !resource.contains("kubernetes.io/")
        && !resource.starts_with("requests.")
}

/// Native resources other than huge pages may be overcommitted (a request below the limit).
fn overcommit_allowed(resource: &str) -> bool {
    let native = !resource.contains('/') || resource.contains("kubernetes.io/");
    native && !resource.starts_with("hugepages-")
}

/// A container's quantity as text (the sim stores them as canonical strings).
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The SetDefaults_Pod rule: a container with a limit and no request of a resource requests
/// its limit.
pub fn default_requests(spec: &mut Value) {
    for list in ["initContainers", "containers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            let Some(limits) = container["resources"]["limits"].as_object().cloned() else {
                continue;
            };
            let requests = &mut container["resources"]["requests"];
            if requests.is_null() {
                *requests = Value::Object(Default::default());
            }
            if let Some(requests) = requests.as_object_mut() {
                for (resource, limit) in limits {
                    requests.entry(resource).or_insert(limit);
                }
            }
        }
    }
}

/// `ValidateResourceQuantityValue`: never negative; an extended resource in whole units.
fn check_quantity(resource: &str, value: &Value, field: &str, causes: &mut Vec<Cause>) {
    let shown = text(value);
    let Some(milli) = parse_milli(&shown) else {
        return;
    };
    if milli < 0 {
        causes.push(invalid(field, &shown, "must be greater than or equal to 0"));
    }
    if is_extended(resource) && milli % 1000 != 0 {
        causes.push(invalid(field, &shown, "must be an integer"));
    }
}

/// `validateResourceRequirements`: the limits, then the requests and how each compares with
/// its limit (keys in order: the real server's map order is random).
fn check_resources(container: &Value, base: &str, causes: &mut Vec<Cause>) {
    let resources = &container["resources"];
    let (limits_path, requests_path) = (
        format!("{base}.resources.limits"),
        format!("{base}.resources.requests"),
    );
    let limits = resources["limits"].as_object();
    for (resource, value) in limits.into_iter().flatten() {
        check_quantity(
            resource,
            value,
            &format!("{limits_path}[{resource}]"),
            causes,
        );
    }
    for (resource, value) in resources["requests"].as_object().into_iter().flatten() {
        check_quantity(
            resource,
            value,
            &format!("{requests_path}[{resource}]"),
            causes,
        );
        let request = text(value);
        match limits.and_then(|l| l.get(resource)) {
            Some(limit) => {
                let limit = text(limit);
                let (Some(r), Some(l)) = (parse_milli(&request), parse_milli(&limit)) else {
                    continue;
                };
                if r != l && !overcommit_allowed(resource) {
                    causes.push(invalid(
                        &requests_path,
                        &request,
                        &format!("must be equal to {resource} limit of {limit}"),
                    ));
                } else if r > l {
                    causes.push(invalid(
                        &requests_path,
                        &request,
                        &format!("must be less than or equal to {resource} limit of {limit}"),
                    ));
                }
            }
            None if !overcommit_allowed(resource) => causes.push(required(
                &limits_path,
                "Limit must be set for non overcommitable resources",
            )),
            None => {}
        }
    }
}

/// `ValidateVolumeMounts`: each mountPath set and unique in the container.
fn check_mounts(container: &Value, base: &str, causes: &mut Vec<Cause>) {
    let mut seen: Vec<&str> = vec![];
    for (j, mount) in container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("{base}.volumeMounts[{j}].mountPath");
        match mount["mountPath"].as_str().filter(|p| !p.is_empty()) {
            None => causes.push(required(&field, "")),
            Some(path) if seen.contains(&path) => {
                causes.push(invalid(&field, path, "must be unique"))
            }
            Some(path) => seen.push(path),
        }
    }
}

/// The field paths the downward API serves to environment variables, besides a label's or an
/// annotation's value (`metadata.labels['team']`).
const ENV_FIELD_PATHS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

/// The field paths the downward API serves to a volume's files.
const VOLUME_FIELD_PATHS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];

/// Every field label a pod's downward API knows (`ConvertDownwardAPIFieldLabel`).
const POD_FIELD_LABELS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "spec.schedulerName",
    "status.phase",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

/// The resources a `resourceFieldRef` may name (huge pages by prefix besides).
const RESOURCE_FIELDS: &[&str] = &[
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
];

/// `validateObjectFieldSelector`: the field path is one the pod's downward API converts,
/// and one of `allowed` (a label or annotation subscript aside).
fn check_field_ref(selector: &Value, field: &str, allowed: &[&str], causes: &mut Vec<Cause>) {
    let path_field = format!("{field}.fieldPath");
    let version = selector["apiVersion"].as_str().unwrap_or("v1");
    let Some(path) = selector["fieldPath"].as_str().filter(|p| !p.is_empty()) else {
        causes.push(required(&path_field, ""));
        return;
    };
    let converting = |why: String| {
        invalid(
            &path_field,
            path,
            &format!("error converting fieldPath: {why}"),
        )
    };
    if version != "v1" {
        causes.push(converting(format!("unsupported pod version: {version}")));
        return;
    }
    if let Some((label, rest)) = path.split_once('[') {
        if !POD_FIELD_LABELS.contains(&label) {
            causes.push(converting(format!("field label not supported: {path}")));
        } else if !matches!(label, "metadata.labels" | "metadata.annotations") {
            causes.push(converting(format!(
                "field label does not support subscript: {path}"
            )));
        } else if !(rest.ends_with("']") && rest.starts_with('\'')) {
            causes.push(invalid(field, path, "does not support subscript"));
        }
        return;
    }
    if !POD_FIELD_LABELS.contains(&path) {
        causes.push(converting(format!("field label not supported: {path}")));
    } else if !allowed.contains(&path) {
        causes.push(not_supported(&path_field, path, allowed));
    }
}

/// `validateContainerResourceFieldSelector`: a resource it serves; in a volume, the container.
fn check_resource_field_ref(selector: &Value, field: &str, volume: bool, causes: &mut Vec<Cause>) {
    let resource = selector["resource"].as_str().unwrap_or_default();
    if volume && selector["containerName"].as_str().is_none_or(str::is_empty) {
        causes.push(required(&format!("{field}.containerName"), ""));
    } else if resource.is_empty() {
        causes.push(required(&format!("{field}.resource"), ""));
    } else if !RESOURCE_FIELDS.contains(&resource)
        && !resource.starts_with("requests.hugepages-")
        && !resource.starts_with("limits.hugepages-")
    {
        causes.push(not_supported(
            &format!("{field}.resource"),
            resource,
            RESOURCE_FIELDS,
        ));
    }
}

/// `validateEnvVarValueFrom`: exactly one source, and none beside a value.
fn check_env(container: &Value, base: &str, causes: &mut Vec<Cause>) {
    for (j, var) in container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let from = &var["valueFrom"];
        if from.is_null() {
            continue;
        }
        let field = format!("{base}.env[{j}].valueFrom");
        let mut sources = 0;
        if !from["fieldRef"].is_null() {
            sources += 1;
            check_field_ref(
                &from["fieldRef"],
                &format!("{field}.fieldRef"),
                ENV_FIELD_PATHS,
                causes,
            );
        }
        if !from["resourceFieldRef"].is_null() {
            sources += 1;
            check_resource_field_ref(
                &from["resourceFieldRef"],
                &format!("{field}.resourceFieldRef"),
                false,
                causes,
            );
        }
        sources += ["configMapKeyRef", "secretKeyRef"]
            .iter()
            .filter(|k| !from[**k].is_null())
            .count();
        let value = var["value"].as_str().unwrap_or_default();
        if sources == 0 {
            causes.push(invalid(
                &field,
                "",
                "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
            ));
        } else if !value.is_empty() {
            causes.push(invalid(
                &field,
                "",
                "may not be specified when `value` is not empty",
            ));
        } else if sources > 1 {
            causes.push(invalid(
                &field,
                "",
                "may not have more than one field specified at a time",
            ));
        }
    }
}

/// The checks of one container (or init container) at `base` (`spec.containers[0]`), in the
/// order the real validation makes them.
pub fn check_container(container: &Value, base: &str, causes: &mut Vec<Cause>) {
    check_env(container, base, causes);
    check_mounts(container, base, causes);
    check_resources(container, base, causes);
}

/// The downward API items of a pod's volumes, plain and projected. The real validation names
/// the volume's source, not the item, in its paths (`spec.volumes[0].downwardAPI.fieldRef`).
pub fn check_volumes(spec: &Value, causes: &mut Vec<Cause>) {
    for (i, volume) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let mut sources = vec![(
            format!("spec.volumes[{i}].downwardAPI"),
            &volume["downwardAPI"],
        )];
        for (j, source) in volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            sources.push((
                format!("spec.volumes[{i}].projected.sources[{j}].downwardAPI"),
                &source["downwardAPI"],
            ));
        }
        for (field, downward) in sources {
            for item in downward["items"].as_array().into_iter().flatten() {
                if !item["fieldRef"].is_null() {
                    check_field_ref(
                        &item["fieldRef"],
                        &format!("{field}.fieldRef"),
                        VOLUME_FIELD_PATHS,
                        causes,
                    );
                }
                if !item["resourceFieldRef"].is_null() {
                    check_resource_field_ref(
                        &item["resourceFieldRef"],
                        &format!("{field}.resourceFieldRef"),
                        true,
                        causes,
                    );
                }
            }
        }
    }
}

/// `ValidatePersistentVolumeClaimSpec`: an access mode, and a storage request above zero.
pub fn check_claim(claim: &Value) -> Vec<Cause> {
    let spec = &claim["spec"];
    let mut causes = vec![];
    if spec["accessModes"].as_array().is_none_or(|m| m.is_empty()) {
        causes.push(required(
            "spec.accessModes",
            "at least 1 access mode is required",
        ));
    }
    let field = "spec.resources[storage]";
    match spec["resources"]["requests"].get("storage") {
        None => causes.push(required(field, "")),
        Some(size) => {
            let shown = text(size);
            if parse_milli(&shown).is_some_and(|milli| milli <= 0) {
                causes.push(invalid(field, &shown, "must be greater than zero"));
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(container: Value) -> Vec<String> {
        let mut causes = vec![];
        check_container(&container, "spec.containers[0]", &mut causes);
        causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn resources_as_the_real_server_checks_them() {
        let rows = [
            (
                json!({"requests": {"cpu": "-1"}}),
                vec![
                    "spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0",
                ],
            ),
            (
                json!({"requests": {"cpu": "200m"}, "limits": {"cpu": "100m"}}),
                vec![
                    "spec.containers[0].resources.requests: Invalid value: \"200m\": must be less than or equal to cpu limit of 100m",
                ],
            ),
            (
                json!({"requests": {"example.com/gpu": "1"}}),
                vec![
                    "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
                ],
            ),
            (
                json!({"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "2"}}),
                vec![
                    "spec.containers[0].resources.requests: Invalid value: \"1\": must be equal to example.com/gpu limit of 2",
                ],
            ),
            (
                json!({"requests": {"example.com/gpu": "500m"}, "limits": {"example.com/gpu": "500m"}}),
                vec![
                    "spec.containers[0].resources.limits[example.com/gpu]: Invalid value: \"500m\": must be an integer",
                    "spec.containers[0].resources.requests[example.com/gpu]: Invalid value: \"500m\": must be an integer",
                ],
            ),
            (
                json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}),
                vec![],
            ),
        ];
        for (resources, want) in rows {
            assert_eq!(messages(json!({"resources": resources})), want);
        }
    }

    #[test]
    fn a_limit_without_a_request_requests_the_limit() {
        let mut spec = json!({"containers": [{"resources": {"limits": {"memory": "-1Gi"}}}]});
        default_requests(&mut spec);
        assert_eq!(
            spec["containers"][0]["resources"]["requests"]["memory"],
            "-1Gi"
        );
        assert_eq!(
            messages(spec["containers"][0].clone()),
            [
                "spec.containers[0].resources.limits[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0",
                "spec.containers[0].resources.requests[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0",
            ]
        );
    }

    #[test]
    fn mounts_and_env_as_the_real_server_checks_them() {
        let mounts = json!({"volumeMounts": [{"name": "a", "mountPath": "/data"}, {"name": "b", "mountPath": "/data"}]});
        assert_eq!(
            messages(mounts),
            [
                "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/data\": must be unique"
            ]
        );
        let env = |var: Value| messages(json!({"env": [var]}));
        assert_eq!(
            env(
                json!({"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
            ),
            [
                "spec.containers[0].env[0].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"
            ]
        );
        assert_eq!(
            env(json!({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}})),
            [
                "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Invalid value: \"spec.bogus\": error converting fieldPath: field label not supported: spec.bogus"
            ]
        );
        assert_eq!(
            env(json!({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}})),
            [
                "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Unsupported value: \"status.phase\": supported values: \"metadata.name\", \"metadata.namespace\", \"metadata.uid\", \"spec.nodeName\", \"spec.serviceAccountName\", \"status.hostIP\", \"status.hostIPs\", \"status.podIP\", \"status.podIPs\""
            ]
        );
        assert_eq!(
            env(
                json!({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName['x']"}}})
            ),
            [
                "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Invalid value: \"spec.nodeName['x']\": error converting fieldPath: field label does not support subscript: spec.nodeName['x']"
            ]
        );
        assert!(env(json!({"name": "A", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['team']"}}})).is_empty());
        assert!(
            env(json!({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}))
                .is_empty()
        );
        assert_eq!(
            env(json!({"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "bogus"}}})),
            [
                "spec.containers[0].env[0].valueFrom.resourceFieldRef.resource: Unsupported value: \"bogus\": supported values: \"limits.cpu\", \"limits.ephemeral-storage\", \"limits.memory\", \"requests.cpu\", \"requests.ephemeral-storage\", \"requests.memory\""
            ]
        );
        assert!(env(json!({"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}})).is_empty());
    }

    #[test]
    fn a_downward_api_volume_names_its_source_and_its_container() {
        let spec = json!({"volumes": [{"name": "info", "downwardAPI": {"items": [
            {"path": "phase", "fieldRef": {"fieldPath": "status.phase"}},
            {"path": "mem", "resourceFieldRef": {"resource": "limits.memory"}}
        ]}}]});
        let mut causes = vec![];
        check_volumes(&spec, &mut causes);
        let found: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            found,
            [
                "spec.volumes[0].downwardAPI.fieldRef.fieldPath: Unsupported value: \"status.phase\": supported values: \"metadata.annotations\", \"metadata.labels\", \"metadata.name\", \"metadata.namespace\", \"metadata.uid\"",
                "spec.volumes[0].downwardAPI.resourceFieldRef.containerName: Required value",
            ]
        );
    }

    #[test]
    fn a_claim_asks_for_storage_above_zero() {
        let claim = |storage: Value| json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}});
        let found = |claim: Value| -> Vec<String> {
            check_claim(&claim)
                .iter()
                .map(|c| format!("{}: {}", c.field, c.message))
                .collect()
        };
        assert_eq!(
            found(claim(json!("0"))),
            ["spec.resources[storage]: Invalid value: \"0\": must be greater than zero"]
        );
        assert_eq!(
            found(claim(json!("-1Gi"))),
            ["spec.resources[storage]: Invalid value: \"-1Gi\": must be greater than zero"]
        );
        assert!(found(claim(json!("1Gi"))).is_empty());
        assert_eq!(
            found(json!({"spec": {"resources": {}}})),
            [
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value"
            ]
        );
    }
}
