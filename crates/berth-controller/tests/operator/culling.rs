//! Idle culling (issue 17): a workspace nobody uses is paused at its `idleTimeout`, keeping
//! its home; one in use (a connection held, heartbeats) never is; one whose agent cannot be
//! asked never is either (unknown is not idle).

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use berth_api::{Phase, Workspace};
use berth_sim::{BoxFuture, ContainerContext, ContainerRuntime, RunningContainer, SimConfig};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::*;

/// GetActivity calls the operator made with `result`, from its metrics.
fn activity_checks(h: &Harness, result: &str) -> u64 {
    h.metric(&format!(
        "berth_agent_activity_checks_total{{result=\"{result}\"}}"
    ))
}

fn culled(h: &Harness) -> u64 {
    h.metric("berth_workspaces_culled_total")
}

fn idle_reason(ws: &Workspace) -> bool {
    condition(ws, "Ready").is_some_and(|c| c.status == "False" && c.reason == "Idle")
}

fn pod_ip(ws: &Workspace) -> Ipv4Addr {
    ws.status
        .as_ref()
        .unwrap()
        .pod
        .as_ref()
        .unwrap()
        .ip
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// A token of the operator's service account for the agents in `default` (any caller allowed
/// to `use` the workspace's agent may send heartbeats).
fn agent_token(h: &Harness) -> String {
    h.sim
        .issue_token(
            "berth-system",
            "berth-controller",
            &["berth-agent/default"],
            Duration::from_secs(600),
        )
        .unwrap()
}

/// A user would see: Running, then once nobody used it for 8 s (±10 %), `Stopped` with
/// `Ready=False` reason `Idle` saying for how long and how to resume, `spec.paused: true` set
/// by Berth, a Normal event `Culled`, and LAST-ACTIVE filled in. Resuming brings a new pod
/// with the same home claim.
#[tokio::test]
async fn an_idle_workspace_is_paused_at_its_timeout_and_resumes_with_its_home() {
    let h = Harness::start().await;
    const TIMEOUT: Duration = Duration::from_secs(8);
    h.create(
        "sleepy",
        json!({"image": "devbox:1", "command": ["sleep", "infinity"],
            "lifecycle": {"idleTimeout": "8s"},
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}}),
    )
    .await;
    let running = h.until_phase("sleepy", Phase::Running).await;
    let ready_seen = Instant::now();
    let first_pod = running
        .status
        .as_ref()
        .unwrap()
        .pod
        .clone()
        .unwrap()
        .uid
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    let claim_uid = claims.get("sleepy-home").await.unwrap().uid().unwrap();

    let culling = h
        .until("sleepy", "the workspace to be culled", idle_reason)
        .await;
    let idle_for = ready_seen.elapsed();
    assert!(
        idle_for >= TIMEOUT.mul_f64(0.9) && idle_for <= TIMEOUT.mul_f64(1.1),
        "culled after {idle_for:?}, the timeout is {TIMEOUT:?}"
    );
    assert!(
        activity_checks(&h, "ok") >= 2,
        "asked at shrinking steps, not once"
    );
    assert_eq!(
        phase_of(&culling),
        Some(Phase::Stopping),
        "{}",
        message_of(&culling)
    );
    let stopped = h.until_phase("sleepy", Phase::Stopped).await;
    assert!(stopped.spec.paused, "Berth set spec.paused");
    assert!(idle_reason(&stopped));
    let message = message_of(&stopped);
    assert!(
        message.starts_with(
            "Nobody used the workspace for 8s (the last use its agent saw: the agent started, at "
        ),
        "{message}"
    );
    assert!(
        message.ends_with("set spec.paused to false to resume."),
        "{message}"
    );
    let status = stopped.status.clone().unwrap();
    assert!(status.last_activity.is_some(), "LAST-ACTIVE is shown");
    assert_eq!(status.last_activity_signal.as_deref(), Some("Started"));
    let events = events_about(&h, &stopped.uid().unwrap()).await;
    let culled_event = events.iter().find(|(reason, _)| reason == "Culled");
    assert!(
        culled_event.is_some_and(|(_, note)| note.contains("(idleTimeout 8s)")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|(reason, _)| reason == "Paused"),
        "{events:?}"
    );
    assert_eq!(culled(&h), 1);
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    assert!(
        pods.get_opt("sleepy-ws").await.unwrap().is_none(),
        "the pod is gone"
    );
    assert_eq!(
        claims.get("sleepy-home").await.unwrap().uid().unwrap(),
        claim_uid,
        "the home is kept"
    );

    // Resumed as any paused workspace is.
    h.patch_spec("sleepy", json!({"paused": false})).await;
    let back = h.until_phase("sleepy", Phase::Running).await;
    let pod = back.status.as_ref().unwrap().pod.clone().unwrap();
    assert_ne!(pod.uid.unwrap(), first_pod, "a new pod");
    assert_eq!(
        claims.get("sleepy-home").await.unwrap().uid().unwrap(),
        claim_uid,
        "with the same home claim"
    );
    let events = events_about(&h, &back.uid().unwrap()).await;
    assert!(
        events.iter().any(|(reason, _)| reason == "Resumed"),
        "{events:?}"
    );
}

