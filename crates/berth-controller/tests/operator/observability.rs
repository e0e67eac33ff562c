//! What operators of Berth look at: metrics, health, `kubectl describe`, and specs refused at
//! the API before the operator ever sees them.

use std::{sync::Arc, time::Duration};

use berth_api::Phase;
use berth_controller::metrics::Metrics;
use kube::api::PostParams;
use serde_json::json;

use crate::support::{Harness, OPERATOR, eventually, test_config};

/// `/readyz` says ready only once the Workspace CRD is served and listed, not merely when the
/// other caches are.
#[tokio::test]
async fn not_ready_until_the_crd_is_served() {
    use std::sync::atomic::Ordering;
    let sim = berth_sim::SimCluster::start(berth_sim::SimConfig::api_only())
        .await
        .unwrap();
    let client = sim.client().await.unwrap();
    let metrics = Arc::new(Metrics::default());
    let operator = tokio::spawn(berth_controller::run_with_metrics(
        client.clone(),
        test_config(),
        metrics.clone(),
    ));
    // The pod, claim, service and event caches list at once; the Workspace one cannot.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!metrics.ready.load(Ordering::Relaxed));
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(client);
    for crd in berth_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    eventually(
        Duration::from_secs(15),
        "ready once the CRD is served",
        || async { metrics.ready.load(Ordering::Relaxed).then_some(()) },
    )
    .await;
    operator.abort();
}

#[tokio::test]
async fn metrics_count_reconciles_writes_and_phases_and_are_served() {
    let metrics = Arc::new(Metrics::default());
    let mut h = Harness::start().await;
    // This test runs its own operator (namespaced, with metrics it can read).
    h.stop_operator().await;
    let client = h.sim.client().await.unwrap();
    let served = metrics.clone();
    let address: std::net::SocketAddr = ([127, 0, 0, 1], berth_sim::free_port()).into();
    tokio::spawn(
        berth_controller::metrics::serve(served, Some(address), Some(address))
            .await
            .unwrap(),
    );
    let config = berth_controller::Config {
        namespace: Some("metrics".into()),
        ..test_config()
    };
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "metrics"}})).unwrap(),
        )
        .await
        .unwrap();
    h.grant_auth_delegator("metrics", "default").await;
    let operator = tokio::spawn(berth_controller::run_with_metrics(
        client.clone(),
        config,
        metrics.clone(),
    ));
    let workspaces: kube::Api<berth_api::Workspace> =
        kube::Api::namespaced(client.clone(), "metrics");
    let body = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "m"}, "spec": {"image": "devbox:1"}});
    workspaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "the workspace to run", || async {
        let ws = workspaces.get("m").await.ok()?;
        (ws.status?.phase == Some(Phase::Running)).then_some(())
    })
    .await;
    let text = eventually(Duration::from_secs(10), "the phase gauge", || async {
        let text = metrics.render();
        text.contains("berth_workspaces{phase=\"Running\"} 1")
            .then_some(text)
    })
    .await;
    for name in [
        "berth_reconcile_duration_seconds_bucket",
        "berth_status_writes_total",
        "berth_workspace_start_seconds_count 1",
        "berth_agent_checks_total{result=\"ok\"} 1",
        concat!(
            "berth_build_info{version=\"",
            env!("CARGO_PKG_VERSION"),
            "\"} 1"
        ),
        "# TYPE process_cpu_seconds counter",
        "# TYPE process_resident_memory_bytes gauge",
        "process_open_fds ",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    let rss: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the resident memory");
    assert!(rss > 1_000_000.0, "a process of the operator's size: {rss}");
    let http = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        socket.read_to_string(&mut response).await.unwrap();
        response
    };
    assert!(http("/metrics").await.contains("berth_workspaces"));
    // The gauge is counted at each scrape: a deleted workspace leaves it.
    workspaces.delete("m", &Default::default()).await.unwrap();
    eventually(
        Duration::from_secs(20),
        "the phase gauge without it",
        || async {
            let text = metrics.render();
            text.contains("berth_workspaces{phase=\"Running\"} 0")
                .then_some(())
        },
    )
    .await;
    assert!(http("/healthz").await.starts_with("HTTP/1.1 200"));
    eventually(
        Duration::from_secs(5),
        "/readyz to answer 200 once caches synced",
        || async {
            http("/readyz")
                .await
                .starts_with("HTTP/1.1 200")
                .then_some(())
        },
    )
    .await;
    operator.abort();
}

