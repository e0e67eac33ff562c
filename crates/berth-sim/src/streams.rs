//! The streaming subresources of pods as the API server and kubelet speak them over WebSocket:
//! `exec` and `attach` (the `channel.k8s.io` protocols, v1 to v5: a byte of channel, then the
//! data; stdin 0, stdout 1, stderr 2, errors 3, resize 4, v5's close 255) and `portforward`
//! (two channels a port, each first telling the port). SPDY is not spoken: such a request is
//! answered as a server answers an exec request it cannot upgrade.

use std::{collections::HashMap, sync::Arc};

use axum::{
    extract::{
        Request,
        ws::{Message, WebSocket, WebSocketUpgrade},
    },
    response::{IntoResponse, Response},
};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    auth::{self, Attributes, Identity},
    error::{ApiError, ApiResult},
    runtime::{ContainerLog, ExecRequest, Reader},
    sim::Sim,
};

/// The subresources served here.
pub const SUBRESOURCES: &[&str] = &["exec", "attach", "portforward"];

/// Protocols of exec and attach, in the order a server that is offered several prefers them.
const CHANNEL_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// Protocols of port-forward over WebSocket.
const PORT_FORWARD_PROTOCOLS: &[&str] = &["v4.channel.k8s.io", "channel.k8s.io"];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Which of exec, attach and port-forward a request asks for, of which pod.
pub struct Target<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub subresource: &'a str,
}

/// A request path naming a streaming subresource of a pod.
pub fn target(path: &str) -> Option<Target<'_>> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match segments.as_slice() {
        [
            "",
            "api",
            "v1",
            "namespaces",
            namespace,
            "pods",
            pod,
            subresource,
        ] if SUBRESOURCES.contains(subresource) => Some(Target {
            namespace,
            pod,
            subresource,
        }),
        _ => None,
    }
}

/// The values of a query parameter that may repeat (`command=sh&command=-c`).
fn all(query: &str, name: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .collect()
}

fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    matches!(query.get(name).map(String::as_str), Some("true" | "1"))
}

/// Serves an exec, attach or port-forward request; errors before the upgrade are the API
/// server's, in its words.
pub async fn serve(
    sim: Arc<Sim>,
    identity: Identity,
    target: Target<'_>,
    request: Request,
) -> ApiResult<Response> {
    let Target {
        namespace,
        pod: name,
        subresource,
    } = target;
    let method = request.method().clone();
    // Over WebSocket a GET, over SPDY a POST; since 1.30 a GET needs `create` as well.
    let verbs: &[&str] = if method == axum::http::Method::GET {
        &["get", "create"]
    } else {
        &["create"]
    };
    for verb in verbs {
        let attrs = Attributes {
            verb: (*verb).to_owned(),
            resource: "pods".into(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            ..Default::default()
        };
        auth::require(&sim.store, &identity, &attrs)?;
    }
    let pod = sim
        .store
        .get("/pods", namespace, name)
        .ok_or_else(|| ApiError::not_found("pods", "", name))?;
    let query_text = request.uri().query().unwrap_or_default().to_owned();
    let query: HashMap<String, String> = form_urlencoded::parse(query_text.as_bytes())
        .into_owned()
        .collect();
    if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    // What the API server checks of the request comes first, whichever protocol it speaks:
    // a client that falls back from WebSocket to SPDY meets the same words.
    let (ports, container, command) = match subresource {
        "portforward" => (ports(&query_text)?, String::new(), vec![]),
        _ => {
            let container = crate::pods::container_named(
                &pod,
                name,
                query.get("container").map(String::as_str),
            )?;
            let command = all(&query_text, "command");
            if subresource == "exec" && command.is_empty() {
                return Err(ApiError::bad_request("you must specify at least 1 command"));
            }
            (vec![], container, command)
        }
    };
    let is_websocket = request
        .headers()
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !is_websocket {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let (mut parts, _) = request.into_parts();
    let upgrade = <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(
        &mut parts,
        &(),
    )
    .await
    .map_err(|e| ApiError::bad_request(e.body_text()))?;
    let supported = match subresource {
        "portforward" => PORT_FORWARD_PROTOCOLS,
        _ => CHANNEL_PROTOCOLS,
    };
    // The client's order decides among those the server speaks.
    let protocol = parts
        .headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|p| p.to_str().ok())
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .find_map(|p| supported.iter().find(|s| **s == p).copied())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "the client must request one of the protocols: {}",
                supported.join(", ")
            ))
        })?;
    let upgrade = upgrade.protocols([protocol]);
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    match subresource {
        "portforward" => {
            let ip = pod["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let (name, uid) = (name.to_owned(), uid.clone());
            Ok(upgrade
                .on_upgrade(move |socket| port_forward(socket, ip, ports, name, uid))
                .into_response())
        }
        _ => {
            let context = sim
                .containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(uid.clone(), container.clone()))
                .cloned();
            let versioned = protocol.starts_with('v') && protocol.as_bytes()[1] >= b'4';
            let session = Session {
                versioned,
                closes: protocol == "v5.channel.k8s.io",
                stdin: flag(&query, "stdin"),
                stdout: flag(&query, "stdout"),
                stderr: flag(&query, "stderr"),
                tty: flag(&query, "tty"),
            };
            if subresource == "attach" {
                let log = sim
                    .logs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&(uid.clone(), container.clone()))
                    .cloned();
                return Ok(upgrade
                    .on_upgrade(move |socket| attach(socket, session, (uid, container), log, sim))
                    .into_response());
            }
            let runtime = sim.config.runtime.clone();
            Ok(upgrade
                .on_upgrade(move |socket| async move {
                    let started = match context {
                        Some(context) => {
                            runtime
                                .exec(
                                    &context,
                                    ExecRequest {
                                        command: command.clone(),
                                        tty: session.tty,
                                        stdin: session.stdin,
                                    },
                                )
                                .await
                        }
                        None => Err(format!("container not found (\"{container}\")")),
                    };
                    exec(socket, session, command, started).await
                })
                .into_response())
        }
    }
}

