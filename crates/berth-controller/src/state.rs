//! The pure core: from what was observed (the workspace, its pod, the pod's Warning events,
//! its claim and service) and the time, derive the whole status, what to do, which events to
//! publish and when to look again. No I/O here; every rule of the phase table lives here.

use std::time::Duration;

use berth_api::{
    AgentStatus, ConditionStatus, Phase, PodRecreationPolicy, PodRef, Workspace, WorkspaceStatus,
    condition::{
        ConditionType, HasStatus, event_reasons, find_condition, pod_conditions, reasons,
        set_condition, types,
    },
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{ContainerStatus, Event, PersistentVolumeClaim, Pod, Service},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time},
};
use kube::ResourceExt;

use crate::{
    config::{Policy, WarningClass},
    idle::{self, ActivityCheck, ActivityOutcome},
    pod::{self, is_owned_by},
    refusal::Refusal,
};

/// Container waiting reasons that mean something is wrong (the kubelet's own words).
pub const ERROR_WAITING_REASONS: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "CrashLoopBackOff",
    "RunContainerError",
];

/// What the operator saw, all from its caches.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    pub workspace: &'a Workspace,
    /// The pod with the workspace's pod name, whoever owns it.
    pub pod: Option<&'a Pod>,
    /// Warning events whose `involvedObject.uid` is the current pod's (rule C2).
    pub warnings: &'a [&'a Event],
    pub claim: Option<&'a PersistentVolumeClaim>,
    pub service: Option<&'a Service>,
    /// The last WhoAmI to the current pod's agent, when one was made (rule C14).
    pub agent: Option<&'a AgentCheck>,
    /// The API server's refusal of the last attempt at an action, until that action succeeds.
    pub refusal: Option<&'a Refusal>,
    /// The last `GetActivity` to the current pod's agent, when the workspace has an idle
    /// timeout.
    pub activity: Option<&'a ActivityCheck>,
}

/// What the operator's WhoAmI to a pod's agent found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCheck {
    pub pod_uid: String,
    /// `ip:port` the agent was called at.
    pub address: String,
    pub outcome: AgentOutcome,
    /// The call was made for this reconcile (a failure is published as an event once per call).
    pub fresh: bool,
    /// After a failure: how long until the next call (rule C15's backoff).
    pub retry_in: Duration,
}

/// The answer of a WhoAmI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentOutcome {
    /// The agent authenticated the operator as `identity`.
    Verified { identity: String },
    /// The call failed: `reason` is the gRPC code's name (`Unauthenticated`,
    /// `PermissionDenied`), `AgentUnreachable`, or `Unknown`; `message` is the agent's.
    Failed { reason: String, message: String },
}

/// The address of the agent to check, when the workspace's pod is ready and its agent has not
/// been verified for this pod UID yet (rule C14: once per pod).
pub fn agent_to_check(workspace: &Workspace, pod: Option<&Pod>, port: u16) -> Option<String> {
    let pod = pod.filter(|p| is_owned_by(&p.metadata, workspace))?;
    let verified = workspace
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.verified_pod_uid.as_deref());
    let current = pod::built_from(pod, &workspace.spec);
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    (workspace.metadata.deletion_timestamp.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && !workspace.spec.paused
        && current
        && pod_is_ready(pod)
        && verified != pod.metadata.uid.as_deref())
    .then(|| match ip.parse::<std::net::IpAddr>() {
        // `[fd00::1]:50051` for IPv6 pods.
        Ok(ip) => std::net::SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{ip}:{port}"),
    })
}

/// What a growing claim says: its size to be, and its own words (the condition that holds).
fn growing(claim: &PersistentVolumeClaim, size: Option<&Quantity>) -> String {
    let why = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.is(ConditionStatus::True)))
        .map(|c| match c.message.as_deref().filter(|m| !m.is_empty()) {
            Some(message) => format!("{}: {message}", c.type_),
            None => c.type_.clone(),
        })
        .unwrap_or_else(|| "waiting for the storage provider".to_owned());
    format!(
        "Growing claim {} to {} ({why})",
        claim.name_any(),
        size.map(|q| q.0.as_str()).unwrap_or_default()
    )
}

/// Whether a container of the pod (not an init container) is running.
fn containers_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// Running, with its Ready condition true.
fn pod_is_ready(pod: &Pod) -> bool {
    pod_condition(pod, pod_conditions::READY) == Some(ConditionStatus::True)
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Something to do through the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    CreateClaim,
    /// Grow the home claim's storage request to the spec's `home.size`.
    ResizeClaim,
    CreateService,
    UpdateService,
    DeleteService,
    CreatePod,
    /// Delete the pod with this UID (a precondition, so a newer pod is never hit).
    DeletePod {
        uid: String,
    },
    /// Delete the pod at once (grace 0): its node is gone and will never stop it.
    ForceDeletePod {
        uid: String,
    },
    /// Stop an idle workspace: set its `spec.paused`, if its spec is still the one decided on.
    Cull,
}

impl Action {
    /// What the action does, as a person would say it: `create pod w-ws`.
    pub fn describe(&self, workspace: &str) -> String {
        match self {
            Action::CreateClaim => format!("create claim {}", pod::claim_name(workspace)),
            Action::ResizeClaim => format!("grow claim {}", pod::claim_name(workspace)),
            Action::CreateService => format!("create service {}", pod::service_name(workspace)),
            Action::UpdateService => format!("update service {}", pod::service_name(workspace)),
            Action::DeleteService => format!("delete service {}", pod::service_name(workspace)),
            Action::CreatePod => format!("create pod {}", pod::pod_name(workspace)),
            Action::DeletePod { .. } | Action::ForceDeletePod { .. } => {
                format!("delete pod {}", pod::pod_name(workspace))
            }
            Action::Cull => format!("pause idle workspace {workspace}"),
        }
    }

    /// The reason of the Warning event published when the API server refuses the action, as
    /// Kubernetes' own controllers name it.
    pub fn refused_reason(&self) -> &'static str {
        match self {
            Action::CreateClaim | Action::CreateService | Action::CreatePod => "FailedCreate",
            Action::UpdateService | Action::ResizeClaim | Action::Cull => "FailedUpdate",
            Action::DeleteService | Action::DeletePod { .. } | Action::ForceDeletePod { .. } => {
                "FailedDelete"
            }
        }
    }
}

/// A pod replaced after a rejection or a lost node, for the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recreation {
    /// The kubelet's reason, or `NodeLost`.
    pub reason: String,
    /// 1 for the first replacement of this start.
    pub attempt: u32,
}