/// A user would see: a workspace with a connection held to its port, and one whose IDE sends
/// heartbeats, stay Running past three timeouts while Berth keeps asking, with LAST-ACTIVE
/// following their use. Once the connection closes, that one is culled.
#[tokio::test]
async fn a_workspace_in_use_is_never_culled() {
    let h = Harness::start().await;
    const TIMEOUT: Duration = Duration::from_secs(3);
    let idle = json!({"idleTimeout": "3s"});
    h.create(
        "served",
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}], "lifecycle": idle}),
    )
    .await;
    h.create(
        "edited",
        json!({"image": "devbox:1", "command": ["sleep", "infinity"], "lifecycle": idle}),
    )
    .await;
    let served = h.until_phase("served", Phase::Running).await;
    let edited = h.until_phase("edited", Phase::Running).await;
    let connection = tokio::net::TcpStream::connect(SocketAddr::from((pod_ip(&served), 8080)))
        .await
        .expect("the workspace serves its port on the pod IP");
    let agent = edited.status.as_ref().unwrap().agent.clone().unwrap();
    let address = agent.address.unwrap();
    let token = agent_token(&h);
    let heartbeats = tokio::spawn(async move {
        loop {
            berth_agent::client::heartbeat(
                &address,
                &token,
                Duration::from_secs(5),
                None,
                "vscode",
            )
            .await
            .expect("a heartbeat");
            tokio::time::sleep(TIMEOUT / 4).await;
        }
    });

    let from = Instant::now();
    let asked = activity_checks(&h, "ok");
    eventually(
        Duration::from_secs(40),
        "three timeouts of asks",
        || async {
            (from.elapsed() >= 3 * TIMEOUT && activity_checks(&h, "ok") >= asked + 8).then_some(())
        },
    )
    .await;
    for (name, signal) in [("served", "Connection"), ("edited", "Heartbeat")] {
        let ws = h.workspaces().get(name).await.unwrap();
        assert_eq!(
            phase_of(&ws),
            Some(Phase::Running),
            "{name}: {}",
            message_of(&ws)
        );
        assert!(!ws.spec.paused, "{name}");
        let status = ws.status.unwrap();
        assert_eq!(
            status.last_activity_signal.as_deref(),
            Some(signal),
            "{name}"
        );
    }
    assert_eq!(culled(&h), 0);
    heartbeats.abort();

    drop(connection);
    h.until(
        "served",
        "the workspace to be culled once unused",
        idle_reason,
    )
    .await;
}

/// Agents for workspace `cut` sit behind a proxy on the agent port that drops every
/// connection once [`CUT`] is set, as a network partition would; the agent itself serves on
/// the next port.
static CUT: AtomicBool = AtomicBool::new(false);

struct Partitioned;

impl ContainerRuntime for Partitioned {
    fn start(&self, mut context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        let agent = !context.init
            && berth_agent::sim_runtime::runs_agent(&context.container)
            && context.container["env"].as_array().is_some_and(|env| {
                env.iter()
                    .any(|e| e["name"] == "BERTH_WORKSPACE_NAME" && e["value"] == "cut")
            });
        if !agent {
            return berth_agent::sim_runtime::AgentRuntime::default().start(context);
        }
        let real = berth_agent::DEFAULT_PORT + 1;
        for e in context.container["env"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if e["name"] == "BERTH_AGENT_PORT" {
                e["value"] = json!(real.to_string());
            }
        }
        let ip = context.pod_ip;
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind((ip, berth_agent::DEFAULT_PORT))
                .await
                .map_err(|e| e.to_string())?;
            let container = berth_agent::sim_runtime::AgentRuntime::default()
                .start(context)
                .await?;
            let proxy = tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if CUT.load(Ordering::SeqCst) {
                        continue; // dropped at once
                    }
                    tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect((ip, real)).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                }
            });
            let RunningContainer { exited, stop } = container;
            let (exit_tx, exited_outer) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let code = exited.await.unwrap_or(1);
                proxy.abort();
                let _ = exit_tx.send(code);
            });
            Ok(RunningContainer {
                exited: exited_outer,
                stop,
            })
        })
    }
}

/// A user would see: the workspace stays Running past its timeout while its agent cannot be
/// reached, saying its activity is unknown (with a Warning `ActivityUnknown`), and is culled
/// only once the agent answers again and shows nobody used it.
#[tokio::test]
async fn an_agent_that_cannot_be_asked_never_gets_its_workspace_culled() {
    let h = Harness::start_with(
        SimConfig {
            runtime: Arc::new(Partitioned),
            ..sim_config()
        },
        test_config(),
    )
    .await;
    const TIMEOUT: Duration = Duration::from_secs(2);
    h.create(
        "cut",
        json!({"image": "devbox:1", "command": ["sleep", "infinity"], "lifecycle": {"idleTimeout": "2s"}}),
    )
    .await;
    let running = h.until_phase("cut", Phase::Running).await;
    CUT.store(true, Ordering::SeqCst);
    let from = Instant::now();
    eventually(
        Duration::from_secs(40),
        "failed asks over three timeouts",
        || async {
            (from.elapsed() >= 3 * TIMEOUT && activity_checks(&h, "AgentUnreachable") >= 3)
                .then_some(())
        },
    )
    .await;
    let ws = h.workspaces().get("cut").await.unwrap();
    assert_eq!(phase_of(&ws), Some(Phase::Running), "{}", message_of(&ws));
    assert!(!ws.spec.paused);
    assert!(
        message_of(&ws).starts_with(
            "Workspace is running; its agent cannot say whether it is in use (AgentUnreachable: "
        ),
        "{}",
        message_of(&ws)
    );
    let events = events_about(&h, &running.uid().unwrap()).await;
    assert!(
        events.iter().any(|(reason, _)| reason == "ActivityUnknown"),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|(reason, _)| reason == "Culled"),
        "{events:?}"
    );
    assert_eq!(culled(&h), 0);

    CUT.store(false, Ordering::SeqCst);
    h.until(
        "cut",
        "the workspace to be culled once its agent answers",
        idle_reason,
    )
    .await;
}
