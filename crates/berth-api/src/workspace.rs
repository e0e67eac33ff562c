//! The `Workspace` spec: what a developer asks for. Every doc comment here becomes the
//! `kubectl explain` text, and every constraint is enforced by the API server through the CRD.

use std::{borrow::Cow, collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{Affinity, EnvVar, ResourceRequirements, Toleration},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{DurationString, Result, WorkspaceStatus};

/// DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`, starting and ending alphanumeric.
pub const DNS1123_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// The port the Berth agent serves on in every workspace pod (`berth controller
/// --agent-port`'s default); a workspace cannot declare it.
pub const AGENT_PORT: u16 = 50051;

/// Directories of the workspace container that are not the workspace's to mount over: the
/// service-account token Kubernetes mounts (`/var/run` is `/run` in most images), the Berth
/// agent's binary and its TLS files. Each with what it is, for the API's message.
pub const RESERVED_DIRS: [(&str, &str); 4] = [
    (
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "the service-account token Kubernetes mounts",
    ),
    (
        "/run/secrets/kubernetes.io/serviceaccount",
        "the service-account token Kubernetes mounts",
    ),
    ("/opt/berth", "the Berth agent's binary"),
    (
        "/etc/berth",
        "the Berth agent's TLS files and content credentials",
    ),
];

/// DNS-1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric.
pub const DNS1123_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// What a developer asks for: the image, its command and resources, ports, storage and
/// scheduling of the workspace pod, and how Berth bounds its start.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "Workspace",
    doc = "A developer workspace: one pod with its storage, service and in-pod agent, which Berth keeps alive, explains and repairs.",
    plural = "workspaces",
    singular = "workspace",
    shortname = "ws",
    namespaced,
    status = "WorkspaceStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Where the workspace is in its lifecycle"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the workspace is usable"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.summary","description":"What is wrong (or happening), in short; kubectl describe has the detail and the fix"}"#,
    printcolumn = r#"{"name":"Update","type":"boolean","jsonPath":".status.pendingRestart","description":"The workspace's kind changed since it started: the next start from stopped applies it (condition UpdateAvailable lists what)"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.kind","priority":1,"description":"The WorkspaceKind the workspace is of"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".status.pod.name","priority":1,"description":"The workspace's current pod"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.pod.nodeName","priority":1,"description":"The node of the current pod"}"#,
    printcolumn = r#"{"name":"Recreations","type":"integer","jsonPath":".status.podRecreations","priority":1,"description":"Pods replaced after kubelet rejection since the last start"}"#,
    printcolumn = r#"{"name":"Last-Active","type":"date","jsonPath":".status.lastActivity","priority":1,"description":"When the current pod was last used, as its agent saw it (empty until it is)"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.kind) || has(self.image)").field_path(".image").reason(kube::core::Reason::FieldValueRequired).message("set it, or name a WorkspaceKind in spec.kind"),
    validation = Rule::new("!has(self.kind) || !has(self.image)").field_path(".image").reason(kube::core::Reason::FieldValueForbidden).message("a workspace of a kind gets its image from the kind's image option (spec.options.image); leave spec.image out"),
    validation = Rule::new("!has(self.kind) || !has(self.resources)").field_path(".resources").reason(kube::core::Reason::FieldValueForbidden).message("a workspace of a kind gets its resources from the kind's pod option (spec.options.pod); leave spec.resources out"),
    validation = Rule::new("!has(self.kind) || !has(self.serviceAccountName)").field_path(".serviceAccountName").reason(kube::core::Reason::FieldValueForbidden).message("a workspace of a kind runs as the kind's service account; leave spec.serviceAccountName out"),
    validation = Rule::new("!has(self.kind) || !has(self.podTemplate) || (!has(self.podTemplate.nodeSelector) && !has(self.podTemplate.tolerations) && !has(self.podTemplate.affinity))").field_path(".podTemplate").reason(kube::core::Reason::FieldValueForbidden).message("a workspace of a kind gets its node selector, tolerations and affinity from the kind's pod option (spec.options.pod); leave them out"),
    validation = Rule::new("!has(self.content) || has(self.kind) || (has(self.podTemplate) && has(self.podTemplate.volumes) && has(self.podTemplate.volumes.home))").field_path(".podTemplate.volumes.home").reason(kube::core::Reason::FieldValueRequired).message("spec.content is cloned into the home volume: set spec.podTemplate.volumes.home too"),
    validation = Rule::new("has(self.kind) || !has(self.options)").field_path(".options").reason(kube::core::Reason::FieldValueForbidden).message("spec.options picks options of a WorkspaceKind: set spec.kind too")
)]
pub struct WorkspaceSpec {
    /// The WorkspaceKind the workspace is of (cluster-scoped; `kubectl get wsk` lists them):
    /// its image, pod shape, home, env, probes, security context, service account and
    /// lifecycle defaults come from the kind and the options picked. Picking a kind needs the
    /// RBAC verb `use` on `workspacekinds/<name>` (group `berth.dev`). Absent, the spec says
    /// everything itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub kind: Option<String>,

