//! `berth gateway` in front of the real operator on the sim: who gets in (TokenReview, then
//! SubjectAccessReview of `create` on `workspaces/connect` for that workspace), what reaches
//! the workspace (never the caller's credentials), what streams (a WebSocket, a large body),
//! and what a person sees when the workspace cannot be reached.

use std::{net::SocketAddr, time::Duration};

use berth_api::Phase;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::{Value, json};

use crate::support::*;

/// A running gateway, as its own service account with exactly the RBAC of `deploy/gateway/`.
async fn gateway(h: &Harness) -> SocketAddr {
    berth_sim::manifests::create_all(&h.client, berth_gateway::RBAC, "default")
        .await
        .unwrap();
    let token = h
        .sim
        .issue_token(
            "berth-system",
            "berth-gateway",
            &[],
            Duration::from_secs(3600),
        )
        .unwrap();
    let client = h.sim.client_with_token(&token).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let gateway = berth_gateway::Gateway::new(client, berth_gateway::Config::default());
    tokio::spawn(berth_gateway::serve(
        listener,
        gateway,
        std::future::pending(),
    ));
    address
}

/// A developer: a service account of `default` with a token, allowed into `workspaces` only.
async fn developer(h: &Harness, name: &str, workspaces: &[&str]) -> String {
    let mut manifest = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  namespace: default\n"
    );
    if !workspaces.is_empty() {
        let names = workspaces
            .iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(", ");
        manifest.push_str(&format!(
            "---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {name}-workspaces
  namespace: default
rules:
  - apiGroups: [\"berth.dev\"]
    resources: [\"workspaces/connect\"]
    resourceNames: [{names}]
    verbs: [\"create\"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {name}-workspaces
  namespace: default
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {name}-workspaces
subjects:
  - kind: ServiceAccount
    name: {name}
    namespace: default
"
        ));
    }
    berth_sim::manifests::create_all(&h.client, &manifest, "default")
        .await
        .unwrap();
    h.sim
        .issue_token("default", name, &[], Duration::from_secs(3600))
        .unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {} {}", self.status, self.text()))
    }
}

async fn get(gateway: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut request = Request::get(format!("http://{gateway}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .expect("the gateway answers");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn served(h: &Harness, name: &str) -> berth_api::Workspace {
    h.create(
        name,
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}]}),
    )
    .await;
    h.until_phase(name, Phase::Running).await
}

