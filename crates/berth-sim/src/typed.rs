//! The fields a real API server knows for each built-in type, derived from k8s-openapi's types
//! (their `schemars` schemas, subschemas inlined), so that unknown fields are dropped, warned
//! about or refused (`fieldValidation`) as a real server's strict decoder does. Events are not
//! here: the sim stores both of their API views as one object, so their fields are checked
//! by neither view's type.

use std::sync::OnceLock;

use serde_json::Value;

/// The schema of built-in type `group`/`resource`, if the sim knows its fields.
pub fn schema(group: &str, resource: &str) -> Option<&'static Value> {
    type Known = Vec<((&'static str, &'static str), Value)>;
    static SCHEMAS: OnceLock<Known> = OnceLock::new();
    SCHEMAS
        .get_or_init(|| {
            use k8s_openapi::api::{
                admissionregistration::v1 as admission, apps::v1 as apps,
                coordination::v1 as coordination, core::v1 as core, policy::v1 as policy,
                rbac::v1 as rbac,
            };
            let mut schemas: Known = vec![];
            macro_rules! add {
                ($group:literal, $resource:literal, $type:ty) => {
                    schemas.push((($group, $resource), generate::<$type>()));
                };
            }
            add!("", "pods", core::Pod);
            add!("", "services", core::Service);
            add!("", "configmaps", core::ConfigMap);
            add!("", "secrets", core::Secret);
            add!("", "persistentvolumeclaims", core::PersistentVolumeClaim);
            add!("", "persistentvolumes", core::PersistentVolume);
            add!("", "serviceaccounts", core::ServiceAccount);
            add!("", "resourcequotas", core::ResourceQuota);
            add!("", "namespaces", core::Namespace);
            add!("", "nodes", core::Node);
            add!("coordination.k8s.io", "leases", coordination::Lease);
            add!("apps", "deployments", apps::Deployment);
            add!("apps", "replicasets", apps::ReplicaSet);
            add!(
                "policy",
                "poddisruptionbudgets",
                policy::PodDisruptionBudget
            );
            add!("rbac.authorization.k8s.io", "roles", rbac::Role);
            add!(
                "rbac.authorization.k8s.io",
                "rolebindings",
                rbac::RoleBinding
            );
            add!(
                "rbac.authorization.k8s.io",
                "clusterroles",
                rbac::ClusterRole
            );
            add!(
                "rbac.authorization.k8s.io",
                "clusterrolebindings",
                rbac::ClusterRoleBinding
            );
            add!(
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                admission::ValidatingWebhookConfiguration
            );
            schemas
        })
        .iter()
        .find(|((g, r), _)| *g == group && *r == resource)
        .map(|(_, schema)| schema)
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
