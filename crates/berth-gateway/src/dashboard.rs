//! The dashboard: a signed-in person's workspaces and a spawner, at the root of the gateway's
//! base domain (`https://<domain>/`), an origin apart from every workspace's
//! (`<port>--<workspace>--<namespace>.<domain>`) and from the path route, so no workspace's
//! page can read it or use its session. Everything it shows and does is what the person may:
//! it lists workspaces in namespaces where SubjectAccessReview says they may `list` them,
//! offers kinds they may `use`, and makes every change (create, start, stop, delete) as them,
//! by impersonation, so the API server's RBAC and admission policies judge the person, not the
//! gateway, and their words reach the page. Pages are the gateway's own HTML, a stylesheet and
//! a few lines of script (no framework, nothing from another site); without script everything
//! but the live table works.

use std::{collections::BTreeSet, fmt::Write as _, sync::Arc};

use axum::{
    body::Body,
    extract::Request,
    response::{IntoResponse, Response},
};
use berth_api::{Phase, Workspace, WorkspaceKind};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use k8s_openapi::api::core::v1::Event;
use kube::{Resource, ResourceExt};

use crate::{
    Gateway,
    access::{Refusal, User},
    api_words, now,
    pages::{Page, escape},
    route, session,
};

/// The stylesheet and the script, served by the dashboard itself.
const STYLE: &str = include_str!("dashboard.css");
const SCRIPT: &str = include_str!("dashboard.js");

/// How often an open dashboard's table is compared with the gateway's cache of workspaces
/// (itself kept by a watch), and sent again when it changed.
pub const LIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How many quiet looks at the table pass before the live stream sends a comment, so that a
/// proxy that closes idle streams keeps it.
const KEEPALIVE_TICKS: u32 = 15;

/// Whether `host` (a request's `Host`) is the dashboard's: the gateway's base domain itself.
pub fn is_dashboard_host(host: Option<&str>, domain: Option<&str>) -> bool {
    let (Some(host), Some(domain)) = (host, domain) else {
        return false;
    };
    let host = host
        .rsplit_once(':')
        .filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(h, _)| h);
    host.eq_ignore_ascii_case(domain.trim_start_matches('.'))
}

/// One row of the table of workspaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub namespace: String,
    pub name: String,
    pub kind: String,
    pub phase: String,
    pub message: String,
    pub last_active: String,
    pub paused: bool,
    pub ports: Vec<String>,
}

/// The row of `ws`.
pub fn row(ws: &Workspace) -> Row {
    let status = ws.status.as_ref();
    let kind = match &ws.spec.kind {
        Some(kind) => {
            let options = ws.spec.options.as_ref();
            let picked: Vec<&str> = [
                options.and_then(|o| o.image.as_deref()),
                options.and_then(|o| o.pod.as_deref()),
            ]
            .into_iter()
            .flatten()
            .collect();
            match picked.is_empty() {
                true => kind.clone(),
                false => format!("{kind} ({})", picked.join(", ")),
            }
        }
        None => ws.spec.image.clone(),
    };
    let ports = match status.and_then(|s| s.resolved.as_ref()) {
        Some(record) => record.apply(&ws.spec).ports,
        None => ws.spec.ports.clone(),
    };
    Row {
        namespace: ws.namespace().unwrap_or_default(),
        name: ws.name_any(),
        kind,
        phase: status
            .and_then(|s| s.phase)
            .map(|p| p.to_string())
            .unwrap_or_else(|| "Pending".to_owned()),
        message: status.and_then(|s| s.message.clone()).unwrap_or_default(),
        last_active: status
            .and_then(|s| s.last_activity.as_ref())
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        paused: ws.spec.paused,
        ports: ports.into_iter().map(|p| p.name).collect(),
    }
}

