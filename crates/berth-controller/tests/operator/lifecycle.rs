//! Workspace lifecycle end to end (rules C1-C9, C16-C19).

use std::time::Duration;

use berth_api::{Phase, Workspace};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Secret, Service};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::support::{
    Harness, Recording, WAIT, condition, events_about, eventually, message_of, phase_of, record,
    test_config,
};

async fn secret(h: &Harness, name: &str) {
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": name}, "stringData": {"token": "t"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
}

fn pods(h: &Harness) -> Api<Pod> {
    Api::namespaced(h.client.clone(), "default")
}

/// One observed status: (phase, message, pod uid).
type Seen = (Option<Phase>, String, Option<String>);

/// Records every (phase, message, pod uid) the workspace's status goes through.
fn history(h: &Harness, name: &str) -> Recording<Seen> {
    record(h, name, |ws: &Workspace| {
        (
            phase_of(ws),
            message_of(ws),
            ws.status
                .as_ref()
                .and_then(|s| s.pod.as_ref())
                .and_then(|p| p.uid.clone()),
        )
    })
}

#[tokio::test]
async fn a_workspace_starts_runs_and_explains_itself() {
    let mut sim = crate::support::sim_config();
    sim.timings.pull = Duration::from_millis(300);
    let h = Harness::start_with(sim, test_config()).await;
    secret(&h, "git").await;
    let history = history(&h, "alice");
    h.create(
        "alice",
        json!({
            "image": "devbox:1",
            "ports": [{"name": "http", "port": 8080}],
            "podTemplate": {"volumes": {
                "home": {"size": "1Gi", "mountPath": "/home/dev"},
                "secrets": [{"secretName": "git", "mountPath": "/secrets/git", "defaultMode": 256}]
            }}
        }),
    )
    .await;
    let ws = h.until_phase("alice", Phase::Running).await;
    assert_eq!(message_of(&ws), "Workspace is running");
    let ready = condition(&ws, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "WorkspaceReady")
    );
    assert_eq!(condition(&ws, "PodScheduled").unwrap().status, "True");
    let status = ws.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert!(status.started_at.is_some() && status.ready_at.is_some());
    let pod_ref = status.pod.unwrap();
    assert_eq!(pod_ref.name, "alice-ws");

    let pod = pods(&h).get("alice-ws").await.unwrap();
    assert_eq!(pod.uid(), pod_ref.uid);
    assert_eq!(pod.labels()["app.kubernetes.io/managed-by"], "berth");
    assert_eq!(pod.labels()["berth.dev/workspace"], "alice");
    let owner = &pod.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Workspace", "alice", Some(true))
    );
    let volumes = pod.spec.as_ref().unwrap().volumes.clone().unwrap();
    let secret_volume = volumes
        .iter()
        .find(|v| v.secret.is_some())
        .unwrap()
        .secret
        .clone()
        .unwrap();
    assert_eq!(secret_volume.default_mode, Some(256));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    let claim = claims.get("alice-home").await.unwrap();
    assert_eq!(claim.owner_references()[0].name, "alice");
    let services: Api<Service> = Api::namespaced(h.client.clone(), "default");
    let service = services.get("alice").await.unwrap();
    assert_eq!(service.spec.unwrap().ports.unwrap()[0].port, 8080);

    let seen = history.through(&ws).await;
    let phases: Vec<Phase> = seen.iter().filter_map(|s| s.0).fold(vec![], |mut acc, p| {
        if acc.last() != Some(&p) {
            acc.push(p);
        }
        acc
    });
    let pending = phases
        .iter()
        .position(|p| *p == Phase::Pending)
        .expect("Pending seen");
    let starting = phases
        .iter()
        .position(|p| *p == Phase::Starting)
        .expect("Starting seen");
    let running = phases
        .iter()
        .position(|p| *p == Phase::Running)
        .expect("Running seen");
    assert!(pending < starting && starting < running, "{phases:?}");

    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    let about = events
        .list(&ListParams::default().fields(&format!("involvedObject.uid={}", ws.uid().unwrap())))
        .await
        .unwrap();
    let reasons: Vec<String> = about
        .items
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    for reason in ["Created", "Started", "Ready"] {
        assert!(
            reasons.contains(&reason.to_owned()),
            "{reason} in {reasons:?}"
        );
    }
}

