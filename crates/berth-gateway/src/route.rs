//! Which workspace port a request is for, from its path (`/w/<namespace>/<workspace>/<port>/`)
//! or its host (`<port>--<workspace>--<namespace>.<domain>`), and what is forwarded of it. Pure:
//! no client, no I/O.

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The path prefix of workspace routes.
pub const PREFIX: &str = "/w/";
/// The gateway's own browser-session cookie: never forwarded to a workspace.
pub const SESSION_COOKIE: &str = "berth_session";

/// A workspace port a request is for, and the path the workspace's server is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub workspace: String,
    pub port: String,
    /// The path and query sent to the workspace (always starting with `/`).
    pub path: String,
    /// The prefix the gateway removed (`/w/ns/ws/port`), empty for a host route: sent as
    /// `X-Forwarded-Prefix` so an app can build its links.
    pub prefix: String,
}

/// Why a request names no workspace port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoTarget {
    /// Not a workspace route at all (e.g. `/healthz`, `/`).
    Elsewhere,
    /// A workspace route that is malformed; the text says how.
    Malformed(String),
    /// `/w/ns/ws/port` without its trailing slash: redirect to this location, as a browser
    /// resolves relative links against the folder.
    Redirect(String),
}

/// The target of a request: its host when a base domain is set and the host is under it, else
/// its path.
pub fn target(
    host: Option<&str>,
    path_and_query: &str,
    domain: Option<&str>,
) -> Result<Target, NoTarget> {
    if let Some(label) = workspace_host(host, domain) {
        return host_target(label, path_and_query);
    }
    path_target(path_and_query)
}

/// The label of `host` under the gateway's base domain (`<port>--<workspace>--<namespace>`),
/// if it is under it.
fn workspace_host<'a>(host: Option<&'a str>, domain: Option<&str>) -> Option<&'a str> {
    let (host, domain) = (host?, domain?);
    let host = host
        .rsplit_once(':')
        .filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(h, _)| h);
    host.strip_suffix(domain.trim_start_matches('.'))
        .and_then(|h| h.strip_suffix('.'))
}

/// The host of a request when it is a workspace's host under the gateway's base domain (the
/// gateway routed by it, so it is no caller's invention); None on a path route.
pub fn checked_host<'a>(host: Option<&'a str>, domain: Option<&str>) -> Option<&'a str> {
    workspace_host(host, domain).and(host)
}

/// The segment under which the gateway answers for a workspace itself:
/// `/w/<namespace>/<workspace>/.berth/<action>`, or `/.berth/<action>` on a workspace's host.
/// A port name cannot start with a dot, so no port is hidden by it.
pub const OWN: &str = ".berth";

/// A request for one of the gateway's own pages of a workspace (its login, its start button).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Own {
    pub namespace: String,
    pub workspace: String,
    /// The port of a workspace's host; None on a path route.
    pub port: Option<String>,
    /// What follows `.berth/`, without the query.
    pub action: String,
    /// Where the workspace's session cookie is sent: its own path, or its host's root.
    pub base: String,
}

/// The gateway's own page of a workspace that the request is for, if it is one.
pub fn own(host: Option<&str>, path_and_query: &str, domain: Option<&str>) -> Option<Own> {
    let path = path_and_query.split('?').next().unwrap_or_default();
    if let Some(label) = workspace_host(host, domain) {
        let action = path
            .strip_prefix('/')?
            .strip_prefix(OWN)?
            .strip_prefix('/')?;
        let target = host_target(label, "/").ok()?;
        return Some(Own {
            namespace: target.namespace,
            workspace: target.workspace,
            port: Some(target.port),
            action: action.to_owned(),
            base: "/".to_owned(),
        });
    }
    let mut parts = path.strip_prefix(PREFIX)?.splitn(4, '/');
    let (namespace, workspace, own, action) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if own != OWN || check_names(namespace, workspace, "own").is_err() {
        return None;
    }
    Some(Own {
        namespace: namespace.to_owned(),
        workspace: workspace.to_owned(),
        port: None,
        action: action.to_owned(),
        base: format!("{PREFIX}{namespace}/{workspace}/"),
    })
}

