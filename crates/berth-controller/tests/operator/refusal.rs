//! When the API server says no: the workspace says so in the API server's words, with a
//! Warning event and a growing delay, and heals once the cause is fixed.
//!
//! What a user sees for a workspace whose pod the API server refuses:
//! `kubectl get ws` -> `Error`; `Ready=False` with the API's reason (`Forbidden`,
//! `QuotaExceeded`); the message `Cannot create pod <name> (<reason>); the API server said: <its message>`; a
//! Warning `FailedCreate` event with the same words; no `Created` event (nothing was created).

use std::time::Duration;

use berth_api::Phase;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, ServiceAccount};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

use berth_sim::{ApiFault, Frequency, RequestMatch};

use crate::support::{Harness, OPERATOR, condition, events_about, message_of};

fn pod_creates(h: &Harness) -> u64 {
    h.sim.count_requests(|k| {
        k.user == OPERATOR && k.verb == "create" && k.resource == "pods" && k.subresource.is_empty()
    })
}

#[tokio::test]
async fn a_refused_pod_is_explained_in_the_api_servers_words_backs_off_and_heals() {
    let h = Harness::start().await;
    let ws = h
        .create(
            "nosa",
            json!({"image": "devbox:1", "command": ["sleep", "inf"], "serviceAccountName": "does-not-exist"}),
        )
        .await;
    let failing = h.until_not_ready("nosa", "Forbidden").await;
    assert_eq!(failing.status.as_ref().unwrap().phase, Some(Phase::Error));
    assert_eq!(
        message_of(&failing),
        "Cannot create pod nosa-ws (Forbidden); the API server said: pods \"nosa-ws\" is forbidden: error looking up service account default/does-not-exist: serviceaccount \"does-not-exist\" not found"
    );
    assert_eq!(
        condition(&failing, "Ready").unwrap().message,
        message_of(&failing)
    );

    // The refusal is retried with a growing delay (1 s, 2 s, 4 s ...), not in a loop: two
    // more attempts take at least the first two delays, however fast the machine.
    let before = pod_creates(&h);
    let started = tokio::time::Instant::now();
    crate::support::eventually(crate::support::WAIT, "two more attempts", || async {
        (pod_creates(&h) >= before + 2).then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "two retries within {:?} of the first refusal",
        started.elapsed()
    );
    let events = events_about(&h, &ws.uid().unwrap()).await;
    let warnings: Vec<&(String, String)> =
        events.iter().filter(|(r, _)| r == "FailedCreate").collect();
    assert!(!warnings.is_empty(), "a FailedCreate event: {events:?}");
    assert!(
        warnings[0]
            .1
            .contains("serviceaccount \"does-not-exist\" not found"),
        "{warnings:?}"
    );
    assert!(
        warnings.len() <= 1,
        "the same refusal is one event (a series), not one per attempt: {events:?}"
    );
    assert!(
        !events.iter().any(|(r, _)| r == "Created"),
        "nothing was created: {events:?}"
    );

    // Fixed: the account exists, and the next retry creates the pod.
    let accounts: Api<ServiceAccount> = Api::namespaced(h.client.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "does-not-exist"}})).unwrap(),
        )
        .await
        .unwrap();
    h.grant_auth_delegator("default", "does-not-exist").await;
    h.until_phase("nosa", Phase::Running).await;
    let events = events_about(&h, &ws.uid().unwrap()).await;
    assert!(events.iter().any(|(r, _)| r == "Created"), "{events:?}");
}

#[tokio::test]
async fn a_quota_refusal_is_quota_exceeded_and_heals_when_room_is_made() {
    let h = Harness::start().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(h.client.clone(), "default");
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "1"}}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "hog"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}))
            .unwrap(),
    )
    .await
    .unwrap();
    h.create(
        "quota",
        json!({"image": "devbox:1", "command": ["sleep", "inf"]}),
    )
    .await;
    let failing = h.until_not_ready("quota", "QuotaExceeded").await;
    assert_eq!(
        message_of(&failing),
        "Cannot create pod quota-ws (QuotaExceeded); the API server said: pods \"quota-ws\" is forbidden: exceeded quota: two-pods, requested: pods=1, used: pods=1, limited: pods=1"
    );
    pods.delete(
        "hog",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    h.until_phase("quota", Phase::Running).await;
}

#[tokio::test]
async fn a_create_refused_for_the_whole_start_timeout_fails_the_workspace() {
    let h = Harness::start().await;
    h.create(
        "stuck",
        json!({"image": "devbox:1", "serviceAccountName": "never", "lifecycle": {"startTimeout": "3s"}}),
    )
    .await;
    let failed = h.until_phase("stuck", Phase::Failed).await;
    let stalled = condition(&failed, "Stalled").unwrap();
    assert_eq!(stalled.reason, "StartTimeout");
    assert!(
        stalled.message.starts_with(
            "No progress for 3s while creating pod stuck-ws: pods \"stuck-ws\" is forbidden: error looking up service account default/never"
        ),
        "{}",
        stalled.message
    );
    // Given up: no more creates until the spec changes, whatever wakes the workspace.
    let before = pod_creates(&h);
    h.poke("stuck").await;
    assert_eq!(pod_creates(&h), before);
}

