//! Idle culling, decided purely: which running workspace's agent to ask for its activity,
//! when to ask next (a step that shrinks with the idle time left, not a fixed poll), and
//! whether what the agent said means nobody used the workspace for its `idleTimeout`.

use std::time::Duration;

use crate::cached_pod::CachedPod;
use berth_api::{Workspace, WorkspaceStatus, condition::Reason};
use jiff::Timestamp;

/// What the operator's last `GetActivity` to a pod's agent found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityCheck {
    pub pod_uid: String,
    /// When the agent was asked.
    pub asked_at: Timestamp,
    pub outcome: ActivityOutcome,
    /// First handed to a reconcile now (a failure is published as an event once per call).
    pub fresh: bool,
    /// After a failure: how long after `asked_at` to ask again.
    pub retry_in: Duration,
}

/// The answer of a `GetActivity`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActivityOutcome {
    /// The latest use the agent saw (or its own start): when, which signal, in words.
    Seen {
        at: Timestamp,
        signal: String,
        detail: String,
    },
    /// The agent could not be asked: the same reasons as a WhoAmI's failure.
    Failed { reason: Reason, message: String },
}

/// The step below which the next ask is made at the deadline itself, as a share of the
/// timeout: asks come at 1/2, 3/4, 7/8 and 15/16 of an idle stretch, then at its end.
const LAST_STEP: u32 = 10;

/// The workspace's idle timeout, when it is set and readable.
pub fn timeout(workspace: &Workspace) -> Option<Duration> {
    workspace
        .spec
        .lifecycle
        .as_ref()?
        .idle_timeout
        .as_ref()?
        .to_duration()
        .ok()
        .filter(|d| !d.is_zero())
}

/// Whether the workspace's agent is asked for activity: an idle timeout is set, and the
/// workspace runs on `pod`, whose agent was verified (activity is asked only of an agent the
/// operator trusts).
pub fn wanted(workspace: &Workspace, pod: Option<&CachedPod>) -> Option<Duration> {
    let pod = pod?;
    let status = workspace.status.as_ref()?;
    let verified = status.agent.as_ref()?.verified_pod_uid.as_deref();
    (workspace.metadata.deletion_timestamp.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && !workspace.spec.paused
        && verified.is_some()
        && verified == pod.metadata.uid.as_deref())
    .then(|| timeout(workspace))
    .flatten()
}

