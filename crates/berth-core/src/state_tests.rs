//! The phase table (rule C8), one test per row family, and properties of `derive`.

use std::time::Duration;

use berth_api::{Phase, Workspace};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Event, PersistentVolumeClaim, Pod, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::{Value, json};

use super::*;
use crate::ownership::{Derived, Foreign};
use crate::refusal::Refusal;
use crate::state::Recreation;
use crate::{config::Policy, pod};

const NOW: i64 = 1_800_000_000;

/// [`super::derive`]; tests name the pods they build as `Pod`s and observe them as the cache
/// keeps them ([`CachedPod::from`]).
fn derive(observed: &Observed<'_>, policy: &Policy, now: Timestamp) -> Decision {
    super::derive(observed, policy, now)
}

/// An observation of `ws` alone: no pod, claim, service, agent check, refusal or activity, the
/// admission policy installed, nothing expected; a test names what it adds.
fn only(ws: &Workspace) -> Observed<'_> {
    Observed {
        workspace: ws,
        pod: None,
        warnings: &[],
        claim: None,
        service: None,
        taken: &[],
        agent: None,
        refusal: None,
        activity: None,
        content: None,
        admission: None,
        admission_since: None,
        kind: &crate::kinds::NO_KIND,
        expectations: Default::default(),
    }
}

fn now() -> Timestamp {
    Timestamp::from_second(NOW).unwrap()
}

fn at(seconds_ago: i64) -> String {
    Timestamp::from_second(NOW - seconds_ago)
        .unwrap()
        .to_string()
}

fn workspace(spec: Value, status: Value) -> Workspace {
    let mut ws = crate::pod::tests::workspace("w", spec);
    ws.status = serde_json::from_value(status).unwrap();
    ws
}

/// The workspace's own pod with `status`, built from the spec so the hash matches.
fn pod_of(ws: &Workspace, status: Value) -> Pod {
    let mut pod = pod::build_pod(ws, &Default::default());
    pod.metadata.uid = Some("pod-1".into());
    pod.status = serde_json::from_value(status).unwrap();
    pod
}

fn warning(uid: &str, reason: &str, message: &str, count: i32, seconds_ago: i64) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": format!("e-{reason}-{seconds_ago}"), "namespace": "team-a"},
        "involvedObject": {"kind": "Pod", "name": "w-ws", "uid": uid},
        "reason": reason, "message": message, "type": "Warning", "count": count, "lastTimestamp": at(seconds_ago)
    }))
    .unwrap()
}

fn decide(ws: &Workspace, pod: Option<&Pod>, warnings: &[Event]) -> Decision {
    let refs: Vec<&Event> = warnings.iter().collect();
    let cached = pod.map(CachedPod::from);
    derive(
        &Observed {
            workspace: ws,
            pod: cached.as_ref(),
            warnings: &refs,
            claim: None,
            service: None,
            taken: &[],
            agent: None,
            refusal: None,
            activity: None,
            content: None,
            admission: None,
            admission_since: None,
            kind: &crate::kinds::NO_KIND,
            expectations: Default::default(),
        },
        &Policy::default(),
        now(),
    )
}

/// [`decide`] after a WhoAmI to the pod's agent.
fn decide_checked(ws: &Workspace, pod: &Pod, check: &AgentCheck) -> Decision {
    derive(
        &Observed {
            pod: Some(&CachedPod::from(pod)),
            agent: Some(check),
            ..only(ws)
        },
        &Policy::default(),
        now(),
    )
}

const OPERATOR: &str = "system:serviceaccount:berth-system:berth-controller";

fn check(outcome: AgentOutcome, fresh: bool) -> AgentCheck {
    AgentCheck {
        pod_uid: "pod-1".into(),
        address: "127.1.0.1:50051".into(),
        outcome,
        fresh,
        retry_in: Duration::from_secs(5),
    }
}

/// A WhoAmI that failed for `reason` with `message` (`fresh`: made for this reconcile).
fn failed_check(reason: &str, message: &str, fresh: bool) -> AgentCheck {
    check(
        AgentOutcome::Failed {
            reason: reason.into(),
            message: message.into(),
        },
        fresh,
    )
}

fn verified() -> AgentCheck {
    check(
        AgentOutcome::Verified {
            identity: OPERATOR.into(),
        },
        true,
    )
}

fn ready_pod(ws: &Workspace) -> Pod {
    pod_of(
        ws,
        json!({"phase": "Running", "podIP": "127.1.0.1", "conditions": [scheduled(), {"type": "Ready", "status": "True"}]}),
    )
}

fn scheduled() -> Value {
    json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": at(5)})
}

fn started(seconds_ago: i64) -> Value {
    json!({"phase": "Starting", "startedAt": at(seconds_ago)})
}

fn condition_of<'a>(
    d: &'a Decision,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

#[test]
fn pending_creates_the_pod() {
    let ws = workspace(json!({"image": "x:1"}), Value::Null);
    let d = decide(&ws, None, &[]);
    assert_eq!(d.status.phase, Some(Phase::Pending));
    assert_eq!(d.status.message.as_deref(), Some("Creating pod w-ws"));
    assert_eq!(d.actions, vec![Action::CreatePod]);
    assert_eq!(d.status.started_at.as_ref().map(|t| t.0), Some(now()));
    // Nothing was created yet: `Created` is told once the pod exists.
    assert!(d.notices.is_empty(), "{:?}", d.notices);
    assert_eq!(d.status.observed_generation, Some(1));
}

fn notice_reasons(d: &Decision) -> Vec<&str> {
    d.notices.iter().map(|n| n.reason.as_ref()).collect()
}

#[test]
fn events_tell_what_happened_created_once_the_pod_exists_started_once_a_container_runs() {
    let ws = workspace(json!({"image": "x:1"}), started(3));
    let waiting = json!({"phase": "Pending", "podIP": "10.0.0.1", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]});
    let pod = pod_of(&ws, waiting);
    let d = decide(&ws, Some(&pod), &[]);
    // The pod has an IP, but no container ever ran: not `Started`. Its error is told once.
    assert_eq!(notice_reasons(&d), ["Created", "ImagePullBackOff"]);
    assert!(d.notices[1].warning);
    assert_eq!(
        d.notices[1].note,
        "ImagePullBackOff: Back-off pulling image"
    );
    let seen = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&d.status).unwrap(),
    );
    assert!(decide(&seen, Some(&pod), &[]).notices.is_empty());

    let ws = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&d.status).unwrap(),
    );
    let running = json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}]});
    let pod = pod_of(&ws, running);
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(notice_reasons(&d), ["Started"]);
    assert_eq!(condition_of(&d, "PodReady").reason, "ContainersNotReady");

    // Seen again: nothing new happened.
    let ws = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&d.status).unwrap(),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert!(d.notices.is_empty(), "{:?}", d.notices);
}

fn refused(action: Action, attempts: u32, seconds_ago: i64, fresh: bool) -> Refusal {
    Refusal {
        action,
        reason: "Forbidden".into(),
        message: "pods \"w-ws\" is forbidden: error looking up service account team-a/nope: serviceaccount \"nope\" not found".into(),
        generation: Some(1),
        attempts,
        at: Timestamp::from_second(NOW - seconds_ago).unwrap(),
        fresh,
    }
}

fn decide_refused(ws: &Workspace, pod: Option<&Pod>, refusal: &Refusal) -> Decision {
    let cached = pod.map(CachedPod::from);
    derive(
        &Observed {
            workspace: ws,
            pod: cached.as_ref(),
            warnings: &[],
            claim: None,
            service: None,
            taken: &[],
            agent: None,
            refusal: Some(refusal),
            activity: None,
            content: None,
            admission: None,
            admission_since: None,
            kind: &crate::kinds::NO_KIND,
            expectations: Default::default(),
        },
        &Policy::default(),
        now(),
    )
}

#[test]
fn a_refused_create_is_an_error_in_the_api_servers_words_with_a_warning_and_backoff() {
    let ws = workspace(json!({"image": "x:1"}), started(1));
    let d = decide_refused(&ws, None, &refused(Action::CreatePod, 1, 0, true));
    assert_eq!(d.status.phase, Some(Phase::Error));
    let text = "Cannot create pod w-ws (Forbidden); the API server said: pods \"w-ws\" is forbidden: error looking up service account team-a/nope: serviceaccount \"nope\" not found";
    assert_eq!(d.status.message.as_deref(), Some(text));
    let ready = condition_of(&d, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Forbidden")
    );
    assert_eq!(notice_reasons(&d), ["FailedCreate"]);
    assert!(d.notices[0].warning);
    // Not tried again before its backoff: 1 s after the first refusal.
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.requeue, Duration::from_secs(1));

    // The same refusal seen by a later reconcile: no new event, and the delay has grown.
    let ws = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&d.status).unwrap(),
    );
    let d = decide_refused(&ws, None, &refused(Action::CreatePod, 3, 1, false));
    assert!(d.notices.is_empty());
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert_eq!(d.requeue, Duration::from_secs(3));
    // Once the backoff ran out the create is tried again, still showing the refusal.
    let d = decide_refused(&ws, None, &refused(Action::CreatePod, 3, 4, false));
    assert_eq!(d.actions, vec![Action::CreatePod]);
    assert_eq!(d.status.message.as_deref(), Some(text));
}

#[test]
fn a_refusal_of_an_older_spec_or_of_an_action_no_longer_wanted_is_forgotten() {
    let mut ws = workspace(json!({"image": "x:1"}), started(1));
    ws.metadata.generation = Some(2);
    let d = decide_refused(&ws, None, &refused(Action::CreatePod, 5, 0, false));
    assert_eq!(d.status.phase, Some(Phase::Pending));
    assert_eq!(d.actions, vec![Action::CreatePod]);

    let ws = workspace(json!({"image": "x:1"}), started(1));
    let pod = ready_pod(&ws);
    let d = decide_refused(&ws, Some(&pod), &refused(Action::CreatePod, 5, 0, false));
    assert_ne!(d.status.phase, Some(Phase::Error));
}

#[test]
fn a_create_refused_until_the_start_timeout_fails_the_workspace() {
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "1m"}}),
        started(61),
    );
    let d = decide_refused(&ws, None, &refused(Action::CreatePod, 6, 1, false));
    assert_eq!(d.status.phase, Some(Phase::Failed));
    let stalled = condition_of(&d, "Stalled");
    assert_eq!(stalled.reason, "StartTimeout");
    assert!(
        stalled
            .message
            .starts_with("No progress for 1m while creating pod w-ws: pods \"w-ws\" is forbidden"),
        "{}",
        stalled.message
    );
    assert!(d.actions.is_empty());
    assert_eq!(notice_reasons(&d), ["StartTimeout"]);

    // Before the timeout, the requeue does not overshoot it.
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "1m"}}),
        started(59),
    );
    let d = decide_refused(&ws, None, &refused(Action::CreatePod, 9, 0, false));
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert_eq!(d.requeue, Duration::from_secs(1));
}

#[test]
fn starting_while_containers_are_created() {
    let ws = workspace(json!({"image": "x:1"}), started(3));
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Starting));
    assert_eq!(
        d.status.message.as_deref(),
        Some("Pod w-ws is starting (ContainerCreating)")
    );
    assert_eq!(condition_of(&d, "PodScheduled").status, "True");
    assert_eq!(condition_of(&d, "Ready").reason, "ContainerCreating");
    assert!(d.actions.is_empty());
}

#[test]
fn running_when_the_pod_is_ready_and_its_agent_authenticated_the_operator() {
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = ready_pod(&ws);
    assert_eq!(
        agent_to_check(&ws, Some(&CachedPod::from(&pod)), 50051).as_deref(),
        Some("127.1.0.1:50051")
    );
    let d = decide_checked(&ws, &pod, &verified());
    assert_eq!(d.status.phase, Some(Phase::Running));
    assert_eq!(d.status.message.as_deref(), Some("Workspace is running"));
    assert_eq!(condition_of(&d, "Ready").status, "True");
    let agent_ready = condition_of(&d, "AgentReady");
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("True", "AgentVerified")
    );
    assert_eq!(
        agent_ready.message,
        format!("The agent at 127.1.0.1:50051 authenticated the operator as {OPERATOR}")
    );
    assert_eq!(
        d.status.agent,
        Some(berth_api::AgentStatus {
            address: Some("127.1.0.1:50051".into()),
            identity: Some(OPERATOR.into()),
            verified_pod_uid: Some("pod-1".into()),
        })
    );
    assert_eq!(d.status.ready_at.as_ref().map(|t| t.0), Some(now()));
    assert!(d.notices.iter().any(|n| n.reason == "Ready"));
    assert_eq!(d.requeue, Policy::default().resync);
}

#[test]
fn an_ipv6_pod_is_called_at_a_bracketed_address() {
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = pod_of(
        &ws,
        json!({"phase": "Running", "podIP": "fd00:10:244::7", "conditions": [scheduled(), {"type": "Ready", "status": "True"}]}),
    );
    assert_eq!(
        agent_to_check(&ws, Some(&CachedPod::from(&pod)), 50051).as_deref(),
        Some("[fd00:10:244::7]:50051")
    );
}

#[test]
fn a_ready_pod_waits_for_its_agent_check() {
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = ready_pod(&ws);
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Starting));
    assert_eq!(
        d.status.message.as_deref(),
        Some("Pod w-ws is ready; checking its agent")
    );
    assert_eq!(condition_of(&d, "PodReady").status, "True");
    assert_eq!(condition_of(&d, "AgentReady").status, "Unknown");
    assert_eq!(condition_of(&d, "Ready").status, "False");
    assert!(d.status.ready_at.is_none());
    // Before the pod is ready there is nothing to check.
    let starting = pod_of(
        &ws,
        json!({"phase": "Pending", "podIP": "127.1.0.1", "conditions": [scheduled()]}),
    );
    assert_eq!(
        agent_to_check(&ws, Some(&CachedPod::from(&starting)), 50051),
        None
    );
    let d = decide(&ws, Some(&starting), &[]);
    let agent_ready = condition_of(&d, "AgentReady");
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("Unknown", "WaitingForPod")
    );
}

