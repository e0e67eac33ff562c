//! Condition types, statuses and reasons of a workspace, typed (never compared as text), and
//! the one helper that sets a condition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types a workspace carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    /// The current pod is bound to a node.
    PodScheduled,
    /// The current pod's containers are ready.
    PodReady,
    /// The agent answered WhoAmI for the current pod with the operator's identity.
    AgentReady,
    /// The last pod was rejected by its kubelet and is being replaced.
    PodRejected,
    /// The workspace is usable: PodReady and AgentReady.
    Ready,
    /// Berth gave up until the spec changes or the user restarts the workspace.
    Stalled,
    /// The workspace's kind now gives it something else than it started with; the next start
    /// from stopped applies it (only on a workspace of a kind).
    UpdateAvailable,
    /// The home volume holds `spec.content` (only on a workspace with content): cloning, the
    /// commit, or why not, in git's words.
    ContentReady,
}

impl ConditionType {
    /// As the condition's `type` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::PodScheduled => "PodScheduled",
            ConditionType::PodReady => "PodReady",
            ConditionType::AgentReady => "AgentReady",
            ConditionType::PodRejected => "PodRejected",
            ConditionType::Ready => "Ready",
            ConditionType::Stalled => "Stalled",
            ConditionType::UpdateAvailable => "UpdateAvailable",
            ConditionType::ContentReady => "ContentReady",
        }
    }

    /// What the condition is about, which says when it goes (a match without a default, so a
    /// new type cannot be added without deciding).
    pub fn scope(self) -> Scope {
        match self {
            ConditionType::PodScheduled
            | ConditionType::PodReady
            | ConditionType::AgentReady
            | ConditionType::ContentReady => Scope::Pod,
            ConditionType::PodRejected | ConditionType::Stalled => Scope::Start,
            ConditionType::Ready | ConditionType::UpdateAvailable => Scope::Workspace,
        }
    }

    /// The type a condition's `type` names; None for one Berth does not write.
    pub fn parse(text: &str) -> Option<Self> {
        types::ALL.into_iter().find(|t| t.as_str() == text)
    }
}

/// What a condition is about, and so when it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The current pod: gone with the pod.
    Pod,
    /// One start of the workspace (its rejections, a start Berth gave up on): forgotten when a
    /// new start begins (a new generation) or the workspace is paused.
    Start,
    /// The workspace itself: always there.
    Workspace,
}

/// The condition types by the names the code has always used for them.
pub mod types {
    use super::ConditionType;

    pub const POD_SCHEDULED: ConditionType = ConditionType::PodScheduled;
    pub const POD_READY: ConditionType = ConditionType::PodReady;
    pub const AGENT_READY: ConditionType = ConditionType::AgentReady;
    pub const POD_REJECTED: ConditionType = ConditionType::PodRejected;
    pub const READY: ConditionType = ConditionType::Ready;
    pub const STALLED: ConditionType = ConditionType::Stalled;
    pub const UPDATE_AVAILABLE: ConditionType = ConditionType::UpdateAvailable;
    pub const CONTENT_READY: ConditionType = ConditionType::ContentReady;

    /// Every condition type, in the order Berth writes them.
    pub const ALL: [ConditionType; 8] = [
        POD_SCHEDULED,
        POD_READY,
        AGENT_READY,
        CONTENT_READY,
        POD_REJECTED,
        READY,
        STALLED,
        UPDATE_AVAILABLE,
    ];
}

/// The condition types of a pod that Berth reads (the kubelet's and the scheduler's words).
pub mod pod_conditions {
    /// The scheduler bound the pod (or says why it cannot).
    pub const POD_SCHEDULED: &str = "PodScheduled";
    /// The pod's containers are ready and its readiness gates pass.
    pub const READY: &str = "Ready";
    /// The pod's containers are ready.
    pub const CONTAINERS_READY: &str = "ContainersReady";
}