/// The table's body for `rows`, with buttons carrying `csrf`.
pub fn table_body(rows: &[Row], csrf: &str) -> String {
    let mut html = String::new();
    if rows.is_empty() {
        html.push_str(
            "<tr><td colspan=\"7\">No workspaces you may list yet. <a href=\"/new\">Create one</a>.</td></tr>\n",
        );
    }
    for r in rows {
        let id = format!("{}/{}", r.namespace, r.name);
        let hidden = |action: &str| {
            format!(
                "<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"namespace\" value=\"{}\"><input type=\"hidden\" name=\"name\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"{action}\">",
                escape(csrf),
                escape(&r.namespace),
                escape(&r.name)
            )
        };
        let switch = match r.paused {
            true => ("start", "Start"),
            false => ("stop", "Stop"),
        };
        let mut ports = String::new();
        for port in &r.ports {
            let _ = write!(
                ports,
                "<form method=\"post\" action=\"/.berth/open\">{}<input type=\"hidden\" name=\"port\" value=\"{}\"><button type=\"submit\" aria-label=\"Open port {} of {}\">{}</button></form>",
                hidden("open"),
                escape(port),
                escape(port),
                escape(&id),
                escape(port)
            );
        }
        let _ = writeln!(
            html,
            "<tr data-workspace=\"{id_attr}\"><td data-label=\"Workspace\"><a href=\"/workspaces/{ns}/{name}\">{id_text}</a></td><td data-label=\"Kind\">{kind}</td><td data-label=\"Phase\" class=\"phase phase-{phase_class}\">{phase}</td><td data-label=\"Message\">{message}</td><td data-label=\"Last active\">{active}</td><td data-label=\"Ports\">{ports}</td><td data-label=\"Actions\"><form method=\"post\" action=\"/.berth/act\">{switch_fields}<button type=\"submit\" aria-label=\"{switch_label} {id_text}\">{switch_label}</button></form></td></tr>",
            id_attr = escape(&id),
            ns = escape(&r.namespace),
            name = escape(&r.name),
            id_text = escape(&id),
            kind = escape(&r.kind),
            phase_class = escape(&r.phase.to_ascii_lowercase()),
            phase = escape(&r.phase),
            message = escape(&r.message),
            active = escape(&r.last_active),
            switch_fields = hidden(switch.0),
            switch_label = switch.1,
        );
    }
    html
}

/// A whole dashboard page: `title`, the signed-in `user`, and `body` (HTML).
fn layout(status: StatusCode, title: &str, user: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title} · Berth</title><link rel=\"stylesheet\" href=\"/.berth/dashboard.css\"><script src=\"/.berth/dashboard.js\" defer></script></head>\n<body><header><nav aria-label=\"Berth\"><a href=\"/\">Workspaces</a> <a href=\"/new\">New workspace</a></nav><p class=\"user\">Signed in as {user}</p></header>\n<main><h1>{title}</h1>\n{body}</main></body></html>\n",
        title = escape(title),
        user = escape(user),
    );
    let mut response = (status, html).into_response();
    secure_headers(response.headers_mut(), "text/html; charset=utf-8");
    response
}

/// What every dashboard answer carries: never cached, never framed, no script or style but
/// its own, no image but its own and inline kind icons.
fn secure_headers(headers: &mut HeaderMap, content_type: &'static str) {
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self' http: https:; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert("x-berth-gateway", HeaderValue::from_static("1"));
}

/// A page that says something went wrong (or was refused), in the API server's words.
fn said(status: StatusCode, title: &str, user: &str, lines: &[String]) -> Response {
    let body: String = lines
        .iter()
        .map(|l| format!("<p class=\"said\" role=\"alert\">{}</p>\n", escape(l)))
        .chain(std::iter::once(
            "<p><a href=\"/\">Back to your workspaces</a></p>\n".to_owned(),
        ))
        .collect();
    layout(status, title, user, &body)
}

/// What a person asks the spawner for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spawn {
    pub namespace: String,
    pub name: String,
    pub kind: String,
    pub image: String,
    pub pod: String,
    pub git_url: String,
    pub git_ref: String,
}

impl Spawn {
    fn from_form(body: &[u8]) -> Spawn {
        let value = |name: &str| {
            route::form_value(body, name)
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        Spawn {
            namespace: value("namespace"),
            name: value("name"),
            kind: value("kind"),
            image: value("image"),
            pod: value("pod"),
            git_url: value("gitUrl"),
            git_ref: value("gitRef"),
        }
    }

    /// The Workspace it asks for, owned by `user` (the annotation the per-owner policy reads).
    pub fn workspace(&self, user: &str) -> Result<Workspace, String> {
        let mut spec = serde_json::json!({"kind": self.kind});
        let mut options = serde_json::Map::new();
        if !self.image.is_empty() {
            options.insert("image".into(), self.image.clone().into());
        }
        if !self.pod.is_empty() {
            options.insert("pod".into(), self.pod.clone().into());
        }
        if !options.is_empty() {
            spec["options"] = options.into();
        }
        if !self.git_url.is_empty() {
            let mut git = serde_json::json!({"url": self.git_url});
            if !self.git_ref.is_empty() {
                git["ref"] = self.git_ref.clone().into();
            }
            spec["content"] = serde_json::json!({"git": git});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "berth.dev/v1alpha1",
            "kind": "Workspace",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "annotations": {berth_api::labels::OWNER: user},
                // Its operator shard's bucket, so the sharder has nothing to write.
                "labels": {berth_api::labels::SHARD: berth_core::shard::label_value(&self.namespace)},
            },
            "spec": spec,
        }))
        .map_err(|e| format!("not a workspace: {e}"))
    }
}