/// While the API server's watch of workspaces brings the operator nothing (a watch cache
/// fallen behind under load), a workspace still starts: each decision rests on the workspace
/// as the operator's own last status write left it, not on the older copy its cache shows
/// (on which it would only wait for the watch), and each step is said once.
#[tokio::test]
async fn a_workspace_starts_while_the_watch_of_workspaces_brings_nothing() {
    let h = Harness::start().await;
    // Its pod waits for a node that fits, so every step of its start comes after the hold.
    h.create_unschedulable("erin").await;
    h.sim.faults().hold_watches("workspaces", true);
    h.add_big_node();

    let ws = h.until_phase("erin", Phase::Running).await;
    let agent_ready = condition(&ws, "AgentReady").unwrap();
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("True", "AgentVerified")
    );
    let reasons: Vec<String> = events_about(&h, &ws.uid().unwrap())
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect();
    for reason in ["Started", "Ready"] {
        assert_eq!(
            reasons.iter().filter(|r| *r == reason).count(),
            1,
            "{reason} once in {reasons:?}"
        );
    }

    // The watch brings it all at last: nothing changes.
    let reconciles = h.reconciles();
    h.sim.faults().hold_watches("workspaces", false);
    h.until_reconciled(reconciles, 1).await;
    let after = h.workspaces().get("erin").await.unwrap();
    assert_eq!(phase_of(&after), Some(Phase::Running));
    assert_eq!(after.status, ws.status, "no status written again");
}

#[tokio::test]
async fn a_missing_secret_is_explained_within_two_seconds_and_heals_in_place() {
    let h = Harness::start().await;
    h.create("bob", json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "workspace-secret", "mountPath": "/s"}]}}})).await;
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    eventually(WAIT, "the sim's FailedMount", || async {
        let found = events
            .list(&ListParams::default().fields("reason=FailedMount"))
            .await
            .unwrap();
        (!found.items.is_empty()).then_some(())
    })
    .await;
    let failing = eventually(
        Duration::from_secs(2),
        "the workspace to explain the missing secret",
        || async {
            let ws = h.workspaces().get("bob").await.ok()?;
            (phase_of(&ws) == Some(Phase::Error)
                && message_of(&ws).contains("secret \"workspace-secret\" not found"))
            .then_some(ws)
        },
    )
    .await;
    assert_eq!(condition(&failing, "Ready").unwrap().reason, "FailedMount");
    // `kubectl describe ws bob` tells why, in a Warning on the workspace itself.
    let told = eventually(WAIT, "a FailedMount event on the workspace", || async {
        let events = crate::support::events_about(&h, &failing.uid().unwrap()).await;
        events
            .into_iter()
            .find(|(reason, _)| reason == "FailedMount")
    })
    .await;
    assert!(
        told.1.contains("secret \"workspace-secret\" not found"),
        "{told:?}"
    );
    let first_uid = failing.status.unwrap().pod.unwrap().uid;

    secret(&h, "workspace-secret").await;
    let healed = h.until_phase("bob", Phase::Running).await;
    assert_eq!(
        healed.status.unwrap().pod.unwrap().uid,
        first_uid,
        "the same pod heals; nothing was recreated"
    );
}

#[tokio::test]
async fn an_unpullable_image_then_a_fixed_one() {
    let h = Harness::start().await;
    h.create("carol", json!({"image": "registry.invalid/devbox:1"}))
        .await;
    let failing = h
        .until("carol", "ImagePullBackOff", |ws| {
            phase_of(ws) == Some(Phase::Error) && message_of(ws).contains("ImagePullBackOff")
        })
        .await;
    let old_uid = failing.status.unwrap().pod.unwrap().uid;
    h.patch_spec("carol", json!({"image": "devbox:1"})).await;
    let running = h.until_phase("carol", Phase::Running).await;
    let new_uid = running
        .status
        .as_ref()
        .unwrap()
        .pod
        .as_ref()
        .unwrap()
        .uid
        .clone();
    assert_ne!(new_uid, old_uid, "a spec change replaces the pod");
    assert_eq!(running.status.unwrap().observed_generation, Some(2));
}