    /// The kind's options the workspace picks (`spec.kind` must be set); the kind's defaults
    /// for those it leaves out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Box<crate::resolution::WorkspaceOptions>>,

    /// The container image of the workspace, e.g. `ghcr.io/example/devbox:1.4`. Required
    /// unless `kind` is set; a workspace of a kind gets its image from the kind.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 4096), regex(pattern = r"^\S+$"))]
    pub image: String,

    /// The command the workspace container runs. The image's entrypoint when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,

    /// Environment variables of the workspace container (core/v1 EnvVar). Names are
    /// C-identifier-like (`[-._a-zA-Z][-._a-zA-Z0-9]*`); names starting with `BERTH_` are the
    /// agent's and refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "env_schema")]
    pub env: Vec<EnvVar>,

    /// CPU and memory requests and limits of the workspace container (core/v1
    /// ResourceRequirements). Each value is a quantity (`500m`, `2Gi`), never negative; a limit
    /// is at least its request; an extended resource (`example.com/gpu`) or huge pages need a
    /// limit equal to the request, in whole units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<Box<ResourceRequirements>>,

    /// Ports the workspace serves; when set, Berth exposes them through a ClusterIP Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "ports_schema")]
    pub ports: Vec<WorkspacePort>,

    /// `true` stops the workspace: the pod is deleted and the storage kept. `false` starts it again.
    #[serde(default)]
    pub paused: bool,

    /// The service account the workspace pod runs as. It needs the `system:auth-delegator`
    /// ClusterRole so the in-pod agent can check who calls it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,

    /// Pod-level settings: extra metadata, scheduling constraints and volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<Box<PodTemplate>>,

    /// How long a start may make no progress, and how rejected pods are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Box<Lifecycle>>,

    /// What the home volume starts with: a git repository the in-pod agent clones before the
    /// workspace's command starts (needs a home volume). Cloned once: a later start finds the
    /// checkout and leaves it, and the user's work in it, alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Box<crate::content::WorkspaceContent>>,
}

/// The schema of a port list (a Workspace's `ports`, a kind's image option's): at most 32,
/// names and numbers unique, names with a letter, and never the agent's port.
pub(crate) fn ports_schema(generator: &mut SchemaGenerator) -> Schema {
    let items = generator.subschema_for::<WorkspacePort>();
    json_schema!({
        "type": "array",
        "maxItems": 32,
        "items": items,
        "x-kubernetes-validations": [
            {"rule": "self.all(p, p.port != 50051)", "message": "ports: 50051 is the Berth agent's port in every workspace pod; pick another port"},
            {"rule": "self.all(p, self.exists_one(q, q.name == p.name))", "message": "each port name must be unique"},
            {"rule": "self.all(p, self.exists_one(q, q.port == p.port))", "message": "each port number must be unique"},
            {"rule": "self.all(p, p.name.matches('[a-z]'))", "message": "each port name must contain at least one letter (a-z), as Kubernetes requires of container port names"}
        ]
    })
}

/// The most environment variables a workspace may set (a bound for the CRD's rule costs).
pub const MAX_ENV: u64 = 256;

