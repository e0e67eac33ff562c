//! The developer's subcommands (`berth ls`, `start`, `stop`, `open`, `port-forward`; `shell`
//! is `shell.rs`), also `kubectl berth ...` when
//! the binary is installed as `kubectl-berth`: they act with the user's own kubeconfig and
//! credentials, so they can do exactly what the user's RBAC allows.

use std::time::{Duration, Instant};

use berth_api::{Phase, Workspace};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

/// Which cluster, context and namespace: as kubectl takes them.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// The kubeconfig to use (default: $KUBECONFIG, a list of files as kubectl takes it, else
    /// ~/.kube/config, else in-cluster).
    #[arg(long, global = true, env = "BERTH_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, env = "BERTH_CONTEXT")]
    pub context: Option<String>,
    /// The namespace (default: the context's, else `default`).
    #[arg(short, long, global = true, env = "BERTH_NAMESPACE")]
    pub namespace: Option<String>,
}

/// Options of `berth ls`.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Workspaces of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// Options of `berth start` and `berth stop`.
#[derive(clap::Args, Debug)]
pub struct SwitchArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspace.
    pub name: String,
    /// Return at once instead of waiting for the workspace to be Running (start) or
    /// Stopped (stop).
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "5m", value_parser = crate::controller::duration)]
    pub timeout: Duration,
}

/// Options of `berth open`.
#[derive(clap::Args, Debug)]
pub struct OpenArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspace (none: the dashboard, your workspaces and a spawner).
    pub name: Option<String>,
    /// The port, by its name in the workspace's spec (default: its first).
    pub port: Option<String>,
    /// The gateway's address, as your browser reaches it (e.g. https://berth.example.com).
    /// Default: the kubeconfig cluster's extension berth.dev/gateway (berth dev writes its
    /// own), else the annotation berth.dev/gateway of the Service berth-system/berth-gateway.
    #[arg(long, env = "BERTH_GATEWAY")]
    pub gateway: Option<String>,
    /// Only print the link; do not start a browser.
    #[arg(long)]
    pub print: bool,
}

/// Options of `berth port-forward`.
#[derive(clap::Args, Debug)]
pub struct PortForwardArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspace.
    pub name: String,
    /// `[LOCAL:]PORT`: the workspace's port, by name or number, and the local port (default:
    /// the same number; 0 picks a free one).
    pub port: String,
    /// The gateway's address (as for `berth open`).
    #[arg(long, env = "BERTH_GATEWAY")]
    pub gateway: Option<String>,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
}

/// A client and the namespace to use, as kubectl would pick them.
async fn connect(target: &Target) -> Result<(Client, String), String> {
    let (config, namespace) = load(target).await?;
    let client = Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))?;
    Ok((client, namespace))
}

/// The kubeconfig's cluster, user and namespace, as kubectl would pick them.
pub(crate) async fn load(target: &Target) -> Result<(kube::Config, String), String> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let config = match &target.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot load the kubeconfig: {e}"))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| e.to_string())
        }
        None if target.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| e.to_string()),
        None => kube::Config::infer().await.map_err(|e| e.to_string()),
    }
    .map_err(|e| format!("cannot load the kubeconfig: {e}"))?;
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((config, namespace))
}

/// The bearer token the kubeconfig's user presents to the API server (a token, a token file,
/// an exec plugin, an OIDC provider: whatever kube does for a request, done for one).
pub(crate) async fn bearer_token(config: &kube::Config) -> Result<String, String> {
    use kube::client::ConfigExt;
    use tower::{Layer, ServiceExt};
    let no_token = "your kubeconfig's user has no bearer token (a client certificate, or basic auth): the gateway knows a person by a token the API server accepts (TokenReview), as from a token, an exec plugin or an OIDC login";
    let layer = config
        .auth_layer()
        .map_err(|e| format!("cannot read your credential: {e}"))?
        .ok_or(no_token)?;
    let capture = tower::service_fn(|request: http::Request<String>| async move {
        // kube's layer is tower-http's AddAuthorization (which serves only services that
        // answer an http::Response) or a refreshing filter (whose error is a BoxError).
        Ok::<_, tower::BoxError>(http::Response::new(
            request.headers().get(http::header::AUTHORIZATION).cloned(),
        ))
    });
    let header = layer
        .layer(capture)
        .oneshot(http::Request::new(String::new()))
        .await
        .map_err(|e| format!("cannot get your credential: {e}"))?;
    header
        .body()
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_owned)
        .ok_or_else(|| no_token.to_owned())
}