impl Own {
    /// The workspace as a whole, before any port (its names were checked by [`own`]).
    pub fn target(&self) -> Target {
        Target {
            namespace: self.namespace.clone(),
            workspace: self.workspace.clone(),
            port: String::new(),
            path: "/".to_owned(),
            // As [`target`] has it: the path route's prefix, none on a host.
            prefix: self.base.trim_end_matches('/').to_owned(),
        }
    }
}

/// A workspace as a whole on the path route, before a port is chosen (a login link asked for
/// by name), its names checked as [`target`] checks them.
pub fn workspace(namespace: &str, workspace: &str) -> Result<Target, String> {
    match check_names(namespace, workspace, "own") {
        Err(NoTarget::Malformed(why)) => Err(why),
        _ => Ok(Target {
            namespace: namespace.to_owned(),
            workspace: workspace.to_owned(),
            port: String::new(),
            path: "/".to_owned(),
            prefix: format!("{PREFIX}{namespace}/{workspace}"),
        }),
    }
}

/// Where the session cookie for `target`'s workspace is sent (as [`Own::base`]).
pub fn session_base(target: &Target) -> String {
    if target.prefix.is_empty() {
        "/".to_owned()
    } else {
        format!("{PREFIX}{}/{}/", target.namespace, target.workspace)
    }
}

/// The value of `name` in a query string (`a=1&b=2`), percent-decoded.
pub fn query_value(path_and_query: &str, name: &str) -> Option<String> {
    let query = path_and_query.split_once('?')?.1;
    form_value(query.as_bytes(), name)
}