#[tokio::test]
async fn a_long_name_and_a_leading_digit_run_with_names_and_labels_a_real_server_accepts() {
    use k8s_openapi::api::core::v1::Service;
    let h = Harness::start().await;
    // 100 characters: the label value would be refused past 63, so it is shortened with a hash.
    let long = format!("{}.{}", "a".repeat(60), "b".repeat(39));
    for name in [long.as_str(), "1st"] {
        h.create(
            name,
            json!({"image": "devbox:1", "command": ["sleep", "inf"], "ports": [{"name": "http", "port": 8080}]}),
        )
        .await;
    }
    for name in [long.as_str(), "1st"] {
        let running = h.until_phase(name, Phase::Running).await;
        let pod_name = running.status.unwrap().pod.unwrap().name;
        let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
        let pod = pods.get(&pod_name).await.unwrap();
        let services: Api<Service> = Api::namespaced(h.client.clone(), "default");
        let service = crate::support::eventually(
            Duration::from_secs(10),
            "the workspace's service",
            || async {
                services
                    .list(&Default::default())
                    .await
                    .unwrap()
                    .items
                    .into_iter()
                    .find(|s| {
                        s.owner_references()
                            .iter()
                            .any(|o| o.name == name && o.kind == "Workspace")
                    })
            },
        )
        .await;
        // The service selects exactly this workspace's pod.
        let selector = service.spec.unwrap().selector.unwrap();
        assert!(
            selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v)),
            "{selector:?} vs {:?}",
            pod.labels()
        );
    }
}

/// The escalation attempt of issue 11: a spec that tolerates every taint, takes the `app`
/// label of another Service's pods and opts out of the mesh. A user would see: `Error`,
/// `Ready=False` and `Stalled=True` with reason `Forbidden` and a message naming the field and
/// the operator setting that would allow it; a Warning event; and no pod, ever. Taking those
/// out of the spec starts the workspace.
#[tokio::test]
async fn a_spec_asking_for_what_the_operator_does_not_allow_gets_no_pod() {
    let h = Harness::start().await;
    // The admission policy would refuse this spec at the API; the operator checks it again,
    // for a workspace created while the policy was not there.
    h.without_admission_policy().await;
    let created = h
        .create(
            "greedy",
            json!({"image": "devbox:1", "podTemplate": {
                "tolerations": [{"operator": "Exists"}],
                "metadata": {"labels": {"app": "payments"},
                    "annotations": {"sidecar.istio.io/inject": "false"}}
            }}),
        )
        .await;
    let ws = h.until_not_ready("greedy", "Forbidden").await;
    assert_eq!(ws.status.as_ref().unwrap().phase, Some(Phase::Error));
    let expected = "The spec asks for what this operator does not allow: spec.podTemplate.tolerations[0]: a toleration of every taint (no key) is not allowed; the operator allows tolerations of (--allowed-tolerations): none";
    assert_eq!(message_of(&ws), expected);
    assert_eq!(condition(&ws, "Stalled").unwrap().reason, "Forbidden");
    let uid = created.uid().unwrap();
    crate::support::eventually(crate::support::WAIT, "a Warning event", || async {
        events_about(&h, &uid)
            .await
            .into_iter()
            .any(|(_, note)| note == expected)
            .then_some(())
    })
    .await;

    // One violation at a time, each named.
    h.patch_spec("greedy", json!({"podTemplate": {"tolerations": null}}))
        .await;
    let ws = h
        .until("greedy", "the label named", |ws| {
            message_of(ws).contains("metadata.labels: \"app\" is reserved")
        })
        .await;
    assert_eq!(condition(&ws, "Ready").unwrap().reason, "Forbidden");
    h.patch_spec(
        "greedy",
        json!({"podTemplate": {"metadata": {"labels": {"app": null, "team": "a"}}}}),
    )
    .await;
    h.until("greedy", "the annotation named", |ws| {
        message_of(ws)
            .contains("\"sidecar.istio.io/inject\" (prefix sidecar.istio.io) is not allowed")
    })
    .await;
    assert_eq!(pod_creates(&h), 0, "no pod was asked for");

    h.patch_spec(
        "greedy",
        json!({"podTemplate": {"metadata": {"annotations": null}}}),
    )
    .await;
    let running = h.until_phase("greedy", Phase::Running).await;
    assert!(condition(&running, "Stalled").is_none());
    let pod = Api::<Pod>::namespaced(h.client.clone(), "default")
        .get("greedy-ws")
        .await
        .unwrap();
    assert_eq!(pod.labels().get("team").map(String::as_str), Some("a"));
}

/// What a user sees when a reconcile itself fails (here the API server fails the operator's
/// writes to the workspace, so its status cannot say it): a Warning `ReconcileFailed` on the
/// workspace with the API server's words and the retry delay; the workspace runs once the
/// writes are taken again.
#[tokio::test]
async fn a_failed_reconcile_is_said_by_a_warning_and_retried() {
    let h = Harness::start().await;
    h.sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("patch", "workspaces"),
        code: 500,
        frequency: Frequency::Next(3),
    });
    let rita = h.create("rita", json!({"image": "devbox:1"})).await;
    h.until_phase("rita", Phase::Running).await;
    let events = events_about(&h, rita.metadata.uid.as_deref().unwrap()).await;
    let failed: Vec<&String> = events
        .iter()
        .filter(|(reason, _)| reason == "ReconcileFailed")
        .map(|(_, note)| note)
        .collect();
    assert!(
        failed.iter().any(|note| note
            .starts_with("Cannot reconcile the workspace (ApiUnavailable); ")
            && note.contains("injected fault (patch workspaces)")
            // The API server's words, not kube's debug print of its whole answer.
            && !note.contains("Status {")
            && note.ends_with("Retrying in 500ms.")),
        "{events:?}"
    );
}
