//! The handshake with the in-pod agent end to end (rules C4, C14, C15): the agent runs
//! in-process in the sim's pods and authenticates the operator through the sim's real
//! TokenReview, SubjectAccessReview and RBAC.

use std::{sync::Arc, time::Duration};

use berth_api::{Phase, Workspace};
use berth_controller::config::AgentConfig;
use berth_sim::{BoxFuture, ContainerContext, ContainerRuntime, RunningContainer, SimConfig};
use k8s_openapi::api::{
    core::v1::{Pod, ServiceAccount},
    rbac::v1::ClusterRole,
};
use kube::{Api, ResourceExt, api::PostParams};
use serde_json::json;

use crate::support::{
    Harness, OPERATOR, WAIT, condition, events_about, eventually, message_of, phase_of, sim_config,
    test_config,
};

/// Asserts this test's logs say each of `expected` (every string of one entry on one line, so
/// the capture is known to work) and hold none of the sim's tokens.
fn assert_logs_without_tokens(h: &Harness, expected: &[&[&str]]) {
    let text = h.logs.text();
    for wanted in expected {
        assert!(
            text.lines().any(|l| wanted.iter().all(|w| l.contains(w))),
            "no log line has all of {wanted:?}"
        );
    }
    let tokens = h.sim.issued_tokens();
    assert!(
        tokens.len() >= 3,
        "the operator's, a pod's, the agent call's"
    );
    for token in tokens {
        assert!(
            !text.contains(&token),
            "a token appears in the logs: {}",
            text.lines()
                .find(|l| l.contains(&token))
                .unwrap_or_default()
        );
    }
}

/// A workspace whose command the agent wraps.
fn wrapped() -> serde_json::Value {
    json!({"image": "devbox:1", "command": ["sleep", "infinity"]})
}

fn pods(h: &Harness) -> Api<Pod> {
    Api::namespaced(h.client.clone(), "default")
}

async fn pod_uid(h: &Harness, workspace: &str) -> String {
    pods(h)
        .get(&format!("{workspace}-ws"))
        .await
        .unwrap()
        .uid()
        .unwrap()
}

async fn service_account(h: &Harness, name: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(h.client.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
}

fn agent_checks(h: &Harness, result: &str) -> u64 {
    h.metric(&format!("berth_agent_checks_total{{result=\"{result}\"}}"))
}

/// Holds while the agent check fails `retries` more times with `reason` (however long that
/// takes on this machine): the pod keeps its UID, none of its containers restarts, and nothing
/// kills it (rule C15).
async fn assert_no_churn(h: &Harness, workspace: &str, uid: &str, reason: &str, retries: u64) {
    let target = agent_checks(h, reason) + retries;
    let deadline = tokio::time::Instant::now() + WAIT;
    while agent_checks(h, reason) < target {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent check was not retried {retries} times within {WAIT:?}"
        );
        let pod = pods(h).get(&format!("{workspace}-ws")).await.unwrap();
        assert_eq!(pod.uid().as_deref(), Some(uid), "the pod was replaced");
        assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "the pod is being deleted"
        );
        let restarts: i32 = pod
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 0, "a container was restarted");
        let ws = h.workspaces().get(workspace).await.unwrap();
        assert_eq!(phase_of(&ws), Some(Phase::Error), "{}", message_of(&ws));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = events_about(h, uid).await;
    assert!(
        !events.iter().any(|(reason, _)| reason == "Killing"),
        "{events:?}"
    );
}