/// Why a condition is as it is. Berth's own reasons are named here, once; CamelCase and
/// stable, since programs and alerts match on them. Words Berth passes on as they were said
/// (a kubelet's container reason, the scheduler's, an agent's gRPC code, the API server's
/// refusal) are [`Reason::Other`] unless they are one of these. Serialized as the text it
/// always was: `Reason::parse(r.as_str()) == r`.
macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident,)*) => {
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $variant,)*
            /// Someone else's words, passed on as they were said.
            Other(String),
        }

        impl Reason {
            /// The name of one of Berth's own reasons; None for [`Reason::Other`].
            pub fn name(&self) -> Option<&'static str> {
                match self {
                    $(Reason::$variant => Some(stringify!($variant)),)*
                    Reason::Other(_) => None,
                }
            }

            /// The reason a condition's text names.
            pub fn parse(text: &str) -> Reason {
                match text {
                    $(stringify!($variant) => Reason::$variant,)*
                    other => Reason::Other(other.to_owned()),
                }
            }
        }
    };
}

reasons! {
    // PodScheduled
    /// The scheduler found no node that fits.
    Unschedulable,
    /// The pod is waiting for the scheduler.
    WaitingForScheduler,
    /// The pod is bound to a node.
    Scheduled,
    // PodReady (the kubelet's own container reasons)
    /// Containers are being created.
    ContainerCreating,
    /// A volume could not be mounted.
    FailedMount,
    /// The image cannot be pulled; the kubelet is backing off.
    ImagePullBackOff,
    /// Pulling the image failed.
    ErrImagePull,
    /// A container keeps crashing.
    CrashLoopBackOff,
    /// A container's configuration (e.g. a referenced secret key) is invalid.
    CreateContainerConfigError,
    /// The pod's init containers are running.
    PodInitializing,
    /// The pod failed, and its containers did not say why.
    PodFailed,
    /// The pod's containers all exited with success (the kubelet's word).
    PodCompleted,
    /// The pod's containers are ready.
    ContainersReady,
    /// The pod's containers run but are not ready yet.
    ContainersNotReady,
    // AgentReady
    /// The agent accepted the operator's identity.
    AgentVerified,
    /// The agent could not authenticate the operator.
    Unauthenticated,
    /// The agent authenticated the operator but refused it.
    PermissionDenied,
    /// The agent authenticated the operator as someone else than its service account (an
    /// agent with authentication off says `system:anonymous`).
    IdentityMismatch,
    /// The agent answered, but the API it checks callers with (TokenReview,
    /// SubjectAccessReview) did not, within the call's deadline.
    Unavailable,
    /// The agent is checking too many other callers' tokens to check this one in time.
    ResourceExhausted,
    /// The agent could not be reached.
    AgentUnreachable,
    /// The agent's state is not known yet (e.g. the operator cannot get its token).
    Unknown,
    /// The agent is checked once the pod is ready.
    WaitingForPod,
    // PodRejected and Stalled
    /// A new pod replaced the one that was rejected or lost (PodRejected turns False).
    PodRecreated,
    /// An object of a name Berth derives for the workspace (its pod, home claim or service)
    /// exists and is not the workspace's own.
    NameTaken,
    /// A pod's node was lost; the pod is replaced.
    NodeLost,
    /// Too many pods were rejected; Berth gave up.
    RecreationLimitReached,
    /// A start made no progress for `startTimeout`.
    StartTimeout,
    /// The spec can never work; Berth waits for it to change.
    InvalidSpec,
    /// The spec asks for what the operator's policy does not allow a workspace (tolerations,
    /// node selection, reserved labels and annotations); Berth waits for it to change.
    Forbidden,
    // Ready
    /// The workspace is usable.
    WorkspaceReady,
    /// The workspace is paused.
    Paused,
    /// Berth stopped the workspace: nobody used it for `lifecycle.idleTimeout`.
    Idle,
    /// The admission policy that checks a spec's author may use what it names is not
    /// installed (or not enforcing); a workspace that names other objects gets no pod.
    AdmissionNotInstalled,
    /// The spec was written while the admission policy was not enforcing, so nothing checked
    /// its author may use what it names; it gets no pod until it is checked.
    AdmissionUnchecked,
    // UpdateAvailable
    /// The workspace's kind gives what its record says (UpdateAvailable False).
    UpToDate,
    /// The workspace's kind changed since the workspace started (UpdateAvailable True).
    KindChanged,
    /// The workspace's kind does not exist: a running workspace keeps running as recorded, a
    /// start waits for the kind (also Stalled's reason then).
    KindNotFound,
    /// The option a workspace picks is not one of its kind's (also Stalled's reason then).
    OptionNotFound,
    /// The workspace's pod is on its way out (to be replaced, or the workspace is deleted):
    /// it is not usable, whatever the pod still says.
    PodStopping,
    // ContentReady
    /// The agent is cloning the workspace's repository (the message has git's progress).
    Cloning,
    /// The agent cloned the repository into the home volume (the message names the commit).
    Cloned,
    /// The checkout was already there (cloned by an earlier pod, or put there by the user):
    /// it is left as it is.
    ContentFound,
    /// The repository refused the credentials (or asked for some and none were given).
    AuthenticationFailed,
    /// The remote has no such repository.
    RepositoryNotFound,
    /// The repository has no such branch, tag or commit.
    RefNotFound,
    /// The remote could not be reached (retried with backoff).
    Unreachable,
    /// The home volume is full.
    NoSpace,
    /// Cloning failed for another reason (git's words say which).
    Failed,
}