/// A Kubernetes Event to publish about the workspace (rule C17).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    pub reason: std::borrow::Cow<'static, str>,
    pub note: String,
}

impl Notice {
    fn normal(reason: &'static str, note: String) -> Self {
        Notice {
            warning: false,
            reason: reason.into(),
            note,
        }
    }

    fn warning(reason: impl Into<std::borrow::Cow<'static, str>>, note: String) -> Self {
        Notice {
            warning: true,
            reason: reason.into(),
            note,
        }
    }
}

/// What [`derive`] decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: WorkspaceStatus,
    pub actions: Vec<Action>,
    pub notices: Vec<Notice>,
    pub requeue: Duration,
    /// Set when this decision creates a replacement pod.
    pub recreation: Option<Recreation>,
}

/// The most relevant thing wrong (or happening) with a pod that is not ready (rule C6).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Signal {
    reason: String,
    message: String,
    error: bool,
}

fn time(now: Timestamp) -> Time {
    Time(now)
}

/// The count of an event: `series.count`, else `count`, else 1 (rule C2).
pub fn event_count(event: &Event) -> u32 {
    event
        .series
        .as_ref()
        .and_then(|s| s.count)
        .or(event.count)
        .unwrap_or(1)
        .max(1) as u32
}

/// When an event was last seen: `series.lastObservedTime`, `lastTimestamp`, `eventTime`, then
/// `creationTimestamp` (rule C2).
pub fn event_time(event: &Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn waiting(statuses: Option<&Vec<ContainerStatus>>) -> Option<(String, String)> {
    statuses?.iter().find_map(|s| {
        let waiting = s.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.clone()?;
        Some((reason, waiting.message.clone().unwrap_or_default()))
    })
}

/// The first signal by priority: unschedulable, then a container's waiting reason, then the
/// newest classified Warning event.
fn signal(pod: &Pod, warnings: &[&Event], policy: &Policy) -> Option<Signal> {
    let status = pod.status.as_ref();
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == pod_conditions::POD_SCHEDULED));
    if let Some(condition) = scheduled
        .filter(|c| c.is(ConditionStatus::False) && c.reason.as_deref() == Some("Unschedulable"))
    {
        return Some(Signal {
            reason: reasons::UNSCHEDULABLE.to_owned(),
            message: condition.message.clone().unwrap_or_default(),
            error: policy.warnings.classify("FailedScheduling", 1) == WarningClass::Error,
        });
    }
    let waiting = waiting(status.and_then(|s| s.init_container_statuses.as_ref()))
        .filter(|(r, _)| ERROR_WAITING_REASONS.contains(&r.as_str()))
        .or_else(|| {
            waiting(status.and_then(|s| s.container_statuses.as_ref()))
                .filter(|(r, _)| ERROR_WAITING_REASONS.contains(&r.as_str()))
        });
    if let Some((reason, message)) = waiting {
        let message = if message.is_empty() {
            reason.clone()
        } else {
            format!("{reason}: {message}")
        };
        return Some(Signal {
            reason,
            message,
            error: true,
        });
    }
    let pod_uid = pod.metadata.uid.as_deref();
    let newest = warnings
        .iter()
        // Rule C2: only events about this very pod count; the name is reused across pods.
        .filter(|e| e.involved_object.uid.as_deref() == pod_uid && pod_uid.is_some())
        .filter_map(|e| {
            let reason = e.reason.clone()?;
            let class = policy.warnings.classify(&reason, event_count(e));
            (class != WarningClass::Ignore).then(|| {
                (
                    event_time(e),
                    reason,
                    e.message.clone().unwrap_or_default(),
                    class,
                )
            })
        })
        .max_by(|a, b| a.0.cmp(&b.0));
    newest.map(|(_, reason, message, class)| Signal {
        message: format!("{reason}: {message}"),
        reason,
        error: class == WarningClass::Error,
    })
}

/// The status of the pod's condition `type_` (one of [`pod_conditions`]).
fn pod_condition(pod: &Pod, type_: &str) -> Option<ConditionStatus> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .and_then(HasStatus::status)
}

/// The requeue of a workspace that is not running: it grows with time since the start
/// (1 s, 2 s, 4 s ...) up to the cap (rule C6).
pub fn requeue_interval(since_start: Duration, cap: Duration) -> Duration {
    let seconds = since_start.as_secs().max(1);
    let power = 1u64 << (63 - seconds.leading_zeros()).min(30);
    Duration::from_secs(power).clamp(Duration::from_secs(1), cap.max(Duration::from_secs(1)))
}

