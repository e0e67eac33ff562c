//! `berth gateway`: the way into workspaces. It proxies HTTP (1.1 and 2) and WebSocket to a
//! workspace's named port at `/w/<namespace>/<workspace>/<port>/` (and, with a base domain, at
//! `<port>--<workspace>--<namespace>.<domain>`), for a caller the API server authenticates
//! (TokenReview) and authorizes on that workspace (`create` on `workspaces/connect`,
//! SubjectAccessReview). It reaches only the ready pod Berth owns for that workspace, at a port
//! that pod declares; the caller's credentials never reach the workspace; bodies stream.
//! Trust boundaries: ARCHITECTURE.md, "The gateway".

/// The gateway's service account and ClusterRole, and the `berth-workspace-connect`
/// ClusterRole to bind for developers (`deploy/gateway/rbac.yaml`): tests and `berth dev`
/// create exactly what the README documents.
pub const RBAC: &str = include_str!("../../../deploy/gateway/rbac.yaml");

/// The dashboard's right to act as the person signed in (`deploy/gateway-dashboard/`).
pub const DASHBOARD_RBAC: &str = include_str!("../../../deploy/gateway-dashboard/rbac.yaml");

pub mod access;
pub mod dashboard;
pub mod login;
pub mod pages;
pub mod route;
pub mod session;
pub mod shell;
pub mod ssh;

use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{ConnectInfo, Request, State},
    response::{IntoResponse, Response},
};
use berth_api::{
    Phase, Workspace,
    condition::{ConditionStatus, HasStatus, find_condition, pod_conditions, types},
};
use http::{HeaderValue, StatusCode, Uri, Version, header};
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{
        reflector::{self, ObjectRef, Store, reflector},
        watcher::{self, watcher},
    },
};

use access::{Access, Refusal, User};
use pages::{Form, Page};
use route::{NoTarget, Own, Public, Target};
use session::{Claims, Key};

/// How long an unused connection to a workspace's port is kept open (for reuse, and so the
/// agent's sampling of connections sees every request as activity).
pub const IDLE_CONNECTION: Duration = Duration::from_secs(30);

/// How long the gateway's tokens for agents last (renewed at 80%).
pub const AGENT_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// How the gateway behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// With a base domain, `<port>--<workspace>--<namespace>.<domain>` reaches a port too.
    pub base_domain: Option<String>,
    /// How long an answer of TokenReview or SubjectAccessReview is used before asking again.
    pub review_ttl: Duration,
    /// How long connecting to a workspace's port may take.
    pub connect_timeout: Duration,
    /// The gateway's namespace: where the Secret with its session key and the records of used
    /// login links are.
    pub namespace: String,
    /// How long a browser session lasts (it is still authorized on every request).
    pub session_ttl: Duration,
    /// A workspace's own port marked `public` is served to anyone (a port its kind declares
    /// public always is).
    pub allow_public_ports: bool,
    /// The gateway's own service account (namespace, name): its tokens for agents open
    /// shells. None: no shells.
    pub service_account: Option<(String, String)>,
    /// The CA bundle (PEM) agents' TLS certificates are verified against, where agents serve
    /// TLS.
    pub agent_tls_ca: Option<Vec<u8>>,
    /// How long a caller may take to send a request's headers; a connection that sends
    /// nothing, or half a request, is closed then (so idle sockets cannot pile up).
    pub header_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            base_domain: None,
            review_ttl: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            namespace: "berth-system".to_owned(),
            session_ttl: Duration::from_secs(12 * 3600),
            allow_public_ports: false,
            service_account: None,
            agent_tls_ca: None,
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// The gateway: cheap to clone, one per process.
#[derive(Clone)]
pub struct Gateway(Arc<Inner>);

struct Inner {
    client: Client,
    config: Config,
    access: Access,
    upstream: HttpClient<HttpConnector, Body>,
    key: Key,
    /// The gateway's tokens for agents (shells), when it has a service account.
    agent_tokens: Option<berth_agent::client::AgentTokens>,
    /// Every workspace, and the pods Berth manages, as watches keep them.
    workspaces: Store<Workspace>,
    pods: Store<Pod>,
    /// Every WorkspaceKind, for the dashboard's spawner.
    kinds: Store<berth_api::WorkspaceKind>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

/// A cache of `api`'s objects kept by a watch (their managed fields dropped), and its task;
/// a watch that fails says so and tries again with backoff.
fn cache<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, config)
            .default_backoff()
            .modify(|object| object.meta_mut().managed_fields = None),
    );
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::warn!(resource = %K::plural(&()), error = %e, "the watch failed; trying again");
            }
        }
    });
    (reader, task)
}

impl Gateway {
    /// A gateway that asks the API server `client` talks to, as the gateway's own service
    /// account (`deploy/gateway/`), with the session key of its namespace's Secret (made when
    /// there is none).
    pub async fn start(client: Client, config: Config) -> Result<Self, String> {
        let key = login::load_key(&client, &config.namespace).await?;
        Ok(Gateway::new(client, config, key))
    }

    /// A gateway that signs sessions with `key`.
    pub fn new(client: Client, config: Config, key: Key) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        // A connection to a workspace's port is kept for a while after a request: the agent
        // samples established connections to its ports as activity, so even a request that
        // takes a millisecond is seen (and a finished session stops counting soon after).
        let upstream = HttpClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_CONNECTION)
            .build(connector);
        let (workspaces, watch_workspaces) = cache(
            Api::<Workspace>::all(client.clone()),
            watcher::Config::default(),
        );
        let (pods, watch_pods) = cache(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(&format!(
                "{}={}",
                berth_api::labels::MANAGED_BY,
                berth_api::labels::MANAGED_BY_VALUE
            )),
        );
        let (kinds, watch_kinds) = cache(
            Api::<berth_api::WorkspaceKind>::all(client.clone()),
            watcher::Config::default(),
        );
        let agent_tokens = config.service_account.as_ref().map(|(namespace, name)| {
            berth_agent::client::AgentTokens::new(
                client.clone(),
                "the gateway's",
                namespace,
                name,
                AGENT_TOKEN_LIFETIME,
            )
        });
        Gateway(Arc::new(Inner {
            agent_tokens,
            workspaces,
            pods,
            kinds,
            watches: vec![watch_workspaces, watch_pods, watch_kinds],
            access: Access::new(client.clone(), config.review_ttl),
            client,
            config,
            upstream,
            key,
        }))
    }

    /// Stops its watches (a process that stops the API server first says nothing of them).
    pub fn stop(&self) {
        for watch in &self.0.watches {
            watch.abort();
        }
    }

    /// Every route: `/healthz`, and every other path to [`handle`].
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
            .fallback(handle)
            .with_state(self.clone())
    }
}

