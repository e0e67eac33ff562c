//! `GET /w/<ns>/<ws>/.berth/ssh` as a WebSocket (`berth ssh`, and OpenSSH through `berth ssh
//! --stdio` as its ProxyCommand): an SSH connection to the SSH server of the workspace's agent,
//! for a caller with a bearer token who may connect to the workspace. The gateway opens it with
//! its own service account's token for the agent, as it opens shells.
//!
//! The protocol, after the upgrade: the gateway's first message is [`Said::HostKey`] (text,
//! JSON), the workspace's SSH host key as an OpenSSH public key line; then binary messages both
//! ways are the SSH connection's bytes. With `?hostKey` the gateway closes after the key. A
//! connection that cannot be opened, or ends for a reason other than the SSH connection's own
//! end, gets one [`Said::Error`] before the close.

use axum::extract::ws::{Message, WebSocket};
use berth_agent::proto::{SshInput, SshOutput, ssh_input::Input, ssh_output::Output};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};

/// What the gateway says as text.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Said {
    /// The workspace's SSH host key (`ssh-ed25519 AAAA...`): first.
    HostKey(String),
    /// Why there is no connection, or why it ended: last.
    Error(String),
}

fn said(said: &Said) -> Message {
    Message::Text(serde_json::to_string(said).unwrap_or_default().into())
}

/// How long the gateway waits for the caller's close after its last message.
const CLOSING: std::time::Duration = std::time::Duration::from_secs(2);

/// Ends a connection that never opened: `message` says why; then the closing handshake.
pub async fn refuse(mut socket: WebSocket, message: String) {
    let _ = socket.send(said(&Said::Error(message))).await;
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

/// Joins the caller's WebSocket and the agent's SSH stream until either ends; when `revoked`
/// resolves (the caller lost the right to connect), the connection ends with its words.
pub async fn bridge(
    socket: WebSocket,
    inputs: tokio::sync::mpsc::Sender<SshInput>,
    mut outputs: tonic::Streaming<SshOutput>,
    revoked: impl std::future::Future<Output = String>,
) {
    let (mut to_caller, mut from_caller) = socket.split();
    let up = async move {
        while let Some(Ok(message)) = from_caller.next().await {
            match message {
                Message::Binary(bytes) => {
                    let input = SshInput {
                        input: Some(Input::Data(bytes.to_vec())),
                    };
                    if inputs.send(input).await.is_err() {
                        return;
                    }
                }
                Message::Close(_) => return,
                _ => {}
            }
        }
    };
    let sink = &mut to_caller;
    let down = async move {
        let mut revoked = std::pin::pin!(revoked);
        loop {
            let next = tokio::select! {
                next = outputs.message() => next,
                why = &mut revoked => Err(tonic::Status::permission_denied(why)),
            };
            let message = match next {
                Ok(Some(SshOutput {
                    output: Some(Output::HostKey(key)),
                })) => said(&Said::HostKey(key)),
                Ok(Some(SshOutput {
                    output: Some(Output::Data(bytes)),
                })) => Message::Binary(bytes.into()),
                Ok(Some(_)) => continue,
                // The SSH connection's own end.
                Ok(None) => return,
                Err(status) => {
                    let why = match status.code() {
                        tonic::Code::PermissionDenied => status.message().to_owned(),
                        _ => format!("the agent said: {}", status.message()),
                    };
                    let _ = sink.send(said(&Said::Error(why))).await;
                    return;
                }
            };
            if sink.send(message).await.is_err() {
                return;
            }
        }
    };
    // The caller is always told the end with a close, never a connection dropped without
    // its closing handshake: when the agent's stream ends, at once (then the caller's close is
    // awaited a moment); when the caller closes first, once the agent's stream has had a
    // moment to end (it does when the caller's input does).
    let (mut up, mut down) = (Box::pin(up), Box::pin(down));
    let caller_first = tokio::select! {
        () = &mut up => true,
        () = &mut down => false,
    };
    if caller_first {
        let _ = tokio::time::timeout(CLOSING, &mut down).await;
    }
    drop(down);
    let _ = to_caller.send(Message::Close(None)).await;
    if !caller_first {
        let _ = tokio::time::timeout(CLOSING, &mut up).await;
    }
    let _ = to_caller.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_gateway_says_is_json_text() {
        assert_eq!(
            said(&Said::HostKey("ssh-ed25519 AAAA".into())),
            Message::Text(r#"{"hostKey":"ssh-ed25519 AAAA"}"#.into())
        );
        assert_eq!(
            serde_json::from_str::<Said>(r#"{"error":"no"}"#).unwrap(),
            Said::Error("no".into())
        );
    }
}