#[test]
fn an_agent_auth_failure_keeps_the_pod_and_says_what_to_fix() {
    let ws = workspace(
        json!({"image": "x:1"}),
        json!({"phase": "Starting", "startedAt": at(10), "pod": {"name": "w-ws", "uid": "pod-1"}}),
    );
    let pod = ready_pod(&ws);
    let message = "TokenReview API is unavailable: grant system:auth-delegator to system:serviceaccount:team-a:default";
    let failed = failed_check("Unauthenticated", message, true);
    let d = decide_checked(&ws, &pod, &failed);
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert_eq!(
        d.status.message.as_deref(),
        Some(
            format!("The agent of pod w-ws refused the operator (Unauthenticated); it was called at 127.1.0.1:50051: {message}. The pod is kept; Berth keeps retrying.").as_str()
        )
    );
    for type_ in ["AgentReady", "Ready"] {
        let c = condition_of(&d, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Unauthenticated", message),
            "{type_}"
        );
    }
    assert!(d.actions.is_empty(), "rule C15: the pod is never touched");
    assert_eq!(
        d.notices
            .iter()
            .map(|n| (n.warning, n.reason.as_ref()))
            .collect::<Vec<_>>(),
        [(true, "AgentAuthFailed")]
    );
    assert_eq!(d.requeue, Duration::from_secs(5), "the backoff's wait");
    assert_eq!(
        d.status
            .agent
            .as_ref()
            .and_then(|a| a.verified_pod_uid.as_ref()),
        None
    );

    // Looking again before the next call: the same status, no new event.
    let mut seen = ws.clone();
    seen.status = Some(d.status.clone());
    let again = decide_checked(
        &seen,
        &pod,
        &AgentCheck {
            fresh: false,
            ..failed
        },
    );
    assert_eq!(again.status, d.status, "nothing to write (rule C16)");
    assert!(again.notices.is_empty());
    assert!(again.actions.is_empty());
}

/// Each way an agent check fails says in its lead what it means for the user, and the status
/// keeps the address it was called at (what `kubectl describe` shows to check it by hand).
#[test]
fn each_agent_failure_says_what_it_means_and_where_the_agent_was_called() {
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = ready_pod(&ws);
    for (reason, meaning) in [
        ("AgentUnreachable", "cannot be reached"),
        ("Unauthenticated", "refused the operator"),
        ("PermissionDenied", "refused the operator"),
        ("IdentityMismatch", "is not to be trusted"),
        ("AgentError", "could not be checked"),
    ] {
        let failed = failed_check(reason, "m", true);
        let d = decide_checked(&ws, &pod, &failed);
        assert_eq!(
            d.status.message.as_deref(),
            Some(format!("The agent of pod w-ws {meaning} ({reason}); it was called at 127.1.0.1:50051: m. The pod is kept; Berth keeps retrying.").as_str()),
        );
        assert_eq!(
            d.status.agent,
            Some(berth_api::AgentStatus {
                address: Some("127.1.0.1:50051".into()),
                ..Default::default()
            }),
            "{reason}"
        );
    }
}

#[test]
fn the_agent_backoff_doubles_from_the_base_to_the_cap() {
    let (base, max) = (Duration::from_secs(5), Duration::from_secs(300));
    let schedule: Vec<u64> = (1..=9)
        .map(|n| agent_backoff(n, base, max).as_secs())
        .collect();
    assert_eq!(schedule, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    assert_eq!(agent_backoff(1000, base, max), max, "no overflow");
}

#[test]
fn an_agent_failure_stands_through_its_backoff_and_is_said_once() {
    let at = |seconds: i64| Timestamp::from_second(NOW + seconds).unwrap();
    let failure = failed_check("Unauthenticated", "no", true);
    let verified = verified();
    // (last check, backoff ends at, read before, now) -> (fresh, retry in) or due.
    type Row<'a> = (&'a str, &'a AgentCheck, i64, bool, i64, Option<(bool, u64)>);
    let rows: Vec<Row> = vec![
        (
            "a failure read for the first time",
            &failure,
            5,
            false,
            0,
            Some((true, 5)),
        ),
        (
            "the same failure read again",
            &failure,
            5,
            true,
            2,
            Some((false, 3)),
        ),
        (
            "its backoff ran out: call again",
            &failure,
            5,
            true,
            5,
            None,
        ),
        (
            "a failure never read is said even late",
            &failure,
            5,
            false,
            9,
            Some((true, 0)),
        ),
        (
            "a verification stands",
            &verified,
            0,
            true,
            60,
            Some((false, 0)),
        ),
    ];
    for (case, last, next_at, delivered, now, want) in rows {
        let got = agent_reading(last, at(next_at), delivered, at(now))
            .map(|c| (c.fresh, c.retry_in.as_secs()));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn an_unreachable_agent_is_said_so() {
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = ready_pod(&ws);
    let failed = failed_check(
        "AgentUnreachable",
        "the agent at 127.1.0.1:50051 cannot be reached: connection refused",
        true,
    );
    let d = decide_checked(&ws, &pod, &failed);
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert!(d.status.message.as_deref().unwrap().starts_with(
        "The agent of pod w-ws cannot be reached (AgentUnreachable); it was called at 127.1.0.1:50051"
    ));
    assert_eq!(condition_of(&d, "Ready").reason, "AgentUnreachable");
    assert!(d.actions.is_empty());
}

#[test]
fn the_agent_is_verified_once_per_pod() {
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = ready_pod(&ws);
    let mut running = ws.clone();
    running.status = Some(decide_checked(&ws, &pod, &verified()).status);
    assert_eq!(
        agent_to_check(&running, Some(&CachedPod::from(&pod)), 50051),
        None,
        "verified for this pod UID"
    );
    let d = decide(&running, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Running));
    assert_eq!(d.status, running.status.clone().unwrap(), "nothing changes");

    // A new pod (same name, new UID) is checked again.
    let mut replacement = pod.clone();
    replacement.metadata.uid = Some("pod-2".into());
    assert!(agent_to_check(&running, Some(&CachedPod::from(&replacement)), 50051).is_some());
    let d = decide(&running, Some(&replacement), &[]);
    assert_eq!(d.status.phase, Some(Phase::Starting));
    assert_eq!(
        d.status.agent, None,
        "the old pod's verification is dropped"
    );
    // A check of another pod does not count for this one.
    let d = decide_checked(&running, &replacement, &verified());
    assert_eq!(d.status.phase, Some(Phase::Starting));
}

#[test]
fn error_from_a_container_waiting_reason() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x:1\""}}}]}),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert_eq!(
        d.status.message.as_deref(),
        Some("ImagePullBackOff: Back-off pulling image \"x:1\"")
    );
    assert_eq!(condition_of(&d, "PodReady").reason, "ImagePullBackOff");
    assert!(d.actions.is_empty(), "the pod is kept");
}

#[test]
fn error_from_repeated_warning_events_of_this_pod_only() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()]}),
    );
    let missing = "MountVolume.SetUp failed for volume \"secret-0\" : secret \"s\" not found";
    let once = [warning("pod-1", "FailedMount", missing, 1, 1)];
    assert_eq!(
        decide(&ws, Some(&pod), &once).status.phase,
        Some(Phase::Starting),
        "one FailedMount is tolerated"
    );
    let twice = [warning("pod-1", "FailedMount", missing, 2, 1)];
    let d = decide(&ws, Some(&pod), &twice);
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert_eq!(
        d.status.message.as_deref(),
        Some(format!("FailedMount: {missing}").as_str())
    );
    let other_pod = [warning("old-pod", "FailedMount", missing, 9, 0)];
    let d = decide(&ws, Some(&pod), &other_pod);
    assert_eq!(
        d.status.phase,
        Some(Phase::Starting),
        "events of another pod with the same name do not count"
    );
    assert!(!d.status.message.unwrap().contains("FailedMount"));
}

#[test]
fn the_newest_warning_wins() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()]}),
    );
    let events = [
        warning("pod-1", "FailedMount", "old", 5, 10),
        warning("pod-1", "FailedCreatePodSandBox", "new", 1, 1),
    ];
    assert_eq!(
        decide(&ws, Some(&pod), &events).status.message.as_deref(),
        Some("FailedCreatePodSandBox: new")
    );
}

#[test]
fn unschedulable_is_explained_in_the_schedulers_words() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let text = "0/3 nodes are available: 3 Insufficient cpu.";
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": text}]}),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(
        d.status.phase,
        Some(Phase::Starting),
        "FailedScheduling is transient by default"
    );
    assert_eq!(d.status.message.as_deref(), Some(text));
    assert_eq!(condition_of(&d, "PodScheduled").reason, "Unschedulable");
    assert_eq!(
        condition_of(&d, "Ready").reason,
        "Unschedulable",
        "Ready names the first false prerequisite"
    );
}

#[test]
fn stopping_while_the_pod_goes_or_the_spec_changed() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let mut deleting = pod_of(&ws, json!({"phase": "Running"}));
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let d = decide(&ws, Some(&deleting), &[]);
    assert_eq!(
        (d.status.phase, d.status.message.as_deref()),
        (Some(Phase::Stopping), Some("Waiting for pod w-ws to stop"))
    );

    let changed = workspace(json!({"image": "x:2"}), started(20));
    let old = pod_of(&ws, json!({"phase": "Running"}));
    let d = decide(&changed, Some(&old), &[]);
    assert_eq!(d.status.phase, Some(Phase::Stopping));
    assert_eq!(
        d.actions,
        vec![Action::DeletePod {
            uid: "pod-1".into()
        }]
    );
    assert_eq!(
        d.status.started_at.as_ref().map(|t| t.0),
        Some(now()),
        "a spec change is a new start"
    );
}

#[test]
fn paused_deletes_the_pod_then_is_stopped() {
    let ws = workspace(
        json!({"image": "x:1", "paused": true, "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/h"}}}}),
        json!({"phase": "Running"}),
    );
    let pod = pod_of(&ws, json!({"phase": "Running"}));
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Stopping));
    assert!(d.actions.contains(&Action::DeletePod {
        uid: "pod-1".into()
    }));
    assert!(d.notices.iter().any(|n| n.reason == "Paused"));
    let d = decide(&ws, None, &[]);
    assert_eq!(d.status.phase, Some(Phase::Stopped));
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::DeletePod { .. } | Action::CreatePod))
    );
}

#[test]
fn failed_after_no_progress_for_the_start_timeout() {
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "60s"}}),
        started(120),
    );
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at(100)}], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x:1\""}}}]}),
    );
    let mut ws = ws;
    ws.status.as_mut().unwrap().conditions = serde_json::from_value(json!([
        {"type": "PodScheduled", "status": "True", "reason": "Scheduled", "message": "", "lastTransitionTime": at(100)},
        {"type": "PodReady", "status": "False", "reason": "ErrImagePull", "message": "", "lastTransitionTime": at(100)},
        {"type": "Ready", "status": "False", "reason": "ErrImagePull", "message": "", "lastTransitionTime": at(100)}
    ]))
    .unwrap();
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert_eq!(
        d.status.message.as_deref(),
        Some(
            "No progress for 1m while starting containers: ImagePullBackOff: Back-off pulling image \"x:1\""
        )
    );
    assert_eq!(condition_of(&d, "Stalled").reason, "StartTimeout");
    assert_eq!(
        d.actions,
        vec![Action::DeletePod {
            uid: "pod-1".into()
        }]
    );
    assert!(
        d.notices
            .iter()
            .any(|n| n.warning && n.reason == "StartTimeout")
    );

    // It stays Failed for this generation, pod or not.
    let mut failed = ws.clone();
    failed.status = Some(d.status.clone());
    let again = decide(&failed, None, &[]);
    assert_eq!(again.status.phase, Some(Phase::Failed));
    assert!(again.actions.is_empty());
    // A new generation starts again.
    failed.metadata.generation = Some(2);
    let restarted = decide(&failed, None, &[]);
    assert_eq!(restarted.status.phase, Some(Phase::Pending));
    assert_eq!(restarted.actions, vec![Action::CreatePod]);
}

#[test]
fn a_workspace_whose_spec_cannot_work_is_deleted_at_once() {
    let mut ws = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "1x"}}),
        json!({"phase": "Failed"}),
    );
    ws.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let pod = pod_of(&ws, json!({"phase": "Running"}));
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Terminating));
    assert_eq!(
        d.actions,
        vec![Action::DeletePod {
            uid: "pod-1".into()
        }],
        "the pod stops now, not after the deletion grace"
    );
}

#[test]
fn an_invalid_spec_waits_for_a_change() {
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "1x"}}),
        Value::Null,
    );
    let d = decide(&ws, None, &[]);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert_eq!(condition_of(&d, "Stalled").reason, "InvalidSpec");
    assert!(d.actions.is_empty());
    assert_eq!(d.requeue, Policy::default().resync, "no retry storm");
}

#[test]
fn unknown_when_the_node_is_lost_and_the_pod_is_force_replaced() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let pod = pod_of(
        &ws,
        json!({"phase": "Unknown", "reason": "NodeLost", "message": "Node node-1 which was running pod w-ws is unresponsive"}),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(
        (d.status.phase, d.status.message.as_deref()),
        (
            Some(Phase::Unknown),
            Some("Node node-1 which was running pod w-ws is unresponsive; replacing the pod")
        )
    );
    assert_eq!(
        d.actions,
        vec![Action::ForceDeletePod {
            uid: "pod-1".into()
        }]
    );
    assert_eq!(condition_of(&d, "PodRejected").reason, "NodeLost");
    // Once gone, the pod is created again at once, without counting against maxRecreations.
    let mut gone = ws.clone();
    gone.status = Some(d.status.clone());
    let again = decide(&gone, None, &[]);
    assert_eq!(again.actions, vec![Action::CreatePod]);
    assert_eq!(again.status.pod_recreations, Some(0));
    assert_eq!(
        again.recreation.as_ref().map(|r| r.reason.as_str()),
        Some("NodeLost")
    );
}

fn rejected_pod(ws: &Workspace, reason: &str) -> Pod {
    let mut pod = pod_of(
        ws,
        json!({"phase": "Failed", "reason": reason, "message": format!("Pod was rejected: {reason}")}),
    );
    pod.spec.as_mut().unwrap().node_name = Some("node-3".into());
    pod
}

