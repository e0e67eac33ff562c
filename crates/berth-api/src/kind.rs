//! The `WorkspaceKind`: what a platform team offers, cluster-wide. The spawner's text, the
//! image and pod options a workspace picks from, and what every workspace of the kind gets.
//! Every doc comment is `kubectl explain` text; every rule is the API server's to enforce.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Affinity, EnvVar, PodSecurityContext, Probe, ResourceRequirements, SecurityContext,
        Toleration,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{DurationString, MountPath, PodRecreationSpec, WorkspacePort};

/// The most options of each list: bounds what the API server estimates the rules cost.
pub const MAX_OPTIONS: u64 = 32;

/// A kind of workspace that a platform team publishes: what its spawner shows, the image and
/// pod options a workspace of the kind picks from, and what every such workspace gets (home
/// volume, env, probes, security context, service account, lifecycle).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "WorkspaceKind",
    doc = "A kind of workspace a platform team offers: the options a workspace picks from and what every workspace of the kind gets.",
    plural = "workspacekinds",
    singular = "workspacekind",
    shortname = "wsk",
    status = "WorkspaceKindStatus",
    printcolumn = r#"{"name":"Display-Name","type":"string","jsonPath":".spec.spawner.displayName","description":"The name the spawner shows"}"#,
    printcolumn = r#"{"name":"Workspaces","type":"integer","jsonPath":".status.workspaces","description":"Workspaces of this kind"}"#,
    printcolumn = r#"{"name":"Deprecated","type":"boolean","jsonPath":".spec.spawner.deprecated","description":"Whether new workspaces should pick another kind"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceKindSpec {
    /// What a spawner (a UI, `berth`) shows of the kind.
    pub spawner: Spawner,
    /// The image and pod options a workspace of the kind picks from.
    pub options: KindOptions,
    /// The home volume every workspace of the kind gets, unless the workspace sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<KindHome>,
    /// Environment variables of every workspace container of the kind (core/v1 EnvVar); a
    /// workspace's own variables of the same name win. Names starting with `BERTH_` are the
    /// agent's and refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::workspace::env_schema")]
    pub env: Vec<EnvVar>,
    /// Probes of the workspace container (core/v1 Probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Box<KindProbes>>,
    /// The security context of the pod and of the workspace container. Absent, the pod runs
    /// as Pod Security "restricted" asks: non-root, no privilege escalation, no capabilities,
    /// the runtime's default seccomp profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<Box<KindSecurityContext>>,
    /// The service account the pods of the kind run as; the namespace's `default` when absent.
    /// It needs the `system:auth-delegator` ClusterRole so the in-pod agent can check who
    /// calls it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,
    /// Lifecycle defaults of the kind's workspaces, and the longest idle timeout they may ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<KindLifecycle>,
}

/// What a spawner shows of a kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Spawner {
    /// The kind's name as people read it, e.g. `Python data science`.
    #[schemars(length(min = 1, max = 128))]
    pub display_name: String,
    /// What the kind is for, in a sentence or two.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub description: String,
    /// A small picture of the kind for a spawner: an image inline as a data URL
    /// (`data:image/png;base64,...`, also `image/svg+xml`, `image/webp`, `image/jpeg`), so a
    /// spawner fetches nothing from elsewhere.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(
        length(max = 16384),
        regex(pattern = r"^data:image/(png|svg\+xml|webp|jpeg);base64,[A-Za-z0-9+/]+=*$")
    )]
    pub icon: String,
    /// `true` keeps the kind out of a spawner's list; workspaces may still name it.
    #[serde(default)]
    pub hidden: bool,
    /// `true` says new workspaces should pick another kind; existing ones keep running.
    #[serde(default)]
    pub deprecated: bool,
    /// What a spawner says of a deprecated kind, e.g. which kind to pick instead.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub deprecation_message: String,
}

/// The option lists of a kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindOptions {
    /// The images a workspace picks from, each with its pull policy and ports.
    pub image: OptionList<ImageConfig>,
    /// The pod shapes a workspace picks from: resources and scheduling.
    pub pod: OptionList<PodConfig>,
}

/// A list of options: the one a workspace gets when it picks none, and the options.
/// Its `default` must be one of the ids; ids are unique; a redirect goes to another option of
/// the list that does not redirect itself (one hop, so no chain and no cycle).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.values.exists(v, v.id == self.default)",
        "message": "default must be the id of one of the options in values"
    },
    {
        "rule": "self.values.all(v, self.values.exists_one(w, w.id == v.id))",
        "message": "each option's id must be unique"
    },
    {
        "rule": "self.values.all(v, !has(v.redirect) || self.values.exists(w, w.id == v.redirect.to && !has(w.redirect)))",
        "message": "a redirect must name another option of the list that does not redirect itself (one hop: no chains, no cycles)"
    }
]))]
pub struct OptionList<T: JsonSchema> {
    /// The id of the option a workspace gets when it picks none.
    #[schemars(length(min = 1, max = 63))]
    pub default: String,
    /// The options, at most 32.
    #[schemars(length(min = 1, max = 32))]
    pub values: Vec<KindOption<T>>,
}

