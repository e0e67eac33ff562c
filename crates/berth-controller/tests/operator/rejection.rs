//! Recovery from kubelet rejection and node loss (rules C10-C13), end to end.

use std::{collections::HashMap, time::Duration};

use berth_api::{Phase, PodRecreationPolicy};
use berth_sim::{NodeConfig, SimConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams},
};
use serde_json::json;

use crate::support::{
    Harness, OPERATOR, WAIT, condition, message_of, phase_of, record, test_config,
};

fn one_node() -> SimConfig {
    SimConfig {
        nodes: vec![NodeConfig::new("node-1")],
        ..crate::support::sim_config()
    }
}

fn quick_recreation() -> berth_controller::Config {
    let mut config = test_config();
    config.policy.recreation = PodRecreationPolicy {
        max: 3,
        delay: Duration::from_millis(200),
    };
    config
}

async fn workspace_events(h: &Harness, name: &str) -> Vec<(String, String)> {
    let uid = h.workspaces().get(name).await.unwrap().uid().unwrap();
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    let mut list = events
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
        .await
        .unwrap()
        .items;
    list.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
    list.into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

async fn rejected_once_then_running(h: &Harness, name: &str, reason: &str) {
    let seen = record(h, name, phase_of);
    h.create(name, json!({"image": "devbox:1"})).await;
    let ws = h
        .until(name, "Running after one replacement", |ws| {
            phase_of(ws) == Some(Phase::Running)
        })
        .await;
    let status = ws.status.clone().unwrap();
    assert_eq!(status.pod_recreations, Some(1));
    let rejected = condition(&ws, "PodRejected").unwrap();
    assert_eq!(
        (rejected.status.as_str(), rejected.reason.as_str()),
        ("False", "PodRecreated")
    );
    let reasons: Vec<String> = workspace_events(h, name)
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let first_rejected = reasons
        .iter()
        .position(|r| r == "PodRejected")
        .expect("PodRejected event");
    let recreating = reasons
        .iter()
        .position(|r| r == "Recreating")
        .expect("Recreating event");
    assert!(first_rejected < recreating, "{reasons:?}");
    let kubelet_rejections = Api::<Event>::namespaced(h.client.clone(), "default")
        .list(&ListParams::default().fields(&format!("reason={reason}")))
        .await
        .unwrap()
        .items;
    assert_eq!(kubelet_rejections.len(), 1, "the sim rejected exactly once");
    let counted = format!("berth_pod_recreations_total{{reason=\"{reason}\",attempt=\"1\"}} 1");
    let metrics = h.metrics.render();
    assert!(
        metrics.contains(&counted),
        "{counted} missing from:\n{metrics}"
    );
    let history: Vec<Phase> = seen.through(&ws).await.into_iter().flatten().collect();
    assert!(
        !history.contains(&Phase::Failed),
        "a watch saw Failed: {history:?}"
    );
    assert!(history.contains(&Phase::Running));
}

#[tokio::test]
async fn a_pod_rejected_for_cpu_is_replaced_and_the_workspace_runs() {
    let h = Harness::start_with(one_node(), quick_recreation()).await;
    h.sim.faults().reject_next("node-1", 1, "OutOfcpu");
    rejected_once_then_running(&h, "cpu", "OutOfcpu").await;
}

#[tokio::test]
async fn the_node_label_race_is_handled_the_same_way() {
    let h = Harness::start_with(one_node(), quick_recreation()).await;
    h.sim.faults().node_label_race("node-1");
    rejected_once_then_running(&h, "race", "NodeAffinity").await;
}

#[tokio::test]
async fn the_new_pod_waits_for_the_delay_after_the_old_one_is_gone() {
    let h = Harness::start_with(one_node(), quick_recreation()).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let mut events = Box::pin(
        pods.watch(&WatchParams::default().fields("metadata.name=slow-ws"), "0")
            .await
            .unwrap(),
    );
    h.sim.faults().reject_next("node-1", 1, "OutOfmemory");
    h.create(
        "slow",
        json!({"image": "devbox:1", "lifecycle": {"podRecreation": {"delay": "1500ms"}}}),
    )
    .await;
    let mut gone_at = None;
    let mut created_again_at = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while created_again_at.is_none() && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), events.next()).await {
            Ok(Some(Ok(WatchEvent::Deleted(_)))) => gone_at = Some(tokio::time::Instant::now()),
            Ok(Some(Ok(WatchEvent::Added(_)))) if gone_at.is_some() => {
                created_again_at = Some(tokio::time::Instant::now())
            }
            _ => {}
        }
    }
    let waited = created_again_at
        .expect("a new pod")
        .duration_since(gone_at.expect("the old pod went"));
    // The operator waits from when it saw the rejection, which is before the pod was gone.
    assert!(
        waited >= Duration::from_millis(1300),
        "the new pod came {waited:?} after the old one was gone"
    );
    h.until_phase("slow", Phase::Running).await;
}