/// The schema of `spec.env`: core/v1 EnvVar items whose names follow the real API server's
/// rule, and may not take the agent's `BERTH_` prefix (the agent's settings are the
/// operator's, never the user's).
pub(crate) fn env_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut items = generator.subschema_for::<EnvVar>();
    if let Some(name) = items
        .get_mut("properties")
        .and_then(|p| p.get_mut("name"))
        .and_then(|n| n.as_object_mut())
    {
        name.insert("maxLength".into(), 256.into());
        name.insert("pattern".into(), r"^[-._a-zA-Z][-._a-zA-Z0-9]*$".into());
        name.insert(
            "x-kubernetes-validations".into(),
            serde_json::json!([{
                "rule": "!self.startsWith('BERTH_')",
                "message": "environment variables starting with BERTH_ are reserved for the Berth agent"
            }]),
        );
    }
    // As the real API server: a variable's valueFrom may not be set beside a non-empty value.
    items.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "!has(self.valueFrom) || !has(self.value) || self.value == ''",
            "message": "env: a variable has a value or a valueFrom, not both"
        }]),
    );
    json_schema!({
        "type": "array",
        "maxItems": MAX_ENV,
        "items": items
    })
}

/// The most entries of `resources.requests` and of `resources.limits`: cpu, memory,
/// ephemeral storage, two huge page sizes and a few extended resources. It bounds what the
/// API server estimates the CRD's rules cost.
pub const MAX_RESOURCES: u64 = 8;

/// The native resources whose limit may exceed the request; the rule comparing them names
/// each one (a rule over every key could not pay for its comparisons).
const OVERCOMMITTED: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// The schema of `spec.resources`: core/v1 ResourceRequirements, with the rules the real
/// API server applies to a container's resources, so a workspace whose pod would be refused
/// is refused itself, naming the field.
///
/// Every rule checks `isQuantity` before `quantity`, so a bad value is a message, never an
/// evaluation error, and every rule fits the API server's cost budget on Kubernetes 1.30+
/// (10 000 000 per rule, 100 000 000 per CRD, estimated when the CRD is created). Up to 1.33
/// that estimate takes an int-or-string value to be 3 MiB long whatever its `maxLength`, so a
/// `quantity(string(v))` is about 630 000, and the rules spend it sparingly: each value is
/// checked on its own (bounded by [`MAX_RESOURCES`]), the comparison of a limit with its request
/// names the resources it compares, and the rules over every key compare text.
pub(crate) fn resources_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<ResourceRequirements>();
    let value_rules = json!([
        {
            "rule": "isQuantity(string(self))",
            "message": "must be a quantity, such as 500m, 2 or 2Gi"
        },
        {
            "rule": "!string(self).startsWith('-')",
            "message": "must not be negative"
        }
    ]);
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for map in ["requests", "limits"] {
            if let Some(map) = properties.get_mut(map).and_then(|m| m.as_object_mut()) {
                map.insert("maxProperties".into(), MAX_RESOURCES.into());
                if let Some(value) = map
                    .get_mut("additionalProperties")
                    .and_then(|v| v.as_object_mut())
                {
                    value.insert("x-kubernetes-validations".into(), value_rules.clone());
                }
            }
        }
    }
    // Extended resources (`example.com/gpu`) and huge pages cannot be overcommitted: their
    // limit is their request (the real API server's IsOvercommitAllowed).
    let fixed =
        "((k.contains('/') && !k.contains('kubernetes.io/')) || k.startsWith('hugepages-'))";
    let extended = "(k.contains('/') && !k.contains('kubernetes.io/'))";
    let mut rules = vec![];
    for resource in OVERCOMMITTED {
        let (request, limit) = (
            format!("self.requests['{resource}']"),
            format!("self.limits['{resource}']"),
        );
        rules.push(json!({
            "rule": format!(
                "!has(self.requests) || !has(self.limits) || !('{resource}' in self.requests) || !('{resource}' in self.limits) \
                 || !isQuantity(string({request})) || !isQuantity(string({limit})) \
                 || quantity(string({limit})).compareTo(quantity(string({request}))) >= 0"
            ),
            "message": format!("resources.limits[{resource}] must be at least resources.requests[{resource}]"),
        }));
    }
    let unlimited = format!("{fixed} && !(has(self.limits) && k in self.limits)");
    rules.push(json!({
        "rule": format!("!has(self.requests) || !self.requests.exists(k, {unlimited})"),
        "message": "resources.limits: an extended resource or huge pages need a limit equal to the request",
        "messageExpression": format!("'resources.limits[' + self.requests.filter(k, {unlimited})[0] + '] must be set, equal to its request: it cannot be overcommitted'"),
    }));
    let unequal = format!(
        "{fixed} && k in self.limits && string(self.requests[k]) != string(self.limits[k])"
    );
    rules.push(json!({
        "rule": format!("!has(self.requests) || !has(self.limits) || !self.requests.exists(k, {unequal})"),
        "message": "resources.limits: an extended resource or huge pages need a limit equal to the request",
        "messageExpression": format!("'resources.limits[' + self.requests.filter(k, {unequal})[0] + '] must be equal to resources.requests[' + self.requests.filter(k, {unequal})[0] + ']: it cannot be overcommitted'"),
    }));
    for map in ["requests", "limits"] {
        let fraction = format!("{extended} && !string(self.{map}[k]).matches('^[0-9]+$')");
        rules.push(json!({
            "rule": format!("!has(self.{map}) || !self.{map}.exists(k, {fraction})"),
            "message": format!("resources.{map}: an extended resource is counted in whole units, such as 1"),
            "messageExpression": format!("'resources.{map}[' + self.{map}.filter(k, {fraction})[0] + '] must be a whole number, such as 1: an extended resource is counted in whole units'"),
        }));
    }
    // A container's `resources.claims` names one of the pod's `resourceClaims`, which Berth never
    // gives a workspace pod: every name would make the pod invalid, so none is accepted.
    rules.push(json!({
        "rule": "!has(self.claims) || size(self.claims) == 0",
        "message": "resources.claims: a workspace's pod has no resource claims (pod.spec.resourceClaims) for a container to name, so no claim name is valid here; leave resources.claims out",
        "reason": "FieldValueForbidden",
        "fieldPath": ".claims",
    }));
    schema.insert("x-kubernetes-validations".into(), rules.into());
    schema.insert("nullable".into(), true.into());
    schema
}