/// Serves the gateway on `listener` until `shutdown` completes, then lets the requests under
/// way finish. HTTP/1.1 and HTTP/2 (cleartext), upgrades (WebSocket) included; each
/// connection must send a request's headers within [`Config::header_timeout`], and an HTTP/2
/// connection that stops answering pings is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::server::{conn::auto, graceful::GracefulShutdown};
    use tower::ServiceExt;
    let header_timeout = gateway.0.config.header_timeout;
    let router = gateway.router();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(header_timeout))
        .keep_alive_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // wait a moment instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            // Telling HTTP/1 from HTTP/2 waits for the first bytes without a timeout of its
            // own: a connection that sends nothing is closed here.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let service = hyper::service::service_fn(
                move |mut request: http::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    router.clone().oneshot(request.map(Body::new))
                },
            );
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

/// One request: which port, who, whether they may, where the pod is, then forward.
async fn handle(State(gateway): State<Gateway>, request: Request) -> Response {
    let headers = request.headers().clone();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or(request.uri().host())
        .map(str::to_owned);
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let domain = gateway.0.config.base_domain.as_deref();
    if dashboard::is_dashboard_host(host.as_deref(), domain)
        && path.split('?').next() != Some(TICKETS)
    {
        return gateway.dashboard(request).await;
    }
    if path
        .split('?')
        .next()
        .is_some_and(|p| p == "/" || p == "/.berth/login")
        && domain.is_none()
    {
        return Page::new(StatusCode::NOT_FOUND, "No dashboard here")
            .line("Berth's dashboard is served at the gateway's base domain (berth gateway --domain), an origin apart from every workspace's; this gateway has none.")
            .answer(&headers);
    }
    if let Some(own) = route::own(host.as_deref(), &path, domain) {
        return gateway.own_page(own, request).await;
    }
    if path.split('?').next() == Some(TICKETS) {
        return gateway.mint_ticket(&path, request).await;
    }
    let target = match route::target(
        host.as_deref(),
        &path,
        gateway.0.config.base_domain.as_deref(),
    ) {
        Ok(target) => target,
        Err(NoTarget::Elsewhere) => {
            return Page::new(StatusCode::NOT_FOUND, "Not a workspace address")
                .line(format!(
                    "Berth's gateway serves a workspace's port at {}<namespace>/<workspace>/<port>/.",
                    route::PREFIX
                ))
                .answer(&headers);
        }
        Err(NoTarget::Malformed(why)) => {
            return Page::new(StatusCode::BAD_REQUEST, "Not a workspace address")
                .line(why)
                .answer(&headers);
        }
        Err(NoTarget::Redirect(location)) => {
            let mut response = StatusCode::PERMANENT_REDIRECT.into_response();
            if let Ok(value) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, value);
            }
            return response;
        }
    };
    let workspace = gateway.cached_workspace(&target);
    let options = workspace
        .as_ref()
        .map(|ws| route::port_options(ws, &target.port, gateway.0.config.allow_public_ports));
    let public = options.as_ref().map(|o| o.public);
    let anonymous = route::bearer(&headers).is_none() && session::cookies(&headers).is_empty();
    if public == Some(Public::NotAllowed) && anonymous {
        return Page::new(StatusCode::UNAUTHORIZED, "Sign in to reach this workspace")
            .line(format!(
                "Port {} of workspace {}/{} is marked public, but this gateway serves a workspace's own port to anyone only when it runs with --allow-public-ports (a port its WorkspaceKind declares public is served to anyone). Send your bearer token, or open the link `berth open {} -n {}` prints.",
                target.port, target.namespace, target.workspace, target.workspace, target.namespace
            ))
            .answer(&headers);
    }
    // A public port is served to anyone; every other port to a caller allowed in.
    let (user, session) = if public == Some(Public::Yes) {
        (None, None)
    } else {
        match gateway
            .caller(&headers, &target, peer_of(&request), request.method())
            .await
        {
            Ok((user, session)) => (Some(user), session),
            Err(refused) => return refused,
        }
    };
    // A port that keeps its prefix gets the path as the caller sent it.
    let target = match options {
        Some(o) if !o.strip_prefix => route::unstripped(target),
        _ => target,
    };
    // A browser session may start a stopped workspace from its page.
    let start = session.map(|s| Form {
        action: format!("{}{}/start", route::session_base(&target), route::OWN),
        fields: vec![
            ("csrf".to_owned(), gateway.0.key.csrf(&s)),
            ("port".to_owned(), target.port.clone()),
        ],
        button: "Start this workspace".to_owned(),
    });
    let backend = match gateway.backend(&target, workspace, start).await {
        Ok(backend) => backend,
        Err(page) => return page.answer(&headers),
    };
    let peer = peer_of(&request);
    gateway.forward(request, &target, backend, peer, user).await
}

/// The address of the caller's end of the connection.
fn peer_of(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// Where `berth open` asks for a login link (POST, with the user's bearer token, the
/// workspace in the query: `?namespace=&workspace=&port=`).
pub const TICKETS: &str = "/.berth/tickets";

/// Seconds since the Unix epoch.
fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// A login link minted for `berth open`: the answer's JSON.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Ticket {
    /// The link's path on this gateway (`/w/<ns>/<ws>/.berth/login?ticket=...`).
    pub path: String,
    /// The port's name it signs in to (the one asked for by name or number, else the
    /// workspace's first).
    #[serde(default)]
    pub port: String,
    /// Where the link is opened: the dashboard's host (the gateway's domain, with the port
    /// the gateway was reached at) for a dashboard link; absent: the gateway's own address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// When it stops working (RFC 3339); it works once.
    pub expires_at: String,
}

impl Gateway {
    /// Who is asking, for `target`'s workspace: the holder of a bearer token (the CLI, curl),
    /// else the browser session of this workspace; authorized to connect to it. Else the
    /// answer that says why not.
    async fn caller(
        &self,
        headers: &http::HeaderMap,
        target: &Target,
        peer: Option<IpAddr>,
        method: &http::Method,
    ) -> Result<(User, Option<Claims>), Response> {
        let access = &self.0.access;
        // A bearer token (the CLI, curl), else the browser's session for this workspace.
        let (user, session) = if let Some(token) = route::bearer(headers) {
            match access.authenticate(token, peer).await {
                Ok(user) => (user, None),
                Err(refusal) => return Err(refusal_page(refusal, target).answer(headers)),
            }
        } else {
            match session::session_for(
                &self.0.key,
                &self.session_cookies(headers),
                &target.namespace,
                &target.workspace,
                now(),
            ) {
                Some(Ok(session)) => {
                    if let Some(why) = session::cross_origin_use(method, headers) {
                        return Err(
                            not_from_its_pages(&why, &target.namespace, &target.workspace)
                                .answer(headers),
                        );
                    }
                    // A session ends when its credential does.
                    if let Err(refusal) = access.still_exists(&session.user).await {
                        return Err(session_ended(refusal, target).answer(headers));
                    }
                    (session.user.clone(), Some(session))
                }
                Some(Err(invalid)) => {
                    return Err(Page::new(StatusCode::UNAUTHORIZED, "Sign in to reach this workspace")
                        .line(format!(
                            "Your browser's session for workspace {}/{} is not valid: {invalid}. Run `berth open {} -n {}` for a new login link.",
                            target.namespace, target.workspace, target.workspace, target.namespace
                        ))
                        .answer(headers));
                }
                None => {
                    let mut page = Page::new(StatusCode::UNAUTHORIZED, "Sign in to reach this workspace")
                        .line(format!(
                            "Workspace {}/{} needs a Kubernetes credential: send your bearer token (Authorization: Bearer ...), as kubectl does, or open the login link `berth open {} -n {}` prints.",
                            target.namespace, target.workspace, target.workspace, target.namespace
                        ));
                    // A browser that came by the path route: its session is on the host.
                    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
                    if let Some(domain) = self.0.config.base_domain.as_deref()
                        && route::checked_host(host, Some(domain)).is_none()
                        && !target.port.is_empty()
                    {
                        page = page.line(format!(
                            "This gateway keeps a browser's session on each workspace's own host: {}.",
                            route::workspace_host_name(
                                &target.port,
                                &target.workspace,
                                &target.namespace,
                                domain,
                                host
                            )
                        ));
                    }
                    return Err(page.answer(headers));
                }
            }
        };
        if let Err(refusal) = access
            .authorize(&user, &target.namespace, &target.workspace)
            .await
        {
            return Err(refusal_page(refusal, target).answer(headers));
        }
        Ok((user, session))
    }

