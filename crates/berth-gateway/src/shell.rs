//! `GET /w/<ns>/<ws>/.berth/shell` as a WebSocket (`berth shell`): a command in the workspace
//! container, run by Berth's agent there, for a caller with a bearer token who may connect to
//! the workspace. The gateway opens it with its own service account's token for the agent
//! (`shell` on `workspaces/agent`, which only the gateway holds), naming the person.
//!
//! The protocol, after the upgrade: the caller's first message is the [`Start`] (text, JSON);
//! then binary messages are the command's input and text messages are [`Control`]s. The
//! gateway sends binary messages whose first byte says the stream ([`STDOUT`], [`STDERR`]) and
//! ends with one text message, [`Ended`], before it closes.

use axum::extract::ws::{Message, WebSocket};
use berth_agent::proto::{
    ShellInput, ShellStart, TerminalSize, shell_input::Input, shell_output::Output,
};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};

/// The first byte of a binary message with the command's standard output.
pub const STDOUT: u8 = 1;
/// The first byte of a binary message with the command's standard error.
pub const STDERR: u8 = 2;

/// What to run: the caller's first message.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Start {
    /// The command and its arguments; empty: the container's login shell.
    #[serde(default)]
    pub command: Vec<String>,
    /// On a terminal (its output then all comes as stdout).
    #[serde(default)]
    pub tty: bool,
    #[serde(default)]
    pub columns: u16,
    #[serde(default)]
    pub rows: u16,
    /// The caller's TERM.
    #[serde(default)]
    pub term: String,
}

/// What the caller may say after the start, as text.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Control {
    /// The terminal's new size.
    Resize { columns: u16, rows: u16 },
    /// No more input.
    CloseStdin,
}

/// How the shell ended: the gateway's last message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Ended {
    /// The command exited with this code (128 + the signal for a killed one).
    Exit { code: i32 },
    /// No command ran, or the agent lost it: why, in words.
    Error { message: String },
}

/// The agent's input for a caller's WebSocket message; None for what it ignores.
pub fn input(message: Message) -> Option<Input> {
    match message {
        Message::Binary(bytes) => Some(Input::Stdin(bytes.to_vec())),
        Message::Text(text) => match serde_json::from_str(text.as_str()).ok()? {
            Control::Resize { columns, rows } => Some(Input::Resize(TerminalSize {
                columns: columns.into(),
                rows: rows.into(),
            })),
            Control::CloseStdin => Some(Input::CloseStdin(true)),
        },
        _ => None,
    }
}

/// The agent's start for the caller's, on behalf of `user`.
pub fn start(start: Start, user: &str) -> ShellInput {
    ShellInput {
        input: Some(Input::Start(ShellStart {
            command: start.command,
            tty: start.tty,
            size: Some(TerminalSize {
                columns: start.columns.into(),
                rows: start.rows.into(),
            }),
            on_behalf_of: user.to_owned(),
            term: start.term,
        })),
    }
}

/// The caller's message for an output of the agent's.
pub fn output(output: Output) -> Message {
    let framed = |stream: u8, bytes: Vec<u8>| {
        let mut framed = Vec::with_capacity(bytes.len() + 1);
        framed.push(stream);
        framed.extend_from_slice(&bytes);
        Message::Binary(framed.into())
    };
    match output {
        Output::Stdout(bytes) => framed(STDOUT, bytes),
        Output::Stderr(bytes) => framed(STDERR, bytes),
        Output::ExitCode(code) => ended(Ended::Exit { code }),
    }
}

/// The text message that ends a shell.
pub fn ended(ended: Ended) -> Message {
    Message::Text(serde_json::to_string(&ended).unwrap_or_default().into())
}

/// Waits for the caller's [`Start`]: Err is why there is none, in words.
pub async fn first(socket: &mut WebSocket) -> Result<Start, String> {
    loop {
        match socket.recv().await {
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str(text.as_str())
                    .map_err(|e| format!("the first message must say what to run: {e}"));
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(_)) => return Err("the first message must say what to run (JSON)".to_owned()),
            Some(Err(_)) | None => return Err("the caller left".to_owned()),
        }
    }
}

