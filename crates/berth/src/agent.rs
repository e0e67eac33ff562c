//! `berth agent [-- CMD ...]`: the in-pod agent. It serves gRPC (authenticating callers
//! through TokenReview and SubjectAccessReview) and, given a command, supervises it and exits
//! with its code.

use std::{net::SocketAddr, sync::Arc};

use berth_agent::{
    activity::{Activity, Settings},
    auth::{Authenticator, Mode, Scope},
    server::Inside,
    server::TlsIdentity,
    shell::Shells,
};

/// How callers are authenticated.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum AuthMode {
    /// TokenReview and SubjectAccessReview with the pod's service account (the default).
    Kube,
    /// Everyone is allowed: local debugging only.
    None,
}

/// Options of `berth agent`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Address to serve gRPC on.
    #[arg(long, env = "BERTH_AGENT_ADDRESS", default_value = "0.0.0.0")]
    pub address: std::net::IpAddr,
    /// Port to serve gRPC on (0 picks a free one).
    #[arg(long, env = "BERTH_AGENT_PORT", default_value_t = berth_agent::DEFAULT_PORT)]
    pub port: u16,
    /// How callers are authenticated. Only this flag can turn authentication off, never the
    /// environment: a workspace's spec sets environment variables, not the agent's flags.
    #[arg(long, value_enum, default_value = "kube")]
    pub auth: AuthMode,
    /// The workspace's namespace (set by the operator).
    #[arg(long, env = "BERTH_WORKSPACE_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// The workspace's name (set by the operator).
    #[arg(long, env = "BERTH_WORKSPACE_NAME", default_value = "")]
    pub workspace: String,
    /// The pod's name.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod: String,
    /// The pod's service account, `namespace:name` (named in messages about missing RBAC).
    #[arg(long, env = "BERTH_AGENT_SERVICE_ACCOUNT", default_value = "")]
    pub service_account: String,
    /// Serve TLS with this certificate (PEM; it must name `berth-agent`), with --tls-key.
    /// Default: none, plaintext gRPC.
    #[arg(long, env = berth_agent::TLS_CERT_ENV, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The TLS certificate's private key (PEM). Default: none.
    #[arg(long, env = berth_agent::TLS_KEY_ENV, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The workspace's declared ports, comma-separated: an established connection to one of
    /// them is activity (set by the operator). Default: none.
    #[arg(long, env = berth_agent::ACTIVITY_PORTS_ENV, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    pub activity_ports: Vec<u16>,
    /// CPU of the supervised command's processes, in cores, that counts as activity.
    #[arg(long, env = "BERTH_AGENT_ACTIVITY_CPU", default_value_t = berth_agent::activity::DEFAULT_CPU_THRESHOLD)]
    pub activity_cpu: f64,
    /// How often connections and CPU are sampled (e.g. `5s`).
    #[arg(long, env = "BERTH_AGENT_ACTIVITY_INTERVAL", default_value = "5s", value_parser = parse_interval)]
    pub activity_interval: std::time::Duration,
    /// The workspace's content to clone into its home volume before its command starts (JSON,
    /// set by the operator). Default: none.
    #[arg(long, env = berth_agent::content::CONTENT_ENV, hide_env_values = true)]
    pub content: Option<String>,
    /// Serve only until the content is in place, then exit 0: the pod's init container when
    /// the workspace runs its image's entrypoint, which cannot wait for the content itself.
    /// Default: off (serve until stopped, or until the command exits).
    #[arg(long, env = "BERTH_AGENT_UNTIL_CONTENT")]
    pub until_content: bool,
    /// The workspace's command, run and supervised by the agent.
    #[arg(last = true)]
    pub command: Vec<String>,
}

fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    let interval = berth_api::DurationString(text.to_owned())
        .to_duration()
        .map_err(|e| e.to_string())?;
    match interval.is_zero() {
        true => Err("the interval must be longer than 0s".to_owned()),
        false => Ok(interval),
    }
}