/// One option a workspace can pick.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindOption<T: JsonSchema> {
    /// The option's id, which a workspace names (`spec.options.image` or `spec.options.pod`):
    /// lowercase letters, digits and `-`, at most 63 characters.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub id: String,
    /// The option's name as people read it, e.g. `Python 3.12`.
    #[schemars(length(min = 1, max = 128))]
    pub display_name: String,
    /// What the option gives, in a sentence.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub description: String,
    /// `true` keeps the option out of a spawner's list; workspaces may still pick it.
    #[serde(default)]
    pub hidden: bool,
    /// Where workspaces on this option should move: shown to them as an update available,
    /// applied at their next start, never behind their back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    /// What the option sets.
    pub spec: T,
}

/// An option's successor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    /// The id of the option to move to, in the same list.
    #[schemars(length(min = 1, max = 63))]
    pub to: String,
    /// Why, as the workspace's update notice says it, e.g. `3.11 is end of life`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub message: String,
}

/// What an image option sets: the image, how it is pulled, and the ports it serves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfig {
    /// The container image, e.g. `ghcr.io/example/devbox:1.4`.
    #[schemars(length(min = 1, max = 4096), regex(pattern = r"^\S+$"))]
    pub image: String,
    /// When the kubelet pulls the image: `Always`, `IfNotPresent` or `Never`; the kubelet's
    /// default when absent (`Always` for `:latest`, else `IfNotPresent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pull_policy_schema")]
    pub image_pull_policy: Option<String>,
    /// The ports the image serves; Berth exposes them through the workspace's Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::workspace::ports_schema")]
    pub ports: Vec<WorkspacePort>,
    /// The command that serves the option (e.g. a browser IDE on its port), for a workspace
    /// that gives none of its own; Berth's agent runs and supervises it, so the workspace has
    /// shells and SSH. The image's entrypoint when absent (and the workspace has no command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub command: Option<Vec<String>>,
}

fn pull_policy_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Always", "IfNotPresent", "Never"]
    })
}

/// What a pod option sets: the workspace container's resources and the pod's scheduling.
/// Scheduling comes from the admin's kind, so a workspace of a kind needs no allow-list.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodConfig {
    /// CPU and memory requests and limits of the workspace container (core/v1
    /// ResourceRequirements), checked as a Workspace's are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::workspace::resources_schema")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels the pod's node must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pod tolerates (core/v1 Toleration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,
    /// Node and pod affinity of the pod (core/v1 Affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

/// The home volume a kind gives its workspaces.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "isQuantity(string(self.size)) && quantity(string(self.size)).sign() > 0",
    "message": "home.size must be a quantity greater than zero, such as 10Gi"
}]))]
pub struct KindHome {
    /// Where the volume is mounted, an absolute path such as `/home/dev`.
    pub mount_path: MountPath,
    /// Requested size of each workspace's claim, e.g. `10Gi`.
    pub size: Quantity,
    /// Storage class of the claims; the cluster's default class when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub storage_class_name: Option<String>,
}

/// Probes of the workspace container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindProbes {
    /// When the workspace container is ready for traffic (core/v1 Probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Probe>,
    /// When the kubelet restarts the workspace container (core/v1 Probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Probe>,
}

/// The security context of the kind's pods and workspace containers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindSecurityContext {
    /// The pod's (core/v1 PodSecurityContext).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodSecurityContext>,
    /// The workspace container's (core/v1 SecurityContext).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<SecurityContext>,
}

/// Lifecycle defaults of a kind's workspaces, and the bound on their idle timeout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindLifecycle {
    /// How long a start may make no progress, unless the workspace says otherwise, e.g. `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout: Option<DurationString>,
    /// How long a workspace may go unused before it stops, unless it says otherwise, e.g. `2h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<DurationString>,
    /// The longest idle timeout a workspace of the kind may ask, e.g. `8h`; a longer one, or
    /// none, becomes this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_idle_timeout: Option<DurationString>,
    /// How pods rejected by their kubelet are replaced, unless the workspace says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_recreation: Option<PodRecreationSpec>,
}

/// What the operator observes of a kind's use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceKindStatus {
    /// How many workspaces name the kind.
    #[serde(default)]
    pub workspaces: u32,
    /// How many workspaces use each option, by list and id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<OptionUse>,
    /// With the operator sharded (`--shards N`), each shard's own counts, by shard
    /// (`<i>-of-<N>`); `workspaces` and `options` are their sum, written by shard 0's holder
    /// once every shard has counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256))]
    pub shards: BTreeMap<String, KindUsage>,
}

/// What one shard of the operator counts of a kind's use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindUsage {
    /// How many of the shard's workspaces name the kind.
    #[serde(default)]
    pub workspaces: u32,
    /// How many of the shard's workspaces use each option, by list and id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<OptionUse>,
}

/// Workspaces per option.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OptionUse {
    /// Workspaces per image option id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image: BTreeMap<String, u32>,
    /// Workspaces per pod option id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod: BTreeMap<String, u32>,
}
