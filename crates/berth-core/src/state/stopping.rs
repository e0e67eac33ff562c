//! The stopping families: a workspace being deleted, paused, or given up on, and a pod on its
//! way out.

use std::time::Duration;

use crate::cached_pod::CachedPod;
use berth_api::{
    ConditionStatus, Phase,
    condition::{HasReason, Reason, Scope, event_reasons, find_condition, types},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::{Action, Builder, Decision, Notice, elapsed, human};

/// A workspace being deleted (rule C18): the pod stops first; the finalizer goes once it is
/// gone. A pod still there when the deletion grace has run out is deleted at once (its node
/// may never stop it) and the finalizer goes anyway, with a Warning saying so.
pub(super) fn deleting(
    mut b: Builder<'_>,
    owned_pod: Option<&CachedPod>,
    pod_name: &str,
    grace: Duration,
    since: Option<&Time>,
) -> Decision {
    let Some(p) = owned_pod else {
        b.release = true;
        b.phase(Phase::Terminating, "Workspace is being deleted");
        return b.finish(Duration::from_secs(1));
    };
    let uid = p.uid().unwrap_or_default();
    let deleting_for = elapsed(since, b.now.0);
    if deleting_for >= grace {
        b.actions.push(Action::ForceDeletePod { uid });
        b.release = true;
        let text = format!(
            "Pod {pod_name} did not stop within the deletion grace period ({}); it is deleted at once and the workspace goes",
            human(grace)
        );
        b.notices.push(Notice::warning(
            event_reasons::DELETION_GRACE_EXPIRED,
            text.clone(),
        ));
        b.phase(Phase::Terminating, text);
        return b.finish(Duration::from_secs(1));
    }
    if p.metadata.deletion_timestamp.is_none() {
        b.actions.push(Action::DeletePod { uid });
    }
    b.phase(
        Phase::Terminating,
        format!("Stopping pod {pod_name} before the workspace is deleted"),
    );
    // Looked at again within a second, and at once when the pod is gone (its watch wakes the
    // workspace); never past the end of the grace period.
    b.finish(Duration::from_secs(1).min(grace - deleting_for))
}

/// A paused workspace (by its user, or culled for idleness): its pod goes, its storage stays;
/// Stopping until the pod is gone, then Stopped.
pub(super) fn paused(
    mut b: Builder<'_>,
    owned_pod: Option<&CachedPod>,
    pod_name: &str,
    slow: Duration,
) -> Decision {
    b.forget(Scope::Start);
    b.status.started_at = None;
    b.status.pod_recreations = None;
    // Paused by Berth because nobody used it: it says so until it is resumed.
    let culled = find_condition(&b.old.conditions, types::READY)
        .filter(|c| c.has_reason(&Reason::Idle))
        .map(|c| c.message.clone());
    // Said once: a refused action may have made the last status Error, and its Ready
    // condition still says Paused.
    let said = matches!(b.old.phase, Some(Phase::Stopping | Phase::Stopped))
        || find_condition(&b.old.conditions, types::READY)
            .is_some_and(|c| c.has_reason(&Reason::Paused));
    if !said && culled.is_none() {
        b.notices.push(Notice::normal(
            event_reasons::PAUSED,
            "Workspace paused: its pod is deleted, its storage kept".into(),
        ));
    }
    match &culled {
        Some(why) => b.condition(types::READY, ConditionStatus::False, Reason::Idle, why),
        None => b.condition(
            types::READY,
            ConditionStatus::False,
            Reason::Paused,
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
            b.forget(Scope::Pod);
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
pub(super) fn gave_up(
    mut b: Builder<'_>,
    owned_pod: Option<&CachedPod>,
    message: &str,
    slow: Duration,
) -> Decision {
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

/// The workspace's own pod is being deleted (a spec change, a rejection, a lost node): wait
/// for it to go before anything else.
pub(super) fn pod_stopping(mut b: Builder<'_>, pod_name: &str) -> Decision {
    b.phase(
        Phase::Stopping,
        format!("Waiting for pod {pod_name} to stop"),
    );
    b.finish(Duration::from_secs(1))
}
