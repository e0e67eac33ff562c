//! The pure core: from what was observed (the workspace, its pod, the pod's Warning events,
//! its claim and service) and the time, derive the whole status, what to do, which events to
//! publish and when to look again. No I/O here; every rule of the phase table lives here.

use std::time::Duration;

use berth_api::{
    AdmissionRecord, ConditionStatus, Phase, PodRecreationPolicy, PodRef, Workspace,
    WorkspaceStatus,
    condition::{
        ConditionType, HasReason, HasStatus, Reason, Scope, event_reasons, find_condition,
        pod_conditions, set_condition, types,
    },
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Event, PersistentVolumeClaim, Service},
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{Condition, Time},
    },
};
use kube::ResourceExt;

pub use crate::action::Action;
use crate::cached_pod::{CachedContainerStatus, CachedPod};
use crate::{
    config::{Policy, WarningClass},
    idle::ActivityCheck,
    kinds::KindUpdate,
    ownership::{Derived, Foreign},
    pod::{self, is_owned_by},
    refusal::Refusal,
};

/// The longest `UpdateAvailable` message: a kind's change lists every field that differs,
/// and an affinity in JSON is long.
const MAX_UPDATE_MESSAGE: usize = 4096;

/// Cuts `text` to at most `max` bytes, at a character boundary, saying that it did.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
}

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
    /// The pod with the workspace's pod name, whoever owns it (the caches show objects
    /// labelled as Berth's; one that is not the workspace's own is someone else's).
    pub pod: Option<&'a CachedPod>,
    /// Warning events whose `involvedObject.uid` is the current pod's (rule C2).
    pub warnings: &'a [&'a Event],
    /// The claim with the workspace's home claim name, whoever owns it.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The service with the workspace's service name, whoever owns it.
    pub service: Option<&'a Service>,
    /// Objects of the names Berth derives for the workspace that its creates met and that are
    /// not the workspace's own (the caches do not show objects without Berth's labels).
    pub taken: &'a [Foreign],
    /// The last WhoAmI to the current pod's agent, when one was made (rule C14).
    pub agent: Option<&'a AgentCheck>,
    /// The API server's refusal of the last attempt at an action, until that action succeeds.
    pub refusal: Option<&'a Refusal>,
    /// The last `GetActivity` to the current pod's agent, when the workspace has an idle
    /// timeout.
    pub activity: Option<&'a ActivityCheck>,
    /// The last `GetContent` to the current pod's agent, while the workspace's content is not
    /// in place for it.
    pub content: Option<&'a crate::content::ContentCheck>,
    /// What is missing of the admission policy that checks a spec's author may use what it
    /// names (`berth_controller::admission`); `None` when it is installed and enforcing.
    pub admission: Option<&'a str>,
    /// The resourceVersion at which this operator saw the policy begin to enforce (for the
    /// workspace's namespace), when it saw that happen: a spec first seen at a lower version
    /// was written before, unchecked. None: no such change seen.
    pub admission_since: Option<u64>,
    /// What the workspace's kind says of it (`crate::kinds`): the workspace above is already
    /// shaped by the record in force.
    pub kind: &'a KindUpdate,
    /// Creates the API server accepted that the caches do not show yet.
    pub expectations: Expectations,
}

/// When this operator's create (or update) of an object the workspace owns was accepted, for
/// the objects its caches do not show yet. Under load a watch lags by seconds: until the
/// cache shows the object, or [`EXPECTATION_TTL`] has passed, the create is not sent again (it
/// would only earn a 409).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expectations {
    pub pod: Option<Timestamp>,
    pub claim: Option<Timestamp>,
    pub service: Option<Timestamp>,
}

/// How long a create is trusted to show up in the cache before it is sent again. It bounds
/// only a create whose object vanished before the cache saw it (kube-controller-manager
/// waits five minutes for the same).
pub const EXPECTATION_TTL: Duration = Duration::from_secs(60);

impl Expectations {
    /// Whether `action` was done lately and its result is still to show up in the cache.
    fn covers(&self, action: &Action, now: Timestamp) -> bool {
        let sent = match action {
            Action::CreatePod => self.pod,
            Action::CreateClaim => self.claim,
            Action::CreateService | Action::UpdateService { .. } => self.service,
            _ => None,
        };
        sent.is_some_and(|at| elapsed(Some(&Time(at)), now) < EXPECTATION_TTL)
    }
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
    Failed { reason: Reason, message: String },
}

/// Rule C15, the wait after `failures` failed calls in a row to an agent: base, 2 x base,
/// 4 x base ... capped at `max`.
pub fn agent_backoff(failures: u32, base: Duration, max: Duration) -> Duration {
    base.saturating_mul(1u32 << failures.saturating_sub(1).min(20))
        .min(max)
}