/// The spawner's first step: the kinds `kinds` (those the person may use, not hidden), each a
/// link to its form.
pub fn kind_list(kinds: &[Arc<WorkspaceKind>]) -> String {
    if kinds.is_empty() {
        return "<p>There is no kind you may use. A platform admin grants the verb <code>use</code> on <code>workspacekinds</code> (API group berth.dev).</p>\n".to_owned();
    }
    let mut html = String::from("<ul class=\"kinds\">\n");
    for kind in kinds {
        let spawner = &kind.spec.spawner;
        let icon = match spawner.icon.is_empty() {
            true => String::new(),
            false => format!(
                "<img src=\"{}\" alt=\"\" width=\"32\" height=\"32\"> ",
                escape(&spawner.icon)
            ),
        };
        let deprecated = match spawner.deprecated {
            true => format!(
                "<p class=\"said\">Deprecated{}</p>",
                match spawner.deprecation_message.is_empty() {
                    true => String::new(),
                    false => format!(": {}", escape(&spawner.deprecation_message)),
                }
            ),
            false => String::new(),
        };
        let _ = writeln!(
            html,
            "<li><a href=\"/new?kind={name}\">{icon}<strong>{display}</strong></a><p>{description}</p>{deprecated}</li>",
            name = escape(&kind.name_any()),
            display = escape(&spawner.display_name),
            description = escape(&spawner.description),
        );
    }
    html.push_str("</ul>\n");
    html
}

/// The spawner's form for `kind`: its image and pod options (hidden ones left out, a redirect
/// said), a namespace, a name, content from git; `asked` fills it again after a refusal.
pub fn spawn_form(
    kind: &WorkspaceKind,
    namespaces: &[String],
    asked: &Spawn,
    csrf: &str,
) -> String {
    let mut html = String::new();
    let _ = writeln!(
        html,
        "<p>{}</p>\n<form method=\"post\" action=\"/new\" class=\"spawn\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"kind\" value=\"{}\">",
        escape(&kind.spec.spawner.description),
        escape(csrf),
        escape(&kind.name_any())
    );
    let _ = writeln!(
        html,
        "<label for=\"namespace\">Namespace</label><input id=\"namespace\" name=\"namespace\" required list=\"namespaces\" value=\"{}\" autocomplete=\"off\"><datalist id=\"namespaces\">{}</datalist>",
        escape(&asked.namespace),
        namespaces
            .iter()
            .map(|n| format!("<option value=\"{}\">", escape(n)))
            .collect::<String>()
    );
    let _ = writeln!(
        html,
        "<label for=\"name\">Name</label><input id=\"name\" name=\"name\" required maxlength=\"63\" pattern=\"[a-z0-9]([-a-z0-9]*[a-z0-9])?\" value=\"{}\" aria-describedby=\"name-help\" autocomplete=\"off\"><p id=\"name-help\" class=\"help\">Lower-case letters, digits and dashes.</p>",
        escape(&asked.name)
    );
    fn options<T: schemars::JsonSchema>(
        html: &mut String,
        id: &str,
        label: &str,
        list: &berth_api::kind::OptionList<T>,
        asked: &str,
    ) {
        let visible: Vec<_> = list.values.iter().filter(|o| !o.hidden).collect();
        if visible.is_empty() {
            return;
        }
        let chosen = match asked.is_empty() {
            true => list.default.as_str(),
            false => asked,
        };
        let _ = write!(
            html,
            "<label for=\"{id}\">{label}</label><select id=\"{id}\" name=\"{id}\">"
        );
        for option in visible {
            let redirect = option
                .redirect
                .as_ref()
                .map(|r| {
                    let to = list
                        .values
                        .iter()
                        .find(|o| o.id == r.to)
                        .map_or(r.to.as_str(), |o| o.display_name.as_str());
                    match r.message.is_empty() {
                        true => format!(" (starts as {to})"),
                        false => format!(" (starts as {to}: {})", r.message),
                    }
                })
                .unwrap_or_default();
            let display = match option.display_name.is_empty() {
                true => option.id.as_str(),
                false => option.display_name.as_str(),
            };
            let _ = write!(
                html,
                "<option value=\"{}\"{}>{}{}</option>",
                escape(&option.id),
                if option.id == chosen { " selected" } else { "" },
                escape(display),
                escape(&redirect)
            );
        }
        html.push_str("</select>\n");
    }
    options(
        &mut html,
        "image",
        "Image",
        &kind.spec.options.image,
        &asked.image,
    );
    options(&mut html, "pod", "Size", &kind.spec.options.pod, &asked.pod);
    let _ = writeln!(
        html,
        "<fieldset><legend>Content from git (optional)</legend><label for=\"gitUrl\">Repository</label><input id=\"gitUrl\" name=\"gitUrl\" type=\"text\" inputmode=\"url\" placeholder=\"https://github.com/org/repo.git\" value=\"{}\"><label for=\"gitRef\">Branch, tag or commit</label><input id=\"gitRef\" name=\"gitRef\" value=\"{}\"></fieldset>\n<button type=\"submit\">Create</button></form>",
        escape(&asked.git_url),
        escape(&asked.git_ref)
    );
    html
}

