//! The container runtime the `berth` binary gives berth-sim: a container whose command is
//! `berth agent ...` runs the agent in-process, bound to the pod's IP, authenticating with the
//! pod's service-account token against the sim's API server (what a projected token, `ca.crt`
//! and `KUBERNETES_SERVICE_HOST` give it in a cluster). Such a container also serves its
//! declared ports on the pod IP with a stand-in HTTP server (`stand_in`: it holds every
//! connection, as the workspace's own server would), so a connection to the pod IP's port is activity exactly as in a real pod: the
//! agent reads it from `/proc/net/tcp`. Other containers run nothing.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, atomic::AtomicBool},
};

use base64::Engine;
use berth_sim::{BoxFuture, ContainerContext, ContainerRuntime, IdleRuntime, RunningContainer};
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use serde_json::Value;

use crate::{
    TLS_CERT_ENV, TLS_KEY_ENV,
    activity::{Activity, Settings},
    auth::{Authenticator, Mode, Scope},
    content::{CONTENT_ENV, CREDENTIALS_DIR, Content, Credentials},
    server::TlsIdentity,
    shell::{BESIDE_ENTRYPOINT, Shells},
};

/// Runs the Berth agent for agent containers; nothing for the rest. With claim folders, an
/// agent clones its workspace's content into its home claim's folder. Its agents open no
/// shells (no process of the workspace runs), unless told to run them on this machine.
#[derive(Clone, Default)]
pub struct AgentRuntime {
    claims: Option<ClaimDirs>,
    host_shells: bool,
}

/// Why an agent of this runtime opens no shell.
pub const NO_PROCESSES: &str = "this simulated cluster runs no processes for its containers (berth sim --containers nothing), so there is no workspace container to open a shell in";

/// Where a claim's files are on this machine, by the claim's UID and capacity.
pub type ClaimDirs = Arc<dyn Fn(&str, Option<u64>) -> Result<PathBuf, String> + Send + Sync>;

impl AgentRuntime {
    /// A runtime whose claims' files are in `dir/<claim uid>` (as `ProcessRuntime` keeps them).
    pub fn with_claims(dir: PathBuf) -> Self {
        AgentRuntime {
            claims: Some(Arc::new(move |uid: &str, _| Ok(dir.join(uid)))),
            host_shells: false,
        }
    }

    /// Its agents' shells run on this machine, as processes of this one, where a workspace
    /// container with a command would run them: for tests of what reaches a shell, which is
    /// the same in both.
    pub fn with_host_shells(mut self) -> Self {
        self.host_shells = true;
        self
    }

    /// Where the claims' files are, if this runtime keeps them.
    pub fn claim_dirs(&self) -> Option<&ClaimDirs> {
        self.claims.as_ref()
    }

    /// A runtime whose claims' files are where `claims` says.
    pub fn with_claim_dirs(claims: ClaimDirs) -> Self {
        AgentRuntime {
            claims: Some(claims),
            host_shells: false,
        }
    }
}

/// A container's command, as strings.
fn command(container: &Value) -> Vec<&str> {
    container["command"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The agent's own flags: its command up to `--` (what follows is the workspace's command).
fn agent_flags(container: &Value) -> Vec<&str> {
    command(container)
        .into_iter()
        .take_while(|a| *a != "--")
        .collect()
}

/// The value of the agent's flag `name`, as `--name value` or `--name=value`.
fn flag<'a>(flags: &[&'a str], name: &str) -> Option<&'a str> {
    let joined = format!("{name}=");
    flags
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix(&joined) {
            Some(value) => Some(value),
            None => (*a == name).then(|| flags.get(i + 1).copied()).flatten(),
        })
}

/// Whether a container runs the agent: its command is `.../berth agent ...`.
pub fn runs_agent(container: &Value) -> bool {
    matches!(command(container).as_slice(), [program, "agent", ..] if program.rsplit('/').next() == Some("berth"))
}

/// A container's variable as the kubelet sets it: of duplicates, the last one wins.
fn env(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .rfind(|e| e["name"] == name)?["value"]
        .as_str()
        .map(str::to_owned)
}

/// The `--port` the agent is given, else the default.
fn port(container: &Value) -> u16 {
    flag(&agent_flags(container), "--port")
        .and_then(|p| p.parse().ok())
        .or_else(|| env(container, "BERTH_AGENT_PORT").and_then(|p| p.parse().ok()))
        .unwrap_or(crate::DEFAULT_PORT)
}