/// A port the workspace serves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspacePort {
    /// The port's name (e.g. `http`), unique within the workspace: at most 15 lowercase
    /// letters, digits and single hyphens, with at least one letter (a container port name).
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[a-z0-9](-?[a-z0-9])*$"))]
    pub name: String,
    /// The port number the workspace container listens on, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Whether `berth gateway` removes `/w/<namespace>/<workspace>/<port>` from the path it
    /// forwards (default true; the app gets it in `X-Forwarded-Prefix`). An app that is told
    /// its base path and wants the full one sets false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<bool>,
    /// Whether `berth gateway` serves this port to anyone, without a credential (default
    /// false). Honoured for a port its WorkspaceKind declares public, and for a workspace's
    /// own port only where the gateway allows it (`berth gateway --allow-public-ports`);
    /// otherwise the port stays private and the gateway says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
}

/// Pod-level settings of the workspace pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations added to the workspace pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// Node labels the pod's node must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pod tolerates (core/v1 Toleration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod affinity of the pod (core/v1 Affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Storage of the workspace: an owned home volume, existing claims, and secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<WorkspaceVolumes>,
}

/// Labels and annotations added to the workspace pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels added to the pod. Berth's own labels win over these.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The workspace's volumes. Every mountPath must be unique across home, data and secrets.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.home) || ((!has(self.data) || self.data.all(d, d.mountPath != self.home.mountPath)) && (!has(self.secrets) || self.secrets.all(s, s.mountPath != self.home.mountPath)))").message("home.mountPath is also used by a data or secret volume; each mountPath must be unique"),
    validation = Rule::new("!has(self.data) || self.data.all(d, self.data.exists_one(e, e.mountPath == d.mountPath) && (!has(self.secrets) || self.secrets.all(s, s.mountPath != d.mountPath)))").message("two data or secret volumes share a mountPath; each mountPath must be unique"),
    validation = Rule::new("!has(self.secrets) || self.secrets.all(s, self.secrets.exists_one(t, t.mountPath == s.mountPath))").message("two secret volumes share a mountPath; each mountPath must be unique")
)]
pub struct WorkspaceVolumes {
    /// A PersistentVolumeClaim that Berth creates and owns for this workspace; it outlives
    /// pauses and restarts and is deleted with the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<HomeVolume>,
    /// Existing PersistentVolumeClaims mounted into the workspace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub data: Vec<DataVolume>,
    /// Secrets mounted into the workspace as files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub secrets: Vec<SecretVolume>,
}

