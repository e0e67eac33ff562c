//! `berth gateway` against a direct connection to the workspace's port, on loopback: the
//! latency it adds to small requests (p50, p99), the throughput of a large download, and the
//! gateway's memory with many WebSockets open through it. The sim, the operator and the
//! workspace's server (the agent runtime's stand-in) run in this process; the gateway is a
//! `berth gateway` process of its own (its service account's token in a kubeconfig), so its
//! memory is its own.
//!
//! Run: `cargo bench -p berth --bench gateway` (`BERTH_BENCH_REQUESTS`, default 2000;
//! `BERTH_BENCH_DOWNLOAD_MB`, default 100; `BERTH_BENCH_SOCKETS`, default 1000). Results go in
//! `bench/gateway.md`.

use std::{
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use berth_api::{Phase, Workspace};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, api::PostParams};
use serde_json::json;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A child process, stopped when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(run());
}

async fn run() {
    let requests = setting("BERTH_BENCH_REQUESTS", 2000) as usize;
    let download_mb = setting("BERTH_BENCH_DOWNLOAD_MB", 100);
    let sockets = setting("BERTH_BENCH_SOCKETS", 1000) as usize;

    let sim = berth_sim::SimCluster::start(berth_sim::SimConfig {
        runtime: Arc::new(berth_agent::sim_runtime::AgentRuntime::default()),
        ..berth_sim::SimConfig::fast()
    })
    .await
    .unwrap();
    let admin = sim.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in berth_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for manifest in [
        berth_controller::rbac::OPERATOR,
        berth_controller::rbac::ADMISSION_POLICY,
        berth_controller::rbac::WORKSPACE_SERVICE_ACCOUNT,
        berth_gateway::RBAC,
    ] {
        berth_sim::manifests::create_all(&admin, manifest, "default")
            .await
            .unwrap();
    }
    let hour = Duration::from_secs(3600);
    let operator_token = sim
        .issue_token("berth-system", "berth-controller", &[], hour)
        .unwrap();
    let operator = sim.client_with_token(&operator_token).await.unwrap();
    tokio::spawn(berth_controller::run(
        operator,
        berth_controller::Config::default(),
    ));

    // The developer, allowed into workspace `web`.
    berth_sim::manifests::create_all(
        &admin,
        "apiVersion: v1
kind: ServiceAccount
metadata: {name: dev, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: dev, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: berth-workspace-connect}
subjects: [{kind: ServiceAccount, name: dev, namespace: default}]
",
        "default",
    )
    .await
    .unwrap();
    let dev_token = sim.issue_token("default", "dev", &[], hour).unwrap();
    let workspaces: Api<Workspace> = Api::default_namespaced(admin.clone());
    workspaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
                "metadata": {"name": "web"},
                "spec": {"image": "devbox:1", "command": ["serve"], "ports": [{"name": "http", "port": 8080}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let pod_ip = loop {
        let ws = workspaces.get("web").await.unwrap();
        let status = ws.status.unwrap_or_default();
        if status.phase == Some(Phase::Running)
            && let Some(ip) = status.pod.and_then(|p| p.ip)
        {
            break ip;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "web never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The gateway, a process of its own.
    let dir = tempfile::tempdir().unwrap();
    let gateway_token = sim
        .issue_token("berth-system", "berth-gateway", &[], hour)
        .unwrap();
    let kubeconfig = dir.path().join("gateway.kubeconfig");
    std::fs::write(
        &kubeconfig,
        serde_json::to_string(&sim.kubeconfig_with_token("gateway", &gateway_token)).unwrap(),
    )
    .unwrap();
    let port = free_port();
    let gateway = Process(
        Command::new(BERTH)
            .args(["gateway", "--listen", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", &kubeconfig)
            .env("BERTH_LOG_FORMAT", "text")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = |url: String, auth: bool| {
        let client = client.clone();
        let token = dev_token.clone();
        async move {
            let mut request = http::Request::get(url);
            if auth {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let response = client
                .request(request.body(Empty::new()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let mut body = response.into_body();
            let mut bytes = 0usize;
            while let Some(frame) = body.frame().await {
                bytes += frame.unwrap().data_ref().map_or(0, |d| d.len());
            }
            (status, bytes)
        }
    };
    let direct = format!("http://{pod_ip}:8080");
    let through = format!("http://127.0.0.1:{port}/w/default/web/http");
    let ready = Instant::now();
    loop {
        if client
            .request(
                http::Request::get(format!("http://127.0.0.1:{port}/healthz"))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "the gateway never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get(format!("{through}/"), true).await;
    assert_eq!(status, 200, "the developer reaches web through the gateway");

    println!("| measure | direct | through the gateway | added |");
    println!("|---|---|---|---|");
    // Latency of small requests, one after another on a kept-alive connection.
    let mut timings = vec![];
    for (base, auth) in [(&direct, false), (&through, true)] {
        for _ in 0..100 {
            get(format!("{base}/"), auth).await;
        }
        let mut took = Vec::with_capacity(requests);
        for _ in 0..requests {
            let at = Instant::now();
            let (status, _) = get(format!("{base}/"), auth).await;
            took.push(at.elapsed());
            assert_eq!(status, 200);
        }
        took.sort();
        timings.push(took);
    }
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        let (d, g) = (percentile(&timings[0], p), percentile(&timings[1], p));
        println!(
            "| small GET, {name} ({requests} requests) | {} | {} | {} |",
            micros(d),
            micros(g),
            micros(g.saturating_sub(d))
        );
    }
    // Throughput of one large download.
    let size = download_mb * 1024 * 1024;
    let mut rates = vec![];
    for (base, auth) in [(&direct, false), (&through, true)] {
        let at = Instant::now();
        let (status, bytes) = get(format!("{base}/bytes/{size}"), auth).await;
        let took = at.elapsed();
        assert_eq!((status.as_u16(), bytes as u64), (200, size));
        rates.push(size as f64 / 1024.0 / 1024.0 / took.as_secs_f64());
    }
    println!(
        "| {download_mb} MB download | {:.0} MB/s | {:.0} MB/s | {:.0} % of direct |",
        rates[0],
        rates[1],
        100.0 * rates[1] / rates[0]
    );
    // WebSockets held open through the gateway.
    let before = rss_kib(gateway.0.id());
    let opened = Instant::now();
    let mut open = Vec::with_capacity(sockets);
    for batch in (0..sockets).collect::<Vec<_>>().chunks(100) {
        let connects = batch.iter().map(|_| {
            let mut request =
                tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                    format!("ws://127.0.0.1:{port}/w/default/web/http/echo"),
                )
                .unwrap();
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {dev_token}").parse().unwrap(),
            );
            async move {
                let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
                socket
                    .send(tokio_tungstenite::tungstenite::Message::text("ping"))
                    .await
                    .unwrap();
                let echoed = socket.next().await.unwrap().unwrap();
                assert_eq!(echoed.into_text().unwrap().as_str(), "ping");
                socket
            }
        });
        open.extend(futures::future::join_all(connects).await);
    }
    let took = opened.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(gateway.0.id());
    println!(
        "| {sockets} WebSockets open, each echoed | | opened in {:.1} s | gateway RSS {:.1} MiB -> {:.1} MiB ({:.1} KiB a socket) |",
        took.as_secs_f64(),
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / sockets as f64
    );
    drop(open);
    drop(gateway);
    sim.shutdown();
}