/// `berth open`: a one-time login link to a workspace's port through the gateway, made for
/// the kubeconfig's user (who must be allowed to connect to it), printed, and opened in a
/// browser when there is one.
pub async fn open(args: OpenArgs) -> Result<(), String> {
    let (config, namespace) = load(&args.target).await?;
    let gateway = discover_gateway(args.gateway.as_deref(), &args.target, &config).await?;
    let gateway = gateway.as_str();
    let Some(name) = args.name.clone() else {
        return dashboard(&config, gateway, args.print).await;
    };
    let client =
        Client::try_from(config.clone()).map_err(|e| format!("cannot build a client: {e}"))?;
    let read = Api::<Workspace>::namespaced(client, &namespace)
        .get(&name)
        .await;
    let port = match read {
        Ok(ws) => Some(berth_api::resolution::port_in_force(&ws, args.port.as_deref())?.name),
        // Allowed to connect but not to read the workspace (berth-workspace-connect): the
        // gateway finds the port, after checking who asks.
        Err(kube::Error::Api(status)) if status.code == 403 => args.port.clone(),
        Err(e) => {
            return Err(format!("cannot read workspace {name}: {}", api_words(&e)));
        }
    };
    let token = bearer_token(&config).await?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("namespace", &namespace)
        .append_pair("workspace", &name);
    if let Some(port) = &port {
        query.append_pair("port", port);
    }
    let query = query.finish();
    let url = format!("{gateway}{}?{query}", berth_gateway::TICKETS);
    let ticket = mint(&url, gateway, &token).await?;
    let link = format!("{gateway}{}", ticket.path);
    println!("{link}");
    let port = match ticket.port.is_empty() {
        true => port.unwrap_or_default(),
        false => ticket.port,
    };
    eprintln!(
        "berth open: workspace {namespace}/{name}, port {port}: the link works once, until {}",
        ticket.expires_at
    );
    if !args.print && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        open_browser(&link);
    }
    Ok(())
}

/// Asks the gateway at `url` for a login link with the bearer `token`.
async fn mint(url: &str, gateway: &str, token: &str) -> Result<berth_gateway::Ticket, String> {
    let answer = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| {
            format!(
                "cannot reach the gateway at {gateway}: {}",
                berth_gateway::error_chain(&e)
            )
        })?;
    let status = answer.status();
    let body = answer
        .text()
        .await
        .map_err(|e| format!("the gateway's answer broke off: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "the gateway refused ({status}): {}",
            body.trim_end()
        ));
    }
    serde_json::from_str(&body)
        .map_err(|e| format!("{url} did not answer as berth gateway does: {e}"))
}

/// Options of `berth dashboard`.
#[derive(clap::Args, Debug)]
pub struct DashboardArgs {
    #[command(flatten)]
    pub target: Target,
    /// The gateway's address (as for `berth open`).
    #[arg(long, env = "BERTH_GATEWAY")]
    pub gateway: Option<String>,
    /// Only print the link; do not start a browser.
    #[arg(long)]
    pub print: bool,
}

/// `berth dashboard` (and `berth open` without a workspace): a one-time login link to the
/// gateway's dashboard for the kubeconfig's user, printed and opened.
pub async fn open_dashboard(args: DashboardArgs) -> Result<(), String> {
    let (config, _) = load(&args.target).await?;
    let gateway = discover_gateway(args.gateway.as_deref(), &args.target, &config).await?;
    dashboard(&config, &gateway, args.print).await
}

async fn dashboard(config: &kube::Config, gateway: &str, print: bool) -> Result<(), String> {
    let token = bearer_token(config).await?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("{gateway}{}?dashboard", berth_gateway::TICKETS);
    let ticket = mint(&url, gateway, &token).await?;
    let scheme = gateway.split("://").next().unwrap_or("https");
    let link = match &ticket.host {
        Some(host) => format!("{scheme}://{host}{}", ticket.path),
        None => format!("{gateway}{}", ticket.path),
    };
    println!("{link}");
    eprintln!(
        "berth dashboard: your workspaces and a spawner; the link works once, until {}",
        ticket.expires_at
    );
    if !print && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        open_browser(&link);
    }
    Ok(())
}

/// The gateway's address from `--gateway` or `BERTH_GATEWAY`, without a trailing slash.
pub(crate) fn gateway_address(given: Option<&str>) -> Result<String, String> {
    let gateway = given.ok_or(NO_GATEWAY)?;
    if !gateway.starts_with("http://") && !gateway.starts_with("https://") {
        return Err(format!(
            "--gateway {gateway}: an http:// or https:// address"
        ));
    }
    Ok(gateway.trim_end_matches('/').to_owned())
}