#[tokio::test]
async fn unschedulable_until_a_node_fits() {
    let h = Harness::start().await;
    h.create(
        "dave",
        json!({"image": "devbox:1", "resources": {"requests": {"cpu": "12"}}}),
    )
    .await;
    // The scheduler's event and its condition on the pod are two writes, seen in either order
    // (as from a real scheduler): the workspace shows both once both are seen.
    h.until("dave", "the scheduler's message and condition", |ws| {
        message_of(ws).contains("0/3 nodes are available: 3 Insufficient cpu.")
            && condition(ws, "PodScheduled").is_some_and(|c| c.reason == "Unschedulable")
    })
    .await;
    h.add_big_node();
    let running = h.until_phase("dave", Phase::Running).await;
    assert_eq!(
        running.status.unwrap().pod.unwrap().node_name.as_deref(),
        Some("node-big")
    );
}

#[tokio::test]
async fn start_timeout_fails_visibly_frees_the_node_and_a_spec_change_restarts() {
    let h = Harness::start().await;
    h.create(
        "erin",
        json!({
            "image": "registry.invalid/devbox:1",
            "lifecycle": {"startTimeout": "2s"},
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}
        }),
    )
    .await;
    let failed = h.until_phase("erin", Phase::Failed).await;
    let stalled = condition(&failed, "Stalled").unwrap();
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "StartTimeout")
    );
    let message = message_of(&failed);
    assert!(
        message.starts_with("No progress for 2s while starting containers: "),
        "{message}"
    );
    assert!(
        message.contains("ImagePull") || message.contains("ErrImagePull"),
        "names the last warning: {message}"
    );
    eventually(WAIT, "the pod to be deleted", || async {
        pods(&h)
            .get_opt("erin-ws")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    assert!(
        claims.get_opt("erin-home").await.unwrap().is_some(),
        "the claim stays"
    );
    // Still Failed when something else wakes it: it gave up until the spec changes.
    h.poke("erin").await;
    assert_eq!(
        phase_of(&h.workspaces().get("erin").await.unwrap()),
        Some(Phase::Failed)
    );

    h.patch_spec("erin", json!({"image": "devbox:1"})).await;
    let running = h.until_phase("erin", Phase::Running).await;
    assert!(condition(&running, "Stalled").is_none());
}

#[tokio::test]
async fn events_of_a_previous_pod_never_explain_the_next() {
    let h = Harness::start().await;
    let history = history(&h, "frank");
    h.create("frank", json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "absent", "mountPath": "/s"}]}}})).await;
    let failing = h
        .until("frank", "FailedMount", |ws| {
            message_of(ws).contains("secret \"absent\" not found")
        })
        .await;
    let old_uid = failing.status.unwrap().pod.unwrap().uid;
    // Same pod name, no secret any more: the old pod's FailedMount events must not leak.
    h.workspaces()
        .patch(
            "frank",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/spec/podTemplate"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    let running = h.until_phase("frank", Phase::Running).await;
    let new_uid = running.status.clone().unwrap().pod.unwrap().uid;
    assert_ne!(new_uid, old_uid);
    let seen = history.through(&running).await;
    for (phase, message, uid) in &seen {
        if uid.is_some() && *uid == new_uid {
            assert!(
                !message.contains("FailedMount"),
                "old events leaked into the new pod's story: {phase:?} {message}"
            );
        }
    }
}

#[tokio::test]
async fn pause_keeps_storage_and_resume_starts_again() {
    let h = Harness::start().await;
    h.create("gina", json!({"image": "devbox:1", "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}})).await;
    let first = h.until_phase("gina", Phase::Running).await;
    let first_start = first.status.unwrap().started_at;
    h.patch_spec("gina", json!({"paused": true})).await;
    let stopped = h.until_phase("gina", Phase::Stopped).await;
    assert_eq!(
        message_of(&stopped),
        "Workspace is paused; its storage is kept"
    );
    assert!(pods(&h).get_opt("gina-ws").await.unwrap().is_none());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    assert!(claims.get_opt("gina-home").await.unwrap().is_some());
    // Timestamps have second precision: resume in a later second so a reset shows.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.patch_spec("gina", json!({"paused": false})).await;
    let resumed = h.until_phase("gina", Phase::Running).await;
    assert_ne!(
        resumed.status.unwrap().started_at,
        first_start,
        "startedAt resets on resume"
    );
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.uid={}",
            first.metadata.uid.unwrap()
        )))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.contains(&"Paused".to_owned()) && reasons.contains(&"Resumed".to_owned()),
        "{reasons:?}"
    );
}

