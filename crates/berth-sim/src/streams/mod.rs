//! The streaming subresources of pods as the API server and kubelet speak them: `exec` and
//! `attach` over WebSocket (the `channel.k8s.io` protocols, v1 to v5: a byte of channel, then
//! the data; stdin 0, stdout 1, stderr 2, errors 3, resize 4, v5's close 255) or over SPDY (a
//! stream a channel, named by its `streamType`), and `portforward` over WebSocket channels (two
//! a port, each first telling the port), over SPDY (an error and a data stream a connection),
//! or over SPDY tunnelled in WebSocket as kubectl 1.31 and later do it. What the request asks
//! is checked once, whichever protocol carries it, and the work runs the same on each.

use std::{collections::HashMap, sync::Arc};

use axum::{
    extract::{Request, ws::WebSocketUpgrade},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::{
    auth::{self, Attributes, Identity},
    error::{ApiError, ApiResult},
    runtime::{ContainerLog, ExecRequest},
    sim::Sim,
};

mod channels;
mod exec;
mod port_forward;
mod spdy;

use channels::{spdy_channels, tunnel, websocket_channels};
use port_forward::{port_forward, spdy_port_forward};

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
/// Port-forward's SPDY tunnelled through WebSocket (kubectl 1.31 and later).
const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

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
    let upgrade = request
        .headers()
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let ip = pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let work = match subresource {
        "portforward" => Work::PortForward {
            ip,
            ports,
            pod: name.to_owned(),
            uid,
        },
        _ => {
            let context = sim
                .containers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(uid.clone(), container.clone()))
                .cloned()
                .map(Box::new);
            let options = Options {
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
                Work::Attach {
                    options,
                    key: (uid, container),
                    log,
                    sim,
                    context,
                }
            } else {
                Work::Exec {
                    options,
                    command,
                    context,
                    runtime: sim.config.runtime.clone(),
                    container,
                }
            }
        }
    };
    match upgrade.as_str() {
        "websocket" => over_websocket(request, work).await,
        spdy if spdy.starts_with("spdy/3.1") => over_spdy(request, work),
        _ => Err(ApiError::bad_request("Upgrade request required")),
    }
}

/// What a request asks to stream, checked and resolved, whichever protocol carries it.
enum Work {
    Exec {
        options: Options,
        command: Vec<String>,
        context: Option<Box<crate::runtime::ContainerContext>>,
        runtime: Arc<dyn crate::runtime::ContainerRuntime>,
        container: String,
    },
    Attach {
        options: Options,
        key: (String, String),
        log: Option<ContainerLog>,
        sim: Arc<Sim>,
        context: Option<Box<crate::runtime::ContainerContext>>,
    },
    PortForward {
        ip: String,
        ports: Vec<u16>,
        pod: String,
        uid: String,
    },
}

impl Work {
    /// Runs an exec or attach whose client's input and output the protocol has turned into
    /// channels.
    async fn run(self, session: Session, inputs: mpsc::Receiver<Input>, outputs: Output) {
        match self {
            Work::Exec {
                options: _,
                command,
                context,
                runtime,
                container,
            } => {
                let started = match context {
                    Some(context) => {
                        runtime
                            .exec(
                                &context,
                                ExecRequest {
                                    command: command.clone(),
                                    tty: session.options.tty,
                                    stdin: session.options.stdin,
                                    // The client sends its size once the stream is up.
                                    size: None,
                                },
                            )
                            .await
                    }
                    None => Err(format!("container not found (\"{container}\")")),
                };
                exec::exec(inputs, outputs, session, command, started).await
            }
            Work::Attach {
                key,
                log,
                sim,
                context,
                ..
            } => {
                // The container's own stdin, when the client sends input and the spec has one.
                let input = context
                    .filter(|_| session.options.stdin)
                    .and_then(|c| sim.config.runtime.attach(&c));
                exec::attach(inputs, outputs, session, (key, log, input), sim).await
            }
            Work::PortForward { .. } => {}
        }
    }

    fn options(&self) -> Options {
        match self {
            Work::Exec { options, .. } | Work::Attach { options, .. } => *options,
            Work::PortForward { .. } => Options::default(),
        }
    }
}