/// The name of the kubeconfig cluster extension, and of the gateway Service's annotation,
/// that say where the gateway is served.
pub const GATEWAY_EXTENSION: &str = "berth.dev/gateway";

const NO_GATEWAY: &str = "which gateway? Pass --gateway https://... or set BERTH_GATEWAY; or have your kubeconfig's cluster say it (an extension named berth.dev/gateway with {url: https://...}, as berth dev writes), or your platform annotate the Service berth-system/berth-gateway with berth.dev/gateway: https://...";

/// The gateway's address: `given` (--gateway, BERTH_GATEWAY), else the kubeconfig cluster's
/// extension `berth.dev/gateway` (`{url: ...}`), else the annotation `berth.dev/gateway` of the
/// Service berth-system/berth-gateway, read with the user's credentials; else how to say it.
pub(crate) async fn discover_gateway(
    given: Option<&str>,
    target: &Target,
    config: &kube::Config,
) -> Result<String, String> {
    if given.is_some() {
        return gateway_address(given);
    }
    if let Some(url) = kubeconfig_gateway(target) {
        return gateway_address(Some(&url));
    }
    let client =
        Client::try_from(config.clone()).map_err(|e| format!("cannot build a client: {e}"))?;
    let service = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client, "berth-system")
        .get_opt("berth-gateway")
        .await
        .ok()
        .flatten();
    let annotated = service
        .as_ref()
        .and_then(|s| s.annotations().get(GATEWAY_EXTENSION).cloned());
    match annotated {
        Some(url) => gateway_address(Some(&url)),
        None => Err(NO_GATEWAY.to_owned()),
    }
}

/// The gateway the kubeconfig's cluster names (its extension `berth.dev/gateway`).
fn kubeconfig_gateway(target: &Target) -> Option<String> {
    let kubeconfig = match &target.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).ok()?,
        None => Kubeconfig::read().ok()?,
    };
    let context = target
        .context
        .clone()
        .or_else(|| kubeconfig.current_context.clone())?;
    let cluster = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .clone();
    let extension = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster)?
        .cluster
        .as_ref()?
        .extensions
        .as_ref()?
        .iter()
        .find(|e| e.name == GATEWAY_EXTENSION)?
        .extension
        .clone();
    extension
        .get("url")
        .and_then(|u| u.as_str())
        .or_else(|| extension.as_str())
        .map(str::to_owned)
}

/// The WebSocket address of the gateway's own page `action` of workspace `namespace/name`.
pub(crate) fn own_websocket(gateway: &str, namespace: &str, name: &str, action: &str) -> String {
    format!(
        "{}{}{namespace}/{name}/{}/{action}",
        gateway.replacen("http", "ws", 1),
        berth_gateway::route::PREFIX,
        berth_gateway::route::OWN,
    )
}