/// Another writer adds its finalizer between the operator's read of a new workspace and its
/// own finalizer's patch (in `berth dev` the cache is behind when a second trigger of the
/// same workspace runs before the watch brings the finalizer just added). kube's finalizer
/// helper tests the finalizers it read, the API server answers 422 for the failed test: a
/// stale copy, retried at once and quietly, as a 409 is. What a user sees: the workspace
/// Running with both finalizers, and no Warning `ReconcileFailed`.
#[tokio::test]
async fn a_finalizer_added_by_another_writer_meanwhile_is_no_failure() {
    let h = Harness::start().await;
    h.sim.faults().latency(
        berth_sim::RequestMatch::new("patch", "workspaces"),
        Duration::from_secs(1),
    );
    let fern = h.create("fern", json!({"image": "devbox:1"})).await;
    eventually(
        WAIT,
        "the operator's finalizer patch to be held",
        || async { (h.sim.faults().held() >= 1).then_some(()) },
    )
    .await;
    let mut theirs = h.workspaces().get("fern").await.unwrap();
    assert!(theirs.finalizers().is_empty(), "{theirs:?}");
    theirs.metadata.finalizers = Some(vec!["example.com/keep".to_owned()]);
    h.workspaces()
        .replace("fern", &PostParams::default(), &theirs)
        .await
        .unwrap();
    h.sim.faults().clear_api_faults();
    let ws = h.until_phase("fern", Phase::Running).await;
    assert_eq!(
        ws.finalizers(),
        ["example.com/keep", berth_api::labels::FINALIZER],
        "the operator's finalizer added after the other writer's"
    );
    let events = events_about(&h, fern.metadata.uid.as_deref().unwrap()).await;
    assert!(
        !events.iter().any(|(reason, _)| reason == "ReconcileFailed"),
        "{events:?}"
    );
    let counted: Vec<String> = h
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("berth_reconcile_errors_total{"))
        .map(str::to_owned)
        .collect();
    assert!(
        counted.iter().any(|l| l.contains("reason=\"Conflict\"")),
        "the failed test is counted as the conflict it is: {counted:?}"
    );
    assert!(
        counted.iter().all(|l| l.contains("reason=\"Conflict\"")),
        "{counted:?}"
    );
    h.workspaces()
        .patch(
            "fern",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers/0"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn deleting_a_workspace_removes_what_it_owns_even_when_its_pod_is_stuck() {
    let h = Harness::start().await;
    let hank = h.create("hank", json!({"image": "devbox:1", "ports": [{"name": "http", "port": 80}], "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/h"}}}})).await;
    h.until_phase("hank", Phase::Running).await;
    // A finalizer nobody removes keeps the pod terminating forever.
    pods(&h)
        .patch(
            "hank-ws",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/stuck"]}})),
        )
        .await
        .unwrap();
    h.workspaces()
        .delete("hank", &Default::default())
        .await
        .unwrap();
    eventually(
        WAIT,
        "the workspace to be gone despite the stuck pod",
        || async {
            h.workspaces()
                .get_opt("hank")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    // The workspace went without its pod stopping, and says so where `kubectl get events`
    // shows it (the deletion grace is 2 s in these tests).
    let events = events_about(&h, hank.metadata.uid.as_deref().unwrap()).await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "DeletionGraceExpired"
                && note
                    .starts_with("Pod hank-ws did not stop within the deletion grace period (2s)")),
        "{events:?}"
    );
    let services: Api<Service> = Api::namespaced(h.client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    eventually(WAIT, "the service and claim to be collected", || async {
        (services.get_opt("hank").await.unwrap().is_none()
            && claims.get_opt("hank-home").await.unwrap().is_none())
        .then_some(())
    })
    .await;
    // Waiting for the pod to stop is not a failed reconcile (only a stale cache's conflict is).
    let errors: Vec<String> = h
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("berth_reconcile_errors_total{") && !l.contains("Conflict"))
        .map(str::to_owned)
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    pods(&h)
        .patch(
            "hank-ws",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually(WAIT, "the pod to be collected", || async {
        pods(&h)
            .get_opt("hank-ws")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn restarting_the_operator_over_running_workspaces_writes_nothing() {
    let mut h = Harness::start().await;
    for name in ["w1", "w2", "w3"] {
        h.create(name, json!({"image": "devbox:1", "ports": [{"name": "http", "port": 80}], "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/h"}}}})).await;
    }
    for name in ["w1", "w2", "w3"] {
        h.until_phase(name, Phase::Running).await;
    }
    // Stopping waits for the operator's task to end: no write of the first run is left.
    h.stop_operator().await;
    h.sim.reset_requests();
    let before = h.reconciles();
    h.start_operator();
    // Every workspace was reconciled by the new run (so a write, had it been due, was made).
    h.until_reconciled(before, 3).await;
    let writes = h.operator_requests(&["create", "update", "patch", "delete"]);
    assert_eq!(
        writes,
        0,
        "writes after restart: {:?}",
        h.sim
            .requests()
            .into_iter()
            .filter(|r| r.key.user == crate::support::OPERATOR)
            .collect::<Vec<_>>()
    );
    // Steady state: once started (ready: caches filled, CRD served), reconciles read from
    // caches: no GET or LIST.
    eventually(WAIT, "the operator to be ready", || async {
        h.metrics
            .ready
            .load(std::sync::atomic::Ordering::Relaxed)
            .then_some(())
    })
    .await;
    let lists = h.operator_requests(&["list", "get"]);
    h.poke("w1").await;
    assert_eq!(
        h.operator_requests(&["list", "get"]),
        lists,
        "a reconcile made GET/LIST requests"
    );
}

