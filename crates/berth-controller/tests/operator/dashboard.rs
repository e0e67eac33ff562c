//! The gateway's dashboard in a real browser (headless Chromium over the DevTools protocol):
//! a person signs in with the link `berth dashboard` prints, sees their workspaces follow the
//! cluster without a reload, spawns one from a kind they may use (its options as the kind
//! offers them), stops it, reads its events; someone allowed less is refused in the API
//! server's words; a page of another origin cannot use the session.

use std::time::Duration;

use berth_api::Workspace;
use http::StatusCode;
use kube::Api;
use serde_json::json;

use crate::{
    gateway::{Browser, call, gateway_with, served},
    support::*,
};

const DOMAIN: &str = "dash.example.com";

/// Kinds: `python` (alice may use it; an image option that redirects, a hidden one, two pod
/// options), `gpu` (shown to no one here: nobody may use it), `internal` (hidden).
fn kinds() -> String {
    let kind = |name: &str, display: &str, hidden: bool| {
        json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
            "metadata": {"name": name},
            "spec": {
                "spawner": {"displayName": display, "description": format!("{display} with a home"), "hidden": hidden,
                            "icon": "data:image/svg+xml;base64,PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciLz4="},
                "options": {
                    "image": {"default": "py312", "values": [
                        {"id": "py311", "displayName": "Python 3.11", "redirect": {"to": "py312", "message": "3.11 is end of life"},
                         "spec": {"image": "devbox:1.4", "ports": [{"name": "http", "port": 8080}]}},
                        {"id": "py312", "displayName": "Python 3.12", "spec": {"image": "devbox:1.5", "ports": [{"name": "http", "port": 8080}]}},
                        {"id": "py313", "displayName": "Python 3.13 preview", "hidden": true, "spec": {"image": "devbox:1.6"}}
                    ]},
                    "pod": {"default": "small", "values": [
                        {"id": "small", "displayName": "Small", "spec": {"resources": {"requests": {"cpu": "100m"}}}},
                        {"id": "large", "displayName": "Large", "spec": {"resources": {"requests": {"cpu": "500m"}}}}
                    ]}
                },
                "home": {"mountPath": "/home/dev", "size": "1Gi"}
            }
        })
        .to_string()
    };
    [
        kind("python", "Python", false),
        kind("gpu", "GPU notebook", false),
        kind("internal", "Internal", true),
    ]
    .join("\n---\n")
}

