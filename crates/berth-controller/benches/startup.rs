//! Figures for the operator, printed as a table (run: `cargo bench -p berth-controller`;
//! `BERTH_BENCH_WORKSPACES=1000` for the scale run): the time until every workspace runs
//! (agents verified), API writes per workspace start, the process's peak memory (sim, operator
//! and agents together), and the time from the sim's FailedMount event to the workspace status
//! carrying it (median and p99). 100 workspaces by default.

use std::{collections::HashMap, time::Duration};

use berth_api::{Phase, Workspace};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::{
    Api, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::time::Instant;

// The operator tests' harness: a sim with the CRD and the operator as its own service account.
#[allow(dead_code)]
#[path = "../tests/operator/support.rs"]
mod support;

use support::{Harness, OPERATOR};

/// How many workspaces each run starts.
fn workspace_count() -> usize {
    std::env::var("BERTH_BENCH_WORKSPACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

/// The operator with its production defaults on the sim's fast profile, with a node per 50
/// workspaces (and at least 3).
async fn harness() -> Harness {
    let sim = berth_sim::SimConfig {
        nodes: berth_sim::NodeConfig::several((workspace_count() / 50).max(3)),
        ..support::sim_config()
    };
    Harness::start_with(sim, berth_controller::Config::default()).await
}

/// The peak resident memory of this process, from `/proc/self/status`.
fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:").map(|v| v.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn create_all(client: &kube::Client, spec: serde_json::Value) {
    let api: Api<Workspace> = Api::namespaced(client.clone(), "default");
    for i in 0..workspace_count() {
        let body = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": format!("w{i:03}")}, "spec": spec});
        api.create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    }
}

/// What a restart of the operator over running workspaces costs.
struct Resync {
    /// Until `/readyz` would answer 200.
    ready: Duration,
    /// Writes in the first 10 s after the restart (goal: 0).
    writes: u64,
    /// WhoAmI calls in those 10 s (goal: 0, each pod's agent is verified once).
    agent_calls: u64,
}

fn agent_calls(h: &Harness) -> u64 {
    h.metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("berth_agent_checks_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn resync(h: &mut Harness) -> Resync {
    use std::sync::atomic::Ordering;
    h.stop_operator().await;
    h.sim.reset_requests();
    h.metrics.ready.store(false, Ordering::Relaxed);
    let calls_before = agent_calls(h);
    let restarted = Instant::now();
    h.start_operator();
    while !h.metrics.ready.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ready = restarted.elapsed();
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(ready)).await;
    Resync {
        ready,
        writes: h.operator_requests(&["create", "update", "patch", "delete"]),
        agent_calls: agent_calls(h) - calls_before,
    }
}

async fn writes_per_start() -> (Duration, f64, Vec<(String, u64)>, Resync) {
    let mut h = harness().await;
    let started = Instant::now();
    let client = h.client.clone();
    create_all(&client, json!({"image": "devbox:1", "ports": [{"name": "http", "port": 80}], "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/h"}}}})).await;
    let api: Api<Workspace> = Api::namespaced(client.clone(), "default");
    loop {
        let running = api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|w| w.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running))
            .count();
        if running == workspace_count() {
            break;
        }

        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_running = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut by_kind: HashMap<String, u64> = HashMap::new();
    let mut conflicts = 0;
    for row in h.sim.requests().into_iter().filter(|r| {
        r.key.user == OPERATOR
            && matches!(
                r.key.verb.as_str(),
                "create" | "update" | "patch" | "delete"
            )
    }) {
        if row.key.code == 409 {
            conflicts += row.count;
            continue;
        }
        let what = if row.key.subresource.is_empty() {
            format!("{} {}", row.key.verb, row.key.resource)
        } else {
            format!(
                "{} {}/{}",
                row.key.verb, row.key.resource, row.key.subresource
            )
        };
        *by_kind.entry(what).or_default() += row.count;
    }
    by_kind.insert(
        "(refused with 409: stale-cache writes, retried)".to_owned(),
        conflicts,
    );
    let total: u64 = by_kind
        .iter()
        .filter(|(k, _)| !k.starts_with('('))
        .map(|(_, v)| v)
        .sum();
    let mut rows: Vec<(String, u64)> = by_kind.into_iter().collect();
    rows.sort();
    let resync = resync(&mut h).await;
    (
        all_running,
        total as f64 / workspace_count() as f64,
        rows,
        resync,
    )
}

async fn failed_mount_latency() -> Vec<Duration> {
    let h = harness().await;
    let client = h.client.clone();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let workspaces: Api<Workspace> = Api::namespaced(client.clone(), "default");
    let mut event_stream = Box::pin(
        watcher(
            events,
            watcher::Config::default().fields("reason=FailedMount"),
        )
        .applied_objects(),
    );
    let mut status_stream =
        Box::pin(watcher(workspaces, watcher::Config::default()).applied_objects());
    create_all(&client, json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "absent", "mountPath": "/s"}]}}})).await;
    let mut first_event: HashMap<String, Instant> = HashMap::new();
    let mut explained: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while explained.len() < workspace_count() && Instant::now() < deadline {
        tokio::select! {
            Some(Ok(event)) = event_stream.next() => {
                let pod = event.involved_object.name.unwrap_or_default();
                let workspace = pod.trim_end_matches("-ws").to_owned();
                first_event.entry(workspace).or_insert_with(Instant::now);
            }
            Some(Ok(ws)) = status_stream.next() => {
                let message = ws.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
                if message.contains("secret \"absent\" not found") {
                    explained.entry(ws.name_any()).or_insert_with(Instant::now);
                }
            }
        }
    }
    let mut latencies: Vec<Duration> = explained
        .iter()
        .filter_map(|(name, at)| {
            first_event
                .get(name)
                .map(|e| at.saturating_duration_since(*e))
        })
        .collect();
    latencies.sort();
    latencies
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = workspace_count();
    let (all_running, per_start, rows, resync) = writes_per_start().await;
    println!("{n} workspaces created to all Running (agents verified): {all_running:?}");
    println!(
        "API writes per workspace start ({n} workspaces, home claim and service each): {per_start:.2}"
    );
    for (what, count) in rows {
        println!("  {what:<40} {count}");
    }
    println!(
        "operator restarted over {n} running workspaces: ready after {:?}; in its first 10 s {} writes, {} agent calls",
        resync.ready, resync.writes, resync.agent_calls
    );
    let latencies = failed_mount_latency().await;
    if latencies.is_empty() {
        println!("FailedMount -> status: no samples");
        return;
    }
    println!(
        "FailedMount event -> workspace status carries it ({} workspaces): median {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().unwrap()
    );
    println!(
        "peak resident memory of the process (sim, operator, agents): {}",
        peak_rss()
    );
}