/// A workspace's own page: its status, why it is not Running, its events, its buttons.
fn detail(ws: &Workspace, events: Result<Vec<Event>, String>, csrf: &str) -> String {
    let r = row(ws);
    let mut html = String::new();
    let _ = writeln!(
        html,
        "<table class=\"live\"><tbody>{}</tbody></table>",
        table_body(std::slice::from_ref(&r), csrf)
    );
    if r.phase != Phase::Running.to_string() && !r.message.is_empty() {
        let _ = writeln!(
            html,
            "<p class=\"said\" role=\"status\">Why it is {}: {}</p>",
            escape(&r.phase),
            escape(&r.message)
        );
    }
    html.push_str("<h2>Conditions</h2><ul>");
    for c in ws.status.iter().flat_map(|s| s.conditions.iter()) {
        let _ = write!(
            html,
            "<li><strong>{}</strong> {} ({}): {}</li>",
            escape(&c.type_),
            escape(&c.status),
            escape(&c.reason),
            escape(&c.message)
        );
    }
    html.push_str("</ul>\n<h2>Events</h2>\n");
    match events {
        Ok(events) if events.is_empty() => html.push_str("<p>None.</p>\n"),
        Ok(mut events) => {
            events.sort_by_key(|e| {
                e.last_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .or(e.event_time.as_ref().map(|t| t.0))
            });
            html.push_str("<ul class=\"events\">");
            for e in events.iter().rev().take(50) {
                let _ = write!(
                    html,
                    "<li><strong>{}</strong> {}: {}</li>",
                    escape(e.type_.as_deref().unwrap_or_default()),
                    escape(e.reason.as_deref().unwrap_or_default()),
                    escape(e.message.as_deref().unwrap_or_default())
                );
            }
            html.push_str("</ul>\n");
        }
        Err(why) => {
            let _ = writeln!(html, "<p class=\"said\">{}</p>", escape(&why));
        }
    }
    let _ = writeln!(
        html,
        "<h2>Delete</h2><form method=\"post\" action=\"/.berth/act\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"namespace\" value=\"{}\"><input type=\"hidden\" name=\"name\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"delete\"><label><input type=\"checkbox\" name=\"sure\" value=\"yes\" required> Delete workspace {}/{} and its home</label> <button type=\"submit\">Delete</button></form>",
        escape(csrf),
        escape(&r.namespace),
        escape(&r.name),
        escape(&r.namespace),
        escape(&r.name)
    );
    html
}

/// A request of the API server made as `user` (impersonation): the API server authorizes
/// and admits it as theirs.
fn as_user(
    mut request: http::Request<Vec<u8>>,
    user: &User,
) -> Result<http::Request<Vec<u8>>, String> {
    let headers = request.headers_mut();
    let value = |v: &str| HeaderValue::from_str(v).map_err(|_| format!("{v:?} cannot be sent"));
    headers.insert("impersonate-user", value(&user.username)?);
    for group in &user.groups {
        headers.append("impersonate-group", value(group)?);
    }
    Ok(request)
}