/// How long the gateway waits for the caller's close after the last message: a connection
/// dropped with the caller's messages unread is reset, and a reset can lose the caller the
/// last message.
const CLOSING: std::time::Duration = std::time::Duration::from_secs(2);

/// Ends a shell that never ran: `message` says why; then the closing handshake.
pub async fn refuse(mut socket: WebSocket, message: String) {
    let _ = socket.send(ended(Ended::Error { message })).await;
    let _ = socket.send(Message::Close(None)).await;
    let _ = tokio::time::timeout(CLOSING, async {
        while let Some(Ok(message)) = socket.recv().await {
            if let Message::Close(_) = message {
                return;
            }
        }
    })
    .await;
}

/// Joins the caller's WebSocket and the agent's shell: the caller's messages become inputs
/// (`inputs`), the agent's outputs messages, the exit code the last one. Either side leaving
/// ends both: the agent hangs up a command whose caller left. When `revoked` resolves (the
/// caller lost the right to connect), the shell ends with its words.
pub async fn bridge(
    socket: WebSocket,
    inputs: tokio::sync::mpsc::Sender<ShellInput>,
    mut outputs: tonic::Streaming<berth_agent::proto::ShellOutput>,
    revoked: impl std::future::Future<Output = String>,
) {
    let (mut to_caller, mut from_caller) = socket.split();
    // Until the caller closes: what comes after the command ended is read and dropped.
    let up = async move {
        while let Some(Ok(message)) = from_caller.next().await {
            if let Message::Close(_) = message {
                break;
            }
            if let Some(input) = input(message) {
                let _ = inputs.send(ShellInput { input: Some(input) }).await;
            }
        }
    };
    let down = async move {
        let mut revoked = std::pin::pin!(revoked);
        loop {
            let next = tokio::select! {
                next = outputs.message() => next,
                why = &mut revoked => {
                    let _ = to_caller.send(ended(Ended::Error { message: why })).await;
                    let _ = to_caller.send(Message::Close(None)).await;
                    return;
                }
            };
            let message = match next {
                Ok(Some(answer)) => match answer.output {
                    Some(out) => output(out),
                    None => continue,
                },
                Ok(None) => ended(Ended::Error {
                    message: "the agent ended the shell without its exit code".to_owned(),
                }),
                Err(status) => ended(Ended::Error {
                    message: format!("the agent said: {}", status.message()),
                }),
            };
            let last = matches!(message, Message::Text(_));
            if to_caller.send(message).await.is_err() {
                return;
            }
            if last {
                let _ = to_caller.send(Message::Close(None)).await;
                return;
            }
        }
    };
    let mut up = std::pin::pin!(up);
    tokio::select! {
        () = &mut up => {}
        () = down => {
            let _ = tokio::time::timeout(CLOSING, up).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_messages_become_the_agents_inputs() {
        assert_eq!(
            input(Message::Binary(b"ls\n".to_vec().into())),
            Some(Input::Stdin(b"ls\n".to_vec()))
        );
        let resize = serde_json::to_string(&Control::Resize {
            columns: 120,
            rows: 40,
        })
        .unwrap();
        assert_eq!(resize, r#"{"resize":{"columns":120,"rows":40}}"#);
        assert_eq!(
            input(Message::Text(resize.into())),
            Some(Input::Resize(TerminalSize {
                columns: 120,
                rows: 40
            }))
        );
        assert_eq!(
            input(Message::Text(r#""closeStdin""#.into())),
            Some(Input::CloseStdin(true))
        );
        assert_eq!(input(Message::Text("nonsense".into())), None);
    }

    #[test]
    fn the_agents_outputs_are_framed_by_stream_and_the_exit_ends() {
        assert_eq!(
            output(Output::Stdout(b"hi".to_vec())),
            Message::Binary(vec![STDOUT, b'h', b'i'].into())
        );
        assert_eq!(
            output(Output::Stderr(b"no".to_vec())),
            Message::Binary(vec![STDERR, b'n', b'o'].into())
        );
        assert_eq!(
            output(Output::ExitCode(3)),
            Message::Text(r#"{"exit":{"code":3}}"#.into())
        );
    }
}