/// The container's declared ports (`ports[].containerPort`).
fn declared_ports(container: &Value) -> Vec<u16> {
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["containerPort"].as_u64()?.try_into().ok())
        .collect()
}

/// The ports whose connections are activity, as the operator tells the agent.
fn activity_ports(container: &Value) -> Vec<u16> {
    flag(&agent_flags(container), "--activity-ports")
        .map(str::to_owned)
        .or_else(|| env(container, crate::ACTIVITY_PORTS_ENV))
        .and_then(|p| crate::parse_ports(&p).ok())
        .unwrap_or_default()
}

/// Stands in for the workspace's own server on `port`: accepts and holds connections until
/// the peer closes them.
async fn serve_port(listener: tokio::net::TcpListener, pod: String) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    let _ = axum::serve(listener, stand_in(pod, port)).await;
}

/// The stand-in for a workspace's own server on one declared port: an HTTP server (1.1 and 2)
/// that says which pod and port answered and what it was asked (method, path, headers), echoes
/// WebSocket messages at `/echo`, and streams `n` bytes at `/bytes/<n>`. A connection that
/// sends nothing is held open, as a real server holds it.
pub fn stand_in(pod: String, port: u16) -> axum::Router {
    use axum::{
        extract::{Path, Request, ws::WebSocketUpgrade},
        routing::get,
    };
    let described = move |request: Request| {
        let pod = pod.clone();
        async move {
            let headers: serde_json::Map<String, Value> = request
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), Value::from(v.to_str().unwrap_or_default())))
                .collect();
            axum::Json(serde_json::json!({
                "pod": pod,
                "port": port,
                "method": request.method().as_str(),
                "path": request.uri().path_and_query().map_or("/", |p| p.as_str()),
                "headers": headers,
            }))
        }
    };
    axum::Router::new()
        .route(
            "/echo",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    while let Some(Ok(message)) = socket.recv().await {
                        if socket.send(message).await.is_err() {
                            break;
                        }
                    }
                })
            }),
        )
        .route(
            "/bytes/{n}",
            get(|Path(n): Path<u64>| async move {
                const CHUNK: u64 = 64 * 1024;
                let chunks = futures::stream::iter((0..n.div_ceil(CHUNK)).map(move |i| {
                    let len = CHUNK.min(n - i * CHUNK) as usize;
                    Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b'x'; len]))
                }));
                axum::body::Body::from_stream(chunks)
            }),
        )
        .fallback(described)
}

/// Whether the agent is given `--auth none`: as with the real binary, only its command line
/// turns authentication off, never the environment.
fn auth_off(container: &Value) -> bool {
    flag(&agent_flags(container), "--auth") == Some("none")
}