/// Serves, supervises; returns the exit code.
pub async fn run(args: AgentArgs) -> Result<i32, String> {
    let mode = match args.auth {
        AuthMode::None => Mode::None,
        AuthMode::Kube => {
            let unreachable = |e: &dyn std::fmt::Display| {
                format!("cannot reach the API server for TokenReview: {e}")
            };
            let config = kube::Config::infer().await.map_err(|e| unreachable(&e))?;
            Mode::kube(config).map_err(|e| unreachable(&e))?
        }
    };
    let scope = Scope {
        namespace: args.namespace.clone(),
        workspace: args.workspace.clone(),
        pod: args.pod.clone(),
        service_account: format!("system:serviceaccount:{}", args.service_account),
    };
    let auth = Arc::new(Authenticator::new(mode, scope));
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsIdentity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        }),
        _ => None,
    };
    let activity = Arc::new(Activity::new(Settings {
        ports: args.activity_ports.clone(),
        address: None,
        cpu_threshold: args.activity_cpu,
        interval: args.activity_interval,
    }));
    let content = berth_agent::content::Content::from_env(args.content.as_deref())?;
    let stop_content = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(spec) = content.spec() {
        let dir = std::path::PathBuf::from(berth_agent::content::CREDENTIALS_DIR);
        let auth = spec.auth;
        tokio::spawn(berth_agent::content::fill(
            content.clone(),
            std::path::PathBuf::from(&spec.home),
            Arc::new(move || match auth {
                true => berth_agent::content::Credentials::from_dir(&dir),
                false => berth_agent::content::Credentials::None,
            }),
            Arc::new(berth_agent::git::clone),
            stop_content.clone(),
        ));
    }
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.address, args.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.address, args.port))?;
    tracing::info!(address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "berth agent serving");
    if args.until_content {
        let ready = content.clone();
        let inside = Inside::nothing("an init container's agent opens no shells");
        berth_agent::server::serve(listener, auth, tls, activity, content, inside, async move {
            tokio::select! {
                _ = ready.told_ready(berth_agent::content::TELL_PATIENCE) => {}
                _ = crate::wait_for_shutdown_signal() => {
                    stop_content.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
        .await
        .map_err(|e| e.to_string())?;
        return Ok(0);
    }
    // SSH's host key is kept in the workspace's home volume, as the operator names it.
    let home = std::env::var_os(berth_api::agent::HOME_ENV)
        .map(std::path::PathBuf::from)
        .filter(|home| home.is_dir());
    if args.command.is_empty() {
        berth_agent::server::serve(
            listener,
            auth,
            tls,
            activity,
            content,
            Inside {
                shells: Shells::Unavailable(berth_agent::shell::BESIDE_ENTRYPOINT.to_owned()),
                home,
            },
            crate::wait_for_shutdown_signal(),
        )
        .await
        .map_err(|e| e.to_string())?;
        return Ok(0);
    }
    // The agent reaps every child once the command runs: shells started before then too.
    berth_agent::supervisor::will_reap();
    let server = tokio::spawn(berth_agent::server::serve(
        listener,
        auth,
        tls,
        activity.clone(),
        content.clone(),
        Inside {
            shells: Shells::Available(berth_agent::shell::local()),
            home,
        },
        std::future::pending(),
    ));
    // The workspace's command starts once its content is in place (SIGTERM meanwhile ends
    // the agent, and the clone with it).
    tokio::select! {
        _ = content.ready() => {}
        _ = crate::wait_for_shutdown_signal() => {
            stop_content.store(true, std::sync::atomic::Ordering::SeqCst);
            server.abort();
            return Ok(143);
        }
    }
    let code = berth_agent::supervisor::supervise(&args.command, |pid| activity.supervise(pid))
        .await
        .map_err(|e| e.to_string())?;
    server.abort();
    Ok(code)
}