fn elapsed(since: Option<&Time>, now: Timestamp) -> Duration {
    since
        .map(|t| now.duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

/// Removes a condition entirely (Stalled is present only while true).
fn clear_condition(status: &mut WorkspaceStatus, type_: ConditionType) {
    status.conditions.retain(|c| c.type_ != type_.as_str());
}

/// The Stalled reasons that are verdicts on the spec (derived again on every reconcile), not
/// a start that gave up.
const SPEC_VERDICTS: [&str; 2] = [reasons::INVALID_SPEC, reasons::FORBIDDEN];

struct Builder<'a> {
    status: WorkspaceStatus,
    generation: Option<i64>,
    now: Time,
    actions: Vec<Action>,
    notices: Vec<Notice>,
    old: &'a WorkspaceStatus,
    recreation: Option<Recreation>,
    /// A refusal of an action derived from this very spec, with the name of the workspace.
    refusal: Option<(&'a Refusal, String)>,
    /// The cap of every requeue and retry delay.
    max_requeue: Duration,
    /// While the home claim grows: what the workspace says when it is not running yet.
    growing: Option<String>,
}

impl Builder<'_> {
    /// A verdict on the spec itself: `Stalled=True` and `Ready=False` with `reason`, in
    /// `phase`, until the spec changes; it is re-derived each time, so it is never the
    /// "gave up" stall below (the reason is one of [`SPEC_VERDICTS`]).
    fn spec_verdict(&mut self, phase: Phase, reason: &str, message: String) {
        debug_assert!(SPEC_VERDICTS.contains(&reason));
        self.condition(types::STALLED, ConditionStatus::True, reason, &message);
        self.condition(types::READY, ConditionStatus::False, reason, &message);
        self.phase(phase, message);
    }

    /// A spec that can never work: Failed, Stalled=InvalidSpec, no retry storm (rule C19).
    fn invalid_spec(mut self, message: String, requeue: Duration) -> Decision {
        self.spec_verdict(Phase::Failed, reasons::INVALID_SPEC, message);
        self.finish(requeue)
    }

    /// A spec the operator's policy forbids: Error, Stalled=Forbidden, Warning event; no pod
    /// is created for it. A pod from an earlier spec is left as it is (like an invalid spec):
    /// a verdict on the spec never destroys running work.
    fn forbidden(mut self, message: String, requeue: Duration) -> Decision {
        self.status.ready_at = None;
        self.spec_verdict(Phase::Error, reasons::FORBIDDEN, message);
        self.finish(requeue)
    }

    /// The conditions of a workspace whose pod is being created.
    fn pod_being_created(&mut self, pod_name: &str) {
        self.status.agent = None;
        self.agent_waits_for(pod_name);
        let message = format!("Pod {pod_name} is being created");
        self.condition(
            types::POD_SCHEDULED,
            ConditionStatus::False,
            reasons::WAITING_FOR_SCHEDULER,
            &message,
        );
        self.condition(
            types::POD_READY,
            ConditionStatus::False,
            reasons::CONTAINER_CREATING,
            &message,
        );
        self.condition(
            types::READY,
            ConditionStatus::False,
            reasons::CONTAINER_CREATING,
            &message,
        );
    }

    /// AgentReady while there is no ready pod to check the agent of.
    fn agent_waits_for(&mut self, pod_name: &str) {
        self.condition(
            types::AGENT_READY,
            ConditionStatus::Unknown,
            reasons::WAITING_FOR_POD,
            &format!("The agent is checked once pod {pod_name} is ready"),
        );
    }

    fn condition(
        &mut self,
        type_: ConditionType,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) {
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            &self.now,
        );
    }

    fn phase(&mut self, phase: Phase, message: impl Into<String>) {
        self.status.phase = Some(phase);
        self.status.message = Some(message.into());
    }
}

/// Ready reasons that only say a start is moving on, as opposed to what is wrong with it.
const PROGRESS: [&str; 6] = [
    reasons::WAITING_FOR_SCHEDULER,
    reasons::CONTAINER_CREATING,
    "PodInitializing",
    reasons::CONTAINERS_NOT_READY,
    reasons::UNKNOWN,
    reasons::WAITING_FOR_POD,
];

/// Rule C16, coalesced: progress within a start is written at most once per `interval`, so a
/// start costs a status write per phase a user sees rather than one per step of the kubelet.
/// Returns how long to hold `decision`'s status back, given how long ago this operator last
/// wrote the workspace's status (`None`: not lately); `None` means write it now.
///
/// Held back only when the workspace stays in its phase, Pending or Starting (a new phase is
/// always written), at the same generation and recreation count, the Ready condition names progress (never a problem: those are
/// written at once), and the decision takes no action (a write guards every action) and
/// publishes no Warning. Its Normal events (Created, Started) wait with the status: they are
/// derived from the status as last written, so the next decision derives them again.
pub fn hold_back(
    old: &WorkspaceStatus,
    decision: &Decision,
    since_last_write: Option<Duration>,
    interval: Duration,
) -> Option<Duration> {
    let new = &decision.status;
    let progress = find_condition(&new.conditions, types::READY)
        .is_some_and(|c| c.is(ConditionStatus::False) && PROGRESS.contains(&c.reason.as_str()));
    let same_start = old.phase == new.phase
        && matches!(new.phase, Some(Phase::Pending | Phase::Starting))
        && old.observed_generation == new.observed_generation
        && old.pod_recreations == new.pod_recreations;
    let quiet = decision.actions.is_empty() && decision.notices.iter().all(|n| !n.warning);
    let wait = interval.checked_sub(since_last_write?)?;
    (progress && same_start && quiet && !wait.is_zero()).then_some(wait)
}

/// A workspace being deleted (rule C18): the pod stops first; the finalizer goes once it is
/// gone.
fn deleting(mut b: Builder<'_>, owned_pod: Option<&Pod>, pod_name: &str) -> Decision {
    if let Some(p) = owned_pod.filter(|p| p.metadata.deletion_timestamp.is_none()) {
        b.actions.push(Action::DeletePod {
            uid: p.uid().unwrap_or_default(),
        });
    }
    let message = match owned_pod {
        Some(_) => format!("Stopping pod {pod_name} before the workspace is deleted"),
        None => "Workspace is being deleted".to_owned(),
    };
    b.phase(Phase::Terminating, message);
    b.finish(Duration::from_secs(1))
}

/// A paused workspace (by its user, or culled for idleness): its pod goes, its storage stays;
/// Stopping until the pod is gone, then Stopped.
fn paused(mut b: Builder<'_>, owned_pod: Option<&Pod>, pod_name: &str, slow: Duration) -> Decision {
    clear_condition(&mut b.status, types::STALLED);
    clear_condition(&mut b.status, types::POD_REJECTED);
    b.status.started_at = None;
    b.status.pod_recreations = None;
    // Paused by Berth because nobody used it: it says so until it is resumed.
    let culled = find_condition(&b.old.conditions, types::READY)
        .filter(|c| c.reason == reasons::IDLE)
        .map(|c| c.message.clone());
    if !matches!(b.old.phase, Some(Phase::Stopping | Phase::Stopped)) && culled.is_none() {
        b.notices.push(Notice::normal(
            event_reasons::PAUSED,
            "Workspace paused: its pod is deleted, its storage kept".into(),
        ));
    }
    match &culled {
        Some(why) => b.condition(types::READY, ConditionStatus::False, reasons::IDLE, why),
        None => b.condition(
            types::READY,
            ConditionStatus::False,
            reasons::PAUSED,
            "Workspace is paused",
        ),
    }
    match owned_pod {
        Some(p) => {
            if p.metadata.deletion_timestamp.is_none() {
                b.actions.push(Action::DeletePod {
                    uid: p.uid().unwrap_or_default(),
                });
            }
            b.phase(
                Phase::Stopping,
                match culled {
                    Some(_) => format!("Stopping pod {pod_name}: nobody used the workspace"),
                    None => format!("Stopping pod {pod_name} to pause the workspace"),
                },
            );
            b.finish(Duration::from_secs(1))
        }
        None => {
            b.status.pod = None;
            b.status.agent = None;
            for t in [types::POD_SCHEDULED, types::POD_READY, types::AGENT_READY] {
                clear_condition(&mut b.status, t);
            }
            b.phase(
                Phase::Stopped,
                culled.unwrap_or_else(|| "Workspace is paused; its storage is kept".to_owned()),
            );
            b.finish(slow)
        }
    }
}

