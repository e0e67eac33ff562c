//! The fields a real API server knows for each built-in type, derived from k8s-openapi's types
//! (their `schemars` schemas, subschemas inlined), so that unknown fields are dropped, warned
//! about or refused (`fieldValidation`) as a real server's strict decoder does. Events are not
//! here: the sim stores both of their API views as one object, so their fields are checked
//! by neither view's type.

use std::sync::OnceLock;

use serde_json::Value;

/// A built-in type the sim knows from k8s-openapi: its group and resource, its schema with
/// every subschema inlined (for strict decoding), and its schema added to a generator (for
/// OpenAPI: a `$ref` to its definition, which the generator then holds with the definitions
/// it refers to).
struct Builtin {
    group: &'static str,
    resource: &'static str,
    inlined: fn() -> Value,
    definition: fn(&mut schemars::SchemaGenerator) -> Value,
}

macro_rules! builtin {
    ($group:literal, $resource:literal, $type:ty) => {
        Builtin {
            group: $group,
            resource: $resource,
            inlined: generate::<$type>,
            definition: |generator| generator.subschema_for::<$type>().to_value(),
        }
    };
}

use k8s_openapi::api::{
    admissionregistration::v1 as admission, apps::v1 as apps, coordination::v1 as coordination,
    core::v1 as core, networking::v1 as networking, policy::v1 as policy, rbac::v1 as rbac,
};

const BUILTINS: &[Builtin] = &[
    builtin!("", "pods", core::Pod),
    builtin!("", "services", core::Service),
    builtin!("", "configmaps", core::ConfigMap),
    builtin!("", "secrets", core::Secret),
    builtin!("", "persistentvolumeclaims", core::PersistentVolumeClaim),
    builtin!("", "persistentvolumes", core::PersistentVolume),
    builtin!("", "serviceaccounts", core::ServiceAccount),
    builtin!("", "resourcequotas", core::ResourceQuota),
    builtin!("", "namespaces", core::Namespace),
    builtin!("", "nodes", core::Node),
    builtin!("coordination.k8s.io", "leases", coordination::Lease),
    builtin!("", "endpoints", core::Endpoints),
    builtin!(
        "discovery.k8s.io",
        "endpointslices",
        k8s_openapi::api::discovery::v1::EndpointSlice
    ),
    builtin!("apps", "deployments", apps::Deployment),
    builtin!("apps", "replicasets", apps::ReplicaSet),
    builtin!("batch", "jobs", k8s_openapi::api::batch::v1::Job),
    builtin!("batch", "cronjobs", k8s_openapi::api::batch::v1::CronJob),
    builtin!(
        "apiregistration.k8s.io",
        "apiservices",
        k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService
    ),
    builtin!(
        "certificates.k8s.io",
        "certificatesigningrequests",
        k8s_openapi::api::certificates::v1::CertificateSigningRequest
    ),
    builtin!(
        "policy",
        "poddisruptionbudgets",
        policy::PodDisruptionBudget
    ),
    builtin!(
        "networking.k8s.io",
        "networkpolicies",
        networking::NetworkPolicy
    ),
    builtin!("rbac.authorization.k8s.io", "roles", rbac::Role),
    builtin!(
        "rbac.authorization.k8s.io",
        "rolebindings",
        rbac::RoleBinding
    ),
    builtin!(
        "rbac.authorization.k8s.io",
        "clusterroles",
        rbac::ClusterRole
    ),
    builtin!(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        rbac::ClusterRoleBinding
    ),
    builtin!(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        admission::ValidatingWebhookConfiguration
    ),
    builtin!(
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        admission::ValidatingAdmissionPolicy
    ),
    builtin!(
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        admission::ValidatingAdmissionPolicyBinding
    ),
];

/// The schema of built-in type `group`/`resource`, if the sim knows its fields.
pub fn schema(group: &str, resource: &str) -> Option<&'static Value> {
    static SCHEMAS: OnceLock<Vec<Value>> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| BUILTINS.iter().map(|b| (b.inlined)()).collect());
    BUILTINS
        .iter()
        .position(|b| b.group == group && b.resource == resource)
        .map(|i| &schemas[i])
}

/// The fields of the served built-in types that are `MicroTime`s (the schema cannot tell
/// them from `Time`s: both are `date-time` strings, and a field's description replaces the
/// type's). Events' times are normalised by `events.rs`.
const MICRO_TIMES: &[(&str, &str)] =
    &[("leases", "spec.acquireTime"), ("leases", "spec.renewTime")];