impl Reason {
    /// As the condition's `reason` says it.
    pub fn as_str(&self) -> &str {
        match self {
            Reason::Other(text) => text,
            known => known.name().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for Reason {
    fn from(text: &str) -> Self {
        Reason::parse(text)
    }
}

impl From<String> for Reason {
    fn from(text: String) -> Self {
        Reason::parse(&text)
    }
}

/// An event's reason from a condition's: Berth's own without an allocation.
impl From<Reason> for std::borrow::Cow<'static, str> {
    fn from(reason: Reason) -> Self {
        match reason {
            Reason::Other(text) => text.into(),
            known => known.name().unwrap_or_default().into(),
        }
    }
}

/// A condition whose reason is read typed, never compared as text.
pub trait HasReason {
    /// The reason as written.
    fn reason_text(&self) -> &str;

    /// The reason, typed.
    fn reason(&self) -> Reason {
        Reason::parse(self.reason_text())
    }

    /// Whether the reason is `reason`.
    fn has_reason(&self, reason: &Reason) -> bool {
        self.reason_text() == reason.as_str()
    }
}

impl HasReason for Condition {
    fn reason_text(&self) -> &str {
        &self.reason
    }
}

/// The reasons of the events Berth publishes about a workspace (rule C17): CamelCase and
/// stable, as alerts match on them. Where an event reports what a condition says, it has the
/// condition's reason.
pub mod event_reasons {
    /// The workspace's pod was created.
    pub const CREATED: &str = "Created";
    /// A container of the pod runs.
    pub const STARTED: &str = "Started";
    /// The workspace became usable.
    pub const READY: &str = "Ready";
    /// The workspace was paused: its pod goes, its storage stays.
    pub const PAUSED: &str = "Paused";
    /// A paused workspace resumed.
    pub const RESUMED: &str = "Resumed";
    /// Nobody used the workspace for its idle timeout: Berth paused it.
    pub const CULLED: &str = "Culled";
    /// A rejected or lost pod is created again.
    pub const RECREATING: &str = "Recreating";
    /// The kubelet rejected the pod.
    pub const POD_REJECTED: &str = "PodRejected";
    /// The agent did not authenticate the operator.
    pub const AGENT_AUTH_FAILED: &str = "AgentAuthFailed";
    /// The workspace's pod did not stop within the deletion grace period: it was deleted at
    /// once, and the workspace went.
    pub const DELETION_GRACE_EXPIRED: &str = "DeletionGraceExpired";
    /// The agent could not say when the workspace was last used; it is not culled meanwhile.
    pub const ACTIVITY_UNKNOWN: &str = "ActivityUnknown";
    /// The API server refused to create an object the workspace needs (as Kubernetes' own
    /// controllers name it).
    pub const FAILED_CREATE: &str = "FailedCreate";
    /// The API server refused to update an object the workspace owns.
    pub const FAILED_UPDATE: &str = "FailedUpdate";
    /// The operator cannot label the workspace with its shard's bucket, so no operator
    /// shard reconciles it yet (`berth_core::shard`).
    pub const SHARD_LABEL_FAILED: &str = "ShardLabelFailed";
    /// The agent cannot put the workspace's content in place (once per failure series).
    pub const CONTENT_FAILED: &str = "ContentFailed";
    /// The workspace's content is in place (once per clone).
    pub const CONTENT_READY: &str = "ContentReady";
    /// The API server refused to delete an object the workspace owns.
    pub const FAILED_DELETE: &str = "FailedDelete";
    /// A reconcile of the workspace failed (its status may be what cannot be written); it is
    /// retried with backoff.
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
}

/// The status of a condition, as Kubernetes spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    /// `"True"`, `"False"` or `"Unknown"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// The status a condition's text names; None for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "True" => Some(ConditionStatus::True),
            "False" => Some(ConditionStatus::False),
            "Unknown" => Some(ConditionStatus::Unknown),
            _ => None,
        }
    }
}