    /// The session cookies a request may use here: with a base domain, browser sessions live
    /// on each workspace's own host only (an origin of its own), so on the gateway's path
    /// route, where every workspace's pages share one origin, none is taken.
    fn session_cookies(&self, headers: &http::HeaderMap) -> Vec<String> {
        let domain = self.0.config.base_domain.as_deref();
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        match domain.is_none() || route::checked_host(host, domain).is_some() {
            true => session::cookies(headers),
            false => vec![],
        }
    }

    /// `POST /.berth/tickets`: a one-time login link for the caller (a bearer token the API
    /// server accepts) to a workspace they may connect to.
    async fn mint_ticket(&self, path: &str, request: Request) -> Response {
        let headers = request.headers();
        if request.method() != http::Method::POST {
            let mut response = Page::new(StatusCode::METHOD_NOT_ALLOWED, "Use POST")
                .line(format!(
                    "{TICKETS} makes a login link: POST, with your bearer token."
                ))
                .answer(headers);
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return response;
        }
        if path.split_once('?').is_some_and(|(_, q)| {
            q.split('&')
                .any(|p| p == "dashboard" || p.starts_with("dashboard="))
        }) {
            return self.mint_dashboard_ticket(request).await;
        }
        let (Some(namespace), Some(workspace)) = (
            route::query_value(path, "namespace"),
            route::query_value(path, "workspace"),
        ) else {
            return Page::new(StatusCode::BAD_REQUEST, "Which workspace?")
                .line(format!(
                    "{TICKETS}?namespace=<namespace>&workspace=<workspace>[&port=<port name or number>]"
                ))
                .answer(headers);
        };
        // The port as asked (a name or a number; none: the first), checked once the caller is
        // known: whoever may connect need not be able to read the workspace to name its port.
        let asked = route::query_value(path, "port").filter(|p| !p.is_empty());
        let target = match route::workspace(&namespace, &workspace) {
            Ok(target) => target,
            Err(why) => {
                return Page::new(StatusCode::BAD_REQUEST, "Not a workspace address")
                    .line(why)
                    .answer(headers);
            }
        };
        let Some(token) = route::bearer(headers) else {
            return Page::new(StatusCode::UNAUTHORIZED, "Who is asking?")
                .line("A login link is made for the holder of a Kubernetes credential: send your bearer token (Authorization: Bearer ...).")
                .answer(headers);
        };
        let access = &self.0.access;
        let user = match access.authenticate(token, peer_of(&request)).await {
            Ok(user) => user,
            Err(refusal) => return refusal_page(refusal, &target).answer(headers),
        };
        if let Err(refusal) = access.authorize(&user, &namespace, &workspace).await {
            return refusal_page(refusal, &target).answer(headers);
        }
        let port = match self.port_in_force(&target, asked.as_deref()).await {
            Ok(port) => port,
            Err(page) => return page.answer(headers),
        };
        let claims = session::ticket(user, &namespace, &workspace, Some(&port), now());
        let signed = self.0.key.sign(&claims);
        let login = format!(
            "{}{}/login?ticket={signed}",
            route::session_base(&target),
            route::OWN
        );
        let ticket = Ticket {
            port,
            host: None,
            path: login,
            expires_at: jiff::Timestamp::from_second(claims.expires)
                .map(|t| t.to_string())
                .unwrap_or_default(),
        };
        let mut response = axum::Json(ticket).into_response();
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    /// `POST /.berth/tickets?dashboard`: a one-time login link to the dashboard for the caller
    /// (a bearer token the API server accepts); the dashboard shows only what they may see.
    async fn mint_dashboard_ticket(&self, request: Request) -> Response {
        let headers = request.headers();
        let Some(domain) = self.0.config.base_domain.as_deref() else {
            return Page::new(StatusCode::NOT_FOUND, "No dashboard here")
                .line("Berth's dashboard is served at the gateway's base domain (berth gateway --domain), an origin apart from every workspace's; this gateway has none.")
                .answer(headers);
        };
        let Some(token) = route::bearer(headers) else {
            return Page::new(StatusCode::UNAUTHORIZED, "Who is asking?")
                .line("A login link is made for the holder of a Kubernetes credential: send your bearer token (Authorization: Bearer ...).")
                .answer(headers);
        };
        let user = match self.0.access.authenticate(token, peer_of(&request)).await {
            Ok(user) => user,
            Err(refusal) => {
                return refusal_page(refusal, &route::Target::default()).answer(headers);
            }
        };
        let claims = session::dashboard_ticket(user, now());
        let listening = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.rsplit_once(':'))
            .filter(|(_, p)| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            .map(|(_, p)| format!(":{p}"))
            .unwrap_or_default();
        let ticket = Ticket {
            path: format!("/{}/login?ticket={}", route::OWN, self.0.key.sign(&claims)),
            port: String::new(),
            host: Some(format!("{}{listening}", domain.trim_start_matches('.'))),
            expires_at: jiff::Timestamp::from_second(claims.expires)
                .map(|t| t.to_string())
                .unwrap_or_default(),
        };
        let mut response = axum::Json(ticket).into_response();
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    /// The gateway's own pages of a workspace: `login` (a ticket becomes a session cookie)
    /// and `start` (the stopped page's button).
    async fn own_page(&self, own: Own, request: Request) -> Response {
        let headers = request.headers().clone();
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let name = format!("{}/{}", own.namespace, own.workspace);
        match (own.action.as_str(), request.method().clone()) {
            ("login", http::Method::GET) => {
                let Some(ticket) = route::query_value(&path, "ticket") else {
                    return Page::new(StatusCode::BAD_REQUEST, "This is not a login link")
                        .line(format!(
                            "`berth open {} -n {}` prints one.",
                            own.workspace, own.namespace
                        ))
                        .answer(&headers);
                };
                let refused = |why: String| {
                    Page::new(StatusCode::UNAUTHORIZED, "This login link does not work")
                        .line(format!("The link for workspace {name} cannot be used: {why}."))
                        .line(format!(
                            "Run `berth open {} -n {}` for a new one: a link works once, within {} seconds.",
                            own.workspace,
                            own.namespace,
                            session::TICKET_TTL_SECONDS
                        ))
                        .answer(&headers)
                };
                let claims = match self.0.key.verify(&ticket, session::Kind::Ticket, now()) {
                    Ok(c) if c.namespace == own.namespace && c.workspace == own.workspace => c,
                    Ok(_) => return refused(session::Invalid::OtherWorkspace.to_string()),
                    Err(invalid) => return refused(invalid.to_string()),
                };
                if own.port.is_some() && claims.port != own.port {
                    return refused(session::Invalid::OtherWorkspace.to_string());
                }
                // With a base domain a session lives on the workspace's own host: the link
                // (unused yet) goes on there.
                if let (None, Some(domain), Some(port)) =
                    (&own.port, &self.0.config.base_domain, &claims.port)
                {
                    let host = route::workspace_host_name(
                        port,
                        &own.workspace,
                        &own.namespace,
                        domain,
                        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
                    );
                    let scheme = if secure(&request) { "https" } else { "http" };
                    let location =
                        format!("{scheme}://{host}/{}/login?ticket={ticket}", route::OWN);
                    let mut response = StatusCode::SEE_OTHER.into_response();
                    if let Ok(value) = HeaderValue::from_str(&location) {
                        response.headers_mut().insert(header::LOCATION, value);
                    }
                    response
                        .headers_mut()
                        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    return response;
                }
                match login::use_ticket(&self.0.client, &self.0.config.namespace, &claims).await {
                    Ok(()) => {}
                    Err(login::Unused::AlreadyUsed) => {
                        return refused("it was used before".to_owned());
                    }
                    Err(login::Unused::Unavailable(why)) => {
                        return Page::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "Cannot sign you in right now",
                        )
                        .line(why)
                        .refresh(5)
                        .answer(&headers);
                    }
                }
                let ttl =
                    i64::try_from(self.0.config.session_ttl.as_secs()).unwrap_or(i64::MAX / 2);
                let session = session::session_of(&claims, ttl, now());
                let cookie = session::set_cookie(
                    &self.0.key.sign(&session),
                    &own.base,
                    ttl,
                    secure(&request),
                );
                let location = match (&own.port, &claims.port) {
                    (None, Some(port)) => format!("{}{port}/", own.base),
                    _ => own.base.clone(),
                };
                let mut response = StatusCode::SEE_OTHER.into_response();
                for (name, value) in [(header::SET_COOKIE, cookie), (header::LOCATION, location)] {
                    if let Ok(value) = HeaderValue::from_str(&value) {
                        response.headers_mut().insert(name, value);
                    }
                }
                response
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                response
            }
            ("start", http::Method::POST) => self.start_button(own, request).await,
            ("shell", http::Method::GET) => self.shell(own, request).await,
            ("ssh", http::Method::GET) => self.ssh(own, request).await,
            (action, http::Method::GET) if action.starts_with("tcp/") => {
                let port = action["tcp/".len()..].to_owned();
                self.tunnel(own, port, request).await
            }
            (action, method) => Page::new(StatusCode::NOT_FOUND, "Not a page of the gateway")
                .line(format!(
                    "The gateway has no {method} {}{action} for workspace {name}.",
                    route::OWN
                ))
                .answer(&headers),
        }
    }

    /// The stopped page's start button: a browser session of a user who may patch the
    /// workspace, from a page the gateway served that session (its CSRF token), from this
    /// site (Origin); then `spec.paused: false`, as `berth start`.
    async fn start_button(&self, own: Own, request: Request) -> Response {
        let headers = request.headers().clone();
        let name = format!("{}/{}", own.namespace, own.workspace);
        let session = match session::session_for(
            &self.0.key,
            &self.session_cookies(&headers),
            &own.namespace,
            &own.workspace,
            now(),
        ) {
            Some(Ok(session)) => session,
            Some(Err(invalid)) => {
                return Page::new(StatusCode::UNAUTHORIZED, "Sign in to start this workspace")
                    .line(format!(
                        "Your browser's session for workspace {name} is not valid: {invalid}."
                    ))
                    .answer(&headers);
            }
            None => {
                return Page::new(StatusCode::UNAUTHORIZED, "Sign in to start this workspace")
                    .line(format!("The start button needs your browser's session for workspace {name}: open the link `berth open {} -n {}` prints.", own.workspace, own.namespace))
                    .answer(&headers);
            }
        };
        if !same_origin(&headers) {
            return Page::new(StatusCode::FORBIDDEN, "Not from this site")
                .line("The start button works from the gateway's own page only.")
                .answer(&headers);
        }
        if let Some(why) = session::cross_origin_use(request.method(), &headers) {
            return not_from_its_pages(&why, &own.namespace, &own.workspace).answer(&headers);
        }
        let body = match axum::body::to_bytes(request.into_body(), 64 * 1024).await {
            Ok(body) => body,
            Err(e) => {
                return Page::new(StatusCode::BAD_REQUEST, "Cannot read the form")
                    .line(e.to_string())
                    .answer(&headers);
            }
        };
        let csrf = route::form_value(&body, "csrf").unwrap_or_default();
        if !self.0.key.csrf_matches(&session, &csrf) {
            return Page::new(StatusCode::FORBIDDEN, "Not from this site")
                .line("The form did not come from the gateway's page of this workspace in this session; load the page again.")
                .answer(&headers);
        }
        if let Err(refusal) = self
            .0
            .access
            .may_patch(&session.user, &own.namespace, &own.workspace)
            .await
        {
            return match refusal {
                Refusal::Forbidden { user, reason } => {
                    let page =
                        Page::new(StatusCode::FORBIDDEN, "Not allowed to start this workspace")
                            .line(access::missing_patch(&user, &own.namespace, &own.workspace));
                    match reason.is_empty() {
                        true => page,
                        false => page.line(format!("The authorizer said: {reason}")),
                    }
                }
                other => refusal_page(other, &own.target()),
            }
            .answer(&headers);
        }
        let patched = Api::<Workspace>::namespaced(self.0.client.clone(), &own.namespace)
            .patch(
                &own.workspace,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
            )
            .await;
        if let Err(e) = patched {
            return Page::new(
                StatusCode::BAD_GATEWAY,
                "The workspace could not be started",
            )
            .line(format!("The API server said: {}", api_words(&e)))
            .answer(&headers);
        }
        let port = route::form_value(&body, "port")
            .filter(|p| !p.is_empty() && !p.contains(['/', '?', '#']));
        let location = match (&own.port, port) {
            (None, Some(port)) => format!("{}{port}/", own.base),
            _ => own.base.clone(),
        };
        let mut response = StatusCode::SEE_OTHER.into_response();
        if let Ok(value) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, value);
        }
        response
    }
}