impl Gateway {
    /// Every request on the dashboard's host.
    pub(crate) async fn dashboard(&self, request: Request) -> Response {
        let headers = request.headers().clone();
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let bare = path.split('?').next().unwrap_or("/").to_owned();
        let method = request.method().clone();
        match (method.clone(), bare.as_str()) {
            (http::Method::GET, "/.berth/dashboard.css") => return asset(STYLE, "text/css"),
            (http::Method::GET, "/.berth/dashboard.js") => {
                return asset(SCRIPT, "text/javascript");
            }
            (http::Method::GET, "/.berth/login") => {
                let secure = crate::secure(&request);
                return self.dashboard_login(&path, &headers, secure).await;
            }
            _ => {}
        }
        let session = match self.dashboard_session(&headers, &method).await {
            Ok(session) => session,
            Err(refused) => return refused,
        };
        let user = session.user.username.clone();
        let csrf = self.0.key.csrf(&session);
        if method == http::Method::POST {
            if !crate::same_origin(&headers) {
                return said(
                    StatusCode::FORBIDDEN,
                    "Not from this dashboard",
                    &user,
                    &[
                        "A form of the dashboard is sent from the dashboard's own pages only."
                            .to_owned(),
                    ],
                );
            }
            let body = match axum::body::to_bytes(request.into_body(), 64 * 1024).await {
                Ok(body) => body,
                Err(e) => {
                    return said(
                        StatusCode::BAD_REQUEST,
                        "Cannot read the form",
                        &user,
                        &[e.to_string()],
                    );
                }
            };
            if !self.0.key.csrf_matches(
                &session,
                &route::form_value(&body, "csrf").unwrap_or_default(),
            ) {
                return said(
                    StatusCode::FORBIDDEN,
                    "Not from this dashboard",
                    &user,
                    &["The form did not come from this dashboard in this session; load the page again.".to_owned()],
                );
            }
            return match bare.as_str() {
                "/.berth/act" => self.act(&session, &body).await,
                "/.berth/open" => self.open_port(&session, &body, &headers).await,
                "/new" => self.spawn(&session, &body, &csrf).await,
                _ => said(
                    StatusCode::NOT_FOUND,
                    "Not a page of the dashboard",
                    &user,
                    &[],
                ),
            };
        }
        if method != http::Method::GET && method != http::Method::HEAD {
            return said(
                StatusCode::METHOD_NOT_ALLOWED,
                "Not a page of the dashboard",
                &user,
                &[],
            );
        }
        match bare.as_str() {
            "/" => {
                let rows = self.rows_for(&session.user).await;
                let body = format!(
                    "<table class=\"live\" aria-live=\"polite\"><caption>Your workspaces: the table follows them as they change.</caption><thead><tr><th scope=\"col\">Workspace</th><th scope=\"col\">Kind</th><th scope=\"col\">Phase</th><th scope=\"col\">Message</th><th scope=\"col\">Last active</th><th scope=\"col\">Ports</th><th scope=\"col\">Actions</th></tr></thead><tbody id=\"workspaces\" data-live=\"/.berth/live\">{}</tbody></table>\n",
                    table_body(&rows, &csrf)
                );
                layout(StatusCode::OK, "Your workspaces", &user, &body)
            }
            "/.berth/live" => self.live_table(session, csrf),
            "/new" => match route::query_value(&path, "kind").filter(|k| !k.is_empty()) {
                None => {
                    let kinds = self.kinds_for(&session.user).await;
                    layout(StatusCode::OK, "New workspace", &user, &kind_list(&kinds))
                }
                Some(kind) => {
                    let asked = Spawn {
                        kind: kind.clone(),
                        namespace: session_namespace(&session.user),
                        ..Default::default()
                    };
                    self.spawn_page(&session, &asked, &csrf, StatusCode::OK, None)
                        .await
                }
            },
            other => match other
                .strip_prefix("/workspaces/")
                .and_then(|r| r.split_once('/'))
            {
                Some((namespace, name)) => {
                    self.workspace_page(&session, namespace, name, &csrf).await
                }
                None => said(
                    StatusCode::NOT_FOUND,
                    "Not a page of the dashboard",
                    &user,
                    &[format!(
                        "The dashboard has {other} not; workspaces' own pages are on their hosts."
                    )],
                ),
            },
        }
    }

    /// The dashboard session of a request, still good (its credential exists, it comes from the
    /// dashboard's own pages or a link to them); else the answer.
    async fn dashboard_session(
        &self,
        headers: &HeaderMap,
        method: &http::Method,
    ) -> Result<session::Claims, Response> {
        let sign_in = |why: String| {
            Page::new(StatusCode::UNAUTHORIZED, "Sign in to Berth")
                .line(why)
                .line("Run `berth dashboard` (or `berth open` with no workspace) for a login link to this dashboard.")
                .answer(headers)
        };
        let session =
            match session::dashboard_session(&self.0.key, &session::cookies(headers), now()) {
                Some(Ok(session)) => session,
                Some(Err(invalid)) => {
                    return Err(sign_in(format!(
                        "Your browser's session is not valid: {invalid}."
                    )));
                }
                None => return Err(sign_in("You are not signed in.".to_owned())),
            };
        if let Some(why) = session::cross_origin_use(method, headers) {
            return Err(Page::new(StatusCode::FORBIDDEN, "Not from this dashboard")
                .line(format!(
                    "The dashboard answers its own pages and links opened to it; {why}."
                ))
                .answer(headers));
        }
        if let Err(refusal) = self.0.access.still_exists(&session.user).await {
            return Err(sign_in(format!("Your session ended: {refusal}.")));
        }
        Ok(session)
    }

