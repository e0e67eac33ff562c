//! Defaults and validation of built-in types, as the real API server's strategies and
//! admission plugins apply them (the subset the sim serves).

use std::sync::LazyLock;

use base64::Engine;
use regex::Regex;
use serde_json::{Value, json};

use crate::{
    error::{Cause, invalid, not_supported},
    resources::ResourceType,
};

static DNS1123_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("valid regex")
});
static DNS1123_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("valid regex"));
static DNS1035_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z]([-a-z0-9]*[a-z0-9])?$").expect("valid regex"));

static QUALIFIED_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").expect("valid regex")
});
static ENV_VAR_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$").expect("valid regex"));
static IANA_SVC_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$").expect("valid regex"));
static QUANTITY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$").expect("valid regex")
});

/// The most bytes all of an object's annotations may take, keys and values together.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Checks `object[key]`, when set, against the values an enum allows.
fn check_enum(causes: &mut Vec<Cause>, object: &Value, key: &str, field: &str, supported: &[&str]) {
    if let Some(value) = object[key].as_str()
        && !supported.contains(&value)
    {
        causes.push(not_supported(&format!("{field}.{key}"), value, supported));
    }
}

const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".to_owned(),
        message: "Required value".to_owned(),
        field: field.to_owned(),
    }
}