impl Gateway {
    /// `GET .berth/tcp/<port>` as a WebSocket (`berth port-forward`): a TCP connection to the
    /// workspace's port, its bytes in binary messages both ways, for a caller allowed to
    /// connect to the workspace; the same pod and port rules as HTTP.
    async fn tunnel(&self, own: Own, port: String, request: Request) -> Response {
        let headers = request.headers().clone();
        // The port (a name or a number) is checked once the caller is known.
        let mut target = own.target();
        let user = match self
            .caller(&headers, &target, peer_of(&request), request.method())
            .await
        {
            Ok((user, _)) => user,
            Err(refused) => return refused,
        };
        target.port = match self.port_in_force(&target, Some(&port)).await {
            Ok(name) => name,
            Err(page) => return page.answer(&headers),
        };
        let workspace = self.cached_workspace(&target);
        let backend = match self.backend(&target, workspace, None).await {
            Ok(backend) => backend,
            Err(page) => return page.answer(&headers),
        };
        let upgrade = match websocket(request, "a TCP tunnel", "berth port-forward").await {
            Ok(upgrade) => upgrade,
            Err(refused) => return refused,
        };
        // Connected before the upgrade, so a port that does not answer is an HTTP answer.
        let connected = tokio::time::timeout(
            self.0.config.connect_timeout,
            tokio::net::TcpStream::connect(backend),
        )
        .await;
        let stream = match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return unreachable_port(&target, backend, &e).answer(&headers),
            Err(_) => {
                return unreachable_port(&target, backend, &"no answer within the connect timeout")
                    .answer(&headers);
            }
        };
        let _ = stream.set_nodelay(true);
        let gateway = self.clone();
        upgrade.on_upgrade(move |socket| async move {
            tokio::select! {
                () = pump(socket, stream) => {}
                _ = gateway.revoked(&user, &own.namespace, &own.workspace) => {}
            }
        })
    }
}