/// Rule C15, what a reconcile at `now` makes of the last finished WhoAmI to the pod's agent:
/// the check to decide with, or `None` when the agent is to be called again. A verification
/// stands (once per pod). A failure stands until its backoff ends at `next_at` and is
/// `fresh` (its Warning published) only the first time a reconcile reads it (`delivered`
/// says one did); then a call is due. A failure never read is read once even past its
/// backoff, so every failure is said.
pub fn agent_reading(
    last: &AgentCheck,
    next_at: Timestamp,
    delivered: bool,
    now: Timestamp,
) -> Option<AgentCheck> {
    let verified = matches!(last.outcome, AgentOutcome::Verified { .. });
    let backing_off = now < next_at;
    (verified || !delivered || backing_off).then(|| AgentCheck {
        fresh: !delivered,
        retry_in: Duration::try_from(next_at.duration_since(now)).unwrap_or_default(),
        ..last.clone()
    })
}

/// The address of the agent to check, when the workspace's pod is ready and its agent has not
/// been verified for this pod UID yet (rule C14: once per pod).
pub fn agent_to_check(workspace: &Workspace, pod: Option<&CachedPod>, port: u16) -> Option<String> {
    let pod = pod.filter(|p| is_owned_by(&p.metadata, workspace))?;
    let verified = workspace
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.verified_pod_uid.as_deref());
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    (workspace.metadata.deletion_timestamp.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && !workspace.spec.paused
        && pod_is_ready(pod)
        && verified != pod.metadata.uid.as_deref()
        // Last: it hashes the workspace, and most calls (every pod event, every reconcile)
        // are of an agent already checked or a pod not ready yet.
        && pod::built_from(pod, workspace))
    .then(|| agent_address(ip, port))
}

/// Where a pod's agent is called: `ip:port`, `[fd00::1]:50051` for IPv6 pods.
pub fn agent_address(ip: &str, port: u16) -> String {
    match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{ip}:{port}"),
    }
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
fn containers_running(pod: &CachedPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// Running, with its Ready condition true.
pub fn pod_is_ready(pod: &CachedPod) -> bool {
    pod_condition(pod, pod_conditions::READY) == Some(ConditionStatus::True)
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// A pod replaced after a rejection or a lost node, for the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recreation {
    /// The kubelet's reason, or `NodeLost`.
    pub reason: Reason,
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
    /// The workspace is being deleted and its finalizer may go (rule C18): its pod is gone,
    /// or is force-deleted by this decision's actions.
    pub release: bool,
}

/// The most relevant thing wrong (or happening) with a pod that is not ready (rule C6).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Signal {
    reason: Reason,
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

fn waiting(statuses: Option<&Vec<CachedContainerStatus>>) -> Option<(String, String)> {
    statuses?.iter().find_map(|s| {
        let waiting = s.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.clone()?;
        Some((reason, waiting.message.clone().unwrap_or_default()))
    })
}

/// The first signal by priority: unschedulable, then a container's waiting reason, then the
/// newest classified Warning event.
fn signal(pod: &CachedPod, warnings: &[&Event], policy: &Policy) -> Option<Signal> {
    let status = pod.status.as_ref();
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == pod_conditions::POD_SCHEDULED));
    if let Some(condition) = scheduled.filter(|c| {
        c.is(ConditionStatus::False)
            && c.reason.as_deref().map(Reason::parse) == Some(Reason::Unschedulable)
    }) {
        return Some(Signal {
            reason: Reason::Unschedulable,
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
            reason: Reason::parse(&reason),
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
        reason: Reason::parse(&reason),
        error: class == WarningClass::Error,
    })
}

/// The status of the pod's condition `type_` (one of [`pod_conditions`]).
fn pod_condition(pod: &CachedPod, type_: &str) -> Option<ConditionStatus> {
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

/// The Stalled reasons that are verdicts on the spec (derived again on every reconcile), not
/// a start that gave up.
const SPEC_VERDICTS: [Reason; 4] = [
    Reason::InvalidSpec,
    Reason::Forbidden,
    Reason::KindNotFound,
    Reason::OptionNotFound,
];

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
    /// The workspace is being deleted and its finalizer may go.
    release: bool,
    expectations: Expectations,
    /// Objects of the names this workspace needs that are someone else's.
    taken: Vec<Foreign>,
    /// Why the spec is not known to be admission-checked, when it names objects the policy
    /// should check: the reason and the words.
    admission_missing: Option<(Reason, String)>,
}

