//! The `Workspace` status: what Berth observed and decided, written only when it changes.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a workspace is in its lifecycle (rule C8 of the design).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum Phase {
    /// No pod exists yet.
    #[default]
    Pending,
    /// The pod exists and is making progress.
    Starting,
    /// The pod is ready and the agent answered: the workspace is usable.
    Running,
    /// The pod is being deleted, for a pause or a replacement.
    Stopping,
    /// Paused: no pod, storage kept.
    Stopped,
    /// Something is wrong that may still heal; the message says what.
    Error,
    /// Berth gave up until the spec changes or the user restarts the workspace.
    Failed,
    /// The workspace is being deleted.
    Terminating,
    /// The pod's state cannot be known, e.g. its node was lost.
    Unknown,
}

impl Phase {
    /// Every phase, in lifecycle order.
    pub const ALL: [Phase; 9] = [
        Phase::Pending,
        Phase::Starting,
        Phase::Running,
        Phase::Stopping,
        Phase::Stopped,
        Phase::Error,
        Phase::Failed,
        Phase::Terminating,
        Phase::Unknown,
    ];

    /// The phase as it appears in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Starting => "Starting",
            Phase::Running => "Running",
            Phase::Stopping => "Stopping",
            Phase::Stopped => "Stopped",
            Phase::Error => "Error",
            Phase::Failed => "Failed",
            Phase::Terminating => "Terminating",
            Phase::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The most characters of [`WorkspaceStatus::summary`].
pub const SUMMARY_LIMIT: usize = 100;

/// The lead of a message: up to its first sentence or clause end (`. ` or `; `), at most
/// [`SUMMARY_LIMIT`] characters (cut with `…`).
pub fn summary(message: &str) -> String {
    let lead = [". ", "; "]
        .iter()
        .filter_map(|end| message.find(end))
        .min()
        .map_or(message, |at| &message[..at]);
    let lead = lead.trim_end_matches('.').trim();
    if lead.chars().count() <= SUMMARY_LIMIT {
        return lead.to_owned();
    }
    let cut: String = lead.chars().take(SUMMARY_LIMIT - 1).collect();
    format!("{}…", cut.trim_end())
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn a_summary_is_the_lead_of_the_message_within_the_limit() {
        assert_eq!(summary("Workspace is running"), "Workspace is running");
        assert_eq!(
            summary(
                "Claim victim-home exists and is not owned by this workspace (owned by nobody); rename the workspace or delete the claim"
            ),
            "Claim victim-home exists and is not owned by this workspace (owned by nobody)"
        );
        assert_eq!(
            summary("No pod until the admission policy is installed: nothing checked. Install it."),
            "No pod until the admission policy is installed: nothing checked"
        );
        let long = "x".repeat(150);
        let cut = summary(&long);
        assert_eq!(cut.chars().count(), SUMMARY_LIMIT);
        assert!(cut.ends_with('…'));
        // Dots inside a name are no sentence end.
        assert_eq!(
            summary("Pod a.b-ws waits for the scheduler"),
            "Pod a.b-ws waits for the scheduler"
        );
    }
}

/// Observed state of a workspace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// Where the workspace is in its lifecycle: Pending, Starting, Running, Stopping, Stopped,
    /// Error, Failed, Terminating or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// One human sentence saying why the workspace is in its phase. Not for programs to parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The message's lead, what is wrong (or happening) in at most 100 characters: what
    /// `kubectl get ws` shows; the message has the detail and the fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The `metadata.generation` this status was derived from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions: PodScheduled, PodReady, AgentReady, PodRejected, Ready, Stalled and, for a
    /// workspace of a kind, UpdateAvailable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub conditions: Vec<Condition>,
    /// The workspace's current pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The in-pod agent as the operator last verified it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// Pods replaced after kubelet rejection since the last start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_recreations: Option<u32>,
    /// When the current start began: creation, resume, or a spec change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the workspace last became Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Time>,
    /// The latest use of the workspace its agent reported (or the agent's start, when nothing
    /// happened since); asked for when `lifecycle.idleTimeout` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<Time>,
    /// What that use was: `Connection`, `Cpu`, `Heartbeat`, `Shell`, or `Started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_signal: Option<String>,
    /// What the workspace's kind and options gave it when it last started from stopped: its
    /// pods are built from this record until it next starts from stopped (resume), whatever
    /// the kind says since.
    // Behind a pointer, as the other large optional parts of a Workspace are: most workspaces
    // have no kind, and each of 10 000 cached workspaces should not carry two kilobytes of
    // nothing. Shared (`Arc`), since the workspaces of a kind mostly have equal records: the
    // operator's cache keeps one copy of each (`berth_core::trim::Records`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<std::sync::Arc<crate::KindResolution>>,
    /// `true` when the kind now gives the workspace something else than its record: the
    /// condition `UpdateAvailable` lists what, and the next start from stopped applies it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending_restart: bool,
    /// What the agent found or cloned in the home volume for `spec.content` (the condition
    /// `ContentReady` says how it went).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Box<crate::ContentStatus>>,
    /// Whether the admission policy checked the spec as it is, for a workspace that names
    /// other objects or a kind: the operator records it when it first sees a spec (or a new
    /// `berth.dev/check` annotation). A spec written while the policy was not enforcing
    /// gets no pod until it is checked. Written by the operator only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Box<AdmissionRecord>>,
}

/// What the operator recorded of admission for one version of a workspace's spec (starting
/// and stopping, `spec.paused`, name nothing and are not checked, so they keep the record).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRecord {
    /// A hash of the spec this is about, without `paused`.
    pub spec: String,
    /// The `metadata.generation` at which it was recorded.
    pub generation: i64,
    /// The `berth.dev/check` annotation's value this is about (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check: String,
    /// `true` when the admission policy enforced when that spec was written.
    pub checked: bool,
}

/// The pod that currently serves a workspace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// The pod's name.
    pub name: String,
    /// The pod's UID; a replaced pod has the same name and a new UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The pod's IP address, once it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The node the pod is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// When Berth first saw one of the pod's containers running; the `Started` event is
    /// told then, once per pod, whatever its containers do afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the workspace first became Ready in this pod; the `Ready` event is told then, once
    /// per pod (`status.readyAt` is when it became Ready this time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Time>,
}

/// The in-pod agent, as the operator verified it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// `host:port` the operator reaches the agent at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The identity the agent authenticated the operator as, e.g.
    /// `system:serviceaccount:berth-system:berth-controller`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The UID of the pod whose agent answered WhoAmI; checked once per pod.
    #[serde(
        default,
        rename = "verifiedPodUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub verified_pod_uid: Option<String>,
}