#[tokio::test]
async fn invalid_specs_never_reach_the_operator() {
    let h = Harness::start().await;
    let bad = [
        json!({"image": "x:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "relative/path"}]}}}),
        json!({"image": "x:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/same"}], "data": [{"claimName": "c", "mountPath": "/same"}]}}}),
        json!({"image": "x:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/s", "defaultMode": 1000}]}}}),
        json!({"image": ""}),
    ];
    let fields = [
        "spec.podTemplate.volumes.secrets[0].mountPath",
        "spec.podTemplate.volumes",
        "spec.podTemplate.volumes.secrets[0].defaultMode",
        "spec.image",
    ];
    for (spec, field) in bad.iter().zip(fields) {
        let body = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "bad"}, "spec": spec});
        let result = h
            .workspaces()
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await;
        match result {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{spec}");
                assert!(
                    status.message.contains(field),
                    "{field} not named in: {}",
                    status.message
                );
            }
            other => panic!("{spec} was accepted: {other:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.sim.count_requests(|k| k.user == OPERATOR
            && matches!(k.verb.as_str(), "create" | "patch" | "update" | "delete")),
        0
    );
}

#[tokio::test]
async fn kubectl_describe_shows_the_workspace_story() {
    let h = Harness::start().await;
    let present = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        if std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() != Ok("0") {
            panic!(
                "kubectl is needed for this test and is not on PATH: install it (any version from 1.27; README, \"What the tests need\"), or set BERTH_REQUIRE_KUBECTL=0 to skip what needs it"
            );
        }
        eprintln!("skipping: kubectl is not installed");
        return;
    }
    h.create("story", json!({"image": "devbox:1"})).await;
    h.until_phase("story", Phase::Running).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    h.sim.write_kubeconfig(&kubeconfig).unwrap();
    let described = eventually(
        Duration::from_secs(10),
        "the events in describe",
        || async {
            let output = tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["describe", "ws", "story"])
                .output()
                .await
                .ok()?;
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            let events = text.split("Events:").nth(1)?.to_owned();
            (events.contains("Created") && events.contains("Started") && events.contains("Ready"))
                .then_some(text)
        },
    )
    .await;
    assert!(
        described.contains("Phase:") && described.contains("Running"),
        "{described}"
    );
    assert!(described.contains("Workspace is ready"), "{described}");
}

/// The events of the workspace with `uid`, by reason.
async fn event_reasons(h: &Harness, uid: &str) -> Vec<String> {
    let mut reasons: Vec<String> = crate::support::events_about(h, uid)
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect();
    reasons.sort();
    reasons
}

/// An event the API server fails to take (a 500) is tried again, not lost: the status says it
/// was told, so nothing else would tell it. One whose every attempt fails is counted.
#[tokio::test]
async fn events_are_retried_before_they_are_dropped_and_a_dropped_one_is_counted() {
    use berth_sim::{ApiFault, Frequency, RequestMatch};
    let h = Harness::start().await;
    h.sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("create", "events"),
        code: 500,
        frequency: Frequency::Next(3),
    });
    let ws = h.create("told", json!({"image": "devbox:1"})).await;
    h.until_phase("told", Phase::Running).await;
    let uid = ws.metadata.uid.clone().unwrap();
    eventually(
        Duration::from_secs(20),
        "every event of the start",
        || async {
            let reasons = event_reasons(&h, &uid).await;
            (reasons == ["Created", "Ready", "Started"]).then_some(())
        },
    )
    .await;
    let failed = h
        .sim
        .count_requests(|k| k.resource == "events" && k.verb == "create" && k.code == 500);
    assert_eq!(failed, 3, "the faults fired");
    assert!(!h.metrics.render().contains("berth_events_dropped_total{"));

    // Every attempt fails: the event is dropped, and counted by its reason. (A 500: kube's
    // client itself already retries a 429, 503 or 504, for longer than a test waits.)
    h.sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("create", "events"),
        code: 500,
        frequency: Frequency::Next(u32::MAX),
    });
    h.create("untold", json!({"image": "devbox:1"})).await;
    let counted = tokio::time::timeout(Duration::from_secs(30), async {
        while h.metric("berth_events_dropped_total{reason=\"Created\"}") < 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "no dropped Created event counted:\n{}\n{:?}\n{}",
        h.metrics.render(),
        h.sim.requests(),
        h.logs.text()
    );
}