impl Builder<'_> {
    /// A verdict on the spec itself: `Stalled=True` and `Ready=False` with `reason`, in
    /// `phase`, until the spec changes; it is re-derived each time, so it is never the
    /// "gave up" stall below (the reason is one of [`SPEC_VERDICTS`]).
    fn spec_verdict(&mut self, phase: Phase, reason: Reason, message: String) {
        debug_assert!(SPEC_VERDICTS.contains(&reason));
        // A verdict on the spec comes first: nothing is created for it anyway.
        self.taken.clear();
        self.condition(
            types::STALLED,
            ConditionStatus::True,
            reason.clone(),
            &message,
        );
        self.condition(types::READY, ConditionStatus::False, reason, &message);
        self.phase(phase, message);
    }

    /// `UpdateAvailable` and `pendingRestart`, from what the kind says of the record in force.
    fn kind_update(&mut self, update: &KindUpdate) {
        self.status.pending_restart = false;
        let (status, reason, message) = match update {
            KindUpdate::NoKind => {
                let type_ = types::UPDATE_AVAILABLE.as_str();
                self.status.conditions.retain(|c| c.type_ != type_);
                return;
            }
            KindUpdate::UpToDate { kind } => (
                ConditionStatus::False,
                Reason::UpToDate,
                format!("The workspace runs what WorkspaceKind {kind} gives"),
            ),
            KindUpdate::Changed { kind, differences } => {
                self.status.pending_restart = true;
                let mut message = format!(
                    "WorkspaceKind {kind} changed since the workspace started; its next start from stopped (pause and resume) applies it: {}",
                    differences.join("; ")
                );
                truncate(&mut message, MAX_UPDATE_MESSAGE);
                (ConditionStatus::True, Reason::KindChanged, message)
            }
            KindUpdate::Gone { error, .. } => (
                ConditionStatus::Unknown,
                Reason::parse(error.reason()),
                format!(
                    "{error}; the workspace keeps what it started with, and cannot start again until the kind offers it"
                ),
            ),
        };
        self.condition(types::UPDATE_AVAILABLE, status, reason, &message);
    }

    /// A spec that can never work: Failed, Stalled=InvalidSpec, no retry storm (rule C19).
    fn invalid_spec(mut self, message: String, requeue: Duration) -> Decision {
        self.spec_verdict(Phase::Failed, Reason::InvalidSpec, message);
        self.finish(requeue)
    }

    /// A spec the operator's policy forbids: Error, Stalled=Forbidden, Warning event; no pod
    /// is created for it. A pod from an earlier spec is left as it is (like an invalid spec):
    /// a verdict on the spec never destroys running work.
    fn forbidden(self, message: String, requeue: Duration) -> Decision {
        self.held(Reason::Forbidden, message, requeue)
    }

    /// A spec held up until what it asks changes or appears (`Forbidden`, `KindNotFound`,
    /// `OptionNotFound`): Error, Stalled with the reason, a Warning event, no pod.
    fn held(mut self, reason: Reason, message: String, requeue: Duration) -> Decision {
        self.status.ready_at = None;
        self.spec_verdict(Phase::Error, reason, message);
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
            Reason::WaitingForScheduler,
            &message,
        );
        self.condition(
            types::POD_READY,
            ConditionStatus::False,
            Reason::ContainerCreating,
            &message,
        );
        self.condition(
            types::READY,
            ConditionStatus::False,
            Reason::ContainerCreating,
            &message,
        );
    }

    /// AgentReady while there is no ready pod to check the agent of.
    fn agent_waits_for(&mut self, pod_name: &str) {
        self.condition(
            types::AGENT_READY,
            ConditionStatus::Unknown,
            Reason::WaitingForPod,
            &format!("The agent is checked once pod {pod_name} is ready"),
        );
    }

    fn condition(
        &mut self,
        type_: ConditionType,
        status: ConditionStatus,
        reason: impl Into<Reason>,
        message: &str,
    ) {
        set_condition(
            &mut self.status.conditions,
            type_,
            status,
            &reason.into(),
            message,
            self.generation,
            &self.now,
        );
        // A transition is against the last status, not against what this decision said on
        // the way (READY set True, then held False by a name taken): a condition that ends
        // where it was keeps its time, so the status does not change with every look.
        let before = find_condition(&self.old.conditions, type_).filter(|c| c.is(status));
        if let Some(before) = before
            && let Some(now) = self
                .status
                .conditions
                .iter_mut()
                .find(|c| c.type_ == type_.as_str())
        {
            now.last_transition_time = before.last_transition_time.clone();
        }
    }

    /// Whether the last status already said `type_` is True for `reason` (and its event was
    /// published then).
    fn already_said(&self, type_: ConditionType, reason: &Reason) -> bool {
        find_condition(&self.old.conditions, type_)
            .is_some_and(|c| c.is(ConditionStatus::True) && c.has_reason(reason))
    }

    /// Removes Berth's conditions about `scope` (a condition it does not write stays).
    fn forget(&mut self, scope: Scope) {
        self.status
            .conditions
            .retain(|c| ConditionType::parse(&c.type_).is_none_or(|t| t.scope() != scope));
    }

    fn phase(&mut self, phase: Phase, message: impl Into<String>) {
        self.status.phase = Some(phase);
        self.status.message = Some(message.into());
    }
}