#[test]
fn a_rejected_pod_is_replaced_after_the_delay_and_counted() {
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"podRecreation": {"maxRecreations": 3, "delay": "10s"}}}),
        started(30),
    );
    let d = decide(&ws, Some(&rejected_pod(&ws, "OutOfcpu")), &[]);
    assert_eq!(
        d.status.phase,
        Some(Phase::Starting),
        "clients never see Failed for a rejection"
    );
    assert_eq!(
        d.status.message.as_deref(),
        Some("Pod rejected by node-3 (OutOfcpu); creating a new pod (attempt 1 of 3)")
    );
    assert_eq!(
        d.actions,
        vec![Action::DeletePod {
            uid: "pod-1".into()
        }]
    );
    assert_eq!(
        (
            condition_of(&d, "PodRejected").status.as_str(),
            condition_of(&d, "PodRejected").reason.as_str()
        ),
        ("True", "OutOfcpu")
    );
    assert!(
        d.notices
            .iter()
            .any(|n| n.warning && n.reason == "PodRejected")
    );
    assert_eq!(
        d.status.pod.as_ref().and_then(|p| p.uid.as_deref()),
        Some("pod-1"),
        "the rejected pod is named until it is gone"
    );
    // Read again before the pod is gone: the same status, and the rejection is not told twice.
    let mut again = ws.clone();
    again.status = Some(d.status.clone());
    let twice = decide(&again, Some(&rejected_pod(&ws, "OutOfcpu")), &[]);
    assert_eq!(twice.status, d.status);
    assert!(twice.notices.is_empty(), "{:?}", twice.notices);

    // Gone, but the delay has not passed: wait exactly the rest of it.
    let mut waiting = ws.clone();
    waiting.status = Some(d.status.clone());
    let early = decide(&waiting, None, &[]);
    assert!(early.actions.is_empty());
    assert_eq!(
        early.requeue,
        Duration::from_secs(11),
        "the delay counts from the end of the rejection's second"
    );
    // Looked at 4 s into it: the rest is 7 s.
    let part_way = derive(
        &Observed { ..only(&waiting) },
        &Policy::default(),
        Timestamp::from_second(NOW + 4).unwrap(),
    );
    assert!(part_way.actions.is_empty());
    assert_eq!(part_way.requeue, Duration::from_secs(7));
    // After the delay: a new pod, the count goes up, PodRejected flips back.
    let later = derive(
        &Observed { ..only(&waiting) },
        &Policy::default(),
        Timestamp::from_second(NOW + 11).unwrap(),
    );
    assert_eq!(later.actions, vec![Action::CreatePod]);
    assert_eq!(later.status.pod_recreations, Some(1));
    assert_eq!(
        later.status.started_at,
        waiting.status.as_ref().unwrap().started_at,
        "the start timeout counts from the original start"
    );
    assert_eq!(condition_of(&later, "PodRejected").status, "False");
    assert!(
        later
            .notices
            .iter()
            .any(|n| n.reason == "Recreating" && n.note.contains("attempt 1 of 3"))
    );
    assert_eq!(
        later.recreation,
        Some(Recreation {
            reason: "OutOfcpu".into(),
            attempt: 1
        })
    );
}

#[test]
fn the_recreation_limit_fails_visibly() {
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"podRecreation": {"maxRecreations": 2}}}),
        json!({"phase": "Starting", "startedAt": at(30), "podRecreations": 2}),
    );
    let d = decide(&ws, Some(&rejected_pod(&ws, "NodeAffinity")), &[]);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert!(d.status.message.as_deref().unwrap().starts_with(
        "Pod rejected by node-3 (NodeAffinity) after 2 replacements; giving up (maxRecreations 2)."
    ));
    for type_ in ["PodRejected", "Stalled"] {
        assert_eq!(
            (
                condition_of(&d, type_).status.as_str(),
                condition_of(&d, type_).reason.as_str()
            ),
            ("True", "RecreationLimitReached"),
            "{type_}"
        );
    }
    assert!(
        d.notices
            .iter()
            .any(|n| n.warning && n.reason == "RecreationLimitReached")
    );
    // No more pods for this generation.
    let mut failed = ws.clone();
    failed.status = Some(d.status.clone());
    assert!(decide(&failed, None, &[]).actions.is_empty());
    // A spec change starts over with a fresh count.
    failed.metadata.generation = Some(2);
    let restarted = decide(&failed, None, &[]);
    assert_eq!(restarted.actions, vec![Action::CreatePod]);
    assert_eq!(restarted.status.pod_recreations, Some(0));
}

#[test]
fn a_pod_that_ran_and_failed_is_a_crash_not_a_rejection() {
    let ws = workspace(json!({"image": "x:1"}), started(30));
    let pod = pod_of(
        &ws,
        json!({"phase": "Failed", "reason": "OutOfmemory", "message": "x",
        "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "killed"}}}]}),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert_eq!(
        d.status.message.as_deref(),
        Some("Pod w-ws failed: container exited with code 137 (OOMKilled): killed")
    );
    assert!(d.actions.is_empty(), "not replaced");
}

#[test]
fn terminating_stops_the_pod_first() {
    let mut ws = workspace(json!({"image": "x:1"}), json!({"phase": "Running"}));
    ws.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let pod = pod_of(&ws, json!({"phase": "Running"}));
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Terminating));
    assert_eq!(
        d.actions,
        vec![Action::DeletePod {
            uid: "pod-1".into()
        }]
    );
}

#[test]
fn a_foreign_pod_is_an_error_and_left_alone() {
    let ws = workspace(json!({"image": "x:1"}), Value::Null);
    let mut foreign = pod_of(&ws, json!({"phase": "Running"}));
    foreign.metadata.owner_references = None;
    let d = decide(&ws, Some(&foreign), &[]);
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert!(
        d.status
            .message
            .unwrap()
            .contains("not owned by this workspace")
    );
    assert!(d.actions.is_empty());
}

#[test]
fn every_phase_is_reachable_from_some_observation() {
    // One observation per row of the phase table; a phase that derive can no longer reach
    // (or a new phase without a row) fails here.
    let mut reached = std::collections::BTreeSet::new();
    let plain = workspace(json!({"image": "x:1"}), started(10));
    reached.insert(
        decide_checked(&plain, &ready_pod(&plain), &verified())
            .status
            .phase
            .expect("a phase")
            .as_str(),
    );
    let mut phase = |ws: &Workspace, pod: Option<&Pod>| {
        reached.insert(decide(ws, pod, &[]).status.phase.expect("a phase").as_str());
    };
    phase(&plain, None);
    phase(
        &plain,
        Some(&pod_of(
            &plain,
            json!({"phase": "Pending", "conditions": [scheduled()]}),
        )),
    );
    let mut deleting = pod_of(&plain, json!({"phase": "Running"}));
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    phase(&plain, Some(&deleting));
    phase(
        &workspace(json!({"image": "x:1", "paused": true}), Value::Null),
        None,
    );
    phase(
        &plain,
        Some(&pod_of(
            &plain,
            json!({"phase": "Pending", "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}),
        )),
    );
    phase(
        &workspace(
            json!({"image": "x:1", "lifecycle": {"startTimeout": "bad"}}),
            Value::Null,
        ),
        None,
    );
    let mut going = plain.clone();
    going.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    phase(&going, None);
    phase(&plain, Some(&pod_of(&plain, json!({"phase": "Unknown"}))));
    let all: std::collections::BTreeSet<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(reached, all);
}

#[test]
fn the_requeue_grows_with_time_since_the_start() {
    let cap = Duration::from_secs(60);
    let rows = [
        (0, 1),
        (1, 1),
        (3, 2),
        (5, 4),
        (9, 8),
        (40, 32),
        (100, 60),
        (10_000, 60),
    ];
    for (elapsed, want) in rows {
        assert_eq!(
            requeue_interval(Duration::from_secs(elapsed), cap),
            Duration::from_secs(want),
            "{elapsed}s"
        );
    }
}

#[test]
fn an_unchanged_observation_derives_an_unchanged_status() {
    // Rule C16: feeding the derived status back changes nothing, so nothing is written.
    let ws = workspace(json!({"image": "x:1"}), started(10));
    let pod = pod_of(
        &ws,
        json!({"phase": "Running", "podIP": "127.1.0.1", "conditions": [scheduled(), {"type": "Ready", "status": "True"}]}),
    );
    let first = decide(&ws, Some(&pod), &[]);
    let mut settled = ws.clone();
    settled.status = Some(first.status.clone());
    let second = derive(
        &Observed {
            pod: Some(&CachedPod::from(&pod)),
            ..only(&settled)
        },
        &Policy::default(),
        Timestamp::from_second(NOW + 30).unwrap(),
    );
    assert_eq!(second.status, first.status);
    assert!(second.notices.is_empty());
}

fn arbitrary_pod_status() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let phase = prop::sample::select(vec![
        "Pending",
        "Running",
        "Failed",
        "Succeeded",
        "Unknown",
        "",
    ]);
    let waiting = prop::sample::select(vec![
        "ContainerCreating",
        "ImagePullBackOff",
        "CrashLoopBackOff",
        "ErrImagePull",
        "Weird",
        "",
    ]);
    let status = prop::sample::select(vec!["True", "False", "Unknown"]);
    (phase, waiting, status.clone(), status, any::<bool>(), ".{0,20}").prop_map(|(phase, waiting, scheduled, ready, ip, message)| {
        let mut s = json!({
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": scheduled, "reason": "Unschedulable", "message": message}, {"type": "Ready", "status": ready}],
            "containerStatuses": [{"name": "workspace", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": waiting, "message": message}}}]
        });
        if ip {
            s["podIP"] = json!("127.1.0.9");
        }
        s
    })
}

proptest::proptest! {
    #[test]
    fn derive_never_panics_and_is_deterministic(
        status in arbitrary_pod_status(),
        counts in proptest::collection::vec((0i32..5, 0i64..100, proptest::sample::select(vec!["FailedMount", "BackOff", "Unhealthy", "Odd"])), 0..4),
        started in 0i64..2000,
        paused in proptest::bool::ANY,
    ) {
        let ws = workspace(json!({"image": "x:1", "paused": paused}), json!({"startedAt": at(started)}));
        let pod = pod_of(&ws, status);
        let events: Vec<Event> = counts.iter().map(|(c, ago, reason)| warning("pod-1", reason, "m", *c, *ago)).collect();
        let first = decide(&ws, Some(&pod), &events);
        let second = decide(&ws, Some(&pod), &events);
        proptest::prop_assert_eq!(&first, &second);
        proptest::prop_assert!(first.status.phase.is_some());
        proptest::prop_assert!(first.requeue > Duration::ZERO);
    }
}

proptest::proptest! {
    /// A decision is a fixpoint: with its status written back and the world as it was, the
    /// next decision keeps that status and publishes nothing again (events tell what changed,
    /// once: rule C17), even while an action is still to take effect (not done yet, or
    /// refused), which it may ask for again; a decision with nothing to do does nothing again.
    #[test]
    fn a_written_status_is_derived_again_without_new_events(
        status in arbitrary_pod_status(),
        counts in proptest::collection::vec((0i32..5, 0i64..100, proptest::sample::select(vec!["FailedMount", "BackOff", "Unhealthy", "Odd"])), 0..4),
        started in 0i64..2000,
        paused in proptest::bool::ANY,
        with_pod in proptest::bool::ANY,
    ) {
        let ws = workspace(json!({"image": "x:1", "paused": paused}), json!({"startedAt": at(started)}));
        let pod = pod_of(&ws, status);
        let pod = with_pod.then_some(&pod);
        let events: Vec<Event> = counts.iter().map(|(c, ago, reason)| warning("pod-1", reason, "m", *c, *ago)).collect();
        let first = decide(&ws, pod, &events);
        let mut written = ws.clone();
        written.status = Some(first.status.clone());
        let second = decide(&written, pod, &events);
        proptest::prop_assert_eq!(&second.status, &first.status);
        proptest::prop_assert!(second.notices.is_empty(), "published again: {:?} (first {:?})", second.notices, first.notices);
        if first.actions.is_empty() {
            proptest::prop_assert!(second.actions.is_empty(), "{:?}", second.actions);
        }
    }
}

proptest::proptest! {
    /// Rule C16 for every state that waits on something outside Berth: a name someone else's
    /// object holds (met by a create, or shown by the caches), a write the API server refused,
    /// a pod in any state. With the world unchanged, the status written back derives the same
    /// status and no event: no write loop, one Warning per cause.
    #[test]
    fn every_wait_on_the_world_is_a_fixpoint(
        status in arbitrary_pod_status(),
        with_pod in proptest::bool::ANY,
        foreign_pod in proptest::bool::ANY,
        paused in proptest::bool::ANY,
        home in proptest::bool::ANY,
        ports in proptest::bool::ANY,
        met in proptest::option::of((proptest::sample::select(vec![Derived::Pod, Derived::Claim, Derived::Service]), 0i64..70, 1u32..8)),
        cached_claim in proptest::bool::ANY,
        cached_service in proptest::bool::ANY,
        refusal in proptest::option::of((proptest::sample::select(vec![Action::CreatePod, Action::CreateClaim, Action::CreateService]), 1u32..6, 0i64..70)),
        unchecked in proptest::bool::ANY,
        names_a_secret in proptest::bool::ANY,
    ) {
        let mut spec = json!({"image": "x:1", "paused": paused});
        if names_a_secret {
            spec["env"] = json!([{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]);
        }
        if home {
            spec["podTemplate"] = json!({"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}});
        }
        if ports {
            spec["ports"] = json!([{"name": "http", "port": 8080}]);
        }
        let ws = workspace(spec, json!({"startedAt": at(40)}));
        let mut pod = pod_of(&ws, status);
        if foreign_pod {
            pod.metadata.owner_references = None;
        }
        let cached = CachedPod::from(&pod);
        let theirs = |name: &str| -> ObjectMeta {
            serde_json::from_value(json!({"name": name, "uid": "theirs"})).unwrap()
        };
        let claim = PersistentVolumeClaim { metadata: theirs("w-home"), ..Default::default() };
        let service = Service { metadata: theirs("w"), ..Default::default() };
        let taken: Vec<Foreign> = met.iter().map(|(kind, ago, attempts)| Foreign {
            kind: *kind,
            name: "taken".into(),
            owner: Some("Workspace other".into()),
            met: Some(crate::ownership::Met { at: Timestamp::from_second(NOW - ago).unwrap(), attempts: *attempts }),
        }).collect();
        let refusal = |fresh| refusal.clone().map(|(action, attempts, ago)| refused(action, attempts, ago, fresh));
        let (fresh, stale) = (refusal(true), refusal(false));
        let decide = |ws: &Workspace, refusal: Option<&Refusal>| derive(
            &Observed {
                workspace: ws,
                pod: with_pod.then_some(&cached),
                warnings: &[],
                claim: cached_claim.then_some(&claim),
                service: cached_service.then_some(&service),
                taken: &taken,
                agent: None,
                refusal,
                activity: None,
                content: None,
                admission: unchecked.then_some("the ValidatingAdmissionPolicy workspaces.berth.dev is not installed"),
                admission_since: None,
                kind: &crate::kinds::NO_KIND,
                expectations: Default::default(),
            },
            &Policy::default(),
            now(),
        );
        let first = decide(&ws, fresh.as_ref());
        let mut written = ws.clone();
        written.status = Some(first.status.clone());
        let second = decide(&written, stale.as_ref());
        proptest::prop_assert_eq!(&second.status, &first.status);
        proptest::prop_assert!(second.notices.is_empty(), "published again: {:?} (first {:?})", second.notices, first.notices);
        proptest::prop_assert_eq!(&second.actions, &first.actions);
        // Nothing is ever created over a name that is someone else's.
        let shown = |kind| (kind == Derived::Claim && cached_claim) || (kind == Derived::Service && cached_service) || (kind == Derived::Pod && with_pod && foreign_pod);
        for kind in [Derived::Pod, Derived::Claim, Derived::Service] {
            proptest::prop_assert!(!(shown(kind) && first.actions.contains(&kind.create())), "{:?} over a name in use: {:?}", kind, first.actions);
        }
        if home && cached_claim {
            proptest::prop_assert!(!first.actions.contains(&Action::CreatePod), "a pod that would mount their claim");
        }
        if unchecked && names_a_secret {
            proptest::prop_assert!(!first.actions.contains(&Action::CreatePod), "a pod no admission checked");
        }
    }
}

proptest::proptest! {
    /// A workspace's phase and READY never contradict each other: READY is True only in
    /// `Running`, whatever happens to a workspace that was running (its pod stopping or
    /// replaced, its spec changed, paused, deleted, its pod in any state).
    #[test]
    fn ready_is_true_only_while_running(
        status in arbitrary_pod_status(),
        with_pod in proptest::bool::ANY,
        going in proptest::bool::ANY,
        paused in proptest::bool::ANY,
        deleted in proptest::bool::ANY,
        image in proptest::sample::select(vec!["x:1", "x:2"]),
    ) {
        let running = json!({"phase": "Running", "observedGeneration": 1, "startedAt": at(100), "pod": {"name": "w-ws", "uid": "pod-1"},
            "agent": {"verifiedPodUID": "pod-1"},
            "conditions": [
                {"type": "PodReady", "status": "True", "reason": "ContainersReady", "message": "", "lastTransitionTime": at(90)},
                {"type": "Ready", "status": "True", "reason": "WorkspaceReady", "message": "", "lastTransitionTime": at(90)}
            ]});
        let built = workspace(json!({"image": "x:1"}), running.clone());
        let mut pod = pod_of(&built, status);
        if going {
            pod.metadata.deletion_timestamp = Some(Time(now()));
        }
        let mut ws = workspace(json!({"image": image, "paused": paused}), running);
        if deleted {
            ws.metadata.deletion_timestamp = Some(Time(now()));
        }
        let d = decide(&ws, with_pod.then_some(&pod), &[]);
        let ready = find_condition(&d.status.conditions, types::READY).is_some_and(|c| c.is(ConditionStatus::True));
        proptest::prop_assert!(!ready || d.status.phase == Some(Phase::Running), "READY True in {:?}: {:?}", d.status.phase, d.status.message);
    }
}

/// The states one pod goes through on its way to ready, and back (a crash, a restart).
fn pod_state(ws: &Workspace, which: usize) -> Pod {
    let container = |state: Value, ready: bool, restarts: i32| json!([{"name": "workspace", "image": "x:1", "imageID": "", "ready": ready, "restartCount": restarts, "state": state}]);
    let not_ready = json!({"type": "Ready", "status": "False", "reason": "ContainersNotReady"});
    let status = match which {
        0 => {
            json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": container(json!({"waiting": {"reason": "ContainerCreating"}}), false, 0)})
        }
        1 => {
            json!({"phase": "Pending", "podIP": "10.0.0.1", "conditions": [scheduled()], "containerStatuses": container(json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}), false, 0)})
        }
        2 => {
            json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [scheduled(), not_ready], "containerStatuses": container(json!({"running": {}}), false, 0)})
        }
        3 => {
            json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [scheduled(), not_ready], "containerStatuses": container(json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}}), false, 1)})
        }
        _ => {
            json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [scheduled(), {"type": "Ready", "status": "True"}], "containerStatuses": container(json!({"running": {}}), true, 1)})
        }
    };
    pod_of(ws, status)
}