    /// `GET /.berth/login?ticket=`: a dashboard ticket becomes the dashboard's session cookie.
    async fn dashboard_login(&self, path: &str, headers: &HeaderMap, secure: bool) -> Response {
        let refused = |why: String| {
            Page::new(StatusCode::UNAUTHORIZED, "This login link does not work")
                .line(format!("The link cannot be used: {why}."))
                .line("Run `berth dashboard` for a new one: a link works once, within a minute.")
                .answer(headers)
        };
        let Some(ticket) = route::query_value(path, "ticket") else {
            return refused("it has no ticket".to_owned());
        };
        let claims = match self.0.key.verify(&ticket, session::Kind::Ticket, now()) {
            Ok(claims) if claims.dashboard => claims,
            Ok(_) => return refused(session::Invalid::OtherWorkspace.to_string()),
            Err(invalid) => return refused(invalid.to_string()),
        };
        match crate::login::use_ticket(&self.0.client, &self.0.config.namespace, &claims).await {
            Ok(()) => {}
            Err(crate::login::Unused::AlreadyUsed) => {
                return refused("it was used before".to_owned());
            }
            Err(crate::login::Unused::Unavailable(why)) => {
                return Page::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Cannot sign you in right now",
                )
                .line(why)
                .refresh(5)
                .answer(headers);
            }
        }
        let ttl = i64::try_from(self.0.config.session_ttl.as_secs()).unwrap_or(i64::MAX / 2);
        let session = session::session_of(&claims, ttl, now());
        let cookie = session::set_cookie(&self.0.key.sign(&session), "/", ttl, secure);
        let mut response = StatusCode::SEE_OTHER.into_response();
        for (name, value) in [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, "/".to_owned()),
        ] {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, value);
            }
        }
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    /// The namespaces where `user` may `verb` workspaces, among those the gateway knows
    /// (where workspaces are, and a service account's own).
    async fn namespaces_for(&self, user: &User, verb: &str) -> Vec<String> {
        let mut known: BTreeSet<String> = self
            .0
            .workspaces
            .state()
            .iter()
            .filter_map(|ws| ws.namespace())
            .collect();
        let own = session_namespace(user);
        if !own.is_empty() {
            known.insert(own);
        }
        let mut allowed = vec![];
        for namespace in known {
            if self
                .0
                .access
                .may(user, verb, crate::access::RESOURCE, &namespace, "")
                .await
                .is_ok()
            {
                allowed.push(namespace);
            }
        }
        allowed
    }

    /// The table's rows for `user`: the workspaces of every namespace they may list, by
    /// namespace and name.
    async fn rows_for(&self, user: &User) -> Vec<Row> {
        let namespaces = self.namespaces_for(user, "list").await;
        let mut rows: Vec<Row> = self
            .0
            .workspaces
            .state()
            .iter()
            .filter(|ws| ws.namespace().is_some_and(|n| namespaces.contains(&n)))
            .map(|ws| row(ws))
            .collect();
        rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        rows
    }

    /// The kinds `user` may use (in their own namespace, or any), not hidden, by name.
    async fn kinds_for(&self, user: &User) -> Vec<Arc<WorkspaceKind>> {
        let namespace = session_namespace(user);
        let mut kinds = vec![];
        let mut all = self.0.kinds.state();
        all.sort_by_key(|k| k.name_any());
        for kind in all {
            if kind.spec.spawner.hidden {
                continue;
            }
            if self
                .0
                .access
                .may(user, "use", "workspacekinds", &namespace, &kind.name_any())
                .await
                .is_ok()
            {
                kinds.push(kind);
            }
        }
        kinds
    }

    /// `GET /.berth/live`: the table's body, sent again (a server-sent event) each time it
    /// changes, until the page goes or the session ends.
    fn live_table(&self, session: session::Claims, csrf: String) -> Response {
        let gateway = self.clone();
        let stream = async_stream(move |sender| async move {
            let mut last = String::new();
            let mut quiet = 0u32;
            loop {
                if gateway.0.access.still_exists(&session.user).await.is_err()
                    || session.expires <= now()
                {
                    return;
                }
                let body = table_body(&gateway.rows_for(&session.user).await, &csrf);
                let event = match body != last {
                    true => {
                        quiet = 0;
                        let lines: String = body.lines().map(|l| format!("data: {l}\n")).collect();
                        last = body;
                        Some(format!("{lines}\n"))
                    }
                    // A comment now and then, so a proxy between keeps the stream open.
                    false if quiet >= KEEPALIVE_TICKS => {
                        quiet = 0;
                        Some(": still here\n\n".to_owned())
                    }
                    false => {
                        quiet += 1;
                        None
                    }
                };
                if let Some(event) = event
                    && sender.send(event).await.is_err()
                {
                    return;
                }
                // A page that went away ends this at once, not at the next change.
                tokio::select! {
                    () = sender.closed() => return,
                    () = tokio::time::sleep(LIVE_EVERY) => {}
                }
            }
        });
        let mut response = Response::new(Body::from_stream(stream));
        secure_headers(response.headers_mut(), "text/event-stream");
        response
    }

    /// A workspace's page, if the person may get it.
    async fn workspace_page(
        &self,
        session: &session::Claims,
        namespace: &str,
        name: &str,
        csrf: &str,
    ) -> Response {
        let user = &session.user.username;
        let got = self
            .as_person::<Workspace>(
                &session.user,
                kube::core::Request::new(Workspace::url_path(&(), Some(namespace)))
                    .get(name, &Default::default()),
            )
            .await;
        let ws = match got {
            Ok(ws) => ws,
            Err((status, words)) => {
                return said(
                    status,
                    &format!("Workspace {namespace}/{name}"),
                    user,
                    &[words],
                );
            }
        };
        let params = kube::api::ListParams::default().fields(&format!(
            "involvedObject.kind=Workspace,involvedObject.name={name}"
        ));
        let events = self
            .as_person::<kube::core::ObjectList<Event>>(
                &session.user,
                kube::core::Request::new(Event::url_path(&(), Some(namespace))).list(&params),
            )
            .await
            .map(|list| list.items)
            .map_err(|(_, words)| format!("Its events cannot be shown: {words}"));
        layout(
            StatusCode::OK,
            &format!("Workspace {namespace}/{name}"),
            user,
            &detail(&ws, events, csrf),
        )
    }

    /// The spawner's form for `asked.kind`, with `error` above it.
    async fn spawn_page(
        &self,
        session: &session::Claims,
        asked: &Spawn,
        csrf: &str,
        status: StatusCode,
        error: Option<String>,
    ) -> Response {
        let user = &session.user.username;
        let kinds = self.kinds_for(&session.user).await;
        let Some(kind) = kinds.iter().find(|k| k.name_any() == asked.kind) else {
            return said(
                StatusCode::NOT_FOUND,
                "New workspace",
                user,
                &[format!(
                    "There is no kind {:?} you may use; pick one from the list.",
                    asked.kind
                )],
            );
        };
        let namespaces = self.namespaces_for(&session.user, "create").await;
        let mut body = error
            .map(|e| format!("<p class=\"said\" role=\"alert\">{}</p>\n", escape(&e)))
            .unwrap_or_default();
        body.push_str(&spawn_form(kind, &namespaces, asked, csrf));
        layout(
            status,
            &format!("New {} workspace", kind.spec.spawner.display_name),
            user,
            &body,
        )
    }

    /// `POST /new`: the workspace created as the person, then the list (where it starts);
    /// a refusal keeps the form with the API server's words.
    async fn spawn(&self, session: &session::Claims, body: &[u8], csrf: &str) -> Response {
        let asked = Spawn::from_form(body);
        let workspace = match asked.workspace(&session.user.username) {
            Ok(workspace) => workspace,
            Err(why) => {
                return self
                    .spawn_page(session, &asked, csrf, StatusCode::BAD_REQUEST, Some(why))
                    .await;
            }
        };
        let created = match serde_json::to_vec(&workspace) {
            Ok(bytes) => {
                self.as_person::<Workspace>(
                    &session.user,
                    kube::core::Request::new(Workspace::url_path(&(), Some(&asked.namespace)))
                        .create(&kube::api::PostParams::default(), bytes),
                )
                .await
            }
            Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
        };
        match created {
            Ok(_) => see_other("/"),
            Err((status, words)) => {
                self.spawn_page(
                    session,
                    &asked,
                    csrf,
                    status,
                    Some(format!("The API server refused to create it: {words}")),
                )
                .await
            }
        }
    }

    /// `POST /.berth/act`: start, stop or delete a workspace, as the person.
    async fn act(&self, session: &session::Claims, body: &[u8]) -> Response {
        let field = |name: &str| route::form_value(body, name).unwrap_or_default();
        let (namespace, name, action) = (field("namespace"), field("name"), field("action"));
        let user = &session.user.username;
        let request = kube::core::Request::new(Workspace::url_path(&(), Some(&namespace)));
        let done = match action.as_str() {
            "start" | "stop" => {
                let patch = serde_json::json!({"spec": {"paused": action == "stop"}});
                self.as_person::<Workspace>(
                    &session.user,
                    request.patch(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(patch),
                    ),
                )
                .await
                .map(drop)
            }
            "delete" if field("sure") == "yes" => self
                .as_person::<serde_json::Value>(
                    &session.user,
                    request.delete(&name, &kube::api::DeleteParams::default()),
                )
                .await
                .map(drop),
            "delete" => Err((
                StatusCode::BAD_REQUEST,
                "Tick the box that says the home goes too.".to_owned(),
            )),
            other => Err((StatusCode::BAD_REQUEST, format!("No action {other:?}."))),
        };
        match done {
            Ok(()) => see_other("/"),
            Err((status, words)) => said(
                status,
                &format!("Cannot {action} workspace {namespace}/{name}"),
                user,
                &[format!("The API server said: {words}")],
            ),
        }
    }

    /// `POST /.berth/open`: a login link to a workspace's port for the person (who must be
    /// allowed to connect), followed at once: on the port's own host, as `berth open` does.
    async fn open_port(
        &self,
        session: &session::Claims,
        body: &[u8],
        headers: &HeaderMap,
    ) -> Response {
        let field = |name: &str| route::form_value(body, name).unwrap_or_default();
        let (namespace, name, port) = (field("namespace"), field("name"), field("port"));
        let user = &session.user.username;
        let refused = |status, words: String| {
            said(
                status,
                &format!("Cannot open workspace {namespace}/{name}"),
                user,
                &[words],
            )
        };
        let target = match route::workspace(&namespace, &name) {
            Ok(target) => target,
            Err(why) => return refused(StatusCode::BAD_REQUEST, why),
        };
        if let Err(refusal) = self
            .0
            .access
            .authorize(&session.user, &namespace, &name)
            .await
        {
            return refused(
                StatusCode::FORBIDDEN,
                match refusal {
                    Refusal::Forbidden { user, .. } => {
                        crate::access::missing_permission(&user, &namespace, &name)
                    }
                    other => other.to_string(),
                },
            );
        }
        let port = match self.port_in_force(&target, Some(&port)).await {
            Ok(port) => port,
            Err(page) => return refused(page.status, page.lines.join(" ")),
        };
        let Some(domain) = self.0.config.base_domain.as_deref() else {
            return refused(
                StatusCode::NOT_FOUND,
                "This gateway has no domain.".to_owned(),
            );
        };
        let claims = session::ticket(session.user.clone(), &namespace, &name, Some(&port), now());
        let host = route::workspace_host_name(
            &port,
            &name,
            &namespace,
            domain,
            headers.get(header::HOST).and_then(|h| h.to_str().ok()),
        );
        let scheme = match headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
        {
            Some("https") => "https",
            _ => "http",
        };
        see_other(&format!(
            "{scheme}://{host}/{}/login?ticket={}",
            route::OWN,
            self.0.key.sign(&claims)
        ))
    }

    /// A request to the API server as the person; the object, or the status and the API
    /// server's words.
    async fn as_person<T: serde::de::DeserializeOwned + Clone + std::fmt::Debug>(
        &self,
        user: &User,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, (StatusCode, String)> {
        let request = request
            .map_err(|e| e.to_string())
            .and_then(|r| as_user(r, user))
            .map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        self.0.client.request::<T>(request).await.map_err(|e| {
            let status = match &e {
                kube::Error::Api(s) => {
                    StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY)
                }
                _ => StatusCode::BAD_GATEWAY,
            };
            (status, api_words(&e))
        })
    }
}

