//! The starting families: no pod yet (create it), and a pod that is not ready (say why, in
//! the kubelet's and the scheduler's words, and give up after `startTimeout` without
//! progress).

use std::time::Duration;

use crate::cached_pod::CachedPod;
use berth_api::{
    ConditionStatus, Phase,
    condition::{
        ConditionType, HasReason, HasStatus, Reason, find_condition, pod_conditions, types,
    },
};

use super::{
    Action, Builder, Current, Decision, Notice, Observed, containers_running, content::Hold,
    elapsed, human, requeue_interval, signal, waiting,
};
use crate::config::Policy;

/// No pod (rule C4): create it, Pending; a create the API server keeps refusing fails the
/// start after `startTimeout` (rule C9), counted from the first attempt.
pub(super) fn creating(
    mut b: Builder<'_>,
    pod_name: &str,
    start_timeout: Duration,
    slow: Duration,
) -> Decision {
    let now = b.now.0;
    b.actions.push(Action::CreatePod);
    if b.status.started_at.is_none() {
        b.status.started_at = Some(b.now.clone());
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

/// The conditions whose transitions are a start's progress (rule C9): the pod bound, its
/// containers ready (or not any more), a rejected pod replaced. Nothing else resets the start
/// timeout: not AgentReady (waiting for the pod before its agent is checked is no progress),
/// and not a condition Berth does not know (another controller's).
const START_STEPS: [ConditionType; 4] = [
    ConditionType::PodScheduled,
    ConditionType::PodReady,
    ConditionType::PodRejected,
    ConditionType::Ready,
];

/// A pod that is not ready (rules C5-C9): the first thing wrong (or happening) is the Ready
/// reason, in the kubelet's or the scheduler's words; a start with no progress for
/// `startTimeout` gives up and frees its node.
pub(super) fn starting(
    mut b: Builder<'_>,
    current: &Current<'_>,
    observed: &Observed<'_>,
    start_timeout: Duration,
    policy: &Policy,
) -> Decision {
    let (warnings, workspace, content) = (observed.warnings, observed.workspace, observed.content);
    let Current {
        pod,
        name: pod_name,
        agent_verified,
        ..
    } = *current;
    let (now, slow) = (b.now.0, policy.resync);
    b.status.ready_at = None;
    let pod_phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let signal = signal(pod, warnings, policy);
    // A pod that ran to its end: the container's own words first (a pod that ran and then
    // failed crashed).
    let ended = matches!(pod_phase.as_str(), "Failed" | "Succeeded").then(|| ended(pod, pod_name));
    let (reason, message) = match (&ended, &signal) {
        (Some(end), _) => end.clone(),
        (None, Some(s)) => (s.reason.clone(), s.message.clone()),
        (None, None) => {
            let waiting = waiting(
                pod.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref()),
            )
            .map(|w| Reason::parse(&w.0));
            match waiting {
                None if containers_running(pod) => (
                    Reason::ContainersNotReady,
                    format!("Pod {pod_name} is running; waiting for its containers to be ready"),
                ),
                waiting => {
                    let reason = waiting.unwrap_or(Reason::ContainerCreating);
                    (
                        reason.clone(),
                        format!("Pod {pod_name} is starting ({reason})"),
                    )
                }
            }
        }
    };
    b.condition(types::POD_READY, ConditionStatus::False, reason, &message);
    if !agent_verified {
        b.agent_waits_for(pod_name);
    }
    let first_false = find_condition(&b.status.conditions, types::POD_SCHEDULED)
        .filter(|c| !c.is(ConditionStatus::True))
        .or_else(|| find_condition(&b.status.conditions, types::POD_READY))
        .cloned();
    // What the start waits on first: the scheduler, then the containers.
    let waits_on = match first_false {
        Some(c) => {
            b.condition(types::READY, ConditionStatus::False, c.reason(), &c.message);
            c.message
        }
        None => message.clone(),
    };

    // A running pod whose agent is still putting the content in place says so.
    if ended.is_none() && signal.is_none() && crate::content::agent_running(pod) {
        let timing = (policy.progress_interval, start_timeout);
        match b.content_holds(workspace, content, &current.uid, pod_name, timing) {
            Some(Hold::Wait(wait)) => return b.finish(wait),
            Some(Hold::GiveUp(text)) => {
                b.actions.push(Action::DeletePod {
                    uid: current.uid.clone(),
                });
                return b.start_timed_out(text, slow);
            }
            None => {}
        }
    }
    // (A pod in phase Unknown never comes here: its node is lost, `replacing::node_lost`.)
    match &signal {
        _ if ended.is_some() => b.phase(Phase::Error, message.clone()),
        Some(s) if s.error => b.phase(Phase::Error, s.message.clone()),
        Some(s) => b.phase(Phase::Starting, s.message.clone()),
        None => b.phase(Phase::Starting, waits_on),
    }

    // No progress for startTimeout: give up and free the node (rule C9).
    let last_progress = b
        .status
        .conditions
        .iter()
        .filter(|c| ConditionType::parse(&c.type_).is_some_and(|t| START_STEPS.contains(&t)))
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
        b.actions.push(Action::DeletePod {
            uid: current.uid.clone(),
        });
        return b.start_timed_out(text, slow);
    }
    let wait = requeue_interval(
        elapsed(b.status.started_at.as_ref(), now),
        policy.max_requeue,
    )
    .min(start_timeout - stuck_for);
    b.finish(wait.max(Duration::from_millis(100)))
}