/// A user would see: `kubectl get ws` says Running; `AgentReady=True (AgentVerified)`;
/// `status.agent` names the pod's address, the operator's identity and the verified pod UID.
/// The token is requested once and the agent is called once per pod.
#[tokio::test]
async fn the_operator_authenticates_to_the_agent_before_the_workspace_is_ready() {
    let mut h = Harness::start().await;
    h.create(
        "alice",
        json!({"image": "devbox:1", "command": ["/bin/sh", "-c", "sleep infinity"]}),
    )
    .await;
    let ws = h.until_phase("alice", Phase::Running).await;
    let pod = pods(&h).get("alice-ws").await.unwrap();
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    assert_eq!(
        spec["containers"][0]["command"],
        json!([
            "/opt/berth/berth",
            "agent",
            "--",
            "/bin/sh",
            "-c",
            "sleep infinity"
        ])
    );
    assert_eq!(spec["initContainers"][0]["name"], "berth-install");
    let agent_ready = condition(&ws, "AgentReady").unwrap();
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("True", "AgentVerified")
    );
    let agent = ws.status.as_ref().unwrap().agent.clone().unwrap();
    assert_eq!(agent.identity.as_deref(), Some(OPERATOR));
    assert_eq!(agent.verified_pod_uid, pod.uid());
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    assert_eq!(agent.address, Some(format!("{ip}:50051")));
    assert_eq!(agent_checks(&h, "ok"), 1);

    // A second workspace (without a command: the agent is a sidecar) reuses the token.
    h.create("bob", json!({"image": "devbox:1"})).await;
    let bob = h.until_phase("bob", Phase::Running).await;
    assert_eq!(
        bob.status.unwrap().agent.unwrap().identity.as_deref(),
        Some(OPERATOR)
    );
    assert_eq!(
        h.sim.count_requests(|k| k.user == OPERATOR
            && k.verb == "create"
            && k.resource == "serviceaccounts"
            && k.subresource == "token"),
        1,
        "the token is cached"
    );
    assert_eq!(agent_checks(&h, "ok"), 2);

    // Once per pod UID: a restarted operator does not call the verified agents again.
    h.stop_operator().await;
    h.sim.reset_requests();
    let before = h.reconciles();
    h.start_operator();
    h.until_reconciled(before, 2).await;
    assert_eq!(agent_checks(&h, "ok"), 2);
    assert_eq!(
        phase_of(&h.workspaces().get("alice").await.unwrap()),
        Some(Phase::Running)
    );
    assert_logs_without_tokens(
        &h,
        &[
            &["the agent authenticated the operator", "workspace=alice"],
            &["requested a token for agents"],
        ],
    );
}

/// A user would see: `Error`, `Ready=False` with reason `Unauthenticated` and the agent's words
/// naming `system:auth-delegator`; a Warning `AgentAuthFailed`; the pod untouched. After the
/// binding, the same pod becomes Running.
#[tokio::test]
async fn a_workspace_account_without_auth_delegator_is_explained_and_never_churned() {
    let h = Harness::start().await;
    service_account(&h, "no-delegator").await;
    let created = h
        .create(
            "carol",
            json!({"image": "devbox:1", "command": ["sleep", "infinity"], "serviceAccountName": "no-delegator"}),
        )
        .await;
    let ws = h.until_not_ready("carol", "Unauthenticated").await;
    let ready = condition(&ws, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("TokenReview API is unavailable")
            && ready.message.contains("system:auth-delegator")
            && ready
                .message
                .contains("system:serviceaccount:default:no-delegator"),
        "{}",
        ready.message
    );
    assert_eq!(
        condition(&ws, "AgentReady").unwrap().reason,
        "Unauthenticated"
    );
    assert_eq!(phase_of(&ws), Some(Phase::Error));
    assert!(
        message_of(&ws).contains("The pod is kept"),
        "{}",
        message_of(&ws)
    );
    let uid = pod_uid(&h, "carol").await;

    assert_no_churn(&h, "carol", &uid, "Unauthenticated", 3).await;
    let events = events_about(&h, &created.uid().unwrap()).await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "AgentAuthFailed"
                && note.contains("system:auth-delegator")),
        "{events:?}"
    );

    h.grant_auth_delegator("default", "no-delegator").await;
    let ws = h.until_phase("carol", Phase::Running).await;
    assert_eq!(pod_uid(&h, "carol").await, uid, "the same pod");
    assert_eq!(condition(&ws, "AgentReady").unwrap().status, "True");
    assert_logs_without_tokens(
        &h,
        &[
            &["the API server refused a review", "no-delegator"],
            &[
                "the agent check failed",
                "workspace=carol",
                "Unauthenticated",
            ],
        ],
    );
}