/// A person: a service account of `default` with `verbs` on workspaces there (and reading
/// events), `connect`, and `use` on the kind `python` when `spawns`; their token.
async fn person(h: &Harness, name: &str, verbs: &[&str], spawns: bool) -> String {
    let verbs = serde_json::to_string(verbs).unwrap();
    let mut rules = format!(
        r#"[{{"apiGroups": ["berth.dev"], "resources": ["workspaces"], "verbs": {verbs}}},
           {{"apiGroups": ["berth.dev"], "resources": ["workspaces/connect"], "verbs": ["create"]}},
           {{"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}}"#
    );
    if spawns {
        rules.push_str(r#", {"apiGroups": ["berth.dev"], "resources": ["workspacekinds"], "resourceNames": ["python", "internal"], "verbs": ["use"]}"#);
    }
    let manifest = format!(
        r#"{{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {{"name": "{name}", "namespace": "default"}}}}
---
{{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {{"name": "{name}", "namespace": "default"}}, "rules": {rules}]}}
---
{{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {{"name": "{name}", "namespace": "default"}},
  "roleRef": {{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "{name}"}},
  "subjects": [{{"kind": "ServiceAccount", "name": "{name}", "namespace": "default"}}]}}"#
    );
    berth_sim::manifests::create_all(&h.client, &manifest, "default")
        .await
        .unwrap();
    h.sim
        .issue_token("default", name, &[], Duration::from_secs(3600))
        .unwrap()
}

/// The login link `berth dashboard` prints for the holder of `token`.
async fn dashboard_link(gateway: std::net::SocketAddr, token: &str) -> String {
    let minted = call(
        gateway,
        http::Method::POST,
        "/.berth/tickets?dashboard",
        &[("authorization", &format!("Bearer {token}"))],
        "",
    )
    .await;
    assert_eq!(minted.status, StatusCode::OK, "{}", minted.text());
    let ticket: berth_gateway::Ticket = serde_json::from_slice(&minted.body).unwrap();
    assert!(
        ticket.path.starts_with("/.berth/login?ticket="),
        "{ticket:?}"
    );
    format!("http://{}{}", ticket.host.unwrap(), ticket.path)
}

/// What the person sees: alice signs in and finds `web` Running; the spawner offers Python
/// (not the kind she may not use, not the hidden one) with its visible image options, the
/// redirect said, and its sizes; she creates `mine` (Large), which appears and turns Running
/// in the open table (no reload), owned by her; Stop stops it; its page shows its events; a
/// name already taken is refused in the API server's words with her form kept. Bob, who may
/// only read, is refused Stop in the API server's words and offered no kind. A request with
/// the session from a page of another origin is refused.
#[tokio::test]
async fn a_person_signs_in_spawns_from_a_kind_watches_it_start_and_stops_it() {
    let Some(mut browser) = Browser::start_with(&[&format!(
        "--host-resolver-rules=MAP {DOMAIN} 127.0.0.1, MAP *.{DOMAIN} 127.0.0.1"
    )])
    .await
    else {
        return;
    };
    let h = Harness::start().await;
    let config = berth_gateway::Config {
        base_domain: Some(DOMAIN.to_owned()),
        review_ttl: Duration::from_millis(500),
        ..Default::default()
    };
    let gateway = gateway_with(&h, config).await;
    berth_sim::manifests::create_all(&h.client, berth_gateway::DASHBOARD_RBAC, "default")
        .await
        .unwrap();
    berth_sim::manifests::create_all(&h.client, &kinds(), "default")
        .await
        .unwrap();
    served(&h, "web").await;
    let all = ["get", "list", "watch", "create", "patch", "delete"];
    let alice = person(&h, "alice", &all, true).await;
    let bob = person(&h, "bob", &["get", "list", "watch"], false).await;
    let site = format!("http://{DOMAIN}:{}", gateway.port());

    // Signed in: the list.
    browser
        .navigate(&dashboard_link(gateway, &alice).await)
        .await;
    browser
        .until(
            "web in the list",
            r#"document.querySelector('tr[data-workspace="default/web"] .phase')"#,
        )
        .await;
    assert_eq!(
        browser
            .eval(r#"document.querySelector('tr[data-workspace="default/web"] .phase').innerText"#)
            .await,
        json!("Running")
    );
    assert!(
        browser
            .eval("document.querySelector('header').innerText")
            .await
            .as_str()
            .unwrap()
            .contains("Signed in as system:serviceaccount:default:alice")
    );

    // The spawner: kinds she may use, then the kind's options.
    browser
        .eval(r#"document.querySelector('nav a[href="/new"]').click()"#)
        .await;
    browser
        .until("the kinds", "document.querySelector('ul.kinds')")
        .await;
    let offered = browser
        .eval("document.querySelector('main').innerText")
        .await;
    let offered = offered.as_str().unwrap();
    assert!(offered.contains("Python"), "{offered}");
    assert!(
        !offered.contains("GPU notebook"),
        "not hers to use: {offered}"
    );
    assert!(!offered.contains("Internal"), "hidden: {offered}");
    browser
        .eval(r#"document.querySelector('a[href="/new?kind=python"]').click()"#)
        .await;
    browser
        .until("the form", "document.querySelector('form.spawn')")
        .await;
    let options = |select: &str| {
        format!("[...document.querySelectorAll('#{select} option')].map(o => o.textContent)")
    };
    assert_eq!(
        browser.eval(&options("image")).await,
        json!([
            "Python 3.11 (starts as Python 3.12: 3.11 is end of life)",
            "Python 3.12"
        ])
    );
    assert_eq!(
        browser.eval(&options("pod")).await,
        json!(["Small", "Large"])
    );
    assert_eq!(
        browser.eval("document.querySelector('#image').value").await,
        json!("py312"),
        "the kind's default is chosen"
    );
    assert_eq!(
        browser
            .eval("document.querySelector('label[for=name]').textContent")
            .await,
        json!("Name"),
        "every field has its label"
    );
    assert_eq!(
        browser
            .eval("document.querySelector('#namespace').value")
            .await,
        json!("default")
    );
    browser
        .eval(
            "document.querySelector('#name').value = 'mine';
             document.querySelector('#pod').value = 'large';
             document.querySelector('form.spawn').requestSubmit()",
        )
        .await;

    // It appears, and turns Running in the open table.
    browser
        .until(
            "mine in the list",
            r#"document.querySelector('tr[data-workspace="default/mine"]')"#,
        )
        .await;
    browser.eval("window.sameDocument = true").await;
    browser
        .until(
            "mine Running without a reload",
            r#"window.sameDocument && document.querySelector('tr[data-workspace="default/mine"] .phase').innerText === 'Running'"#,
        )
        .await;
    let mine = Api::<Workspace>::namespaced(h.client.clone(), "default")
        .get("mine")
        .await
        .unwrap();
    assert_eq!(
        mine.metadata.annotations.unwrap()["berth.dev/owner"],
        "system:serviceaccount:default:alice"
    );
    assert_eq!(mine.spec.kind.as_deref(), Some("python"));
    assert_eq!(
        mine.spec.options.unwrap().pod.as_deref(),
        Some("large"),
        "the size she picked"
    );

    // Stop, by keyboard-reachable button, as her.
    browser
        .eval(r#"document.querySelector('button[aria-label="Stop default/mine"]').click()"#)
        .await;
    browser
        .until(
            "mine Stopped",
            r#"document.querySelector('tr[data-workspace="default/mine"] .phase')?.innerText === 'Stopped'"#,
        )
        .await;
    h.until_phase("mine", berth_api::Phase::Stopped).await;

    // Its page: its events.
    browser
        .navigate(&format!("{site}/workspaces/default/mine"))
        .await;
    browser
        .until(
            "its events",
            "document.querySelectorAll('ul.events li').length > 0",
        )
        .await;

    // A name that is taken: the API server's words, her form kept.
    browser.navigate(&format!("{site}/new?kind=python")).await;
    browser
        .until("the form", "document.querySelector('form.spawn')")
        .await;
    browser
        .eval("document.querySelector('#name').value = 'web'; document.querySelector('form.spawn').requestSubmit()")
        .await;
    browser
        .until("the refusal", "document.querySelector('[role=alert]')")
        .await;
    let refusal = browser
        .eval("document.querySelector('[role=alert]').innerText")
        .await;
    assert!(
        refusal.as_str().unwrap().contains(
            r#"The API server refused to create it: workspaces.berth.dev "web" already exists"#
        ),
        "{refusal}"
    );
    assert_eq!(
        browser.eval("document.querySelector('#name').value").await,
        json!("web")
    );

    // Delete, from its page, once she ticks that the home goes too.
    browser
        .navigate(&format!("{site}/workspaces/default/mine"))
        .await;
    browser
        .until("its page", "document.querySelector('input[name=sure]')")
        .await;
    browser
        .eval(
            "document.querySelector('input[name=sure]').checked = true;
             document.querySelector('input[name=sure]').form.requestSubmit()",
        )
        .await;
    browser
        .until(
            "mine gone from the list",
            r#"document.querySelector('tbody[data-live]') && !document.querySelector('tr[data-workspace="default/mine"]')"#,
        )
        .await;
    eventually(Duration::from_secs(30), "mine deleted", || async {
        h.workspaces()
            .get_opt("mine")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // The session is the dashboard's: a request from a workspace's page is refused.
    let cookies = browser
        .call("Network.getCookies", json!({"urls": [site]}))
        .await;
    let cookie = cookies["cookies"][0]["value"].as_str().unwrap().to_owned();
    assert_eq!(cookies["cookies"][0]["httpOnly"], json!(true));
    let host = format!("{DOMAIN}:{}", gateway.port());
    let from_a_workspace = call(
        gateway,
        http::Method::GET,
        "/.berth/live",
        &[
            ("host", &host),
            ("cookie", &format!("berth_session={cookie}")),
            ("sec-fetch-site", "same-site"),
            ("sec-fetch-mode", "cors"),
            ("sec-fetch-dest", "empty"),
        ],
        "",
    )
    .await;
    assert_eq!(from_a_workspace.status, StatusCode::FORBIDDEN);
    from_a_workspace.says("Not from this dashboard");
    let unsigned = call(gateway, http::Method::GET, "/", &[("host", &host)], "").await;
    assert_eq!(unsigned.status, StatusCode::UNAUTHORIZED);
    unsigned.says("berth dashboard");

    // Bob may read, not stop, and may use no kind.
    browser.navigate(&dashboard_link(gateway, &bob).await).await;
    browser
        .until(
            "bob's list",
            r#"document.querySelector('button[aria-label="Stop default/web"]')"#,
        )
        .await;
    browser
        .eval(r#"document.querySelector('button[aria-label="Stop default/web"]').click()"#)
        .await;
    browser
        .until("the refusal", "document.querySelector('[role=alert]')")
        .await;
    let refused = browser
        .eval("document.querySelector('main').innerText")
        .await;
    let refused = refused.as_str().unwrap();
    assert!(
        refused.contains("Cannot stop workspace default/web"),
        "{refused}"
    );
    assert!(
        refused.contains(r#"User "system:serviceaccount:default:bob" cannot patch resource "workspaces" in API group "berth.dev""#),
        "{refused}"
    );
    assert!(
        !h.workspaces().get("web").await.unwrap().spec.paused,
        "web still runs"
    );
    browser.navigate(&format!("{site}/new")).await;
    browser
        .until("the spawner", "document.querySelector('main p')")
        .await;
    let none = browser
        .eval("document.querySelector('main').innerText")
        .await;
    assert!(
        none.as_str()
            .unwrap()
            .contains("There is no kind you may use"),
        "{none}"
    );
}