/// A user would see: without a token, 401 and how to send one; with a token the API server
/// does not accept, 401 in its words; allowed into another workspace only, 403 naming the
/// permission to ask for (as a page in a browser); allowed, the workspace's own answer, which
/// never carries their token or the gateway's cookie.
#[tokio::test]
async fn only_a_caller_allowed_on_the_workspace_reaches_it_and_their_credentials_stay_behind() {
    let h = Harness::start().await;
    let gateway = gateway(&h).await;
    served(&h, "web").await;
    served(&h, "other").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let bob = developer(&h, "bob", &[]).await;
    let bearer = |token: &str| format!("Bearer {token}");

    let none = get(gateway, "/w/default/web/http/", &[]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{}", none.text());
    assert_eq!(
        none.headers[header::WWW_AUTHENTICATE],
        "Bearer realm=\"berth\""
    );
    assert!(none.text().contains("bearer token"), "{}", none.text());

    let forged = get(
        gateway,
        "/w/default/web/http/",
        &[("authorization", "Bearer not-a-token")],
    )
    .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{}", forged.text());
    assert!(
        forged.text().contains("does not accept"),
        "{}",
        forged.text()
    );

    let refused = get(
        gateway,
        "/w/default/web/http/",
        &[("authorization", &bearer(&bob))],
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text());
    assert!(
        refused.text().contains(
            "User \"system:serviceaccount:default:bob\" cannot create resource \"workspaces/connect\" in API group \"berth.dev\" for workspace \"web\" in the namespace \"default\""
        ),
        "{}",
        refused.text()
    );
    let page = get(
        gateway,
        "/w/default/web/http/",
        &[
            ("authorization", &bearer(&bob)),
            ("accept", "text/html,*/*"),
        ],
    )
    .await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(
        page.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        page.text()
            .contains("resources [&quot;workspaces/connect&quot;]"),
        "{}",
        page.text()
    );

    let elsewhere = get(
        gateway,
        "/w/default/other/http/",
        &[("authorization", &bearer(&alice))],
    )
    .await;
    assert_eq!(
        elsewhere.status,
        StatusCode::FORBIDDEN,
        "alice's rule names web only"
    );

    let answer = get(
        gateway,
        "/w/default/web/http/src/main.rs?line=3",
        &[
            ("authorization", &bearer(&alice)),
            ("cookie", "berth_session=s; theme=dark"),
            ("x-forwarded-for", "6.6.6.6"),
        ],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let seen = answer.json();
    assert_eq!(seen["pod"], "web-ws", "the workspace's own pod answered");
    assert_eq!(seen["port"], 8080);
    assert_eq!(
        seen["path"], "/src/main.rs?line=3",
        "the prefix is stripped"
    );
    let headers = &seen["headers"];
    assert_eq!(
        headers.get("authorization"),
        None,
        "the token stays at the gateway: {headers}"
    );
    assert_eq!(headers["cookie"], "theme=dark");
    assert_eq!(headers["x-forwarded-prefix"], "/w/default/web/http");
    assert_eq!(
        headers["x-forwarded-for"], "127.0.0.1",
        "the caller cannot forge it"
    );

    let redirect = get(gateway, "/w/default/web/http?x=1", &[]).await;
    assert_eq!(redirect.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(
        redirect.headers[header::LOCATION],
        "/w/default/web/http/?x=1"
    );

    let no_port = get(
        gateway,
        "/w/default/web/ssh/",
        &[("authorization", &bearer(&alice))],
    )
    .await;
    assert_eq!(no_port.status, StatusCode::NOT_FOUND);
    assert!(
        no_port
            .text()
            .contains("no port named \"ssh\"; its ports: http"),
        "{}",
        no_port.text()
    );

    // Allowed on a name that has no workspace: said so, and nothing else is reached.
    let alice_anything = developer(&h, "carol", &["ghost"]).await;
    let ghost = get(
        gateway,
        "/w/default/ghost/http/",
        &[("authorization", &bearer(&alice_anything))],
    )
    .await;
    assert_eq!(ghost.status, StatusCode::NOT_FOUND);
    assert!(
        ghost
            .text()
            .contains("There is no workspace ghost in namespace default"),
        "{}",
        ghost.text()
    );
}

/// A user would see: a WebSocket to the workspace echoes through the gateway, a 20 MB
/// download arrives whole, and HTTP/2 works as HTTP/1.1 does.
#[tokio::test]
async fn a_websocket_and_a_large_download_stream_through_the_gateway() {
    let h = Harness::start().await;
    let gateway = gateway(&h).await;
    served(&h, "web").await;
    let alice = developer(&h, "alice", &["web"]).await;

    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(format!(
            "ws://{gateway}/w/default/web/http/echo"
        ))
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {alice}").parse().unwrap());
    let (mut socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the WebSocket is accepted through the gateway");
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    for text in ["hello", "from the browser"] {
        socket
            .send(tokio_tungstenite::tungstenite::Message::text(text))
            .await
            .unwrap();
        let echoed = socket.next().await.unwrap().unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), text);
    }
    socket.close(None).await.unwrap();

    let size = 20 * 1024 * 1024;
    let download = get(
        gateway,
        &format!("/w/default/web/http/bytes/{size}"),
        &[("authorization", &format!("Bearer {alice}"))],
    )
    .await;
    assert_eq!(download.status, StatusCode::OK);
    assert_eq!(download.body.len(), size);

    // HTTP/2 (prior knowledge, as a TLS-terminating proxy may speak it) reaches it too.
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let response = h2
        .request(
            Request::get(format!("http://{gateway}/w/default/web/http/h2"))
                .header("authorization", format!("Bearer {alice}"))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .expect("the gateway speaks HTTP/2");
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let seen: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(seen["path"], "/h2");
}

/// A user would see: a workspace that is not Running shows its phase and message (refreshed
/// while it may still come up), a paused one says it is stopped and since when; and a pod
/// that someone else created under the workspace's pod name is never reached, even ready.
#[tokio::test]
async fn a_workspace_that_cannot_be_reached_explains_itself_and_no_other_pod_is_reached() {
    let h = Harness::start().await;
    let gateway = gateway(&h).await;
    let alice = developer(&h, "alice", &["web", "squat"]).await;
    let auth = [("authorization", format!("Bearer {alice}"))];
    let auth: Vec<(&str, &str)> = auth.iter().map(|(k, v)| (*k, v.as_str())).collect();

    served(&h, "web").await;
    h.patch_spec("web", json!({"paused": true})).await;
    h.until_phase("web", Phase::Stopped).await;
    let stopped = get(gateway, "/w/default/web/http/", &auth).await;
    assert_eq!(stopped.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        stopped
            .text()
            .starts_with("Workspace default/web is stopped"),
        "{}",
        stopped.text()
    );
    assert!(
        stopped.text().contains("Stopped since 20"),
        "{}",
        stopped.text()
    );

    h.patch_spec("web", json!({"paused": false})).await;
    h.until_phase("web", Phase::Running).await;
    assert_eq!(
        get(gateway, "/w/default/web/http/", &auth).await.status,
        StatusCode::OK
    );

    // A workspace stuck on a missing secret: its page says so in the kubelet's words, and
    // a browser reloads it until the workspace comes up.
    h.create(
        "stuck",
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}],
               "podTemplate": {"volumes": {"secrets": [{"secretName": "workspace-secret", "mountPath": "/s"}]}}}),
    )
    .await;
    h.until("stuck", "the missing secret to be said", |ws| {
        message_of(ws).contains("secret \"workspace-secret\" not found")
    })
    .await;
    let alice_stuck = developer(&h, "dave", &["stuck"]).await;
    let stuck = get(
        gateway,
        "/w/default/stuck/http/",
        &[
            ("authorization", &format!("Bearer {alice_stuck}")),
            ("accept", "text/html"),
        ],
    )
    .await;
    assert_eq!(stuck.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        stuck.headers["refresh"], "2",
        "a starting workspace's page reloads"
    );
    assert!(
        stuck
            .text()
            .contains("<title>Workspace default/stuck is not ready: "),
        "{}",
        stuck.text()
    );
    assert!(
        stuck
            .text()
            .contains("secret &quot;workspace-secret&quot; not found"),
        "{}",
        stuck.text()
    );

    // Someone with pod rights creates a ready pod under the name Berth derives for "squat",
    // with the port the workspace will name.
    let squatter = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "squat-ws"},
        "spec": {"containers": [{"name": "c", "image": "devbox:1", "ports": [{"name": "http", "containerPort": 8080}]}]}
    });
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::default_namespaced(h.client.clone());
    pods.create(
        &Default::default(),
        &serde_json::from_value(squatter).unwrap(),
    )
    .await
    .unwrap();
    h.create(
        "squat",
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}]}),
    )
    .await;
    let refused = h.until_not_ready("squat", "NameTaken").await;
    let page = get(gateway, "/w/default/squat/http/", &auth).await;
    assert_eq!(
        page.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        page.text()
    );
    assert!(page.text().contains("is not ready"), "{}", page.text());
    assert!(
        page.text().contains(&message_of(&refused)),
        "{}",
        page.text()
    );
}