proptest::proptest! {
    /// Rule C17, counted over a start: whatever a pod goes through (pulling, crashing and
    /// running again, an agent that fails before it authenticates the operator) and however
    /// often it is looked at (a status held back or not written is derived again), the events
    /// tell each thing once per pod: one `Created`, one `Started`, one `Ready` (its readiness
    /// may flap; the pod became ready once).
    #[test]
    fn a_start_tells_created_started_and_ready_once_each(
        steps in proptest::collection::vec((0usize..5, 0usize..3, proptest::bool::ANY), 1..14),
    ) {
        let spec = json!({"image": "x:1"});
        let mut ws = workspace(spec.clone(), Value::Null);
        let first = decide(&ws, None, &[]);
        ws.status = Some(first.status);
        let failed = failed_check("AgentUnreachable", "connection refused", true);
        let mut told: Vec<String> = vec![];
        let (mut ran, mut was_ready) = (false, false);
        for (i, (state, agent, written)) in steps.into_iter().enumerate() {
            let pod = pod_state(&ws, state);
            let agent = [None, Some(failed.clone()), Some(verified())][agent].clone();
            let d = derive(
                &Observed {
                    pod: Some(&CachedPod::from(&pod)),
                    agent: agent.as_ref(),
                    ..only(&ws)
                },
                &Policy::default(),
                Timestamp::from_second(NOW + i as i64).unwrap(),
            );
            if !written {
                // Held back, or the write conflicted: nothing was said, and the next look
                // starts from the status as last written.
                continue;
            }
            ran |= containers_running(&CachedPod::from(&pod));
            was_ready |= find_condition(&d.status.conditions, types::READY).is_some_and(|c| c.is(ConditionStatus::True));
            told.extend(d.notices.iter().map(|n| if n.warning { "Warning".to_string() } else { n.reason.to_string() }));
            ws.status = Some(d.status);
        }
        let count = |reason: &str| told.iter().filter(|r| *r == reason).count();
        proptest::prop_assert!(count("Created") <= 1, "{:?}", told);
        proptest::prop_assert_eq!(count("Started"), usize::from(ran), "{:?}", told);
        proptest::prop_assert_eq!(count("Ready"), usize::from(was_ready), "{:?}", told);
    }
}

#[test]
fn the_last_activity_belongs_to_the_current_pod() {
    // Used at 85 s ago in the pod before; the pod now is a new one (a resume).
    let ws = workspace(
        json!({"image": "x:1"}),
        json!({"phase": "Pending", "observedGeneration": 1, "startedAt": at(10),
            "lastActivity": at(85), "lastActivitySignal": "connection",
            "pod": {"name": "w-ws", "uid": "pod-0"}}),
    );
    let pod = pod_of(&ws, json!({"phase": "Pending"}));
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.last_activity, None);
    assert_eq!(d.status.last_activity_signal, None);
    // The same pod keeps what its agent said.
    let mut same = ws.clone();
    same.status.as_mut().unwrap().pod.as_mut().unwrap().uid = Some("pod-1".into());
    let d = decide(&same, Some(&pod), &[]);
    assert!(d.status.last_activity.is_some());
}

#[test]
fn without_the_admission_policy_only_a_workspace_that_names_nothing_gets_a_pod() {
    let decide = |spec: Value| {
        let ws = workspace(spec, json!({}));
        derive(
            &Observed {
                workspace: &ws,
                pod: None,
                warnings: &[],
                claim: None,
                service: None,
                taken: &[],
                agent: None,
                refusal: None,
                activity: None,
                content: None,
                admission: Some(
                    "the ValidatingAdmissionPolicy workspaces.berth.dev is not installed",
                ),
                admission_since: None,
                kind: &crate::kinds::NO_KIND,
                expectations: Default::default(),
            },
            &Policy::default(),
            now(),
        )
    };
    let plain = decide(json!({"image": "x:1"}));
    assert_eq!(plain.actions, [Action::CreatePod]);
    let named = decide(json!({"image": "x:1", "serviceAccountName": "deployer"}));
    assert!(named.actions.is_empty(), "{:?}", named.actions);
    assert_eq!(named.status.phase, Some(Phase::Error));
    let ready = condition_of(&named, "Ready");
    assert_eq!(ready.reason, "AdmissionNotInstalled");
    assert!(ready.message.contains("what spec.serviceAccountName names (the ValidatingAdmissionPolicy workspaces.berth.dev is not installed)"), "{}", ready.message);
    assert_eq!(notice_reasons(&named), ["AdmissionNotInstalled"]);
    // What was seen while nothing checked it is recorded so.
    let record = named.status.admission.clone().unwrap();
    assert_eq!((record.generation, record.checked), (1, false));
    assert_eq!(record.spec.len(), 16);
    assert_eq!(
        plain.status.admission, None,
        "a plain workspace names nothing"
    );
}

/// A spec written while admission did not enforce stays unchecked once it does (its record
/// says so), and so does one written before the operator saw admission begin to enforce;
/// a new generation or `berth.dev/check` value written since is checked, and starts.
#[test]
fn a_spec_written_while_nothing_checked_it_gets_no_pod_until_it_is_checked() {
    let decide = |ws: &Workspace, missing: Option<&str>, since: Option<u64>| {
        derive(
            &Observed {
                admission: missing,
                admission_since: since,
                ..only(ws)
            },
            &Policy::default(),
            now(),
        )
    };
    let spec = json!({"image": "x:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/s"}]}}});
    let mut ws = workspace(spec.clone(), json!({}));
    ws.metadata.resource_version = Some("100".into());
    // Seen while the policy is missing: recorded unchecked.
    let gap = decide(
        &ws,
        Some("the ValidatingAdmissionPolicy workspaces.berth.dev is not installed"),
        None,
    );
    let record = gap.status.admission.clone().unwrap();
    assert!(!record.checked);
    assert!(condition_of(&gap, "Ready").message.ends_with("this spec was written meanwhile, so it is checked once its author sets a new value of the annotation berth.dev/check."));
    // Resumed or paused, it is the same spec to admission.
    let mut paused = ws.clone();
    paused.spec.paused = true;
    paused.metadata.generation = Some(2);
    paused.status = Some(gap.status.clone());
    let same = decide(&paused, None, None);
    assert_eq!(same.status.admission, gap.status.admission);
    // The policy is back: still no pod, saying why and how.
    ws.status = Some(gap.status.clone());
    ws.metadata.resource_version = Some("120".into());
    let back = decide(&ws, None, None);
    assert!(back.actions.is_empty(), "{:?}", back.actions);
    assert_eq!(back.status.phase, Some(Phase::Error));
    let ready = condition_of(&back, "Ready");
    assert_eq!(ready.reason, "AdmissionUnchecked");
    assert_eq!(
        ready.message,
        "No pod: this spec (generation 1) was written while the admission policy was not enforcing, so nothing checked that its author may use what spec.podTemplate.volumes.secrets[0] names. To have it checked, its author sets a new value of the annotation berth.dev/check: kubectl annotate workspace w berth.dev/check=$(date +%s) --overwrite; it then starts, or the API server says what its author may not use."
    );
    assert_eq!(notice_reasons(&back), ["AdmissionUnchecked"]);
    // Checked again (a new annotation value written while the policy enforces): it starts.
    let mut checked = ws.clone();
    checked.status = Some(back.status.clone());
    checked.metadata.annotations = Some([("berth.dev/check".to_owned(), "1".to_owned())].into());
    checked.metadata.resource_version = Some("130".into());
    let started = decide(&checked, None, Some(110));
    assert_eq!(started.actions, [Action::CreatePod]);
    assert!(started.status.admission.as_ref().unwrap().checked);

    // First seen only after the operator saw the policy begin to enforce, but written before:
    // unchecked. Written after: checked. No change seen: checked (nothing says otherwise).
    let mut fresh = workspace(spec, json!({}));
    fresh.metadata.resource_version = Some("105".into());
    let before = decide(&fresh, None, Some(110));
    assert_eq!(condition_of(&before, "Ready").reason, "AdmissionUnchecked");
    assert_eq!(decide(&fresh, None, Some(100)).actions, [Action::CreatePod]);
    assert_eq!(decide(&fresh, None, None).actions, [Action::CreatePod]);
}

/// Makes `claim` request `size` of storage.
fn requesting(claim: &mut PersistentVolumeClaim, size: &str) {
    let resources = claim.spec.as_mut().unwrap().resources.as_mut().unwrap();
    resources.requests = Some(
        [(
            "storage".to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.into()),
        )]
        .into(),
    );
}

#[test]
fn a_grown_home_size_grows_the_claim_and_says_so_until_it_has_grown() {
    let spec = json!({"image": "x:1", "podTemplate": {"volumes": {"home": {"size": "2Gi", "mountPath": "/h"}}}});
    let ws = workspace(spec.clone(), started(3));
    let mut claim = pod::build_claim(&ws).unwrap();
    requesting(&mut claim, "1Gi");
    claim.status =
        serde_json::from_value(json!({"phase": "Bound", "capacity": {"storage": "1024Mi"}}))
            .unwrap();
    let decide_with = |claim: &PersistentVolumeClaim| {
        derive(
            &Observed {
                claim: Some(claim),
                ..only(&ws)
            },
            &Policy::default(),
            now(),
        )
    };
    let d = decide_with(&claim);
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::ResizeClaim { .. })),
        "{:?}",
        d.actions
    );
    assert!(!d.actions.contains(&Action::CreateClaim));
    assert_eq!(
        d.status.message.as_deref(),
        Some("Growing claim w-home to 2Gi (waiting for the storage provider)")
    );

    // Requested, the provider resizing: no second request, its words in the message.
    requesting(&mut claim, "2Gi");
    claim.status = serde_json::from_value(json!({"phase": "Bound", "capacity": {"storage": "1Gi"},
        "conditions": [{"type": "Resizing", "status": "True", "message": "External resizer is resizing volume pvc-1"}]})).unwrap();
    let d = decide_with(&claim);
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::ResizeClaim { .. }))
    );
    assert_eq!(
        d.status.message.as_deref(),
        Some("Growing claim w-home to 2Gi (Resizing: External resizer is resizing volume pvc-1)")
    );

    // Grown: nothing more to say about the claim.
    claim.status =
        serde_json::from_value(json!({"phase": "Bound", "capacity": {"storage": "2Gi"}})).unwrap();
    let d = decide_with(&claim);
    assert_eq!(d.status.message.as_deref(), Some("Creating pod w-ws"));
}