/// Ready reasons that only say a start is moving on, as opposed to what is wrong with it.
const PROGRESS: [Reason; 6] = [
    Reason::WaitingForScheduler,
    Reason::ContainerCreating,
    Reason::PodInitializing,
    Reason::ContainersNotReady,
    Reason::Unknown,
    Reason::WaitingForPod,
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
        .is_some_and(|c| c.is(ConditionStatus::False) && PROGRESS.contains(&c.reason()));
    let same_start = old.phase == new.phase
        && matches!(new.phase, Some(Phase::Pending | Phase::Starting))
        && old.observed_generation == new.observed_generation
        && old.pod_recreations == new.pod_recreations;
    let quiet = decision.actions.is_empty() && decision.notices.iter().all(|n| !n.warning);
    let wait = interval.checked_sub(since_last_write?)?;
    (progress && same_start && quiet && !wait.is_zero()).then_some(wait)
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

/// The workspace's own pod, as this decision sees it.
struct Current<'a> {
    pod: &'a CachedPod,
    /// The pod's name (the workspace's pod name).
    name: &'a str,
    uid: String,
    /// Its agent authenticated the operator already (rule C14: once per pod).
    agent_verified: bool,
}

/// Derives the workspace's status and the actions that move it toward its spec: a dispatcher
/// over the phase families (`state/stopping.rs`, `state/replacing.rs`, `state/starting.rs`,
/// `state/running.rs`), in the order their rules take precedence.
pub fn derive(observed: &Observed<'_>, policy: &Policy, now: Timestamp) -> Decision {
    let workspace = observed.workspace;
    let name = workspace.name_any();
    let pod_name = pod::pod_name(&name);
    let empty = WorkspaceStatus::default();
    let old = workspace.status.as_ref().unwrap_or(&empty);
    let mut b = Builder::new(observed, old, policy, now);
    let slow = policy.resync;
    let owned_pod = observed.pod.filter(|p| is_owned_by(&p.metadata, workspace));

    // Deletion first: a spec that cannot work must not hold up its own deletion.
    if workspace.metadata.deletion_timestamp.is_some() {
        let since = workspace.metadata.deletion_timestamp.as_ref();
        return stopping::deleting(b, owned_pod, &pod_name, policy.deletion_grace, since);
    }
    // A workspace of a kind says what its kind gives it now; it cannot start from a kind or
    // an option that is gone, and waits for it (the kind's watch wakes it).
    b.kind_update(observed.kind);
    if let KindUpdate::Gone {
        error,
        blocks_start: true,
    } = observed.kind
    {
        let reason = Reason::parse(error.reason());
        return b.held(reason, format!("Cannot start: {error}"), slow);
    }
    // A spec that can never work waits for a change, without retries (rule C19).
    let lifecycle = match Lifecycle::of(workspace, policy) {
        Ok(lifecycle) => lifecycle,
        Err(message) => return b.invalid_spec(message, slow),
    };
    // What the operator's policy does not allow a workspace waits for a change, without a pod.
    if let Some(violation) = crate::pod_policy::violation_in(
        workspace.metadata.namespace.as_deref().unwrap_or_default(),
        &workspace.spec,
        &policy.pod,
    ) {
        let message = format!("The spec asks for what this operator does not allow: {violation}");
        return b.forbidden(message, slow);
    }
    // Storage and service follow the spec whatever the pod does.
    b.storage_and_service(observed);
    if workspace.spec.paused {
        return stopping::paused(b, owned_pod, &pod_name, slow);
    }
    b.resumed();
    // Gave up earlier: stay Failed until the spec changes or the user restarts (rule C9, C12).
    if let Some(message) = b.gave_up_on_this_spec() {
        return stopping::gave_up(b, owned_pod, &message, slow);
    }

    let rejected = find_condition(&b.status.conditions, types::POD_REJECTED)
        .filter(|c| c.is(ConditionStatus::True))
        .cloned();
    let Some(pod) = owned_pod else {
        if let Some(condition) = &rejected {
            return replacing::replacing(b, condition, &lifecycle.recreation, &pod_name);
        }
        if b.lost_its_pod() {
            replacing::vanished(&mut b, &pod_name);
        }
        return starting::creating(b, &pod_name, lifecycle.start_timeout, slow);
    };
    let current = b.saw_pod(pod, &pod_name);
    if pod.metadata.deletion_timestamp.is_some() {
        return stopping::pod_stopping(b, &pod_name);
    }
    if !pod::built_from(pod, workspace) {
        return replacing::spec_changed(b, current.uid, &pod_name);
    }
    // A pod its kubelet rejected is replaced, a bounded number of times (rules C10-C12).
    if let Some(rejection) = crate::rejection::detect(pod, &policy.rejections) {
        return replacing::rejected(b, rejection, &current, &lifecycle.recreation, slow);
    }
    // A pod whose node is gone is replaced at once, and counted apart (rule C13).
    if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Unknown") {
        return replacing::node_lost(b, &current);
    }
    b.scheduled(&current);
    if pod_is_ready(pod) {
        return running::running(b, &current, observed, &lifecycle, policy);
    }
    starting::starting(b, &current, observed, lifecycle.start_timeout, policy)
}

