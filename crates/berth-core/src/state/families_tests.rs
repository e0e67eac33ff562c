//! One table per phase family (`stopping.rs`, `replacing.rs`, `starting.rs`, `running.rs`).
//! A row is an observation and what a user then sees: the phase, the Ready condition's
//! reason, what Berth does, the events it publishes (a Warning is marked `!`), and whether
//! a deleted workspace's finalizer may go. Each row goes through [`derive`], so it also checks
//! that the dispatcher hands the observation to the right family.

use super::*;

/// What a user sees of a decision.
#[derive(Debug, PartialEq)]
struct Seen {
    phase: Phase,
    /// The Ready condition's reason (`kubectl get ws -o wide`), if there is one.
    ready: Option<String>,
    actions: Vec<Action>,
    /// Event reasons, a Warning's with a leading `!`.
    events: Vec<String>,
    release: bool,
}

fn seen(phase: Phase, ready: Option<&str>, actions: Vec<Action>, events: &[&str]) -> Seen {
    Seen {
        phase,
        ready: ready.map(str::to_owned),
        actions,
        events: events.iter().map(|e| (*e).to_owned()).collect(),
        release: false,
    }
}

fn released(mut s: Seen) -> Seen {
    s.release = true;
    s
}

/// An observation.
struct Case {
    name: &'static str,
    workspace: Workspace,
    pod: Option<Pod>,
    warnings: Vec<Event>,
    agent: Option<AgentCheck>,
    expectations: Expectations,
    claim: Option<PersistentVolumeClaim>,
    service: Option<Service>,
    taken: Vec<Foreign>,
}

fn case(name: &'static str, workspace: Workspace, pod: Option<Pod>) -> Case {
    Case {
        name,
        workspace,
        pod,
        warnings: vec![],
        agent: None,
        expectations: Expectations::default(),
        claim: None,
        service: None,
        taken: vec![],
    }
}

impl Case {
    fn agent(mut self, check: AgentCheck) -> Self {
        self.agent = Some(check);
        self
    }

    /// The pod's create was accepted `seconds_ago`, and the pod cache does not show it yet.
    fn pod_created(mut self, seconds_ago: i64) -> Self {
        self.expectations.pod = Some(Timestamp::from_second(NOW - seconds_ago).unwrap());
        self
    }

    /// The caches show `claim` under the home claim's name.
    fn claim(mut self, claim: PersistentVolumeClaim) -> Self {
        self.claim = Some(claim);
        self
    }

    /// The caches show `service` under the service's name.
    fn service(mut self, service: Service) -> Self {
        self.service = Some(service);
        self
    }

    /// A create of `kind`'s name met someone else's object `seconds_ago`, `attempts` times in
    /// a row.
    fn met(mut self, kind: Derived, seconds_ago: i64, attempts: u32) -> Self {
        self.taken.push(Foreign {
            kind,
            name: "taken".into(),
            owner: None,
            met: Some(crate::ownership::Met {
                at: Timestamp::from_second(NOW - seconds_ago).unwrap(),
                attempts,
            }),
        });
        self
    }

    fn warning(mut self, event: Event) -> Self {
        self.warnings.push(event);
        self
    }

    fn decide(&self) -> Seen {
        let d = self.decision();
        Seen {
            phase: d.status.phase.expect("every decision has a phase"),
            ready: find_condition(&d.status.conditions, types::READY).map(|c| c.reason.clone()),
            actions: d.actions,
            events: d
                .notices
                .iter()
                .map(|n| format!("{}{}", if n.warning { "!" } else { "" }, n.reason))
                .collect(),
            release: d.release,
        }
    }

    fn decision(&self) -> Decision {
        let warnings: Vec<&Event> = self.warnings.iter().collect();
        let pod = self.pod.as_ref().map(CachedPod::from);
        derive(
            &Observed {
                workspace: &self.workspace,
                pod: pod.as_ref(),
                warnings: &warnings,
                claim: self.claim.as_ref(),
                service: self.service.as_ref(),
                taken: &self.taken,
                agent: self.agent.as_ref(),
                refusal: None,
                activity: None,
                content: None,
                admission: None,
                admission_since: None,
                kind: &crate::kinds::NO_KIND,
                expectations: self.expectations,
            },
            &Policy::default(),
            now(),
        )
    }
}