/// The ports a port-forward asks for (`ports=80,8080` or repeated).
fn ports(query: &str) -> ApiResult<Vec<u16>> {
    let mut ports = vec![];
    for text in all(query, "ports").iter().flat_map(|p| p.split(',')) {
        let port = text
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid port {text:?}: must be between 1 and 65535"
                ))
            })?;
        ports.push(port);
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request("at least 1 port must be specified"));
    }
    Ok(ports)
}

/// How a session's streams are spoken.
#[derive(Clone, Copy)]
struct Session {
    /// v4 and later carry a `Status` on the error channel; earlier ones plain text.
    versioned: bool,
    /// v5: a client may close its stdin with `[255, 0]`.
    closes: bool,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl Session {
    /// The error channel's last word: success, an exit code, or the kubelet's error.
    fn status(&self, outcome: Result<i32, String>, command: &[String]) -> Vec<u8> {
        let value = match &outcome {
            Ok(0) => json!({"metadata": {}, "status": "Success"}),
            Ok(code) => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!(
                    "command terminated with non-zero exit code: command '{}' exited with {code}: ",
                    command.join(" ")
                ),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
            }),
            Err(message) => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {message}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": message}]},
                "code": 500
            }),
        };
        if self.versioned {
            return value.to_string().into_bytes();
        }
        match outcome {
            Ok(0) => vec![],
            Ok(code) => format!("command terminated with exit code {code}").into_bytes(),
            Err(message) => message.into_bytes(),
        }
    }
}

/// The close a client takes for a normal end (1000); without a code it reads 1005 as an error.
fn normal_close() -> Message {
    Message::Close(Some(axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::NORMAL,
        reason: "".into(),
    }))
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

/// Copies a process's output into frames of `channel` until it ends.
fn pump(
    output: Option<Reader>,
    channel: u8,
    frames: tokio::sync::mpsc::Sender<Message>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Some(mut output) = output else { return };
        let mut chunk = vec![0u8; 32 * 1024];
        while let Ok(n) = output.read(&mut chunk).await {
            if n == 0 || frames.send(frame(channel, &chunk[..n])).await.is_err() {
                break;
            }
        }
    })
}

/// An exec: the client's stdin and resizes go to the process, its output comes back, and the
/// error channel ends it with the exit status.
async fn exec(
    socket: WebSocket,
    session: Session,
    command: Vec<String>,
    started: Result<crate::runtime::ExecSession, String>,
) {
    let (mut sink, mut incoming) = socket.split();
    let process = match started {
        Ok(process) => process,
        Err(error) => {
            let message = format!(
                "error executing command in container: failed to exec in container: failed to start exec \"{}\": {error}",
                exec_id()
            );
            let _ = sink
                .send(frame(ERROR, &session.status(Err(message), &command)))
                .await;
            let _ = sink.send(normal_close()).await;
            return;
        }
    };
    let crate::runtime::ExecSession {
        stdin,
        stdout,
        stderr,
        resize,
        exited,
    } = process;
    let (frames, mut outgoing) = tokio::sync::mpsc::channel::<Message>(16);
    let pumps = [
        pump(stdout.filter(|_| session.stdout), STDOUT, frames.clone()),
        pump(stderr.filter(|_| session.stderr), STDERR, frames.clone()),
    ];
    let writer = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
        sink
    });
    let reader = tokio::spawn(async move {
        let mut stdin = stdin.filter(|_| session.stdin);
        while let Some(Ok(message)) = incoming.next().await {
            let data = match message {
                Message::Binary(data) => data.to_vec(),
                Message::Text(text) => text.as_bytes().to_vec(),
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&channel, data)) = data.split_first() else {
                continue;
            };
            match channel {
                STDIN => {
                    if let Some(input) = stdin.as_mut()
                        && (input.write_all(data).await.is_err() || input.flush().await.is_err())
                    {
                        stdin = None;
                    }
                }
                RESIZE => {
                    let size: Value = serde_json::from_slice(data).unwrap_or_default();
                    if let (Some(resize), Some(width), Some(height)) =
                        (&resize, size["Width"].as_u64(), size["Height"].as_u64())
                    {
                        resize(width as u16, height as u16);
                    }
                }
                CLOSE if session.closes && data.first() == Some(&STDIN) => {
                    if let Some(mut input) = stdin.take() {
                        let _ = input.shutdown().await;
                    }
                }
                _ => {}
            }
        }
    });
    let code = exited.await.unwrap_or(128 + libc::SIGKILL);
    for pump in pumps {
        let _ = pump.await;
    }
    reader.abort();
    let _ = frames
        .send(frame(ERROR, &session.status(Ok(code), &command)))
        .await;
    drop(frames);
    if let Ok(mut sink) = writer.await {
        let _ = sink.send(normal_close()).await;
    }
}

