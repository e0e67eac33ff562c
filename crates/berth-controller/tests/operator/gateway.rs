//! `berth gateway` in front of the real operator on the sim: who gets in (TokenReview, then
//! SubjectAccessReview of `create` on `workspaces/connect` for that workspace), what reaches
//! the workspace (never the caller's credentials), what streams (a WebSocket, a large body),
//! and what a person sees when the workspace cannot be reached.

use std::{net::SocketAddr, time::Duration};

use berth_api::Phase;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::{Value, json};

use crate::support::*;

/// A running gateway, as its own service account with exactly the RBAC of `deploy/gateway/`.
async fn gateway(h: &Harness) -> SocketAddr {
    gateway_with(h, berth_gateway::Config::default()).await
}

pub(crate) async fn gateway_with(h: &Harness, config: berth_gateway::Config) -> SocketAddr {
    berth_sim::manifests::create_all(&h.client, berth_gateway::RBAC, "default")
        .await
        .unwrap();
    replica(h, config).await
}

/// One more replica of the gateway installed by [`gateway_with`].
async fn replica(h: &Harness, config: berth_gateway::Config) -> SocketAddr {
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
    let gateway = berth_gateway::Gateway::start(client, config).await.unwrap();
    tokio::spawn(berth_gateway::serve(
        listener,
        gateway,
        std::future::pending(),
    ));
    address
}

/// A developer: a service account of `default` with a token, allowed into `workspaces` only.
pub(crate) async fn developer(h: &Harness, name: &str, workspaces: &[&str]) -> String {
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

/// Lets developer `name` patch workspace `workspace` (what the start button needs).
async fn may_patch(h: &Harness, name: &str, workspace: &str) {
    let manifest = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}-patch, namespace: default}}
rules: [{{apiGroups: [berth.dev], resources: [workspaces], resourceNames: [{workspace}], verbs: [patch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}-patch, namespace: default}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}-patch}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: default}}]
"
    );
    berth_sim::manifests::create_all(&h.client, &manifest, "default")
        .await
        .unwrap();
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts that the answer's text has `words` (showing the whole text when not).
    #[track_caller]
    pub(crate) fn says(&self, words: &str) {
        let text = self.text();
        assert!(text.contains(words), "{text}");
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {} {}", self.status, self.text()))
    }
}

pub(crate) async fn get(gateway: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    call(gateway, http::Method::GET, path, headers, "").await
}