/// What `kubectl get ws` shows in MESSAGE: the message's lead, up to its first `. ` or `; `.
/// Every message leads with what is wrong (or happening) within the column's 100 characters,
/// then gives the detail and the fix; `None` when it does.
fn lead_too_long(message: &str) -> Option<String> {
    let summary = berth_api::summary(message);
    summary.ends_with('…').then(|| message.to_owned())
}

/// Every row that differs, named, in one failure.
fn table(rows: Vec<(Case, Seen)>) {
    let wrong: Vec<String> = rows
        .into_iter()
        .filter_map(|(case, want)| {
            let got = case.decide();
            let message = case.decision().status.message.unwrap_or_default();
            if let Some(long) = lead_too_long(&message) {
                return Some(format!(
                    "{}: the message's lead is over 100 characters: {long}",
                    case.name
                ));
            }
            (got != want).then(|| format!("{}:\n  want {want:?}\n  got  {got:?}", case.name))
        })
        .collect();
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

fn delete_pod() -> Action {
    Action::DeletePod {
        uid: "pod-1".into(),
    }
}

fn being_deleted(mut ws: Workspace, seconds_ago: i64) -> Workspace {
    ws.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(NOW - seconds_ago).unwrap()));
    ws
}

/// A start that already saw its pod (so `Created` is not told again).
fn starting_with_pod() -> Value {
    json!({"phase": "Starting", "observedGeneration": 1, "startedAt": at(30), "podRecreations": 0, "pod": {"name": "w-ws", "uid": "pod-1"}})
}

fn running_status() -> Value {
    json!({"phase": "Running", "observedGeneration": 1, "startedAt": at(100), "pod": {"name": "w-ws", "uid": "pod-1"},
    "agent": {"verifiedPodUID": "pod-1"},
    "conditions": [
        {"type": "PodReady", "status": "True", "reason": "ContainersReady", "message": "", "lastTransitionTime": at(90)},
        {"type": "Ready", "status": "True", "reason": "WorkspaceReady", "message": "", "lastTransitionTime": at(90)}
    ]})
}

#[test]
fn stopping() {
    let ws = workspace(json!({"image": "x:1"}), running_status());
    let pod = ready_pod(&ws);
    let mut going = pod.clone();
    going.metadata.deletion_timestamp = Some(Time(now()));
    let paused = workspace(json!({"image": "x:1", "paused": true}), running_status());
    let stopped = workspace(
        json!({"image": "x:1", "paused": true}),
        json!({"phase": "Stopping", "conditions": [{"type": "Ready", "status": "False", "reason": "Paused", "message": "", "lastTransitionTime": at(5)}]}),
    );
    let gave_up = workspace(
        json!({"image": "x:1"}),
        json!({"phase": "Failed", "observedGeneration": 1, "conditions": [{"type": "Stalled", "status": "True", "reason": "StartTimeout", "message": "No progress", "observedGeneration": 1, "lastTransitionTime": at(5)}]}),
    );
    table(vec![
        (
            case(
                "deleted: the pod stops first",
                being_deleted(ws.clone(), 1),
                Some(pod.clone()),
            ),
            seen(
                Phase::Terminating,
                Some("PodStopping"),
                vec![delete_pod()],
                &[],
            ),
        ),
        (
            case(
                "deleted, the pod stopping: wait for it",
                being_deleted(ws.clone(), 1),
                Some(going.clone()),
            ),
            seen(Phase::Terminating, Some("PodStopping"), vec![], &[]),
        ),
        (
            case(
                "deleted, the pod gone: the finalizer goes",
                being_deleted(ws.clone(), 1),
                None,
            ),
            released(seen(Phase::Terminating, Some("PodStopping"), vec![], &[])),
        ),
        (
            case(
                "deleted, the pod still there after the grace",
                being_deleted(ws.clone(), 61),
                Some(going.clone()),
            ),
            released(seen(
                Phase::Terminating,
                Some("PodStopping"),
                vec![Action::ForceDeletePod {
                    uid: "pod-1".into(),
                }],
                &["!DeletionGraceExpired"],
            )),
        ),
        (
            case("paused: the pod goes", paused.clone(), Some(pod.clone())),
            seen(
                Phase::Stopping,
                Some("Paused"),
                vec![delete_pod()],
                &["Paused"],
            ),
        ),
        (
            case("paused, the pod gone: stopped, said once", stopped, None),
            seen(Phase::Stopped, Some("Paused"), vec![], &[]),
        ),
        (
            case(
                "the pod of a running workspace is being deleted",
                ws.clone(),
                Some(going),
            ),
            seen(Phase::Stopping, Some("PodStopping"), vec![], &[]),
        ),
        (
            case(
                "gave up on this spec: the pod goes, Failed stays",
                gave_up.clone(),
                Some(pod_of(&gave_up, json!({"phase": "Running"}))),
            ),
            seen(Phase::Failed, None, vec![delete_pod()], &[]),
        ),
        (
            case("gave up on this spec, no pod: nothing more", gave_up, None),
            seen(Phase::Failed, None, vec![], &[]),
        ),
    ]);
}

