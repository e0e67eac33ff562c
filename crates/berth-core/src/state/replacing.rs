//! The replacing families: a pod its kubelet rejected, a pod whose node was lost, a pod that
//! vanished, and a pod built from an older spec, each replaced (rules C10-C13).

use std::time::Duration;

use berth_api::{
    ConditionStatus, Phase, PodRecreationPolicy,
    condition::{HasReason, Reason, Scope, event_reasons, types},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::{Action, Builder, Current, Decision, Notice, Recreation};
use crate::rejection::Rejection;

/// A pod rejected by its kubelet or lost with its node, and gone (rule C12, C13): a new one
/// once the delay has passed (at once for a lost node), counted.
pub(super) fn replacing(
    mut b: Builder<'_>,
    condition: &Condition,
    recreation: &PodRecreationPolicy,
    pod_name: &str,
) -> Decision {
    let now = b.now.0;
    // The rejected (or lost) pod is gone: replace it once the delay has passed.
    let node_lost = condition.has_reason(&Reason::NodeLost);
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
        reason: condition.reason(),
        attempt: attempt.max(1),
    });
    b.notices
        .push(Notice::normal(event_reasons::RECREATING, note));
    b.condition(
        types::POD_REJECTED,
        ConditionStatus::False,
        Reason::PodRecreated,
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

/// The pod vanished without Berth deleting it (its node was deleted, or someone removed it):
/// it is started again, counted with the lost nodes.
pub(super) fn vanished(b: &mut Builder<'_>, pod_name: &str) {
    b.recreation = Some(Recreation {
        reason: Reason::NodeLost,
        attempt: 1,
    });
    b.notices.push(Notice::warning(
        Reason::NodeLost,
        format!(
            "Pod {pod_name} disappeared (its node was deleted or it was evicted); creating it again"
        ),
    ));
}

/// The pod was built from an older spec: it goes, and the new spec starts afresh.
pub(super) fn spec_changed(mut b: Builder<'_>, uid: String, pod_name: &str) -> Decision {
    b.actions.push(Action::DeletePod { uid });
    b.status.started_at = Some(b.now.clone());
    b.status.ready_at = None;
    // A spec change is a new start: the recreation count starts over.
    b.status.pod_recreations = None;
    b.forget(Scope::Start);
    b.phase(
        Phase::Stopping,
        format!("Replacing pod {pod_name}: the workspace spec changed"),
    );
    b.finish(Duration::from_secs(1))
}

/// A pod its kubelet rejected (rules C10-C12): deleted, and replaced once it is gone, up to
/// `maxRecreations` times; then the start fails, visibly and for good.
pub(super) fn rejected(
    mut b: Builder<'_>,
    rejected: Rejection,
    current: &Current<'_>,
    recreation: &PodRecreationPolicy,
    slow: Duration,
) -> Decision {
    let pod_name = current.name;
    let replaced = b.status.pod_recreations.unwrap_or(0);
    let node = rejected
        .node
        .clone()
        .unwrap_or_else(|| "its node".to_owned());
    b.actions.push(Action::DeletePod {
        uid: current.uid.clone(),
    });
    // The pod is named until it is gone; a rejection is told once.
    let told = b.already_said(types::POD_REJECTED, &Reason::parse(&rejected.reason));
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
            Reason::RecreationLimitReached,
            &text,
        );
        b.condition(
            types::STALLED,
            ConditionStatus::True,
            Reason::RecreationLimitReached,
            &text,
        );
        b.condition(
            types::READY,
            ConditionStatus::False,
            Reason::RecreationLimitReached,
            &text,
        );
        b.notices.push(Notice::warning(
            Reason::RecreationLimitReached,
            text.clone(),
        ));
        b.phase(Phase::Failed, text);
        return b.finish(slow);
    }
    b.condition(
        types::POD_REJECTED,
        ConditionStatus::True,
        rejected.reason.as_str(),
        &rejected.message,
    );
    b.condition(
        types::READY,
        ConditionStatus::False,
        rejected.reason.as_str(),
        &rejected.message,
    );
    if !told {
        b.notices.push(Notice::warning(
            event_reasons::POD_REJECTED,
            format!(
                "Pod {pod_name} was rejected by {node}: {}",
                rejected.message
            ),
        ));
    }
    b.phase(
        Phase::Starting,
        format!(
            "Pod rejected by {node} ({}); creating a new pod (attempt {} of {})",
            rejected.reason,
            replaced + 1,
            recreation.max
        ),
    );
    b.finish(recreation.delay.max(Duration::from_millis(100)))
}

/// A pod whose node is lost (rule C13): deleted at once (its node will never stop it) and
/// replaced without counting against `maxRecreations`.
pub(super) fn node_lost(mut b: Builder<'_>, current: &Current<'_>) -> Decision {
    let pod_name = current.name;
    let pod = current.pod;
    let text = pod
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_else(|| format!("The node of pod {pod_name} is lost"));
    b.actions.push(Action::ForceDeletePod {
        uid: current.uid.clone(),
    });
    // The pod is named until it is gone; its lost node is told once.
    let told = b.already_said(types::POD_REJECTED, &Reason::NodeLost);
    b.status.ready_at = None;
    b.condition(
        types::POD_REJECTED,
        ConditionStatus::True,
        Reason::NodeLost,
        &text,
    );
    b.condition(
        types::READY,
        ConditionStatus::False,
        Reason::NodeLost,
        &text,
    );
    if !told {
        b.notices.push(Notice::warning(
            Reason::NodeLost,
            format!("{text}; replacing pod {pod_name}"),
        ));
    }
    b.phase(Phase::Unknown, format!("{text}; replacing the pod"));
    b.finish(Duration::from_secs(1))
}