impl Gateway {
    /// `GET .berth/shell` as a WebSocket (`berth shell`, see [`shell`]): for a caller with a
    /// bearer token who may connect to the workspace, a command in its container, run by the
    /// agent of the ready pod Berth owns for it. A browser session opens no shell: on a path
    /// route every workspace's pages share the gateway's origin, so a page of one workspace
    /// could otherwise open a shell in another with its visitor's cookie.
    async fn shell(&self, own: Own, request: Request) -> Response {
        let (user, agent, request) = match self.agent_for(&own, request, "A shell").await {
            Ok(found) => found,
            Err(refused) => return refused,
        };
        let upgrade = match websocket(request, "a shell", "berth shell").await {
            Ok(upgrade) => upgrade,
            Err(refused) => return refused,
        };
        let gateway = self.clone();
        upgrade.on_upgrade(move |mut socket| async move {
            let start = match shell::first(&mut socket).await {
                Ok(start) => start,
                Err(message) => return shell::refuse(socket, message).await,
            };
            let start = shell::start(start, &user.username);
            let opened = gateway.open_shell(&own.namespace, &agent, start).await;
            match opened {
                Ok((inputs, outputs)) => {
                    let revoked = gateway.revoked(&user, &own.namespace, &own.workspace);
                    shell::bridge(socket, inputs, outputs, revoked).await
                }
                Err(message) => shell::refuse(socket, message).await,
            }
        })
    }

    /// `GET .berth/ssh` as a WebSocket (`berth ssh`, see [`ssh`]): for a caller with a bearer
    /// token who may connect to the workspace, an SSH connection to the agent's SSH server in
    /// the ready pod Berth owns for it (its host key first; only that with `?hostKey`). As
    /// for shells, a browser session opens none.
    async fn ssh(&self, own: Own, request: Request) -> Response {
        let key_only = request.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == "hostKey" || p.starts_with("hostKey="))
        });
        let (user, agent, request) = match self.agent_for(&own, request, "SSH").await {
            Ok(found) => found,
            Err(refused) => return refused,
        };
        let upgrade = match websocket(request, "SSH", "berth ssh").await {
            Ok(upgrade) => upgrade,
            Err(refused) => return refused,
        };
        let gateway = self.clone();
        upgrade.on_upgrade(move |socket| async move {
            let start = berth_agent::proto::SshInput {
                input: Some(berth_agent::proto::ssh_input::Input::Start(
                    berth_agent::proto::SshStart {
                        on_behalf_of: user.username.clone(),
                        host_key_only: key_only,
                    },
                )),
            };
            match gateway.open_ssh(&own.namespace, &agent, start).await {
                Ok((inputs, outputs)) => {
                    let revoked = gateway.revoked(&user, &own.namespace, &own.workspace);
                    ssh::bridge(socket, inputs, outputs, revoked).await
                }
                Err(message) => ssh::refuse(socket, message).await,
            }
        })
    }

    /// For a shell or SSH (`what`): the caller (with a bearer token, allowed to connect to
    /// the workspace) and the agent of the workspace's ready pod; else the answer saying why
    /// not.
    async fn agent_for(
        &self,
        own: &Own,
        request: Request,
        what: &str,
    ) -> Result<(User, Agent, Request), Response> {
        let headers = request.headers().clone();
        let target = own.target();
        let name = format!("{}/{}", own.namespace, own.workspace);
        if route::bearer(&headers).is_none() {
            return Err(Page::new(StatusCode::UNAUTHORIZED, format!("{what} needs your credential"))
                .line(format!(
                    "{what} in workspace {name} is opened for the holder of a Kubernetes bearer token (`berth shell {} -n {}` and `berth ssh` send yours); a browser session opens none.",
                    own.workspace, own.namespace
                ))
                .answer(&headers));
        }
        let (user, _) = self
            .caller(&headers, &target, peer_of(&request), request.method())
            .await?;
        if self.0.agent_tokens.is_none() {
            return Err(Page::new(StatusCode::SERVICE_UNAVAILABLE, "This gateway opens no shells and no SSH")
                .line("It runs without a service account of its own (berth gateway --service-account), whose token the workspace's agent would accept.")
                .answer(&headers));
        }
        let workspace = self.cached_workspace(&target);
        let pod = self
            .ready_pod(&target, workspace)
            .await
            .map_err(|page| page.answer(&headers))?;
        let Some(address) = agent_address(&pod) else {
            return Err(Page::new(StatusCode::CONFLICT, "This workspace has no agent")
                .line(format!("No container of workspace {name}'s pod runs Berth's agent, or the pod has no IP yet."))
                .answer(&headers));
        };
        let tls = match (
            berth_core::pod::mounts_agent_tls(
                (pod.spec.iter())
                    .flat_map(|s| s.volumes.iter().flatten())
                    .map(|v| v.name.as_str()),
            ),
            &self.0.config.agent_tls_ca,
        ) {
            (false, _) => None,
            (true, Some(ca)) => Some(berth_agent::client::ClientTls { ca_pem: ca.clone() }),
            (true, None) => {
                return Err(Page::new(StatusCode::SERVICE_UNAVAILABLE, "Cannot reach the workspace's agent")
                    .line("The agent serves TLS and this gateway has no CA to verify it (berth gateway --agent-tls-ca).")
                    .answer(&headers));
            }
        };
        Ok((user, Agent { address, tls }, request))
    }

    /// Opens a stream (a shell, an SSH connection) on an agent with `start` first, by `call`,
    /// with the gateway's token for `namespace` (requested again, and the stream asked for
    /// again, when the agent rejected a cached one); the sender of further inputs and the
    /// outputs, or why not, in words.
    async fn open_stream<I, O, F, Fut>(
        &self,
        namespace: &str,
        start: I,
        call: F,
    ) -> Result<(tokio::sync::mpsc::Sender<I>, tonic::Streaming<O>), String>
    where
        I: Clone + Send + 'static,
        F: Fn(String, tokio_stream::wrappers::ReceiverStream<I>) -> Fut,
        Fut: Future<Output = Result<tonic::Streaming<O>, berth_agent::client::CallError>>,
    {
        use berth_agent::client::{CallError, token_rejected};
        let tokens = self.0.agent_tokens.as_ref().ok_or("no service account")?;
        let mut renewed = false;
        loop {
            let (token, fresh) = tokens.token(namespace).await?;
            let (inputs, queued) = tokio::sync::mpsc::channel(16);
            let _ = inputs.try_send(start.clone());
            let queued = tokio_stream::wrappers::ReceiverStream::new(queued);
            match call(token.clone(), queued).await {
                Ok(outputs) => return Ok((inputs, outputs)),
                Err(CallError::Refused(status))
                    if !fresh && !renewed && token_rejected(&status) =>
                {
                    tokens.forget(namespace, &token).await;
                    renewed = true;
                }
                Err(CallError::Refused(status)) => {
                    return Err(format!("the agent said: {}", status.message()));
                }
                Err(unreachable) => return Err(unreachable.to_string()),
            }
        }
    }

    /// Opens a shell on `agent` with `start` ([`Gateway::open_stream`]).
    async fn open_shell(
        &self,
        namespace: &str,
        agent: &Agent,
        start: berth_agent::proto::ShellInput,
    ) -> Result<
        (
            tokio::sync::mpsc::Sender<berth_agent::proto::ShellInput>,
            tonic::Streaming<berth_agent::proto::ShellOutput>,
        ),
        String,
    > {
        let timeout = self.0.config.connect_timeout;
        self.open_stream(namespace, start, |token, queued| async move {
            berth_agent::client::shell(&agent.address, &token, timeout, agent.tls.as_ref(), queued)
                .await
        })
        .await
    }

    /// Opens an SSH connection on `agent` with `start` ([`Gateway::open_stream`]): the sender
    /// of the client's bytes and the agent's outputs, or why not.
    async fn open_ssh(
        &self,
        namespace: &str,
        agent: &Agent,
        start: berth_agent::proto::SshInput,
    ) -> Result<
        (
            tokio::sync::mpsc::Sender<berth_agent::proto::SshInput>,
            tonic::Streaming<berth_agent::proto::SshOutput>,
        ),
        String,
    > {
        let timeout = self.0.config.connect_timeout;
        self.open_stream(namespace, start, |token, queued| async move {
            berth_agent::client::ssh(&agent.address, &token, timeout, agent.tls.as_ref(), queued)
                .await
        })
        .await
    }
}