#[test]
fn replacing() {
    let spec = json!({"image": "x:1", "lifecycle": {"podRecreation": {"maxRecreations": 2, "delay": "10s"}}});
    let starting = workspace(spec.clone(), starting_with_pod());
    let mut at_limit = starting.clone();
    at_limit.status.as_mut().unwrap().pod_recreations = Some(2);
    let rejected_at = |seconds_ago: i64| {
        workspace(
            spec.clone(),
            json!({"phase": "Starting", "startedAt": at(30), "podRecreations": 0, "conditions": [
                {"type": "PodRejected", "status": "True", "reason": "OutOfcpu", "message": "Pod was rejected", "lastTransitionTime": at(seconds_ago)},
                {"type": "Ready", "status": "False", "reason": "OutOfcpu", "message": "Pod was rejected", "lastTransitionTime": at(seconds_ago)}]}),
        )
    };
    let lost = pod_of(
        &starting,
        json!({"phase": "Unknown", "reason": "NodeLost", "message": "Node node-1 is unresponsive"}),
    );
    let changed = workspace(json!({"image": "x:2"}), running_status());
    table(vec![
        (
            case(
                "rejected by its kubelet: deleted, to be replaced",
                starting.clone(),
                Some(rejected_pod(&starting, "OutOfcpu")),
            ),
            seen(
                Phase::Starting,
                Some("OutOfcpu"),
                vec![delete_pod()],
                &["!PodRejected"],
            ),
        ),
        (
            case(
                "rejected once too often: Failed",
                at_limit.clone(),
                Some(rejected_pod(&at_limit, "OutOfcpu")),
            ),
            seen(
                Phase::Failed,
                Some("RecreationLimitReached"),
                vec![delete_pod()],
                &["!RecreationLimitReached"],
            ),
        ),
        (
            case(
                "rejected and gone, within the delay: wait",
                rejected_at(5),
                None,
            ),
            seen(Phase::Starting, Some("OutOfcpu"), vec![], &[]),
        ),
        (
            case(
                "rejected and gone, after the delay: a new pod",
                rejected_at(12),
                None,
            ),
            seen(
                Phase::Starting,
                Some("ContainerCreating"),
                vec![Action::CreatePod],
                &["Recreating"],
            ),
        ),
        (
            case(
                "its node lost: deleted at once",
                starting.clone(),
                Some(lost),
            ),
            seen(
                Phase::Unknown,
                Some("NodeLost"),
                vec![Action::ForceDeletePod {
                    uid: "pod-1".into(),
                }],
                &["!NodeLost"],
            ),
        ),
        (
            case(
                "vanished while running: created again",
                workspace(json!({"image": "x:1"}), running_status()),
                None,
            ),
            seen(
                Phase::Pending,
                Some("ContainerCreating"),
                vec![Action::CreatePod],
                &["!NodeLost"],
            ),
        ),
        (
            case(
                "built from an older spec: replaced",
                changed.clone(),
                Some(ready_pod(&workspace(json!({"image": "x:1"}), Value::Null))),
            ),
            seen(
                Phase::Stopping,
                Some("PodStopping"),
                vec![delete_pod()],
                &[],
            ),
        ),
    ]);
}