/// `berth port-forward`: a local port whose connections reach a workspace's port through the
/// gateway (a WebSocket each, with the user's bearer token), as `kubectl port-forward` does
/// without `pods/portforward`.
pub async fn port_forward(args: PortForwardArgs) -> Result<(), String> {
    let (config, namespace) = load(&args.target).await?;
    let gateway = discover_gateway(args.gateway.as_deref(), &args.target, &config).await?;
    let (local, wanted) =
        match args.port.rsplit_once(':') {
            Some((local, port)) => (
                Some(local.parse::<u16>().map_err(|_| {
                    format!("{}: the local port {local:?} is not a number", args.port)
                })?),
                port.to_owned(),
            ),
            None => (None, args.port.clone()),
        };
    let client =
        Client::try_from(config.clone()).map_err(|e| format!("cannot build a client: {e}"))?;
    let read = Api::<Workspace>::namespaced(client, &namespace)
        .get(&args.name)
        .await;
    // (name, number): from the workspace; allowed to connect but not to read it
    // (berth-workspace-connect), as asked, and the gateway finds it after checking who asks.
    let (name, number) = match read {
        Ok(ws) => {
            let port = berth_api::resolution::port_in_force(&ws, Some(&wanted))?;
            (port.name, u16::try_from(port.port).ok())
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            (wanted.clone(), wanted.parse::<u16>().ok())
        }
        Err(e) => {
            return Err(format!(
                "cannot read workspace {}: {}",
                args.name,
                api_words(&e)
            ));
        }
    };
    // Without a local port: the workspace's number, else a free one.
    let local = local.or(number).unwrap_or(0);
    let websocket = own_websocket(&gateway, &namespace, &args.name, &format!("tcp/{name}"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Refused now rather than at the first connection: who may not connect, a stopped
    // workspace, a port that does not answer.
    let probe = tunnel(&websocket, &bearer_token(&config).await?).await?;
    drop(probe);
    let listener = tokio::net::TcpListener::bind((args.address, local))
        .await
        .map_err(|e| format!("cannot listen on {}:{local}: {e}", args.address))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "Forwarding from {bound} -> workspace {namespace}/{} port {}",
        args.name,
        match number {
            Some(number) if number.to_string() != name => format!("{name} ({number})"),
            _ => name.clone(),
        }
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let websocket = std::sync::Arc::new(websocket);
    loop {
        let (connection, peer) = tokio::select! {
            accepted = listener.accept() => accepted.map_err(|e| format!("cannot accept: {e}"))?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        // Asked for each connection: an exec plugin's token may have been renewed.
        let token = match bearer_token(&config).await {
            Ok(token) => token,
            Err(e) => {
                eprintln!("berth port-forward: a connection from {peer}: {e}");
                continue;
            }
        };
        let websocket = websocket.clone();
        tokio::spawn(async move {
            match tunnel(&websocket, &token).await {
                Ok(socket) => join(socket, connection).await,
                Err(e) => eprintln!("berth port-forward: a connection from {peer}: {e}"),
            }
        });
    }
}

type Tunnel =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket to the gateway's tunnel, with the user's bearer token; a refusal in the
/// gateway's words.
pub(crate) async fn tunnel(url: &str, token: &str) -> Result<Tunnel, String> {
    use tokio_tungstenite::tungstenite::{Error, client::IntoClientRequest};
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("{url}: {e}"))?;
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| "the bearer token is not a valid header".to_owned())?;
    request
        .headers_mut()
        .insert(http::header::AUTHORIZATION, value);
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(Error::Http(response)) => {
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).trim_end().to_owned())
                .unwrap_or_default();
            Err(format!(
                "the gateway refused ({}): {body}",
                response.status()
            ))
        }
        Err(e) => Err(format!("cannot reach the gateway at {url}: {e}")),
    }
}