/// Where a workspace's agent is: its address, and the TLS it is reached with.
struct Agent {
    address: String,
    tls: Option<berth_agent::client::ClientTls>,
}

/// The address (`ip:port`) of Berth's agent in `pod`: the pod's IP and the port the operator
/// gave the container that runs the agent.
fn agent_address(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    let port = berth_core::pod::agent_port(pod)?;
    Some(berth_core::state::agent_address(ip, port))
}

impl Gateway {
    /// Resolves, with words saying so, once `user` may no longer connect to workspace
    /// `namespace/name`: asked again every `review_ttl` while a WebSocket, tunnel or shell of
    /// theirs is open, so removing someone's Role ends those too (an API server that cannot
    /// answer ends nothing).
    async fn revoked(&self, user: &User, namespace: &str, name: &str) -> String {
        let every = self.0.config.review_ttl.max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            if let Err(Refusal::Unauthenticated(why)) = self.0.access.still_exists(user).await {
                return format!("{} is no longer valid: {why}", user.username);
            }
            if let Err(Refusal::Forbidden { .. }) =
                self.0.access.authorize(user, namespace, name).await
            {
                return format!(
                    "{} may no longer connect to workspace {namespace}/{name}",
                    user.username
                );
            }
        }
    }
}

/// The WebSocket `request` asks for; else 400 saying `what` is one and `which` CLI opens it.
async fn websocket(
    request: Request,
    what: &str,
    which: &str,
) -> Result<axum::extract::ws::WebSocketUpgrade, Response> {
    use axum::extract::FromRequest;
    let headers = request.headers().clone();
    axum::extract::ws::WebSocketUpgrade::from_request(request, &())
        .await
        .map_err(|rejection| {
            Page::new(StatusCode::BAD_REQUEST, "Not a WebSocket")
                .line(format!(
                    "{}: {what} is a WebSocket ({which} opens one).",
                    rejection.body_text()
                ))
                .answer(&headers)
        })
}

/// The page of a workspace port that does not take connections.
fn unreachable_port(target: &Target, backend: SocketAddr, why: &dyn std::fmt::Display) -> Page {
    Page::new(StatusCode::BAD_GATEWAY, "The workspace's port does not answer").line(format!(
        "Port {} ({}) of workspace {}/{} did not answer: {why}. Is its server listening on the pod's address?",
        target.port,
        backend.port(),
        target.namespace,
        target.workspace,
    ))
}