/// The WebSocket protocols: channels in binary messages, or SPDY tunnelled in them.
async fn over_websocket(request: Request, work: Work) -> ApiResult<Response> {
    let (mut parts, _) = request.into_parts();
    let upgrade = <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(
        &mut parts,
        &(),
    )
    .await
    .map_err(|e| ApiError::bad_request(e.body_text()))?;
    let offered: Vec<&str> = parts
        .headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|p| p.to_str().ok())
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .collect();
    // kubectl 1.31 and later tunnel port-forward's SPDY through WebSocket, and send no ports.
    let tunnels = offered.contains(&PORT_FORWARD_TUNNEL);
    let supported: &[&str] = match &work {
        Work::PortForward { .. } if tunnels => &[PORT_FORWARD_TUNNEL],
        Work::PortForward { ports, .. } if ports.is_empty() => {
            return Err(ApiError::bad_request("at least 1 port must be specified"));
        }
        Work::PortForward { .. } => PORT_FORWARD_PROTOCOLS,
        _ => CHANNEL_PROTOCOLS,
    };
    // The client's order decides among those the server speaks.
    let protocol = offered
        .iter()
        .find_map(|p| supported.iter().find(|s| *s == p).copied())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "the client must request one of the protocols: {}",
                supported.join(", ")
            ))
        })?;
    let upgrade = upgrade.protocols([protocol]);
    if protocol == PORT_FORWARD_TUNNEL {
        return Ok(upgrade
            .on_upgrade(move |socket| spdy_port_forward(tunnel(socket), work))
            .into_response());
    }
    if let Work::PortForward {
        ip,
        ports,
        pod,
        uid,
    } = work
    {
        return Ok(upgrade
            .on_upgrade(move |socket| port_forward(socket, ip, ports, pod, uid))
            .into_response());
    }
    let session = Session {
        versioned: protocol.starts_with('v') && protocol.as_bytes()[1] >= b'4',
        options: work.options(),
    };
    let closes = protocol == "v5.channel.k8s.io";
    Ok(upgrade
        .on_upgrade(move |socket| async move {
            let (inputs, outputs, done) = websocket_channels(socket, closes);
            tokio::join!(work.run(session, inputs, outputs), done);
        })
        .into_response())
}

/// SPDY/3.1 over an HTTP/1.1 upgrade, as kubectl 1.29 and earlier exec, attach and
/// port-forward; the protocol version is negotiated as the kubelet does.
fn over_spdy(mut request: Request, work: Work) -> ApiResult<Response> {
    let supported: &[&str] = match work {
        Work::PortForward { .. } => &["portforward.k8s.io"],
        _ => &CHANNEL_PROTOCOLS[1..],
    };
    let offered: Vec<String> = request
        .headers()
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|p| p.to_str().ok())
        .flat_map(|p| p.split(','))
        .map(|p| p.trim().to_owned())
        .collect();
    // A client that names no version speaks the first one.
    let protocol = match offered.iter().find(|p| supported.contains(&p.as_str())) {
        Some(protocol) => protocol.clone(),
        None if offered.is_empty() => String::new(),
        None => {
            let mut response = format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}\n"
            )
            .into_response();
            *response.status_mut() = axum::http::StatusCode::FORBIDDEN;
            for protocol in supported {
                response.headers_mut().append(
                    "x-accepted-stream-protocol-versions",
                    axum::http::HeaderValue::from_static(protocol),
                );
            }
            return Ok(response);
        }
    };
    let upgrading = hyper::upgrade::on(&mut request);
    let session = Session {
        versioned: protocol.starts_with("v4"),
        options: work.options(),
    };
    let resizes = matches!(protocol.as_str(), "v4.channel.k8s.io" | "v3.channel.k8s.io");
    tokio::spawn(async move {
        let io = match upgrading.await {
            Ok(upgraded) => hyper_util::rt::TokioIo::new(upgraded),
            Err(error) => {
                tracing::debug!(%error, "SPDY upgrade failed");
                return;
            }
        };
        let connection = spdy::serve(io);
        if let Work::PortForward { .. } = work {
            return spdy_port_forward(connection, work).await;
        }
        let Some((inputs, outputs, done)) = spdy_channels(connection, session, resizes).await
        else {
            return;
        };
        tokio::join!(work.run(session, inputs, outputs), done);
    });
    let mut response = axum::http::Response::builder()
        .status(axum::http::StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1");
    if !protocol.is_empty() {
        response = response.header("x-stream-protocol-version", protocol);
    }
    Ok(response
        .body(axum::body::Body::empty())
        .expect("a response of static headers"))
}

/// The ports a port-forward asks for (`ports=80,8080` or repeated); over SPDY each stream
/// names its port instead.
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
    Ok(ports)
}

/// What the client asked to stream of an exec or attach.
#[derive(Clone, Copy, Default)]
struct Options {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

/// How a session's streams are spoken.
#[derive(Clone, Copy)]
struct Session {
    /// v4 and later carry a `Status` on the error channel; earlier ones plain text.
    versioned: bool,
    options: Options,
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

/// What a client sends an exec or attach, whichever protocol carries it.
enum Input {
    Stdin(Vec<u8>),
    StdinEnd,
    Resize { width: u16, height: u16 },
}

/// What goes back: data on a channel (stdout, stderr, error). Dropping the last sender
/// ends the session.
type Output = mpsc::Sender<(u8, Vec<u8>)>;

/// A terminal size as clients send it, on its channel or stream.
fn resize(data: &[u8]) -> Option<Input> {
    let size: Value = serde_json::from_slice(data).ok()?;
    Some(Input::Resize {
        width: size["Width"].as_u64()? as u16,
        height: size["Height"].as_u64()? as u16,
    })
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
        assert_eq!(ports("").unwrap(), Vec::<u16>::new());
        assert!(ports("ports=0").is_err());
        assert!(ports("ports=http").is_err());
    }

    #[test]
    fn the_error_channel_speaks_status_from_v4_on_and_text_before() {
        let versioned = Session {
            versioned: true,
            options: Options::default(),
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