/// Idle culling (issue 17): a running workspace whose agent was verified, with an idle
/// timeout of 60 s, ready since 100 s ago.
mod culling {
    use super::*;
    use crate::idle::{ActivityCheck, ActivityOutcome};

    fn running(idle_timeout: &str) -> (Workspace, Pod) {
        let spec = json!({"image": "x:1", "lifecycle": {"idleTimeout": idle_timeout}});
        let unverified = workspace(spec.clone(), started(100));
        let pod = ready_pod(&unverified);
        let first = decide_checked(&unverified, &pod, &verified());
        let mut ws = workspace(spec, json!({}));
        ws.status = Some(WorkspaceStatus {
            ready_at: Some(Time(Timestamp::from_second(NOW - 100).unwrap())),
            ..first.status
        });
        (ws, pod)
    }

    fn seen(asked_ago: i64, used_ago: i64, detail: &str) -> ActivityCheck {
        ActivityCheck {
            pod_uid: "pod-1".into(),
            asked_at: Timestamp::from_second(NOW - asked_ago).unwrap(),
            outcome: ActivityOutcome::Seen {
                at: Timestamp::from_second(NOW - used_ago).unwrap(),
                signal: "Connection".into(),
                detail: detail.into(),
            },
            fresh: true,
            retry_in: Duration::ZERO,
        }
    }

    fn decide_with(ws: &Workspace, pod: &Pod, activity: &ActivityCheck) -> Decision {
        derive(
            &Observed {
                pod: Some(&CachedPod::from(pod)),
                activity: Some(activity),
                content: None,
                ..only(ws)
            },
            &Policy::default(),
            now(),
        )
    }

    #[test]
    fn an_answer_showing_no_use_for_the_timeout_pauses_the_workspace() {
        let (ws, pod) = running("60s");
        let d = decide_with(&ws, &pod, &seen(0, 90, "a connection to port 8080"));
        assert_eq!(d.actions, vec![Action::Cull]);
        assert_eq!(d.status.phase, Some(Phase::Stopping));
        let ready = condition_of(&d, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Idle")
        );
        assert!(
            ready.message.starts_with("Nobody used the workspace for 1m30s (the last use its agent saw: a connection to port 8080, at "),
            "{}",
            ready.message
        );
        assert!(
            ready
                .message
                .ends_with("set spec.paused to false to resume.")
        );
        let culled = d
            .notices
            .iter()
            .find(|n| n.reason == "Culled")
            .expect("a Culled event");
        assert!(!culled.warning);
        assert!(
            culled
                .note
                .contains("nobody used it for 1m30s (idleTimeout 1m)"),
            "{}",
            culled.note
        );
        assert_eq!(
            d.status.last_activity.as_ref().map(|t| t.0),
            Some(Timestamp::from_second(NOW - 90).unwrap())
        );
        assert_eq!(d.status.last_activity_signal.as_deref(), Some("Connection"));
    }

    #[test]
    fn recent_use_keeps_it_running_and_is_remembered() {
        let (ws, pod) = running("60s");
        let d = decide_with(&ws, &pod, &seen(0, 10, "a heartbeat from vscode"));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(d.status.phase, Some(Phase::Running));
        assert_eq!(d.status.message.as_deref(), Some("Workspace is running"));
        assert_eq!(
            d.status.last_activity.as_ref().map(|t| t.0),
            Some(Timestamp::from_second(NOW - 10).unwrap())
        );
        // Asked now, 50 s of idle time left: the next ask in half of that.
        assert_eq!(d.requeue, Duration::from_secs(25));
    }

    /// `status.lastActivity` only moves forward: an older reading (an answer that arrived
    /// late, another replica's) never overwrites a newer one, and a reading of the same second
    /// rewrites nothing, not even the signal.
    #[test]
    fn the_last_activity_only_moves_forward() {
        let (mut ws, pod) = running("600s");
        let remembered = |ws: &Workspace| {
            let s = ws.status.as_ref().unwrap();
            (
                s.last_activity.as_ref().map(|t| t.0.as_second()),
                s.last_activity_signal.clone(),
            )
        };
        ws.status.as_mut().unwrap().last_activity =
            Some(Time(Timestamp::from_second(NOW - 20).unwrap()));
        ws.status.as_mut().unwrap().last_activity_signal = Some("Cpu".into());
        let older = decide_with(&ws, &pod, &seen(0, 30, "a connection"));
        assert_eq!(older.status, *ws.status.as_ref().unwrap(), "older");
        let same = decide_with(&ws, &pod, &seen(0, 20, "a connection"));
        assert_eq!(same.status, *ws.status.as_ref().unwrap(), "same second");
        let newer = decide_with(&ws, &pod, &seen(0, 5, "a connection"));
        ws.status = Some(newer.status);
        assert_eq!(remembered(&ws), (Some(NOW - 5), Some("Connection".into())));
    }

    #[test]
    fn an_answer_from_before_the_deadline_never_culls_even_when_read_late() {
        let (ws, pod) = running("60s");
        // Asked 50 s ago, when the workspace had been idle for 40 s: not enough, whatever now is.
        let d = decide_with(&ws, &pod, &seen(50, 90, "the agent started"));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(d.status.phase, Some(Phase::Running));
    }

    #[test]
    fn an_agent_that_cannot_be_asked_never_gets_it_culled_and_it_says_so() {
        let (ws, pod) = running("60s");
        let failed = ActivityCheck {
            outcome: ActivityOutcome::Failed {
                reason: "AgentUnreachable".into(),
                message: "connection refused".into(),
            },
            retry_in: Duration::from_secs(5),
            ..seen(0, 0, "")
        };
        let d = decide_with(&ws, &pod, &failed);
        assert!(d.actions.is_empty());
        assert_eq!(d.status.phase, Some(Phase::Running));
        assert_eq!(
            d.status.message.as_deref(),
            Some(
                "Workspace is running; its agent cannot say whether it is in use (AgentUnreachable: connection refused), so it is not stopped when idle. Berth keeps asking."
            )
        );
        assert_eq!(notice_reasons(&d), ["ActivityUnknown"]);
        assert_eq!(d.requeue, Duration::from_secs(5));
        let again = decide_with(
            &ws,
            &pod,
            &ActivityCheck {
                fresh: false,
                ..failed
            },
        );
        assert!(again.notices.is_empty(), "one event per failed ask");
    }

    #[test]
    fn without_an_answer_it_runs_and_looks_again_when_the_first_ask_is_due() {
        let (ws, pod) = running("60s");
        let d = decide_checked(&ws, &pod, &verified());
        assert!(d.actions.is_empty());
        assert_eq!(d.status.phase, Some(Phase::Running));
        // Ready 100 s ago: the halfway ask is overdue, so it is made now; its answer wakes the
        // workspace, and the requeue is only the safety net.
        assert_eq!(d.requeue, Duration::from_secs(1));
    }

    #[test]
    fn a_culled_workspace_says_idle_while_it_stops_and_once_stopped() {
        let (ws, pod) = running("60s");
        let culling = decide_with(&ws, &pod, &seen(0, 90, "the agent started"));
        let mut paused = ws.clone();
        paused.spec.paused = true;
        paused.status = Some(culling.status.clone());
        let stopping = decide(&paused, Some(&pod), &[]);
        assert_eq!(stopping.status.phase, Some(Phase::Stopping));
        assert_eq!(condition_of(&stopping, "Ready").reason, "Idle");
        assert!(
            !notice_reasons(&stopping).contains(&"Paused"),
            "Culled said it"
        );
        paused.status = Some(stopping.status.clone());
        let stopped = decide(&paused, None, &[]);
        assert_eq!(stopped.status.phase, Some(Phase::Stopped));
        let ready = condition_of(&stopped, "Ready");
        assert_eq!(ready.reason, "Idle");
        assert_eq!(
            stopped.status.message.as_deref(),
            Some(ready.message.as_str())
        );
        assert!(stopped.notices.is_empty());

        // Resumed by the user: Resumed, and a pod again.
        let mut resumed = paused.clone();
        resumed.spec.paused = false;
        resumed.status = Some(stopped.status.clone());
        let d = decide(&resumed, None, &[]);
        assert!(d.actions.contains(&Action::CreatePod));
        assert!(notice_reasons(&d).contains(&"Resumed"));
    }

    #[test]
    fn a_pause_by_the_user_stays_a_pause() {
        let (mut ws, pod) = running("60s");
        ws.spec.paused = true;
        let d = decide(&ws, Some(&pod), &[]);
        assert_eq!(condition_of(&d, "Ready").reason, "Paused");
        assert!(notice_reasons(&d).contains(&"Paused"));
    }

    #[test]
    fn the_remembered_activity_is_a_fixpoint() {
        let (ws, pod) = running("60s");
        // A time with a fraction of a second is stored in whole seconds, and compares equal then.
        let mut check = seen(0, 10, "a connection to port 8080");
        if let ActivityOutcome::Seen { at, .. } = &mut check.outcome {
            *at = at.checked_add(Duration::from_millis(300)).unwrap();
        }
        let first = decide_with(&ws, &pod, &check);
        let stored: WorkspaceStatus =
            serde_json::from_value(serde_json::to_value(&first.status).unwrap()).unwrap();
        let mut settled = ws.clone();
        settled.status = Some(stored.clone());
        let second = decide_with(
            &settled,
            &pod,
            &ActivityCheck {
                fresh: false,
                ..check
            },
        );
        assert_eq!(second.status, stored);
        assert!(second.actions.is_empty() && second.notices.is_empty());
    }
}

/// Rule C16, coalesced. What a user sees: a start's progress (bound to a node, containers
/// being created, the agent being checked) reaches the status at most once a second, while a
/// problem (an image that cannot be pulled) and the phase Running are written at once.
#[test]
fn progress_within_a_start_is_written_at_most_once_per_interval() {
    let second = Duration::from_secs(1);
    // The status written when the pod was created.
    let creating = decide(&workspace(json!({"image": "x:1"}), started(3)), None, &[]);
    assert!(!creating.actions.is_empty());
    let ws = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&creating.status).unwrap(),
    );
    let pending = pod_of(&ws, json!({"phase": "Pending"}));
    let first = decide(&ws, Some(&pending), &[]);
    assert_eq!(
        (creating.status.phase, first.status.phase),
        (Some(Phase::Pending), Some(Phase::Starting))
    );
    assert_eq!(
        hold_back(
            &ws.status.clone().unwrap(),
            &first,
            Some(Duration::ZERO),
            second
        ),
        None,
        "a new phase is written at once"
    );
    let ws = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&first.status).unwrap(),
    );
    let old = ws.status.clone().unwrap();

    let creating = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    let d = decide(&ws, Some(&creating), &[]);
    assert_ne!(d.status, old, "there is progress to write");
    assert_eq!(
        hold_back(&old, &d, Some(Duration::from_millis(200)), second),
        Some(Duration::from_millis(800)),
        "written 200 ms ago: held back for the rest of the second"
    );
    assert_eq!(hold_back(&old, &d, Some(2 * second), second), None);
    assert_eq!(
        hold_back(&old, &d, None, second),
        None,
        "not written lately"
    );
    assert_eq!(
        hold_back(&old, &d, Some(Duration::ZERO), Duration::ZERO),
        None,
        "an interval of 0 writes every step"
    );

    // A Normal event waits with the status it goes with: while the status is held back, the
    // next decision derives the event again.
    let running = pod_of(
        &ws,
        json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}]}),
    );
    let d = decide(&ws, Some(&running), &[]);
    assert_eq!(notice_reasons(&d), ["Started"]);
    assert_eq!(
        hold_back(&old, &d, Some(Duration::ZERO), second),
        Some(second)
    );
    assert_eq!(
        notice_reasons(&decide(&ws, Some(&running), &[])),
        ["Started"]
    );

    // A problem is written at once.
    let stuck = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}}]}),
    );
    let d = decide(&ws, Some(&stuck), &[]);
    assert_eq!(condition_of(&d, "Ready").reason, "ErrImagePull");
    assert_eq!(hold_back(&old, &d, Some(Duration::ZERO), second), None);

    // So is the phase a user waits for.
    let ready = ready_pod(&ws);
    let d = decide_checked(&ws, &ready, &verified());
    assert_eq!(d.status.phase, Some(Phase::Running));
    assert_eq!(hold_back(&old, &d, Some(Duration::ZERO), second), None);

    // And anything that acts: the write guards the action.
    let d = decide(&ws, None, &[]);
    assert!(!d.actions.is_empty());
    assert_eq!(hold_back(&old, &d, Some(Duration::ZERO), second), None);
}

/// The pod cache keeps only what decisions read (`cached_pod.rs`): a pod the operator built,
/// in each status a kubelet gives it, decodes into its cached form, which says whether its
/// agent serves TLS, and a decision on it is the one its status calls for.
#[test]
fn a_built_pod_in_every_status_is_decided_on_as_the_cache_keeps_it() {
    let ws = workspace(json!({"image": "x:1"}), started(3));
    let statuses = [
        json!({"phase": "Pending"}),
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}}]}),
        json!({"phase": "Running", "podIP": "10.0.0.1", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}]}),
        json!({"phase": "Running", "podIP": "127.1.0.1", "conditions": [scheduled(), {"type": "Ready", "status": "True"}]}),
        json!({"phase": "Failed", "reason": "OutOfcpu", "message": "Pod was rejected: Node didn't have enough resource: cpu"}),
        json!({"phase": "Unknown", "message": "node-1 is lost"}),
    ];
    let with_tls = crate::config::AgentConfig {
        tls: Some(crate::config::AgentTls {
            secret: "agent-tls".into(),
            ca_pem: b"ca".to_vec(),
        }),
        ..Default::default()
    };
    for agent in [crate::config::AgentConfig::default(), with_tls] {
        for status in &statuses {
            let mut whole = pod::build_pod(&ws, &agent);
            whole.metadata.uid = Some("pod-1".into());
            whole.spec.as_mut().unwrap().node_name = Some("node-1".into());
            whole.status = serde_json::from_value(status.clone()).unwrap();
            let cached = CachedPod::from(&whole);
            assert_eq!(pod::serves_agent_tls(&cached), agent.tls.is_some());
            assert_eq!(
                cached.status.as_ref().and_then(|s| s.phase.as_deref()),
                status["phase"].as_str()
            );
            let d = decide(&ws, Some(&whole), &[]);
            let checked = decide_checked(&ws, &whole, &verified());
            if status["phase"] == "Failed" {
                // Rejected by its kubelet: replaced.
                assert!(
                    d.actions
                        .iter()
                        .any(|a| matches!(a, Action::DeletePod { .. })),
                    "{status}: {:?}",
                    d.actions
                );
            }
            if status["podIP"] == "127.1.0.1" {
                assert_eq!(checked.status.phase, Some(Phase::Running), "{status}");
            }
        }
    }
}

