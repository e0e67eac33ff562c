//! The agent's authentication and authorization against berth-sim's real TokenReview,
//! SubjectAccessReview and RBAC: each case with the exact gRPC code and message.

use std::{sync::Arc, time::Duration};

use berth_agent::{
    auth::{Authenticator, Limits, Mode, Scope},
    client::{CallError, ClientTls, get_activity, heartbeat, who_am_i},
    server::TlsIdentity,
};
use berth_sim::{SimCluster, SimConfig};
use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{Api, api::PostParams};
use serde_json::{Value, json};
use tonic::Code;

mod connections;
mod content;
mod shells;

/// The audience of the operator's tokens for agents in namespace `default`.
const AUDIENCE: &str = "berth-agent/default";

async fn create<K>(api: &Api<K>, body: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .unwrap();
}

struct Setup {
    sim: SimCluster,
    admin: kube::Client,
}

impl Setup {
    async fn new() -> Setup {
        let sim = SimCluster::start(SimConfig::api_only()).await.unwrap();
        let admin = sim.client().await.unwrap();
        for account in ["ws", "lonely", "half", "caller", "stranger", "gateway"] {
            create(
                &Api::<ServiceAccount>::namespaced(admin.clone(), "default"),
                json!({"metadata": {"name": account}}),
            )
            .await;
        }
        let delegate = |name: &str, account: &str| {
            json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}]})
        };
        create(
            &Api::<ClusterRoleBinding>::all(admin.clone()),
            delegate("ws-delegator", "ws"),
        )
        .await;
        // `half` may review tokens but not access.
        create(&Api::<ClusterRole>::all(admin.clone()), json!({"metadata": {"name": "token-reviewer"},
            "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]})).await;
        create(&Api::<ClusterRoleBinding>::all(admin.clone()), json!({"metadata": {"name": "half"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "token-reviewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "half", "namespace": "default"}]})).await;
        create(&Api::<Role>::namespaced(admin.clone(), "default"), json!({"metadata": {"name": "agent-user"},
            "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces/agent"], "resourceNames": ["w"], "verbs": ["use"]}]})).await;
        create(&Api::<RoleBinding>::namespaced(admin.clone(), "default"), json!({"metadata": {"name": "caller-uses-agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent-user"},
            "subjects": [{"kind": "ServiceAccount", "name": "caller", "namespace": "default"}]})).await;
        // `gateway` may open shells (and nothing else: not `use`).
        create(&Api::<Role>::namespaced(admin.clone(), "default"), json!({"metadata": {"name": "agent-shell"},
            "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces/agent"], "resourceNames": ["w"], "verbs": ["shell"]}]})).await;
        create(&Api::<RoleBinding>::namespaced(admin.clone(), "default"), json!({"metadata": {"name": "gateway-opens-shells"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent-shell"},
            "subjects": [{"kind": "ServiceAccount", "name": "gateway", "namespace": "default"}]})).await;
        Setup { sim, admin }
    }

    /// Starts an agent running as `account`; returns its address.
    async fn agent(&self, account: &str) -> String {
        self.agent_with_tls(account, None).await
    }

    /// [`Setup::agent`], serving TLS with `tls`.
    async fn agent_with_tls(&self, account: &str, tls: Option<TlsIdentity>) -> String {
        self.start_agent(account, tls, Limits::default()).await.0
    }

    /// An agent for workspace `default/w` running as `account`: its address and authenticator.
    async fn start_agent(
        &self,
        account: &str,
        tls: Option<TlsIdentity>,
        limits: Limits,
    ) -> (String, Arc<Authenticator>) {
        let shells = berth_agent::shell::Shells::Available(berth_agent::shell::local());
        self.start_agent_with(account, tls, limits, shells).await
    }

    /// [`Setup::start_agent`], opening shells as `shells` says.
    async fn start_agent_with(
        &self,
        account: &str,
        tls: Option<TlsIdentity>,
        limits: Limits,
        shells: berth_agent::shell::Shells,
    ) -> (String, Arc<Authenticator>) {
        let token = self
            .sim
            .issue_token("default", account, &[], Duration::from_secs(3600))
            .unwrap();
        let config = self.sim.config_with_token(&token).await.unwrap();
        let scope = Scope {
            namespace: "default".into(),
            workspace: "w".into(),
            pod: "w-ws".into(),
            service_account: format!("system:serviceaccount:default:{account}"),
        };
        let auth = Arc::new(Authenticator::with_limits(
            Mode::kube(config).unwrap(),
            scope,
            limits,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let activity = Arc::new(berth_agent::activity::Activity::new(Default::default()));
        tokio::spawn(berth_agent::server::serve(
            listener,
            auth.clone(),
            tls,
            activity,
            berth_agent::content::Content::new(None),
            berth_agent::server::Inside { shells, home: None },
            std::future::pending(),
        ));
        (address, auth)
    }

    fn token(&self, account: &str, audience: &str, ttl: Duration) -> String {
        self.sim
            .issue_token("default", account, &[audience], ttl)
            .unwrap()
    }
}

/// Whether the refusal says the token itself was rejected (so the caller renews it).
async fn token_marked_rejected(address: &str, token: &str) -> bool {
    match who_am_i(address, token, Duration::from_secs(5), None).await {
        Err(CallError::Refused(status)) => berth_agent::client::token_rejected(&status),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn refused(address: &str, token: &str) -> (Code, String) {
    match who_am_i(address, token, Duration::from_secs(5), None).await {
        Err(CallError::Refused(status)) => (status.code(), status.message().to_owned()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn every_auth_outcome_has_its_code_and_message() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    let hour = Duration::from_secs(3600);

    assert_eq!(
        refused(&agent, "").await,
        (Code::Unauthenticated, "request has no bearer token".into())
    );

    assert_eq!(
        refused(&agent, "not-a-token").await,
        (
            Code::Unauthenticated,
            "the token is not valid for audience berth-agent/default: it is not a service-account token (a JWT)".into()
        )
    );

    assert_eq!(
        refused(&agent, &s.token("caller", AUDIENCE, Duration::ZERO)).await,
        (
            Code::Unauthenticated,
            "the token is not valid for audience berth-agent/default: it has expired".into()
        )
    );

    assert_eq!(
        refused(&agent, &s.token("caller", "somebody-else", hour)).await,
        (
            Code::Unauthenticated,
            "the token is not valid for audience berth-agent/default: it is for [\"somebody-else\"]"
                .into()
        )
    );

    let (code, message) = refused(&agent, &s.token("stranger", AUDIENCE, hour)).await;
    assert_eq!(code, Code::PermissionDenied);
    assert_eq!(
        message,
        "User \"system:serviceaccount:default:stranger\" cannot use workspaces/agent \"w\" in API group \"berth.dev\" in the namespace \"default\""
    );

    let allowed = who_am_i(
        &agent,
        &s.token("caller", AUDIENCE, hour),
        Duration::from_secs(5),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        allowed.caller_username,
        "system:serviceaccount:default:caller"
    );
    assert!(
        allowed
            .caller_groups
            .contains(&"system:serviceaccounts:default".to_owned())
    );
    assert_eq!(
        (
            allowed.workspace_namespace.as_str(),
            allowed.workspace_name.as_str(),
            allowed.pod_name.as_str()
        ),
        ("default", "w", "w-ws")
    );
    assert_eq!(allowed.agent_version, env!("CARGO_PKG_VERSION"));

    // Only a token the TokenReview rejected is marked so; a new token cannot help the rest.
    for token in [
        "not-a-token".to_owned(),
        s.token("caller", AUDIENCE, Duration::ZERO),
        s.token("caller", "somebody-else", hour),
    ] {
        assert!(token_marked_rejected(&agent, &token).await);
    }
    assert!(!token_marked_rejected(&agent, "").await);
    assert!(!token_marked_rejected(&agent, &s.token("stranger", AUDIENCE, hour)).await);
    let lonely = s.agent("lonely").await;
    assert!(!token_marked_rejected(&lonely, &s.token("caller", AUDIENCE, hour)).await);
}

#[tokio::test]
async fn review_apis_the_agent_may_not_use_say_what_to_bind() {
    let s = Setup::new().await;
    let hour = Duration::from_secs(3600);
    let lonely = s.agent("lonely").await;
    let (code, message) = refused(&lonely, &s.token("caller", AUDIENCE, hour)).await;
    assert_eq!(code, Code::Unauthenticated);
    assert!(message.starts_with("TokenReview API is unavailable: grant system:auth-delegator to system:serviceaccount:default:lonely"), "{message}");
    assert!(message.contains("kubectl create clusterrolebinding berth-agent-default-lonely --clusterrole=system:auth-delegator --serviceaccount=default:lonely"), "{message}");

    let half = s.agent("half").await;
    let (code, message) = refused(&half, &s.token("caller", AUDIENCE, hour)).await;
    assert_eq!(code, Code::Unauthenticated);
    assert!(message.starts_with("SubjectAccessReview API is unavailable: grant system:auth-delegator to system:serviceaccount:default:half"), "{message}");
}

/// A refused caller is remembered, so a stranger cannot make the agent ask the API server on
/// every call; and forgotten after `DENY_TTL` (5 s), so granting access takes effect quickly.
/// Two agents deny the same token before access is granted: one remembers denials for an hour
/// (the denial stands, without another review), the other for the default five seconds (the
/// grant shows once they pass).
#[tokio::test]
async fn a_denial_is_forgotten_quickly_so_a_fix_takes_effect() {
    let s = Setup::new().await;
    let remembering = Limits {
        deny_ttl: Duration::from_secs(3600),
        ..Limits::default()
    };
    let (patient, patient_auth) = s.start_agent("ws", None, remembering).await;
    let (agent, _) = s.start_agent("ws", None, Limits::default()).await;
    let token = s.token("stranger", AUDIENCE, Duration::from_secs(3600));
    assert_eq!(refused(&patient, &token).await.0, Code::PermissionDenied);
    assert_eq!(refused(&agent, &token).await.0, Code::PermissionDenied);
    let denied_at = std::time::Instant::now();
    let reviews = patient_auth.stats().token_reviews;
    create(
        &Api::<RoleBinding>::namespaced(s.admin.clone(), "default"),
        json!({"metadata": {"name": "stranger-uses-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent-user"},
        "subjects": [{"kind": "ServiceAccount", "name": "stranger", "namespace": "default"}]}),
    )
    .await;
    // Within the deny cache's lifetime the answer stands, without asking the API again...
    assert_eq!(refused(&patient, &token).await.0, Code::PermissionDenied);
    assert_eq!(
        patient_auth.stats().token_reviews,
        reviews,
        "the denial was cached"
    );
    // ...after it, the fix shows.
    tokio::time::sleep(
        (berth_agent::auth::DENY_TTL + Duration::from_millis(200))
            .saturating_sub(denied_at.elapsed()),
    )
    .await;
    let allowed = who_am_i(&agent, &token, Duration::from_secs(5), None)
        .await
        .unwrap();
    assert_eq!(
        allowed.caller_username,
        "system:serviceaccount:default:stranger"
    );
}

#[tokio::test]
async fn the_health_service_needs_no_token_and_an_absent_agent_is_unreachable() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{agent}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );

    let closed = format!("127.0.0.1:{}", berth_sim::free_port());
    match who_am_i(&closed, "t", Duration::from_secs(2), None).await {
        Err(CallError::Unreachable { address, .. }) => assert_eq!(address, closed),
        other => panic!("expected unreachable, got {other:?}"),
    }
}

/// Over TLS the operator trusts an agent whose certificate chains to its CA and names
/// `berth-agent`; anything else is unreachable, never an answer.
#[tokio::test]
async fn over_tls_an_agent_is_trusted_by_its_ca_and_name() {
    let s = Setup::new().await;
    let authority = berth_sim::Authority::generate().unwrap();
    let identity = |names: &[&str]| {
        let (_, _, cert_pem, key_pem) = authority.issue(names).unwrap();
        TlsIdentity {
            cert_pem: cert_pem.into_bytes(),
            key_pem: key_pem.into_bytes(),
        }
    };
    let agent = s
        .agent_with_tls("ws", Some(identity(&[berth_agent::TLS_SERVER_NAME])))
        .await;
    let token = s.token("caller", AUDIENCE, Duration::from_secs(3600));
    let tls = ClientTls {
        ca_pem: authority.ca_pem().as_bytes().to_vec(),
    };
    let answer = who_am_i(&agent, &token, Duration::from_secs(5), Some(&tls))
        .await
        .unwrap();
    assert_eq!(
        answer.caller_username,
        "system:serviceaccount:default:caller"
    );

    let unreachable = |result: Result<_, CallError>| match result {
        Err(CallError::Unreachable { message, .. }) => message,
        other => panic!("expected unreachable, got {other:?}"),
    };
    // Plaintext to a TLS agent.
    unreachable(who_am_i(&agent, &token, Duration::from_secs(5), None).await);
    // A CA that did not sign it.
    let other = ClientTls {
        ca_pem: berth_sim::Authority::generate()
            .unwrap()
            .ca_pem()
            .as_bytes()
            .to_vec(),
    };
    let message = unreachable(who_am_i(&agent, &token, Duration::from_secs(5), Some(&other)).await);
    assert!(message.contains("certificate"), "{message}");
    // A certificate for another name.
    let misnamed = s
        .agent_with_tls("ws", Some(identity(&["somebody-else"])))
        .await;
    let message =
        unreachable(who_am_i(&misnamed, &token, Duration::from_secs(5), Some(&tls)).await);
    assert!(message.contains("certificate"), "{message}");
}

#[tokio::test]
async fn a_pod_running_the_agent_in_the_sim_answers_at_its_ip() {
    let config = SimConfig {
        runtime: Arc::new(berth_agent::sim_runtime::AgentRuntime::default()),
        ..SimConfig::fast()
    };
    let sim = SimCluster::start(config).await.unwrap();
    let admin = sim.client().await.unwrap();
    let setup = Setup {
        sim,
        admin: admin.clone(),
    };
    for account in ["ws", "caller"] {
        create(
            &Api::<ServiceAccount>::namespaced(admin.clone(), "default"),
            json!({"metadata": {"name": account}}),
        )
        .await;
    }
    create(&Api::<ClusterRoleBinding>::all(admin.clone()), json!({"metadata": {"name": "ws-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": "ws", "namespace": "default"}]})).await;
    create(&Api::<Role>::namespaced(admin.clone(), "default"), json!({"metadata": {"name": "agent-user"},
        "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces/agent"], "resourceNames": ["w"], "verbs": ["use"]}]})).await;
    create(
        &Api::<RoleBinding>::namespaced(admin.clone(), "default"),
        json!({"metadata": {"name": "caller-uses-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent-user"},
        "subjects": [{"kind": "ServiceAccount", "name": "caller", "namespace": "default"}]}),
    )
    .await;

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), "default");
    create(&pods, json!({"metadata": {"name": "w-ws"}, "spec": {"serviceAccountName": "ws", "containers": [{
        "name": "workspace", "image": "devbox:1", "command": ["/opt/berth/berth", "agent", "--", "sleep", "infinity"],
        "env": [{"name": "BERTH_WORKSPACE_NAMESPACE", "value": "default"}, {"name": "BERTH_WORKSPACE_NAME", "value": "w"}],
        "readinessProbe": {"grpc": {"port": 50051}}
    }]}})).await;
    let ip = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let pod = pods.get("w-ws").await.unwrap();
            let status = pod.status.unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                break status.pod_ip.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the agent pod becomes ready through its gRPC probe");
    let address = format!("{ip}:{}", berth_agent::DEFAULT_PORT);
    let token = setup.token("caller", AUDIENCE, Duration::from_secs(3600));
    let answer = who_am_i(&address, &token, Duration::from_secs(5), None)
        .await
        .unwrap();
    assert_eq!(
        answer.caller_username,
        "system:serviceaccount:default:caller"
    );
    assert_eq!(
        (answer.workspace_name.as_str(), answer.pod_name.as_str()),
        ("w", "w-ws")
    );
}