fn waiting_pod(ws: &Workspace, reason: &str) -> Pod {
    pod_of(
        ws,
        json!({"phase": "Pending", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": format!("{reason} says the kubelet")}}}]}),
    )
}

#[test]
fn starting() {
    let fresh = workspace(json!({"image": "x:1"}), Value::Null);
    let created = workspace(json!({"image": "x:1"}), started(2));
    let starting = workspace(json!({"image": "x:1"}), started(3));
    let unschedulable = pod_of(
        &starting,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available", "lastTransitionTime": at(2)}]}),
    );
    // Nothing changed for 100 s, against a start timeout of 60 s; a condition Berth does not
    // write (another controller's) changed a second ago, which is no progress of the start.
    let timed_out = workspace(
        json!({"image": "x:1", "lifecycle": {"startTimeout": "60s"}}),
        json!({"phase": "Starting", "startedAt": at(120), "conditions": [
            {"type": "PodScheduled", "status": "True", "reason": "Scheduled", "message": "", "lastTransitionTime": at(100)},
            {"type": "PodReady", "status": "False", "reason": "ContainerCreating", "message": "", "lastTransitionTime": at(100)},
            {"type": "Ready", "status": "False", "reason": "ContainerCreating", "message": "", "lastTransitionTime": at(100)},
            {"type": "example.com/Audited", "status": "True", "reason": "Seen", "message": "", "lastTransitionTime": at(1)}]}),
    );
    let crashed = pod_of(
        &starting,
        json!({"phase": "Failed", "conditions": [scheduled()], "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
    );
    table(vec![
        (
            case("no pod: create it", fresh, None),
            seen(
                Phase::Pending,
                Some("ContainerCreating"),
                vec![Action::CreatePod],
                &[],
            ),
        ),
        (
            case(
                "created 5 s ago, not in the cache yet: not again",
                created.clone(),
                None,
            )
            .pod_created(5),
            seen(Phase::Pending, Some("ContainerCreating"), vec![], &[]),
        ),
        (
            case("created 61 s ago and never seen: again", created, None).pod_created(61),
            seen(
                Phase::Pending,
                Some("ContainerCreating"),
                vec![Action::CreatePod],
                &[],
            ),
        ),
        (
            case(
                "no node fits: the scheduler's words",
                starting.clone(),
                Some(unschedulable),
            ),
            seen(Phase::Starting, Some("Unschedulable"), vec![], &["Created"]),
        ),
        (
            case(
                "containers being created",
                starting.clone(),
                Some(waiting_pod(&starting, "ContainerCreating")),
            ),
            seen(
                Phase::Starting,
                Some("ContainerCreating"),
                vec![],
                &["Created"],
            ),
        ),
        (
            case(
                "an image that cannot be pulled: Error, in the kubelet's words",
                starting.clone(),
                Some(waiting_pod(&starting, "ImagePullBackOff")),
            ),
            seen(
                Phase::Error,
                Some("ImagePullBackOff"),
                vec![],
                &["Created", "!ImagePullBackOff"],
            ),
        ),
        (
            case(
                "a warning event of this pod says more",
                starting.clone(),
                Some(waiting_pod(&starting, "ContainerCreating")),
            )
            .warning(warning(
                "pod-1",
                "FailedMount",
                "secret \"s\" not found",
                3,
                1,
            )),
            seen(
                Phase::Error,
                Some("FailedMount"),
                vec![],
                &["Created", "!FailedMount"],
            ),
        ),
        (
            case(
                "no progress for the start timeout: Failed, the node freed",
                timed_out.clone(),
                Some(waiting_pod(&timed_out, "ContainerCreating")),
            ),
            seen(
                Phase::Failed,
                Some("StartTimeout"),
                vec![delete_pod()],
                &["Created", "!StartTimeout"],
            ),
        ),
        (
            case(
                "the container exited: Error in its words, not replaced",
                starting.clone(),
                Some(crashed),
            ),
            seen(Phase::Error, Some("Error"), vec![], &["Created", "!Error"]),
        ),
    ]);
}

#[test]
fn running() {
    let starting = workspace(json!({"image": "x:1"}), starting_with_pod());
    let pod = ready_pod(&starting);
    let refused = |fresh| {
        check(
            AgentOutcome::Failed {
                reason: "Unauthenticated".into(),
                message: "token audience".into(),
            },
            fresh,
        )
    };
    // The status written after the first refusal.
    let mut refused_before = starting.clone();
    refused_before.status = Some(decide_checked(&starting, &pod, &refused(true)).status);
    let running = workspace(json!({"image": "x:1"}), running_status());
    table(vec![
        (
            case(
                "ready, its agent not checked yet: Starting",
                starting.clone(),
                Some(pod.clone()),
            ),
            seen(Phase::Starting, Some("Unknown"), vec![], &[]),
        ),
        (
            case(
                "ready, its agent authenticated the operator: Running",
                starting.clone(),
                Some(pod.clone()),
            )
            .agent(verified()),
            seen(Phase::Running, Some("WorkspaceReady"), vec![], &["Ready"]),
        ),
        (
            case(
                "its agent refused the operator: Error, the pod kept",
                starting.clone(),
                Some(pod.clone()),
            )
            .agent(refused(true)),
            seen(
                Phase::Error,
                Some("Unauthenticated"),
                vec![],
                &["!AgentAuthFailed"],
            ),
        ),
        (
            case(
                "the same refusal, read again: no second event",
                refused_before.clone(),
                Some(pod.clone()),
            )
            .agent(refused(false)),
            seen(Phase::Error, Some("Unauthenticated"), vec![], &[]),
        ),
        (
            case(
                "the refusal, retried and refused again: said again",
                refused_before,
                Some(pod.clone()),
            )
            .agent(refused(true)),
            seen(
                Phase::Error,
                Some("Unauthenticated"),
                vec![],
                &["!AgentAuthFailed"],
            ),
        ),
        (
            case(
                "running, verified for this pod: nothing to do",
                running,
                Some(pod),
            ),
            seen(Phase::Running, Some("WorkspaceReady"), vec![], &[]),
        ),
    ]);
}

/// What goes when: a stopped workspace keeps only its Ready condition of Berth's (its pod's
/// conditions went with the pod, its start's with the pause), and another controller's
/// condition stays untouched.
#[test]
fn a_stopped_workspace_forgets_its_pod_and_its_start_but_not_others_conditions() {
    let ws = workspace(
        json!({"image": "x:1", "paused": true}),
        json!({"phase": "Stopping", "observedGeneration": 1, "conditions": [
            {"type": "PodScheduled", "status": "True", "reason": "Scheduled", "message": "", "lastTransitionTime": at(50)},
            {"type": "PodReady", "status": "True", "reason": "ContainersReady", "message": "", "lastTransitionTime": at(50)},
            {"type": "AgentReady", "status": "True", "reason": "AgentVerified", "message": "", "lastTransitionTime": at(50)},
            {"type": "PodRejected", "status": "False", "reason": "PodRecreated", "message": "", "lastTransitionTime": at(50)},
            {"type": "Ready", "status": "False", "reason": "Paused", "message": "", "lastTransitionTime": at(5)},
            {"type": "example.com/Audited", "status": "True", "reason": "Seen", "message": "", "lastTransitionTime": at(50)}]}),
    );
    let d = decide(&ws, None, &[]);
    assert_eq!(d.status.phase, Some(Phase::Stopped));
    let types: Vec<&str> = d
        .status
        .conditions
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, ["Ready", "example.com/Audited"]);
}

/// What a user reads while the pod waits: the first thing it waits on, in words. A pod the
/// scheduler has not looked at yet waits for the scheduler (not "ContainerCreating", which
/// it is not doing).
#[test]
fn a_start_says_what_it_waits_on_first() {
    let ws = workspace(json!({"image": "x:1"}), started(1));
    let unscheduled = pod_of(&ws, json!({"phase": "Pending"}));
    let d = decide(&ws, Some(&unscheduled), &[]);
    assert_eq!(
        (
            d.status.phase,
            d.status.message.as_deref(),
            condition_of(&d, "Ready").reason.as_str()
        ),
        (
            Some(Phase::Starting),
            Some("Pod w-ws waits for the scheduler"),
            "WaitingForScheduler"
        )
    );
    let scheduled = pod_of(
        &ws,
        json!({"phase": "Pending", "conditions": [scheduled()]}),
    );
    let d = decide(&ws, Some(&scheduled), &[]);
    assert_eq!(
        d.status.message.as_deref(),
        Some("Pod w-ws is starting (ContainerCreating)")
    );
}

/// An object of the workspace's name that is not its own: unlabelled (a create met it) or
/// labelled like Berth's (the caches show it), owned by nobody.
fn foreign<K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned>(name: &str) -> K {
    serde_json::from_value(json!({
        "apiVersion": K::api_version(&()), "kind": K::kind(&()),
        "metadata": {"name": name, "namespace": "team-a", "uid": "theirs",
            "labels": {"app.kubernetes.io/managed-by": "berth"}}
    }))
    .unwrap()
}

#[test]
fn name_taken() {
    let home = json!({"image": "x:1", "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}});
    let ws = workspace(home.clone(), json!({}));
    let ported = workspace(
        json!({"image": "x:1", "ports": [{"name": "http", "port": 8080}]}),
        json!({}),
    );
    let said = workspace(
        home.clone(),
        json!({"phase": "Error", "observedGeneration": 1, "startedAt": at(30), "podRecreations": 0, "conditions": [
            {"type": "Ready", "status": "False", "reason": "NameTaken", "message": "", "lastTransitionTime": at(30)}]}),
    );
    let paused = workspace(json!({"image": "x:1", "paused": true}), json!({}));
    let mut theirs: Pod = foreign("w-ws");
    theirs.spec = Some(Default::default());
    table(vec![
        (
            case(
                "the home claim's name is someone else's: no pod",
                ws.clone(),
                None,
            )
            .claim(foreign("w-home")),
            seen(Phase::Error, Some("NameTaken"), vec![], &["!NameTaken"]),
        ),
        (
            case(
                "a create met a claim of its name: no pod while it waits",
                ws.clone(),
                None,
            )
            .met(Derived::Claim, 0, 1),
            seen(Phase::Error, Some("NameTaken"), vec![], &["!NameTaken"]),
        ),
        (
            case("said already: no second Warning", said.clone(), None).met(Derived::Claim, 0, 1),
            seen(Phase::Error, Some("NameTaken"), vec![], &[]),
        ),
        (
            case(
                "its wait ran out: the claim is tried again, then the pod",
                said.clone(),
                None,
            )
            .met(Derived::Claim, 2, 1),
            seen(
                Phase::Error,
                Some("NameTaken"),
                vec![Action::CreateClaim, Action::CreatePod],
                &[],
            ),
        ),
        (
            case("the third meeting waits 4 s", said.clone(), None).met(Derived::Claim, 3, 3),
            seen(Phase::Error, Some("NameTaken"), vec![], &[]),
        ),
        (
            case(
                "a create met a pod of its name: not sent again yet",
                workspace(json!({"image": "x:1"}), json!({})),
                None,
            )
            .met(Derived::Pod, 0, 1),
            seen(Phase::Error, Some("NameTaken"), vec![], &["!NameTaken"]),
        ),
        (
            case(
                "the caches show a pod of its name that is not its own",
                workspace(json!({"image": "x:1"}), json!({})),
                Some(theirs.clone()),
            ),
            seen(Phase::Error, Some("NameTaken"), vec![], &["!NameTaken"]),
        ),
        (
            case(
                "the service's name is someone else's: never applied over, the pod starts",
                ported.clone(),
                None,
            )
            .service(foreign("w")),
            seen(
                Phase::Error,
                Some("NameTaken"),
                vec![Action::CreatePod],
                &["!NameTaken"],
            ),
        ),
        (
            case(
                "paused: a pod of its name is none of its business",
                paused,
                Some(theirs.clone()),
            ),
            seen(Phase::Stopped, Some("Paused"), vec![], &["Paused"]),
        ),
        (
            case(
                "deleted: what is not its own is never deleted",
                being_deleted(workspace(json!({"image": "x:1"}), json!({})), 1),
                Some(theirs),
            ),
            released(seen(Phase::Terminating, None, vec![], &[])),
        ),
    ]);
}