/// Joins a local connection and a tunnel until either ends.
async fn join(socket: Tunnel, connection: tokio::net::TcpStream) {
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut to_gateway, mut from_gateway) = socket.split();
    let (mut read, mut write) = connection.into_split();
    let up = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match read.read(&mut buffer).await {
                // The local side is done sending: the workspace may still answer, and the
                // tunnel has no half-close, so only stop reading.
                Ok(0) => std::future::pending::<()>().await,
                Err(_) => break,
                Ok(n) => {
                    let chunk = bytes::Bytes::copy_from_slice(&buffer[..n]);
                    if to_gateway.send(Message::Binary(chunk)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_gateway.send(Message::Close(None)).await;
    };
    let down = async move {
        while let Some(Ok(message)) = from_gateway.next().await {
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
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Starts `$BROWSER`, else the desktop's opener, on `link`; silent when there is none (the
/// link is printed).
fn open_browser(link: &str) {
    let candidates = std::env::var("BROWSER")
        .ok()
        .into_iter()
        .chain(["xdg-open".to_owned(), "open".to_owned()]);
    for program in candidates {
        let started = std::process::Command::new(&program)
            .arg(link)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if started.is_ok() {
            return;
        }
    }
}

/// One row of `berth ls`.
fn row(ws: &Workspace) -> [String; 4] {
    let status = ws.status.clone().unwrap_or_default();
    [
        ws.namespace().unwrap_or_default(),
        ws.name_any(),
        status.phase.unwrap_or_default().to_string(),
        status.message.unwrap_or_default(),
    ]
}

/// The rows as a table whose columns are as wide as their widest cell.
pub fn table(header: [&str; 4], rows: &[[String; 4]], namespaces: bool) -> String {
    let skip = usize::from(!namespaces);
    let mut width = [0usize; 4];
    for cells in std::iter::once(header.map(str::to_owned)).chain(rows.iter().cloned()) {
        for (w, c) in width.iter_mut().zip(cells.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String; 4]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate().skip(skip) {
            if i == 3 {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}   ", w = width[i]));
            }
        }
        text.trim_end().to_owned()
    };
    let mut out = line(&header.map(str::to_owned));
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out.push('\n');
    out
}

/// `berth ls`: the workspaces the user may list, with phase and message.
pub async fn ls(args: LsArgs) -> Result<(), String> {
    let (client, namespace) = connect(&args.target).await?;
    let api: Api<Workspace> = match args.all_namespaces {
        true => Api::all(client),
        false => Api::namespaced(client, &namespace),
    };
    let mut list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list workspaces: {}", api_words(&e)))?
        .items;
    list.sort_by_key(|ws| (ws.namespace(), ws.name_any()));
    if list.is_empty() {
        match args.all_namespaces {
            true => println!("No workspaces."),
            false => println!("No workspaces in namespace {namespace}."),
        }
        return Ok(());
    }
    let rows: Vec<[String; 4]> = list.iter().map(row).collect();
    print!(
        "{}",
        table(
            ["NAMESPACE", "NAME", "PHASE", "MESSAGE"],
            &rows,
            args.all_namespaces
        )
    );
    Ok(())
}

/// `berth start` (`paused: false`) and `berth stop` (`paused: true`): the spec change, then,
/// unless `--no-wait`, each phase and message until the workspace gets there.
pub async fn switch(args: SwitchArgs, start: bool) -> Result<(), String> {
    let (client, namespace) = connect(&args.target).await?;
    let api: Api<Workspace> = Api::namespaced(client, &namespace);
    let verb = if start { "start" } else { "stop" };
    api.patch(
        &args.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"paused": !start}})),
    )
    .await
    .map_err(|e| format!("cannot {verb} workspace {}: {}", args.name, api_words(&e)))?;
    let goal = if start {
        Phase::Running
    } else {
        Phase::Stopped
    };
    if args.no_wait {
        println!("workspace {}/{}: asked to {verb}", namespace, args.name);
        return Ok(());
    }
    let deadline = Instant::now() + args.timeout;
    let mut said = String::new();
    loop {
        let ws = api
            .get(&args.name)
            .await
            .map_err(|e| format!("cannot read workspace {}: {}", args.name, api_words(&e)))?;
        let status = ws.status.clone().unwrap_or_default();
        let current = status.observed_generation >= ws.metadata.generation;
        let phase = status.phase.unwrap_or_default();
        let line = format!(
            "workspace {}/{}: {phase}{}",
            namespace,
            args.name,
            status
                .message
                .as_deref()
                .filter(|m| !m.is_empty())
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
        if line != said {
            println!("{line}");
            said = line;
        }
        if current && phase == goal {
            return Ok(());
        }
        if current && phase == Phase::Failed {
            return Err(format!("workspace {} failed", args.name));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "workspace {} is not {goal} after {}",
                args.name,
                berth_controller::state::human(args.timeout)
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The API server's own words for a refusal.
fn api_words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubeconfig's cluster names the gateway (`berth.dev/gateway`, `{url: ...}`), for
    /// the context in use; one without says nothing.
    #[test]
    fn the_kubeconfig_names_the_gateway_of_its_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: dev\nclusters:\n- name: dev\n  cluster:\n    server: https://127.0.0.1:6443\n    extensions:\n    - name: berth.dev/gateway\n      extension: {url: 'http://127.0.0.1:8080'}\n- name: prod\n  cluster: {server: 'https://prod:6443'}\ncontexts:\n- name: dev\n  context: {cluster: dev, user: me}\n- name: prod\n  context: {cluster: prod, user: me}\nusers:\n- name: me\n  user: {token: x}\n",
        )
        .unwrap();
        let target = |context: Option<&str>| Target {
            kubeconfig: Some(path.clone()),
            context: context.map(str::to_owned),
            namespace: None,
        };
        assert_eq!(
            kubeconfig_gateway(&target(None)).as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(kubeconfig_gateway(&target(Some("prod"))), None);
        assert!(NO_GATEWAY.contains("--gateway") && NO_GATEWAY.contains("berth.dev/gateway"));
    }

    #[test]
    fn the_table_aligns_its_columns_and_shows_the_namespace_only_when_asked() {
        let rows = [
            [
                "team-a".into(),
                "web".into(),
                "Running".into(),
                "Workspace is running".into(),
            ],
            [
                "team-b".into(),
                "a-long-name".into(),
                "Error".into(),
                "secret \"x\" not found".into(),
            ],
        ];
        assert_eq!(
            table(["NAMESPACE", "NAME", "PHASE", "MESSAGE"], &rows, false),
            "NAME          PHASE     MESSAGE\nweb           Running   Workspace is running\na-long-name   Error     secret \"x\" not found\n"
        );
        assert!(
            table(["NAMESPACE", "NAME", "PHASE", "MESSAGE"], &rows, true)
                .starts_with("NAMESPACE   NAME")
        );
    }
}
