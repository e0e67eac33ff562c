//! Browser sessions. `berth open` asks the gateway, with the user's own Kubernetes credential,
//! for a one-time login ticket for one workspace; the browser exchanges it once for a session
//! cookie scoped to that workspace. Tickets, cookies and the start button's CSRF token are
//! signed (HMAC-SHA256) with a key every replica reads from one Secret, so any replica accepts
//! what another made; a ticket's nonce is recorded when it is used (an API object per ticket:
//! `login.rs`), so a second use is refused on every replica. Pure: no client, no I/O.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::access::User;
use crate::route::SESSION_COOKIE;

/// How long a login ticket may wait before the browser uses it.
pub const TICKET_TTL_SECONDS: i64 = 60;
/// The smallest key accepted: HMAC-SHA256 with fewer bytes than its output is weaker.
pub const MIN_KEY_BYTES: usize = 32;

/// The signing key. Never printed.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// What a ticket or a session is: one is never accepted as the other.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Ticket,
    Session,
}

/// What is signed: who, for which workspace, until when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub kind: Kind,
    pub user: User,
    pub namespace: String,
    pub workspace: String,
    /// The port a login leads to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// For the dashboard (no workspace): used nowhere else, and no workspace's is used there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dashboard: bool,
    /// Seconds since the Unix epoch.
    pub expires: i64,
    /// Random, hex: what makes a ticket usable once, and a session's CSRF token its own.
    pub nonce: String,
}

/// Why a ticket or a cookie is not accepted, in words for the person holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Not something this gateway made, or changed since.
    Forged,
    /// Made by this gateway, but expired at this time (seconds since the epoch).
    Expired(i64),
    /// A ticket where a session belongs, or the other way round.
    WrongKind,
    /// For another workspace.
    OtherWorkspace,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Invalid::Forged => {
                f.write_str("it was not made by this cluster's gateway, or was changed")
            }
            Invalid::Expired(at) => write!(
                f,
                "it expired at {}",
                jiff::Timestamp::from_second(*at)
                    .map(|t| t.to_string())
                    .unwrap_or_else(|_| at.to_string())
            ),
            Invalid::WrongKind => f.write_str("it is not a login link"),
            Invalid::OtherWorkspace => f.write_str("it is for another workspace"),
        }
    }
}

impl Key {
    /// A key of at least [`MIN_KEY_BYTES`] bytes.
    pub fn new(bytes: &[u8]) -> Result<Key, String> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(format!(
                "the session key has {} bytes; it needs at least {MIN_KEY_BYTES}",
                bytes.len()
            ));
        }
        Ok(Key(bytes.to_vec()))
    }

    /// Fresh random bytes for a new key.
    pub fn generate() -> Vec<u8> {
        rand::random::<[u8; 32]>().to_vec()
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes a key of any length")
    }

    /// `claims` as `<payload>.<signature>`, both base64url: safe in a URL and in a cookie.
    pub fn sign(&self, claims: &Claims) -> String {
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{payload}.{signature}")
    }

    /// The claims of `token` if this key signed them, they are of `kind`, and they have not
    /// expired at `now` (seconds since the epoch).
    pub fn verify(&self, token: &str, kind: Kind, now: i64) -> Result<Claims, Invalid> {
        let (payload, signature) = token.split_once('.').ok_or(Invalid::Forged)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| Invalid::Forged)?;
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        mac.verify_slice(&signature).map_err(|_| Invalid::Forged)?;
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or(Invalid::Forged)?;
        if claims.kind != kind {
            return Err(Invalid::WrongKind);
        }
        if claims.expires <= now {
            return Err(Invalid::Expired(claims.expires));
        }
        Ok(claims)
    }

    /// The CSRF token of a session: only a page the gateway served that session carries it.
    pub fn csrf(&self, session: &Claims) -> String {
        let mut mac = self.mac();
        mac.update(b"csrf\n");
        mac.update(session.nonce.as_bytes());
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// Whether `token` is the CSRF token of `session` (compared in constant time).
    pub fn csrf_matches(&self, session: &Claims, token: &str) -> bool {
        let Ok(token) = URL_SAFE_NO_PAD.decode(token) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(b"csrf\n");
        mac.update(session.nonce.as_bytes());
        mac.verify_slice(&token).is_ok()
    }
}