/// The times of a built-in object as the real server decodes and stores them: a `Time` is
/// RFC 3339 with any fraction and offset, kept in UTC to the second; a `MicroTime` has exactly
/// six fractional digits and is kept in UTC. What does not parse is the decoder's words.
pub fn normalize_times(resource: &str, schema: &Value, value: &mut Value) -> Result<(), String> {
    walk_times(resource, "", schema, value)
}

fn walk_times(resource: &str, path: &str, schema: &Value, value: &mut Value) -> Result<(), String> {
    match value {
        Value::String(text) if schema["format"] == "date-time" => {
            let micro = MICRO_TIMES.contains(&(resource, path));
            let (layout, fraction) = match micro {
                true => ("2006-01-02T15:04:05.000000Z07:00", Some(6)),
                false => ("2006-01-02T15:04:05Z07:00", None),
            };
            let digits = text
                .split_once('.')
                .map(|(_, rest)| rest.chars().take_while(char::is_ascii_digit).count());
            let time = text
                .parse::<jiff::Timestamp>()
                .ok()
                .filter(|_| fraction.is_none() || digits == fraction)
                .ok_or_else(|| {
                    format!("parsing time \"{text}\" as \"{layout}\": cannot parse \"{text}\" as \"{layout}\"")
                })?;
            let format = match micro {
                true => "%Y-%m-%dT%H:%M:%S%.6fZ",
                false => "%Y-%m-%dT%H:%M:%SZ",
            };
            *text = time.strftime(format).to_string();
            Ok(())
        }
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                let inner = schema["properties"]
                    .get(key)
                    .or_else(|| schema.get("additionalProperties"));
                if let Some(inner) = inner {
                    let path = match path {
                        "" => key.clone(),
                        _ => format!("{path}.{key}"),
                    };
                    walk_times(resource, &path, inner, field)?;
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            if let Some(inner) = schema.get("items") {
                for item in items {
                    walk_times(resource, path, inner, item)?;
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The OpenAPI definitions of the built-in types, as the real server publishes them (named
/// `io.k8s.api.core.v1.Pod` and so on, referring to each other as `#/definitions/NAME`), and
/// the definition name of each type by (group, resource).
pub struct Definitions {
    pub schemas: serde_json::Map<String, Value>,
    pub names: Vec<((&'static str, &'static str), String)>,
}

impl Definitions {
    /// The definition name of built-in type `group`/`resource`.
    pub fn name_of(&self, group: &str, resource: &str) -> Option<&str> {
        self.names
            .iter()
            .find(|((g, r), _)| *g == group && *r == resource)
            .map(|(_, name)| name.as_str())
    }
}

/// The built-in types' definitions, generated once.
pub fn definitions() -> &'static Definitions {
    static DEFINITIONS: OnceLock<Definitions> = OnceLock::new();
    DEFINITIONS.get_or_init(|| {
        let mut generator = schemars::generate::SchemaSettings::draft2020_12()
            .with(|s| {
                s.definitions_path = "/definitions".into();
                s.meta_schema = None;
            })
            .into_generator();
        let names = BUILTINS
            .iter()
            .map(|b| {
                let reference = (b.definition)(&mut generator);
                let name = reference["$ref"]
                    .as_str()
                    .and_then(|r| r.strip_prefix("#/definitions/"))
                    .unwrap_or_default()
                    .to_owned();
                ((b.group, b.resource), name)
            })
            .collect();
        let schemas = generator.take_definitions(true);
        Definitions { schemas, names }
    })
}

/// Removes every `null` field, at any depth: to a typed decoder, null and absent are the same.
pub fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

fn generate<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::prune_unknown;

    #[test]
    fn unknown_fields_of_a_pod_are_found_at_any_depth_and_known_ones_kept() {
        let schema = schema("", "pods").unwrap();
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {
                "bogus": 1,
                "containers": [{"name": "c", "image": "x", "imagePullPolicy": "Always",
                    "resources": {"requests": {"cpu": "1", "memory": 64}},
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                    "ports": [{"containerPort": 80, "protocl": "TCP"}]}],
                "nodeSelector": {"kubernetes.io/hostname": "n"},
                "tolerations": [{"operator": "Exists"}],
                "affinity": {"nodeAffinity": {}}
            },
            "status": {"phase": "Running"}
        });
        let original = pod.clone();
        let unknown = prune_unknown(schema, &mut pod);
        assert_eq!(
            unknown,
            ["spec.bogus", "spec.containers[0].ports[0].protocl"]
        );
        let mut expected = original;
        expected["spec"].as_object_mut().unwrap().remove("bogus");
        expected["spec"]["containers"][0]["ports"][0]
            .as_object_mut()
            .unwrap()
            .remove("protocl");
        assert_eq!(pod, expected);
    }
}
