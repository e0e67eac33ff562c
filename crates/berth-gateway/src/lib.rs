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

pub mod access;
pub mod pages;
pub mod route;

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
use kube::{Api, Client};

use access::{Access, Refusal};
use pages::Page;
use route::{NoTarget, Target};

/// How long an unused connection to a workspace's port is kept open (for reuse, and so the
/// agent's sampling of connections sees every request as activity).
pub const IDLE_CONNECTION: Duration = Duration::from_secs(30);

/// How the gateway behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// With a base domain, `<port>--<workspace>--<namespace>.<domain>` reaches a port too.
    pub base_domain: Option<String>,
    /// How long an answer of TokenReview or SubjectAccessReview is used before asking again.
    pub review_ttl: Duration,
    /// How long connecting to a workspace's port may take.
    pub connect_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            base_domain: None,
            review_ttl: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
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
}

impl Gateway {
    /// A gateway that asks the API server `client` talks to, as the gateway's own service
    /// account (`deploy/gateway/`).
    pub fn new(client: Client, config: Config) -> Self {
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
        Gateway(Arc::new(Inner {
            access: Access::new(client.clone(), config.review_ttl),
            client,
            config,
            upstream,
        }))
    }

    /// Every route: `/healthz`, and every other path to [`handle`].
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
            .fallback(handle)
            .with_state(self.clone())
    }
}

/// Serves the gateway on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        gateway
            .router()
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
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
    let Some(token) = route::bearer(&headers) else {
        return Page::new(StatusCode::UNAUTHORIZED, "Sign in to reach this workspace")
            .line(format!(
                "Workspace {}/{} needs a Kubernetes credential: send your bearer token (Authorization: Bearer ...), as kubectl does.",
                target.namespace, target.workspace
            ))
            .answer(&headers);
    };
    let access = &gateway.0.access;
    let refused = match access.authenticate(token).await {
        Err(refusal) => Some(refusal),
        Ok(user) => access
            .authorize(&user, &target.namespace, &target.workspace)
            .await
            .err(),
    };
    if let Some(refusal) = refused {
        return refusal_page(refusal, &target).answer(&headers);
    }
    let backend = match gateway.backend(&target).await {
        Ok(backend) => backend,
        Err(page) => return page.answer(&headers),
    };
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    gateway.forward(request, &target, backend, peer).await
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
    }
}

impl Gateway {
    /// The address of the workspace's port: its pod must be the one Berth owns for it (its
    /// controller reference is the workspace's UID), ready, not being deleted, with the
    /// workspace Running; the port must be one the pod's containers declare by that name.
    /// Otherwise the page that says why.
    async fn backend(&self, target: &Target) -> Result<SocketAddr, Page> {
        let client = &self.0.client;
        let unavailable = |e: kube::Error| {
            Page::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Cannot read the workspace right now",
            )
            .line(format!("The API server said: {e}"))
            .refresh(5)
        };
        let workspace = Api::<Workspace>::namespaced(client.clone(), &target.namespace)
            .get_opt(&target.workspace)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                Page::new(StatusCode::NOT_FOUND, "No such workspace").line(format!(
                    "There is no workspace {} in namespace {}.",
                    target.workspace, target.namespace
                ))
            })?;
        let pod = Api::<Pod>::namespaced(client.clone(), &target.namespace)
            .get_opt(&berth_core::pod::pod_name(&target.workspace))
            .await
            .map_err(unavailable)?
            .filter(|pod| serves(pod, &workspace));
        let running = workspace.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running);
        let (Some(pod), true) = (pod, running) else {
            return Err(status_page(&workspace));
        };
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
            .ok_or_else(|| status_page(&workspace))?;
        Ok(SocketAddr::new(ip, port))
    }

    /// Forwards the request to `backend` and streams the answer back; a WebSocket (or any
    /// upgrade the workspace accepts) is then joined byte for byte.
    async fn forward(
        &self,
        mut request: Request,
        target: &Target,
        backend: SocketAddr,
        peer: Option<IpAddr>,
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
        let mut headers =
            route::forwarded_request_headers(&parts.headers, upgrade, &target.prefix, proto, peer);
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
                return Page::new(StatusCode::BAD_GATEWAY, "The workspace's port does not answer")
                    .line(format!(
                        "Port {} ({}) of workspace {}/{} did not answer: {}. Is its server listening on the pod's address?",
                        target.port,
                        backend.port(),
                        target.namespace,
                        target.workspace,
                        error_chain(&e)
                    ))
                    .answer(&parts.headers);
            }
        };
        let switched = upgrade && response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if let (true, Some(caller)) = (switched, caller) {
            let workspace = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                if let (Ok(caller), Ok(workspace)) = tokio::join!(caller, workspace) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(caller),
                        &mut TokioIo::new(workspace),
                    )
                    .await;
                }
            });
        }
        let headers = route::forwarded_response_headers(response.headers(), switched);
        let (mut parts, body) = response.into_parts();
        parts.headers = headers;
        Response::from_parts(parts, Body::new(body))
    }
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
fn status_page(workspace: &Workspace) -> Page {
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

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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