/// The client settings for the pod's service account, as in-cluster config would make them.
async fn pod_config(context: &ContainerContext) -> Result<kube::Config, String> {
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "sim".into(),
            cluster: Some(Cluster {
                server: Some(context.api_server.clone()),
                certificate_authority_data: Some(
                    base64::engine::general_purpose::STANDARD.encode(&context.ca_pem),
                ),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "pod".into(),
            auth_info: Some(AuthInfo {
                token: Some(context.token.clone().into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "sim".into(),
            context: Some(Context {
                cluster: "sim".into(),
                user: Some("pod".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("sim".into()),
        ..Default::default()
    };
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    // Every simulated pod's agent lives in this one process: an idle pooled connection per
    // agent (two descriptors, kept 90 s) would take 20 000 descriptors at 10 000 pods. Reviews
    // are cached for minutes, so a connection per review costs little.
    config.headers.push((
        tonic::codegen::http::header::CONNECTION,
        tonic::codegen::http::HeaderValue::from_static("close"),
    ));
    Ok(config)
}

/// The workspace's command: what follows the agent's `--`.
pub fn workspace_command(container: &Value) -> Vec<String> {
    let mut words = ["command", "args"]
        .iter()
        .flat_map(|key| container[key].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_owned));
    words.by_ref().find(|w| w == "--");
    words.collect()
}

impl ContainerRuntime for AgentRuntime {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        if !runs_agent(&context.container) {
            return IdleRuntime.start(context);
        }
        let claims = self.claims.clone();
        if context.init {
            return Box::pin(async move {
                let shells = Shells::Unavailable(BESIDE_ENTRYPOINT.to_owned());
                let agent = start_agent(context, false, claims.as_ref(), shells).await?;
                Ok(until_content(agent))
            });
        }
        let shells = match (
            workspace_command(&context.container).is_empty(),
            self.host_shells,
        ) {
            (true, _) => Shells::Unavailable(BESIDE_ENTRYPOINT.to_owned()),
            (false, true) => Shells::Available(crate::shell::local()),
            (false, false) => Shells::Unavailable(NO_PROCESSES.to_owned()),
        };
        Box::pin(async move {
            Ok(start_agent(context, true, claims.as_ref(), shells)
                .await?
                .container)
        })
    }
}

/// The init container's agent (`berth agent --until-content`): it exits 0 once the content
/// is in place.
pub fn until_content(agent: StartedAgent) -> RunningContainer {
    let (exit_tx, exited) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<std::time::Duration>();
    tokio::spawn(async move {
        let (mut agent_exited, agent_stop) = (agent.container.exited, agent.container.stop);
        let code = tokio::select! {
            _ = agent.content.told_ready(crate::content::TELL_PATIENCE) => {
                let _ = agent_stop.send(std::time::Duration::ZERO);
                let _ = (&mut agent_exited).await;
                0
            }
            code = &mut agent_exited => code.unwrap_or(137),
            grace = stop_rx => {
                let _ = agent_stop.send(grace.unwrap_or_default());
                143
            }
        };
        let _ = exit_tx.send(code);
    });
    RunningContainer { exited, stop }
}

/// An agent started in-process: its container, and its content (ready before the workspace's
/// command may start).
pub struct StartedAgent {
    pub container: RunningContainer,
    pub content: Arc<Content>,
}

/// Where the agent's home volume has its files: the folder of the claim mounted at `home`.
fn home_dir(
    context: &ContainerContext,
    home: &str,
    claims: Option<&ClaimDirs>,
) -> Result<PathBuf, String> {
    let mount = context
        .mounts
        .iter()
        .find(|m| m.path.trim_end_matches('/') == home.trim_end_matches('/'))
        .ok_or_else(|| format!("no volume is mounted at {home}, where the content goes"))?;
    match (&mount.source, claims) {
        (berth_sim::VolumeSource::Claim { uid, capacity }, Some(claims)) => claims(uid, *capacity),
        (berth_sim::VolumeSource::Claim { .. }, None) => {
            Err("this runtime keeps no files for claims, so no content can be cloned".to_owned())
        }
        _ => Err(format!("{home} is not a claim's volume")),
    }
}

/// Starts the agent of an agent container in-process; with `stand_ins`, also a stand-in for
/// the workspace's server on each declared port (when the workspace's command does not run).
/// A workspace with content gets its stand-ins once the content is in place. It opens shells
/// as `shells` says.
pub fn start_agent(
    context: ContainerContext,
    stand_ins: bool,
    claims: Option<&ClaimDirs>,
    shells: Shells,
) -> BoxFuture<Result<StartedAgent, String>> {
    let claims = claims.cloned();
    {
        Box::pin(async move {
            let content = Content::from_env(env(&context.container, CONTENT_ENV).as_deref())?;
            let config = pod_config(&context).await?;
            let account = context.pod["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or("default");
            let scope = Scope {
                namespace: env(&context.container, "BERTH_WORKSPACE_NAMESPACE")
                    .unwrap_or_else(|| context.namespace.clone()),
                workspace: env(&context.container, "BERTH_WORKSPACE_NAME").unwrap_or_default(),
                pod: context.pod_name.clone(),
                service_account: format!("system:serviceaccount:{}:{account}", context.namespace),
            };
            let mode = match auth_off(&context.container) {
                true => Mode::None,
                false => Mode::kube(config).map_err(|e| e.to_string())?,
            };
            let auth = Arc::new(Authenticator::new(mode, scope));
            // TLS files come from the container's mounted secret, as on a real node.
            let file = |variable: &str| -> Result<Option<Vec<u8>>, String> {
                match env(&context.container, variable) {
                    None => Ok(None),
                    Some(path) => context
                        .files
                        .get(&path)
                        .cloned()
                        .map(Some)
                        .ok_or_else(|| format!("cannot read {path}: no such file")),
                }
            };
            let tls = match (file(TLS_CERT_ENV)?, file(TLS_KEY_ENV)?) {
                (Some(cert_pem), Some(key_pem)) => Some(TlsIdentity { cert_pem, key_pem }),
                _ => None,
            };
            let address = SocketAddr::from((context.pod_ip, port(&context.container)));
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| format!("cannot listen on {address}: {e}"))?;
            let mut servers = vec![];
            for declared in declared_ports(&context.container)
                .into_iter()
                .filter(|_| stand_ins)
            {
                let address = SocketAddr::from((context.pod_ip, declared));
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|e| format!("cannot listen on {address}: {e}"))?;
                let content = content.clone();
                let pod = context.pod_name.clone();
                servers.push(tokio::spawn(async move {
                    content.ready().await;
                    serve_port(listener, pod).await
                }));
            }
            // SSH's host key is kept in the home volume's folder, as in a pod.
            let inside = crate::server::Inside {
                home: env(&context.container, berth_api::agent::HOME_ENV)
                    .and_then(|home| home_dir(&context, &home, claims.as_ref()).ok()),
                shells,
            };
            let stop_content = Arc::new(AtomicBool::new(false));
            if let Some(spec) = content.spec() {
                let home = home_dir(&context, &spec.home, claims.as_ref())?;
                let files = context.files.clone();
                let credentials = Arc::new(move || {
                    Credentials::from_files(|key| {
                        files.get(&format!("{CREDENTIALS_DIR}/{key}")).cloned()
                    })
                });
                let fill = crate::content::fill(
                    content.clone(),
                    home,
                    credentials,
                    Arc::new(crate::git::clone),
                    stop_content.clone(),
                );
                servers.push(tokio::spawn(async move {
                    fill.await;
                }));
            }
            // Pods share the sim's network namespace: only this pod's IP is this pod's.
            let activity = Arc::new(Activity::new(Settings {
                ports: activity_ports(&context.container),
                address: Some(context.pod_ip.into()),
                interval: std::time::Duration::from_millis(500),
                ..Settings::default()
            }));
            let (exit_tx, exited) = tokio::sync::oneshot::channel();
            let (stop, stop_rx) = tokio::sync::oneshot::channel::<std::time::Duration>();
            let served = content.clone();
            tokio::spawn(async move {
                let result =
                    crate::server::serve(listener, auth, tls, activity, served, inside, async {
                        let _ = stop_rx.await;
                    })
                    .await;
                // As a killed process would, a stopped agent's clone goes no further.
                stop_content.store(true, std::sync::atomic::Ordering::SeqCst);
                servers.iter().for_each(|s| s.abort());
                let _ = exit_tx.send(if result.is_ok() { 0 } else { 1 });
            });
            Ok(StartedAgent {
                container: RunningContainer { exited, stop },
                content,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn of_duplicate_variables_the_last_wins_as_with_the_kubelet() {
        let container = json!({"env": [
            {"name": "BERTH_WORKSPACE_NAME", "value": "bob"},
            {"name": "BERTH_WORKSPACE_NAME", "value": "alice"}
        ]});
        assert_eq!(
            env(&container, "BERTH_WORKSPACE_NAME").as_deref(),
            Some("alice")
        );
        assert_eq!(env(&container, "OTHER"), None);
    }

    #[test]
    fn only_the_command_line_turns_authentication_off() {
        let off = |command: serde_json::Value| auth_off(&json!({"command": command}));
        assert!(off(json!(["berth", "agent", "--auth", "none"])));
        assert!(off(json!(["berth", "agent", "--auth=none", "--", "sh"])));
        assert!(!off(json!([
            "berth", "agent", "--", "echo", "--auth", "none"
        ])));
        assert!(!off(json!(["berth", "agent"])));
        assert!(!auth_off(&json!({
            "command": ["berth", "agent"],
            "env": [{"name": "BERTH_AGENT_AUTH", "value": "none"}]
        })));
    }

    #[test]
    fn agent_containers_are_recognised_by_their_command() {
        assert!(runs_agent(
            &json!({"command": ["/opt/berth/berth", "agent", "--", "sleep", "1"]})
        ));
        assert!(runs_agent(&json!({"command": ["berth", "agent"]})));
        assert!(!runs_agent(
            &json!({"command": ["/bin/sh", "-c", "berth agent"]})
        ));
        assert!(!runs_agent(&json!({"command": ["/opt/notberth", "agent"]})));
        assert!(!runs_agent(&json!({})));
        assert_eq!(
            port(&json!({"command": ["berth", "agent", "--port", "6000"]})),
            6000
        );
        assert_eq!(
            port(&json!({"command": ["berth", "agent"]})),
            crate::DEFAULT_PORT
        );
        assert_eq!(
            port(&json!({"command": ["berth", "agent", "--port=6001"]})),
            6001
        );
        assert_eq!(
            port(&json!({"command": ["berth", "agent", "--", "serve", "--port", "80"]})),
            crate::DEFAULT_PORT,
            "the workspace command's flags are its own"
        );
    }
}
