//! `berth gateway`: the authenticated way into workspaces (crates/berth-gateway).

use std::{net::SocketAddr, time::Duration};

use berth_controller::config::ServiceAccountRef;

use crate::controller::{POD_TOKEN, duration, token_service_account};

/// Options of `berth gateway`.
#[derive(clap::Args, Debug)]
pub struct GatewayArgs {
    /// Where to listen for callers (behind an Ingress or a LoadBalancer that terminates TLS).
    #[arg(long, default_value = "0.0.0.0:8080", env = "BERTH_GATEWAY_LISTEN")]
    pub listen: SocketAddr,
    /// Also serve `<port>--<workspace>--<namespace>.<domain>` (a wildcard DNS name and
    /// certificate for `*.<domain>` point at the gateway).
    #[arg(long, env = "BERTH_GATEWAY_DOMAIN")]
    pub domain: Option<String>,
    /// How long an answer of TokenReview or SubjectAccessReview is used before asking again
    /// (a revoked RoleBinding takes effect within it).
    #[arg(long, default_value = "10s", value_parser = duration, env = "BERTH_GATEWAY_REVIEW_TTL")]
    pub review_ttl: Duration,
    /// The gateway's namespace: where it keeps the Secret with the key that signs browser
    /// sessions (made when there is none) and the records of used login links.
    #[arg(long, default_value = "berth-system", env = "POD_NAMESPACE")]
    pub namespace: String,
    /// How long a browser session lasts (each request is still authorized).
    #[arg(long, default_value = "12h", value_parser = duration, env = "BERTH_GATEWAY_SESSION_TTL")]
    pub session_ttl: Duration,
    /// Serve a workspace's own ports marked `public: true` to anyone, without a credential
    /// (a port its WorkspaceKind declares public is served so anyway: the kind's author
    /// published it).
    #[arg(long, env = "BERTH_GATEWAY_ALLOW_PUBLIC_PORTS")]
    pub allow_public_ports: bool,
    /// The gateway's own service account, NAMESPACE/NAME: `berth shell` reaches a workspace's
    /// agent with its tokens (TokenRequest), which need `shell` on `workspaces/agent`.
    /// Default: in a pod, the pod's own; elsewhere none, and no shells.
    #[arg(long, env = "BERTH_SERVICE_ACCOUNT", value_parser = |s: &str| s.parse::<ServiceAccountRef>())]
    pub service_account: Option<ServiceAccountRef>,
    /// How long a caller may take to send a request's headers before the connection is
    /// closed (half-sent requests cannot hold sockets open).
    #[arg(long, default_value = "10s", value_parser = duration, env = "BERTH_GATEWAY_HEADER_TIMEOUT")]
    pub header_timeout: Duration,
    /// The CA bundle (PEM file) agents' TLS certificates are verified against, where the
    /// operator runs with --agent-tls-secret. Default: none.
    #[arg(long, env = "BERTH_AGENT_TLS_CA")]
    pub agent_tls_ca: Option<std::path::PathBuf>,
}

/// Serves until SIGTERM or Ctrl-C, with the kubeconfig's or the pod's credentials.
pub async fn run(args: GatewayArgs) -> Result<(), String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot reach the API server: {e}"))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let service_account = args.service_account.or_else(|| {
        let token = std::fs::read_to_string(POD_TOKEN).ok()?;
        token_service_account(token.trim())
    });
    if service_account.is_none() {
        tracing::warn!("no service account (--service-account): berth shell is refused");
    }
    let agent_tls_ca = match &args.agent_tls_ca {
        Some(path) => {
            Some(std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?)
        }
        None => None,
    };
    let config = berth_gateway::Config {
        service_account: service_account.map(|a| (a.namespace, a.name)),
        agent_tls_ca,
        base_domain: args.domain,
        review_ttl: args.review_ttl,
        namespace: args.namespace,
        session_ttl: args.session_ttl,
        allow_public_ports: args.allow_public_ports,
        header_timeout: args.header_timeout,
        ..Default::default()
    };
    let gateway = berth_gateway::Gateway::start(client, config).await?;
    tracing::info!(address = %args.listen, "serving workspaces at /w/<namespace>/<workspace>/<port>/");
    berth_gateway::serve(listener, gateway, shutdown())
        .await
        .map_err(|e| format!("serving failed: {e}"))
}

/// SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