/// A user would see: `Error`, reason `PermissionDenied` and the agent's words; the pod kept.
/// Granting `use` on `workspaces/agent` back makes the same pod Running.
#[tokio::test]
async fn an_operator_without_use_on_the_agent_is_permission_denied_and_never_churns() {
    let h = Harness::start().await;
    let roles: Api<ClusterRole> = Api::all(h.client.clone());
    let full = roles.get("berth-controller").await.unwrap();
    let mut without_use = full.clone();
    without_use
        .rules
        .as_mut()
        .unwrap()
        .retain(|r| !r.verbs.contains(&"use".to_owned()));
    assert_ne!(without_use.rules, full.rules);
    roles
        .replace("berth-controller", &PostParams::default(), &without_use)
        .await
        .unwrap();

    h.create("dave", wrapped()).await;
    let ws = h.until_not_ready("dave", "PermissionDenied").await;
    let ready = condition(&ws, "Ready").unwrap();
    assert!(
        ready.message.contains(&format!(
            "User \"{OPERATOR}\" cannot use workspaces/agent \"dave\" in API group \"berth.dev\" in the namespace \"default\""
        )),
        "{}",
        ready.message
    );
    let uid = pod_uid(&h, "dave").await;
    assert_no_churn(&h, "dave", &uid, "PermissionDenied", 3).await;

    let mut restored = roles.get("berth-controller").await.unwrap();
    restored.rules = full.rules;
    roles
        .replace("berth-controller", &PostParams::default(), &restored)
        .await
        .unwrap();
    h.until_phase("dave", Phase::Running).await;
    assert_eq!(pod_uid(&h, "dave").await, uid, "the same pod");
}

/// A user would see nothing: after the account the operator calls agents as is deleted and
/// created again (its cached token now invalid), the next workspace still becomes Running: the
/// agent says the token itself was rejected, the operator requests a new one and asks again.
#[tokio::test]
async fn a_rejected_token_is_renewed_at_once() {
    // A second account for agent calls, so deleting it leaves the operator's API access alone.
    let caller = "system:serviceaccount:berth-system:agent-caller";
    let mut config = test_config();
    config.agent.service_account = "berth-system/agent-caller".parse().unwrap();
    let h = Harness::start_with(sim_config(), config).await;
    let rbac = "
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent-caller, namespace: berth-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: agent-caller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: berth-controller}
subjects: [{kind: ServiceAccount, name: agent-caller, namespace: berth-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: agent-caller-tokens, namespace: berth-system}
rules: [{apiGroups: [''], resources: [serviceaccounts/token], resourceNames: [agent-caller], verbs: [create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: agent-caller-tokens, namespace: berth-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent-caller-tokens}
subjects: [{kind: ServiceAccount, name: berth-controller, namespace: berth-system}]
";
    berth_sim::manifests::create_all(&h.client, rbac, "default")
        .await
        .unwrap();
    h.create("ivan", json!({"image": "devbox:1"})).await;
    let ivan = h.until_phase("ivan", Phase::Running).await;
    assert_eq!(
        ivan.status.unwrap().agent.unwrap().identity.as_deref(),
        Some(caller)
    );

    let accounts: Api<ServiceAccount> = Api::namespaced(h.client.clone(), "berth-system");
    accounts
        .delete("agent-caller", &Default::default())
        .await
        .unwrap();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "agent-caller"}})).unwrap(),
        )
        .await
        .unwrap();
    h.create("judy", json!({"image": "devbox:1"})).await;
    let judy = h.until_phase("judy", Phase::Running).await;
    assert_eq!(
        judy.status.unwrap().agent.unwrap().identity.as_deref(),
        Some(caller)
    );
    let token_requests = h.sim.count_requests(|k| {
        k.user == OPERATOR
            && k.verb == "create"
            && k.resource == "serviceaccounts"
            && k.subresource == "token"
    });
    assert_eq!(token_requests, 2, "one renewal");
    assert_eq!(
        agent_checks(&h, "Unauthenticated"),
        0,
        "the retry is part of the same check"
    );
    assert_eq!(agent_checks(&h, "ok"), 2);
}