/// A fresh nonce: 16 random bytes, hex (also a valid object name).
pub fn nonce() -> String {
    rand::random::<[u8; 16]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The claims of a ticket for `user` to log in to `namespace/workspace` (then `port`).
pub fn ticket(
    user: User,
    namespace: &str,
    workspace: &str,
    port: Option<&str>,
    now: i64,
) -> Claims {
    Claims {
        kind: Kind::Ticket,
        user,
        namespace: namespace.to_owned(),
        workspace: workspace.to_owned(),
        port: port.map(str::to_owned),
        dashboard: false,
        expires: now + TICKET_TTL_SECONDS,
        nonce: nonce(),
    }
}

/// The claims of a ticket for `user` to sign in to the dashboard.
pub fn dashboard_ticket(user: User, now: i64) -> Claims {
    Claims {
        dashboard: true,
        ..ticket(user, "", "", None, now)
    }
}

/// The session a used ticket becomes: the same user and workspace, a nonce of its own.
pub fn session_of(ticket: &Claims, ttl_seconds: i64, now: i64) -> Claims {
    Claims {
        kind: Kind::Session,
        expires: now + ttl_seconds,
        nonce: nonce(),
        ..ticket.clone()
    }
}

/// The `Set-Cookie` value of a session, sent back only to `path` (the workspace's own
/// `/w/<namespace>/<workspace>/`, or `/` on a workspace's own host), never to scripts, and
/// not on cross-site requests.
pub fn set_cookie(value: &str, path: &str, max_age: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{SESSION_COOKIE}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}"
    )
}

/// Why a request that a browser session would authenticate is not let through, if it is
/// not: a session is used only by its workspace's own pages (the same origin) or by opening a
/// link to it (a top-level navigation), never by a page of another site or of another
/// workspace's host (under a gateway's domain those are same-site, so a `SameSite=Lax`
/// cookie goes along, WebSockets included). Browsers say where a request comes from in
/// `Origin` and `Sec-Fetch-*`, which no page can set; a client that sends neither (curl with
/// a cookie) holds the cookie itself.
pub fn cross_origin_use(method: &http::Method, headers: &http::HeaderMap) -> Option<String> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(origin) = get("origin") {
        let from = origin.split_once("://").map(|(_, authority)| authority);
        if from.is_none() || from != get("host") {
            return Some(format!("a page of {origin} sent it"));
        }
    }
    match get("sec-fetch-site") {
        None | Some("same-origin" | "none") => None,
        Some(site) => {
            let navigation = get("sec-fetch-mode") == Some("navigate")
                && get("sec-fetch-dest") == Some("document")
                && (method == http::Method::GET || method == http::Method::HEAD);
            (!navigation).then(|| {
                format!(
                    "a page of another {} asked for it ({})",
                    if site == "same-site" {
                        "workspace or host of this site"
                    } else {
                        "site"
                    },
                    get("sec-fetch-dest").unwrap_or("a request")
                )
            })
        }
    }
}

/// Every value of the session cookie the request carries (a browser may send several, for
/// different paths).
pub fn cookies(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_owned())
        .collect()
}

/// The first of `values` that is a valid dashboard session; else why the first one is not
/// (None: there was none).
pub fn dashboard_session(
    key: &Key,
    values: &[String],
    now: i64,
) -> Option<Result<Claims, Invalid>> {
    let mut first_refusal = None;
    for value in values {
        match key.verify(value, Kind::Session, now) {
            Ok(c) if c.dashboard => return Some(Ok(c)),
            Ok(_) => {
                first_refusal.get_or_insert(Invalid::OtherWorkspace);
            }
            Err(e) => {
                first_refusal.get_or_insert(e);
            }
        }
    }
    first_refusal.map(Err)
}

