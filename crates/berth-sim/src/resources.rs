//! The registry of served resource types: the built-in ones and those that CRDs add. Each type
//! knows its group, version, plural, kind, scope, subresources and where its objects are stored.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::Value;

use crate::schema::CrdSchema;

/// Which storage bucket a type's objects live in. Two types can share one: core/v1 events and
/// events.k8s.io/v1 events are two views of the same objects.
pub type StorageKey = Arc<str>;

/// How a type's objects are shown to clients, relative to how they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Stored as served.
    Native,
    /// events.k8s.io/v1 view of core/v1 events.
    EventsV1,
    /// One version of a custom resource with several: objects are stored in the storage
    /// version, pruned to its schema, and shown in the version asked for, pruned to that
    /// version's schema (the `None` conversion strategy).
    Versioned,
}

/// Where a custom resource with several versions keeps its objects: the storage version.
#[derive(Clone, Debug)]
pub struct StorageVersion {
    /// `group/version`.
    pub api_version: String,
    pub schema: Option<Arc<CrdSchema>>,
}

/// What a type is for the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Stored objects (get, list, watch, create, update, patch, delete).
    Stored,
    /// Create-only reviews that are answered, never stored (TokenReview, SubjectAccessReview...).
    Review,
    /// Objects the server keeps itself, which clients may only get and list
    /// (ComponentStatus).
    ReadOnly,
}

/// A printer column of a Table response.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    /// For CRD columns: the JSONPath into the object. Built-in columns are computed in code.
    pub json_path: Option<String>,
}

/// One served resource type.
#[derive(Clone, Debug)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    /// The plural resource name used in URLs.
    pub resource: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Subresources served, e.g. `status`, `binding`, `token`.
    pub subresources: Vec<String>,
    pub storage: StorageKey,
    pub view: View,
    pub behaviour: Behaviour,
    /// `metadata.generation` is kept and bumped on spec changes.
    pub tracks_generation: bool,
    /// For custom resources: the structural schema with its CEL rules.
    pub schema: Option<Arc<CrdSchema>>,
    /// For a custom resource with several versions: its storage version.
    pub storage_version: Option<StorageVersion>,
    /// CRD printer columns, or empty for built-in defaults.
    pub printer_columns: Vec<PrinterColumn>,
    /// Field selectors this type supports besides metadata.name/namespace.
    pub field_labels: Vec<String>,
    pub is_custom: bool,
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }

    /// The verbs discovery advertises.
    pub fn verbs(&self) -> Vec<&'static str> {
        match self.behaviour {
            Behaviour::Review => vec!["create"],
            Behaviour::ReadOnly => vec!["get", "list"],
            Behaviour::Stored => {
                vec![
                    "create",
                    "delete",
                    "deletecollection",
                    "get",
                    "list",
                    "patch",
                    "update",
                    "watch",
                ]
            }
        }
    }

    /// Whether `field` may be used in a field selector.
    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.field_labels.iter().any(|f| f == field)
    }

    /// Reads a field-selector field from a (served-view) object as a string.
    pub fn field_value(&self, object: &Value, field: &str) -> String {
        let mut node = object;
        for part in field.split('.') {
            node = &node[part];
        }
        match node {
            Value::String(s) => s.clone(),
            // A Go bool that is not set is false.
            Value::Null if matches!(field, "spec.unschedulable" | "spec.hostNetwork") => {
                "false".to_owned()
            }
            Value::Null => String::new(),
            Value::Bool(b) => b.to_string(),
            other => other.to_string(),
        }
    }
}

/// All served types, by (group, version, plural).
#[derive(Clone, Debug, Default)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
}

impl Registry {
    /// The built-in types the sim serves.
    pub fn builtin() -> Self {
        let mut registry = Registry::default();
        for t in builtin_types() {
            registry.insert(t);
        }
        registry
    }

    pub fn insert(&mut self, t: ResourceType) {
        self.types.insert(
            (t.group.clone(), t.version.clone(), t.resource.clone()),
            Arc::new(t),
        );
    }

    pub fn remove_group_resource(&mut self, group: &str, resource: &str) {
        self.types
            .retain(|(g, _, r), _| !(g == group && r == resource));
    }

    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_owned(), version.to_owned(), resource.to_owned()))
            .cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }

    /// Groups and their versions, in discovery order (core group excluded).
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            if t.group.is_empty() {
                continue;
            }
            let versions = groups.entry(t.group.clone()).or_default();
            if !versions.contains(&t.version) {
                versions.push(t.version.clone());
            }
        }
        groups
    }
}