pub(crate) async fn call(
    gateway: SocketAddr,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{gateway}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(
            request
                .body(Full::new(Bytes::from(body.to_owned())))
                .unwrap(),
        )
        .await
        .expect("the gateway answers");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

pub(crate) async fn served(h: &Harness, name: &str) -> berth_api::Workspace {
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
    none.says("bearer token");

    let forged = get(
        gateway,
        "/w/default/web/http/",
        &[("authorization", "Bearer not-a-token")],
    )
    .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{}", forged.text());
    forged.says("does not accept");

    let refused = get(
        gateway,
        "/w/default/web/http/",
        &[("authorization", &bearer(&bob))],
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text());
    refused.says(
            "User \"system:serviceaccount:default:bob\" cannot create resource \"workspaces/connect\" in API group \"berth.dev\" for workspace \"web\" in the namespace \"default\""
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

    // Served from the gateway's watches: once they show the ready pod, a request asks the
    // API server nothing (the reviews are remembered for their TTL).
    let gets = || {
        h.sim.count_requests(|k| {
            k.user == "system:serviceaccount:berth-system:berth-gateway" && k.verb == "get"
        })
    };
    eventually(
        Duration::from_secs(30),
        "the gateway's watches to show web's ready pod",
        || async {
            let before = gets();
            let again = get(
                gateway,
                "/w/default/web/http/",
                &[("authorization", &bearer(&alice))],
            )
            .await;
            (again.status == StatusCode::OK && gets() == before).then_some(())
        },
    )
    .await;
    let before = gets();
    for _ in 0..20 {
        let again = get(
            gateway,
            "/w/default/web/http/",
            &[("authorization", &bearer(&alice))],
        )
        .await;
        assert_eq!(again.status, StatusCode::OK);
    }
    assert_eq!(
        gets(),
        before,
        "no GET of the workspace or its pod per request"
    );
    // Nor does a caller nobody has vouched for, whatever name they try.
    for name in ["web", "no-such-workspace"] {
        let anonymous = get(gateway, &format!("/w/default/{name}/http/"), &[]).await;
        assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        gets(),
        before,
        "an anonymous caller makes the gateway read nothing"
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
    stopped.says("Stopped since 20");

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
    page.says("is not ready");
    page.says(&message_of(&refused));
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

    three_idle_timeouts(&h, TIMEOUT).await;
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

/// Waits three idle timeouts of `timeout`, in which the operator asked the agent about
/// activity at least eight times (so a workspace still Running then was seen in use).
async fn three_idle_timeouts(h: &Harness, timeout: Duration) {
    let asked = h.metric("berth_agent_activity_checks_total{result=\"ok\"}");
    let from = std::time::Instant::now();
    eventually(
        Duration::from_secs(40),
        "three timeouts of asks",
        || async {
            (from.elapsed() >= 3 * timeout
                && h.metric("berth_agent_activity_checks_total{result=\"ok\"}") >= asked + 8)
                .then_some(())
        },
    )
    .await;
}

/// The session cookie's `name=value` from a login's answer.
fn session_cookie(answer: &Answer) -> String {
    let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// What a person with `berth open` sees: the link works once, on any replica, for its
/// workspace only; its session is asked about on every request (a revoked Role closes it);
/// a stopped workspace's page has a start button that only works from that page, for a
/// user who may patch the workspace.
#[tokio::test]
async fn a_login_link_works_once_and_its_session_is_authorized_on_every_request() {
    let h = Harness::start().await;
    let config = berth_gateway::Config {
        review_ttl: Duration::from_millis(200),
        ..Default::default()
    };
    // Two replicas: one key (the Secret the first made), one record of used links.
    let first = gateway_with(&h, config.clone()).await;
    let second = replica(&h, config).await;
    served(&h, "web").await;
    served(&h, "other").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let bob = developer(&h, "bob", &[]).await;
    let mint = |token: String, workspace: &'static str| async move {
        let auth = format!("Bearer {token}");
        call(
            first,
            http::Method::POST,
            &format!("/.berth/tickets?namespace=default&workspace={workspace}&port=http"),
            &[("authorization", &auth)],
            "",
        )
        .await
    };

    let anonymous = call(
        first,
        http::Method::POST,
        "/.berth/tickets?namespace=default&workspace=web&port=http",
        &[],
        "",
    )
    .await;
    assert_eq!(
        anonymous.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        anonymous.text()
    );
    let refused = mint(bob.clone(), "web").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text());
    assert!(
        refused
            .text()
            .contains("cannot create resource \"workspaces/connect\""),
        "{}",
        refused.text()
    );
    assert_eq!(
        mint(alice.clone(), "other").await.status,
        StatusCode::FORBIDDEN
    );

    let minted = mint(alice.clone(), "web").await;
    assert_eq!(minted.status, StatusCode::OK, "{}", minted.text());
    let link = minted.json()["path"].as_str().unwrap().to_owned();
    assert!(
        link.starts_with("/w/default/web/.berth/login?ticket="),
        "{link}"
    );

    // Used on the other replica: a session for web, scoped to web's path.
    let login = get(second, &link, &[]).await;
    assert_eq!(login.status, StatusCode::SEE_OTHER, "{}", login.text());
    assert_eq!(login.headers[header::LOCATION], "/w/default/web/http/");
    let set = login.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set.contains("; Path=/w/default/web/; "), "{set}");
    assert!(set.contains("; HttpOnly; SameSite=Lax"), "{set}");
    let cookie = session_cookie(&login);

    // Used again, on either replica: refused.
    for replica in [first, second] {
        let again = get(replica, &link, &[]).await;
        assert_eq!(again.status, StatusCode::UNAUTHORIZED, "{}", again.text());
        again.says("it was used before");
    }
    // A link for web does not log in to other; a changed link is refused.
    let elsewhere = get(first, &link.replace("/web/", "/other/"), &[]).await;
    elsewhere.says("for another workspace");
    let forged = get(first, &format!("{link}x"), &[]).await;
    forged.says("not made by this cluster's gateway");

    // The session reaches web, and never arrives there.
    let through = get(
        first,
        "/w/default/web/http/",
        &[("cookie", &format!("{cookie}; theme=dark"))],
    )
    .await;
    assert_eq!(through.status, StatusCode::OK, "{}", through.text());
    assert_eq!(through.json()["headers"]["cookie"], "theme=dark");
    let other = get(first, "/w/default/other/http/", &[("cookie", &cookie)]).await;
    assert_eq!(other.status, StatusCode::UNAUTHORIZED);
    other.says("for another workspace");

    // Stopped: the page says so, with a start button carrying the session's CSRF token.
    h.patch_spec("web", json!({"paused": true})).await;
    h.until_phase("web", Phase::Stopped).await;
    let html = [("cookie", cookie.as_str()), ("accept", "text/html")];
    let page = get(first, "/w/default/web/http/", &html).await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
    let text = page.text();
    assert!(
        text.contains("<form method=\"post\" action=\"/w/default/web/.berth/start\">"),
        "{text}"
    );
    let csrf = text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let form = format!("csrf={csrf}&port=http");
    let post = |headers: Vec<(&'static str, String)>, body: String| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        call(
            first,
            http::Method::POST,
            "/w/default/web/.berth/start",
            &headers,
            &body,
        )
        .await
    };
    let with = |origin: &str| {
        vec![
            ("cookie", cookie.clone()),
            (
                "content-type",
                "application/x-www-form-urlencoded".to_owned(),
            ),
            ("origin", origin.to_owned()),
            ("host", first.to_string()),
        ]
    };
    let forged = post(
        with(&format!("http://{first}")),
        "csrf=nope&port=http".into(),
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.text());
    let cross_site = post(with("https://evil.example"), form.clone()).await;
    assert_eq!(
        cross_site.status,
        StatusCode::FORBIDDEN,
        "{}",
        cross_site.text()
    );
    let not_allowed = post(with(&format!("http://{first}")), form.clone()).await;
    assert_eq!(
        not_allowed.status,
        StatusCode::FORBIDDEN,
        "{}",
        not_allowed.text()
    );
    not_allowed
        .says("User \"system:serviceaccount:default:alice\" cannot patch resource \"workspaces\"");
    let still = h.workspaces().get("web").await.unwrap();
    assert!(still.spec.paused, "nothing changed");
    may_patch(&h, "alice", "web").await;
    let started = eventually(
        Duration::from_secs(30),
        "the start button to work once alice may patch web",
        || async {
            let answer = post(with(&format!("http://{first}")), form.clone()).await;
            (answer.status == StatusCode::SEE_OTHER).then_some(answer)
        },
    )
    .await;
    assert_eq!(started.headers[header::LOCATION], "/w/default/web/http/");
    h.until_phase("web", Phase::Running).await;

    // The Role that let alice in is gone: her session stops working.
    let bindings: kube::Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        kube::Api::namespaced(h.client.clone(), "default");
    bindings
        .delete("alice-workspaces", &Default::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "alice's session to be refused once her Role is gone",
        || async {
            let answer = get(first, "/w/default/web/http/", &[("cookie", &cookie)]).await;
            (answer.status == StatusCode::FORBIDDEN).then_some(())
        },
    )
    .await;
}

/// A browser session for `workspace`: a login link minted with `token`, used.
async fn sign_in(gateway: SocketAddr, token: &str, workspace: &str) -> String {
    let auth = format!("Bearer {token}");
    let minted = call(
        gateway,
        http::Method::POST,
        &format!("/.berth/tickets?namespace=default&workspace={workspace}&port=http"),
        &[("authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(minted.status, StatusCode::OK, "{}", minted.text());
    let login = get(gateway, minted.json()["path"].as_str().unwrap(), &[]).await;
    assert_eq!(login.status, StatusCode::SEE_OTHER, "{}", login.text());
    session_cookie(&login)
}

/// The start button of a workspace that names a secret (or a kind) works: starting and
/// stopping name nothing new, so the admission policy does not check the gateway's patch
/// against rights only the workspace's author has. (It answered 502 with a debug dump.)
#[tokio::test]
async fn the_start_button_starts_a_workspace_that_names_a_secret() {
    let h = Harness::start().await;
    let first = gateway(&h).await;
    berth_sim::manifests::create_all(
        &h.client,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: npm-token, namespace: default}\nstringData: {token: x}\n",
        "default",
    )
    .await
    .unwrap();
    h.create(
        "keyed",
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}],
            "podTemplate": {"volumes": {"secrets": [{"secretName": "npm-token", "mountPath": "/secrets/npm"}]}}}),
    )
    .await;
    h.until_phase("keyed", Phase::Running).await;
    let alice = developer(&h, "alice", &["keyed"]).await;
    may_patch(&h, "alice", "keyed").await;
    let cookie = sign_in(first, &alice, "keyed").await;
    h.patch_spec("keyed", json!({"paused": true})).await;
    h.until_phase("keyed", Phase::Stopped).await;
    let page = get(
        first,
        "/w/default/keyed/http/",
        &[("cookie", &cookie), ("accept", "text/html")],
    )
    .await;
    let text = page.text();
    let csrf = text
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a start button: {text}"))
        .to_owned();
    let host = first.to_string();
    let started = call(
        first,
        http::Method::POST,
        "/w/default/keyed/.berth/start",
        &[
            ("cookie", &cookie),
            ("content-type", "application/x-www-form-urlencoded"),
            ("origin", &format!("http://{host}")),
            ("host", &host),
        ],
        &format!("csrf={csrf}&port=http"),
    )
    .await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.text());
    assert!(!started.text().contains("Status {"), "{}", started.text());
    h.until_phase("keyed", Phase::Running).await;
}