/// A token the operator got for namespace `team-b`'s agents, captured there, opens no agent in
/// `default` (and is refused without asking the API server); the same operator's token for
/// `default` does.
#[tokio::test]
async fn a_token_for_another_namespaces_agents_is_refused() {
    let s = Setup::new().await;
    let (agent, auth) = s.start_agent("ws", None, Limits::default()).await;
    let hour = Duration::from_secs(3600);
    let captured = s.token("caller", "berth-agent/team-b", hour);
    assert_eq!(
        refused(&agent, &captured).await,
        (
            Code::Unauthenticated,
            "the token is not valid for audience berth-agent/default: it is for [\"berth-agent/team-b\"]".into()
        )
    );
    assert_eq!(auth.stats().token_reviews, 0, "screened without a review");
    // A forged token claiming both audiences passes the screen and is refused by TokenReview.
    let forged = {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let mut claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(captured.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        claims["aud"] = json!(["berth-agent/team-b", AUDIENCE]);
        let parts: Vec<&str> = captured.split('.').collect();
        format!(
            "{}.{}.{}",
            parts[0],
            b64(claims.to_string().as_bytes()),
            parts[2]
        )
    };
    let (code, message) = refused(&agent, &forged).await;
    assert_eq!(code, Code::Unauthenticated);
    assert!(
        message.starts_with("the token is not valid for audience berth-agent/default: "),
        "{message}"
    );
    assert_eq!(auth.stats().token_reviews, 1);
    let answer = who_am_i(
        &agent,
        &s.token("caller", AUDIENCE, hour),
        Duration::from_secs(5),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        answer.caller_username,
        "system:serviceaccount:default:caller"
    );
}

/// 20 000 distinct garbage tokens: half are not JWTs and cost no review; half are JWTs with
/// the right claims that the API server has never issued. The cache never holds more than its
/// cap, reviews never run more than the limit at once, and the real caller still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_garbage_tokens_keep_memory_and_reviews_bounded() {
    use base64::Engine;
    use futures::StreamExt;

    const CACHED: usize = 256;
    const AT_ONCE: usize = 4;
    let s = Setup::new().await;
    let limits = Limits {
        cached: std::num::NonZeroUsize::new(CACHED).unwrap(),
        concurrent_reviews: AT_ONCE,
        // Generous: on a slow machine a flood must wait, not be turned away.
        budget: Duration::from_secs(60),
        ..Limits::default()
    };
    let (agent, auth) = s.start_agent("ws", None, limits).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{agent}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let exp = jiff::Timestamp::now().as_second() + 3600;
    let garbage = |i: usize| {
        if i.is_multiple_of(2) {
            format!("garbage-{i}")
        } else {
            let claims = json!({"aud": [AUDIENCE], "exp": exp, "sub": format!("forged-{i}")});
            format!(
                "{}.{}.{}",
                b64(br#"{"alg":"RS256"}"#),
                b64(claims.to_string().as_bytes()),
                b64(format!("signature-{i}").as_bytes())
            )
        }
    };
    let codes: Vec<Code> = futures::stream::iter(0..20_000)
        .map(|i| {
            let mut client = berth_agent::proto::agent_client::AgentClient::new(channel.clone());
            let token = garbage(i);
            async move {
                let mut request = tonic::Request::new(berth_agent::proto::WhoAmIRequest {});
                request
                    .metadata_mut()
                    .insert("authorization", format!("Bearer {token}").parse().unwrap());
                client.who_am_i(request).await.unwrap_err().code()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert!(
        codes.iter().all(|c| *c == Code::Unauthenticated),
        "every one refused"
    );
    let stats = auth.stats();
    assert_eq!(
        stats.token_reviews, 10_000,
        "only the JWT-shaped ones were reviewed"
    );
    assert!(stats.cached <= CACHED, "{stats:?}");
    assert!(stats.peak_concurrent_reviews <= AT_ONCE, "{stats:?}");
    let answer = who_am_i(
        &agent,
        &s.token("caller", AUDIENCE, Duration::from_secs(3600)),
        Duration::from_secs(5),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        answer.caller_username,
        "system:serviceaccount:default:caller"
    );
}

/// TokenReview (then SubjectAccessReview) answering 503: the agent retries within the
/// caller's deadline and answers `Unavailable` in its own words before it, never a timeout;
/// once the API is back the next call gets in (an outage is not cached).
#[tokio::test]
async fn a_review_api_outage_is_answered_as_unavailable_within_the_deadline() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    let deadline = Duration::from_secs(5);
    for (api, down) in [
        ("TokenReview", (true, false)),
        ("SubjectAccessReview", (false, true)),
    ] {
        // A new token each time: an allowed one is remembered.
        let token = s.token("caller", AUDIENCE, Duration::from_secs(3600));
        s.sim.faults().token_review_unavailable(down.0);
        s.sim.faults().subject_access_review_unavailable(down.1);
        match who_am_i(&agent, &token, deadline, None).await {
            Err(CallError::Refused(status)) => {
                assert_eq!(status.code(), Code::Unavailable);
                let message = status.message();
                assert!(
                    message.starts_with(&format!(
                        "{api} API is unavailable: the server is currently unable to handle the request"
                    )) && message.contains("attempts in")
                        && message.ends_with("the agent cannot check callers until it answers"),
                    "{message}"
                );
            }
            other => panic!("{api}: expected the agent's Unavailable, got {other:?}"),
        }
        s.sim.faults().token_review_unavailable(false);
        s.sim.faults().subject_access_review_unavailable(false);
        let answer = who_am_i(&agent, &token, deadline, None).await.unwrap();
        assert_eq!(
            answer.caller_username,
            "system:serviceaccount:default:caller"
        );
    }
}

/// An API server that answers TokenReviews slowly (as under a burst of starts) is waited for
/// within three quarters of the caller's deadline: the operator's WhoAmI (5 s) gets in when
/// the review takes 2.5 s, where it used to be told `Unavailable` after 2 s and retried 5 s
/// later. A caller in a hurry is still answered within its own deadline.
#[tokio::test]
async fn a_slow_token_review_is_waited_for_within_the_callers_deadline() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    s.sim.faults().latency(
        berth_sim::RequestMatch::new("create", "tokenreviews"),
        Duration::from_millis(2500),
    );
    let token = s.token("caller", AUDIENCE, Duration::from_secs(3600));
    let answer = who_am_i(&agent, &token, Duration::from_secs(5), None)
        .await
        .unwrap();
    assert_eq!(
        answer.caller_username,
        "system:serviceaccount:default:caller"
    );
    let hurried = s.token("caller", AUDIENCE, Duration::from_secs(3599));
    // The agent's own answer, not the call's timeout: it gave up at 1.5 s.
    match who_am_i(&agent, &hurried, Duration::from_secs(2), None).await {
        Err(CallError::Refused(status)) => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}")
        }
        other => panic!("expected the agent's Unavailable before the deadline, got {other:?}"),
    }
}