/// A user would see: `Error`, reason `Unknown`, a message naming TokenRequest and the operator's
/// service account; the agent is never called without a token. Granting it back heals.
#[tokio::test]
async fn an_operator_that_cannot_get_its_token_says_so() {
    use k8s_openapi::api::rbac::v1::Role;
    let h = Harness::start().await;
    let roles: Api<Role> = Api::namespaced(h.client.clone(), "berth-system");
    let full = roles.get("berth-controller").await.unwrap();
    let mut without_tokens = full.clone();
    without_tokens.rules.as_mut().unwrap().retain(|r| {
        !r.resources
            .iter()
            .flatten()
            .any(|r| r == "serviceaccounts/token")
    });
    roles
        .replace("berth-controller", &PostParams::default(), &without_tokens)
        .await
        .unwrap();
    h.create("frank", json!({"image": "devbox:1"})).await;
    let ws = h.until_not_ready("frank", "Unknown").await;
    assert_eq!(phase_of(&ws), Some(Phase::Error));
    let message = message_of(&ws);
    assert!(
        message.contains("could not be checked (Unknown); it was called at ")
            && message.contains(": cannot get a token for the operator's service account berth-system/berth-controller (TokenRequest)"),
        "{message}"
    );
    let mut restored = roles.get("berth-controller").await.unwrap();
    restored.rules = full.rules;
    roles
        .replace("berth-controller", &PostParams::default(), &restored)
        .await
        .unwrap();
    h.until_phase("frank", Phase::Running).await;
}

/// With TLS on, the agent serves the certificate of the namespace's secret and the operator
/// verifies it against its CA: the workspace runs, and the agent no longer speaks plaintext.
#[tokio::test]
async fn over_tls_the_operator_verifies_the_agent_it_calls() {
    use k8s_openapi::api::core::v1::Secret;
    let authority = berth_sim::Authority::generate().unwrap();
    let (_, _, cert_pem, key_pem) = authority.issue(&[berth_agent::TLS_SERVER_NAME]).unwrap();
    let mut config = test_config();
    config.agent.tls = Some(berth_controller::config::AgentTls {
        secret: "berth-agent-tls".into(),
        ca_pem: authority.ca_pem().as_bytes().to_vec(),
    });
    let h = Harness::start_with(sim_config(), config).await;
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "berth-agent-tls"},
                "type": "kubernetes.io/tls",
                "stringData": {"tls.crt": cert_pem, "tls.key": key_pem}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    h.create("grace", wrapped()).await;
    h.create("heidi", json!({"image": "devbox:1"})).await;
    for name in ["grace", "heidi"] {
        let ws = h.until_phase(name, Phase::Running).await;
        let agent = ws.status.unwrap().agent.unwrap();
        assert_eq!(agent.identity.as_deref(), Some(OPERATOR));
        // The agent speaks only TLS now.
        let token = h
            .sim
            .issue_token(
                "berth-system",
                "berth-controller",
                &["berth-agent"],
                Duration::from_secs(600),
            )
            .unwrap();
        let plaintext = berth_agent::client::who_am_i(
            agent.address.as_deref().unwrap(),
            &token,
            Duration::from_secs(5),
            None,
        )
        .await;
        assert!(
            matches!(
                plaintext,
                Err(berth_agent::client::CallError::Unreachable { .. })
            ),
            "{plaintext:?}"
        );
    }
    assert_eq!(agent_checks(&h, "ok"), 2);
}