/// A session ends when its credential does: once alice's service account is deleted (her
/// RoleBinding still names it, so authorization alone would let her on), her browser session
/// is refused within the review TTL, saying why and how to sign in again; so is a session
/// of an account deleted and made again under the same name.
#[tokio::test]
async fn a_session_ends_when_its_service_account_is_deleted() {
    let h = Harness::start().await;
    let config = berth_gateway::Config {
        review_ttl: Duration::from_millis(200),
        ..Default::default()
    };
    let first = gateway_with(&h, config).await;
    served(&h, "web").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let cookie = sign_in(first, &alice, "web").await;
    let through = get(first, "/w/default/web/http/", &[("cookie", &cookie)]).await;
    assert_eq!(through.status, StatusCode::OK, "{}", through.text());
    k8s_delete::<k8s_openapi::api::core::v1::ServiceAccount>(&h, "alice").await;
    let ended = eventually(
        Duration::from_secs(30),
        "alice's session to end with her service account",
        || async {
            let answer = get(first, "/w/default/web/http/", &[("cookie", &cookie)]).await;
            (answer.status == StatusCode::UNAUTHORIZED).then_some(answer)
        },
    )
    .await;
    ended.says("the service account default/alice it was made for no longer exists");
    ended.says("berth open web -n default");
    // Made again under the same name: another account, and the old session stays ended.
    berth_sim::manifests::create_all(
        &h.client,
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: alice, namespace: default}\n",
        "default",
    )
    .await
    .unwrap();
    let again = eventually(
        Duration::from_secs(30),
        "the old session refused as another account's",
        || async {
            let answer = get(first, "/w/default/web/http/", &[("cookie", &cookie)]).await;
            answer
                .text()
                .contains("was deleted and made again")
                .then_some(answer)
        },
    )
    .await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "{}", again.text());
}

/// What a caller says of where it comes from never reaches the workspace as the gateway's
/// word: `Forwarded`, `X-Real-IP` and `X-Forwarded-*` are the gateway's own, and a `Host`
/// anyone can send is not passed on as `X-Forwarded-Host`.
#[tokio::test]
async fn a_callers_forwarding_headers_are_replaced() {
    let h = Harness::start().await;
    let first = gateway(&h).await;
    served(&h, "web").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let auth = format!("Bearer {alice}");
    let through = get(
        first,
        "/w/default/web/http/",
        &[
            ("authorization", &auth),
            ("host", "evil.example"),
            ("forwarded", "for=6.6.6.6;host=evil.example;proto=https"),
            ("x-real-ip", "6.6.6.6"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-host", "evil.example"),
        ],
    )
    .await;
    assert_eq!(through.status, StatusCode::OK, "{}", through.text());
    let seen = &through.json()["headers"];
    assert_eq!(seen["x-real-ip"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["forwarded"], "for=127.0.0.1;proto=http");
    assert!(seen.get("x-forwarded-host").is_none(), "{seen}");
}

/// Refusals are cheap: a refused token is remembered (asking again costs the API server
/// nothing), and an address that sends more than its budget of refused tokens is answered 429
/// with Retry-After without asking; a caller with a remembered good token still gets in.
#[tokio::test]
async fn refused_tokens_are_remembered_and_limited_per_address() {
    let h = Harness::start().await;
    let first = gateway(&h).await;
    served(&h, "web").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let alice_auth = format!("Bearer {alice}");
    let welcome = get(
        first,
        "/w/default/web/http/",
        &[("authorization", &alice_auth)],
    )
    .await;
    assert_eq!(welcome.status, StatusCode::OK, "{}", welcome.text());
    let reviews = || {
        h.sim
            .count_requests(|k| k.resource == "tokenreviews" && k.user.contains("berth-gateway"))
    };
    let before = reviews();
    // One bad token, sent ten times: asked about once.
    for _ in 0..10 {
        let answer = get(
            first,
            "/w/default/web/http/",
            &[("authorization", "Bearer nope")],
        )
        .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.text());
    }
    assert_eq!(reviews() - before, 1, "a refused token is remembered");
    // Many different bad tokens: asked about up to the budget, then 429 without asking.
    let budget = u64::from(berth_gateway::access::REFUSED_TOKENS_PER_ADDRESS);
    let mut limited = None;
    for i in 0..budget + 5 {
        let auth = format!("Bearer guess-{i}");
        let answer = get(first, "/w/default/web/http/", &[("authorization", &auth)]).await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(answer);
            break;
        }
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.text());
    }
    let limited = limited.expect("the address is limited once its budget is spent");
    limited.says("Too many refused credentials");
    let wait: u64 = limited.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(
        reviews() - before,
        budget,
        "no TokenReview beyond the budget"
    );
    // Alice's token, remembered, still gets in from the same address.
    let still = get(
        first,
        "/w/default/web/http/",
        &[("authorization", &alice_auth)],
    )
    .await;
    assert_eq!(still.status, StatusCode::OK, "{}", still.text());
}