/// A user would see: a workspace used only through the gateway (a WebSocket held open, as an
/// IDE in a browser holds one) stays Running past three idle timeouts, its last activity
/// signal `Connection`; once that session ends it is stopped for being idle.
#[tokio::test]
async fn a_workspace_used_only_through_the_gateway_is_kept_until_its_session_ends() {
    let h = Harness::start().await;
    let gateway = gateway(&h).await;
    let alice = developer(&h, "alice", &["ide"]).await;
    const TIMEOUT: Duration = Duration::from_secs(3);
    h.create(
        "ide",
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}],
               "lifecycle": {"idleTimeout": "3s"}}),
    )
    .await;
    h.until_phase("ide", Phase::Running).await;
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(format!(
            "ws://{gateway}/w/default/ide/http/echo"
        ))
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {alice}").parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();

    let asked = h.metric("berth_agent_activity_checks_total{result=\"ok\"}");
    let from = std::time::Instant::now();
    eventually(
        Duration::from_secs(40),
        "three timeouts of asks",
        || async {
            (from.elapsed() >= 3 * TIMEOUT
                && h.metric("berth_agent_activity_checks_total{result=\"ok\"}") >= asked + 8)
                .then_some(())
        },
    )
    .await;
    socket
        .send(tokio_tungstenite::tungstenite::Message::text("still here"))
        .await
        .unwrap();
    assert!(socket.next().await.unwrap().is_ok(), "the session is alive");
    let ws = h.workspaces().get("ide").await.unwrap();
    assert_eq!(phase_of(&ws), Some(Phase::Running), "{}", message_of(&ws));
    assert!(!ws.spec.paused);
    assert_eq!(
        ws.status.unwrap().last_activity_signal.as_deref(),
        Some("Connection")
    );
    assert_eq!(h.metric("berth_workspaces_culled_total"), 0);

    socket.close(None).await.unwrap();
    drop(socket);
    h.until(
        "ide",
        "the workspace to be culled once its session ended",
        |ws| condition(ws, "Ready").is_some_and(|c| c.status == "False" && c.reason == "Idle"),
    )
    .await;
}