/// The first of `values` that is a valid session for `namespace/workspace`; else why the
/// first one is not (None: there was none).
pub fn session_for(
    key: &Key,
    values: &[String],
    namespace: &str,
    workspace: &str,
    now: i64,
) -> Option<Result<Claims, Invalid>> {
    let mut first_refusal = None;
    for value in values {
        match key.verify(value, Kind::Session, now) {
            Ok(c) if !c.dashboard && c.namespace == namespace && c.workspace == workspace => {
                return Some(Ok(c));
            }
            Ok(_) => {
                first_refusal.get_or_insert(Invalid::OtherWorkspace);
            }
            Err(e) => {
                first_refusal.get_or_insert(e);
            }
        }
    }
    first_refusal.map(Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_session_is_used_only_by_its_own_pages_or_a_link_to_them() {
        let host = ("host", "http--bob--team.ws.example.com");
        let get = http::Method::GET;
        let allowed = [
            // The workspace's own page, a bookmark, curl.
            vec![
                host,
                ("sec-fetch-site", "same-origin"),
                ("sec-fetch-mode", "cors"),
                ("sec-fetch-dest", "empty"),
            ],
            vec![
                host,
                ("sec-fetch-site", "none"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "document"),
            ],
            vec![host],
            // Its own WebSocket.
            vec![
                host,
                ("origin", "http://http--bob--team.ws.example.com"),
                ("sec-fetch-site", "same-origin"),
                ("sec-fetch-mode", "websocket"),
            ],
            // A link from another site or workspace, opened.
            vec![
                host,
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "document"),
            ],
            vec![
                host,
                ("sec-fetch-site", "cross-site"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "document"),
            ],
        ];
        for pairs in allowed {
            assert_eq!(cross_origin_use(&get, &headers(&pairs)), None, "{pairs:?}");
        }
        let refused = [
            // Another workspace's page: a fetch, a WebSocket, a frame.
            vec![
                host,
                ("origin", "http://http--alice--team.ws.example.com"),
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "cors"),
                ("sec-fetch-dest", "empty"),
            ],
            vec![
                host,
                ("origin", "http://http--alice--team.ws.example.com"),
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "websocket"),
            ],
            vec![
                host,
                ("sec-fetch-site", "same-site"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "iframe"),
            ],
            vec![
                host,
                ("sec-fetch-site", "cross-site"),
                ("sec-fetch-mode", "no-cors"),
                ("sec-fetch-dest", "image"),
            ],
            // A sandboxed page, and an Origin without Sec-Fetch-* (an older browser).
            vec![host, ("origin", "null")],
            vec![host, ("origin", "https://evil.example")],
        ];
        for pairs in refused {
            assert!(
                cross_origin_use(&get, &headers(&pairs)).is_some(),
                "{pairs:?}"
            );
        }
        // A form posted from another site navigates, but is no GET.
        let post = headers(&[
            host,
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ]);
        assert!(cross_origin_use(&http::Method::POST, &post).is_some());
    }

    fn alice() -> User {
        User {
            username: "alice".into(),
            uid: "u-1".into(),
            groups: vec!["devs".into()],
            extra: Default::default(),
        }
    }

    fn key() -> Key {
        Key::new(&[7u8; 32]).unwrap()
    }

    #[test]
    fn a_ticket_is_accepted_until_it_expires_and_only_as_a_ticket() {
        let claims = ticket(alice(), "team", "web", Some("http"), 1000);
        let token = key().sign(&claims);
        assert_eq!(key().verify(&token, Kind::Ticket, 1000), Ok(claims.clone()));
        assert_eq!(
            key().verify(&token, Kind::Ticket, 1000 + TICKET_TTL_SECONDS - 1),
            Ok(claims.clone())
        );
        assert_eq!(
            key().verify(&token, Kind::Ticket, 1000 + TICKET_TTL_SECONDS),
            Err(Invalid::Expired(1000 + TICKET_TTL_SECONDS))
        );
        assert_eq!(
            key().verify(&token, Kind::Session, 1000),
            Err(Invalid::WrongKind),
            "a ticket is not a session cookie"
        );
    }

    #[test]
    fn what_another_key_signed_or_anyone_changed_is_refused() {
        let token = key().sign(&ticket(alice(), "team", "web", None, 1000));
        let other = Key::new(&[8u8; 32]).unwrap();
        assert_eq!(
            other.verify(&token, Kind::Ticket, 1000),
            Err(Invalid::Forged)
        );
        // The payload changed to name another user, the signature kept.
        let (_, signature) = token.split_once('.').unwrap();
        let mut mallory = ticket(alice(), "team", "web", None, 1000);
        mallory.user.username = "admin".into();
        let (payload, _) = key()
            .sign(&mallory)
            .split_once('.')
            .map(|(p, s)| (p.to_owned(), s.to_owned()))
            .unwrap();
        assert_eq!(
            key().verify(&format!("{payload}.{signature}"), Kind::Ticket, 1000),
            Err(Invalid::Forged)
        );
        for garbage in ["", ".", "abc", "abc.def", "a.b.c"] {
            assert_eq!(
                key().verify(garbage, Kind::Ticket, 0),
                Err(Invalid::Forged),
                "{garbage:?}"
            );
        }
        assert!(Key::new(&[1u8; 31]).is_err(), "a short key");
    }

    #[test]
    fn a_session_is_bound_to_its_workspace_and_the_first_valid_cookie_wins() {
        let session = session_of(&ticket(alice(), "team", "web", None, 0), 3600, 10);
        assert_eq!(session.kind, Kind::Session);
        assert_eq!(session.expires, 3610);
        let web = key().sign(&session);
        let mut other = session.clone();
        other.workspace = "db".into();
        let db = key().sign(&other);
        assert_eq!(session_for(&key(), &[], "team", "web", 10), None);
        assert_eq!(
            session_for(&key(), std::slice::from_ref(&db), "team", "web", 10),
            Some(Err(Invalid::OtherWorkspace))
        );
        assert_eq!(
            session_for(&key(), &[db, "junk".into(), web.clone()], "team", "web", 10),
            Some(Ok(session.clone()))
        );
        assert_eq!(
            session_for(&key(), &[web], "team", "web", 3610),
            Some(Err(Invalid::Expired(3610)))
        );
    }

    #[test]
    fn the_csrf_token_is_the_sessions_own() {
        let a = session_of(&ticket(alice(), "team", "web", None, 0), 3600, 0);
        let b = session_of(&ticket(alice(), "team", "web", None, 0), 3600, 0);
        let token = key().csrf(&a);
        assert!(key().csrf_matches(&a, &token));
        assert!(!key().csrf_matches(&b, &token), "another session's");
        assert!(!key().csrf_matches(&a, ""));
        assert!(!key().csrf_matches(&a, "not base64 !"));
    }

    #[test]
    fn the_cookie_is_scoped_hidden_from_scripts_and_not_sent_cross_site() {
        assert_eq!(
            set_cookie("v", "/w/team/web/", 60, true),
            "berth_session=v; Path=/w/team/web/; Max-Age=60; HttpOnly; SameSite=Lax; Secure"
        );
        let mut headers = http::HeaderMap::new();
        headers.append(
            http::header::COOKIE,
            "theme=dark; berth_session=a".parse().unwrap(),
        );
        headers.append(http::header::COOKIE, "berth_session=b".parse().unwrap());
        assert_eq!(cookies(&headers), vec!["a".to_owned(), "b".to_owned()]);
    }
}