/// A caller must send a request's headers in time: connections that send nothing or half a
/// request are closed after the header timeout, and the gateway keeps serving.
#[tokio::test]
async fn half_sent_requests_do_not_hold_connections_open() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start().await;
    let config = berth_gateway::Config {
        header_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let first = gateway_with(&h, config).await;
    let mut idle = vec![];
    for i in 0..40 {
        let mut stream = tokio::net::TcpStream::connect(first).await.unwrap();
        if i % 2 == 0 {
            stream
                .write_all(b"GET /w/default/web/http/ HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
                .await
                .unwrap();
        }
        idle.push(stream);
    }
    // Each is closed by the gateway: reading ends (EOF, or a reset) instead of waiting.
    for mut stream in idle {
        let mut buffer = vec![0; 1024];
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "a half-sent request kept its connection open"
        );
    }
    let health = get(first, "/healthz", &[]).await;
    assert_eq!(health.status, StatusCode::OK);
}

/// What `berth port-forward` rides on: a WebSocket at `/w/<ns>/<ws>/.berth/tcp/<port>` is a
/// TCP connection to that port of the workspace's pod (here an HTTP/1.0 exchange, byte for
/// byte), for a caller allowed to connect; anyone else is refused before any connection.
#[tokio::test]
async fn a_tcp_tunnel_reaches_the_workspaces_port_for_an_allowed_caller_only() {
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let h = Harness::start().await;
    let gateway = gateway(&h).await;
    served(&h, "web").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let bob = developer(&h, "bob", &[]).await;
    let open = |token: String, port: &'static str| async move {
        let mut request = format!("ws://{gateway}/w/default/web/.berth/tcp/{port}")
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        tokio_tungstenite::connect_async(request).await
    };

    let (mut socket, _) = open(alice.clone(), "http").await.expect("alice's tunnel");
    socket
        .send(Message::binary(
            b"GET /through/the/tunnel HTTP/1.0\r\nHost: web\r\n\r\n".to_vec(),
        ))
        .await
        .unwrap();
    let mut answer = Vec::new();
    while let Some(message) = socket.next().await {
        match message.unwrap() {
            Message::Binary(bytes) => answer.extend_from_slice(&bytes),
            Message::Close(_) => break,
            _ => {}
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "{answer}"
    );
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["pod"], "web-ws");
    assert_eq!(
        body["path"], "/through/the/tunnel",
        "the bytes arrive as they were sent"
    );

    match open(bob, "http").await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::FORBIDDEN);
        }
        other => panic!("bob is refused: {:?}", other.map(|(_, r)| r.status())),
    }
    // A port by its number too (a caller who may not read the workspace knows no names).
    let (socket, _) = open(alice.clone(), "8080")
        .await
        .expect("the tunnel to port 8080");
    drop(socket);
    match open(alice, "ssh").await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::NOT_FOUND);
        }
        other => panic!("no port ssh: {:?}", other.map(|(_, r)| r.status())),
    }
}

/// `berth open` for someone who may connect to a workspace but not read it
/// (`berth-workspace-connect`): the gateway picks the port, by name, by number or the first,
/// once it knows who asks, and says which ports there are when there is no such one.
#[tokio::test]
async fn a_login_link_names_its_port_for_a_caller_who_cannot_read_the_workspace() {
    let h = Harness::start().await;
    let first = gateway(&h).await;
    served(&h, "web").await;
    let alice = developer(&h, "alice", &["web"]).await;
    let auth = format!("Bearer {alice}");
    let mint = |query: &'static str| {
        let auth = auth.clone();
        async move {
            call(
                first,
                http::Method::POST,
                &format!("/.berth/tickets?namespace=default&workspace=web{query}"),
                &[("authorization", &auth)],
                "",
            )
            .await
        }
    };
    for query in ["", "&port=http", "&port=8080"] {
        let minted = mint(query).await;
        assert_eq!(minted.status, StatusCode::OK, "{query}: {}", minted.text());
        assert_eq!(minted.json()["port"], "http", "{query}");
        let path = minted.json()["path"].as_str().unwrap().to_owned();
        let login = get(first, &path, &[]).await;
        assert_eq!(login.headers[header::LOCATION], "/w/default/web/http/");
    }
    let none = mint("&port=ssh").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    none.says("workspace default/web has no port ssh; its ports: http (8080)");
    // Who asks is checked before anything of the workspace is said.
    let bob = developer(&h, "bob", &[]).await;
    let refused = call(
        first,
        http::Method::POST,
        "/.berth/tickets?namespace=default&workspace=web&port=ssh",
        &[("authorization", &format!("Bearer {bob}"))],
        "",
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
}