#[path = "state/families_tests.rs"]
mod families;

/// A user would see: a running workspace whose service name someone else's Service holds is
/// `Error`, reason NameTaken, with one Warning, and no event saying it is ready while it is
/// not, however often it is looked at; once the name is free, "Workspace is ready" once.
#[test]
fn a_workspace_a_taken_name_holds_never_says_it_is_ready() {
    let ws = workspace(
        json!({"image": "x:1", "ports": [{"name": "http", "port": 8080}]}),
        started(10),
    );
    let pod = ready_pod(&ws);
    let theirs: Service = serde_json::from_value(
        json!({"metadata": {"name": "w", "namespace": "team-a", "uid": "svc-theirs"}}),
    )
    .unwrap();
    let look_at = |ws: &Workspace, service: Option<&Service>, check: &AgentCheck, when| {
        derive(
            &Observed {
                workspace: ws,
                pod: Some(&CachedPod::from(&pod)),
                warnings: &[],
                claim: None,
                service,
                taken: &[],
                agent: Some(check),
                refusal: None,
                activity: None,
                content: None,
                admission: None,
                admission_since: None,
                kind: &crate::kinds::NO_KIND,
                expectations: Default::default(),
            },
            &Policy::default(),
            when,
        )
    };
    let look = |ws: &Workspace, service: Option<&Service>, check: &AgentCheck| {
        look_at(ws, service, check, now())
    };
    let reasons = |d: &Decision| {
        d.notices
            .iter()
            .map(|n| n.reason.to_string())
            .collect::<Vec<_>>()
    };
    let first = look(&ws, Some(&theirs), &verified());
    assert_eq!(first.status.phase, Some(Phase::Error));
    assert_eq!(condition_of(&first, "Ready").reason, "NameTaken");
    assert_eq!(first.status.ready_at, None);
    assert!(reasons(&first).contains(&"NameTaken".to_owned()));
    assert!(
        !reasons(&first).contains(&"Ready".to_owned()),
        "{:?}",
        reasons(&first)
    );
    let mut written = ws.clone();
    written.status = Some(first.status.clone());
    let known = check(
        AgentOutcome::Verified {
            identity: OPERATOR.into(),
        },
        false,
    );
    // Looked at again later, the world unchanged: nothing to write, nothing to tell.
    let later = now() + jiff::SignedDuration::from_secs(5);
    let again = look_at(&written, Some(&theirs), &known, later);
    assert_eq!(reasons(&again), Vec::<String>::new());
    assert_eq!(again.status, first.status);
    // The Service is deleted: the workspace is ready, and says so once.
    let freed = look(&written, None, &known);
    assert_eq!(freed.status.phase, Some(Phase::Running));
    assert_eq!(reasons(&freed), ["Ready"]);
    assert_eq!(freed.status.ready_at.as_ref().map(|t| t.0), Some(now()));
    written.status = Some(freed.status.clone());
    assert_eq!(reasons(&look(&written, None, &known)), Vec::<String>::new());
}

/// A create the API server accepted is trusted to show up in the cache for
/// [`EXPECTATION_TTL`], for the kind it created (and an update of the service like its
/// create); then it is sent again.
#[test]
fn an_accepted_create_is_trusted_for_its_own_kind_until_the_expectation_expires() {
    let ago = |seconds: i64| Some(Timestamp::from_second(NOW - seconds).unwrap());
    let ttl = EXPECTATION_TTL.as_secs() as i64;
    let kinds: [(Expectations, Action); 4] = [
        (
            Expectations {
                pod: ago(1),
                ..Default::default()
            },
            Action::CreatePod,
        ),
        (
            Expectations {
                claim: ago(1),
                ..Default::default()
            },
            Action::CreateClaim,
        ),
        (
            Expectations {
                service: ago(1),
                ..Default::default()
            },
            Action::CreateService,
        ),
        (
            Expectations {
                service: ago(1),
                ..Default::default()
            },
            Action::UpdateService { uid: "s".into() },
        ),
    ];
    for (expected, action) in &kinds {
        assert!(expected.covers(action, now()), "{action:?}");
        // Another kind's expectation says nothing of this one.
        let others = kinds.iter().filter(|(e, _)| e != expected);
        for (other, _) in others {
            assert!(!other.covers(action, now()), "{action:?} by {other:?}");
        }
    }
    let pod_sent = |seconds: i64| Expectations {
        pod: ago(seconds),
        ..Default::default()
    };
    assert!(pod_sent(ttl - 1).covers(&Action::CreatePod, now()));
    assert!(
        !pod_sent(ttl).covers(&Action::CreatePod, now()),
        "expired at the TTL"
    );
    assert!(!pod_sent(1).covers(&Action::DeletePod { uid: "p".into() }, now()));
}

/// Rule C2: an event's time is its series' last observation, else its last timestamp, else
/// its event time, else when it was created.
#[test]
fn an_events_time_is_the_latest_it_says_of_itself() {
    let mut event = warning("pod-1", "FailedMount", "m", 1, 30);
    event.metadata.creation_timestamp = Some(Time(Timestamp::from_second(NOW - 40).unwrap()));
    event.event_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        Timestamp::from_second(NOW - 35).unwrap(),
    ));
    let seconds_ago = |e: &Event| event_time(e).map(|t| NOW - t.as_second());
    event.series = Some(
        serde_json::from_value(
            json!({"count": 3, "lastObservedTime": "2027-01-15T08:00:00.000000Z"}),
        )
        .unwrap(),
    );
    assert_eq!(
        event_time(&event).map(|t| t.to_string()),
        Some("2027-01-15T08:00:00Z".to_owned()),
        "series"
    );
    event.series = None;
    assert_eq!(seconds_ago(&event), Some(30), "lastTimestamp");
    event.last_timestamp = None;
    assert_eq!(seconds_ago(&event), Some(35), "eventTime");
    event.event_time = None;
    assert_eq!(seconds_ago(&event), Some(40), "creationTimestamp");
    event.metadata.creation_timestamp = None;
    assert_eq!(seconds_ago(&event), None);
}

/// Unschedulable is read from the pod's PodScheduled condition alone, when it is False for
/// that reason; an admin who counts it as an error gets `Error`.
#[test]
fn unschedulable_is_an_error_only_when_the_scheduler_says_so_and_the_admin_counts_it() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let strict = Policy {
        warnings: "FailedScheduling=error".parse().unwrap(),
        ..Policy::default()
    };
    let decide_strict = |pod: &Pod| {
        derive(
            &Observed {
                pod: Some(&CachedPod::from(pod)),
                ..only(&ws)
            },
            &strict,
            now(),
        )
    };
    let with = |scheduled: Value| {
        pod_of(
            &ws,
            json!({"phase": "Pending", "conditions": [{"type": "Initialized", "status": "True"}, scheduled]}),
        )
    };
    let unschedulable = with(
        json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}),
    );
    assert_eq!(
        decide_strict(&unschedulable).status.phase,
        Some(Phase::Error)
    );
    for (what, scheduled) in [
        (
            "another reason",
            json!({"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": "m"}),
        ),
        (
            "bound",
            json!({"type": "PodScheduled", "status": "True", "reason": "Unschedulable"}),
        ),
    ] {
        let d = decide_strict(&with(scheduled));
        assert_ne!(d.status.phase, Some(Phase::Error), "{what}");
    }
}

/// A rejection is told once: a PodRejected condition that is False (the last rejection was
/// dealt with) does not count as told, even with the same reason.
#[test]
fn a_rejection_is_told_again_once_the_last_one_was_dealt_with() {
    let ws = workspace(
        json!({"image": "x:1"}),
        json!({"phase": "Starting", "observedGeneration": 1, "startedAt": at(30), "podRecreations": 1,
            "pod": {"name": "w-ws", "uid": "pod-1"},
            "conditions": [{"type": "PodRejected", "status": "False", "reason": "OutOfcpu", "message": "", "lastTransitionTime": at(20)}]}),
    );
    let d = decide(&ws, Some(&rejected_pod(&ws, "OutOfcpu")), &[]);
    assert!(
        d.notices
            .iter()
            .any(|n| n.warning && n.reason == "PodRejected"),
        "{:?}",
        d.notices
    );
}

/// A start whose status was written twice: Pending (the pod created), then Starting (the pod
/// seen, not scheduled yet).
fn starting_with_its_pod() -> Workspace {
    let ws = workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(
            decide(&workspace(json!({"image": "x:1"}), started(3)), None, &[]).status,
        )
        .unwrap(),
    );
    let first = decide(&ws, Some(&pod_of(&ws, json!({"phase": "Pending"}))), &[]);
    workspace(
        json!({"image": "x:1"}),
        serde_json::to_value(&first.status).unwrap(),
    )
}

/// Only progress is held back: a start that waits on something that is not progress (no
/// node fits) is written at once, though it publishes no Warning.
#[test]
fn a_start_waiting_on_a_problem_is_written_at_once() {
    let ws = starting_with_its_pod();
    let unschedulable = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
    );
    let d = decide(&ws, Some(&unschedulable), &[]);
    assert_eq!(d.status.phase, Some(Phase::Starting));
    assert!(d.notices.iter().all(|n| !n.warning), "{:?}", d.notices);
    assert_eq!(
        hold_back(
            ws.status.as_ref().unwrap(),
            &d,
            Some(Duration::ZERO),
            Duration::from_secs(1)
        ),
        None
    );
}

/// Progress is held back only when the decision does nothing else: an action (a write guards
/// every action) or a Warning is written at once.
#[test]
fn progress_with_an_action_or_a_warning_is_written_at_once() {
    let ws = starting_with_its_pod();
    let creating = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    let old = ws.status.clone().unwrap();
    let second = Duration::from_secs(1);
    let d = decide(&ws, Some(&creating), &[]);
    assert_eq!(
        hold_back(&old, &d, Some(Duration::ZERO), second),
        Some(second)
    );
    let mut acting = d.clone();
    acting.actions.push(Action::CreateService);
    assert_eq!(hold_back(&old, &acting, Some(Duration::ZERO), second), None);
    let mut warning = d.clone();
    warning
        .notices
        .push(Notice::warning("FailedMount", "m".into()));
    assert_eq!(
        hold_back(&old, &warning, Some(Duration::ZERO), second),
        None
    );
}

/// The claim and the service follow the spec, and only the workspace's own are ever changed
/// (#27): a claim or service of the same name that is someone else's is never grown, updated
/// or deleted.
#[test]
fn the_claim_and_service_follow_the_spec_and_only_the_workspaces_own_are_touched() {
    let with_ports = json!({"image": "x:1", "ports": [{"name": "http", "port": 8080}],
        "podTemplate": {"volumes": {"home": {"size": "2Gi", "mountPath": "/h"}}}});
    let ws = workspace(with_ports, started(3));
    let plain = workspace(json!({"image": "x:1"}), started(3));
    let own_service = pod::build_service(&ws).unwrap();
    let mut other_ports = own_service.clone();
    other_ports.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 9090;
    let theirs = |mut service: Service| {
        service.metadata.owner_references = None;
        service.metadata.uid = Some("theirs".into());
        service
    };
    let mut small_claim = pod::build_claim(&ws).unwrap();
    requesting(&mut small_claim, "1Gi");
    small_claim.metadata.uid = Some("claim-1".into());
    let mut their_claim = small_claim.clone();
    their_claim.metadata.owner_references = None;
    let decide_with =
        |ws: &Workspace, claim: Option<&PersistentVolumeClaim>, service: Option<&Service>| {
            derive(
                &Observed {
                    workspace: ws,
                    pod: None,
                    warnings: &[],
                    claim,
                    service,
                    taken: &[],
                    agent: None,
                    refusal: None,
                    activity: None,
                    content: None,
                    admission: None,
                    admission_since: None,
                    kind: &crate::kinds::NO_KIND,
                    expectations: Default::default(),
                },
                &Policy::default(),
                now(),
            )
            .actions
        };
    let service_actions = |actions: Vec<Action>| -> Vec<Action> {
        actions
            .into_iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::CreateService
                        | Action::UpdateService { .. }
                        | Action::DeleteService { .. }
                )
            })
            .collect()
    };
    let claim = Some(&small_claim);
    assert_eq!(
        service_actions(decide_with(&ws, claim, None)),
        [Action::CreateService],
        "ports and no service"
    );
    assert_eq!(
        service_actions(decide_with(&ws, claim, Some(&own_service))),
        [],
        "its own, as the spec says"
    );
    let uid = own_service.metadata.uid.clone().unwrap_or_default();
    assert_eq!(
        service_actions(decide_with(&ws, claim, Some(&other_ports))),
        [Action::UpdateService { uid: uid.clone() }],
        "its own, with other ports"
    );
    assert_eq!(
        service_actions(decide_with(&ws, claim, Some(&theirs(other_ports.clone())))),
        [],
        "someone else's, with other ports"
    );
    assert_eq!(
        service_actions(decide_with(&plain, None, Some(&own_service))),
        [Action::DeleteService { uid }],
        "no ports any more: its own goes"
    );
    assert_eq!(
        service_actions(decide_with(
            &plain,
            None,
            Some(&theirs(own_service.clone()))
        )),
        [],
        "someone else's stays"
    );
    let grows = |claim: &PersistentVolumeClaim| {
        decide_with(&ws, Some(claim), Some(&own_service))
            .iter()
            .any(|a| matches!(a, Action::ResizeClaim { .. }))
    };
    assert!(grows(&small_claim), "its own claim grows with home.size");
    assert!(!grows(&their_claim), "someone else's claim is never grown");
}