struct Spec {
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    subresources: &'static [&'static str],
    fields: &'static [&'static str],
    behaviour: Behaviour,
}

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const EVENT_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

fn builtin_types() -> Vec<ResourceType> {
    use Behaviour::{ReadOnly, Review, Stored};
    let specs = [
        Spec {
            group: "",
            version: "v1",
            resource: "namespaces",
            kind: "Namespace",
            namespaced: false,
            short: &["ns"],
            subresources: &["status", "finalize"],
            fields: &["status.phase"],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "nodes",
            kind: "Node",
            namespaced: false,
            short: &["no"],
            subresources: &["status", "proxy"],
            fields: &["spec.unschedulable"],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "pods",
            kind: "Pod",
            namespaced: true,
            short: &["po"],
            subresources: &[
                "status",
                "binding",
                "log",
                "eviction",
                "exec",
                "attach",
                "portforward",
                "proxy",
                "ephemeralcontainers",
                "resize",
            ],
            fields: &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "services",
            kind: "Service",
            namespaced: true,
            short: &["svc"],
            subresources: &["status", "proxy"],
            fields: &["spec.clusterIP", "spec.type"],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "persistentvolumeclaims",
            kind: "PersistentVolumeClaim",
            namespaced: true,
            short: &["pvc"],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "resourcequotas",
            kind: "ResourceQuota",
            namespaced: true,
            short: &["quota"],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "persistentvolumes",
            kind: "PersistentVolume",
            namespaced: false,
            short: &["pv"],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "secrets",
            kind: "Secret",
            namespaced: true,
            short: &[],
            subresources: &[],
            fields: &["type"],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "configmaps",
            kind: "ConfigMap",
            namespaced: true,
            short: &["cm"],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "serviceaccounts",
            kind: "ServiceAccount",
            namespaced: true,
            short: &["sa"],
            subresources: &["token"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "events",
            kind: "Event",
            namespaced: true,
            short: &["ev"],
            subresources: &[],
            fields: EVENT_FIELDS,
            behaviour: Stored,
        },
        Spec {
            group: "events.k8s.io",
            version: "v1",
            resource: "events",
            kind: "Event",
            namespaced: true,
            short: &["ev"],
            subresources: &[],
            fields: EVENT_V1_FIELDS,
            behaviour: Stored,
        },
        Spec {
            group: "apps",
            version: "v1",
            resource: "deployments",
            kind: "Deployment",
            namespaced: true,
            short: &["deploy"],
            subresources: &["status", "scale"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "apps",
            version: "v1",
            resource: "replicasets",
            kind: "ReplicaSet",
            namespaced: true,
            short: &["rs"],
            subresources: &["status", "scale"],
            fields: &["status.replicas"],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "componentstatuses",
            kind: "ComponentStatus",
            namespaced: false,
            short: &["cs"],
            subresources: &[],
            fields: &[],
            behaviour: ReadOnly,
        },
        Spec {
            group: "batch",
            version: "v1",
            resource: "jobs",
            kind: "Job",
            namespaced: true,
            short: &[],
            subresources: &["status"],
            fields: &["status.successful"],
            behaviour: Stored,
        },
        Spec {
            group: "batch",
            version: "v1",
            resource: "cronjobs",
            kind: "CronJob",
            namespaced: true,
            short: &["cj"],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "apiregistration.k8s.io",
            version: "v1",
            resource: "apiservices",
            kind: "APIService",
            namespaced: false,
            short: &[],
            subresources: &["status"],
            fields: &[],
            behaviour: ReadOnly,
        },
        Spec {
            group: "certificates.k8s.io",
            version: "v1",
            resource: "certificatesigningrequests",
            kind: "CertificateSigningRequest",
            namespaced: false,
            short: &["csr"],
            subresources: &["approval", "status"],
            fields: &["spec.signerName"],
            behaviour: Stored,
        },
        Spec {
            group: "policy",
            version: "v1",
            resource: "poddisruptionbudgets",
            kind: "PodDisruptionBudget",
            namespaced: true,
            short: &["pdb"],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "networking.k8s.io",
            version: "v1",
            resource: "networkpolicies",
            kind: "NetworkPolicy",
            namespaced: true,
            short: &["netpol"],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "admissionregistration.k8s.io",
            version: "v1",
            resource: "validatingadmissionpolicies",
            kind: "ValidatingAdmissionPolicy",
            namespaced: false,
            short: &[],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "admissionregistration.k8s.io",
            version: "v1",
            resource: "validatingadmissionpolicybindings",
            kind: "ValidatingAdmissionPolicyBinding",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "admissionregistration.k8s.io",
            version: "v1",
            resource: "validatingwebhookconfigurations",
            kind: "ValidatingWebhookConfiguration",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "",
            version: "v1",
            resource: "endpoints",
            kind: "Endpoints",
            namespaced: true,
            short: &["ep"],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "discovery.k8s.io",
            version: "v1",
            resource: "endpointslices",
            kind: "EndpointSlice",
            namespaced: true,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "coordination.k8s.io",
            version: "v1",
            resource: "leases",
            kind: "Lease",
            namespaced: true,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "apiextensions.k8s.io",
            version: "v1",
            resource: "customresourcedefinitions",
            kind: "CustomResourceDefinition",
            namespaced: false,
            short: &["crd", "crds"],
            subresources: &["status"],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "authentication.k8s.io",
            version: "v1",
            resource: "tokenreviews",
            kind: "TokenReview",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Review,
        },
        Spec {
            group: "authentication.k8s.io",
            version: "v1",
            resource: "selfsubjectreviews",
            kind: "SelfSubjectReview",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Review,
        },
        Spec {
            group: "authorization.k8s.io",
            version: "v1",
            resource: "subjectaccessreviews",
            kind: "SubjectAccessReview",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Review,
        },
        Spec {
            group: "authorization.k8s.io",
            version: "v1",
            resource: "selfsubjectaccessreviews",
            kind: "SelfSubjectAccessReview",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Review,
        },
        Spec {
            group: "authorization.k8s.io",
            version: "v1",
            resource: "selfsubjectrulesreviews",
            kind: "SelfSubjectRulesReview",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Review,
        },
        Spec {
            group: "authorization.k8s.io",
            version: "v1",
            resource: "localsubjectaccessreviews",
            kind: "LocalSubjectAccessReview",
            namespaced: true,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Review,
        },
        Spec {
            group: "rbac.authorization.k8s.io",
            version: "v1",
            resource: "roles",
            kind: "Role",
            namespaced: true,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "rbac.authorization.k8s.io",
            version: "v1",
            resource: "rolebindings",
            kind: "RoleBinding",
            namespaced: true,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "rbac.authorization.k8s.io",
            version: "v1",
            resource: "clusterroles",
            kind: "ClusterRole",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
        Spec {
            group: "rbac.authorization.k8s.io",
            version: "v1",
            resource: "clusterrolebindings",
            kind: "ClusterRoleBinding",
            namespaced: false,
            short: &[],
            subresources: &[],
            fields: &[],
            behaviour: Stored,
        },
    ];
    specs
        .into_iter()
        .map(|s| {
            let (storage, view) = if s.group == "events.k8s.io" {
                (StorageKey::from("/events"), View::EventsV1)
            } else {
                (
                    StorageKey::from(format!("{}/{}", s.group, s.resource)),
                    View::Native,
                )
            };
            ResourceType {
                group: s.group.to_owned(),
                version: s.version.to_owned(),
                resource: s.resource.to_owned(),
                singular: s.kind.to_lowercase(),
                kind: s.kind.to_owned(),
                list_kind: format!("{}List", s.kind),
                namespaced: s.namespaced,
                short_names: s.short.iter().map(|x| x.to_string()).collect(),
                categories: if matches!(
                    s.resource,
                    "pods" | "services" | "deployments" | "replicasets" | "jobs" | "cronjobs"
                ) {
                    vec!["all".to_owned()]
                } else {
                    vec![]
                },
                subresources: s.subresources.iter().map(|x| x.to_string()).collect(),
                storage,
                view,
                behaviour: s.behaviour,
                tracks_generation: matches!(
                    s.resource,
                    "pods"
                        | "customresourcedefinitions"
                        | "deployments"
                        | "replicasets"
                        | "jobs"
                        | "cronjobs"
                        | "poddisruptionbudgets"
                        | "networkpolicies"
                        | "validatingadmissionpolicies"
                        | "validatingadmissionpolicybindings"
                ),
                schema: None,
                storage_version: None,
                printer_columns: vec![],
                field_labels: s.fields.iter().map(|x| x.to_string()).collect(),
                is_custom: false,
            }
        })
        .collect()
}