/// The workspace's own home volume. Its claim can grow but never shrink, and keeps the storage
/// class it was created with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("isQuantity(string(self.size)) && quantity(string(self.size)).sign() > 0").message("home.size must be a quantity greater than zero, such as 10Gi"),
    validation = Rule::new("!isQuantity(string(self.size)) || !isQuantity(string(oldSelf.size)) || quantity(string(self.size)).compareTo(quantity(string(oldSelf.size))) >= 0").message("home.size cannot shrink: a claim can only grow (set it back to at least its current size)"),
    validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("home.storageClassName cannot change: the claim keeps the class it was created with")
)]
pub struct HomeVolume {
    /// Requested size of the claim, e.g. `10Gi`. Growing it grows the claim (its storage class
    /// must allow volume expansion) and replaces the pod; it cannot shrink.
    pub size: Quantity,
    /// Storage class of the claim; the cluster's default class when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub storage_class_name: Option<String>,
    /// Where the volume is mounted, an absolute path such as `/home/dev`.
    pub mount_path: MountPath,
}

/// An existing PersistentVolumeClaim mounted into the workspace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolume {
    /// Name of the claim in the workspace's namespace (a DNS-1123 subdomain).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub claim_name: String,
    /// Where the claim is mounted, an absolute path such as `/data`.
    pub mount_path: MountPath,
    /// Mount the claim read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// A secret mounted into the workspace as files, one per key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolume {
    /// Name of the secret in the workspace's namespace (a DNS-1123 subdomain).
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: String,
    /// Where the secret's files appear, an absolute path such as `/secrets/git`.
    pub mount_path: MountPath,
    /// File mode bits of the secret's files, 0 to 511 (0777); e.g. 420 is 0644. Default 420.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 511))]
    pub default_mode: Option<i32>,
    /// `true` lets the workspace start while the secret does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// An absolute path inside the workspace container, with no `..` segment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(transparent)]
pub struct MountPath(pub String);

impl MountPath {
    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for MountPath {
    fn from(s: &str) -> Self {
        MountPath(s.to_owned())
    }
}

impl JsonSchema for MountPath {
    fn schema_name() -> Cow<'static, str> {
        "MountPath".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut rules = vec![
            json!({
                "rule": "self.startsWith('/')",
                "message": "mountPath must be an absolute path (start with '/')"
            }),
            json!({
                "rule": "!self.matches('(^|/)[.][.](/|$)')",
                "message": "mountPath must not contain a '..' segment"
            }),
            json!({
                "rule": "!self.matches('(^|/)[.](/|$)')",
                "message": "mountPath must not contain a '.' segment"
            }),
            json!({
                "rule": "!self.matches('^/+$')",
                "message": "mountPath must not be / (the container's whole filesystem)"
            }),
        ];
        for (dir, what) in RESERVED_DIRS {
            // `/+` between segments: `//opt/berth` is the same directory.
            let pattern = dir.replace('.', "[.]").replace('/', "/+");
            rules.push(json!({
                "rule": format!("!self.matches('^{pattern}(/|$)')"),
                "message": format!("mountPath must not be {dir} or below it ({what})")
            }));
        }
        json_schema!({
            "type": "string",
            "minLength": 1,
            "maxLength": 1024,
            "x-kubernetes-validations": rules
        })
    }
}

/// How a start is bounded, how rejected pods are replaced, and when an idle workspace stops.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// A start that makes no progress for this long fails (`Stalled`, reason `StartTimeout`).
    /// A Kubernetes duration such as `10m`; the operator's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout: Option<DurationString>,
    /// How pods rejected by their kubelet are replaced; the operator's defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_recreation: Option<PodRecreationSpec>,
    /// A running workspace that nobody used for this long is stopped: Berth sets
    /// `spec.paused` to true (its storage is kept; set it to false to resume). Use is what the
    /// in-pod agent sees: a connection to one of `ports`, its processes using CPU, or a
    /// `Heartbeat` call. A Kubernetes duration such as `2h`; absent, the workspace never stops
    /// by itself. An agent that cannot be asked never gets a workspace stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "idle_timeout_schema")]
    pub idle_timeout: Option<DurationString>,
}

/// A duration longer than zero.
fn idle_timeout_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = DurationString::json_schema(generator);
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "self.matches('[1-9]')",
            "message": "idleTimeout must be longer than 0s; leave it out for a workspace that never stops by itself"
        }]),
    );
    schema
}

/// Replacement of pods that a kubelet rejected, as written in the spec.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodRecreationSpec {
    /// How many rejected pods are replaced per start before the workspace fails, 0 to 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 20))]
    pub max_recreations: Option<u32>,
    /// How long after the rejected pod is gone a new one is created, e.g. `15s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DurationString>,
}