impl<'a> Builder<'a> {
    fn new(
        observed: &Observed<'a>,
        old: &'a WorkspaceStatus,
        policy: &Policy,
        now: Timestamp,
    ) -> Self {
        let workspace = observed.workspace;
        let mut status = old.clone();
        status.observed_generation = workspace.metadata.generation;
        let admission = admission_record(observed, old);
        status.admission = admission.clone();
        Builder {
            status,
            generation: workspace.metadata.generation,
            now: time(now),
            actions: vec![],
            notices: vec![],
            old,
            recreation: None,
            refusal: observed
                .refusal
                .filter(|r| r.generation == workspace.metadata.generation)
                .map(|r| (r, workspace.name_any())),
            max_requeue: policy.max_requeue,
            growing: None,
            release: false,
            expectations: observed.expectations,
            taken: taken(observed),
            admission_missing: match (observed.admission, &admission) {
                (_, None) => None,
                (Some(missing), Some(record)) => Some((
                    Reason::AdmissionNotInstalled,
                    admission_message(workspace, missing, record),
                )),
                (None, Some(record)) if !record.checked => Some((
                    Reason::AdmissionUnchecked,
                    unchecked_message(workspace, record),
                )),
                (None, Some(_)) => None,
            },
        }
    }
}

/// Whether admission checked the spec as it is, for a workspace that names other objects or a
/// kind (a workspace of a kind rests on admission too: who may use the kind, and whose record
/// its pods are built from); None for one that names nothing. The record of this generation
/// and `berth.dev/check` value when there is one; else judged now: checked when the policy
/// enforces and the operator did not see it begin to after this version was written.
fn admission_record(
    observed: &Observed<'_>,
    old: &WorkspaceStatus,
) -> Option<Box<AdmissionRecord>> {
    let workspace = observed.workspace;
    if workspace.spec.kind.is_none() && workspace.spec.references().is_empty() {
        return None;
    }
    let generation = workspace.metadata.generation.unwrap_or_default();
    let spec = admitted_spec(&workspace.spec);
    let check = workspace
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(berth_api::labels::CHECK))
        .cloned()
        .unwrap_or_default();
    if let Some(record) = old
        .admission
        .as_ref()
        .filter(|r| r.spec == spec && r.check == check)
    {
        return Some(record.clone());
    }
    let written = workspace
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok());
    let before_enforcing = matches!(
        (written, observed.admission_since),
        (Some(written), Some(since)) if written <= since
    );
    Some(Box::new(AdmissionRecord {
        spec,
        generation,
        check,
        checked: observed.admission.is_none() && !before_enforcing,
    }))
}