/// A caller who may use the agent sees "Started" until someone says the workspace is in use;
/// a heartbeat then is the latest activity, with its source. Both calls are authenticated as
/// WhoAmI is: a stranger can neither read the activity nor keep the workspace alive.
#[tokio::test]
async fn activity_and_heartbeats_are_for_authenticated_callers() {
    let setup = Setup::new().await;
    let address = setup.agent("ws").await;
    let caller = setup.token("caller", AUDIENCE, Duration::from_secs(600));
    let timeout = Duration::from_secs(5);
    let first = get_activity(&address, &caller, timeout, None)
        .await
        .unwrap();
    assert_eq!(first.signal, "Started");
    let started: jiff::Timestamp = first.last_activity.parse().unwrap();

    heartbeat(&address, &caller, timeout, None, "vscode")
        .await
        .unwrap();
    let after = get_activity(&address, &caller, timeout, None)
        .await
        .unwrap();
    assert_eq!(
        (after.signal.as_str(), after.detail.as_str()),
        ("Heartbeat", "a heartbeat from vscode")
    );
    assert!(after.last_activity.parse::<jiff::Timestamp>().unwrap() >= started);

    let stranger = setup.token("stranger", AUDIENCE, Duration::from_secs(600));
    let refused = heartbeat(&address, &stranger, timeout, None, "intruder").await;
    assert!(
        matches!(&refused, Err(CallError::Refused(s)) if s.code() == Code::PermissionDenied),
        "{refused:?}"
    );
    assert!(matches!(
        get_activity(&address, "not-a-token", timeout, None).await,
        Err(CallError::Refused(s)) if s.code() == Code::Unauthenticated
    ));
    let last = get_activity(&address, &caller, timeout, None)
        .await
        .unwrap();
    assert_eq!(
        last.detail, "a heartbeat from vscode",
        "the refused heartbeat counted nothing"
    );
}