/// A harness whose pods run the [`Tampered`] agents.
async fn tampered(config: berth_controller::Config) -> Harness {
    Harness::start_with(
        SimConfig {
            runtime: Arc::new(Tampered),
            ..sim_config()
        },
        config,
    )
    .await
}

/// The agent runtime, with some workspaces' agents tampered with. For `unreachable`, `hang`
/// and `slow`, something else holds the agent's port (the probe connects; gRPC fails): a
/// listener that drops connections at once, never answers, or drops them after 400 ms. For
/// `impostor`, the agent believes it serves workspace `someone-else` (as a reused pod IP would
/// make it look). For `anonymous`, the agent runs with `--auth none`.
struct Tampered;

fn agent_of(context: &ContainerContext, workspace: &str) -> bool {
    !context.init
        && berth_agent::sim_runtime::runs_agent(&context.container)
        && context.container["env"].as_array().is_some_and(|env| {
            env.iter()
                .any(|e| e["name"] == "BERTH_WORKSPACE_NAME" && e["value"] == workspace)
        })
}

impl ContainerRuntime for Tampered {
    fn start(&self, mut context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        if agent_of(&context, "impostor") {
            for e in context.container["env"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if e["name"] == "BERTH_WORKSPACE_NAME" {
                    e["value"] = json!("someone-else");
                }
            }
        }
        if agent_of(&context, "anonymous")
            && let Some(command) = context.container["command"].as_array_mut()
        {
            // An agent that lets every caller in, as `--auth none` makes it.
            command.splice(2..2, [json!("--auth"), json!("none")]);
        }
        let hang = agent_of(&context, "hang");
        let slow = agent_of(&context, "slow");
        if !hang && !slow && !agent_of(&context, "unreachable") {
            return berth_agent::sim_runtime::AgentRuntime::default().start(context);
        }
        Box::pin(async move {
            let address = (context.pod_ip, berth_agent::DEFAULT_PORT);
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| e.to_string())?;
            let (exit_tx, exited) = tokio::sync::oneshot::channel();
            let (stop, stop_rx) = tokio::sync::oneshot::channel::<std::time::Duration>();
            tokio::spawn(async move {
                let accept = async {
                    let mut held = vec![];
                    while let Ok((connection, _)) = listener.accept().await {
                        if hang {
                            // Accept, then never answer.
                            held.push(connection);
                        } else if slow {
                            // Drop the connection after a while.
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(400)).await;
                                drop(connection);
                            });
                        }
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
                let _ = exit_tx.send(0);
            });
            Ok(RunningContainer { exited, stop })
        })
    }
}