/// A hash of the spec as admission checks it: all of it but `paused` (starting and stopping
/// name nothing, so the policy lets them through unchecked).
fn admitted_spec(spec: &berth_api::WorkspaceSpec) -> String {
    use sha2::{Digest, Sha256};
    let mut spec = spec.clone();
    spec.paused = false;
    let text = serde_json::to_string(&spec).expect("a spec serializes to JSON");
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What a workspace whose spec was written while nothing checked it says.
fn unchecked_message(workspace: &Workspace, record: &AdmissionRecord) -> String {
    format!(
        "No pod: this spec (generation {}) was written while the admission policy was not enforcing, so nothing checked that its author may use what {} names. To have it checked, its author sets a new value of the annotation {}: kubectl annotate workspace {} {}=$(date +%s) --overwrite; it then starts, or the API server says what its author may not use.",
        record.generation,
        named_fields(workspace).join(", "),
        berth_api::labels::CHECK,
        workspace.name_any(),
        berth_api::labels::CHECK,
    )
}

impl Builder<'_> {
    /// The claim and the service follow the spec, whatever the pod does.
    fn storage_and_service(&mut self, observed: &Observed<'_>) {
        let workspace = observed.workspace;
        match (pod::build_claim(workspace), observed.claim) {
            (Some(_), None) => self.actions.push(Action::CreateClaim),
            (Some(wanted), Some(claim)) if is_owned_by(&claim.metadata, workspace) => {
                // The claim grows with home.size (it never shrinks: the CRD refuses that).
                let (requested, capacity) = (pod::claim_request(claim), pod::claim_capacity(claim));
                let size = pod::claim_request(&wanted);
                if pod::storage_less(requested.as_ref(), size.as_ref()) {
                    self.actions.push(Action::ResizeClaim {
                        uid: claim.uid().unwrap_or_default(),
                    });
                }
                if pod::storage_less(capacity.as_ref(), size.as_ref()) {
                    self.growing = Some(growing(claim, size.as_ref()));
                }
            }
            _ => {}
        }
        match (pod::build_service(workspace).is_some(), observed.service) {
            (true, None) => self.actions.push(Action::CreateService),
            (true, Some(s))
                if is_owned_by(&s.metadata, workspace)
                    && !pod::service_ports_match(s, workspace) =>
            {
                self.actions.push(Action::UpdateService {
                    uid: s.uid().unwrap_or_default(),
                })
            }
            (false, Some(s)) if is_owned_by(&s.metadata, workspace) => {
                self.actions.push(Action::DeleteService {
                    uid: s.uid().unwrap_or_default(),
                })
            }
            _ => {}
        }
    }

    /// A workspace paused (by its user or for idleness) that is not any more says so.
    fn resumed(&mut self) {
        if matches!(self.old.phase, Some(Phase::Stopped | Phase::Stopping))
            && self
                .old
                .conditions
                .iter()
                .any(|c| c.has_reason(&Reason::Paused) || c.has_reason(&Reason::Idle))
        {
            self.notices.push(Notice::normal(
                event_reasons::RESUMED,
                "Workspace resumed: creating its pod".into(),
            ));
        }
    }

    /// What Berth said when it gave up on a start of this very spec (rules C9, C12); a stall
    /// of an older generation is forgotten instead: a new generation starts again.
    fn gave_up_on_this_spec(&mut self) -> Option<String> {
        let stalled = find_condition(&self.old.conditions, types::STALLED)
            .filter(|c| c.is(ConditionStatus::True))?;
        if stalled.observed_generation == self.generation
            && !SPEC_VERDICTS.contains(&stalled.reason())
        {
            return Some(stalled.message.clone());
        }
        self.forget(Scope::Start);
        self.status.started_at = None;
        self.status.pod_recreations = None;
        None
    }

    /// The pod vanished without Berth deleting it: the last status named a pod of this spec,
    /// in a phase where it existed, and no rejection explains its absence.
    fn lost_its_pod(&self) -> bool {
        let rejected = find_condition(&self.status.conditions, types::POD_REJECTED)
            .is_some_and(|c| c.is(ConditionStatus::True));
        !rejected
            && self.old.observed_generation == self.generation
            && self.old.pod.as_ref().is_some_and(|p| p.uid.is_some())
            && matches!(
                self.old.phase,
                Some(Phase::Running | Phase::Starting | Phase::Error | Phase::Unknown)
            )
    }

    /// The pod is the workspace's: the status names it, and the events tell only what
    /// happened (rule C17), once per pod: `Created` once the pod exists, `Started` once one
    /// of its containers is first seen running (`status.pod.startedAt` remembers it).
    fn saw_pod<'p>(&mut self, pod: &'p CachedPod, pod_name: &'p str) -> Current<'p> {
        let uid = pod.uid().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        // Rule C14: an agent is verified once per pod; a new pod is checked again.
        let agent_verified = self
            .old
            .agent
            .as_ref()
            .and_then(|a| a.verified_pod_uid.as_deref())
            == Some(uid.as_str());
        if !agent_verified {
            self.status.agent = None;
        }
        let new_pod = self.old.pod.as_ref().and_then(|p| p.uid.as_deref()) != Some(uid.as_str());
        // `Started` is told once per pod: when one of its containers is first seen running.
        // Its containers may stop and run again (a crash, a restart); that is no new start.
        let before = |at: fn(&PodRef) -> &Option<Time>| match new_pod {
            true => None,
            false => self.old.pod.as_ref().and_then(|p| at(p).clone()),
        };
        let started_before = before(|p| &p.started_at);
        let starts_now = started_before.is_none() && containers_running(pod);
        self.status.pod = Some(PodRef {
            name: pod_name.to_owned(),
            uid: Some(uid.clone()),
            ip: ip.clone(),
            node_name: node.clone(),
            started_at: started_before.or_else(|| starts_now.then(|| time(self.now.0))),
            ready_at: before(|p| &p.ready_at),
        });
        if new_pod {
            self.notices.push(Notice::normal(
                event_reasons::CREATED,
                format!("Created pod {pod_name}"),
            ));
            // The last activity is the current pod's: a new pod (resumed, replaced) has not
            // been used yet, whatever the one before it was.
            self.status.last_activity = None;
            self.status.last_activity_signal = None;
        }
        if starts_now {
            self.notices.push(Notice::normal(
                event_reasons::STARTED,
                format!(
                    "Pod {pod_name} started on {} ({})",
                    node.as_deref().unwrap_or("its node"),
                    ip.as_deref().unwrap_or("no IP")
                ),
            ));
        }
        Current {
            pod,
            name: pod_name,
            uid,
            agent_verified,
        }
    }
}

/// The fields of the spec that name other objects, for admission's messages.
fn named_fields(workspace: &Workspace) -> Vec<String> {
    let mut fields: Vec<String> = workspace
        .spec
        .references()
        .into_iter()
        .map(|r| r.field)
        .collect();
    if workspace.spec.kind.is_some() {
        fields.insert(0, "spec.kind".to_owned());
    }
    fields
}

