//! How each protocol carries an exec's or attach's channels: a byte of channel in WebSocket
//! messages, a SPDY stream a channel, or SPDY tunnelled in WebSocket.

use std::collections::HashMap;

use axum::extract::ws::{Message, WebSocket};
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

use super::{
    CLOSE, ERROR, Input, Options, Output, RESIZE, STDERR, STDIN, STDOUT, Session, resize, spdy,
};

/// The close a client takes for a normal end (1000); without a code it reads 1005 as an error.
pub(super) fn normal_close() -> Message {
    Message::Close(Some(axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::NORMAL,
        reason: "".into(),
    }))
}

pub(super) fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

/// Channels over WebSocket: a byte of channel, then the data, in binary messages. The
/// future ends once the output is written and the socket closed.
pub(super) fn websocket_channels(
    socket: WebSocket,
    closes: bool,
) -> (
    mpsc::Receiver<Input>,
    Output,
    impl std::future::Future<Output = ()>,
) {
    let (mut sink, mut incoming) = socket.split();
    let (outputs, mut outgoing) = mpsc::channel::<(u8, Vec<u8>)>(16);
    let (inputs, received) = mpsc::channel(16);
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = incoming.next().await {
            let data = match message {
                Message::Binary(data) => data.to_vec(),
                Message::Text(text) => text.as_bytes().to_vec(),
                Message::Close(_) => break,
                _ => continue,
            };
            let input = match data.split_first() {
                Some((&STDIN, data)) => Input::Stdin(data.to_vec()),
                Some((&RESIZE, data)) => match resize(data) {
                    Some(input) => input,
                    None => continue,
                },
                Some((&CLOSE, [STDIN])) if closes => Input::StdinEnd,
                _ => continue,
            };
            if inputs.send(input).await.is_err() {
                break;
            }
        }
    });
    let done = async move {
        while let Some((channel, data)) = outgoing.recv().await {
            if sink.send(frame(channel, &data)).await.is_err() {
                break;
            }
        }
        let _ = sink.send(normal_close()).await;
        reader.abort();
    };
    (received, outputs, done)
}

/// Channels over SPDY: a stream each, named by its `streamType` header, created by the
/// client before anything runs (as the kubelet waits for them, at most 30 seconds).
pub(super) async fn spdy_channels(
    (mut streams, closer): (mpsc::Receiver<spdy::Stream>, spdy::Closer),
    session: Session,
    resizes: bool,
) -> Option<(
    mpsc::Receiver<Input>,
    Output,
    impl std::future::Future<Output = ()>,
)> {
    let Options {
        stdin,
        stdout,
        stderr,
        tty,
    } = session.options;
    let expected = 1
        + usize::from(stdin)
        + usize::from(stdout)
        + usize::from(stderr && !tty)
        + usize::from(tty && resizes);
    let mut named: HashMap<String, spdy::Stream> = HashMap::new();
    let deadline = tokio::time::sleep(std::time::Duration::from_secs(30));
    tokio::pin!(deadline);
    while named.len() < expected {
        tokio::select! {
            stream = streams.recv() => {
                let stream = stream?;
                let kind = stream.header("streamtype").unwrap_or_default().to_owned();
                named.insert(kind, stream);
            }
            _ = &mut deadline => {
                tracing::debug!("timed out waiting for client to create streams");
                closer.close().await;
                return None;
            }
        }
    }
    let (inputs, received) = mpsc::channel(16);
    if let Some(mut stream) = named.remove("stdin") {
        let inputs = inputs.clone();
        tokio::spawn(async move {
            while let Some(data) = stream.data.recv().await {
                if inputs.send(Input::Stdin(data)).await.is_err() {
                    return;
                }
            }
            let _ = inputs.send(Input::StdinEnd).await;
        });
    }
    if let Some(mut stream) = named.remove("resize") {
        let inputs = inputs.clone();
        tokio::spawn(async move {
            // A stream of JSON sizes, one after another, split anywhere.
            let mut pending = Vec::new();
            while let Some(data) = stream.data.recv().await {
                pending.extend(data);
                let mut sizes = serde_json::Deserializer::from_slice(&pending).into_iter::<Value>();
                let mut used = 0;
                while let Some(Ok(size)) = sizes.next() {
                    used = sizes.byte_offset();
                    if let Some(input) = resize(size.to_string().as_bytes())
                        && inputs.send(input).await.is_err()
                    {
                        return;
                    }
                }
                pending.drain(..used);
            }
        });
    }
    // The session's input lasts as long as the client.
    tokio::spawn(async move {
        while streams.recv().await.is_some() {}
        drop(inputs);
    });
    let writers: HashMap<u8, spdy::StreamWriter> =
        [("stdout", STDOUT), ("stderr", STDERR), ("error", ERROR)]
            .into_iter()
            .filter_map(|(kind, channel)| Some((channel, named.remove(kind)?.writer)))
            .collect();
    let (outputs, mut outgoing) = mpsc::channel::<(u8, Vec<u8>)>(16);
    let done = async move {
        while let Some((channel, data)) = outgoing.recv().await {
            if let Some(writer) = writers.get(&channel)
                && !writer.send(&data).await
            {
                break;
            }
        }
        for writer in writers.values() {
            writer.finish().await;
        }
        closer.close().await;
    };
    Some((received, outputs, done))
}

/// A WebSocket as the byte stream SPDY runs over: binary messages carry the bytes, however
/// they are cut.
pub(super) fn tunnel(socket: WebSocket) -> (mpsc::Receiver<spdy::Stream>, spdy::Closer) {
    let (near, far) = tokio::io::duplex(64 * 1024);
    let (mut far_read, mut far_write) = tokio::io::split(far);
    let (mut sink, mut incoming) = socket.split();
    tokio::spawn(async move {
        while let Some(Ok(message)) = incoming.next().await {
            match message {
                Message::Binary(data) if far_write.write_all(&data).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = far_write.shutdown().await;
    });
    tokio::spawn(async move {
        let mut chunk = vec![0u8; 32 * 1024];
        while let Ok(n) = far_read.read(&mut chunk).await {
            if n == 0
                || sink
                    .send(Message::Binary(chunk[..n].to_vec().into()))
                    .await
                    .is_err()
            {
                break;
            }
        }
        let _ = sink.send(normal_close()).await;
    });
    spdy::serve(near)
}