#[tokio::test]
async fn the_limit_fails_visibly_survives_a_restart_and_a_spec_change_starts_again() {
    let mut h = Harness::start_with(one_node(), quick_recreation()).await;
    h.sim.faults().reject_next("node-1", 3, "OutOfcpu");
    h.create("doomed", json!({"image": "devbox:1", "lifecycle": {"podRecreation": {"maxRecreations": 2, "delay": "100ms"}}})).await;
    let failed = h.until_phase("doomed", Phase::Failed).await;
    for type_ in ["PodRejected", "Stalled"] {
        let c = condition(&failed, type_).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "RecreationLimitReached"),
            "{type_}"
        );
    }
    assert_eq!(failed.status.as_ref().unwrap().pod_recreations, Some(2));
    assert!(
        message_of(&failed).contains("giving up (maxRecreations 2)"),
        "{}",
        message_of(&failed)
    );
    let creations = h.sim.count_requests(|k| {
        k.user == OPERATOR && k.verb == "create" && k.resource == "pods" && k.code == 201
    });
    assert_eq!(creations, 3, "one pod and two replacements");
    let reasons: Vec<String> = workspace_events(&h, "doomed")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(
        reasons.contains(&"RecreationLimitReached".to_owned()),
        "{reasons:?}"
    );

    // The failure is persisted: a restarted operator keeps it and creates nothing.
    h.stop_operator().await;
    let reconciled = h.reconciles();
    h.start_operator();
    h.until_reconciled(reconciled, 1).await;
    let still = h.workspaces().get("doomed").await.unwrap();
    assert_eq!(phase_of(&still), Some(Phase::Failed));
    assert_eq!(
        h.sim.count_requests(|k| k.user == OPERATOR
            && k.verb == "create"
            && k.resource == "pods"
            && k.code == 201),
        3
    );

    // A spec change resets the count and starts again.
    h.patch_spec("doomed", json!({"image": "devbox:2"})).await;
    let running = h.until_phase("doomed", Phase::Running).await;
    assert_eq!(running.status.unwrap().pod_recreations, Some(0));
}