/// Joins a WebSocket and a TCP connection: binary messages in, bytes out, and back.
async fn pump(socket: axum::extract::ws::WebSocket, stream: tokio::net::TcpStream) {
    use axum::extract::ws::Message;
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut to_caller, mut from_caller) = socket.split();
    let (mut read, mut write) = stream.into_split();
    let up = async move {
        while let Some(Ok(message)) = from_caller.next().await {
            if let Message::Close(_) = message {
                break;
            }
            if let Message::Binary(bytes) = message
                && write.write_all(&bytes).await.is_err()
            {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    let down = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = axum::body::Bytes::copy_from_slice(&buffer[..n]);
                    if to_caller.send(Message::Binary(chunk)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_caller.send(Message::Close(None)).await;
    };
    // Either side ending ends both: a caller gone leaves no connection holding the workspace
    // open (it would count as use), and a port that closed has nothing more to say.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Whether the request came over TLS to whatever is in front of the gateway.
fn secure(request: &Request) -> bool {
    request.uri().scheme_str() == Some("https")
        || request
            .headers()
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// A browser's POST names its page's origin: it must be this host (a form on another site
/// posting here is refused even with the cookie). No Origin (an old browser, a tool) is let
/// through: the CSRF token still has to match.
fn same_origin(headers: &http::HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin.split_once("://").map(|(_, h)| h);
    origin_host.is_some() && origin_host == host
}

fn refusal_page(refusal: Refusal, target: &Target) -> Page {
    match refusal {
        Refusal::Unauthenticated(why) => {
            Page::new(StatusCode::UNAUTHORIZED, "Sign in to reach this workspace").line(format!(
                "The API server does not accept this credential: {why}"
            ))
        }
        Refusal::Forbidden { user, reason } => {
            let page = Page::new(StatusCode::FORBIDDEN, "Not allowed into this workspace").line(
                access::missing_permission(&user, &target.namespace, &target.workspace),
            );
            match reason.is_empty() {
                true => page,
                false => page.line(format!("The authorizer said: {reason}")),
            }
        }
        Refusal::Unavailable(why) => Page::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Cannot check who you are right now",
        )
        .line(why)
        .refresh(5),
        Refusal::TooMany(wait) => {
            let seconds = u32::try_from(wait.as_secs().max(1)).unwrap_or(u32::MAX);
            Page::new(StatusCode::TOO_MANY_REQUESTS, "Too many refused credentials")
                .line(format!(
                    "Your address sent more than {} credentials the API server does not accept within {} seconds; try again in {seconds} seconds, with a valid one.",
                    access::REFUSED_TOKENS_PER_ADDRESS,
                    access::REFUSAL_WINDOW.as_secs()
                ))
                .refresh(seconds)
        }
    }
}

/// The page of a request that a browser session would authenticate but that did not come
/// from the workspace's own pages.
fn not_from_its_pages(why: &str, namespace: &str, workspace: &str) -> Page {
    Page::new(StatusCode::FORBIDDEN, "Not from this workspace's page").line(format!(
        "Your browser's session for workspace {namespace}/{workspace} is used only by that workspace's own pages, or by opening a link to it; this request was not: {why}."
    ))
}

/// The page of a browser session whose identity is gone (or that cannot be checked now).
fn session_ended(refusal: Refusal, target: &Target) -> Page {
    match refusal {
        Refusal::Unauthenticated(why) => {
            Page::new(StatusCode::UNAUTHORIZED, "Sign in to reach this workspace").line(format!(
                "Your browser's session for workspace {}/{} has ended: {why}. Run `berth open {} -n {}` for a new login link.",
                target.namespace, target.workspace, target.workspace, target.namespace
            ))
        }
        other => refusal_page(other, target),
    }
}

/// The page of an API server that cannot answer the gateway's read.
fn unavailable(e: kube::Error) -> Page {
    Page::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "Cannot read the workspace right now",
    )
    .line(format!("The API server said: {}", api_words(&e)))
    .refresh(5)
}

impl Gateway {
    /// The name of the port of `target`'s workspace asked for by name or number (None: its
    /// first), among its ports in force; else the page that says which it has.
    async fn port_in_force(&self, target: &Target, asked: Option<&str>) -> Result<String, Page> {
        let workspace = match self.cached_workspace(target) {
            Some(workspace) => (*workspace).clone(),
            None => self.live(target).await?.0,
        };
        berth_api::resolution::port_in_force(&workspace, asked)
            .map(|p| p.name)
            .map_err(|why| Page::new(StatusCode::NOT_FOUND, "No such port").line(why))
    }

    /// The workspace `target` names as the watch last saw it. Only the cache: what is read
    /// before a caller is authenticated must cost the API server nothing (`backend` reads the
    /// API itself when the cache does not show a ready pod).
    fn cached_workspace(&self, target: &Target) -> Option<Arc<Workspace>> {
        self.0
            .workspaces
            .get(&ObjectRef::new(&target.workspace).within(&target.namespace))
    }

    /// The ready pod Berth owns for `target`'s workspace, with the workspace Running (the
    /// watch's cache first, then the API server); else the page that says why.
    async fn ready_pod(
        &self,
        target: &Target,
        workspace: Option<Arc<Workspace>>,
    ) -> Result<Arc<Pod>, Page> {
        if let Some((pod, _)) = self.cached_ready(target, workspace) {
            return Ok(pod);
        }
        let (workspace, pod) = self.live(target).await?;
        match (pod, running(&workspace)) {
            (Some(pod), true) => Ok(Arc::new(pod)),
            _ => Err(status_page(&workspace, None)),
        }
    }

    /// The workspace and the pod Berth owns for it (if ready) as the API server says now.
    async fn live(&self, target: &Target) -> Result<(Workspace, Option<Pod>), Page> {
        let workspace = Api::<Workspace>::namespaced(self.0.client.clone(), &target.namespace)
            .get_opt(&target.workspace)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                Page::new(StatusCode::NOT_FOUND, "No such workspace").line(format!(
                    "There is no workspace {} in namespace {}.",
                    target.workspace, target.namespace
                ))
            })?;
        let pod = Api::<Pod>::namespaced(self.0.client.clone(), &target.namespace)
            .get_opt(&berth_core::pod::pod_name(&target.workspace))
            .await
            .map_err(unavailable)?
            .filter(|pod| serves(pod, &workspace));
        Ok((workspace, pod))
    }

    /// The address of the workspace's port: its pod must be the one Berth owns for it (its
    /// controller reference is the workspace's UID), ready, not being deleted, with the
    /// workspace Running; the port must be one the pod's containers declare by that name.
    /// Otherwise the page that says why.
    async fn backend(
        &self,
        target: &Target,
        workspace: Option<Arc<Workspace>>,
        start: Option<Form>,
    ) -> Result<SocketAddr, Page> {
        // The watches' caches first: the common case asks the API server nothing.
        if let Some((pod, cached)) = self.cached_ready(target, workspace)
            && let Ok(address) = address(&pod, target, || status_page(&cached, None))
        {
            return Ok(address);
        }
        // Otherwise as the API server says now: a cache a moment behind never turns a
        // starting workspace away.
        let (workspace, pod) = self.live(target).await?;
        let (Some(pod), true) = (pod, running(&workspace)) else {
            return Err(status_page(&workspace, start));
        };
        address(&pod, target, || status_page(&workspace, start))
    }

    /// The ready pod Berth owns for `workspace` (as the watch last saw it) and the workspace,
    /// if the watches' caches show it Running with one.
    fn cached_ready(
        &self,
        target: &Target,
        workspace: Option<Arc<Workspace>>,
    ) -> Option<(Arc<Pod>, Arc<Workspace>)> {
        let workspace = workspace?;
        let pod = self.0.pods.get(
            &ObjectRef::new(&berth_core::pod::pod_name(&target.workspace))
                .within(&target.namespace),
        )?;
        (running(&workspace) && serves(&pod, &workspace)).then_some((pod, workspace))
    }

    /// Forwards the request to `backend` and streams the answer back; a WebSocket (or any
    /// upgrade the workspace accepts) is then joined byte for byte.
    async fn forward(
        &self,
        mut request: Request,
        target: &Target,
        backend: SocketAddr,
        peer: Option<IpAddr>,
        user: Option<User>,
    ) -> Response {
        let upgrade = route::wants_upgrade(request.headers());
        let caller = upgrade.then(|| hyper::upgrade::on(&mut request));
        let (parts, body) = request.into_parts();
        let Ok(uri) = format!("http://{backend}{}", target.path).parse::<Uri>() else {
            return Page::new(StatusCode::BAD_REQUEST, "Not a workspace address")
                .line(format!("{} is not a path", target.path))
                .answer(&parts.headers);
        };
        let proto = parts.uri.scheme_str().unwrap_or("http");
        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let checked = route::checked_host(host, self.0.config.base_domain.as_deref());
        let mut headers = route::forwarded_request_headers(
            &parts.headers,
            upgrade,
            &target.prefix,
            proto,
            peer,
            checked,
        );
        if !headers.contains_key(header::HOST)
            && let Some(authority) = parts.uri.authority()
            && let Ok(value) = HeaderValue::from_str(authority.as_str())
        {
            headers.insert(header::HOST, value);
        }
        let mut upstream = http::Request::new(body);
        *upstream.method_mut() = parts.method.clone();
        *upstream.uri_mut() = uri;
        *upstream.version_mut() = Version::HTTP_11;
        *upstream.headers_mut() = headers;
        let mut response = match self.0.upstream.request(upstream).await {
            Ok(response) => response,
            Err(e) => {
                return unreachable_port(target, backend, &error_chain(&e)).answer(&parts.headers);
            }
        };
        let switched = upgrade && response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if let (true, Some(caller)) = (switched, caller) {
            let workspace = hyper::upgrade::on(&mut response);
            let (gateway, namespace, name) = (
                self.clone(),
                target.namespace.clone(),
                target.workspace.clone(),
            );
            tokio::spawn(async move {
                if let (Ok(caller), Ok(workspace)) = tokio::join!(caller, workspace) {
                    let (mut caller, mut workspace) =
                        (TokioIo::new(caller), TokioIo::new(workspace));
                    let joined = tokio::io::copy_bidirectional(&mut caller, &mut workspace);
                    // A public port's caller has no permission to lose.
                    let revoked = async {
                        match &user {
                            Some(user) => gateway.revoked(user, &namespace, &name).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = joined => {}
                        _ = revoked => {}
                    }
                }
            });
        }
        let headers = route::forwarded_response_headers(response.headers(), switched);
        let (mut parts, body) = response.into_parts();
        parts.headers = headers;
        Response::from_parts(parts, Body::new(body))
    }
}

/// Whether the workspace's phase is Running.
fn running(workspace: &Workspace) -> bool {
    workspace.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running)
}