/// What a workspace that names other objects says while the admission policy is missing.
fn admission_message(workspace: &Workspace, missing: &str, record: &AdmissionRecord) -> String {
    let then = match record.checked {
        true => "the workspace then starts by itself".to_owned(),
        false => format!(
            "this spec was written meanwhile, so it is checked once its author sets a new value of the annotation {}",
            berth_api::labels::CHECK
        ),
    };
    format!(
        "No pod until the admission policy is installed; nothing checked that this workspace's author may use what {} names ({missing}). Install it with kubectl apply -k deploy/ (Kubernetes 1.30+); {then}.",
        named_fields(workspace).join(", "),
    )
}

impl Builder<'_> {
    /// Closed when absent: a workspace that names another object gets no pod while the
    /// admission policy that checks its author may use it is not installed and enforcing;
    /// `Error`, reason `AdmissionNotInstalled` (a Warning once). A pod it already has is left
    /// alone (it was admitted). Looked at again with the growing requeue, and at once when a
    /// policy or binding changes. Returns the requeue.
    fn closed_without_admission(&mut self, requeue: Duration) -> Duration {
        let Some((reason, message)) = self.admission_missing.clone() else {
            return requeue;
        };
        if !self.actions.contains(&Action::CreatePod)
            || matches!(self.status.phase, Some(Phase::Failed | Phase::Terminating))
        {
            return requeue;
        }
        self.actions.retain(|a| *a != Action::CreatePod);
        self.condition(types::READY, ConditionStatus::False, reason, &message);
        self.status.ready_at = None;
        self.phase(Phase::Error, message);
        let waited = elapsed(self.status.started_at.as_ref(), self.now.0);
        requeue.min(requeue_interval(waited, self.max_requeue))
    }
}

/// The objects of the names the workspace needs that are someone else's: those its creates met,
/// and those the caches show that it does not own. A claim counts while the spec has a home
/// volume, a service while it has ports, a pod always (whether it is needed is decided with
/// the create, see [`Builder::name_taken`]).
fn taken(observed: &Observed<'_>) -> Vec<Foreign> {
    let workspace = observed.workspace;
    let cached = [
        observed
            .pod
            .and_then(|p| Foreign::of(Derived::Pod, &p.metadata, workspace, None)),
        observed
            .claim
            .and_then(|c| Foreign::of(Derived::Claim, &c.metadata, workspace, None)),
        observed
            .service
            .and_then(|s| Foreign::of(Derived::Service, &s.metadata, workspace, None)),
    ];
    let mut taken: Vec<Foreign> = cached.into_iter().flatten().collect();
    for met in observed.taken {
        if !taken.iter().any(|f| f.kind == met.kind) {
            taken.push(met.clone());
        }
    }
    taken.retain(|f| match f.kind {
        Derived::Pod => true,
        Derived::Claim => pod::build_claim(workspace).is_some(),
        Derived::Service => !workspace.spec.ports.is_empty(),
    });
    taken.sort_by_key(|f| f.kind);
    taken
}

impl Builder<'_> {
    /// A name is not ownership: nothing is created over a name someone else's object holds,
    /// and no pod while its home claim's name is taken (it would mount that claim). The
    /// workspace is `Error`, reason `NameTaken`, naming the object and its owner (a Warning
    /// once, through [`Builder::explain_error`]); what it already runs is left alone. A create
    /// that met the object is tried again after a doubling wait (the caches show only objects
    /// labelled as Berth's); one the caches show is looked at again with the growing requeue.
    /// A paused workspace creates nothing over a taken name either, and says so once it
    /// starts. Returns the requeue.
    fn name_taken(&mut self, requeue: Duration) -> Duration {
        if self.taken.is_empty()
            || matches!(self.status.phase, Some(Phase::Failed | Phase::Terminating))
        {
            return requeue;
        }
        let (now, cap) = (self.now.0, self.max_requeue);
        let wants_pod = self.actions.contains(&Action::CreatePod);
        let due = |f: &Foreign| f.look_again_in(now, cap).is_some_and(|w| w.is_zero());
        let claim_held = self
            .taken
            .iter()
            .any(|f| f.kind == Derived::Claim && !due(f));
        // Said once per derive: nothing looks at it after this.
        let taken = std::mem::take(&mut self.taken);
        let relevant: Vec<&Foreign> = taken
            .iter()
            .filter(|f| f.kind != Derived::Pod || wants_pod)
            .collect();
        let mut requeue = requeue;
        if let Some(first) = relevant.first() {
            self.actions.retain(|a| {
                let held = relevant.iter().any(|f| f.kind.create() == *a && !due(f));
                !(held || (claim_held && *a == Action::CreatePod))
            });
            let again = relevant
                .iter()
                .filter_map(|f| f.look_again_in(now, cap))
                .filter(|w| !w.is_zero())
                .min()
                .unwrap_or_else(|| {
                    requeue_interval(elapsed(self.status.started_at.as_ref(), now), cap)
                });
            requeue = requeue.min(again);
            // A stopped workspace stays stopped; it says what is in its way when it starts.
            if matches!(self.status.phase, Some(Phase::Stopped | Phase::Stopping)) {
                return requeue;
            }
            let message = first.message();
            self.condition(
                types::READY,
                ConditionStatus::False,
                Reason::NameTaken,
                &message,
            );
            self.status.ready_at = None;
            self.phase(Phase::Error, message);
        }
        requeue
    }
}