/// What an admin and a developer see of a port's options: a workspace's own port marked
/// public stays private (401 saying why) unless the gateway allows public ports; a port its
/// WorkspaceKind declares public is served to anyone; a port with `stripPrefix: false` gets
/// the path as the caller sent it.
#[tokio::test]
async fn a_public_port_is_served_to_anyone_only_where_allowed_and_a_port_may_keep_its_prefix() {
    let h = Harness::start().await;
    let strict = gateway(&h).await;
    let open = replica(
        &h,
        berth_gateway::Config {
            allow_public_ports: true,
            ..Default::default()
        },
    )
    .await;
    h.create(
        "blog",
        json!({"image": "devbox:1", "command": ["serve"],
            "ports": [{"name": "http", "port": 8080, "public": true, "stripPrefix": false}]}),
    )
    .await;
    h.until_phase("blog", Phase::Running).await;
    let alice = developer(&h, "alice", &["blog"]).await;

    // What a caller meets before signing in comes from the gateway's watch alone: wait for it
    // to show blog.
    let anonymous = eventually(
        Duration::from_secs(30),
        "the gateway's watch to show blog",
        || async {
            let answer = get(strict, "/w/default/blog/http/post/1", &[]).await;
            answer.text().contains("marked public").then_some(answer)
        },
    )
    .await;
    assert_eq!(
        anonymous.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        anonymous.text()
    );
    anonymous.says("Port http of workspace default/blog is marked public, but this gateway serves a workspace's own port to anyone only when it runs with --allow-public-ports");
    let signed_in = get(
        strict,
        "/w/default/blog/http/post/1",
        &[("authorization", &format!("Bearer {alice}"))],
    )
    .await;
    assert_eq!(signed_in.status, StatusCode::OK, "{}", signed_in.text());
    let seen = signed_in.json();
    assert_eq!(
        seen["path"], "/w/default/blog/http/post/1",
        "the prefix is kept"
    );
    assert_eq!(seen["headers"].get("x-forwarded-prefix"), None);

    let served = eventually(
        Duration::from_secs(30),
        "the open gateway's watch to show blog",
        || async {
            let answer = get(open, "/w/default/blog/http/post/1", &[]).await;
            (answer.status != StatusCode::UNAUTHORIZED).then_some(answer)
        },
    )
    .await;
    assert_eq!(served.status, StatusCode::OK, "{}", served.text());

    // A kind's public port: its admin published it.
    let kinds: kube::Api<berth_api::WorkspaceKind> = kube::Api::all(h.client.clone());
    kinds
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
                "metadata": {"name": "docs"},
                "spec": {
                    "spawner": {"displayName": "Docs", "description": "A docs server"},
                    "options": {
                        "image": {"default": "v1", "values": [{"id": "v1", "displayName": "v1",
                            "spec": {"image": "devbox:1", "ports": [{"name": "docs", "port": 8080, "public": true}]}}]},
                        "pod": {"default": "small", "values": [{"id": "small", "displayName": "Small", "spec": {}}]}
                    }
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    h.create("handbook", json!({"kind": "docs", "command": ["serve"]}))
        .await;
    h.until_phase("handbook", Phase::Running).await;
    let anyone = eventually(
        Duration::from_secs(30),
        "the gateway's watch to show handbook",
        || async {
            let answer = get(strict, "/w/default/handbook/docs/", &[]).await;
            (answer.status != StatusCode::UNAUTHORIZED).then_some(answer)
        },
    )
    .await;
    assert_eq!(anyone.status, StatusCode::OK, "{}", anyone.text());
    assert_eq!(anyone.json()["pod"], "handbook-ws");
}

/// Headless Chromium (Debian's `chromium`), driven over the DevTools protocol: a page of its
/// own, JavaScript evaluated in it.
pub(crate) struct Browser {
    child: std::process::Child,
    _profile: tempfile::TempDir,
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    session: String,
    next_id: u64,
    /// The DevTools events seen so far (e.g. `Network.responseReceived` once enabled).
    events: Vec<Value>,
}

impl Drop for Browser {
    /// SIGTERM first: Chromium then ends its own helper processes and waits for them.
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// A browser, or None (said) where Chromium is not installed; CI requires one
    /// (BERTH_REQUIRE_BROWSER=1).
    async fn start() -> Option<Browser> {
        Browser::start_with(&[]).await
    }

    /// [`Browser::start`] with more command-line flags.
    pub(crate) async fn start_with(flags: &[&str]) -> Option<Browser> {
        let program = ["chromium", "chromium-browser"].into_iter().find(|p| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
        let Some(program) = program else {
            if std::env::var("BERTH_REQUIRE_BROWSER").as_deref() == Ok("1") {
                panic!(
                    "BERTH_REQUIRE_BROWSER=1 but there is no chromium (apt-get install chromium)"
                );
            }
            eprintln!("skipped: needs chromium (apt-get install chromium)");
            return None;
        };
        let profile = tempfile::tempdir().unwrap();
        // The flags keep it from reaching out to a network this machine does not have.
        let child = std::process::Command::new(program)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                // A container's /dev/shm is often too small for Chromium's shared memory.
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
                "about:blank",
            ])
            .args(flags)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let active = profile.path().join("DevToolsActivePort");
        let endpoint = eventually(
            Duration::from_secs(60),
            "chromium's DevTools port",
            || async {
                let text = std::fs::read_to_string(&active).ok()?;
                let mut lines = text.lines();
                let (port, path) = (lines.next()?, lines.next()?);
                Some(format!("ws://127.0.0.1:{port}{path}"))
            },
        )
        .await;
        let (socket, _) = tokio_tungstenite::connect_async(endpoint).await.unwrap();
        let mut browser = Browser {
            child,
            _profile: profile,
            socket,
            session: String::new(),
            next_id: 0,
            events: vec![],
        };
        let target = browser
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        Some(browser)
    }

    /// One DevTools command (to the page once attached); its result.
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        match self.send(method, params).await {
            Ok(result) => result,
            Err(error) => panic!("{method}: {error}"),
        }
    }

    /// One DevTools command; its result, or its error.
    async fn send(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        use tokio_tungstenite::tungstenite::Message;
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            command["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(command.to_string()))
            .await
            .unwrap();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(60), self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("chromium did not answer {method}"))
                .expect("chromium's DevTools connection")
                .unwrap();
            let Message::Text(text) = message else {
                continue;
            };
            let answer: Value = serde_json::from_str(&text).unwrap();
            if answer.get("method").is_some() {
                self.events.push(answer);
                continue;
            }
            if answer["id"] == json!(id) {
                return match answer.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(answer["result"].clone()),
                };
            }
        }
    }

    /// The value of a JavaScript expression in the page (a promise is awaited).
    pub(crate) async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    pub(crate) async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
    }

    /// Waits until `condition` (JavaScript) is true in the page, as a person looking at it
    /// (a page that is being replaced is asked again).
    pub(crate) async fn until(&mut self, what: &str, condition: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let expression = format!("document.readyState === 'complete' && !!({condition})");
        loop {
            let answer = self
                .send(
                    "Runtime.evaluate",
                    json!({"expression": expression, "returnByValue": true}),
                )
                .await;
            if answer.is_ok_and(|a| a["result"]["value"] == json!(true)) {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let seen = self
                    .eval("location.href + '\\n' + document.body.innerText")
                    .await;
                panic!("timed out waiting for {what}; the page: {seen}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A person in a real browser: the login link `berth open` prints signs them in (a cookie
/// scripts cannot read), the workspace's page and a WebSocket from it work, a stopped
/// workspace's page has a start button that starts it, and once their Role is gone the page
/// names the permission they lack.
#[tokio::test]
async fn a_person_in_a_browser_signs_in_uses_starts_and_is_shut_out() {
    let Some(mut browser) = Browser::start().await else {
        return;
    };
    let h = Harness::start().await;
    let gateway = gateway(&h).await;
    served(&h, "web").await;
    h.create(
        "stuck",
        json!({"image": "registry.invalid/devbox:9.9", "ports": [{"name": "http", "port": 8080}]}),
    )
    .await;
    let alice = developer(&h, "alice", &["web", "stuck"]).await;
    may_patch(&h, "alice", "web").await;
    let login_link = |workspace: &'static str| {
        let alice = alice.clone();
        async move {
            let minted = call(
                gateway,
                http::Method::POST,
                &format!("/.berth/tickets?namespace=default&workspace={workspace}&port=http"),
                &[("authorization", &format!("Bearer {alice}"))],
                "",
            )
            .await;
            minted.json()["path"].as_str().unwrap().to_owned()
        }
    };

    // A workspace that cannot start explains itself, in the kubelet's words, and says it
    // will look again.
    let link = login_link("stuck").await;
    browser.navigate(&format!("http://{gateway}{link}")).await;
    browser
        .until(
            "the stuck workspace's page",
            "document.querySelector('h1') && document.querySelector('h1').innerText.startsWith('Workspace default/stuck is not ready') && document.body.innerText.includes('registry.invalid/devbox:9.9')",
        )
        .await;
    assert_eq!(
        browser
            .eval("document.querySelector('meta[http-equiv=refresh]').content")
            .await,
        json!("2")
    );

    let link = login_link("web").await;

    browser.navigate(&format!("http://{gateway}{link}")).await;
    browser
        .until("the workspace's page", "location.pathname === '/w/default/web/http/' && document.body.innerText.includes('web-ws')")
        .await;
    assert_eq!(browser.eval("document.cookie").await, json!(""), "HttpOnly");
    let echoed = browser
        .eval(
            "new Promise((done, failed) => {
                const socket = new WebSocket('ws://' + location.host + '/w/default/web/http/echo');
                socket.onopen = () => socket.send('hello from chromium');
                socket.onmessage = (m) => { done(m.data); socket.close(); };
                socket.onerror = () => failed('the WebSocket failed');
            })",
        )
        .await;
    assert_eq!(echoed, json!("hello from chromium"));

    h.patch_spec("web", json!({"paused": true})).await;
    h.until_phase("web", Phase::Stopped).await;
    browser
        .navigate(&format!("http://{gateway}/w/default/web/http/"))
        .await;
    browser
        .until("the stopped page's start button", "document.querySelector('h1').innerText.includes('is stopped') && document.querySelector('form button')")
        .await;
    browser
        .eval("document.querySelector('form button').click(); true")
        .await;
    h.until_phase("web", Phase::Running).await;
    // The page reloads itself while the workspace starts, then is the workspace's.
    browser
        .until(
            "the workspace's page again",
            "document.body.innerText.includes('web-ws')",
        )
        .await;

    let bindings: kube::Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        kube::Api::namespaced(h.client.clone(), "default");
    bindings
        .delete("alice-workspaces", &Default::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "alice's review to expire",
        || async {
            let answer = get(
                gateway,
                "/w/default/web/http/",
                &[("authorization", &format!("Bearer {alice}"))],
            )
            .await;
            (answer.status == StatusCode::FORBIDDEN).then_some(())
        },
    )
    .await;
    browser
        .navigate(&format!("http://{gateway}/w/default/web/http/"))
        .await;
    browser
        .until("the 403 page", "document.querySelector('h1') && document.querySelector('h1').innerText === 'Not allowed into this workspace'")
        .await;
    let text = browser.eval("document.body.innerText").await;
    assert!(
        text.as_str()
            .unwrap()
            .contains("resources [\"workspaces/connect\"]"),
        "{text}"
    );
}

/// Trust between workspaces in a browser, with a base domain (each workspace's port its own
/// host, `<port>--<workspace>--<namespace>.ws.example.com`, which Chromium resolves to this
/// machine): carol is signed in to bob's workspace and visits web's page, whose script tries
/// to use her session for bob: a WebSocket to bob's host, a fetch of bob's page with her
/// cookie. Both are refused by the gateway (they reach bob's host same-site, so her
/// SameSite=Lax cookie goes along); bob's own page still opens its WebSocket.
#[tokio::test]
async fn a_page_of_one_workspace_cannot_use_a_session_for_another() {
    const DOMAIN: &str = "ws.example.com";
    let Some(mut browser) =
        Browser::start_with(&["--host-resolver-rules=MAP *.ws.example.com 127.0.0.1"]).await
    else {
        return;
    };
    let h = Harness::start().await;
    let config = berth_gateway::Config {
        base_domain: Some(DOMAIN.to_owned()),
        ..Default::default()
    };
    let gateway = gateway_with(&h, config).await;
    served(&h, "web").await;
    served(&h, "bob").await;
    let carol = developer(&h, "carol", &["web", "bob"]).await;
    let port = gateway.port();
    let host_of = |workspace: &str| format!("http--{workspace}--default.{DOMAIN}:{port}");
    // The link `berth open` prints (a path on the gateway) signs in on the workspace's host.
    for workspace in ["bob", "web"] {
        let minted = call(
            gateway,
            http::Method::POST,
            &format!("/.berth/tickets?namespace=default&workspace={workspace}&port=http"),
            &[("authorization", &format!("Bearer {carol}"))],
            "",
        )
        .await;
        let link = minted.json()["path"].as_str().unwrap().to_owned();
        browser.navigate(&format!("http://{gateway}{link}")).await;
        let pod = format!("{workspace}-ws");
        browser
            .until(
                &format!("{workspace}'s page on its own host"),
                &format!(
                    "location.host === '{}' && document.body.innerText.includes('{pod}')",
                    host_of(workspace)
                ),
            )
            .await;
    }
    let socket = |url: String| {
        format!(
            "new Promise((done) => {{
                const socket = new WebSocket('{url}');
                socket.onopen = () => socket.send('hello');
                socket.onmessage = (m) => {{ done('open: ' + m.data); socket.close(); }};
                socket.onerror = () => done('refused');
            }})"
        )
    };
    // web's own page reaches its own WebSocket.
    let own = browser
        .eval(&socket(format!("ws://{}/echo", host_of("web"))))
        .await;
    assert_eq!(own, json!("open: hello"));
    browser.call("Network.enable", json!({})).await;
    // web's page tries carol's session for bob: a WebSocket, and a fetch with her cookie.
    let stolen = browser
        .eval(&socket(format!("ws://{}/echo", host_of("bob"))))
        .await;
    assert_eq!(
        stolen,
        json!("refused"),
        "a WebSocket from web's page to bob's host"
    );
    let bob_page = format!("http://{}/from-web", host_of("bob"));
    let read = browser
        .eval(&format!(
            "fetch('{bob_page}', {{credentials: 'include'}}).then(r => r.text()).catch(e => 'unreadable')"
        ))
        .await;
    assert_eq!(read, json!("unreadable"));
    // The page cannot read the answer either way; the browser shows what the gateway said.
    browser.eval("true").await;
    let asked: Vec<&Value> = browser
        .events
        .iter()
        .filter(|e| {
            e["method"] == "Network.requestWillBeSent"
                && e["params"]["request"]["url"] == json!(bob_page)
        })
        .map(|e| &e["params"]["requestId"])
        .collect();
    assert_eq!(asked.len(), 1, "one request for bob's page");
    let answered: Vec<&Value> = browser
        .events
        .iter()
        .filter(|e| {
            e["method"] == "Network.responseReceivedExtraInfo"
                && &e["params"]["requestId"] == asked[0]
        })
        .map(|e| &e["params"]["statusCode"])
        .collect();
    assert_eq!(
        answered,
        [&json!(403)],
        "the gateway refused the fetch that carried carol's cookie for bob"
    );
    // bob's own page is unaffected.
    browser
        .navigate(&format!("http://{}/", host_of("bob")))
        .await;
    browser
        .until("bob's page", "document.body.innerText.includes('bob-ws')")
        .await;
    let own = browser
        .eval(&socket(format!("ws://{}/echo", host_of("bob"))))
        .await;
    assert_eq!(own, json!("open: hello"));
    // The path route takes no browser session where hosts are configured.
    browser
        .navigate(&format!("http://{gateway}/w/default/bob/http/"))
        .await;
    browser
        .until(
            "the path route's sign-in page",
            "document.querySelector('h1') && document.querySelector('h1').innerText === 'Sign in to reach this workspace'",
        )
        .await;
    let text = browser.eval("document.body.innerText").await;
    assert!(
        text.as_str().unwrap().contains(&format!(
            "This gateway keeps a browser's session on each workspace's own host: {}.",
            host_of("bob")
        )),
        "{text}"
    );
}