/// The address of `target`'s port on `pod`: a port its containers declare by that name, at
/// the pod's IP (without one, `no_ip`'s page).
fn address(pod: &Pod, target: &Target, no_ip: impl FnOnce() -> Page) -> Result<SocketAddr, Page> {
    let declared: Vec<(String, i32)> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.clone()?, p.container_port)))
        .collect();
    let Some(port) = declared
        .iter()
        .find(|(name, _)| *name == target.port)
        .and_then(|(_, p)| u16::try_from(*p).ok())
    else {
        let names: Vec<&str> = declared.iter().map(|(n, _)| n.as_str()).collect();
        return Err(
            Page::new(StatusCode::NOT_FOUND, "No such port").line(format!(
                "Workspace {}/{} has no port named {:?}; its ports: {}.",
                target.namespace,
                target.workspace,
                target.port,
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            )),
        );
    };
    let ip: IpAddr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(no_ip)?;
    Ok(SocketAddr::new(ip, port))
}

/// Whether `pod` is the one the gateway may reach for `workspace`: Berth's for that
/// workspace (its controller reference is the workspace's UID: a pod someone else created
/// under the derived name never is), Ready, and not on its way out.
pub fn serves(pod: &Pod, workspace: &Workspace) -> bool {
    berth_core::pod::is_owned_by(&pod.metadata, workspace)
        && pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == pod_conditions::READY && c.is(ConditionStatus::True))
}

/// What a person sees of a workspace that cannot be reached yet, or any more: its phase and
/// message, refreshed while it may still come up.
fn status_page(workspace: &Workspace, start: Option<Form>) -> Page {
    let name = format!(
        "{}/{}",
        workspace.metadata.namespace.as_deref().unwrap_or_default(),
        workspace.metadata.name.as_deref().unwrap_or_default()
    );
    let status = workspace.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let message = status.message.unwrap_or_default();
    let since = find_condition(&status.conditions, types::READY)
        .map(|c| c.last_transition_time.0.to_string())
        .unwrap_or_default();
    let page = match phase {
        Phase::Stopped => Page::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Workspace {name} is stopped"),
        )
        .line(if message.is_empty() {
            "It was paused.".to_owned()
        } else {
            message
        })
        .line(format!(
            "Stopped since {since}. Start it by setting spec.paused to false (berth start)."
        ))
        .form(start)
        .refresh(10),
        Phase::Failed => Page::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Workspace {name} has failed"),
        )
        .line(message)
        .line("Berth does not try again until its spec changes.".to_owned()),
        phase => Page::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Workspace {name} is not ready: {phase}"),
        )
        .line(message)
        .refresh(2),
    };
    page.line(format!("Phase: {phase}"))
}

/// What the API server said, in its own words: a refusal's message (with its reason and
/// code), never kube's debug dump of the Status; any other error with its causes.
pub fn api_words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => match status.reason.is_empty() {
            true => format!("{} ({})", status.message, status.code),
            false => format!("{} ({}, {})", status.message, status.reason, status.code),
        },
        other => error_chain(other),
    }
}

/// An error with each of its causes, as `a: b: c` (hyper's and reqwest's outer errors say
/// little on their own).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_api_refusal_is_shown_in_the_servers_words_not_as_a_dump() {
        let status: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "workspaces.berth.dev \"w\" is forbidden: denied"
        }))
        .unwrap();
        let words = api_words(&kube::Error::Api(Box::new(status)));
        assert_eq!(
            words,
            "workspaces.berth.dev \"w\" is forbidden: denied (Forbidden, 403)"
        );
        assert!(!words.contains("Status"));
    }

    #[test]
    fn only_berths_ready_pod_of_the_workspace_is_reached() {
        let workspace: Workspace = serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "web", "namespace": "n", "uid": "ws-uid"},
            "spec": {"image": "x:1"}
        }))
        .unwrap();
        let pod = |owner: &str, controller: bool, ready: &str, deleting: bool| -> Pod {
            let mut meta = json!({"name": "web-ws", "namespace": "n", "ownerReferences": [{
                "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "name": "web",
                "uid": owner, "controller": controller
            }]});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(json!({
                "metadata": meta,
                "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        assert!(serves(&pod("ws-uid", true, "True", false), &workspace));
        assert!(
            !serves(&pod("other-uid", true, "True", false), &workspace),
            "someone else's"
        );
        assert!(
            !serves(&pod("ws-uid", false, "True", false), &workspace),
            "not its controller"
        );
        assert!(
            !serves(&pod("ws-uid", true, "False", false), &workspace),
            "not ready"
        );
        assert!(
            !serves(&pod("ws-uid", true, "True", true), &workspace),
            "being deleted"
        );
    }
}