/// The wait before reconciling again after the `attempt`th failed reconcile in a row (rule
/// C19): 500 ms, 1 s, 2 s ... up to `cap`.
pub fn retry_after_error(attempt: u32, cap: Duration) -> Duration {
    Duration::from_millis(250)
        .saturating_mul(1 << attempt.min(8))
        .min(cap)
}

/// `10m`, `90s`, `1h30m`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s == 0 && !d.is_zero() {
        return format!("{}ms", d.as_millis());
    }
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

impl Builder<'_> {
    /// The decision, with a refused action accounted for: while the decision still asks for
    /// the action the API server refused, the workspace is `Error` with the API server's words
    /// (a Warning event when the refusal is fresh), and the action waits out its backoff.
    fn finish(mut self, mut requeue: Duration) -> Decision {
        // A create the caches do not show yet is not sent again.
        let (expectations, now) = (self.expectations, self.now.0);
        self.actions.retain(|a| !expectations.covers(a, now));
        requeue = self.name_taken(requeue);
        requeue = self.closed_without_admission(requeue);
        let still_wanted = self
            .refusal
            .as_ref()
            .filter(|(r, _)| self.actions.contains(&r.action));
        if let Some((refused, workspace)) = still_wanted.cloned()
            && !matches!(self.status.phase, Some(Phase::Failed | Phase::Terminating))
        {
            // What is wrong leads (the column `kubectl get ws` shows), the API server's own
            // words follow.
            let text = format!(
                "Cannot {} ({}); the API server said: {}",
                refused.action.describe(&workspace),
                refused.reason,
                refused.message
            );
            // A stopped workspace keeps saying why it is stopped (Paused, Idle) in its Ready
            // condition, which is what tells it was said already.
            if !matches!(self.status.phase, Some(Phase::Stopped | Phase::Stopping)) {
                self.condition(
                    types::READY,
                    ConditionStatus::False,
                    refused.reason.as_str(),
                    &text,
                );
            }
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
        self.not_ready_unless_running();
        self.became_ready();
        self.explain_error();
        self.status.summary = self.status.message.as_deref().map(berth_api::summary);
        // Counted from 0, so `kubectl get ws` shows RECREATIONS 0 rather than nothing.
        self.status.pod_recreations.get_or_insert(0);
        Decision {
            status: self.status,
            actions: self.actions,
            notices: self.notices,
            requeue,
            recreation: self.recreation,
            release: self.release,
        }
    }

    /// READY is True only while the workspace is `Running`: a pod on its way out (replaced,
    /// stopping, the workspace deleted) may still be ready, and the workspace says it is not.
    fn not_ready_unless_running(&mut self) {
        let ready = find_condition(&self.status.conditions, types::READY)
            .is_some_and(|c| c.is(ConditionStatus::True));
        if ready && self.status.phase != Some(Phase::Running) {
            let message = self.status.message.clone().unwrap_or_default();
            self.condition(
                types::READY,
                ConditionStatus::False,
                Reason::PodStopping,
                &message,
            );
        }
    }

    /// READY turning True sets `readyAt`, and is told once per pod (`status.pod.readyAt`):
    /// decided last, after whatever holds it False (a name taken, a refusal, the pod
    /// stopping), so a workspace never says it is ready while its status says it is not, nor
    /// says it again each time it is looked at or its pod's readiness flaps.
    fn became_ready(&mut self) {
        let ready = |conditions: &[Condition]| {
            find_condition(conditions, types::READY).is_some_and(|c| c.is(ConditionStatus::True))
        };
        if !ready(&self.status.conditions) || ready(&self.old.conditions) {
            return;
        }
        self.status.ready_at = Some(time(self.now.0));
        if let Some(pod) = self.status.pod.as_mut().filter(|p| p.ready_at.is_none()) {
            pod.ready_at = Some(time(self.now.0));
            self.notices.push(Notice::normal(
                event_reasons::READY,
                "Workspace is ready".into(),
            ));
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
        let before = find_condition(&self.old.conditions, types::READY).map(HasReason::reason);
        if self.old.phase == Some(Phase::Error) && before == Some(ready.reason()) {
            return;
        }
        let note = self.status.message.clone().unwrap_or_default();
        self.notices.push(Notice::warning(ready.reason(), note));
    }
}

mod content;
mod replacing;
mod running;
mod starting;
mod stopping;

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