/// A pod that ran to its end (phase Failed or Succeeded): the Ready reason and what to say,
/// in the container's own words first (its terminated reason, `Error`, `OOMKilled` or
/// `Completed`), then the pod's.
fn ended(pod: &CachedPod, pod_name: &str) -> (Reason, String) {
    let status = pod.status.as_ref();
    let failed = status.and_then(|s| s.phase.as_deref()) == Some("Failed");
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find_map(|c| c.state.as_ref()?.terminated.clone()));
    let pod_reason = status.and_then(|s| s.reason.clone());
    let why = pod_reason
        .clone()
        .zip(status.and_then(|s| s.message.clone()))
        .map(|(r, m)| format!("{r}: {m}"));
    let reason = terminated
        .as_ref()
        .and_then(|t| t.reason.clone())
        .or(pod_reason)
        .map(Reason::from)
        .unwrap_or(if failed {
            Reason::PodFailed
        } else {
            Reason::PodCompleted
        });
    let text = terminated
        .map(|t| {
            format!(
                "container exited with code {}{}{}",
                t.exit_code,
                t.reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                t.message.map(|m| format!(": {m}")).unwrap_or_default()
            )
        })
        .or(why)
        .unwrap_or_else(|| format!("pod phase {}", if failed { "Failed" } else { "Succeeded" }));
    let verb = if failed { "failed" } else { "exited" };
    (reason, format!("Pod {pod_name} {verb}: {text}"))
}

impl Builder<'_> {
    /// PodScheduled from the pod's own condition, in the scheduler's words.
    pub(super) fn scheduled(&mut self, current: &Current<'_>) {
        let b = self;
        let (pod, pod_name) = (current.pod, current.name);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == pod_conditions::POD_SCHEDULED))
            .cloned();
        match scheduled {
            Some(c) if c.is(ConditionStatus::True) => {
                let message = format!("Pod {pod_name} is bound to {}", node.unwrap_or("a node"));
                b.condition(
                    types::POD_SCHEDULED,
                    ConditionStatus::True,
                    Reason::Scheduled,
                    &message,
                )
            }
            Some(c) => {
                let reason = c
                    .reason
                    .as_deref()
                    .map_or(Reason::Unschedulable, Reason::parse);
                b.condition(
                    types::POD_SCHEDULED,
                    ConditionStatus::False,
                    reason,
                    c.message.as_deref().unwrap_or(""),
                );
            }
            None => b.condition(
                types::POD_SCHEDULED,
                ConditionStatus::False,
                Reason::WaitingForScheduler,
                &format!("Pod {pod_name} waits for the scheduler"),
            ),
        }
    }

    /// Gives up on a start that made no progress for `startTimeout` (rule C9).
    pub(super) fn start_timed_out(mut self, text: String, requeue: Duration) -> Decision {
        self.condition(
            types::STALLED,
            ConditionStatus::True,
            Reason::StartTimeout,
            &text,
        );
        self.condition(
            types::READY,
            ConditionStatus::False,
            Reason::StartTimeout,
            &text,
        );
        self.notices
            .push(Notice::warning(Reason::StartTimeout, text.clone()));
        self.phase(Phase::Failed, text);
        self.finish(requeue)
    }
}