/// `kubectl get ws` says what is wrong in short, in every phase family, within a line a
/// terminal holds; `-o wide` adds the pod, node, recreations and last activity, and the full
/// message stays in the status.
#[tokio::test]
async fn kubectl_get_ws_shows_a_short_message_in_every_phase_family() {
    let h = Harness::start().await;
    if std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        assert_eq!(
            std::env::var("BERTH_REQUIRE_KUBECTL").as_deref(),
            Ok("0"),
            "kubectl is needed for this test and is not on PATH: install it (any version from 1.27; README, \"What the tests need\"), or set BERTH_REQUIRE_KUBECTL=0 to skip what needs it"
        );
        return;
    }
    // Running; Error (a missing secret, in the kubelet's words); Stopped (paused); Error
    // (a name someone else's object holds, the longest message Berth writes).
    h.create("up", json!({"image": "devbox:1"})).await;
    h.create("lacking", json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "nowhere", "mountPath": "/s"}]}}})).await;
    h.create("resting", json!({"image": "devbox:1", "paused": true}))
        .await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(h.client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "squatted-ws"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}})).unwrap(),
    )
    .await
    .unwrap();
    h.create("squatted", json!({"image": "devbox:1"})).await;
    h.until_phase("up", Phase::Running).await;
    h.until_phase("lacking", Phase::Error).await;
    h.until_phase("resting", Phase::Stopped).await;
    let squatted = h.until_phase("squatted", Phase::Error).await;
    let status = squatted.status.unwrap();
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .ends_with("rename the workspace or delete the pod")
    );
    assert_eq!(
        status.summary.as_deref(),
        Some("Pod squatted-ws exists and is not owned by this workspace (owned by nobody)")
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    h.sim.write_kubeconfig(&kubeconfig).unwrap();
    // Asynchronously: the sim serves on this test's own thread.
    let get = |wide: bool| {
        let mut command = tokio::process::Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "ws"]);
        if wide {
            command.args(["-o", "wide"]);
        }
        async move { String::from_utf8(command.output().await.unwrap().stdout).unwrap() }
    };
    let table = get(false).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "READY", "MESSAGE", "UPDATE", "AGE"],
        "{table}"
    );
    for line in table.lines() {
        assert!(
            line.chars().count() <= 140,
            "a line wider than a terminal: {line:?}\n{table}"
        );
    }
    for (name, said) in [
        ("up", "Workspace is running"),
        ("resting", "Workspace is paused"),
        (
            "squatted",
            "Pod squatted-ws exists and is not owned by this workspace (owned by nobody)",
        ),
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name) && l.contains(said)),
            "{name}: {said}\n{table}"
        );
    }
    let wide = get(true).await;
    let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PHASE",
            "READY",
            "MESSAGE",
            "UPDATE",
            "AGE",
            "KIND",
            "POD",
            "NODE",
            "RECREATIONS",
            "LAST-ACTIVE"
        ],
        "{wide}"
    );
    assert!(
        wide.lines()
            .any(|l| l.starts_with("up") && l.contains("up-ws")),
        "{wide}"
    );
}