/// A `berth shell` through the gateway, as the CLI speaks it: the start, then what comes back
/// (stdout, stderr, how it ended); or the gateway's refusal (status and page).
async fn shell(
    gateway: SocketAddr,
    workspace: &str,
    headers: &[(&str, &str)],
    start: berth_gateway::shell::Start,
) -> Result<(String, String, berth_gateway::shell::Ended), (StatusCode, String)> {
    use tokio_tungstenite::tungstenite::Message;
    let mut socket = open_shell(gateway, workspace, headers).await?;
    socket
        .send(Message::text(serde_json::to_string(&start).unwrap()))
        .await
        .unwrap();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("the shell ends")
            .expect("the gateway says how it ended")
            .unwrap();
        match message {
            Message::Binary(bytes) => match bytes.split_first() {
                Some((&berth_gateway::shell::STDOUT, data)) => stdout.extend_from_slice(data),
                Some((&berth_gateway::shell::STDERR, data)) => stderr.extend_from_slice(data),
                other => panic!("a frame of no stream: {other:?}"),
            },
            Message::Text(text) => {
                let ended = serde_json::from_str(&text).unwrap();
                let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                return Ok((text(stdout), text(stderr), ended));
            }
            other => panic!("the gateway ended without saying how: {other:?}"),
        }
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The shell's WebSocket, or the gateway's refusal (status and page).
async fn open_shell(
    gateway: SocketAddr,
    workspace: &str,
    headers: &[(&str, &str)],
) -> Result<Socket, (StatusCode, String)> {
    use tokio_tungstenite::tungstenite::{Error, client::IntoClientRequest};
    let mut request = format!("ws://{gateway}/w/default/{workspace}/.berth/shell")
        .into_client_request()
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(Error::Http(response)) => Err((
            response.status(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("the gateway answers: {e}"),
    }
}

/// What a developer sees of `berth shell`: allowed into the workspace, a command in its
/// container with its output (stdout and stderr apart) and its exit code; without the rule,
/// 403 naming it; a browser session opens no shell (401 saying why); a workspace that runs
/// its image's entrypoint says why it has no shell. An open shell is use: the workspace
/// outlives its idle timeout while one is open, and is stopped once it ended. Removing the
/// person's Role ends their open shell (saying why), WebSocket and tunnel.
#[tokio::test]
async fn a_shell_through_the_gateway_is_for_a_caller_allowed_in_and_is_use_while_open() {
    use berth_gateway::shell::{Ended, Start};
    let sim = berth_sim::SimConfig {
        runtime: std::sync::Arc::new(
            berth_agent::sim_runtime::AgentRuntime::default().with_host_shells(),
        ),
        ..berth_sim::SimConfig::fast()
    };
    let h = Harness::start_with(sim, test_config()).await;
    let config = berth_gateway::Config {
        service_account: Some(("berth-system".to_owned(), "berth-gateway".to_owned())),
        review_ttl: Duration::from_millis(200),
        ..Default::default()
    };
    let gateway = gateway_with(&h, config).await;
    let alice = developer(&h, "alice", &["ide", "plain", "other"]).await;
    let bob = developer(&h, "bob", &[]).await;
    const TIMEOUT: Duration = Duration::from_secs(3);
    h.create(
        "ide",
        json!({"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}],
               "lifecycle": {"idleTimeout": "3s"}}),
    )
    .await;
    h.create("plain", json!({"image": "devbox:1"})).await;
    served(&h, "other").await;
    h.until_phase("ide", Phase::Running).await;
    h.until_phase("plain", Phase::Running).await;
    let as_alice = format!("Bearer {alice}");
    let command = |script: &str| Start {
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };

    let ran = shell(
        gateway,
        "ide",
        &[("authorization", &as_alice)],
        command("echo hi; echo oops >&2; exit 4"),
    )
    .await
    .unwrap();
    assert_eq!(
        ran,
        ("hi\n".into(), "oops\n".into(), Ended::Exit { code: 4 })
    );

    let (status, page) = shell(
        gateway,
        "ide",
        &[("authorization", &format!("Bearer {bob}"))],
        command("true"),
    )
    .await
    .unwrap_err();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(page.contains("workspaces/connect"), "{page}");

    let (status, page) = shell(
        gateway,
        "ide",
        &[("cookie", "berth_session=anything")],
        command("true"),
    )
    .await
    .unwrap_err();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(page.contains("a browser session opens none"), "{page}");

    let (_, _, ended) = shell(
        gateway,
        "plain",
        &[("authorization", &as_alice)],
        command("true"),
    )
    .await
    .unwrap();
    assert_eq!(
        ended,
        Ended::Error {
            message: format!("the agent said: {}", berth_agent::shell::BESIDE_ENTRYPOINT)
        }
    );

    // A shell left open (a person reading a log) keeps the workspace.
    let mut open = open_shell(gateway, "ide", &[("authorization", &as_alice)])
        .await
        .unwrap();
    open.send(tokio_tungstenite::tungstenite::Message::text(
        serde_json::to_string(&command("echo started; sleep 60")).unwrap(),
    ))
    .await
    .unwrap();
    assert!(open.next().await.unwrap().is_ok(), "the shell started");
    three_idle_timeouts(&h, TIMEOUT).await;
    let ws = h.workspaces().get("ide").await.unwrap();
    assert_eq!(phase_of(&ws), Some(Phase::Running), "{}", message_of(&ws));
    let status = ws.status.unwrap();
    assert_eq!(status.last_activity_signal.as_deref(), Some("Shell"));
    assert_eq!(h.metric("berth_workspaces_culled_total"), 0);

    drop(open);
    h.until(
        "ide",
        "the workspace to be culled once its shell ended",
        |ws| condition(ws, "Ready").is_some_and(|c| c.status == "False" && c.reason == "Idle"),
    )
    .await;

    // Alice's way in is taken away while she is inside: her shell, her WebSocket to the
    // workspace's port and her tunnel end within the review TTL.
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let mut shell_open = open_shell(gateway, "other", &[("authorization", &as_alice)])
        .await
        .unwrap();
    shell_open
        .send(Message::text(
            serde_json::to_string(&command("echo started; sleep 60")).unwrap(),
        ))
        .await
        .unwrap();
    assert!(
        shell_open.next().await.unwrap().is_ok(),
        "the shell started"
    );
    let connect = |path: &str| {
        let mut request = format!("ws://{gateway}/w/default/other/{path}")
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", as_alice.parse().unwrap());
        tokio_tungstenite::connect_async(request)
    };
    let (mut echo, _) = connect("http/echo").await.unwrap();
    echo.send(Message::text("hello")).await.unwrap();
    assert_eq!(echo.next().await.unwrap().unwrap(), Message::text("hello"));
    let (mut tunnel, _) = connect(".berth/tcp/http").await.unwrap();
    k8s_delete::<k8s_openapi::api::rbac::v1::RoleBinding>(&h, "alice-workspaces").await;
    let ended = loop {
        match tokio::time::timeout(WAIT, shell_open.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => break text.to_string(),
            Ok(Some(Ok(_))) => {}
            other => panic!("the shell ends saying why: {other:?}"),
        }
    };
    assert_eq!(
        serde_json::from_str::<Ended>(&ended).unwrap(),
        Ended::Error {
            message: "system:serviceaccount:default:alice may no longer connect to workspace default/other".into()
        }
    );
    for (what, socket) in [("WebSocket", &mut echo), ("tunnel", &mut tunnel)] {
        let closed = tokio::time::timeout(WAIT, async {
            while let Some(Ok(message)) = socket.next().await {
                if let Message::Close(_) = message {
                    break;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the {what} outlived alice's Role");
    }
}

/// Deletes the namespaced object `name` of `default`.
async fn k8s_delete<K>(h: &Harness, name: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    kube::Api::<K>::namespaced(h.client.clone(), "default")
        .delete(name, &Default::default())
        .await
        .unwrap();
}

/// Where agents serve TLS, the gateway verifies the agent it opens a shell on against its CA
/// (`--agent-tls-ca`); without one it says so instead of speaking plaintext or trusting any
/// certificate. A gateway without a service account says it opens no shells.
#[tokio::test]
async fn over_tls_a_shell_needs_the_gateway_to_verify_the_agent() {
    use berth_gateway::shell::{Ended, Start};
    let authority = berth_sim::Authority::generate().unwrap();
    let (_, _, cert_pem, key_pem) = authority.issue(&[berth_agent::TLS_SERVER_NAME]).unwrap();
    let ca_pem = authority.ca_pem().as_bytes().to_vec();
    let mut operator = test_config();
    operator.agent.tls = Some(berth_controller::config::AgentTls {
        secret: "berth-agent-tls".into(),
        ca_pem: ca_pem.clone(),
    });
    let sim = berth_sim::SimConfig {
        runtime: std::sync::Arc::new(
            berth_agent::sim_runtime::AgentRuntime::default().with_host_shells(),
        ),
        ..berth_sim::SimConfig::fast()
    };
    let h = Harness::start_with(sim, operator).await;
    let manifest = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: berth-agent-tls, namespace: default}}\ntype: kubernetes.io/tls\nstringData: {}\n",
        json!({"tls.crt": cert_pem, "tls.key": key_pem})
    );
    berth_sim::manifests::create_all(&h.client, &manifest, "default")
        .await
        .unwrap();
    let with_ca = berth_gateway::Config {
        service_account: Some(("berth-system".to_owned(), "berth-gateway".to_owned())),
        agent_tls_ca: Some(ca_pem),
        ..Default::default()
    };
    let verifying = gateway_with(&h, with_ca.clone()).await;
    let without_ca = replica(
        &h,
        berth_gateway::Config {
            agent_tls_ca: None,
            ..with_ca
        },
    )
    .await;
    let alice = developer(&h, "alice", &["ide"]).await;
    served(&h, "ide").await;
    let as_alice = [("authorization", format!("Bearer {alice}"))];
    let headers: Vec<(&str, &str)> = as_alice.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let start = Start {
        command: vec!["sh".into(), "-c".into(), "echo over-tls".into()],
        ..Default::default()
    };

    let ran = shell(verifying, "ide", &headers, start.clone())
        .await
        .unwrap();
    assert_eq!(
        ran,
        ("over-tls\n".into(), String::new(), Ended::Exit { code: 0 })
    );

    let (status, page) = shell(without_ca, "ide", &headers, start.clone())
        .await
        .unwrap_err();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        page.contains("The agent serves TLS and this gateway has no CA to verify it (berth gateway --agent-tls-ca)."),
        "{page}"
    );

    // A gateway without a service account of its own has no token an agent would take.
    let anonymous = replica(&h, berth_gateway::Config::default()).await;
    let (status, page) = shell(anonymous, "ide", &headers, start).await.unwrap_err();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.contains("This gateway opens no shells"), "{page}");
}