#[tokio::test]
async fn a_pod_that_ran_and_then_failed_is_not_replaced() {
    let h = Harness::start_with(one_node(), quick_recreation()).await;
    h.create("crash", json!({"image": "devbox:1"})).await;
    let running = h.until_phase("crash", Phase::Running).await;
    let uid = running.status.unwrap().pod.unwrap().uid;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let failed = json!({"status": {"phase": "Failed", "reason": "OutOfmemory", "message": "The node was low on resource: memory.",
        "containerStatuses": [{"name": "workspace", "image": "devbox:1", "imageID": "", "ready": false, "restartCount": 0, "started": false,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}});
    pods.patch_status("crash-ws", &PatchParams::default(), &Patch::Merge(failed))
        .await
        .unwrap();
    let errored = h.until_phase("crash", Phase::Error).await;
    assert_eq!(
        message_of(&errored),
        "Pod crash-ws failed: container exited with code 137 (OOMKilled)"
    );
    h.poke("crash").await;
    assert_eq!(
        pods.get("crash-ws").await.unwrap().metadata.uid,
        uid,
        "the pod was kept"
    );
    assert!(condition(&h.workspaces().get("crash").await.unwrap(), "PodRejected").is_none());
}

/// Waits until the workspace runs on a node other than `node`.
async fn running_off(h: &Harness, name: &str, node: &str) -> berth_api::Workspace {
    h.until(name, "Running on another node", |ws| {
        phase_of(ws) == Some(Phase::Running)
            && ws
                .status
                .as_ref()
                .and_then(|s| s.pod.as_ref())
                .and_then(|p| p.node_name.as_deref())
                .is_some_and(|n| n != node)
    })
    .await
}

#[tokio::test]
async fn a_deleted_node_loses_its_pod_and_the_workspace_moves() {
    let h = Harness::start_with(crate::support::sim_config(), quick_recreation()).await;
    h.create("mover", json!({"image": "devbox:1"})).await;
    let running = h.until_phase("mover", Phase::Running).await;
    let node = running.status.unwrap().pod.unwrap().node_name.unwrap();
    h.sim.delete_node(&node).unwrap();
    let moved = running_off(&h, "mover", &node).await;
    assert_eq!(
        moved.status.unwrap().pod_recreations,
        Some(0),
        "node loss is counted apart from rejections"
    );
    let reasons: Vec<String> = workspace_events(&h, "mover")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(reasons.contains(&"NodeLost".to_owned()), "{reasons:?}");
}

#[tokio::test]
async fn an_unreachable_node_loses_its_pod_and_the_workspace_moves() {
    let h = Harness::start_with(crate::support::sim_config(), quick_recreation()).await;
    h.create("stranded", json!({"image": "devbox:1"})).await;
    let running = h.until_phase("stranded", Phase::Running).await;
    let node = running.status.unwrap().pod.unwrap().node_name.unwrap();
    h.sim.faults().set_unreachable(&node, true);
    let moved = running_off(&h, "stranded", &node).await;
    assert!(condition(&moved, "PodRejected").is_some_and(|c| c.status == "False"));
    let reasons: Vec<String> = workspace_events(&h, "stranded")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(
        reasons.contains(&"NodeLost".to_owned()) && reasons.contains(&"Recreating".to_owned()),
        "{reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_workspaces_with_ten_percent_rejections_all_run() {
    const COUNT: usize = 200;
    // Each admission is a fresh draw, so with a limit of 3 one workspace in 10 000 meets
    // four rejections in a row and fails as it should (2 % of runs with 200 of them). The
    // limit is not what this test is about: at 10 it takes 10^-11 per workspace.
    let mut generous = quick_recreation();
    generous.policy.recreation.max = 10;
    let h = Harness::start_with(
        SimConfig {
            seed: 7,
            ..crate::support::sim_config()
        },
        generous,
    )
    .await;
    h.sim.faults().reject_fraction(0.1, "OutOfcpu");
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let mut pod_events = Box::pin(
        pods.watch(&WatchParams::default().timeout(290), "0")
            .await
            .unwrap(),
    );
    let watcher_task = tokio::spawn(async move {
        let mut live: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
        let mut most = 0;
        while let Some(Ok(event)) = pod_events.next().await {
            let (added, pod) = match event {
                WatchEvent::Added(p) => (true, p),
                WatchEvent::Deleted(p) => (false, p),
                _ => continue,
            };
            let workspace = pod
                .labels()
                .get("berth.dev/workspace")
                .cloned()
                .unwrap_or_default();
            let set = live.entry(workspace).or_default();
            if added {
                set.insert(pod.uid().unwrap_or_default());
            } else {
                set.remove(&pod.uid().unwrap_or_default());
            }
            most = most.max(set.len());
            if most > 1 {
                break;
            }
        }
        most
    });
    for i in 0..COUNT {
        h.create(&format!("w{i:03}"), json!({"image": "devbox:1"}))
            .await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let all = loop {
        let list = h.workspaces().list(&Default::default()).await.unwrap();
        let waiting: Vec<_> = list
            .items
            .iter()
            .filter(|w| phase_of(w) != Some(Phase::Running))
            .collect();
        if waiting.is_empty() {
            break list.items;
        }
        if tokio::time::Instant::now() > deadline {
            let shown: Vec<String> = waiting
                .iter()
                .take(5)
                .map(|w| format!("{}: {:?}", w.name_any(), w.status))
                .collect();
            panic!(
                "after 120 s, {} workspaces are not running; the first:\n{}",
                waiting.len(),
                shown.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let recreations: u32 = all
        .iter()
        .filter_map(|w| w.status.as_ref()?.pod_recreations)
        .sum();
    let injected = Api::<Event>::namespaced(h.client.clone(), "default")
        .list(&ListParams::default().fields("reason=OutOfcpu"))
        .await
        .unwrap()
        .items
        .len();
    assert!(injected > 0, "the fault fired");
    assert_eq!(
        recreations as usize, injected,
        "every rejection was replaced exactly once"
    );
    watcher_task.abort();
    if let Ok(Ok(most)) = tokio::time::timeout(Duration::from_millis(10), watcher_task).await {
        assert!(most <= 1, "a workspace had two pods at once");
    }
}

/// The harsh profile: 80 workspaces, 30 % of pods rejected, watches cut every 700 ms and the
/// operator killed 8 times. Whatever the caches show, every rejection is counted once, in the
/// status of its own workspace.
async fn chaos(seed: u64) {
    const COUNT: usize = 80;
    let mut config = test_config();
    config.policy.recreation = PodRecreationPolicy {
        max: 20,
        delay: Duration::from_secs(1),
    };
    let mut h = Harness::start_with(
        SimConfig {
            seed,
            ..crate::support::sim_config()
        },
        config,
    )
    .await;
    h.sim.faults().reject_fraction(0.3, "OutOfcpu");
    h.sim
        .faults()
        .close_watches_every(Some(Duration::from_millis(700)));
    // Writes that land while their answer is lost (a timeout after the API server committed):
    // the operator must neither create a second pod nor count a recreation twice.
    for (verb, resource) in [
        ("create", "pods"),
        ("delete", "pods"),
        ("patch", "workspaces"),
    ] {
        h.sim.faults().lost_reply(berth_sim::ApiFault {
            matching: berth_sim::RequestMatch::new(verb, resource),
            code: 500,
            frequency: berth_sim::Frequency::Fraction(0.1),
        });
    }
    for i in 0..COUNT {
        h.create(&format!("c{i:02}"), json!({"image": "devbox:1"}))
            .await;
    }
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        h.stop_operator().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        h.start_operator();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let all = loop {
        let list = h.workspaces().list(&Default::default()).await.unwrap();
        let stuck: Vec<String> = list
            .items
            .iter()
            .filter(|w| phase_of(w) != Some(Phase::Running))
            .map(|w| format!("{}: {:?} {}", w.name_any(), phase_of(w), message_of(w)))
            .collect();
        if stuck.is_empty() {
            break list.items;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "seed {seed}: not running 60 s after the last restart: {stuck:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    h.sim.faults().close_watches_every(None);
    let lost = h.sim.count_requests(|k| {
        k.code == 500
            && matches!(
                (k.verb.as_str(), &*k.resource),
                ("create" | "delete", "pods") | ("patch", "workspaces")
            )
    });
    assert!(lost > 0, "seed {seed}: replies were lost");
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(h.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(pods.len(), COUNT, "seed {seed}: one pod per workspace");
    let mut rejected: HashMap<String, u32> = HashMap::new();
    for event in Api::<Event>::namespaced(h.client.clone(), "default")
        .list(&ListParams::default().fields("reason=OutOfcpu"))
        .await
        .unwrap()
        .items
    {
        let pod = event.involved_object.name.clone().unwrap_or_default();
        *rejected.entry(pod).or_default() += event.count.unwrap_or(1).max(1) as u32;
    }
    assert!(!rejected.is_empty(), "seed {seed}: the fault fired");
    let wrong: Vec<String> = all
        .iter()
        .filter_map(|w| {
            let counted = w.status.as_ref()?.pod_recreations.unwrap_or(0);
            let injected = rejected
                .get(&format!("{}-ws", w.name_any()))
                .copied()
                .unwrap_or(0);
            (counted != injected)
                .then(|| format!("{}: {counted} counted, {injected} rejected", w.name_any()))
        })
        .collect();
    assert!(wrong.is_empty(), "seed {seed}: {wrong:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_chaos_every_rejection_is_counted_once_over_several_seeds() {
    // The seeds run side by side, each against its own sim and operator.
    futures::future::join_all([3, 5, 8].map(chaos)).await;
}
