//! What a crowded node showed (sockets in CLOSE-WAIT on agents' ports): the agent closes every
//! connection whose peer closed, and one whose peer never speaks, so none holds a descriptor.

use std::time::{Duration, Instant};

use berth_agent::{client::ClientTls, client::who_am_i, server::TlsIdentity};
use tokio::io::AsyncWriteExt;

use super::{AUDIENCE, Setup};

/// The agent's connections on `port` that hold a descriptor: established, or in CLOSE-WAIT
/// (the peer closed; the agent has not), whether or not the agent has accepted them yet.
fn held(port: u16) -> Vec<String> {
    procfs::net::tcp()
        .unwrap()
        .into_iter()
        .filter(|e| e.local_address.port() == port)
        .filter(|e| {
            matches!(
                e.state,
                procfs::net::TcpState::Established | procfs::net::TcpState::CloseWait
            )
        })
        .map(|e| format!("{} {:?}", e.remote_address, e.state))
        .collect()
}

/// Waits until the agent on `port` holds no connection; panics with those it still holds.
async fn until_none_held(port: u16, within: Duration) {
    let asked = Instant::now();
    loop {
        let held = held(port);
        if held.is_empty() {
            return;
        }
        assert!(
            asked.elapsed() < within,
            "{} connections still held, e.g. {:?}",
            held.len(),
            &held[..held.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens `count` connections to `address`, `batch` at a time, and drops each after writing
/// what `say` gives for it (nothing, a partial HTTP/2 preface, a partial TLS ClientHello).
async fn open_and_drop(address: &str, count: usize, say: fn(usize) -> &'static [u8]) {
    for start in (0..count).step_by(100) {
        let connections = (start..(start + 100).min(count)).map(|i| async move {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let _ = stream.write_all(say(i)).await;
        });
        futures::future::join_all(connections).await;
    }
}

fn partial(i: usize) -> &'static [u8] {
    match i % 3 {
        0 => b"",
        1 => b"PRI * HTTP/2.0\r\n",
        _ => b"\x16\x03\x01\x00\xa5\x01\x00",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_dropped_connections_leave_the_agent_holding_none() {
    let s = Setup::new().await;
    let authority = berth_sim::Authority::generate().unwrap();
    let (_, _, cert_pem, key_pem) = authority.issue(&[berth_agent::TLS_SERVER_NAME]).unwrap();
    let identity = TlsIdentity {
        cert_pem: cert_pem.into_bytes(),
        key_pem: key_pem.into_bytes(),
    };
    let plain = s.agent("ws").await;
    let tls = s.agent_with_tls("ws", Some(identity)).await;
    let token = s.token("caller", AUDIENCE, Duration::from_secs(3600));
    let client_tls = ClientTls {
        ca_pem: authority.ca_pem().as_bytes().to_vec(),
    };
    for (address, tls) in [(&plain, None), (&tls, Some(&client_tls))] {
        let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
        open_and_drop(address, 3000, partial).await;
        until_none_held(port, Duration::from_secs(30)).await;
        // Served calls close with their channel too, and the agent still answers.
        for _ in 0..50 {
            who_am_i(address, &token, Duration::from_secs(5), tls)
                .await
                .unwrap();
        }
        until_none_held(port, Duration::from_secs(30)).await;
    }
}

#[tokio::test]
async fn a_peer_that_connects_and_never_speaks_is_closed() {
    let s = Setup::new().await;
    let address = s.agent("ws").await;
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    let connected = Instant::now();
    let _silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Held while the peer may still speak...
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(held(port).len(), 1, "{:?}", held(port));
    // ...and closed once it has been silent for the limit, though the peer keeps it open.
    until_none_held(port, berth_agent::server::FIRST_BYTES_TIMEOUT * 3).await;
    assert!(connected.elapsed() >= berth_agent::server::FIRST_BYTES_TIMEOUT);
}