/// An idle timeout of zero (the CRD refuses it; an object stored before that rule may hold
/// it) is a spec that cannot work, said as such, not a workspace culled at once.
#[test]
fn an_idle_timeout_of_zero_is_a_spec_that_cannot_work() {
    let ws = workspace(
        json!({"image": "x:1", "lifecycle": {"idleTimeout": "0s"}}),
        started(3),
    );
    let d = decide(&ws, None, &[]);
    assert_eq!(
        d.status.message.as_deref(),
        Some("The spec cannot work: lifecycle.idleTimeout must be longer than 0s")
    );
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

/// `Resumed` is told of a workspace that was stopped because it was paused (by its user or
/// for idleness), and only of such a one.
#[test]
fn resumed_is_told_only_of_a_workspace_that_was_paused() {
    let stopped = |reason: &str| {
        workspace(
            json!({"image": "x:1"}),
            json!({"phase": "Stopped", "observedGeneration": 1,
                "conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": "", "lastTransitionTime": at(60)}]}),
        )
    };
    let told = |ws: &Workspace| notice_reasons(&decide(ws, None, &[])).contains(&"Resumed");
    assert!(told(&stopped("Paused")));
    assert!(told(&stopped("Idle")));
    assert!(!told(&stopped("Unknown")), "stopped, but not paused");
    let pending = workspace(
        json!({"image": "x:1"}),
        json!({"phase": "Pending", "observedGeneration": 1,
            "conditions": [{"type": "Stalled", "status": "False", "reason": "Paused", "message": "", "lastTransitionTime": at(60)}]}),
    );
    assert!(!told(&pending), "not stopped");
}

/// The names taken are what the caches show and what creates met, one per kind (what the
/// caches show first): a met service is named beside a foreign pod the cache shows.
#[test]
fn names_taken_are_those_the_caches_show_and_those_creates_met_one_per_kind() {
    let ws = workspace(
        json!({"image": "x:1", "ports": [{"name": "http", "port": 8080}]}),
        started(3),
    );
    let mut foreign = pod_of(&ws, json!({"phase": "Running"}));
    foreign.metadata.owner_references = None;
    let met = |kind: Derived| Foreign {
        kind,
        name: "met".into(),
        owner: None,
        met: Some(crate::ownership::Met {
            at: now(),
            attempts: 1,
        }),
    };
    let creates_met = [met(Derived::Pod), met(Derived::Service)];
    let found = taken(&Observed {
        pod: Some(&CachedPod::from(&foreign)),
        taken: &creates_met,
        ..only(&ws)
    });
    let seen: Vec<(Derived, bool)> = found.iter().map(|f| (f.kind, f.met.is_some())).collect();
    assert_eq!(seen, [(Derived::Pod, false), (Derived::Service, true)]);
}

/// A workspace Berth gave up on stays as it is (`Failed`, saying why) when a name it would
/// use is taken: there is nothing to create while it is failed.
#[test]
fn a_failed_workspace_stays_failed_when_a_name_is_taken() {
    let ws = workspace(
        json!({"image": "x:1", "ports": [{"name": "http", "port": 8080}]}),
        json!({"phase": "Failed", "observedGeneration": 1, "startedAt": at(900), "message": "gave up",
            "conditions": [{"type": "Stalled", "status": "True", "reason": "StartTimeout", "message": "gave up", "observedGeneration": 1, "lastTransitionTime": at(300)}]}),
    );
    let service = Service {
        metadata: serde_json::from_value(json!({"name": "w", "uid": "theirs"})).unwrap(),
        ..Default::default()
    };
    let d = derive(
        &Observed {
            service: Some(&service),
            ..only(&ws)
        },
        &Policy::default(),
        now(),
    );
    assert_eq!(d.status.phase, Some(Phase::Failed));
    assert!(
        find_condition(&d.status.conditions, types::READY).is_none_or(|c| c.reason != "NameTaken"),
        "{:?}",
        d.status.conditions
    );
}

#[test]
fn a_failed_reconcile_is_retried_after_a_doubling_wait_up_to_the_cap() {
    let cap = Duration::from_secs(5);
    let waits: Vec<u128> = (1..=6)
        .map(|a| retry_after_error(a, cap).as_millis())
        .collect();
    assert_eq!(waits, [500, 1000, 2000, 4000, 5000, 5000]);
}

#[test]
fn durations_are_said_as_a_person_writes_them() {
    let said = |ms: u64| human(Duration::from_millis(ms));
    assert_eq!(said(0), "0s");
    assert_eq!(said(500), "500ms");
    assert_eq!(said(90_000), "1m30s");
    assert_eq!(said(600_000), "10m");
    assert_eq!(said(3_600_000), "1h");
    assert_eq!(said(5_400_000), "1h30m");
}

/// An `Error` whose cause changes is told again, with the new cause, though the phase stays.
#[test]
fn an_error_whose_cause_changes_is_told_again() {
    let ws = workspace(
        json!({"image": "x:1"}),
        json!({"phase": "Error", "observedGeneration": 1, "startedAt": at(30), "pod": {"name": "w-ws", "uid": "pod-1"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "AgentUnreachable", "message": "", "lastTransitionTime": at(20)}]}),
    );
    let pod = ready_pod(&ws);
    let now_refused = failed_check("Unauthenticated", "m", false);
    let d = decide_checked(&ws, &pod, &now_refused);
    assert_eq!(d.status.phase, Some(Phase::Error));
    let warnings: Vec<&str> = d
        .notices
        .iter()
        .filter(|n| n.warning)
        .map(|n| n.reason.as_ref())
        .collect();
    assert_eq!(warnings, ["Unauthenticated"]);
}

/// A start with no progress is looked at again no later than its start timeout's end.
#[test]
fn a_stuck_start_is_looked_at_again_when_its_timeout_ends() {
    let mut ws = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "60s"}}),
        started(58),
    );
    ws.status.as_mut().unwrap().conditions = serde_json::from_value(json!([
        {"type": "PodScheduled", "status": "True", "reason": "Scheduled", "message": "", "lastTransitionTime": at(58)},
        {"type": "PodReady", "status": "False", "reason": "ContainerCreating", "message": "", "lastTransitionTime": at(58)},
        {"type": "Ready", "status": "False", "reason": "ContainerCreating", "message": "", "lastTransitionTime": at(58)}
    ]))
    .unwrap();
    let pod = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at(58)}], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    let d = decide(&ws, Some(&pod), &[]);
    assert_eq!(d.status.phase, Some(Phase::Starting));
    assert_eq!(d.requeue, Duration::from_secs(2));
}

/// Deleting a workspace whose pod is stopping is looked at again within a second, and never
/// past the end of the deletion grace period.
#[test]
fn a_deletion_is_looked_at_again_no_later_than_its_grace_ends() {
    let requeue_after = |deleting_for: i64| {
        let mut ws = workspace(json!({"image": "x:1"}), started(100));
        ws.metadata.deletion_timestamp =
            Some(Time(Timestamp::from_second(NOW - deleting_for).unwrap()));
        ws.metadata.finalizers = Some(vec![berth_api::labels::FINALIZER.into()]);
        let pod = ready_pod(&ws);
        decide(&ws, Some(&pod), &[]).requeue
    };
    let grace = Policy::default().deletion_grace.as_secs() as i64;
    assert_eq!(requeue_after(1), Duration::from_secs(1));
    assert_eq!(requeue_after(grace - 1), Duration::from_secs(1));
    let mut ws = workspace(json!({"image": "x:1"}), started(100));
    ws.metadata.deletion_timestamp = Some(Time(
        Timestamp::from_second(NOW - grace)
            .unwrap()
            .checked_add(jiff::SignedDuration::from_millis(400))
            .unwrap(),
    ));
    ws.metadata.finalizers = Some(vec![berth_api::labels::FINALIZER.into()]);
    let d = decide(&ws, Some(&ready_pod(&ws)), &[]);
    assert_eq!(
        d.requeue,
        Duration::from_millis(400),
        "the rest of the grace period"
    );
}

/// A create that met someone else's object is tried again after its wait (1 s after the
/// first); once that wait is over the workspace is not looked at in a loop, but on the
/// start's growing requeue.
#[test]
fn a_taken_name_is_looked_at_again_after_its_wait_and_never_in_a_loop() {
    let ws = workspace(json!({"image": "x:1"}), started(20));
    let requeue = |met_ago: i64| {
        let taken = [Foreign {
            kind: Derived::Pod,
            name: "w-ws".into(),
            owner: Some("Workspace other".into()),
            met: Some(crate::ownership::Met {
                at: Timestamp::from_second(NOW - met_ago).unwrap(),
                attempts: 1,
            }),
        }];
        derive(
            &Observed {
                taken: &taken,
                ..only(&ws)
            },
            &Policy::default(),
            now(),
        )
        .requeue
    };
    assert_eq!(requeue(0), Duration::from_secs(1));
    assert!(requeue(10) > Duration::ZERO);
}

/// `kubectl get ws` shows a message's lead (up to its first `. ` or `; `, at most 100
/// characters) in its MESSAGE column: what is wrong leads, and the API server's or the agent's
/// own words, which run to hundreds of characters, follow it.
#[test]
fn a_message_leads_with_what_is_wrong_however_long_the_words_it_quotes() {
    let ws = workspace(json!({"image": "x:1"}), started(1));
    let refusal = decide_refused(&ws, None, &refused(Action::CreatePod, 1, 0, true));
    let no_delegator = "TokenReview API is unavailable: grant system:auth-delegator to system:serviceaccount:team-a:default (kubectl create clusterrolebinding berth-agent-team-a-default --clusterrole=system:auth-delegator --serviceaccount=team-a:default)";
    let agent = decide_checked(
        &ws,
        &ready_pod(&ws),
        &failed_check("Unauthenticated", no_delegator, true),
    );
    for (d, lead) in [
        (refusal, "Cannot create pod w-ws (Forbidden)"),
        (
            agent,
            "The agent of pod w-ws refused the operator (Unauthenticated)",
        ),
    ] {
        assert!(d.status.message.as_deref().unwrap().len() > 100);
        assert_eq!(d.status.summary.as_deref(), Some(lead));
    }
}

/// A workspace of kind `python` that started on `devbox:1.4`, running in its ready pod.
fn running_of_a_kind() -> (Workspace, Pod) {
    let ws = workspace(
        json!({"image": "", "kind": "python", "command": ["sleep", "1d"]}),
        started(10),
    );
    let kind = crate::kinds::tests::kind("devbox:1.4", false);
    let mut shaped = crate::kinds::shape(&ws, Some(&kind), false).workspace;
    shaped.status.as_mut().unwrap().phase = Some(Phase::Running);
    let pod = ready_pod(&shaped);
    (shaped, pod)
}