/// Rejection recovery as the operator applies it: the spec's values over the operator's
/// defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRecreationPolicy {
    /// Replacements allowed per start.
    pub max: u32,
    /// Wait between the rejected pod being gone and the new pod's creation.
    pub delay: Duration,
}

impl PodRecreationPolicy {
    /// The policy for a workspace: fields the spec sets win over `defaults`.
    pub fn resolve(
        spec: Option<&PodRecreationSpec>,
        defaults: PodRecreationPolicy,
    ) -> Result<Self> {
        let Some(spec) = spec else {
            return Ok(defaults);
        };
        Ok(PodRecreationPolicy {
            max: spec.max_recreations.unwrap_or(defaults.max),
            delay: match &spec.delay {
                Some(delay) => delay.to_duration()?,
                None => defaults.delay,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator caches every Workspace (10 000 and more): the struct itself, every
    /// optional part included whether set or not, stays small. The kind's record, the pod
    /// template, the kind's probes and security context, and the parts most workspaces leave
    /// out (options, resources, lifecycle, content and its status, the admission record) are
    /// boxed; unboxed it was 3 960 bytes, then 1 448 with only the first boxed. The cache
    /// keeps each in an `Arc` (16 bytes more), and the operator's allocator (mimalloc) rounds
    /// a block up to its size class (1 024, 1 280, 1 536, ...): 1 448 bytes took 1 536, and
    /// one more byte past a kilobyte takes 1 280.
    #[test]
    fn a_cached_workspace_fits_a_kilobyte() {
        let size = std::mem::size_of::<Workspace>();
        assert!(size + 16 <= 1_024, "a Workspace is {size} bytes inline");
    }

    const DEFAULTS: PodRecreationPolicy = PodRecreationPolicy {
        max: 3,
        delay: Duration::from_secs(15),
    };

    #[test]
    fn recreation_policy_without_spec_is_the_default() {
        assert_eq!(
            PodRecreationPolicy::resolve(None, DEFAULTS).unwrap(),
            DEFAULTS
        );
    }

    #[test]
    fn recreation_policy_takes_each_field_the_spec_sets() {
        let spec = PodRecreationSpec {
            max_recreations: Some(1),
            delay: None,
        };
        let policy = PodRecreationPolicy::resolve(Some(&spec), DEFAULTS).unwrap();
        assert_eq!(policy, PodRecreationPolicy { max: 1, ..DEFAULTS });

        let spec = PodRecreationSpec {
            max_recreations: None,
            delay: Some("2s".into()),
        };
        let policy = PodRecreationPolicy::resolve(Some(&spec), DEFAULTS).unwrap();
        assert_eq!(policy.delay, Duration::from_secs(2));
        assert_eq!(policy.max, 3);
    }

    #[test]
    fn recreation_policy_with_a_bad_delay_is_an_error() {
        let spec = PodRecreationSpec {
            max_recreations: None,
            delay: Some("soon".into()),
        };
        let err = PodRecreationPolicy::resolve(Some(&spec), DEFAULTS).unwrap_err();
        assert_eq!(err.reason(), "InvalidDuration");
    }
}

/// An object a workspace's pod uses on its creator's behalf, and the access that shows the
/// creator may use it directly (what `berth webhook` asks SubjectAccessReview about).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The verb, e.g. `get`.
    pub verb: &'static str,
    /// The resource (core group), e.g. `secrets`.
    pub resource: &'static str,
    /// The subresource, e.g. `token` for service accounts; empty for none.
    pub subresource: &'static str,
    pub name: String,
    /// Where the spec names it, e.g. `spec.env[2].valueFrom.secretKeyRef`.
    pub field: String,
}

impl Reference {
    /// The field without its list positions, as the schema names it:
    /// `spec.env[2].valueFrom.secretKeyRef` (and the admission policy's
    /// `spec.env[name=A].valueFrom.secretKeyRef`) are `spec.env.valueFrom.secretKeyRef`.
    pub fn unindexed(field: &str) -> String {
        let mut out = String::with_capacity(field.len());
        let mut depth = 0usize;
        for c in field.chars() {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                c if depth == 0 => out.push(c),
                _ => {}
            }
        }
        out
    }
}

impl WorkspaceSpec {
    /// Every object the pod would use in the workspace's namespace: the service account it
    /// runs as (other than `default`: running as an account is as good as holding its token,
    /// so `create serviceaccounts/token`), each secret and config map it reads (`get`), each
    /// existing claim it mounts (`get`).
    pub fn references(&self) -> Vec<Reference> {
        let mut found = vec![];
        let mut add = |verb, resource, subresource, name: &str, field: String| {
            found.push(Reference {
                verb,
                resource,
                subresource,
                name: name.to_owned(),
                field,
            })
        };
        if let Some(account) = self
            .service_account_name
            .as_deref()
            .filter(|a| *a != "default")
        {
            add(
                "create",
                "serviceaccounts",
                "token",
                account,
                "spec.serviceAccountName".to_owned(),
            );
        }
        for (i, var) in self.env.iter().enumerate() {
            let Some(from) = &var.value_from else {
                continue;
            };
            if let Some(secret) = &from.secret_key_ref {
                let field = format!("spec.env[{i}].valueFrom.secretKeyRef");
                add("get", "secrets", "", &secret.name, field);
            }
            if let Some(map) = &from.config_map_key_ref {
                let field = format!("spec.env[{i}].valueFrom.configMapKeyRef");
                add("get", "configmaps", "", &map.name, field);
            }
        }
        let volumes = self.pod_template.as_ref().and_then(|t| t.volumes.as_ref());
        for (i, secret) in volumes.iter().flat_map(|v| v.secrets.iter()).enumerate() {
            let field = format!("spec.podTemplate.volumes.secrets[{i}]");
            add("get", "secrets", "", &secret.secret_name, field);
        }
        for (i, data) in volumes.iter().flat_map(|v| v.data.iter()).enumerate() {
            let field = format!("spec.podTemplate.volumes.data[{i}]");
            add("get", "persistentvolumeclaims", "", &data.claim_name, field);
        }
        let content_auth = self.content.as_ref().and_then(|c| c.git.auth.as_ref());
        if let Some(auth) = content_auth {
            let field = "spec.content.git.auth.secretName".to_owned();
            add("get", "secrets", "", &auth.secret_name, field);
        }
        found
    }
}

#[cfg(test)]
mod reference_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_object_the_pod_would_use_is_a_reference() {
        let spec: WorkspaceSpec = serde_json::from_value(json!({
            "image": "x:1",
            "serviceAccountName": "deployer",
            "env": [
                {"name": "PLAIN", "value": "1"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "payments-db", "key": "password"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}
            ],
            "podTemplate": {"volumes": {
                "data": [{"claimName": "bob-home", "mountPath": "/data"}],
                "secrets": [{"secretName": "deploy-key", "mountPath": "/keys"}]
            }},
            "content": {"git": {"url": "https://example.com/org/app.git", "auth": {"secretName": "git-token"}}}
        }))
        .unwrap();
        let references = spec.references();
        let found: Vec<_> = references
            .iter()
            .map(|r| {
                (
                    r.verb,
                    r.resource,
                    r.subresource,
                    r.name.as_str(),
                    r.field.as_str(),
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                (
                    "create",
                    "serviceaccounts",
                    "token",
                    "deployer",
                    "spec.serviceAccountName"
                ),
                (
                    "get",
                    "secrets",
                    "",
                    "payments-db",
                    "spec.env[1].valueFrom.secretKeyRef"
                ),
                (
                    "get",
                    "configmaps",
                    "",
                    "settings",
                    "spec.env[2].valueFrom.configMapKeyRef"
                ),
                (
                    "get",
                    "secrets",
                    "",
                    "deploy-key",
                    "spec.podTemplate.volumes.secrets[0]"
                ),
                (
                    "get",
                    "persistentvolumeclaims",
                    "",
                    "bob-home",
                    "spec.podTemplate.volumes.data[0]"
                ),
                (
                    "get",
                    "secrets",
                    "",
                    "git-token",
                    "spec.content.git.auth.secretName"
                ),
            ]
        );
        let default: WorkspaceSpec =
            serde_json::from_value(json!({"image": "x:1", "serviceAccountName": "default"}))
                .unwrap();
        assert!(default.references().is_empty());
        assert_eq!(
            Reference::unindexed("spec.env[name=A].valueFrom.secretKeyRef"),
            "spec.env.valueFrom.secretKeyRef"
        );
        assert_eq!(
            Reference::unindexed("spec.podTemplate.volumes.data[0]"),
            "spec.podTemplate.volumes.data"
        );
    }
}