/// A start Berth gave up on (rules C9, C12): Failed with what it said then, its pod deleted,
/// until the spec changes or the user restarts the workspace.
fn gave_up(mut b: Builder<'_>, owned_pod: Option<&Pod>, message: &str, slow: Duration) -> Decision {
    if let Some(p) = owned_pod.filter(|p| p.metadata.deletion_timestamp.is_none()) {
        b.actions.push(Action::DeletePod {
            uid: p.uid().unwrap_or_default(),
        });
    }
    if owned_pod.is_none() {
        b.status.pod = None;
    }
    b.status.phase = Some(Phase::Failed);
    b.status.message = Some(message.to_owned());
    b.finish(slow)
}

/// A pod rejected by its kubelet or lost with its node, and gone (rule C12, C13): a new one
/// once the delay has passed (at once for a lost node), counted.
fn replacing(
    mut b: Builder<'_>,
    condition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
    recreation: &PodRecreationPolicy,
    pod_name: &str,
    now: Timestamp,
) -> Decision {
    // The rejected (or lost) pod is gone: replace it once the delay has passed.
    let node_lost = condition.reason == reasons::NODE_LOST;
    // Condition times have whole seconds: count the delay from the end of that second, so
    // it is never shortened.
    let wait = if node_lost {
        Duration::ZERO
    } else {
        recreation.delay + Duration::from_secs(1)
    };
    let since = Duration::try_from(now.duration_since(condition.last_transition_time.0))
        .unwrap_or_default();
    if since < wait {
        return b.finish(wait - since);
    }
    let attempt = if node_lost {
        b.status.pod_recreations.unwrap_or(0)
    } else {
        let attempt = b.status.pod_recreations.unwrap_or(0) + 1;
        b.status.pod_recreations = Some(attempt);
        attempt
    };
    let note = if node_lost {
        format!("Creating pod {pod_name} again: the node of the last one was lost")
    } else {
        format!(
            "Creating pod {pod_name} again (attempt {attempt} of {}) after its kubelet rejected the last one ({})",
            recreation.max, condition.reason
        )
    };
    b.recreation = Some(Recreation {
        reason: condition.reason.clone(),
        attempt: attempt.max(1),
    });
    b.notices
        .push(Notice::normal(event_reasons::RECREATING, note));
    b.condition(
        types::POD_REJECTED,
        ConditionStatus::False,
        "PodRecreated",
        &format!(
            "A new pod replaced the one that was {}",
            if node_lost {
                "lost with its node"
            } else {
                "rejected"
            }
        ),
    );
    b.actions.push(Action::CreatePod);
    b.status.pod = None;
    b.pod_being_created(pod_name);
    b.phase(
        Phase::Starting,
        format!(
            "Creating pod {pod_name} again{}",
            if node_lost {
                String::new()
            } else {
                format!(" (attempt {attempt} of {})", recreation.max)
            }
        ),
    );
    b.finish(Duration::from_secs(1))
}

/// No pod (rule C4): create it, Pending; a create the API server keeps refusing fails the
/// start after `startTimeout` (rule C9), counted from the first attempt.
fn creating(
    mut b: Builder<'_>,
    pod_name: &str,
    start_timeout: Duration,
    now: Timestamp,
    slow: Duration,
) -> Decision {
    b.actions.push(Action::CreatePod);
    if b.status.started_at.is_none() {
        b.status.started_at = Some(time(now));
    }
    b.status.pod = None;
    b.status.ready_at = None;
    b.pod_being_created(pod_name);
    b.phase(Phase::Pending, format!("Creating pod {pod_name}"));
    // A create the API server keeps refusing is no progress either (rule C9), counted from
    // the first attempt.
    let Some(refused) = b
        .refusal
        .as_ref()
        .map(|(r, _)| *r)
        .filter(|r| r.action == Action::CreatePod)
    else {
        return b.finish(Duration::from_secs(1));
    };
    let stuck_for = elapsed(b.status.started_at.as_ref(), now);
    if stuck_for >= start_timeout {
        let text = format!(
            "No progress for {} while creating pod {pod_name}: {}",
            human(start_timeout),
            refused.message
        );
        b.actions.clear();
        return b.start_timed_out(text, slow);
    }
    b.finish(start_timeout - stuck_for)
}

/// The spec's lifecycle settings, parsed; Err says why the spec cannot work (rule C19).
struct Lifecycle {
    start_timeout: Duration,
    recreation: PodRecreationPolicy,
    idle_timeout: Option<Duration>,
}

impl Lifecycle {
    fn of(workspace: &Workspace, policy: &Policy) -> Result<Self, String> {
        let lifecycle = workspace.spec.lifecycle.as_ref();
        let cannot = |field: &str, e: &dyn std::fmt::Display| {
            format!("The spec cannot work: lifecycle.{field}: {e}")
        };
        let start_timeout = match lifecycle.and_then(|l| l.start_timeout.as_ref()) {
            Some(text) => text.to_duration().map_err(|e| cannot("startTimeout", &e))?,
            None => policy.start_timeout,
        };
        let recreation = PodRecreationPolicy::resolve(
            lifecycle.and_then(|l| l.pod_recreation.as_ref()),
            policy.recreation,
        )
        .map_err(|e| cannot("podRecreation.delay", &e))?;
        let idle_timeout = match lifecycle.and_then(|l| l.idle_timeout.as_ref()) {
            Some(text) => match text.to_duration().map_err(|e| cannot("idleTimeout", &e))? {
                d if d.is_zero() => {
                    return Err(
                        "The spec cannot work: lifecycle.idleTimeout must be longer than 0s"
                            .to_owned(),
                    );
                }
                d => Some(d),
            },
            None => None,
        };
        Ok(Lifecycle {
            start_timeout,
            recreation,
            idle_timeout,
        })
    }
}