/// The value of `name` in a form body (`application/x-www-form-urlencoded`).
pub fn form_value(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// The host of a workspace's port under the gateway's base domain, with the port the
/// gateway was reached at (`request_host`'s, if any): `<port>--<workspace>--<namespace>.<domain>`.
pub fn workspace_host_name(
    port: &str,
    workspace: &str,
    namespace: &str,
    domain: &str,
    request_host: Option<&str>,
) -> String {
    let listening = request_host
        .and_then(|h| h.rsplit_once(':'))
        .filter(|(_, p)| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default();
    format!(
        "{port}--{workspace}--{namespace}.{}{listening}",
        domain.trim_start_matches('.')
    )
}

fn host_target(label: &str, path_and_query: &str) -> Result<Target, NoTarget> {
    let parts: Vec<&str> = label.split("--").collect();
    let [port, workspace, namespace] = parts[..] else {
        return Err(NoTarget::Malformed(format!(
            "the host {label:?} is not <port>--<workspace>--<namespace> under the gateway's domain"
        )));
    };
    check_names(namespace, workspace, port)?;
    let path = if path_and_query.starts_with('/') {
        path_and_query.to_owned()
    } else {
        format!("/{path_and_query}")
    };
    Ok(Target {
        namespace: namespace.to_owned(),
        workspace: workspace.to_owned(),
        port: port.to_owned(),
        path,
        prefix: String::new(),
    })
}

fn path_target(path_and_query: &str) -> Result<Target, NoTarget> {
    let Some(rest) = path_and_query.strip_prefix(PREFIX) else {
        return Err(NoTarget::Elsewhere);
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let mut parts = path.splitn(4, '/');
    let (Some(namespace), Some(workspace), Some(port)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(NoTarget::Malformed(format!(
            "{path_and_query} is not {PREFIX}<namespace>/<workspace>/<port>/"
        )));
    };
    check_names(namespace, workspace, port)?;
    let prefix = format!("{PREFIX}{namespace}/{workspace}/{port}");
    let Some(inner) = parts.next() else {
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        return Err(NoTarget::Redirect(format!("{prefix}/{query}")));
    };
    let mut path = format!("/{inner}");
    if let Some(query) = query {
        path.push('?');
        path.push_str(query);
    }
    Ok(Target {
        namespace: namespace.to_owned(),
        workspace: workspace.to_owned(),
        port: port.to_owned(),
        path,
        prefix,
    })
}

/// `target` with its path as the caller sent it (a port whose `stripPrefix` is false); no
/// `X-Forwarded-Prefix` then, as nothing was removed.
pub fn unstripped(target: Target) -> Target {
    Target {
        path: format!("{}{}", target.prefix, target.path),
        prefix: String::new(),
        ..target
    }
}

/// How the gateway serves one port of a workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortOptions {
    /// The gateway's path prefix is removed before forwarding (`stripPrefix`, default true).
    pub strip_prefix: bool,
    pub public: Public,
}

/// Whether a port is served without a credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Public {
    No,
    Yes,
    /// The workspace's own spec marks it public, which this gateway does not allow.
    NotAllowed,
}

/// The options of port `name` of `workspace`, as the port that is in force says them: the
/// workspace's own port of that name, else its kind's (the operator's record of the kind's
/// image option, `status.resolved`, which only the operator writes). A kind's port may be
/// public (an admin published the kind); a workspace's own port only where `allow_public`.
pub fn port_options(
    workspace: &berth_api::Workspace,
    name: &str,
    allow_public: bool,
) -> PortOptions {
    let own = workspace.spec.ports.iter().find(|p| p.name == name);
    let kinds = workspace
        .status
        .as_ref()
        .and_then(|s| s.resolved.as_ref())
        .and_then(|r| r.image.spec.ports.iter().find(|p| p.name == name));
    let (port, from_kind) = match (own, kinds) {
        (Some(own), _) => (Some(own), false),
        (None, Some(kinds)) => (Some(kinds), true),
        (None, None) => (None, false),
    };
    let public = match port.and_then(|p| p.public) {
        Some(true) if from_kind || allow_public => Public::Yes,
        Some(true) => Public::NotAllowed,
        _ => Public::No,
    };
    PortOptions {
        strip_prefix: port.and_then(|p| p.strip_prefix).unwrap_or(true),
        public,
    }
}

/// Names as the API server accepts them: a namespace and a port name are DNS labels, a
/// workspace name a DNS subdomain. Anything else cannot name a workspace, so is refused before
/// any lookup.
fn check_names(namespace: &str, workspace: &str, port: &str) -> Result<(), NoTarget> {
    let label = |s: &str, max: usize| {
        !s.is_empty()
            && s.len() <= max
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    let subdomain = |s: &str| s.len() <= 253 && s.split('.').all(|l| label(l, 63));
    if !label(namespace, 63) {
        return Err(NoTarget::Malformed(format!(
            "{namespace:?} is not a namespace name"
        )));
    }
    if !subdomain(workspace) {
        return Err(NoTarget::Malformed(format!(
            "{workspace:?} is not a workspace name"
        )));
    }
    if !label(port, 15) {
        return Err(NoTarget::Malformed(format!("{port:?} is not a port name")));
    }
    Ok(())
}

/// Headers that belong to one hop (RFC 9110, 7.6.1), never forwarded as they are.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
];

/// Request headers that claim who or where the caller is: the gateway sets them itself, a
/// caller's own never pass.
const CALLER_CLAIMS: [&str; 2] = ["forwarded", "x-real-ip"];

/// The request headers the workspace receives: without the caller's credentials
/// (`Authorization`, `Proxy-Authorization`, the gateway's session cookie) and without
/// hop-by-hop headers, except the `Upgrade` a WebSocket needs; with `X-Forwarded-*`,
/// `Forwarded` and `X-Real-IP` saying where the request came in, set by the gateway alone.
/// `X-Forwarded-Host` is sent only for a host the gateway checked (`trusted_host`: a
/// workspace's host under its domain), never the `Host` any caller can send.
pub fn forwarded_request_headers(
    incoming: &HeaderMap,
    upgrade: bool,
    prefix: &str,
    proto: &str,
    peer: Option<std::net::IpAddr>,
    trusted_host: Option<&str>,
) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(incoming.len() + 6);
    let listed = connection_listed(incoming);
    for (name, value) in incoming {
        let lower = name.as_str();
        if lower == "authorization" || lower == "proxy-authorization" || lower == "cookie" {
            continue;
        }
        if HOP_BY_HOP.contains(&lower) || listed.iter().any(|l| l == lower) {
            continue;
        }
        if lower.starts_with("x-forwarded-") || CALLER_CLAIMS.contains(&lower) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(cookies) = without_session_cookie(incoming) {
        out.insert(header::COOKIE, cookies);
    }
    if upgrade && let Some(protocol) = incoming.get(header::UPGRADE) {
        out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        out.insert(header::UPGRADE, protocol.clone());
    }
    let proto = match proto {
        "https" => "https",
        _ => "http",
    };
    let mut forwarded = vec![];
    if let Some(host) = trusted_host
        && let Ok(value) = HeaderValue::from_str(host)
    {
        out.insert(HeaderName::from_static("x-forwarded-host"), value);
        forwarded.push(format!("host=\"{host}\""));
    }
    out.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(proto),
    );
    forwarded.push(format!("proto={proto}"));
    if let Some(peer) = peer
        && let Ok(value) = HeaderValue::from_str(&peer.to_string())
    {
        out.insert(HeaderName::from_static("x-forwarded-for"), value.clone());
        out.insert(HeaderName::from_static("x-real-ip"), value);
        forwarded.insert(
            0,
            match peer {
                std::net::IpAddr::V4(v4) => format!("for={v4}"),
                std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
            },
        );
    }
    if let Ok(value) = HeaderValue::from_str(&forwarded.join(";")) {
        out.insert(HeaderName::from_static("forwarded"), value);
    }
    if !prefix.is_empty()
        && let Ok(value) = HeaderValue::from_str(prefix)
    {
        out.insert(HeaderName::from_static("x-forwarded-prefix"), value);
    }
    out
}