/// Since when nobody used the workspace: the latest of what the agent just said, what the
/// status remembers (a restarted agent forgets), and the workspace becoming ready.
pub fn idle_since(status: &WorkspaceStatus, check: Option<&ActivityCheck>) -> Option<Timestamp> {
    let seen = check.and_then(|c| match &c.outcome {
        ActivityOutcome::Seen { at, .. } => Some(*at),
        ActivityOutcome::Failed { .. } => None,
    });
    [
        seen,
        status.last_activity.as_ref().map(|t| t.0),
        status.ready_at.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// How long until the agent is asked again. After an answer, half the idle time then left,
/// and the rest at once when that is under a tenth of the timeout (so a busy workspace is
/// asked about twice per timeout, an idle one a few times more, and none is culled late);
/// after a failure, the backoff the check carries. Without an ask yet, as if asked when the
/// idle stretch began.
pub fn next_ask(
    timeout: Duration,
    since: Timestamp,
    last: Option<&ActivityCheck>,
    now: Timestamp,
) -> Duration {
    let after = |at: Timestamp, wait: Duration| {
        let due = at.checked_add(wait).unwrap_or(at);
        Duration::try_from(due.duration_since(now)).unwrap_or_default()
    };
    if let Some(check) = last
        && matches!(check.outcome, ActivityOutcome::Failed { .. })
    {
        return after(check.asked_at, check.retry_in);
    }
    let asked = last.map(|c| c.asked_at).unwrap_or(since).max(since);
    let deadline = since.checked_add(timeout).unwrap_or(since);
    let left = Duration::try_from(deadline.duration_since(asked)).unwrap_or_default();
    let step = match left <= timeout / LAST_STEP {
        true => left,
        false => left / 2,
    };
    after(asked, step)
}

/// How long the workspace was idle when the agent was last asked, if that reaches the
/// timeout: the verdict to stop it. Only an answer counts (unknown is not idle), and only an
/// answer given at or after the deadline, whatever the time is now.
pub fn culled_after(
    timeout: Duration,
    since: Timestamp,
    last: Option<&ActivityCheck>,
) -> Option<Duration> {
    let check = last.filter(|c| matches!(c.outcome, ActivityOutcome::Seen { .. }))?;
    let idle = Duration::try_from(check.asked_at.duration_since(since)).ok()?;
    (idle >= timeout).then_some(idle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const T: Duration = Duration::from_secs(100);

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + seconds).unwrap()
    }

    fn seen(asked: i64, at: i64) -> ActivityCheck {
        ActivityCheck {
            pod_uid: "p".into(),
            asked_at: t(asked),
            outcome: ActivityOutcome::Seen {
                at: t(at),
                signal: "Connection".into(),
                detail: "a connection to port 8080".into(),
            },
            fresh: true,
            retry_in: Duration::ZERO,
        }
    }

    fn failed(asked: i64, retry: u64) -> ActivityCheck {
        ActivityCheck {
            outcome: ActivityOutcome::Failed {
                reason: Reason::AgentUnreachable,
                message: "connection refused".into(),
            },
            retry_in: Duration::from_secs(retry),
            ..seen(asked, 0)
        }
    }

    fn workspace(idle_timeout: Option<&str>, status: serde_json::Value) -> Workspace {
        let mut lifecycle = serde_json::json!({});
        if let Some(timeout) = idle_timeout {
            lifecycle["idleTimeout"] = timeout.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "w", "namespace": "team-a", "uid": "ws-1"},
            "spec": {"image": "x:1", "lifecycle": lifecycle},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_idle_timeout_is_read_when_set_and_not_zero() {
        let timeout_of = |t: Option<&str>| timeout(&workspace(t, serde_json::json!({})));
        assert_eq!(timeout_of(Some("10m")), Some(Duration::from_secs(600)));
        assert_eq!(timeout_of(Some("0s")), None, "zero turns culling off");
        assert_eq!(timeout_of(None), None);
        assert_eq!(timeout_of(Some("soon")), None);
    }

    /// Activity is asked only of a verified agent of the workspace's current pod, while the
    /// workspace runs with an idle timeout: each condition on its own turns the asking off.
    #[test]
    fn activity_is_asked_only_of_a_verified_agent_of_a_running_workspace() {
        let verified = serde_json::json!({"agent": {"verifiedPodUID": "pod-1"}});
        let pod: CachedPod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "w-ws", "uid": "pod-1"}}),
        )
        .unwrap();
        let ws = workspace(Some("10m"), verified.clone());
        assert_eq!(wanted(&ws, Some(&pod)), Some(Duration::from_secs(600)));
        assert_eq!(wanted(&ws, None), None, "no pod");
        let mut gone = pod.clone();
        gone.metadata.deletion_timestamp = Some(Time(t(0)));
        assert_eq!(wanted(&ws, Some(&gone)), None, "the pod is going");
        let mut deleted = ws.clone();
        deleted.metadata.deletion_timestamp = Some(Time(t(0)));
        assert_eq!(
            wanted(&deleted, Some(&pod)),
            None,
            "the workspace is deleted"
        );
        let mut paused = ws.clone();
        paused.spec.paused = true;
        assert_eq!(wanted(&paused, Some(&pod)), None, "paused");
        let unverified = workspace(Some("10m"), serde_json::json!({"agent": {}}));
        assert_eq!(wanted(&unverified, Some(&pod)), None, "agent not verified");
        let mut other = pod.clone();
        other.metadata.uid = Some("pod-2".into());
        assert_eq!(wanted(&ws, Some(&other)), None, "verified for another pod");
        assert_eq!(
            wanted(&workspace(None, verified), Some(&pod)),
            None,
            "no idle timeout"
        );
    }

    #[test]
    fn the_first_ask_comes_halfway_through_the_idle_stretch() {
        assert_eq!(next_ask(T, t(0), None, t(0)), Duration::from_secs(50));
        assert_eq!(next_ask(T, t(0), None, t(20)), Duration::from_secs(30));
        // A restarted operator whose halfway point passed asks at once.
        assert_eq!(next_ask(T, t(0), None, t(70)), Duration::ZERO);
    }

    #[test]
    fn an_idle_workspace_is_asked_at_shrinking_steps_then_at_its_deadline() {
        // Nothing happened since t(0): asks at 50, 75, 87.5, 93.75, then the deadline 100.
        let (mut asked, mut last, mut now) = (vec![], None, t(0));
        while culled_after(T, t(0), last.as_ref()).is_none() {
            assert!(asked.len() < 10, "asked forever: {asked:?}");
            now = now
                .checked_add(next_ask(T, t(0), last.as_ref(), now))
                .unwrap();
            asked.push(now.duration_since(t(0)).as_secs_f64());
            last = Some(ActivityCheck {
                asked_at: now,
                ..seen(0, 0)
            });
        }
        assert_eq!(asked, [50.0, 75.0, 87.5, 93.75, 100.0]);
        assert_eq!(culled_after(T, t(0), last.as_ref()), Some(T));
    }

    #[test]
    fn a_busy_workspace_is_asked_about_twice_per_timeout() {
        // Used at 50, the time it was asked: the next ask is half a timeout later.
        let since = t(50);
        assert_eq!(
            next_ask(T, since, Some(&seen(50, 50)), t(50)),
            Duration::from_secs(50)
        );
        assert_eq!(culled_after(T, since, Some(&seen(50, 50))), None);
    }

    #[test]
    fn a_failed_ask_is_retried_on_its_backoff_and_never_culls() {
        let last = failed(100, 5);
        assert_eq!(
            next_ask(T, t(0), Some(&last), t(101)),
            Duration::from_secs(4)
        );
        assert_eq!(
            culled_after(T, t(0), Some(&last)),
            None,
            "unknown is not idle"
        );
    }

    #[test]
    fn only_an_answer_given_after_the_deadline_culls() {
        assert_eq!(culled_after(T, t(0), Some(&seen(99, 0))), None);
        assert_eq!(
            culled_after(T, t(0), Some(&seen(100, 0))),
            Some(Duration::from_secs(100))
        );
        assert_eq!(
            culled_after(T, t(0), Some(&seen(130, 0))),
            Some(Duration::from_secs(130))
        );
        assert_eq!(culled_after(T, t(0), None), None, "never asked");
    }

    #[test]
    fn idle_time_counts_from_the_latest_known_use() {
        let status = |last: Option<i64>, ready: Option<i64>| WorkspaceStatus {
            last_activity: last.map(|s| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(s))),
            ready_at: ready.map(|s| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(s))),
            ..Default::default()
        };
        assert_eq!(
            idle_since(&status(None, Some(10)), Some(&seen(60, 40))),
            Some(t(40))
        );
        // A restarted agent reports its start; the status remembers later use.
        assert_eq!(
            idle_since(&status(Some(70), Some(10)), Some(&seen(90, 5))),
            Some(t(70))
        );
        assert_eq!(
            idle_since(&status(None, Some(10)), Some(&failed(60, 5))),
            Some(t(10))
        );
        assert_eq!(idle_since(&status(None, None), None), None);
    }
}