/// Derives the workspace's status and the actions that move it toward its spec.
pub fn derive(observed: &Observed<'_>, policy: &Policy, now: Timestamp) -> Decision {
    let workspace = observed.workspace;
    let name = workspace.name_any();
    let pod_name = pod::pod_name(&name);
    let empty = WorkspaceStatus::default();
    let old = workspace.status.as_ref().unwrap_or(&empty);
    let mut b = Builder {
        status: old.clone(),
        generation: workspace.metadata.generation,
        now: time(now),
        actions: vec![],
        notices: vec![],
        old,
        recreation: None,
        refusal: observed
            .refusal
            .filter(|r| r.generation == workspace.metadata.generation)
            .map(|r| (r, name.clone())),
        max_requeue: policy.max_requeue,
        growing: None,
    };
    b.status.observed_generation = workspace.metadata.generation;
    let slow = policy.resync;

    let owned_pod = observed.pod.filter(|p| is_owned_by(&p.metadata, workspace));
    // Deletion first: a spec that cannot work must not hold up its own deletion.
    if workspace.metadata.deletion_timestamp.is_some() {
        return deleting(b, owned_pod, &pod_name);
    }

    // A spec that can never work waits for a change, without retries (rule C19).
    let Lifecycle {
        start_timeout,
        recreation,
        idle_timeout,
    } = match Lifecycle::of(workspace, policy) {
        Ok(lifecycle) => lifecycle,
        Err(message) => return b.invalid_spec(message, slow),
    };

    // What the operator's policy does not allow a workspace waits for a change, without a pod.
    if let Some(violation) = crate::pod_policy::violation(&workspace.spec, &policy.pod) {
        let message = format!("The spec asks for what this operator does not allow: {violation}");
        return b.forbidden(message, slow);
    }

    if let Some(foreign) = observed
        .pod
        .filter(|p| !is_owned_by(&p.metadata, workspace))
    {
        let message = format!(
            "Pod {} exists and is not owned by this workspace; Berth never adopts or deletes it. Delete or rename that pod, or rename the workspace.",
            foreign.name_any()
        );
        b.condition(
            types::READY,
            ConditionStatus::False,
            "PodNotOwned",
            &message,
        );
        b.phase(Phase::Error, message);
        let wait = requeue_interval(
            elapsed(b.status.started_at.as_ref(), now),
            policy.max_requeue,
        );
        return b.finish(wait);
    }

    // Storage and service follow the spec whatever the pod does.
    match (pod::build_claim(workspace), observed.claim) {
        (Some(_), None) => b.actions.push(Action::CreateClaim),
        (Some(wanted), Some(claim)) if is_owned_by(&claim.metadata, workspace) => {
            // The claim grows with home.size (it never shrinks: the CRD refuses that).
            let (requested, capacity) = (pod::claim_request(claim), pod::claim_capacity(claim));
            let size = pod::claim_request(&wanted);
            if pod::storage_less(requested.as_ref(), size.as_ref()) {
                b.actions.push(Action::ResizeClaim);
            }
            if pod::storage_less(capacity.as_ref(), size.as_ref()) {
                b.growing = Some(growing(claim, size.as_ref()));
            }
        }
        _ => {}
    }
    match (pod::build_service(workspace).is_some(), observed.service) {
        (true, None) => b.actions.push(Action::CreateService),
        (true, Some(s)) if !pod::service_ports_match(s, workspace) => {
            b.actions.push(Action::UpdateService)
        }
        (false, Some(s)) if is_owned_by(&s.metadata, workspace) => {
            b.actions.push(Action::DeleteService)
        }
        _ => {}
    }

    if workspace.spec.paused {
        return paused(b, owned_pod, &pod_name, slow);
    }
    if matches!(old.phase, Some(Phase::Stopped | Phase::Stopping))
        && old
            .conditions
            .iter()
            .any(|c| c.reason == reasons::PAUSED || c.reason == reasons::IDLE)
    {
        b.notices.push(Notice::normal(
            event_reasons::RESUMED,
            "Workspace resumed: creating its pod".into(),
        ));
    }

    // Gave up earlier: stay Failed until the spec changes or the user restarts (rule C9, C12).
    let stalled = find_condition(&old.conditions, types::STALLED)
        .filter(|c| c.is(ConditionStatus::True))
        .cloned();
    if let Some(stall) = stalled.clone().filter(|c| {
        c.observed_generation == workspace.metadata.generation
            && !SPEC_VERDICTS.contains(&c.reason.as_str())
    }) {
        return gave_up(b, owned_pod, &stall.message, slow);
    }
    if stalled.is_some() {
        // A new generation starts again.
        clear_condition(&mut b.status, types::STALLED);
        clear_condition(&mut b.status, types::POD_REJECTED);
        b.status.started_at = None;
        b.status.pod_recreations = None;
    }

    let rejected = find_condition(&b.status.conditions, types::POD_REJECTED)
        .filter(|c| c.is(ConditionStatus::True))
        .cloned();
    let lost_pod = owned_pod.is_none()
        && rejected.is_none()
        && old.observed_generation == workspace.metadata.generation
        && old.pod.as_ref().is_some_and(|p| p.uid.is_some())
        && matches!(
            old.phase,
            Some(Phase::Running | Phase::Starting | Phase::Error | Phase::Unknown)
        );
    if let (None, Some(condition)) = (owned_pod, &rejected) {
        return replacing(b, condition, &recreation, &pod_name, now);
    }
    if lost_pod {
        // The pod vanished without Berth deleting it (its node was deleted, or someone
        // removed it): start it again, counted with the lost nodes.
        b.recreation = Some(Recreation {
            reason: reasons::NODE_LOST.to_owned(),
            attempt: 1,
        });
        b.notices.push(Notice::warning(event_reasons::NODE_LOST, format!("Pod {pod_name} disappeared (its node was deleted or it was evicted); creating it again")));
    }
    let Some(pod) = owned_pod else {
        return creating(b, &pod_name, start_timeout, now, slow);
    };
    let uid = pod.uid().unwrap_or_default();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
    let previous_pod = old.pod.clone();
    // Rule C14: an agent is verified once per pod; a new pod is checked again.
    let agent_verified = old
        .agent
        .as_ref()
        .and_then(|a| a.verified_pod_uid.as_deref())
        == Some(uid.as_str());
    if !agent_verified {
        b.status.agent = None;
    }
    b.status.pod = Some(PodRef {
        name: pod_name.clone(),
        uid: Some(uid.clone()),
        ip: ip.clone(),
        node_name: node.clone(),
    });
    // Events tell only what happened (rule C17): `Created` once the pod exists, `Started` once
    // one of its containers runs.
    let new_pod = previous_pod.as_ref().and_then(|p| p.uid.as_deref()) != Some(uid.as_str());
    if new_pod {
        b.notices.push(Notice::normal(
            event_reasons::CREATED,
            format!("Created pod {pod_name}"),
        ));
    }
    let was_running = !new_pod
        && find_condition(&old.conditions, types::POD_READY).is_some_and(|c| {
            c.is(ConditionStatus::True) || c.reason == reasons::CONTAINERS_NOT_READY
        });
    if containers_running(pod) && !was_running {
        b.notices.push(Notice::normal(
            event_reasons::STARTED,
            format!(
                "Pod {pod_name} started on {} ({})",
                node.as_deref().unwrap_or("its node"),
                ip.as_deref().unwrap_or("no IP")
            ),
        ));
    }

    if pod.metadata.deletion_timestamp.is_some() {
        b.phase(
            Phase::Stopping,
            format!("Waiting for pod {pod_name} to stop"),
        );
        return b.finish(Duration::from_secs(1));
    }
    if !pod::built_from(pod, &workspace.spec) {
        b.actions.push(Action::DeletePod { uid });
        b.status.started_at = Some(time(now));
        b.status.ready_at = None;
        // A spec change is a new start: the recreation count starts over.
        b.status.pod_recreations = None;
        clear_condition(&mut b.status, types::POD_REJECTED);
        b.phase(
            Phase::Stopping,
            format!("Replacing pod {pod_name}: the workspace spec changed"),
        );
        return b.finish(Duration::from_secs(1));
    }

    // A pod its kubelet rejected is replaced, a bounded number of times (rules C10-C12).
    if let Some(rejected) = crate::rejection::detect(pod, &policy.rejections) {
        let replaced = b.status.pod_recreations.unwrap_or(0);
        let node = rejected
            .node
            .clone()
            .unwrap_or_else(|| "its node".to_owned());
        b.actions.push(Action::DeletePod { uid: uid.clone() });
        b.status.pod = None;
        b.status.ready_at = None;
        if replaced >= recreation.max {
            let text = format!(
                "Pod rejected by {node} ({}) after {replaced} replacement{}; giving up (maxRecreations {}). {}",
                rejected.reason,
                if replaced == 1 { "" } else { "s" },
                recreation.max,
                rejected.message
            );
            let text = text.trim_end().to_owned();
            b.condition(
                types::POD_REJECTED,
                ConditionStatus::True,
                reasons::RECREATION_LIMIT_REACHED,
                &text,
            );
            b.condition(
                types::STALLED,
                ConditionStatus::True,
                reasons::RECREATION_LIMIT_REACHED,
                &text,
            );
            b.condition(
                types::READY,
                ConditionStatus::False,
                reasons::RECREATION_LIMIT_REACHED,
                &text,
            );
            b.notices.push(Notice::warning(
                event_reasons::RECREATION_LIMIT_REACHED,
                text.clone(),
            ));
            b.phase(Phase::Failed, text);
            return b.finish(slow);
        }
        b.condition(
            types::POD_REJECTED,
            ConditionStatus::True,
            &rejected.reason,
            &rejected.message,
        );
        b.condition(
            types::READY,
            ConditionStatus::False,
            &rejected.reason,
            &rejected.message,
        );
        b.notices.push(Notice::warning(
            event_reasons::POD_REJECTED,
            format!(
                "Pod {pod_name} was rejected by {node}: {}",
                rejected.message
            ),
        ));
        b.phase(
            Phase::Starting,
            format!(
                "Pod rejected by {node} ({}); creating a new pod (attempt {} of {})",
                rejected.reason,
                replaced + 1,
                recreation.max
            ),
        );
        return b.finish(recreation.delay.max(Duration::from_millis(100)));
    }
    // A pod whose node is gone is replaced at once, and counted apart (rule C13).
    let pod_phase_now = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if pod_phase_now == "Unknown" {
        let text = pod
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_else(|| format!("The node of pod {pod_name} is lost"));
        b.actions.push(Action::ForceDeletePod { uid: uid.clone() });
        b.status.pod = None;
        b.status.ready_at = None;
        b.condition(
            types::POD_REJECTED,
            ConditionStatus::True,
            reasons::NODE_LOST,
            &text,
        );
        b.condition(
            types::READY,
            ConditionStatus::False,
            reasons::NODE_LOST,
            &text,
        );
        b.notices.push(Notice::warning(
            event_reasons::NODE_LOST,
            format!("{text}; replacing pod {pod_name}"),
        ));
        b.phase(Phase::Unknown, format!("{text}; replacing the pod"));
        return b.finish(Duration::from_secs(1));
    }

    // Conditions from the pod.
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == pod_conditions::POD_SCHEDULED))
        .cloned();
    match scheduled {
        Some(c) if c.is(ConditionStatus::True) => {
            let message = format!(
                "Pod {pod_name} is bound to {}",
                node.as_deref().unwrap_or("a node")
            );
            b.condition(
                types::POD_SCHEDULED,
                ConditionStatus::True,
                reasons::SCHEDULED,
                &message,
            )
        }
        Some(c) => {
            let reason = c
                .reason
                .clone()
                .unwrap_or_else(|| reasons::UNSCHEDULABLE.to_owned());
            b.condition(
                types::POD_SCHEDULED,
                ConditionStatus::False,
                &reason,
                c.message.as_deref().unwrap_or(""),
            );
        }
        None => b.condition(
            types::POD_SCHEDULED,
            ConditionStatus::False,
            reasons::WAITING_FOR_SCHEDULER,
            &format!("Pod {pod_name} waits for the scheduler"),
        ),
    }
    let pod_phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let ready = pod_is_ready(pod);
    let signal = signal(pod, observed.warnings, policy);

    if ready {
        b.condition(
            types::POD_READY,
            ConditionStatus::True,
            reasons::CONTAINERS_READY,
            "All containers are ready",
        );
        if !agent_verified {
            // Rule C14: Ready only once the agent authenticated the operator; rule C15: a
            // failure keeps the pod untouched, says why, and is retried with backoff.
            let check = observed.agent.filter(|c| c.pod_uid == uid);
            match check.map(|c| (c, &c.outcome)) {
                Some((c, AgentOutcome::Verified { identity })) => {
                    b.status.agent = Some(AgentStatus {
                        address: Some(c.address.clone()),
                        identity: Some(identity.clone()),
                        verified_pod_uid: Some(uid.clone()),
                    });
                    b.condition(
                        types::AGENT_READY,
                        ConditionStatus::True,
                        reasons::AGENT_VERIFIED,
                        &format!(
                            "The agent at {} authenticated the operator as {identity}",
                            c.address
                        ),
                    );
                }
                Some((c, AgentOutcome::Failed { reason, message })) => {
                    b.status.agent = Some(AgentStatus {
                        address: Some(c.address.clone()),
                        ..Default::default()
                    });
                    b.condition(types::AGENT_READY, ConditionStatus::False, reason, message);
                    b.condition(types::READY, ConditionStatus::False, reason, message);
                    let what = match reason.as_str() {
                        reasons::AGENT_UNREACHABLE => "cannot be reached",
                        reasons::UNAUTHENTICATED | reasons::PERMISSION_DENIED => {
                            "refused the operator"
                        }
                        reasons::IDENTITY_MISMATCH => "is not to be trusted",
                        _ => "could not be checked",
                    };
                    let text = format!(
                        "The agent of pod {pod_name} at {} {what} ({reason}): {message}. The pod is kept; Berth keeps retrying.",
                        c.address
                    );
                    if c.fresh {
                        b.notices.push(Notice::warning(
                            event_reasons::AGENT_AUTH_FAILED,
                            text.clone(),
                        ));
                    }
                    b.status.ready_at = None;
                    b.phase(Phase::Error, text);
                    return b.finish(c.retry_in.max(Duration::from_millis(100)));
                }
                None => {
                    let message = format!("Pod {pod_name} is ready; checking its agent");
                    b.condition(
                        types::AGENT_READY,
                        ConditionStatus::Unknown,
                        reasons::UNKNOWN,
                        &message,
                    );
                    b.condition(
                        types::READY,
                        ConditionStatus::False,
                        reasons::UNKNOWN,
                        &message,
                    );
                    b.phase(Phase::Starting, message);
                    // The check runs in the background and wakes the workspace when it ends.
                    return b.finish(policy.max_requeue);
                }
            }
        }
        b.condition(
            types::READY,
            ConditionStatus::True,
            reasons::WORKSPACE_READY,
            "Workspace is running",
        );
        if find_condition(&b.old.conditions, types::READY)
            .is_none_or(|c| !c.is(ConditionStatus::True))
        {
            b.status.ready_at = Some(time(now));
            b.notices.push(Notice::normal(
                event_reasons::READY,
                "Workspace is ready".into(),
            ));
        }
        b.phase(Phase::Running, "Workspace is running");
        return match idle_timeout {
            Some(timeout) => {
                let check = observed.activity.filter(|c| c.pod_uid == uid);
                b.running_until_idle(timeout, check, &pod_name, slow)
            }
            None => b.finish(slow),
        };
    }
    b.status.ready_at = None;

    let (reason, message) = match &signal {
        Some(s) => (s.reason.clone(), s.message.clone()),
        None => {
            let waiting = waiting(
                pod.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref()),
            )
            .map(|w| w.0);
            match waiting {
                None if containers_running(pod) => (
                    reasons::CONTAINERS_NOT_READY.to_owned(),
                    format!("Pod {pod_name} is running; waiting for its containers to be ready"),
                ),
                waiting => {
                    let reason = waiting.unwrap_or_else(|| reasons::CONTAINER_CREATING.to_owned());
                    (
                        reason.clone(),
                        format!("Pod {pod_name} is starting ({reason})"),
                    )
                }
            }
        }
    };
    b.condition(types::POD_READY, ConditionStatus::False, &reason, &message);
    if !agent_verified {
        b.agent_waits_for(&pod_name);
    }
    let first_false = find_condition(&b.status.conditions, types::POD_SCHEDULED)
        .filter(|c| !c.is(ConditionStatus::True))
        .or_else(|| find_condition(&b.status.conditions, types::POD_READY))
        .cloned();
    if let Some(c) = first_false {
        b.condition(types::READY, ConditionStatus::False, &c.reason, &c.message);
    }

    match pod_phase.as_str() {
        "Unknown" => {
            let text = pod
                .status
                .as_ref()
                .and_then(|s| s.message.clone())
                .unwrap_or_else(|| format!("The state of pod {pod_name} is unknown"));
            b.phase(Phase::Unknown, text);
        }
        "Failed" | "Succeeded" => {
            let why = pod
                .status
                .as_ref()
                .and_then(|s| s.reason.clone().zip(s.message.clone()))
                .map(|(r, m)| format!("{r}: {m}"));
            let terminated = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find_map(|c| c.state.as_ref()?.terminated.clone()))
                .map(|t| {
                    format!(
                        "container exited with code {}{}{}",
                        t.exit_code,
                        t.reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                        t.message.map(|m| format!(": {m}")).unwrap_or_default()
                    )
                });
            // The container's own words first: a pod that ran and then failed crashed.
            let text = terminated
                .or(why)
                .unwrap_or_else(|| format!("pod phase {pod_phase}"));
            b.phase(
                Phase::Error,
                format!(
                    "Pod {pod_name} {}: {text}",
                    if pod_phase == "Failed" {
                        "failed"
                    } else {
                        "exited"
                    }
                ),
            );
        }
        _ => match &signal {
            Some(s) if s.error => b.phase(Phase::Error, s.message.clone()),
            Some(s) => b.phase(Phase::Starting, s.message.clone()),
            None => b.phase(Phase::Starting, message.clone()),
        },
    }

    // No progress for startTimeout: give up and free the node (rule C9).
    let last_progress = b
        .status
        .conditions
        .iter()
        // Waiting for the pod before the agent is checked is not progress.
        .filter(|c| ConditionType::parse(&c.type_) != Some(types::AGENT_READY))
        .map(|c| c.last_transition_time.0)
        .chain(b.status.started_at.as_ref().map(|t| t.0))
        .max()
        .unwrap_or(now);
    let stuck_for = Duration::try_from(now.duration_since(last_progress)).unwrap_or_default();
    if stuck_for >= start_timeout {
        let step = find_condition(&b.status.conditions, types::POD_SCHEDULED)
            .filter(|c| !c.is(ConditionStatus::True))
            .map(|_| "scheduling")
            .unwrap_or("starting containers");
        let last = signal
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_else(|| "no warning".to_owned());
        let text = format!(
            "No progress for {} while {step}: {last}",
            crate::state::human(start_timeout)
        );
        b.actions.push(Action::DeletePod { uid });
        return b.start_timed_out(text, slow);
    }
    let wait = requeue_interval(
        elapsed(b.status.started_at.as_ref(), now),
        policy.max_requeue,
    )
    .min(start_timeout - stuck_for);
    b.finish(wait.max(Duration::from_millis(100)))
}