/// Response headers an app may not send through the gateway: `Service-Worker-Allowed` would
/// let a page's service worker control paths beyond its own (other workspaces' on the path
/// route).
const APP_MAY_NOT_SET: [&str; 1] = ["service-worker-allowed"];

/// The response headers the caller receives: without hop-by-hop headers, except those of a
/// switch to WebSocket; without a `Set-Cookie` of the gateway's own cookie (an app cannot set
/// or clear a session) nor what [`APP_MAY_NOT_SET`] lists.
pub fn forwarded_response_headers(incoming: &HeaderMap, upgrade: bool) -> HeaderMap {
    let listed = connection_listed(incoming);
    let mut out = HeaderMap::with_capacity(incoming.len());
    for (name, value) in incoming {
        let lower = name.as_str();
        if HOP_BY_HOP.contains(&lower)
            || listed.iter().any(|l| l == lower)
            || APP_MAY_NOT_SET.contains(&lower)
        {
            continue;
        }
        if name == header::SET_COOKIE && sets_gateway_cookie(value) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if upgrade && let Some(protocol) = incoming.get(header::UPGRADE) {
        out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        out.insert(header::UPGRADE, protocol.clone());
    }
    out
}

/// Whether a `Set-Cookie` value names the gateway's session cookie (also behind a `__Host-` or
/// `__Secure-` prefix, and in any case: browsers match names exactly, but a lookalike serves
/// no app).
fn sets_gateway_cookie(value: &HeaderValue) -> bool {
    let text = String::from_utf8_lossy(value.as_bytes());
    let name = text.split(['=', ';']).next().unwrap_or_default().trim();
    let name = name
        .strip_prefix("__Host-")
        .or_else(|| name.strip_prefix("__Secure-"))
        .unwrap_or(name);
    name.eq_ignore_ascii_case(SESSION_COOKIE)
}

/// Header names a `Connection` header lists (they are hop-by-hop too).
fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty() && s != "upgrade" && s != "keep-alive" && s != "close")
        .collect()
}

/// The caller's cookies without the gateway's own; None when none is left.
fn without_session_cookie(headers: &HeaderMap) -> Option<HeaderValue> {
    let kept: Vec<&str> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .filter(|c| c.split('=').next().map(str::trim) != Some(SESSION_COOKIE))
        .collect();
    (!kept.is_empty())
        .then(|| HeaderValue::from_str(&kept.join("; ")).ok())
        .flatten()
}