/// Validates a DNS-1123 subdomain (most object names).
pub fn check_subdomain(field: &str, value: &str) -> Option<Cause> {
    if value.len() > 253 {
        return Some(invalid(field, value, "must be no more than 253 characters"));
    }
    (!DNS1123_SUBDOMAIN.is_match(value)).then(|| {
        invalid(field, value, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
    })
}

/// Validates a DNS-1123 label (namespace names, container names).
pub fn check_label(field: &str, value: &str) -> Option<Cause> {
    if value.len() > 63 {
        return Some(invalid(field, value, "must be no more than 63 characters"));
    }
    (!DNS1123_LABEL.is_match(value)).then(|| {
        invalid(field, value, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    })
}

pub fn check_dns1035(field: &str, value: &str) -> Option<Cause> {
    if value.len() > 63 {
        return Some(invalid(field, value, "must be no more than 63 characters"));
    }
    (!DNS1035_LABEL.is_match(value)).then(|| {
        invalid(field, value, "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
    })
}

/// Validates a label or annotation key: an optional DNS-1123 subdomain prefix and `/`, then a
/// name of at most 63 alphanumerics, `-`, `_` and `.`.
pub fn check_qualified_name(field: &str, key: &str) -> Vec<Cause> {
    let mut causes = vec![];
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            causes.push(invalid(field, key, "prefix part must be non-empty"));
        } else if let Some(cause) = check_subdomain(field, prefix) {
            let message = cause.message.replacen(
                &format!("Invalid value: \"{prefix}\": "),
                "prefix part ",
                1,
            );
            causes.push(invalid(field, key, &message));
        }
    }
    if name.is_empty() {
        causes.push(invalid(field, key, "name part must be non-empty"));
    } else if name.len() > 63 {
        causes.push(invalid(
            field,
            key,
            "name part must be no more than 63 characters",
        ));
    } else if !QUALIFIED_NAME.is_match(name) || name.contains('/') {
        causes.push(invalid(field, key, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"));
    }
    causes
}

/// Validates a label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`, starting and
/// ending alphanumeric.
pub fn check_label_value(field: &str, value: &str) -> Option<Cause> {
    if value.len() > 63 {
        return Some(invalid(field, value, "must be no more than 63 characters"));
    }
    (!value.is_empty() && !QUALIFIED_NAME.is_match(value)).then(|| {
        invalid(field, value, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
    })
}

/// Validates an environment variable name.
pub fn check_env_var_name(field: &str, name: &str) -> Option<Cause> {
    (!ENV_VAR_NAME.is_match(name)).then(|| {
        invalid(field, name, "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')")
    })
}

/// Validates a container port name (an IANA service name: at most 15 characters).
pub fn check_port_name(field: &str, name: &str) -> Option<Cause> {
    if name.len() > 15 {
        return Some(invalid(field, name, "must be no more than 15 characters"));
    }
    if !IANA_SVC_NAME.is_match(name) {
        return Some(invalid(
            field,
            name,
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
        ));
    }
    if name.contains("--") {
        return Some(invalid(field, name, "must not contain consecutive hyphens"));
    }
    (!name.chars().any(|c| c.is_ascii_lowercase()))
        .then(|| invalid(field, name, "must contain at least one letter (a-z)"))
}

/// The labels and annotations of any object, as the real API server validates ObjectMeta.
pub fn validate_metadata(object: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    if let Some(labels) = object["metadata"]["labels"].as_object() {
        for (key, value) in labels {
            causes.extend(check_qualified_name("metadata.labels", key));
            if let Some(cause) =
                check_label_value("metadata.labels", value.as_str().unwrap_or_default())
            {
                causes.push(cause);
            }
        }
    }
    if let Some(annotations) = object["metadata"]["annotations"].as_object() {
        let mut size = 0;
        for (key, value) in annotations {
            causes.extend(check_qualified_name(
                "metadata.annotations",
                &key.to_lowercase(),
            ));
            size += key.len() + value.as_str().map_or(0, str::len);
        }
        if size > TOTAL_ANNOTATION_SIZE_LIMIT {
            causes.push(Cause {
                reason: "FieldValueTooLong".to_owned(),
                message: format!(
                    "Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"
                ),
                field: "metadata.annotations".to_owned(),
            });
        }
    }
    causes
}

/// A quantity the API server cannot decode: the message of its 400 answer.
/// Quantities given as JSON numbers (`cpu: 64` in YAML) become the canonical strings the real
/// server stores (`"64"`, `0.5` -> `"500m"`), so everything that reads them sees strings.
pub fn canonical_quantities(rt: &ResourceType, object: &mut Value) {
    fn canonical(value: &mut Value) {
        let Some(number) = value.as_number().cloned() else {
            return;
        };
        let text = match (number.as_i64(), number.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => {
                let millis = (f * 1000.0).round();
                if (f * 1000.0 - millis).abs() < 1e-6 {
                    if millis % 1000.0 == 0.0 {
                        format!("{}", (millis / 1000.0) as i64)
                    } else {
                        format!("{}m", millis as i64)
                    }
                } else {
                    number.to_string()
                }
            }
            _ => number.to_string(),
        };
        *value = Value::String(text);
    }
    let mut maps: Vec<&mut Value> = vec![];
    match (rt.group.as_str(), rt.resource.as_str()) {
        ("", "pods") => {
            let spec = &mut object["spec"];
            if let Some(spec) = spec.as_object_mut() {
                for (key, list) in spec.iter_mut() {
                    if key != "containers" && key != "initContainers" {
                        continue;
                    }
                    for container in list.as_array_mut().into_iter().flatten() {
                        if let Some(resources) = container["resources"].as_object_mut() {
                            maps.extend(resources.values_mut());
                        }
                    }
                }
            }
        }
        ("", "persistentvolumeclaims") => {
            if let Some(resources) = object["spec"]["resources"].as_object_mut() {
                maps.extend(resources.values_mut());
            }
        }
        ("", "resourcequotas") => maps.push(&mut object["spec"]["hard"]),
        _ => {}
    }
    for map in maps {
        if let Some(map) = map.as_object_mut() {
            map.values_mut().for_each(canonical);
        }
    }
}

pub fn bad_quantity(object: &Value) -> Option<String> {
    let lists = ["initContainers", "containers"];
    let claim = [object["spec"]["resources"].clone()];
    let quantities = lists
        .iter()
        .filter_map(|l| object["spec"][l].as_array())
        .flatten()
        .map(|c| c["resources"].clone())
        .chain(claim)
        .flat_map(|r| ["requests", "limits"].map(|k| r[k].clone()))
        .filter_map(|m| m.as_object().cloned())
        .flat_map(|m| m.into_iter().map(|(_, v)| v));
    for value in quantities {
        let ok = match &value {
            Value::String(s) => QUANTITY.is_match(s) && crate::quantity::parse_milli(s).is_some(),
            Value::Number(_) => true,
            _ => false,
        };
        if !ok {
            return Some("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'".to_owned());
        }
    }
    None
}

/// Validates the object's name for its type.
pub fn check_name(rt: &ResourceType, name: &str) -> Option<Cause> {
    let field = "metadata.name";
    match (rt.group.as_str(), rt.resource.as_str()) {
        ("", "namespaces") => check_label(field, name),
        ("", "services") => check_dns1035(field, name),
        // `version.group`, and `v1.` for the core group (the aggregator's own rule).
        ("apiregistration.k8s.io", "apiservices") => match name.split_once('.') {
            Some((version, group)) => check_dns1035(field, version).or_else(|| {
                (!group.is_empty())
                    .then(|| check_subdomain(field, group))
                    .flatten()
            }),
            None => Some(invalid(
                field,
                name,
                "must be in the form of <version>.<group>",
            )),
        },
        ("rbac.authorization.k8s.io", _) => {
            (name.contains('/') || name.contains('%') || name == "." || name == "..")
                .then(|| invalid(field, name, "may not contain '/' or '%'"))
        }
        _ => check_subdomain(field, name),
    }
}

fn image_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else if !last.contains(':') || last.ends_with(":latest") {
        "Always"
    } else {
        "IfNotPresent"
    }
}

pub fn qos_class(pod: &Value) -> &'static str {
    let containers = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in &containers {
        let requests = &c["resources"]["requests"];
        let limits = &c["resources"]["limits"];
        if requests.as_object().is_some_and(|r| !r.is_empty())
            || limits.as_object().is_some_and(|l| !l.is_empty())
        {
            any = true;
        }
        for resource in ["cpu", "memory"] {
            let limit = &limits[resource];
            let request = if requests[resource].is_null() {
                limit
            } else {
                &requests[resource]
            };
            if limit.is_null() || request != limit {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn default_container(container: &mut Value) {
    if let Some(image) = container["image"].as_str().map(str::to_owned)
        && container["imagePullPolicy"].is_null()
    {
        container["imagePullPolicy"] = json!(image_pull_policy(&image));
    }
    if container["terminationMessagePath"].is_null() {
        container["terminationMessagePath"] = json!("/dev/termination-log");
    }
    if container["terminationMessagePolicy"].is_null() {
        container["terminationMessagePolicy"] = json!("File");
    }
    if container["resources"].is_null() {
        container["resources"] = json!({});
    }
    if let Some(ports) = container["ports"].as_array_mut() {
        for port in ports {
            if port["protocol"].is_null() {
                port["protocol"] = json!("TCP");
            }
        }
    }
    // SetDefaults_ObjectFieldSelector.
    for var in container["env"].as_array_mut().into_iter().flatten() {
        let selector = var
            .get_mut("valueFrom")
            .and_then(|from| from.get_mut("fieldRef"))
            .and_then(Value::as_object_mut);
        if let Some(selector) = selector {
            selector.entry("apiVersion").or_insert_with(|| json!("v1"));
        }
    }
}

/// Next free ClusterIP, from a counter the caller keeps.
pub fn cluster_ip(n: u32) -> String {
    format!("10.96.{}.{}", (n / 254) % 256, n % 254 + 1)
}

/// The defaults of a pod spec, in a pod or in a workload's template.
pub fn default_pod_spec(spec: &mut Value) {
    for (key, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
    ] {
        if spec[key].is_null() {
            spec[key] = value;
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(containers) = spec[list].as_array_mut() {
            containers.iter_mut().for_each(default_container);
        }
    }
    if let Some(volumes) = spec["volumes"].as_array_mut() {
        for volume in volumes {
            if volume["secret"].is_object() && volume["secret"]["defaultMode"].is_null() {
                volume["secret"]["defaultMode"] = json!(420);
            }
            if volume["configMap"].is_object() && volume["configMap"]["defaultMode"].is_null() {
                volume["configMap"]["defaultMode"] = json!(420);
            }
        }
    }
}

/// Fills in what the real server defaults in a Deployment or ReplicaSet, its pod template
/// included, on create and on update.
pub fn default_workload(rt: &ResourceType, object: &mut Value) {
    crate::apps::default_on_create(&rt.resource, object);
    default_pod_spec(&mut object["spec"]["template"]["spec"]);
}

/// Fills in what the real server defaults in a Job or CronJob, its pod template included;
/// on create, also the selector and labels that tie a Job to its pods.
pub fn default_batch(rt: &ResourceType, object: &mut Value, create: bool) {
    match rt.resource.as_str() {
        "jobs" => crate::batch::default_job(object, create),
        _ => crate::batch::default_cron_job(object),
    }
    default_pod_spec(crate::batch::template_spec(&rt.resource, object));
}

/// Fills in what the real API server defaults on create. `next_ip` allocates ClusterIPs.
pub fn default_on_create(rt: &ResourceType, object: &mut Value, next_ip: impl FnOnce() -> String) {
    if rt.group == "apps" {
        default_workload(rt, object);
        object["status"] = crate::apps::new_status(&rt.resource);
        return;
    }
    if rt.group == "batch" {
        default_batch(rt, object, true);
        object["status"] = json!({});
        return;
    }
    if rt.is_custom || !rt.group.is_empty() && rt.group != "apiextensions.k8s.io" {
        return;
    }
    match rt.resource.as_str() {
        "namespaces" => {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            object["spec"]["finalizers"] = json!(["kubernetes"]);
            object["status"] = json!({"phase": "Active"});
        }
        "pods" => {
            let spec = &mut object["spec"];
            default_pod_spec(spec);
            crate::containers::default_requests(spec);
            // The Priority admission plugin.
            for (key, value) in [
                ("priority", json!(0)),
                ("preemptionPolicy", json!("PreemptLowerPriority")),
            ] {
                if spec[key].is_null() {
                    spec[key] = value;
                }
            }
            if spec["serviceAccountName"].is_null() {
                spec["serviceAccountName"] = json!("default");
            }
            spec["serviceAccount"] = spec["serviceAccountName"].clone();
            // The DefaultTolerationSeconds admission plugin.
            let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
            for key in [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            ] {
                if !tolerations.iter().any(|t| t["key"] == key) {
                    tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
                }
            }
            spec["tolerations"] = Value::Array(tolerations);
            let qos = qos_class(object);
            object["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        "services" => {
            let spec = &mut object["spec"];
            if spec["type"].is_null() {
                spec["type"] = json!("ClusterIP");
            }
            if spec["sessionAffinity"].is_null() {
                spec["sessionAffinity"] = json!("None");
            }
            // An ExternalName service is a DNS alias: it gets no cluster IP.
            if spec["type"] != "ExternalName"
                && (spec["clusterIP"].is_null() || spec["clusterIP"] == "")
            {
                let ip = next_ip();
                spec["clusterIP"] = json!(ip);
                spec["clusterIPs"] = json!([ip]);
            }
            spec["ipFamilies"] = json!(["IPv4"]);
            spec["ipFamilyPolicy"] = json!("SingleStack");
            spec["internalTrafficPolicy"] = json!("Cluster");
            if let Some(ports) = spec["ports"].as_array_mut() {
                for port in ports {
                    if port["protocol"].is_null() {
                        port["protocol"] = json!("TCP");
                    }
                    if port["targetPort"].is_null() {
                        port["targetPort"] = port["port"].clone();
                    }
                }
            }
            object["status"] = json!({"loadBalancer": {}});
        }
        "secrets" => {
            if object["type"].as_str().is_none_or(str::is_empty) {
                object["type"] = json!("Opaque");
            }
            fold_string_data(object);
        }
        "persistentvolumeclaims" => {
            if object["spec"]["volumeMode"].is_null() {
                object["spec"]["volumeMode"] = json!("Filesystem");
            }
            object["status"] = json!({"phase": "Pending"});
        }
        _ => {}
    }
}

/// A secret whose `data` holds a value that is not base64 cannot be decoded: the 400 the real
/// decoder gives.
pub fn bad_secret_data(object: &Value) -> Option<String> {
    let data = object["data"].as_object()?;
    data.values().find_map(|value| {
        let text = value.as_str().unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .err()
            .map(|e| match e {
                base64::DecodeError::InvalidByte(at, _) => {
                    format!("illegal base64 data at input byte {at}")
                }
                base64::DecodeError::InvalidLength(at)
                | base64::DecodeError::InvalidLastSymbol(at, _) => {
                    format!("illegal base64 data at input byte {at}")
                }
                base64::DecodeError::InvalidPadding => {
                    format!("illegal base64 data at input byte {}", text.len())
                }
            })
    })
}

/// What the real server keeps from the stored object when an update leaves it out: a
/// service's allocated cluster IPs (since 1.20), so `kubectl replace` without them works.
pub fn keep_allocated(rt: &ResourceType, old: &Value, new: &mut Value) {
    if !(rt.group.is_empty() && rt.resource == "services") {
        return;
    }
    let allocated = old["spec"]["clusterIP"].as_str().unwrap_or_default();
    if !allocated.is_empty() && new["spec"]["clusterIP"].as_str().is_none_or(str::is_empty) {
        new["spec"]["clusterIP"] = old["spec"]["clusterIP"].clone();
        if new["spec"]["clusterIPs"].is_null() {
            new["spec"]["clusterIPs"] = old["spec"]["clusterIPs"].clone();
        }
    }
}

/// What may not change on update of configmaps and secrets marked `immutable`, and of a
/// service's cluster IP.
pub fn immutable_update_forbidden(rt: &ResourceType, old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    if rt.group == "apps" {
        causes.extend(crate::apps::update_forbidden(old, new));
    }
    if !rt.group.is_empty() {
        return causes;
    }
    let forbidden = |field: &str| Cause {
        reason: "FieldValueForbidden".to_owned(),
        message: "Forbidden: field is immutable when `immutable` is set".to_owned(),
        field: field.to_owned(),
    };
    match rt.resource.as_str() {
        "configmaps" | "secrets" if old["immutable"] == json!(true) => {
            if new["immutable"] != json!(true) {
                causes.push(forbidden("immutable"));
            }
            let fields: &[&str] = if rt.resource == "configmaps" {
                &["data", "binaryData"]
            } else {
                &["data"]
            };
            let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|m| m.is_empty());
            for field in fields {
                if old[field] != new[field] && !(empty(&old[field]) && empty(&new[field])) {
                    causes.push(forbidden(field));
                }
            }
        }
        "services" => {
            let allocated = old["spec"]["clusterIP"].as_str().unwrap_or_default();
            if let Some(ip) = new["spec"]["clusterIP"].as_str()
                && !allocated.is_empty()
                && ip != allocated
            {
                causes.push(invalid("spec.clusterIP", ip, "field is immutable"));
            }
        }
        _ => {}
    }
    causes
}

/// The longest `reportingInstance`, `action` and `reason` of an events.k8s.io/v1 Event.
const EVENT_FIELD_LIMIT: usize = 128;
/// The longest `note`.
const EVENT_NOTE_LIMIT: usize = 1024;

/// What the real API server checks of an Event created through events.k8s.io/v1 (stricter
/// than core/v1): who reported it and when, its action and reason, and none of the deprecated
/// core fields.
pub fn validate_event_v1_create(event: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let text = |key: &str| event[key].as_str().unwrap_or_default();
    if text("eventTime").is_empty() {
        causes.push(required("eventTime"));
    }
    match text("type") {
        "Normal" | "Warning" => {}
        other => causes.push(invalid("type", "", &format!("has invalid value: {other}"))),
    }
    if text("reportingController").is_empty() {
        causes.push(required("reportingController"));
    }
    for (key, limit) in [
        ("reportingInstance", EVENT_FIELD_LIMIT),
        ("action", EVENT_FIELD_LIMIT),
        ("reason", EVENT_FIELD_LIMIT),
    ] {
        let value = text(key);
        if value.is_empty() {
            causes.push(required(key));
        } else if value.chars().count() > limit {
            causes.push(invalid(
                key,
                "",
                &format!("can have at most {limit} characters"),
            ));
        }
    }
    if text("note").chars().count() > EVENT_NOTE_LIMIT {
        causes.push(invalid(
            "note",
            "",
            &format!("can have at most {EVENT_NOTE_LIMIT} characters"),
        ));
    }
    for key in [
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedCount",
        "deprecatedSource",
    ] {
        let set = match &event[key] {
            Value::Null => false,
            Value::Number(n) => n.as_i64() != Some(0),
            Value::Object(m) => m
                .values()
                .any(|v| v.as_str().is_some_and(|s| !s.is_empty())),
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        if set {
            causes.push(invalid(key, "", "needs to be unset"));
        }
    }
    causes
}

/// Secrets' `stringData` is write-only: it is merged into `data`, base64-encoded.
pub fn fold_string_data(secret: &mut Value) {
    if let Some(Value::Object(string_data)) =
        secret.as_object_mut().and_then(|m| m.remove("stringData"))
    {
        for (key, value) in string_data {
            let encoded = base64::engine::general_purpose::STANDARD
                .encode(value.as_str().unwrap_or_default());
            secret["data"][key] = json!(encoded);
        }
    }
}

/// Validation of built-in types on create and update.
pub fn validate(rt: &ResourceType, object: &Value) -> Vec<Cause> {
    let mut causes = validate_metadata(object);
    if rt.group == "apps" {
        causes.extend(crate::apps::validate(object));
    }
    if rt.group == "batch" {
        causes.extend(crate::batch::validate(&rt.resource, object));
    }
    if rt.group == "certificates.k8s.io" {
        causes.extend(crate::certificates::validate(object));
    }
    if rt.group == "networking.k8s.io" && rt.resource == "networkpolicies" {
        causes.extend(crate::network_policies::validate(object));
    }
    if rt.is_custom || !rt.group.is_empty() {
        return causes;
    }
    if rt.resource == "pods" {
        let containers = object["spec"]["containers"].as_array();
        if containers.is_none_or(|c| c.is_empty()) {
            causes.push(required("spec.containers"));
        }
        let volume_names: Vec<&str> = object["spec"]["volumes"]
            .as_array()
            .map(|v| v.iter().filter_map(|v| v["name"].as_str()).collect())
            .unwrap_or_default();
        for (i, name) in volume_names.iter().enumerate() {
            if volume_names[..i].contains(name) {
                causes.push(Cause {
                    reason: "FieldValueDuplicate".to_owned(),
                    message: format!("Duplicate value: \"{name}\""),
                    field: format!("spec.volumes[{i}].name"),
                });
            }
        }
        let spec = &object["spec"];
        check_enum(
            &mut causes,
            spec,
            "restartPolicy",
            "spec",
            &["Always", "Never", "OnFailure"],
        );
        for (i, toleration) in spec["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let field = format!("spec.tolerations[{i}]");
            check_enum(
                &mut causes,
                toleration,
                "operator",
                &field,
                &["Equal", "Exists"],
            );
            if toleration["effect"].as_str() != Some("") {
                check_enum(
                    &mut causes,
                    toleration,
                    "effect",
                    &field,
                    &["NoExecute", "NoSchedule", "PreferNoSchedule"],
                );
            }
        }
        for list in ["initContainers", "containers"] {
            let Some(containers) = object["spec"][list].as_array() else {
                continue;
            };
            let mut seen: Vec<&str> = vec![];
            for (i, c) in containers.iter().enumerate() {
                let base = format!("spec.{list}[{i}]");
                match c["name"].as_str() {
                    None | Some("") => causes.push(required(&format!("{base}.name"))),
                    Some(name) => {
                        if let Some(cause) = check_label(&format!("{base}.name"), name) {
                            causes.push(cause);
                        }
                        if seen.contains(&name) {
                            causes.push(Cause {
                                reason: "FieldValueDuplicate".to_owned(),
                                message: format!("Duplicate value: \"{name}\""),
                                field: format!("{base}.name"),
                            });
                        }
                        seen.push(name);
                    }
                }
                if c["image"].as_str().is_none_or(|i| i.trim().is_empty()) {
                    causes.push(required(&format!("{base}.image")));
                }
                check_enum(
                    &mut causes,
                    c,
                    "imagePullPolicy",
                    &base,
                    &["Always", "IfNotPresent", "Never"],
                );
                for (j, env) in c["env"].as_array().into_iter().flatten().enumerate() {
                    let name = env["name"].as_str().unwrap_or_default();
                    if let Some(cause) = check_env_var_name(&format!("{base}.env[{j}].name"), name)
                    {
                        causes.push(cause);
                    }
                }
                for (j, port) in c["ports"].as_array().into_iter().flatten().enumerate() {
                    check_enum(
                        &mut causes,
                        port,
                        "protocol",
                        &format!("{base}.ports[{j}]"),
                        PROTOCOLS,
                    );
                    if let Some(name) = port["name"].as_str()
                        && let Some(cause) =
                            check_port_name(&format!("{base}.ports[{j}].name"), name)
                    {
                        causes.push(cause);
                    }
                }
                if let Some(mounts) = c["volumeMounts"].as_array() {
                    for (j, m) in mounts.iter().enumerate() {
                        let name = m["name"].as_str().unwrap_or_default();
                        if !volume_names.contains(&name) {
                            causes.push(Cause {
                                reason: "FieldValueNotFound".to_owned(),
                                message: format!("Not found: \"{name}\""),
                                field: format!("{base}.volumeMounts[{j}].name"),
                            });
                        }
                    }
                }
                crate::containers::check_container(c, &base, &mut causes);
            }
        }
        crate::containers::check_volumes(spec, &mut causes);
    }
    if rt.resource == "persistentvolumeclaims" {
        causes.extend(crate::containers::check_claim(object));
    }
    if rt.resource == "secrets" && object["type"] == "kubernetes.io/tls" {
        for key in ["tls.crt", "tls.key"] {
            if object["data"][key].is_null() {
                causes.push(required(&format!("data[{key}]")));
            }
        }
    }
    if rt.resource == "services" {
        let spec = &object["spec"];
        let headless = spec["clusterIP"] == "None";
        let no_ports = spec["ports"].as_array().is_none_or(|p| p.is_empty());
        if no_ports && !headless && spec["type"] != "ExternalName" {
            causes.push(required("spec.ports"));
        }
        check_enum(
            &mut causes,
            spec,
            "type",
            "spec",
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        );
        for (i, port) in spec["ports"].as_array().into_iter().flatten().enumerate() {
            check_enum(
                &mut causes,
                port,
                "protocol",
                &format!("spec.ports[{i}]"),
                PROTOCOLS,
            );
        }
    }
    if rt.resource == "services"
        && let Some(selector) = object["spec"]["selector"].as_object()
    {
        for (key, value) in selector {
            causes.extend(check_qualified_name("spec.selector", key));
            if let Some(cause) =
                check_label_value("spec.selector", value.as_str().unwrap_or_default())
            {
                causes.push(cause);
            }
        }
    }
    if rt.resource == "services"
        && let Some(ports) = object["spec"]["ports"].as_array()
    {
        for (i, port) in ports.iter().enumerate() {
            if let Some(name) = port["name"].as_str()
                && let Some(cause) = check_label(&format!("spec.ports[{i}].name"), name)
            {
                causes.push(cause);
            }
            let number = port["port"].as_i64().unwrap_or(0);
            if !(1..=65535).contains(&number) {
                causes.push(invalid(
                    &format!("spec.ports[{i}].port"),
                    &number.to_string(),
                    "must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
    causes
}

/// A claim's spec is immutable once bound, but for its storage request, which may grow (and
/// not go below what the volume already has).
pub fn claim_update_forbidden(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let bound = old["spec"]["volumeName"]
        .as_str()
        .is_some_and(|v| !v.is_empty());
    let strip = |claim: &Value| {
        let mut spec = claim["spec"].clone();
        if let Some(m) = spec.as_object_mut() {
            m.remove("volumeAttributesClassName");
            if let Some(resources) = m.get_mut("resources").and_then(Value::as_object_mut) {
                resources.remove("requests");
            }
        }
        spec
    };
    if bound && strip(old) != strip(new) {
        causes.push(Cause {
            reason: "FieldValueForbidden".to_owned(),
            message: "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims".to_owned(),
            field: "spec".to_owned(),
        });
    }
    let storage = |v: &Value| v.as_str().and_then(crate::quantity::units);
    let requested = storage(&new["spec"]["resources"]["requests"]["storage"]);
    let capacity = storage(&old["status"]["capacity"]["storage"]);
    if let (Some(requested), Some(capacity)) = (requested, capacity)
        && requested < capacity
    {
        causes.push(Cause {
            reason: "FieldValueForbidden".to_owned(),
            message: "Forbidden: field can not be less than status.capacity".to_owned(),
            field: "spec.resources.requests.storage".to_owned(),
        });
    }
    causes
}

/// Fields of a pod spec that an update may change; everything else is immutable.
/// What the real server refuses in an update of a pod's `ephemeralcontainers`: an ephemeral
/// container changed or removed, a name another container has, a field an ephemeral container
/// may not set.
pub fn ephemeral_update_forbidden(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let list = |pod: &Value| {
        pod["spec"]["ephemeralContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let (before, after) = (list(old), list(new));
    for (i, was) in before.iter().enumerate() {
        match after.iter().find(|c| c["name"] == was["name"]) {
            None => causes.push(Cause {
                reason: "FieldValueForbidden".to_owned(),
                message: format!(
                    "Forbidden: existing ephemeral containers {:?} may not be removed\n",
                    was["name"].as_str().unwrap_or_default()
                ),
                field: "spec.ephemeralContainers".to_owned(),
            }),
            Some(now) if now != was => causes.push(Cause {
                reason: "FieldValueForbidden".to_owned(),
                message: "Forbidden: may not be changed".to_owned(),
                field: format!("spec.ephemeralContainers[{i}]"),
            }),
            Some(_) => {}
        }
    }
    let mut names: Vec<String> = ["containers", "initContainers"]
        .iter()
        .flat_map(|l| new["spec"][*l].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    for (i, container) in after.iter().enumerate() {
        let field = |f: &str| format!("spec.ephemeralContainers[{i}].{f}");
        let name = container["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            causes.push(required(&field("name")));
        } else if names.iter().any(|n| n == name) {
            causes.push(Cause {
                reason: "FieldValueDuplicate".to_owned(),
                message: format!("Duplicate value: \"{name}\""),
                field: field("name"),
            });
        }
        names.push(name.to_owned());
        if container["image"].as_str().is_none_or(str::is_empty) {
            causes.push(required(&field("image")));
        }
        for forbidden in [
            "ports",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
            "lifecycle",
            "resources",
            "restartPolicy",
        ] {
            let set = match &container[forbidden] {
                Value::Null => false,
                Value::Object(o) => !o.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => true,
            };
            if set {
                causes.push(Cause {
                    reason: "FieldValueForbidden".to_owned(),
                    message: "Forbidden: cannot be set for an Ephemeral Container".to_owned(),
                    field: field(forbidden),
                });
            }
        }
    }
    causes
}

pub fn pod_spec_update_forbidden(old: &Value, new: &Value) -> Option<Cause> {
    let strip = |pod: &Value| {
        let mut spec = pod["spec"].clone();
        for list in ["containers", "initContainers"] {
            if let Some(containers) = spec[list].as_array_mut() {
                for c in containers {
                    if let Some(m) = c.as_object_mut() {
                        m.remove("image");
                    }
                }
            }
        }
        if let Some(m) = spec.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
            m.remove("terminationGracePeriodSeconds");
        }
        spec
    };
    (strip(old) != strip(new)).then(|| Cause {
        reason: "FieldValueForbidden".to_owned(),
        message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".to_owned(),
        field: "spec".to_owned(),
    })
}

/// What `pods/resize` takes from an update: each container's `resources` and
/// `resizePolicy`, matched by position; a change to the list of containers is kept, for
/// `resize_forbidden` to refuse. Every other change is dropped, as the real strategy does.
pub fn merge_resize(current: &Value, body: &Value) -> Value {
    let mut new = current.clone();
    let wanted = body["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let same_names = new["spec"]["containers"].as_array().is_some_and(|have| {
        have.len() == wanted.len()
            && have
                .iter()
                .zip(&wanted)
                .all(|(a, b)| a["name"] == b["name"])
    });
    if !same_names {
        new["spec"]["containers"] = Value::Array(wanted);
        return new;
    }
    if let Some(have) = new["spec"]["containers"].as_array_mut() {
        for (container, asked) in have.iter_mut().zip(&wanted) {
            for field in ["resources", "resizePolicy"] {
                crate::meta::carry(container, field, asked.get(field));
            }
        }
    }
    new
}

/// What a resize may not do (`ValidatePodResize`, 1.33).
pub fn resize_forbidden(current: &Value, new: &Value) -> Vec<Cause> {
    let forbidden = |field: &str, message: &str| Cause {
        reason: "FieldValueForbidden".to_owned(),
        message: format!("Forbidden: {message}"),
        field: field.to_owned(),
    };
    let have = current["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let want = new["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if have.len() != want.len() {
        return vec![forbidden(
            "spec.containers",
            "containers may not be added or removed on resize",
        )];
    }
    let mut causes = vec![];
    for (i, (old, container)) in have.iter().zip(&want).enumerate() {
        if old["name"] != container["name"] {
            causes.push(forbidden(
                &format!("spec.containers[{i}].name"),
                "containers may not be renamed or reordered on resize",
            ));
            continue;
        }
        let resources = |c: &Value, kind: &str| -> std::collections::BTreeMap<String, Value> {
            c["resources"][kind]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default()
        };
        for kind in ["requests", "limits"] {
            let (before, after) = (resources(old, kind), resources(container, kind));
            let path = format!("spec.containers[{i}].resources.{kind}");
            if before.keys().any(|k| !after.contains_key(k)) {
                causes.push(forbidden(
                    &path,
                    &format!("resource {kind} cannot be removed"),
                ));
            }
            let changed = before
                .keys()
                .chain(after.keys())
                .any(|k| k != "cpu" && k != "memory" && before.get(k) != after.get(k));
            if changed {
                causes.push(forbidden(
                    "spec",
                    "only cpu and memory resources are mutable",
                ));
            }
        }
        // 1.33: a memory limit may only go down (or be added) with RestartContainer.
        let restarts_for_memory = container["resizePolicy"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["resourceName"] == "memory" && p["restartPolicy"] == "RestartContainer");
        let memory = |c: &Value| {
            c["resources"]["limits"]["memory"]
                .as_str()
                .and_then(crate::quantity::parse_milli)
        };
        if !restarts_for_memory {
            let path = format!("spec.containers[{i}].resources.limits[memory]");
            match (memory(old), memory(container)) {
                (Some(before), Some(after)) if after < before => causes.push(forbidden(
                    &path,
                    "memory limits cannot be decreased unless resizePolicy is RestartContainer",
                )),
                (None, Some(_)) => causes.push(forbidden(
                    &path,
                    "memory limits cannot be added unless resizePolicy is RestartContainer",
                )),
                _ => {}
            }
        }
    }
    if causes.is_empty() && qos_class(current) != qos_class(new) {
        causes.push(Cause {
            reason: "FieldValueInvalid".to_owned(),
            message: format!(
                "Invalid value: \"{}\": Pod QOS Class may not change as a result of resizing",
                qos_class(new)
            ),
            field: "spec".to_owned(),
        });
    }
    causes
}