#[tokio::test]
async fn growing_home_grows_the_same_claim_and_a_shrink_is_refused() {
    let h = Harness::start().await;
    let home = |size: &str| json!({"image": "devbox:1", "podTemplate": {"volumes": {"home": {"size": size, "mountPath": "/home/dev"}}}});
    h.create("ivy", home("1Gi")).await;
    let running = h.until_phase("ivy", Phase::Running).await;
    let first_pod = running.status.unwrap().pod.unwrap().uid;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    let claim_uid = claims.get("ivy-home").await.unwrap().uid();

    h.patch_spec("ivy", home("2Gi")).await;
    let grown = eventually(WAIT, "the claim to have grown to 2Gi", || async {
        let claim = claims.get("ivy-home").await.ok()?;
        let capacity = claim
            .status
            .as_ref()?
            .capacity
            .as_ref()?
            .get("storage")?
            .0
            .clone();
        (capacity == "2Gi").then_some(claim)
    })
    .await;
    assert_eq!(grown.uid(), claim_uid, "the same claim, never a new one");
    let running = h
        .until("ivy", "Running on a new pod", |ws| {
            phase_of(ws) == Some(Phase::Running)
                && ws.status.as_ref().unwrap().pod.as_ref().unwrap().uid != first_pod
        })
        .await;
    assert_eq!(running.metadata.generation, Some(2));

    // The API server refuses a shrink, in the CRD's words.
    let refused = h
        .workspaces()
        .patch(
            "ivy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": home("1Gi")})),
        )
        .await;
    match refused {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422);
            assert!(
                status.message.contains("home.size cannot shrink"),
                "{}",
                status.message
            );
        }
        other => panic!("a shrink must be refused: {other:?}"),
    }
}

/// Rule C16, coalesced. What a user sees: a start writes the status once per phase (Pending
/// while the pod is created, Starting once it exists, Running), not once per step of the
/// kubelet; the steps in between (bound, containers created, started, agent being checked)
/// wait for the progress interval, here longer than any start, so the count cannot depend on
/// how fast the machine is.
#[tokio::test]
async fn a_start_writes_the_status_once_per_phase() {
    let mut config = test_config();
    config.policy.progress_interval = Duration::from_secs(3600);
    let h = Harness::start_with(crate::support::sim_config(), config).await;
    let history = history(&h, "quick");
    h.create("quick", json!({"image": "devbox:1"})).await;
    let ws = h.until_phase("quick", Phase::Running).await;
    let status_writes = h.sim.count_requests(|k| {
        k.user == crate::support::OPERATOR
            && k.verb == "patch"
            && k.resource == "workspaces"
            && k.subresource == "status"
    });
    assert_eq!(status_writes, 3, "one status write per phase");
    // Every change of the workspace, its status-less ones (creation, finalizer) left out.
    let phases: Vec<Phase> = history
        .through(&ws)
        .await
        .iter()
        .filter_map(|s| s.0)
        .collect();
    assert_eq!(
        phases,
        [Phase::Pending, Phase::Starting, Phase::Running],
        "each phase a user sees is written, once"
    );
    // The events of the steps in between were published with the status they go with.
    let events = crate::support::events_about(&h, &ws.uid().unwrap()).await;
    for reason in ["Created", "Started", "Ready"] {
        assert!(
            events.iter().any(|(r, _)| r == reason),
            "{reason} in {events:?}"
        );
    }
}