/// A user would see: `Error`, reason `AgentUnreachable`, the pod kept. With a 200 ms base the
/// checks come 200 ms, 400 ms, 800 ms, 1.6 s, 3.2 s apart: the backoff's schedule, not a loop.
#[tokio::test]
async fn an_unreachable_agent_is_retried_on_the_backoff_schedule() {
    let base = Duration::from_millis(200);
    let mut config = test_config();
    config.agent = AgentConfig {
        backoff_base: base,
        backoff_max: Duration::from_secs(60),
        timeout: Duration::from_secs(2),
        ..AgentConfig::default()
    };
    let h = tampered(config).await;
    h.create("unreachable", wrapped()).await;
    let ws = h.until_not_ready("unreachable", "AgentUnreachable").await;
    assert_eq!(phase_of(&ws), Some(Phase::Error));
    assert!(
        message_of(&ws).contains("cannot be reached (AgentUnreachable)"),
        "{}",
        message_of(&ws)
    );
    let uid = pod_uid(&h, "unreachable").await;

    // When each attempt happened, as the attempt counter shows it (polled every 10 ms).
    let mut seen = vec![];
    let mut last = 0;
    let window = tokio::time::Instant::now() + Duration::from_secs(8);
    while tokio::time::Instant::now() < window {
        let count = agent_checks(&h, "AgentUnreachable");
        if count != last {
            seen.push((count, tokio::time::Instant::now()));
            last = count;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gaps: Vec<(u64, Duration)> = seen
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + 1)
        .map(|w| (w[0].0, w[1].1 - w[0].1))
        .collect();
    assert!(gaps.len() >= 2, "it keeps retrying: {seen:?}");
    for (failures, gap) in &gaps {
        let scheduled = base * (1 << (failures - 1));
        assert!(
            *gap + Duration::from_millis(100) >= scheduled,
            "attempt {} came {gap:?} after the one before; the backoff says {scheduled:?} (all: {gaps:?})",
            failures + 1
        );
    }
    // 200 ms doubling: after 8 s of the 12.4 s the first 7 attempts take, never more than 7.
    assert!(last <= 7, "{last} attempts: {seen:?}");
    assert_eq!(pod_uid(&h, "unreachable").await, uid, "the pod is kept");
    let events = events_about(&h, &uid).await;
    assert!(
        !events.iter().any(|(reason, _)| reason == "Killing"),
        "{events:?}"
    );
}

/// A user would see: a workspace whose agent never answers is `Starting` ("checking its
/// agent") and can be deleted at once: the call runs in the background, never in the way of
/// the workspace's reconciles (its timeout here is a minute).
#[tokio::test]
async fn a_silent_agent_never_blocks_the_workspace() {
    let mut config = test_config();
    config.agent.timeout = Duration::from_secs(60);
    let h = tampered(config).await;
    h.create("hang", wrapped()).await;
    let ws = h
        .until("hang", "the agent check to be under way", |ws| {
            message_of(ws) == "Pod hang-ws is ready; checking its agent"
        })
        .await;
    let agent_ready = condition(&ws, "AgentReady").unwrap();
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("Unknown", "Unknown")
    );
    h.workspaces()
        .delete("hang", &Default::default())
        .await
        .unwrap();
    eventually(crate::support::WAIT, "the workspace to be gone", || async {
        h.workspaces()
            .get_opt("hang")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// A user would see the failure stand while each retry runs: an agent that takes 400 ms to
/// fail keeps the workspace `Error` (AgentUnreachable) throughout, never back to `Starting`.
#[tokio::test]
async fn a_slow_failing_agent_keeps_its_failure_shown_while_retrying() {
    let h = tampered(test_config()).await;
    h.create("slow", wrapped()).await;
    h.until_not_ready("slow", "AgentUnreachable").await;
    let attempts = agent_checks(&h, "AgentUnreachable");
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        let ws = h.workspaces().get("slow").await.unwrap();
        assert_eq!(phase_of(&ws), Some(Phase::Error), "{}", message_of(&ws));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        agent_checks(&h, "AgentUnreachable") >= attempts + 2,
        "retries ran meanwhile"
    );
}

/// An agent that answers for another workspace does not make this one Ready.
#[tokio::test]
async fn an_agent_answering_for_another_workspace_is_not_trusted() {
    let h = tampered(test_config()).await;
    h.create("impostor", wrapped()).await;
    let ws = h.until_not_ready("impostor", "Unknown").await;
    assert_eq!(phase_of(&ws), Some(Phase::Error));
    let message = &condition(&ws, "AgentReady").unwrap().message;
    assert!(
        message.contains(
            "serves workspace default/someone-else (pod impostor-ws), not default/impostor"
        ),
        "{message}"
    );
    assert_eq!(
        ws.status.unwrap().agent.unwrap().verified_pod_uid,
        None,
        "never verified"
    );
}

/// A user would see: `Error`, `AgentReady=False` and `Ready=False` with reason
/// `IdentityMismatch`, a message naming both identities, a Warning `AgentAuthFailed`, and the
/// pod kept: an agent that lets everyone in answers `system:anonymous`, which is not the
/// operator.
#[tokio::test]
async fn an_agent_that_authenticated_someone_else_is_not_trusted() {
    let h = tampered(test_config()).await;
    let created = h.create("anonymous", wrapped()).await;
    let ws = h.until_not_ready("anonymous", "IdentityMismatch").await;
    assert_eq!(phase_of(&ws), Some(Phase::Error));
    let agent_ready = condition(&ws, "AgentReady").unwrap();
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("False", "IdentityMismatch")
    );
    assert!(
        agent_ready.message.contains(&format!(
            "authenticated the operator as \"system:anonymous\", not as its service account {OPERATOR}"
        )),
        "{}",
        agent_ready.message
    );
    assert_eq!(ws.status.unwrap().agent.unwrap().verified_pod_uid, None);
    let uid = pod_uid(&h, "anonymous").await;
    let workspace_uid = created.uid().unwrap();
    eventually(
        Duration::from_secs(5),
        "a Warning AgentAuthFailed",
        || async {
            events_about(&h, &workspace_uid)
                .await
                .iter()
                .any(|(reason, note)| {
                    reason == "AgentAuthFailed" && note.contains("IdentityMismatch")
                })
                .then_some(())
        },
    )
    .await;
    assert_no_churn(&h, "anonymous", &uid, "IdentityMismatch", 2).await;
}

/// A workspace whose pod is not ready is never called, and its AgentReady says why.
#[tokio::test]
async fn the_agent_is_not_called_before_the_pod_is_ready() {
    let h = Harness::start().await;
    h.create(
        "erin",
        json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "absent", "mountPath": "/s"}]}}}),
    )
    .await;
    let ws = h.until_phase("erin", Phase::Error).await;
    let agent_ready = condition(&ws, "AgentReady").unwrap();
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("Unknown", "WaitingForPod")
    );
    // Let the operator settle on the error, then count every call made, whatever its result.
    eventually(Duration::from_secs(5), "the event of the error", || async {
        let uid = h.workspaces().get("erin").await.ok()?.uid()?;
        events_about(&h, &uid)
            .await
            .iter()
            .any(|(r, _)| r == "Created")
            .then_some(())
    })
    .await;
    let calls = h
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("berth_agent_checks_total"))
        .count();
    assert_eq!(calls, 0, "{}", h.metrics.render());
}