/// A service account's namespace (`system:serviceaccount:<ns>:<name>`), else empty.
fn session_namespace(user: &User) -> String {
    user.username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns.to_owned())
        .unwrap_or_default()
}

fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn asset(text: &'static str, content_type: &'static str) -> Response {
    let mut response = text.into_response();
    secure_headers(response.headers_mut(), content_type);
    response
}

/// A stream of what `produce` sends, ending when it returns.
fn async_stream<F, Fut>(
    produce: F,
) -> impl futures::Stream<Item = Result<String, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<String>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(produce(sender));
    futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(receiver), Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_lives_on_the_domain_itself_only() {
        assert!(is_dashboard_host(
            Some("ws.example.com"),
            Some("ws.example.com")
        ));
        assert!(is_dashboard_host(Some("localhost:8080"), Some("localhost")));
        assert!(!is_dashboard_host(
            Some("http--web--default.ws.example.com"),
            Some("ws.example.com")
        ));
        assert!(!is_dashboard_host(
            Some("127.0.0.1:8080"),
            Some("localhost")
        ));
        assert!(!is_dashboard_host(Some("ws.example.com"), None));
    }

    #[test]
    fn a_workspaces_words_stay_text_in_the_table() {
        let ws: Workspace = serde_json::from_value(serde_json::json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "web", "namespace": "team"},
            "spec": {"image": "x", "ports": [{"name": "http", "port": 8080}]},
            "status": {"phase": "Failed", "message": "<img src=x onerror=alert(1)>"}
        }))
        .unwrap();
        let html = table_body(&[row(&ws)], "tok\"en");
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;"),
            "{html}"
        );
        assert!(html.contains("value=\"tok&quot;en\""), "{html}");
        assert!(html.contains("aria-label=\"Stop team/web\""), "{html}");
        assert!(
            html.contains("aria-label=\"Open port http of team/web\""),
            "{html}"
        );
    }

    #[test]
    fn a_spawned_workspace_is_owned_by_its_author_and_names_its_kind_and_options() {
        let asked = Spawn {
            namespace: "team".into(),
            name: "mine".into(),
            kind: "python".into(),
            image: "py312".into(),
            pod: String::new(),
            git_url: "https://example.com/r.git".into(),
            git_ref: "main".into(),
        };
        let ws = serde_json::to_value(asked.workspace("alice").unwrap()).unwrap();
        assert_eq!(ws["metadata"]["annotations"]["berth.dev/owner"], "alice");
        assert_eq!(
            ws["metadata"]["labels"]["berth.dev/shard"],
            berth_core::shard::label_value("team")
        );
        assert_eq!(ws["spec"]["kind"], "python");
        assert_eq!(ws["spec"]["options"], serde_json::json!({"image": "py312"}));
        assert_eq!(
            ws["spec"]["content"]["git"],
            serde_json::json!({"url": "https://example.com/r.git", "ref": "main"})
        );
    }
}