/// An exec's ID as containerd names one.
fn exec_id() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attach: the container's output from now on, until it exits.
async fn attach(
    socket: WebSocket,
    session: Session,
    (uid, container): (String, String),
    log: Option<ContainerLog>,
    sim: Arc<Sim>,
) {
    let (mut sink, mut incoming) = socket.split();
    let Some(log) = log else {
        let message = format!("container not found (\"{container}\")");
        let _ = sink
            .send(frame(ERROR, &session.status(Err(message), &[])))
            .await;
        let _ = sink.send(normal_close()).await;
        return;
    };
    let channel = if session.stdout || session.tty {
        STDOUT
    } else {
        STDERR
    };
    let (_, mut read) = log.read();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
    loop {
        tokio::select! {
            message = incoming.next() => match message {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                _ => continue,
            },
            _ = tick.tick() => {}
        }
        let (new, written) = log.since(read);
        read = written;
        if !new.is_empty() && sink.send(frame(channel, &new)).await.is_err() {
            return;
        }
        let running = sim
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(uid.clone(), container.clone()))
            .is_some_and(|c| c.log.same(&log));
        if !running {
            let _ = sink.send(frame(ERROR, &session.status(Ok(0), &[]))).await;
            let _ = sink.send(normal_close()).await;
            return;
        }
    }
}

/// A port-forward: each port's data channel carries one connection to the pod's port; its
/// error channel says why the connection failed.
async fn port_forward(socket: WebSocket, ip: String, ports: Vec<u16>, pod: String, uid: String) {
    let (mut sink, mut incoming) = socket.split();
    for (i, port) in ports.iter().enumerate() {
        for channel in [2 * i as u8, 2 * i as u8 + 1] {
            if sink
                .send(frame(channel, &port.to_le_bytes()))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    let (frames, mut outgoing) = tokio::sync::mpsc::channel::<Message>(16);
    let mut writers = HashMap::new();
    let mut readers = vec![];
    for (i, port) in ports.iter().copied().enumerate() {
        let data = 2 * i as u8;
        match tokio::net::TcpStream::connect((ip.as_str(), port)).await {
            Ok(stream) => {
                let (read, write) = stream.into_split();
                writers.insert(data, write);
                readers.push(pump(Some(Box::pin(read)), data, frames.clone()));
            }
            Err(e) => {
                let message = format!(
                    "error forwarding port {port} to pod {pod}, uid {uid}: failed to connect to localhost:{port} inside the pod: dial tcp4 {ip}:{port}: {e}"
                );
                let _ = frames.send(frame(data + 1, message.as_bytes())).await;
            }
        }
    }
    drop(frames);
    let writer = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
        let _ = sink.send(normal_close()).await;
    });
    while let Some(Ok(message)) = incoming.next().await {
        let data = match message {
            Message::Binary(data) => data.to_vec(),
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((channel, data)) = data.split_first() else {
            continue;
        };
        if let Some(stream) = writers.get_mut(channel)
            && stream.write_all(data).await.is_err()
        {
            writers.remove(channel);
        }
    }
    // The client is gone: its connections to the pod close.
    drop(writers);
    for reader in readers {
        reader.abort();
    }
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_comma_separated_or_repeated() {
        assert_eq!(
            ports("ports=80,8080&ports=9090").unwrap(),
            vec![80, 8080, 9090]
        );
        assert!(ports("").is_err());
        assert!(ports("ports=0").is_err());
        assert!(ports("ports=http").is_err());
    }

    #[test]
    fn the_error_channel_speaks_status_from_v4_on_and_text_before() {
        let versioned = Session {
            versioned: true,
            closes: false,
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let command = ["sh".to_owned(), "-c".to_owned(), "exit 3".to_owned()];
        let status: Value = serde_json::from_slice(&versioned.status(Ok(3), &command)).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(
            status["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
        let status: Value = serde_json::from_slice(&versioned.status(Ok(0), &command)).unwrap();
        assert_eq!(status["status"], "Success");
        let plain = Session {
            versioned: false,
            ..versioned
        };
        assert_eq!(plain.status(Ok(0), &command), b"");
        assert_eq!(
            plain.status(Ok(3), &command),
            b"command terminated with exit code 3"
        );
    }
}