/// A user would see: workspaces in `default` and `team-b` both Running, `AgentVerified`. The
/// operator asked for one token per namespace, each for that namespace's agents only
/// (audience `berth-agent/<namespace>`), so a token captured in one opens no agent in another.
#[tokio::test]
async fn each_namespace_gets_its_own_token() {
    let h = Harness::start().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(h.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "team-b"}})).unwrap(),
        )
        .await
        .unwrap();
    h.grant_auth_delegator("team-b", "default").await;
    h.create("alice", json!({"image": "devbox:1"})).await;
    let team_b: Api<Workspace> = Api::namespaced(h.client.clone(), "team-b");
    team_b
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
                "metadata": {"name": "bea"}, "spec": {"image": "devbox:1"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    h.until_phase("alice", Phase::Running).await;
    let bea = eventually(WAIT, "bea Running", || async {
        let ws = team_b.get("bea").await.ok()?;
        (phase_of(&ws) == Some(Phase::Running)).then_some(ws)
    })
    .await;
    assert_eq!(
        condition(&bea, "AgentReady").unwrap().reason,
        "AgentVerified"
    );
    assert_eq!(
        h.sim.count_requests(|k| k.user == OPERATOR
            && k.verb == "create"
            && k.resource == "serviceaccounts"
            && k.subresource == "token"),
        2,
        "one token per namespace"
    );
    let logs = h.logs.text();
    for audience in ["berth-agent/default", "berth-agent/team-b"] {
        assert!(
            logs.lines()
                .any(|l| l.contains("requested a token for agents")
                    && l.contains(&format!("audience={audience}"))),
            "no token for {audience}"
        );
    }
}