/// `10m`, `90s`, `1h30m`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// How soon a workspace whose activity ask is due now is looked at again, should the ask's
/// own wake not come.
const ASK_RUNNING_RECHECK: Duration = Duration::from_secs(1);

/// `at` as the status stores it (whole seconds), so a stored time compares equal to it.
fn whole_second(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

impl Builder<'_> {
    /// A running workspace with an idle timeout: it remembers the latest use its agent
    /// reported, is stopped once an answer shows nobody used it for the timeout (Berth sets
    /// `spec.paused`; the storage is kept), and says so when its agent cannot be asked
    /// (unknown is not idle). It is looked at again when the next ask is due.
    fn running_until_idle(
        mut self,
        timeout: Duration,
        check: Option<&ActivityCheck>,
        pod_name: &str,
        slow: Duration,
    ) -> Decision {
        let now = self.now.0;
        if let Some(ActivityOutcome::Seen { at, signal, .. }) = check.map(|c| &c.outcome) {
            let at = whole_second(*at);
            if self.status.last_activity.as_ref().is_none_or(|t| t.0 < at) {
                self.status.last_activity = Some(Time(at));
                self.status.last_activity_signal = Some(signal.clone());
            }
        }
        let since = idle::idle_since(&self.status, check).unwrap_or(now);
        if let Some(idle) = idle::culled_after(timeout, since, check) {
            let last = match check.map(|c| &c.outcome) {
                Some(ActivityOutcome::Seen { detail, at, .. }) => {
                    format!("{detail}, at {}", whole_second(*at))
                }
                _ => "nothing".to_owned(),
            };
            let text = format!(
                "Nobody used the workspace for {} (the last use its agent saw: {last}); Berth set spec.paused to true. Its storage is kept; set spec.paused to false to resume.",
                human(idle)
            );
            self.actions.push(Action::Cull);
            self.condition(types::READY, ConditionStatus::False, reasons::IDLE, &text);
            self.status.ready_at = None;
            self.notices.push(Notice::normal(
                event_reasons::CULLED,
                format!(
                    "Stopping the workspace: nobody used it for {} (idleTimeout {}); its storage is kept",
                    human(idle),
                    human(timeout)
                ),
            ));
            self.phase(
                Phase::Stopping,
                format!("Stopping pod {pod_name}: nobody used the workspace"),
            );
            return self.finish(Duration::from_secs(1));
        }
        if let Some((reason, message, fresh)) = check.and_then(|c| match &c.outcome {
            ActivityOutcome::Failed { reason, message } => Some((reason, message, c.fresh)),
            ActivityOutcome::Seen { .. } => None,
        }) {
            let text = format!(
                "Workspace is running; its agent cannot say whether it is in use ({reason}: {message}), so it is not stopped when idle. Berth keeps asking."
            );
            if fresh {
                self.notices.push(Notice::warning(
                    event_reasons::ACTIVITY_UNKNOWN,
                    text.clone(),
                ));
            }
            self.phase(Phase::Running, text);
        }
        // Due now: the ask was started with this reconcile and its answer wakes the
        // workspace, so the requeue is only the safety net, not a 10 Hz loop while it runs.
        let wait = match idle::next_ask(timeout, since, check, now) {
            due if due.is_zero() => ASK_RUNNING_RECHECK,
            wait => wait.max(Duration::from_millis(100)),
        };
        self.finish(wait.min(slow.max(Duration::from_millis(100))))
    }

    /// Gives up on a start that made no progress for `startTimeout` (rule C9).
    fn start_timed_out(mut self, text: String, requeue: Duration) -> Decision {
        self.condition(
            types::STALLED,
            ConditionStatus::True,
            reasons::START_TIMEOUT,
            &text,
        );
        self.condition(
            types::READY,
            ConditionStatus::False,
            reasons::START_TIMEOUT,
            &text,
        );
        self.notices
            .push(Notice::warning(event_reasons::START_TIMEOUT, text.clone()));
        self.phase(Phase::Failed, text);
        self.finish(requeue)
    }

    /// The decision, with a refused action accounted for: while the decision still asks for
    /// the action the API server refused, the workspace is `Error` with the API server's words
    /// (a Warning event when the refusal is fresh), and the action waits out its backoff.
    fn finish(mut self, mut requeue: Duration) -> Decision {
        let still_wanted = self
            .refusal
            .as_ref()
            .filter(|(r, _)| self.actions.contains(&r.action));
        if let Some((refused, workspace)) = still_wanted.cloned()
            && !matches!(self.status.phase, Some(Phase::Failed | Phase::Terminating))
        {
            let text = format!(
                "Cannot {}: {}",
                refused.action.describe(&workspace),
                refused.message
            );
            self.condition(types::READY, ConditionStatus::False, &refused.reason, &text);
            if refused.fresh {
                self.notices.push(Notice::warning(
                    refused.action.refused_reason(),
                    text.clone(),
                ));
            }
            self.status.ready_at = None;
            self.phase(Phase::Error, text);
            let wait = refused.retry_in(self.now.0, self.max_requeue);
            if !wait.is_zero() {
                self.actions.retain(|a| *a != refused.action);
                requeue = requeue.min(wait);
            }
        }
        if let Some(growing) = self.growing.take()
            && matches!(self.status.phase, Some(Phase::Pending | Phase::Starting))
        {
            self.status.message = Some(growing);
        }
        self.explain_error();
        // Counted from 0, so `kubectl get ws` shows RECREATIONS 0 rather than nothing.
        self.status.pod_recreations.get_or_insert(0);
        Decision {
            status: self.status,
            actions: self.actions,
            notices: self.notices,
            requeue,
            recreation: self.recreation,
        }
    }

    /// Going to `Error`, or to another cause of it, publishes a Warning on the workspace with
    /// the cause (the Ready reason) and the message, so `kubectl describe ws` tells why.
    fn explain_error(&mut self) {
        if self.status.phase != Some(Phase::Error) || self.notices.iter().any(|n| n.warning) {
            return;
        }
        let Some(ready) = find_condition(&self.status.conditions, types::READY) else {
            return;
        };
        let before = find_condition(&self.old.conditions, types::READY).map(|c| c.reason.as_str());
        if self.old.phase == Some(Phase::Error) && before == Some(ready.reason.as_str()) {
            return;
        }
        let note = self.status.message.clone().unwrap_or_default();
        self.notices
            .push(Notice::warning(ready.reason.clone(), note));
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