/// A condition whose status is read typed, never compared as text: a workspace's, a pod's and
/// a claim's.
pub trait HasStatus {
    /// The status as written.
    fn status_text(&self) -> &str;

    /// The status, if it is one Kubernetes knows.
    fn status(&self) -> Option<ConditionStatus> {
        ConditionStatus::parse(self.status_text())
    }

    /// Whether the status is `status`.
    fn is(&self, status: ConditionStatus) -> bool {
        self.status() == Some(status)
    }
}

impl HasStatus for Condition {
    fn status_text(&self) -> &str {
        &self.status
    }
}

impl HasStatus for k8s_openapi::api::core::v1::PodCondition {
    fn status_text(&self) -> &str {
        &self.status
    }
}

impl HasStatus for k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
    fn status_text(&self) -> &str {
        &self.status
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Sets condition `type_` in `conditions`, adding it if absent. `lastTransitionTime` becomes
/// `now` only when the condition is new or its status flips; reason, message and
/// `observedGeneration` are updated in place. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: ConditionType,
    status: ConditionStatus,
    reason: &Reason,
    message: &str,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    let desired = |last_transition_time: Time| Condition {
        type_: type_.as_str().to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.as_str().to_owned(),
        message: message.to_owned(),
        observed_generation,
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_.as_str()) {
        Some(existing) => {
            let transition_time = if existing.is(status) {
                existing.last_transition_time.clone()
            } else {
                now.clone()
            };
            let updated = desired(transition_time);
            if *existing == updated {
                false
            } else {
                *existing = updated;
                true
            }
        }
        None => {
            conditions.push(desired(now.clone()));
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find_condition(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn workspace_condition(status: &str, reason: &str) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at(0),
        }
    }

    #[test]
    fn every_condition_type_reads_back_from_its_name_and_no_other() {
        for type_ in types::ALL {
            assert_eq!(ConditionType::parse(type_.as_str()), Some(type_));
        }
        assert_eq!(ConditionType::parse("ContainersReady"), None);
        assert_eq!(ConditionType::parse("ready"), None);
    }

    #[test]
    fn a_reason_is_displayed_as_written_and_compared_by_it() {
        assert_eq!(Reason::NodeLost.to_string(), "NodeLost");
        assert_eq!(Reason::Other("OutOfcpu".into()).to_string(), "OutOfcpu");
        let condition = workspace_condition("False", "NodeLost");
        assert!(condition.has_reason(&Reason::NodeLost));
        assert!(!condition.has_reason(&Reason::Paused));
        assert!(!condition.has_reason(&Reason::Other("nodelost".into())));
    }

    /// A workspace's, a pod's and a claim's condition are read by their status, which is one
    /// of the three Kubernetes knows or none.
    #[test]
    fn every_kind_of_condition_is_read_by_its_status() {
        for status in [
            ConditionStatus::True,
            ConditionStatus::False,
            ConditionStatus::Unknown,
        ] {
            let text = status.as_str().to_owned();
            assert_eq!(ConditionStatus::parse(&text), Some(status));
            let workspace = workspace_condition(&text, "Any");
            let pod = k8s_openapi::api::core::v1::PodCondition {
                status: text.clone(),
                ..Default::default()
            };
            let claim = k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
                status: text,
                ..Default::default()
            };
            assert!(workspace.is(status) && pod.is(status) && claim.is(status));
            assert_eq!((pod.status(), claim.status()), (Some(status), Some(status)));
        }
        assert_eq!(ConditionStatus::parse("true"), None);
        assert_eq!(ConditionStatus::from(true), ConditionStatus::True);
        assert_eq!(ConditionStatus::from(false), ConditionStatus::False);
    }

    #[test]
    fn a_reason_reads_back_as_it_was_written() {
        for text in ["NodeLost", "StartTimeout", "OutOfcpu", "Internal", ""] {
            let reason = Reason::parse(text);
            assert_eq!(reason.as_str(), text);
            assert_eq!(Reason::parse(reason.as_str()), reason);
        }
        assert_eq!(Reason::parse("NodeLost"), Reason::NodeLost);
        assert_eq!(
            Reason::parse("OutOfcpu"),
            Reason::Other("OutOfcpu".into()),
            "a kubelet's own word is passed on"
        );
        let event: std::borrow::Cow<'static, str> = Reason::StartTimeout.into();
        assert!(matches!(event, std::borrow::Cow::Borrowed("StartTimeout")));
    }

    #[test]
    fn a_new_condition_gets_now_as_transition_time() {
        let mut conditions = vec![];
        let changed = set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::False,
            &Reason::ContainerCreating,
            "Pod is starting",
            Some(1),
            &at(100),
        );
        assert!(changed);
        assert_eq!(conditions.len(), 1);
        assert!(conditions[0].is(ConditionStatus::False));
        assert_eq!(conditions[0].last_transition_time, at(100));
        assert_eq!(conditions[0].observed_generation, Some(1));
    }

    #[test]
    fn same_status_keeps_transition_time_but_updates_reason_and_message() {
        let mut conditions = vec![];
        set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::False,
            &Reason::ContainerCreating,
            "starting",
            Some(1),
            &at(100),
        );
        let changed = set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::False,
            &Reason::FailedMount,
            "secret missing",
            Some(2),
            &at(200),
        );
        assert!(changed);
        assert_eq!(conditions[0].last_transition_time, at(100));
        assert_eq!(conditions[0].reason(), Reason::FailedMount);
        assert_eq!(conditions[0].message, "secret missing");
        assert_eq!(conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn flipped_status_moves_transition_time() {
        let mut conditions = vec![];
        set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::False,
            &Reason::ContainerCreating,
            "starting",
            Some(1),
            &at(100),
        );
        set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::True,
            &Reason::WorkspaceReady,
            "ready",
            Some(1),
            &at(300),
        );
        assert!(conditions[0].is(ConditionStatus::True));
        assert_eq!(conditions[0].last_transition_time, at(300));
    }

    #[test]
    fn identical_update_changes_nothing() {
        let mut conditions = vec![];
        set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::True,
            &Reason::WorkspaceReady,
            "ready",
            Some(1),
            &at(100),
        );
        let before = conditions.clone();
        let changed = set_condition(
            &mut conditions,
            types::READY,
            ConditionStatus::True,
            &Reason::WorkspaceReady,
            "ready",
            Some(1),
            &at(999),
        );
        assert!(!changed);
        assert_eq!(conditions, before);
    }

    #[test]
    fn other_conditions_are_left_alone() {
        let mut conditions = vec![];
        set_condition(
            &mut conditions,
            types::POD_READY,
            ConditionStatus::True,
            &Reason::ContainersReady,
            "",
            Some(1),
            &at(100),
        );
        set_condition(
            &mut conditions,
            types::AGENT_READY,
            ConditionStatus::False,
            &Reason::Unauthenticated,
            "no",
            Some(1),
            &at(200),
        );
        assert_eq!(conditions.len(), 2);
        let pod_ready = find_condition(&conditions, types::POD_READY).unwrap();
        assert_eq!(pod_ready.last_transition_time, at(100));
        assert_eq!(
            find_condition(&conditions, types::AGENT_READY)
                .unwrap()
                .reason,
            Reason::Unauthenticated.as_str()
        );
        assert!(find_condition(&conditions, types::STALLED).is_none());
    }
}