/// A user would see, while TokenReview answers 503: `Error`, `Ready=False` reason
/// `Unavailable` with the agent's words ("TokenReview API is unavailable: ..."), not a
/// timeout; the pod kept; Running once the API is back.
#[tokio::test]
async fn a_review_api_outage_is_reported_as_unavailable_in_the_agents_words() {
    let h = Harness::start().await;
    h.sim.faults().token_review_unavailable(true);
    h.create("outage", json!({"image": "devbox:1"})).await;
    let ws = h.until_not_ready("outage", "Unavailable").await;
    let ready = condition(&ws, "Ready").unwrap();
    assert!(
        ready.message.contains(
            "TokenReview API is unavailable: the server is currently unable to handle the request (post tokenreviews)"
        ),
        "{}",
        ready.message
    );
    assert_eq!(condition(&ws, "AgentReady").unwrap().reason, "Unavailable");
    let uid = pod_uid(&h, "outage").await;
    h.sim.faults().token_review_unavailable(false);
    h.until_phase("outage", Phase::Running).await;
    assert_eq!(pod_uid(&h, "outage").await, uid, "the same pod");
}

/// What a user waits for once the kubelet is done: their pod turned ready, so their workspace
/// says Running, even while the controller's queue is full of other workspaces whose writes
/// hang (here every write in namespace `busy` takes ten minutes, and all sixteen of the
/// controller's workers are stuck in them). The agent check starts from the pod watch, in
/// the order pods turn ready, and Running is written in the agent lane: neither waits behind
/// the controller's queue.
#[tokio::test]
async fn a_ready_pod_makes_its_workspace_running_while_other_workspaces_writes_hang() {
    use berth_sim::RequestMatch;
    use k8s_openapi::api::core::v1::Namespace;

    let h = Harness::start().await;
    // dave's pod waits for a node that fits.
    h.create_unschedulable("dave").await;
    // Twenty workspaces in `busy`, whose first write (the finalizer) hangs: the controller's
    // sixteen workers are all stuck in them.
    Api::<Namespace>::all(h.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "busy"}})).unwrap(),
        )
        .await
        .unwrap();
    h.sim.faults().latency(
        RequestMatch::new("patch", "workspaces").in_namespace("busy"),
        Duration::from_secs(600),
    );
    let busy: Api<Workspace> = Api::namespaced(h.client.clone(), "busy");
    for i in 0..20 {
        let ws: Workspace = serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": format!("busy-{i}")},
            "spec": {"image": "devbox:1"}
        }))
        .unwrap();
        busy.create(&PostParams::default(), &ws).await.unwrap();
    }
    eventually(WAIT, "every worker stuck in a write", || async {
        (h.sim.faults().held() >= 16).then_some(())
    })
    .await;
    let reconciles = h.reconciles();

    // A node that fits: dave's pod is scheduled and turns ready.
    h.add_big_node();
    let ws = h.until_phase("dave", Phase::Running).await;
    let agent_ready = condition(&ws, "AgentReady").unwrap();
    assert_eq!(
        (agent_ready.status.as_str(), agent_ready.reason.as_str()),
        ("True", "AgentVerified")
    );
    let held = h.sim.faults().held();
    assert!(
        held >= 16,
        "the controller's workers were stuck all along ({held} writes held)"
    );
    // The reconcile that wrote Running is counted once the write's answer is back, which
    // may come after the write's watch event.
    h.until_reconciled(reconciles, 1).await;
    assert_eq!(agent_checks(&h, "ok"), 1, "one check of dave's agent");
}