/// Whether a request asks to switch protocols (a WebSocket).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The caller's bearer token, if it sent one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_as_a_whole_has_names_the_api_server_accepts() {
        let target = workspace("team-a", "web").unwrap();
        assert_eq!(
            (target.namespace.as_str(), target.port.as_str()),
            ("team-a", "")
        );
        assert_eq!(session_base(&target), "/w/team-a/web/");
        assert_eq!(
            workspace("Team", "web").unwrap_err(),
            "\"Team\" is not a namespace name"
        );
        assert_eq!(
            workspace("team-a", "web/x").unwrap_err(),
            "\"web/x\" is not a workspace name"
        );
    }

    fn ok(t: Result<Target, NoTarget>) -> (String, String, String, String) {
        let t = t.expect("a target");
        (t.namespace, t.workspace, t.port, t.path)
    }

    #[test]
    fn a_path_names_the_namespace_workspace_and_port_and_the_rest_goes_to_the_workspace() {
        assert_eq!(
            ok(target(
                None,
                "/w/team-a/alice.dev/http/index.html?x=1",
                None
            )),
            (
                "team-a".into(),
                "alice.dev".into(),
                "http".into(),
                "/index.html?x=1".into()
            )
        );
        assert_eq!(ok(target(None, "/w/team-a/alice/http/", None)).3, "/");
        let t = target(None, "/w/team-a/alice/http/a/b", None).unwrap();
        assert_eq!(t.prefix, "/w/team-a/alice/http");
        assert_eq!(
            target(None, "/w/team-a/alice/http?x=1", None),
            Err(NoTarget::Redirect("/w/team-a/alice/http/?x=1".into()))
        );
        assert_eq!(target(None, "/healthz", None), Err(NoTarget::Elsewhere));
        assert_eq!(target(None, "/", None), Err(NoTarget::Elsewhere));
    }

    #[test]
    fn names_the_api_server_would_refuse_name_nothing() {
        for path in [
            "/w/team-a/alice",
            "/w/Team-A/alice/http/",
            "/w/team-a/../http/",
            "/w/team-a/alice/../",
            "/w/team-a/alice/a-port-name-too-long/",
            "/w/team-a/%2e%2e/http/",
            "/w//alice/http/",
            "/w/team-a/alice/-http/",
        ] {
            assert!(
                matches!(target(None, path, None), Err(NoTarget::Malformed(_))),
                "{path}: {:?}",
                target(None, path, None)
            );
        }
    }

    #[test]
    fn under_the_base_domain_the_host_names_the_port() {
        let domain = Some("ws.example.com");
        assert_eq!(
            ok(target(
                Some("http--alice--team-a.ws.example.com"),
                "/x?y",
                domain
            )),
            (
                "team-a".into(),
                "alice".into(),
                "http".into(),
                "/x?y".into()
            )
        );
        assert_eq!(
            ok(target(
                Some("http--alice--team-a.ws.example.com:8443"),
                "/",
                domain
            ))
            .1,
            "alice"
        );
        assert!(matches!(
            target(Some("alice--team-a.ws.example.com"), "/", domain),
            Err(NoTarget::Malformed(_))
        ));
        // Another host, or no domain configured: the path decides.
        assert_eq!(
            ok(target(Some("gateway.example.com"), "/w/n/w/p/", domain)).0,
            "n"
        );
        assert_eq!(
            target(Some("http--alice--team-a.ws.example.com"), "/", None),
            Err(NoTarget::Elsewhere)
        );
        assert_eq!(
            target(Some("evil-ws.example.com"), "/", domain),
            Err(NoTarget::Elsewhere)
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_callers_credentials_and_hop_headers_are_never_forwarded() {
        let incoming = headers(&[
            ("authorization", "Bearer secret"),
            ("proxy-authorization", "Basic x"),
            ("cookie", "berth_session=abc; theme=dark"),
            ("cookie", "lang=en"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-host", "evil.example"),
            ("forwarded", "for=6.6.6.6;host=evil.example"),
            ("x-real-ip", "6.6.6.6"),
            ("host", "gw.example.com"),
            ("accept", "text/html"),
        ]);
        let out = forwarded_request_headers(
            &incoming,
            false,
            "/w/n/w/p",
            "https",
            Some([10, 0, 0, 1].into()),
            None,
        );
        assert!(out.get("authorization").is_none());
        assert!(out.get("proxy-authorization").is_none());
        assert_eq!(out.get("cookie").unwrap(), "theme=dark; lang=en");
        for gone in [
            "connection",
            "x-private",
            "keep-alive",
            "transfer-encoding",
            "upgrade",
        ] {
            assert!(out.get(gone).is_none(), "{gone}");
        }
        assert_eq!(
            out.get("x-forwarded-for").unwrap(),
            "10.0.0.1",
            "the caller cannot forge it"
        );
        assert_eq!(out.get("x-real-ip").unwrap(), "10.0.0.1");
        assert_eq!(out.get("forwarded").unwrap(), "for=10.0.0.1;proto=https");
        assert_eq!(out.get_all("forwarded").iter().count(), 1);
        assert!(
            out.get("x-forwarded-host").is_none(),
            "a Host any caller can send is not passed on as checked"
        );
        assert_eq!(out.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(out.get("x-forwarded-prefix").unwrap(), "/w/n/w/p");
        assert_eq!(out.get("accept").unwrap(), "text/html");
        assert_eq!(out.get("host").unwrap(), "gw.example.com");

        let only_session = headers(&[("cookie", "berth_session=abc")]);
        assert!(
            forwarded_request_headers(&only_session, false, "", "http", None, None)
                .get("cookie")
                .is_none()
        );
        // A workspace's host the gateway routed by is passed on.
        let out = forwarded_request_headers(
            &incoming,
            false,
            "",
            "http",
            Some("::1".parse().unwrap()),
            Some("http--ws--ns.example.com"),
        );
        assert_eq!(
            out.get("x-forwarded-host").unwrap(),
            "http--ws--ns.example.com"
        );
        assert_eq!(
            out.get("forwarded").unwrap(),
            "for=\"[::1]\";host=\"http--ws--ns.example.com\";proto=http"
        );
    }

    #[test]
    fn an_app_cannot_set_the_gateways_cookie_or_widen_a_service_worker() {
        let response = headers(&[
            ("set-cookie", "berth_session=forged; Path=/"),
            ("set-cookie", "__Host-berth_session=x; Path=/"),
            ("set-cookie", "Berth_Session=x"),
            ("set-cookie", "theme=dark; Path=/"),
            ("service-worker-allowed", "/"),
            ("content-type", "text/html"),
        ]);
        let back = forwarded_response_headers(&response, false);
        let cookies: Vec<_> = back.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["theme=dark; Path=/"]);
        assert!(back.get("service-worker-allowed").is_none());
        assert_eq!(back.get("content-type").unwrap(), "text/html");
    }

    #[test]
    fn a_websocket_keeps_its_upgrade_and_nothing_else_of_the_hop() {
        let incoming = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
            ("sec-websocket-version", "13"),
        ]);
        assert!(wants_upgrade(&incoming));
        let out = forwarded_request_headers(&incoming, true, "", "http", None, None);
        assert_eq!(out.get("connection").unwrap(), "upgrade");
        assert_eq!(out.get("upgrade").unwrap(), "websocket");
        assert_eq!(out.get("sec-websocket-key").unwrap(), "k");
        assert!(!wants_upgrade(&headers(&[("upgrade", "websocket")])));
        let response = headers(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-accept", "a"),
        ]);
        let back = forwarded_response_headers(&response, true);
        assert_eq!(back.get("upgrade").unwrap(), "websocket");
        assert!(
            forwarded_response_headers(&response, false)
                .get("upgrade")
                .is_none()
        );
    }

    #[test]
    fn only_a_bearer_token_is_a_credential() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "bearer  abc ")])),
            Some("abc")
        );
        assert_eq!(bearer(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", "Bearer ")])), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn the_gateways_own_pages_sit_beside_a_workspaces_ports_and_hide_none() {
        let own_of = |host: Option<&str>, path: &str| own(host, path, Some("ws.example.com"));
        assert_eq!(
            own_of(None, "/w/team/web/.berth/login?ticket=abc"),
            Some(Own {
                namespace: "team".into(),
                workspace: "web".into(),
                port: None,
                action: "login".into(),
                base: "/w/team/web/".into(),
            })
        );
        assert_eq!(
            own_of(Some("http--web--team.ws.example.com"), "/.berth/start"),
            Some(Own {
                namespace: "team".into(),
                workspace: "web".into(),
                port: Some("http".into()),
                action: "start".into(),
                base: "/".into(),
            })
        );
        // A port's own paths, and anything malformed, are not the gateway's.
        assert_eq!(own_of(None, "/w/team/web/http/.berth/login"), None);
        assert_eq!(
            own_of(Some("http--web--team.ws.example.com"), "/app/.berth/x"),
            None
        );
        assert_eq!(own_of(None, "/w/Team/web/.berth/login"), None);
        assert_eq!(own_of(None, "/w/team/web/.berth"), None);
        // No port name starts with a dot, so `.berth` never hides one.
        assert!(matches!(
            target(None, "/w/team/web/.berth/", None),
            Err(NoTarget::Malformed(_))
        ));
        let path_target = target(None, "/w/team/web/http/x", None).unwrap();
        assert_eq!(session_base(&path_target), "/w/team/web/");
        let host_target = target(
            Some("http--web--team.ws.example.com"),
            "/x",
            Some("ws.example.com"),
        )
        .unwrap();
        assert_eq!(session_base(&host_target), "/");
    }

    #[test]
    fn query_and_form_values_are_decoded() {
        assert_eq!(
            query_value("/x?a=1&ticket=a%2Bb", "ticket").as_deref(),
            Some("a+b")
        );
        assert_eq!(query_value("/x?a=1", "ticket"), None);
        assert_eq!(query_value("/x", "a"), None);
        assert_eq!(
            form_value(b"csrf=x%3D&port=http", "csrf").as_deref(),
            Some("x=")
        );
    }

    #[test]
    fn a_kinds_port_may_be_public_a_workspaces_own_only_where_the_gateway_allows() {
        let workspace =
            |ports: serde_json::Value, kind_ports: serde_json::Value| -> berth_api::Workspace {
                let mut ws = serde_json::json!({
                    "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
                    "metadata": {"name": "web", "namespace": "team"},
                    "spec": {"image": "x:1", "ports": ports}
                });
                if !kind_ports.is_null() {
                    ws["status"] = serde_json::json!({"resolved": {
                        "kind": "k",
                        "image": {"id": "i", "spec": {"image": "x:1", "ports": kind_ports}},
                        "pod": {"id": "p", "spec": {}}
                    }});
                }
                serde_json::from_value(ws).unwrap()
            };
        let own = workspace(
            serde_json::json!([{"name": "http", "port": 80, "public": true, "stripPrefix": false}]),
            serde_json::Value::Null,
        );
        assert_eq!(
            port_options(&own, "http", false),
            PortOptions {
                strip_prefix: false,
                public: Public::NotAllowed
            }
        );
        assert_eq!(port_options(&own, "http", true).public, Public::Yes);
        assert_eq!(
            port_options(&own, "other", true),
            PortOptions {
                strip_prefix: true,
                public: Public::No
            }
        );
        let kinds = workspace(
            serde_json::json!([{"name": "own", "port": 81, "public": true}]),
            serde_json::json!([{"name": "docs", "port": 80, "public": true}, {"name": "own", "port": 82, "public": true}]),
        );
        assert_eq!(
            port_options(&kinds, "docs", false).public,
            Public::Yes,
            "the kind's admin published it"
        );
        assert_eq!(
            port_options(&kinds, "own", false).public,
            Public::NotAllowed,
            "the workspace's own port of that name wins, and is its author's"
        );
    }
}
