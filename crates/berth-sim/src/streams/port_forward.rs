//! port-forward: connections to a pod's port, carried in WebSocket channels or SPDY streams.

use std::collections::HashMap;

use axum::extract::ws::{Message, WebSocket};
use futures::{SinkExt, StreamExt};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

use super::{
    Work,
    channels::{frame, normal_close},
    exec::pump,
    spdy,
};

/// A connection to a pod's port, or the kubelet's words for why there is none (Go's words
/// for a failed dial).
async fn dial(ip: &str, port: u16, pod: &str, uid: &str) -> Result<tokio::net::TcpStream, String> {
    tokio::net::TcpStream::connect((ip, port)).await.map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_owned(),
            std::io::ErrorKind::TimedOut => "i/o timeout".to_owned(),
            _ => format!("connect: {}", e.to_string().to_lowercase()),
        };
        format!(
            "error forwarding port {port} to pod {pod}, uid {uid}: failed to connect to localhost:{port} inside the pod: dial tcp4 {ip}:{port}: {why}"
        )
    })
}

/// A port-forward over WebSocket channels: each port's data channel carries one connection
/// to the pod's port; its error channel says why the connection failed.
pub(super) async fn port_forward(
    socket: WebSocket,
    ip: String,
    ports: Vec<u16>,
    pod: String,
    uid: String,
) {
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
    let (outputs, mut outgoing) = mpsc::channel::<(u8, Vec<u8>)>(16);
    let mut writers = HashMap::new();
    let mut readers = vec![];
    for (i, port) in ports.iter().copied().enumerate() {
        let data = 2 * i as u8;
        match dial(&ip, port, &pod, &uid).await {
            Ok(stream) => {
                let (read, write) = stream.into_split();
                writers.insert(data, write);
                readers.push(pump(Some(Box::pin(read)), data, outputs.clone()));
            }
            Err(message) => {
                let _ = outputs.send((data + 1, message.into_bytes())).await;
            }
        }
    }
    drop(outputs);
    let writer = tokio::spawn(async move {
        while let Some((channel, data)) = outgoing.recv().await {
            if sink.send(frame(channel, &data)).await.is_err() {
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

/// A port-forward over SPDY: the client opens an error and a data stream a connection,
/// paired by their `requestID` and naming the `port`.
pub(super) async fn spdy_port_forward(
    (mut streams, closer): (mpsc::Receiver<spdy::Stream>, spdy::Closer),
    work: Work,
) {
    let Work::PortForward { ip, pod, uid, .. } = work else {
        return;
    };
    let mut halves: HashMap<String, (Option<spdy::Stream>, Option<spdy::Stream>)> = HashMap::new();
    while let Some(stream) = streams.recv().await {
        let kind = stream.header("streamtype").unwrap_or_default().to_owned();
        // Clients before request IDs paired an error stream with the data stream after it.
        let request = match stream.header("requestid") {
            Some(id) => id.to_owned(),
            None if kind == "data" => stream.id.saturating_sub(2).to_string(),
            None => stream.id.to_string(),
        };
        let pair = halves.entry(request.clone()).or_default();
        match kind.as_str() {
            "error" => pair.0 = Some(stream),
            "data" => pair.1 = Some(stream),
            _ => continue,
        }
        if !matches!(halves.get(&request), Some((Some(_), Some(_)))) {
            continue;
        }
        if let Some((Some(error), Some(data))) = halves.remove(&request) {
            let (ip, pod, uid) = (ip.clone(), pod.clone(), uid.clone());
            tokio::spawn(forward_one(error, data, ip, pod, uid));
        }
    }
    closer.close().await;
}

/// One forwarded connection: the data stream's bytes to the pod's port and back.
pub(super) async fn forward_one(
    error: spdy::Stream,
    mut data: spdy::Stream,
    ip: String,
    pod: String,
    uid: String,
) {
    let text = data.header("port").unwrap_or_default().to_owned();
    let connection = match text.parse::<u16>() {
        Ok(port) => dial(&ip, port, &pod, &uid).await,
        Err(e) => Err(format!("unable to parse '{text}' as a port: {e}")),
    };
    match connection {
        Err(message) => {
            error.writer.send(message.as_bytes()).await;
        }
        Ok(connection) => {
            let (mut read, mut write) = connection.into_split();
            let writer = data.writer.clone();
            let upstream = tokio::spawn(async move {
                while let Some(bytes) = data.data.recv().await {
                    if write.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                let _ = write.shutdown().await;
            });
            let mut chunk = vec![0u8; 32 * 1024];
            while let Ok(n) = read.read(&mut chunk).await {
                if n == 0 || !writer.send(&chunk[..n]).await {
                    break;
                }
            }
            upstream.abort();
        }
    }
    data.writer.finish().await;
    error.writer.finish().await;
}
