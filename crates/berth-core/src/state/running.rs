//! The running family: a ready pod whose agent must authenticate the operator before the
//! workspace is Ready (rules C14, C15), and, with an idle timeout, is asked when it was last
//! used.

use std::time::Duration;

use berth_api::{
    AgentStatus, ConditionStatus, Phase,
    condition::{Reason, event_reasons, types},
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{
    Action, AgentOutcome, Builder, Current, Decision, Lifecycle, Notice, Observed, content::Hold,
    human,
};
use crate::config::Policy;
use crate::idle::{self, ActivityCheck, ActivityOutcome};

/// A ready pod: Running once its agent authenticated the operator (once per pod); an agent
/// that fails keeps the pod, says why and is retried with backoff (the pod is never touched
/// for it).
pub(super) fn running(
    mut b: Builder<'_>,
    current: &Current<'_>,
    observed: &Observed<'_>,
    lifecycle: &Lifecycle,
    policy: &Policy,
) -> Decision {
    let (pod_name, uid) = (current.name, &current.uid);
    let (slow, max_requeue) = (policy.resync, policy.max_requeue);
    b.condition(
        types::POD_READY,
        ConditionStatus::True,
        Reason::ContainersReady,
        "All containers are ready",
    );
    if !current.agent_verified {
        // Rule C14: Ready only once the agent authenticated the operator; rule C15: a
        // failure keeps the pod untouched, says why, and is retried with backoff.
        let check = observed.agent.filter(|c| c.pod_uid == *uid);
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
                    Reason::AgentVerified,
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
                b.condition(
                    types::AGENT_READY,
                    ConditionStatus::False,
                    reason.clone(),
                    message,
                );
                b.condition(
                    types::READY,
                    ConditionStatus::False,
                    reason.clone(),
                    message,
                );
                let what = match reason {
                    Reason::AgentUnreachable => "cannot be reached",
                    Reason::Unauthenticated | Reason::PermissionDenied => "refused the operator",
                    Reason::IdentityMismatch => "is not to be trusted",
                    _ => "could not be checked",
                };
                let text = format!(
                    "The agent of pod {pod_name} {what} ({reason}); it was called at {}: {message}. The pod is kept; Berth keeps retrying.",
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
                    Reason::Unknown,
                    &message,
                );
                b.condition(
                    types::READY,
                    ConditionStatus::False,
                    Reason::Unknown,
                    &message,
                );
                b.phase(Phase::Starting, message);
                // The check runs in the background and wakes the workspace when it ends.
                return b.finish(max_requeue);
            }
        }
    }
    // Ready only once the content is in place (the agent clones before the command starts).
    match b.content_holds(
        observed.workspace,
        observed.content,
        uid,
        pod_name,
        (policy.progress_interval, lifecycle.start_timeout),
    ) {
        Some(Hold::Wait(wait)) => return b.finish(wait),
        Some(Hold::GiveUp(text)) => {
            b.actions.push(Action::DeletePod { uid: uid.clone() });
            return b.start_timed_out(text, slow);
        }
        None => {}
    }
    b.condition(
        types::READY,
        ConditionStatus::True,
        Reason::WorkspaceReady,
        "Workspace is running",
    );
    // Said (and `readyAt` set) by `finish`, once nothing holds READY False any more.
    b.phase(Phase::Running, "Workspace is running");
    match lifecycle.idle_timeout {
        Some(timeout) => {
            let check = observed.activity.filter(|c| c.pod_uid == *uid);
            b.running_until_idle(timeout, check, pod_name, slow)
        }
        None => b.finish(slow),
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
    pub(super) fn running_until_idle(
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
            self.condition(types::READY, ConditionStatus::False, Reason::Idle, &text);
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
}