#[test]
fn a_kinds_change_is_said_and_never_restarts_the_pod() {
    let (ws, pod) = running_of_a_kind();
    assert_eq!(
        pod.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some("devbox:1.4")
    );
    let changed = crate::kinds::tests::kind("devbox:1.4", true);
    let shaped = crate::kinds::shape(&ws, Some(&changed), true);
    let d = derive(
        &Observed {
            pod: Some(&CachedPod::from(&pod)),
            agent: Some(&verified()),
            kind: &shaped.update,
            ..only(&shaped.workspace)
        },
        &Policy::default(),
        now(),
    );
    assert_eq!(d.status.phase, Some(Phase::Running));
    assert!(!touches_the_pod(&d), "{:?}", d.actions);
    assert!(d.status.pending_restart);
    let update = condition_of(&d, "UpdateAvailable");
    assert_eq!(
        (update.status.as_str(), update.reason.as_str()),
        ("True", "KindChanged")
    );
    assert!(
        update.message.contains(r#"image: devbox:1.4 -> devbox:1.5 (option py311 redirects to py312: "3.11 is end of life")"#),
        "{}",
        update.message
    );
    // The same kind as recorded: up to date, nothing pending.
    let same = crate::kinds::shape(
        &ws,
        Some(&crate::kinds::tests::kind("devbox:1.4", false)),
        true,
    );
    let d = derive(
        &Observed {
            pod: Some(&CachedPod::from(&pod)),
            agent: Some(&verified()),
            kind: &same.update,
            ..only(&same.workspace)
        },
        &Policy::default(),
        now(),
    );
    assert!(!d.status.pending_restart);
    assert_eq!(condition_of(&d, "UpdateAvailable").reason, "UpToDate");
}

#[test]
fn a_start_from_a_missing_kind_waits_and_says_so_and_a_running_one_keeps_running() {
    let ws = workspace(json!({"image": "", "kind": "python"}), Value::Null);
    let shaped = crate::kinds::shape(&ws, None, false);
    let d = derive(
        &Observed {
            kind: &shaped.update,
            ..only(&shaped.workspace)
        },
        &Policy::default(),
        now(),
    );
    assert_eq!(d.status.phase, Some(Phase::Error));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    let stalled = condition_of(&d, "Stalled");
    assert_eq!(stalled.reason, "KindNotFound");
    assert_eq!(
        d.status.message.as_deref(),
        Some(
            r#"Cannot start: WorkspaceKind "python" does not exist (kubectl get workspacekinds lists those that do)"#
        )
    );
    assert!(
        notice_reasons(&d).contains(&"KindNotFound"),
        "{:?}",
        d.notices
    );

    let (running, pod) = running_of_a_kind();
    let gone = crate::kinds::shape(&running, None, true);
    let d = derive(
        &Observed {
            pod: Some(&CachedPod::from(&pod)),
            agent: Some(&verified()),
            kind: &gone.update,
            ..only(&gone.workspace)
        },
        &Policy::default(),
        now(),
    );
    assert_eq!(d.status.phase, Some(Phase::Running));
    assert!(!touches_the_pod(&d), "{:?}", d.actions);
    assert_eq!(condition_of(&d, "UpdateAvailable").status, "Unknown");
}

/// Whether a decision creates or deletes a pod (the claim and service are not observed here).
fn touches_the_pod(d: &Decision) -> bool {
    d.actions.iter().any(|a| {
        matches!(
            a,
            Action::CreatePod | Action::DeletePod { .. } | Action::ForceDeletePod { .. }
        )
    })
}

/// Content from git (issue 31): a ready pod whose agent authenticated the operator, whose
/// workspace clones `https://h/org/app.git` at `main` into `app`.
mod content {
    use super::*;
    use crate::content::{ContentCheck, ContentOutcome};
    use berth_api::condition::Reason;

    const URL: &str = "https://h/org/app.git";

    fn spec(reference: &str) -> Value {
        json!({
            "image": "x:1", "command": ["sh"],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}},
            "content": {"git": {"url": URL, "ref": reference, "auth": {"secretName": "git-creds"}}}
        })
    }

    /// The workspace after its agent was verified, and its pod.
    fn verified_workspace() -> (Workspace, Pod) {
        verified_workspace_of(spec("main"))
    }

    fn verified_workspace_of(spec: Value) -> (Workspace, Pod) {
        let unverified = workspace(spec.clone(), started(100));
        let pod = ready_pod(&unverified);
        let first = decide_checked(&unverified, &pod, &verified());
        let mut ws = workspace(spec, json!({}));
        ws.status = Some(first.status);
        (ws, pod)
    }

    fn asked(outcome: ContentOutcome, fresh: bool) -> ContentCheck {
        ContentCheck {
            pod_uid: "pod-1".into(),
            asked_at: now(),
            outcome,
            fresh,
        }
    }

    fn failed(
        reason: Reason,
        message: &str,
        retry_in: Option<u64>,
        failing_for: u64,
    ) -> ContentOutcome {
        ContentOutcome::Failed {
            reason,
            message: message.into(),
            retry_in: retry_in.map(Duration::from_secs),
            failing_for: Duration::from_secs(failing_for),
        }
    }

    fn decide_with(ws: &Workspace, pod: &Pod, content: Option<&ContentCheck>) -> Decision {
        // The home claim, bound.
        let mut claim = pod::build_claim(ws).expect("a home");
        claim.status = serde_json::from_value(json!({"phase": "Bound"})).unwrap();
        derive(
            &Observed {
                pod: Some(&CachedPod::from(pod)),
                claim: Some(&claim),
                content,
                ..only(ws)
            },
            &Policy::default(),
            now(),
        )
    }

    /// The workspace with `d`'s status, as the next reconcile reads it.
    fn after(ws: &Workspace, d: &Decision) -> Workspace {
        let mut next = ws.clone();
        next.status = Some(d.status.clone());
        next
    }

    #[test]
    fn a_workspace_is_ready_only_once_its_content_is_in_place() {
        let (ws, pod) = verified_workspace();
        let progress = format!("Cloning {URL}: receiving objects 43 % (1203/2790)");
        for (outcome, status, reason, message) in [
            (
                None,
                "Unknown",
                "Unknown",
                format!("Pod w-ws is running; waiting for its agent to clone app ({URL})"),
            ),
            (
                Some(ContentOutcome::Waiting),
                "Unknown",
                "Unknown",
                format!("Pod w-ws is running; waiting for its agent to clone app ({URL})"),
            ),
            (
                Some(ContentOutcome::Cloning {
                    progress: progress.clone(),
                }),
                "False",
                "Cloning",
                progress.clone(),
            ),
        ] {
            let check = outcome.map(|o| asked(o, true));
            let d = decide_with(&ws, &pod, check.as_ref());
            assert_eq!(d.status.phase, Some(Phase::Starting), "{message}");
            assert_eq!(d.status.message.as_deref(), Some(message.as_str()));
            let content = condition_of(&d, "ContentReady");
            assert_eq!(
                (content.status.as_str(), content.reason.as_str()),
                (status, reason)
            );
            assert_eq!(condition_of(&d, "Ready").status, "False");
            assert_eq!(
                d.requeue,
                Policy::default().progress_interval,
                "asked again then"
            );
            assert!(d.actions.is_empty(), "the pod is kept: {:?}", d.actions);
        }
        let cloned = ContentOutcome::Ready {
            reason: Reason::Cloned,
            url: URL.into(),
            reference: Some("main".into()),
            commit: "abc123".into(),
            message: "Cloned https://h/org/app.git at main (commit abc123) into app".into(),
        };
        let d = decide_with(&ws, &pod, Some(&asked(cloned, true)));
        assert_eq!(d.status.phase, Some(Phase::Running));
        let content = condition_of(&d, "ContentReady");
        assert_eq!(
            (content.status.as_str(), content.reason.as_str()),
            ("True", "Cloned")
        );
        assert!(content.message.contains("abc123"));
        let recorded = d.status.content.clone().unwrap();
        assert_eq!(
            (
                recorded.path.as_str(),
                recorded.reference.as_deref(),
                recorded.commit.as_str(),
                recorded.pod_uid.as_str()
            ),
            ("app", Some("main"), "abc123", "pod-1")
        );
        assert!(
            notice_reasons(&d).contains(&"ContentReady"),
            "{:?}",
            d.notices
        );
        // In place for this pod: nothing more to ask or say.
        let d = decide_with(&after(&ws, &d), &pod, None);
        assert_eq!(d.status.phase, Some(Phase::Running));
        assert!(!notice_reasons(&d).contains(&"ContentReady"));
        assert_eq!(
            condition_of(&d, "ContentReady").reason,
            "Cloned",
            "the spec did not change"
        );
        // A directory the user made is theirs whatever the spec says (no record to compare).
        let found = ContentOutcome::Ready {
            reason: Reason::ContentFound,
            url: String::new(),
            reference: None,
            commit: String::new(),
            message: "app was already in the home volume, not cloned by Berth".into(),
        };
        let d = decide_with(&ws, &pod, Some(&asked(found, true)));
        let d = decide_with(&after(&ws, &d), &pod, None);
        assert_eq!(
            condition_of(&d, "ContentReady").message,
            "app was already in the home volume, not cloned by Berth"
        );
    }

    /// A URL with a token in it (stored before the API refused them) is never shown: not in
    /// the status, its conditions, the recorded content, nor an event.
    #[test]
    fn credentials_in_a_url_are_never_shown() {
        let secret = "https://ghp_t0ken@h/org/app.git";
        let mut with_token = spec("main");
        with_token["content"]["git"]["url"] = json!(secret);
        let (ws, pod) = verified_workspace_of(with_token);
        let said = |d: &Decision| {
            let mut all = serde_json::to_string(&d.status).unwrap();
            for notice in &d.notices {
                all.push_str(&notice.note);
            }
            all
        };
        let failure = format!("could not read from {secret}: denied");
        let d = decide_with(
            &ws,
            &pod,
            Some(&asked(
                failed(Reason::AuthenticationFailed, &failure, None, 0),
                true,
            )),
        );
        assert_eq!(notice_reasons(&d), ["ContentFailed"], "{:?}", d.status);
        let words = said(&d);
        assert!(!words.contains("t0ken"), "{words}");
        assert!(words.contains("https://***@h/org/app.git"), "{words}");
        let cloned = ContentOutcome::Ready {
            reason: Reason::Cloned,
            url: secret.into(),
            reference: Some("main".into()),
            commit: "abc123".into(),
            message: format!("Cloned {secret} at main (commit abc123) into app"),
        };
        let d = decide_with(&ws, &pod, Some(&asked(cloned, true)));
        assert_eq!(d.status.phase, Some(Phase::Running));
        let words = said(&d);
        assert!(!words.contains("t0ken"), "{words}");
        // The shown record matches the spec it came from: no "spec now asks for" note.
        let d = decide_with(&after(&ws, &d), &pod, None);
        assert_eq!(condition_of(&d, "ContentReady").reason, "Cloned");
    }

    #[test]
    fn a_failed_clone_is_an_error_with_the_remedy_said_once_per_failure_series() {
        let (ws, pod) = verified_workspace();
        let missing = "The remote didn't have any ref that matched 'main'";
        let d = decide_with(
            &ws,
            &pod,
            Some(&asked(failed(Reason::RefNotFound, missing, None, 0), true)),
        );
        assert_eq!(d.status.phase, Some(Phase::Error));
        assert_eq!(
            d.status.message.as_deref(),
            Some(format!("Cannot clone {URL} into app (RefNotFound); git said: {missing}; fix spec.content.git.ref (a branch, a tag or a full commit id), or leave it out for the default branch; the agent tries again once the credentials or the spec change. The pod is kept").as_str())
        );
        assert_eq!(condition_of(&d, "ContentReady").reason, "RefNotFound");
        assert_eq!(condition_of(&d, "Ready").reason, "RefNotFound");
        // What `kubectl get ws` shows: what is wrong, the detail in the message.
        assert_eq!(
            d.status.summary.as_deref(),
            Some(format!("Cannot clone {URL} into app (RefNotFound)").as_str())
        );
        assert_eq!(notice_reasons(&d), ["ContentFailed"]);
        assert!(d.actions.is_empty(), "the pod is kept: {:?}", d.actions);
        // Asked again, the same failure: not said again.
        let again = after(&ws, &d);
        let d = decide_with(
            &again,
            &pod,
            Some(&asked(failed(Reason::RefNotFound, missing, None, 2), true)),
        );
        assert_eq!(d.status.phase, Some(Phase::Error));
        assert!(
            !notice_reasons(&d).contains(&"ContentFailed"),
            "{:?}",
            d.notices
        );
        // Another failure is a new series; its remedy names the Secret; a transient one its retry.
        let d = decide_with(
            &again,
            &pod,
            Some(&asked(
                failed(
                    Reason::AuthenticationFailed,
                    "Received HTTP status 401",
                    None,
                    3,
                ),
                true,
            )),
        );
        assert_eq!(notice_reasons(&d), ["ContentFailed"]);
        assert!(d.status.message.as_deref().unwrap().contains(
            "check the credentials in Secret git-creds (spec.content.git.auth.secretName)"
        ));
        let d = decide_with(
            &again,
            &pod,
            Some(&asked(
                failed(Reason::Unreachable, "Connection refused", Some(4), 3),
                true,
            )),
        );
        assert!(
            d.status
                .message
                .as_deref()
                .unwrap()
                .ends_with("Connection refused; the agent tries again in 4s. The pod is kept"),
            "{:?}",
            d.status.message
        );
        // A failure handed to a reconcile before (not fresh) is not said again either.
        let d = decide_with(
            &ws,
            &pod,
            Some(&asked(
                failed(Reason::Unreachable, "Connection refused", Some(4), 3),
                false,
            )),
        );
        assert!(d.notices.iter().all(|n| n.reason != "ContentFailed"));
    }

    #[test]
    fn a_clone_failing_without_progress_for_the_start_timeout_ends_the_start() {
        let (ws, pod) = verified_workspace();
        let timeout = Policy::default().start_timeout.as_secs();
        let d = decide_with(
            &ws,
            &pod,
            Some(&asked(
                failed(
                    Reason::Unreachable,
                    "Connection refused",
                    Some(30),
                    timeout - 1,
                ),
                true,
            )),
        );
        assert_eq!(d.status.phase, Some(Phase::Error));
        let d = decide_with(
            &ws,
            &pod,
            Some(&asked(
                failed(Reason::Unreachable, "Connection refused", Some(30), timeout),
                true,
            )),
        );
        assert_eq!(d.status.phase, Some(Phase::Failed));
        assert!(d.status.message.as_deref().unwrap().starts_with(&format!(
            "No progress for 10m while cloning: Cannot clone {URL}"
        )));
        assert_eq!(condition_of(&d, "Stalled").reason, "StartTimeout");
        assert_eq!(
            d.actions,
            vec![Action::DeletePod {
                uid: "pod-1".into()
            }]
        );
    }

    #[test]
    fn once_in_place_a_changed_content_spec_changes_nothing_and_says_so_before_it_replaces_the_pod()
    {
        let (ws, pod) = verified_workspace();
        let cloned = ContentOutcome::Ready {
            reason: Reason::Cloned,
            url: URL.into(),
            reference: Some("main".into()),
            commit: "abc123".into(),
            message: "Cloned".into(),
        };
        let d = decide_with(&ws, &pod, Some(&asked(cloned, true)));
        let mut changed = after(&ws, &d);
        changed.spec = workspace(spec("v2"), json!({})).spec;
        let d = decide_with(&changed, &pod, None);
        assert_eq!(
            d.status.phase,
            Some(Phase::Running),
            "{:?}",
            d.status.message
        );
        assert!(d.actions.is_empty(), "no restart: {:?}", d.actions);
        let content = condition_of(&d, "ContentReady");
        assert_eq!(
            (content.status.as_str(), content.reason.as_str()),
            ("True", "ContentFound")
        );
        assert!(
            content.message.starts_with(&format!("spec.content.git now asks for {URL} at v2, but app holds {URL} at main (commit abc123): Berth never clones over a checkout, so nothing on disk changed")),
            "{}",
            content.message
        );
        // Before the content is in place, the pod given the old content is replaced.
        let mut changed = ws.clone();
        changed.spec = workspace(spec("v2"), json!({})).spec;
        let d = decide_with(&changed, &pod, None);
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::DeletePod { .. })),
            "{:?}",
            d.actions
        );
    }

    #[test]
    fn a_pod_cloning_in_its_init_container_says_so_unless_the_kubelet_says_worse() {
        let mut spec = spec("main");
        spec.as_object_mut().unwrap().remove("command");
        let ws = workspace(spec, started(20));
        let pod = pod_of(
            &ws,
            json!({
                "phase": "Pending", "podIP": "127.1.0.1", "conditions": [scheduled()],
                "initContainerStatuses": [{"name": "berth-content", "image": "berth", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}],
                "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]
            }),
        );
        let progress = format!("Cloning {URL}: receiving objects 12 % (3/25)");
        let cloning = asked(
            ContentOutcome::Cloning {
                progress: progress.clone(),
            },
            true,
        );
        let d = decide_with(&ws, &pod, Some(&cloning));
        assert_eq!(d.status.phase, Some(Phase::Starting));
        assert_eq!(d.status.message.as_deref(), Some(progress.as_str()));
        // The kubelet's own trouble with the pod comes first.
        let missing = "MountVolume.SetUp failed for volume \"berth-content-auth\" : secret \"git-creds\" not found";
        let warnings = [warning("pod-1", "FailedMount", missing, 2, 1)];
        let refs: Vec<&Event> = warnings.iter().collect();
        let mut claim = pod::build_claim(&ws).expect("a home");
        claim.status = serde_json::from_value(json!({"phase": "Bound"})).unwrap();
        let d = derive(
            &Observed {
                pod: Some(&CachedPod::from(&pod)),
                claim: Some(&claim),
                warnings: &refs,
                content: Some(&cloning),
                ..only(&ws)
            },
            &Policy::default(),
            now(),
        );
        assert_eq!(d.status.phase, Some(Phase::Error));
        assert_eq!(
            d.status.message.as_deref(),
            Some(format!("FailedMount: {missing}").as_str())
        );
    }
}

/// A message over its limit (a kind's change listing every field that differs) is cut at a
/// character boundary, never inside one, and ends with `...` so a reader knows; one within
/// its limit, to the byte, is left whole.
#[test]
fn a_long_message_is_cut_at_a_character_boundary_and_says_so() {
    let cut = |text: &str, max: usize| {
        let mut text = text.to_owned();
        truncate(&mut text, max);
        text
    };
    assert_eq!(cut("abcdefgh", 8), "abcdefgh");
    assert_eq!(cut("abcdefghij", 8), "abcde...");
    // "é" is two bytes: 7 is inside the fourth, so the cut is at 6.
    assert_eq!(cut(&"é".repeat(10), 10), "ééé...");
    assert_eq!(cut(&"é".repeat(10), 20), "é".repeat(10));
    assert_eq!(cut(&"x".repeat(5000), 4096).len(), 4096);
}
