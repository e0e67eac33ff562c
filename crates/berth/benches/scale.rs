//! The operator at scale, measured as it runs in a cluster: `berth sim --fast` and
//! `berth controller` as two processes, so the operator's memory and CPU are its own. Prints a
//! table: workspaces, time until all run, the operator's peak RSS and CPU (and per start),
//! its API writes per start by verb and resource from the sim's request log, refused (409)
//! writes, writes over an idle window, and a restart (time to ready, writes after it).
//!
//! Run: `cargo bench -p berth --bench scale` (`BERTH_BENCH_WORKSPACES`, default 200;
//! `BERTH_BENCH_IDLE_SECONDS`, default 30; `BERTH_BENCH_SIM_MAX_MIB`, default 16384: the run
//! stops, saying how far it got, once the sim's memory passes it; `BERTH_BENCH_KIND=1`: every
//! workspace is of one WorkspaceKind, and the kind's status writes per second are shown,
//! which the operator holds to one a second however many workspaces change). Results go in
//! `bench/scale.md`. It first checks the hard limit of open files against what the sim needs
//! for the count (saying what it needs), prints its progress every 10 s while the workspaces
//! start, and stops, saying where it stood, after a minute without progress. For a heap
//! profile, build `cargo build --profile profiling -p berth --features dhat-heap` and name
//! that binary in `BERTH_BENCH_OPERATOR` or `BERTH_BENCH_SIM`; each writes `$BERTH_DHAT_OUT`
//! when it is stopped. To read what the processes said, name a
//! folder in `BERTH_BENCH_LOGS`: the sim's log and each operator run's (at `info`) go there.
//! `BERTH_BENCH_SHARDS=N` runs N operators (`--shards N`), the workspaces spread over ten
//! namespaces per shard, and prints each shard's figures and a handoff instead of a restart
//! (`bench/sharding.md`); each operator has the operator's default of 64 agent checks in
//! flight, as each replica of a deployment has (`BERTH_BENCH_CHECKS_IN_FLIGHT` sets another).
//! `BERTH_BENCH_MILESTONES=file` writes when the bench's watches saw each workspace created,
//! with a first status, its pod Ready and Running (a JSON line each, Unix seconds).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use berth_api::{Phase, Workspace};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, ResourceExt, api::PostParams};
use serde_json::{Value, json};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");
const OPERATOR: &str = "system:serviceaccount:berth-system:berth-controller";
const RBAC: &str = include_str!("../../../deploy/rbac/berth-controller.yaml");
const WORKSPACE_ACCOUNT: &str = include_str!("../../../deploy/rbac/workspace-service-account.yaml");
/// The admission policies: a workspace of a kind starts only while they enforce.
const ADMISSION: &str = include_str!("../../../deploy/admission/workspaces-policy.yaml");

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A child process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    /// SIGTERM first, so a profiling build writes its profile; SIGKILL after a minute.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_secs(60) {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where a profiling build writes the profile of `run`: `$BERTH_DHAT_OUT-<run>.json`, one per
/// process rather than one over the other.
fn profile(run: &str) -> String {
    let out = std::env::var("BERTH_DHAT_OUT").unwrap_or_else(|_| "dhat".into());
    format!("{}-{run}.json", out.trim_end_matches(".json"))
}

/// The binary for `role` ("SIM" or "OPERATOR"): `BERTH_BENCH_<role>` (e.g. a profiling
/// build), else the one cargo built.
fn binary(role: &str) -> String {
    std::env::var(format!("BERTH_BENCH_{role}")).unwrap_or_else(|_| BERTH.into())
}

/// Where `name`'s standard error goes: a file in `$BERTH_BENCH_LOGS` when it is set, else
/// nowhere; and the operator's log level then (`info`, else `warn`).
fn log_to(name: &str) -> (Stdio, &'static str) {
    match std::env::var_os("BERTH_BENCH_LOGS") {
        Some(dir) => {
            let file = std::fs::File::create(Path::new(&dir).join(format!("{name}.log")))
                .expect("BERTH_BENCH_LOGS names a folder one can write in");
            (file.into(), "info")
        }
        None => (Stdio::null(), "warn"),
    }
}

impl Process {
    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// A field of `/proc/<pid>/status` in MiB (0 when unreadable).
    fn status_mib(&self, field: &str) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    }

    /// (peak RSS in MiB, CPU seconds) from `/proc`.
    fn usage(&self) -> (f64, f64) {
        let peak_mib = self.status_mib("VmHWM:");
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (peak_mib, (ticks(11) + ticks(12)) / 100.0)
    }

    /// (anonymous, file-backed) resident MiB now, from `/proc`: the heap, stacks and the
    /// allocator's reserve, against the binary's own pages.
    fn resident(&self) -> (f64, f64) {
        (self.status_mib("RssAnon:"), self.status_mib("RssFile:"))
    }
}

/// The open descriptors of process `pid`, from `/proc`.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// This process's hard limit of open files (`/proc/self/limits`); the sim raises its soft
/// limit to it.
fn open_files_hard_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let hard = line.split_whitespace().nth(4)?;
    match hard {
        "unlimited" => Some(u64::MAX),
        hard => hard.parse().ok(),
    }
}

/// The descriptors the sim needs for `n` running workspaces: one listener per pod's agent, and
/// room for the connections of starts in flight, the API server's clients and the kubelets.
fn descriptors_needed(n: usize) -> u64 {
    (n + n / 2 + 2048) as u64
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_sim(dir: &Path, nodes: usize) -> (Process, PathBuf) {
    let kubeconfig = dir.join("sim.kubeconfig");
    let child = Command::new(binary("SIM"))
        .args([
            "sim",
            "--fast",
            // The operator is measured, not ten thousand `sleep` processes.
            "--containers",
            "nothing",
            // Nodes renew their Leases as real kubelets do (--fast's 100 ms on a hundred
            // nodes would be a thousand writes a second no cluster makes).
            "--node-heartbeat",
            "10s",
            "--nodes",
            &nodes.to_string(),
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .env("BERTH_DHAT_OUT", profile("sim"))
        .stdout(Stdio::null())
        .stderr(log_to("sim").0)
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Read once it is whole: it may be seen while still being written.
    while !kube::config::Kubeconfig::read_from(&kubeconfig)
        .is_ok_and(|k| k.current_context.is_some())
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "berth sim wrote no kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (Process(child), kubeconfig)
}

/// A kubeconfig like `admin`'s, authenticating with `token`.
fn kubeconfig_with_token(admin: &Path, token: &str, path: &Path) {
    let text = std::fs::read_to_string(admin).unwrap();
    let mut config: Value = serde_saphyr::from_str(&text).unwrap();
    config["users"][0]["user"] = json!({"token": token});
    std::fs::write(path, config.to_string()).unwrap();
}

/// An operator process and where it serves its metrics and health.
struct Operator {
    process: Process,
    metrics: u16,
    health: u16,
}

/// Starts operator `replica` of `shards` (one: no sharding), named as a StatefulSet's pod
/// `berth-controller-<replica>`, so it prefers the shard of that number.
fn start_operator(kubeconfig: &Path, run: &str, replica: u32, shards: u32) -> Operator {
    let (metrics, health) = (free_port(), free_port());
    let name = if shards > 1 {
        format!("{run}-{replica}")
    } else {
        run.to_owned()
    };
    let (log, level) = log_to(&format!("operator-{name}"));
    let process = Process(
        Command::new(binary("OPERATOR"))
            .args([
                "controller",
                "--service-account",
                "berth-system/berth-controller",
            ])
            .args(["--shards", &shards.to_string()])
            // Each replica's own bound, as a deployment runs them (dividing 64 among the
            // shards left each check waiting seconds for a slot while calls took 0.8 s).
            .args([
                "--agent-checks-in-flight",
                &setting("BERTH_BENCH_CHECKS_IN_FLIGHT", 64).to_string(),
            ])
            .args(["--lease-namespace", "berth-system"])
            .args(["--metrics-address", &format!("127.0.0.1:{metrics}")])
            .args(["--health-address", &format!("127.0.0.1:{health}")])
            .env("HOSTNAME", format!("berth-controller-{replica}"))
            .env("KUBECONFIG", kubeconfig)
            .env("BERTH_LOG_FORMAT", "json")
            .env(
                "RUST_LOG",
                std::env::var("BERTH_BENCH_RUST_LOG").unwrap_or_else(|_| level.to_owned()),
            )
            .env("BERTH_DHAT_OUT", profile(&format!("operator-{name}")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    Operator {
        process,
        metrics,
        health,
    }
}

/// Where each workspace goes: (namespace, name, shard). One shard: all in `default`. Several:
/// ten namespaces per shard (the first `team-<k>` in it), the workspaces spread evenly over
/// the shards and, within one, over its namespaces.
fn layout(n: usize, shards: u32) -> Vec<(String, String, u32)> {
    let per_shard: Vec<Vec<String>> = (0..shards)
        .filter(|_| shards > 1)
        .map(|index| {
            let shard =
                berth_controller::shard::Shard::new(index, shards).expect("a shard of them");
            (0..)
                .map(|k| format!("team-{k}"))
                .filter(|ns| shard.owns(ns))
                .take(10)
                .collect()
        })
        .collect();
    (0..n)
        .map(|i| {
            let shard = (i % shards as usize) as u32;
            let namespace = if shards == 1 {
                "default".to_owned()
            } else {
                let namespaces = &per_shard[shard as usize];
                namespaces[(i / shards as usize) % namespaces.len()].clone()
            };
            (namespace, format!("ws-{i:05}"), shard)
        })
        .collect()
}

/// Who holds shard `index` of `shards`' Lease.
async fn shard_holder(admin: &kube::Client, index: u32, shards: u32) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "berth-system");
    leases
        .get_opt(&format!("berth-controller-shard-{index}-of-{shards}"))
        .await
        .ok()??
        .spec?
        .holder_identity
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    socket
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
    let mut response = String::new();
    socket.read_to_string(&mut response).await.ok()?;
    Some(response)
}

/// The operator's requests in the sim's log: (verb, resource[/subresource], code) -> count.
async fn operator_requests(admin: &kube::Client) -> BTreeMap<(String, String, u16), u64> {
    let request = http::Request::get("/sim/v1/requests")
        .body(Vec::new())
        .unwrap();
    let rows: Vec<Value> = admin.request(request).await.unwrap();
    let mut counts = BTreeMap::new();
    for row in rows.iter().filter(|r| r["user"] == OPERATOR) {
        let resource = match row["subresource"].as_str().unwrap_or_default() {
            "" => row["resource"].as_str().unwrap_or_default().to_owned(),
            sub => format!("{}/{sub}", row["resource"].as_str().unwrap_or_default()),
        };
        *counts
            .entry((
                row["verb"].as_str().unwrap_or_default().to_owned(),
                resource,
                row["code"].as_u64().unwrap_or(0) as u16,
            ))
            .or_default() += row["count"].as_u64().unwrap_or(0);
    }
    counts
}

fn since(
    after: &BTreeMap<(String, String, u16), u64>,
    before: &BTreeMap<(String, String, u16), u64>,
) -> BTreeMap<(String, String, u16), u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The operator's reconciles so far (`berth_reconcile_duration_seconds_count`, every result).
/// Lists every object of a kind in the default namespace, in pages of 500.
async fn list_all<K>(client: &kube::Client)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), "default");
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.unwrap();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return,
        }
    }
}

async fn reconciles(metrics: u16) -> f64 {
    let text = http_get(metrics, "/metrics").await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("berth_reconcile_duration_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// When the bench's own watches saw each workspace's milestones.
#[derive(Default, Clone, Copy)]
struct Seen {
    created: Option<Instant>,
    first_status: Option<Instant>,
    pod_ready: Option<Instant>,
    running: Option<Instant>,
    /// The phase last seen.
    phase: Option<Phase>,
}

type Milestones = std::sync::Arc<std::sync::Mutex<BTreeMap<String, Seen>>>;

/// Watches `api` in the background, handing each object seen, with when, to `note`.
fn watch_each<K>(
    api: Api<K>,
    seen: Milestones,
    note: impl Fn(&K, Instant, &mut BTreeMap<String, Seen>) + Send + 'static,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    tokio::spawn(async move {
        let mut changes = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(Ok(object)) = changes.next().await {
            note(&object, Instant::now(), &mut seen.lock().unwrap());
        }
    });
}

/// Watches workspaces and their pods (as a user's `kubectl get -w` would) and records when
/// each milestone was first seen: the latency from what the kubelet reports to what the
/// workspace's status says.
fn watch_milestones(admin: &kube::Client) -> Milestones {
    use k8s_openapi::api::core::v1::Pod;
    let seen: Milestones = Default::default();
    watch_each(
        Api::<Workspace>::all(admin.clone()),
        seen.clone(),
        |workspace, now, seen| {
            let phase = workspace.status.as_ref().and_then(|s| s.phase);
            let entry = seen.entry(workspace.name_any()).or_default();
            entry.created.get_or_insert(now);
            entry.phase = phase;
            if phase.is_some() {
                entry.first_status.get_or_insert(now);
            }
            if phase == Some(Phase::Running) {
                entry.running.get_or_insert(now);
            }
        },
    );
    watch_each(
        Api::<Pod>::all(admin.clone()),
        seen.clone(),
        |pod, now, seen| {
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            // The workspace is the pod's controller.
            let workspace = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "Workspace");
            if let (true, Some(workspace)) = (ready, workspace) {
                seen.entry(workspace.name.clone())
                    .or_default()
                    .pod_ready
                    .get_or_insert(now);
            }
        },
    );
    seen
}

/// Writes each workspace's milestones as a JSON line (seconds since the Unix epoch, to set
/// beside the operators' logs): `BERTH_BENCH_MILESTONES=file`.
fn write_milestones(
    seen: &Milestones,
    started: Instant,
    started_wall: std::time::SystemTime,
    path: &Path,
) {
    let epoch = started_wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let at = |moment: Option<Instant>| {
        moment.map(|m| epoch + m.saturating_duration_since(started).as_secs_f64())
    };
    let lines: String = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(name, s)| {
            let line = json!({"name": name, "created": at(s.created), "firstStatus": at(s.first_status),
                "podReady": at(s.pod_ready), "running": at(s.running)});
            format!("{line}\n")
        })
        .collect();
    std::fs::write(path, lines).expect("BERTH_BENCH_MILESTONES names a file one can write");
}

/// p50 and p99 of the gaps `to - from` over the workspaces that have both, in ms.
fn percentiles(
    seen: &Milestones,
    from: impl Fn(&Seen) -> Option<Instant>,
    to: impl Fn(&Seen) -> Option<Instant>,
) -> (f64, f64) {
    let mut gaps: Vec<f64> = seen
        .lock()
        .unwrap()
        .values()
        .filter_map(|s| Some(to(s)?.saturating_duration_since(from(s)?).as_secs_f64() * 1000.0))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let at = |q: f64| {
        gaps.get(((gaps.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(f64::NAN)
    };
    (at(0.5), at(0.99))
}

const WRITES: &[&str] = &["create", "update", "patch", "delete"];

fn writes(counts: &BTreeMap<(String, String, u16), u64>) -> u64 {
    counts
        .iter()
        .filter(|((verb, _, code), _)| WRITES.contains(&verb.as_str()) && *code < 400)
        .map(|(_, n)| n)
        .sum()
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The sim and the operators are stopped (dropped) when `run` returns, before the exit: an
    // exit from inside it left a sim with every workspace running on the machine.
    let verdict = runtime.block_on(run());
    drop(runtime);
    if let Err(Regression(text)) = verdict {
        eprintln!("{text}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Regression> {
    let n = setting("BERTH_BENCH_WORKSPACES", 200) as usize;
    let idle = Duration::from_secs(setting("BERTH_BENCH_IDLE_SECONDS", 30));
    let sim_limit_mib = setting("BERTH_BENCH_SIM_MAX_MIB", 16 * 1024) as f64;
    let needed = descriptors_needed(n);
    match open_files_hard_limit() {
        Some(hard) if hard < needed => {
            eprintln!(
                "{n} workspaces need about {needed} open files in the sim (one per pod's agent, and room for connections); this machine's hard limit is {hard}: raise it (ulimit -Hn, LimitNOFILE) or run fewer (BERTH_BENCH_WORKSPACES)"
            );
            std::process::exit(2);
        }
        _ => {}
    }
    let dir = tempfile::tempdir().unwrap();
    // 110 pods a node, as kubelets allow by default.
    let (sim, admin_kubeconfig) = start_sim(dir.path(), n / 100 + 1);
    let admin_config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&admin_kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let admin = kube::Client::try_from(admin_config).unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(admin.clone());
    for crd in berth_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for manifest in [RBAC, WORKSPACE_ACCOUNT] {
        berth_sim::manifests::create_all(&admin, manifest, "default")
            .await
            .unwrap();
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "berth-system");
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 86400}}))
            .unwrap();
    let token = accounts
        .create_token_request("berth-controller", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let operator_kubeconfig = dir.path().join("operator.kubeconfig");
    kubeconfig_with_token(&admin_kubeconfig, &token, &operator_kubeconfig);
    // Sharded (`BERTH_BENCH_SHARDS`): one operator per shard, each preferring its own.
    let shards = setting("BERTH_BENCH_SHARDS", 1).clamp(1, 64) as u32;
    let plan = layout(n, shards);
    let mut namespaces: Vec<&String> = plan.iter().map(|(ns, _, _)| ns).collect();
    namespaces.sort();
    namespaces.dedup();
    for namespace in namespaces.iter().filter(|ns| **ns != "default") {
        let manifest = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n---\n{}",
            WORKSPACE_ACCOUNT
                .replace(
                    "berth-agent-default-default",
                    &format!("berth-agent-{namespace}-default")
                )
                .replace("namespace: default", &format!("namespace: {namespace}"))
        );
        berth_sim::manifests::create_all(&admin, &manifest, "default")
            .await
            .unwrap();
    }
    let ready = |health: u16| async move {
        let started = Instant::now();
        loop {
            if http_get(health, "/readyz")
                .await
                .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the operator never got ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // Of one kind, when asked: the workspaces' image and pod shape come from it. The admission
    // policies are installed before the operators start, as a cluster has them before its
    // first workspace: a workspace created in the instant after them may reach the operator
    // before they do, and is then taken as written while nothing checked it (its status says
    // so and how to have it checked; two of 3 000 once, which stopped the run).
    let of_a_kind = setting("BERTH_BENCH_KIND", 0) == 1;
    if of_a_kind {
        berth_sim::manifests::create_all(&admin, ADMISSION, "default")
            .await
            .unwrap();
        let kinds: Api<berth_api::WorkspaceKind> = Api::all(admin.clone());
        let kind = json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind", "metadata": {"name": "bench"},
            "spec": {"spawner": {"displayName": "Bench"}, "options": {
                "image": {"default": "devbox", "values": [{"id": "devbox", "displayName": "Devbox", "spec": {"image": "ghcr.io/example/devbox:1.4"}}]},
                "pod": {"default": "small", "values": [{"id": "small", "displayName": "Small", "spec": {"resources": {"requests": {"cpu": "1m"}}}}]}}}
        });
        kinds
            .create(
                &PostParams::default(),
                &serde_json::from_value(kind).unwrap(),
            )
            .await
            .unwrap();
    }
    let mut operators: Vec<Operator> = (0..shards)
        .map(|replica| start_operator(&operator_kubeconfig, "start", replica, shards))
        .collect();
    for operator in &operators {
        ready(operator.health).await;
    }
    // Each shard with the replica that prefers it, so each process's figures are its shard's.
    if shards > 1 {
        let waited = Instant::now();
        for index in 0..shards {
            let own = format!("berth-controller-{index}-");
            while !shard_holder(&admin, index, shards)
                .await
                .is_some_and(|h| h.starts_with(&own))
            {
                assert!(
                    waited.elapsed() < Duration::from_secs(60),
                    "shard {index} was not taken by its replica"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let cpu_before: Vec<f64> = operators.iter().map(|o| o.process.usage().1).collect();
    let mut reconciles_before = 0.0;
    for operator in &operators {
        reconciles_before += reconciles(operator.metrics).await;
    }
    let before = operator_requests(&admin).await;

    let spec = if of_a_kind {
        json!({"kind": "bench", "command": ["sleep", "infinity"]})
    } else {
        json!({"image": "ghcr.io/example/devbox:1.4", "command": ["sleep", "infinity"]})
    };

    let milestones = watch_milestones(&admin);
    // Start: n workspaces, 50 creates in flight.
    let (started, started_wall) = (Instant::now(), std::time::SystemTime::now());
    for chunk in plan.chunks(50) {
        let creates = chunk.iter().map(|(namespace, name, _)| {
            let workspaces: Api<Workspace> = Api::namespaced(admin.clone(), namespace);
            let body: Workspace = serde_json::from_value(json!({
                "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name},
                "spec": spec.clone()
            }))
            .unwrap();
            async move {
                workspaces
                    .create(&PostParams::default(), &body)
                    .await
                    .unwrap()
            }
        });
        futures::future::join_all(creates).await;
    }
    // Progress every 10 s; a minute without any is the end of the run, saying where it stood.
    let (mut said, mut progressed, mut best, mut sim_fds_peak) = (started, started, 0, 0);
    // Counted from the watch, not by listing: a list of 10 000 workspaces four times a second
    // would be most of what the sim does.
    loop {
        let phases: Vec<Option<Phase>> = milestones
            .lock()
            .unwrap()
            .values()
            .map(|s| s.phase)
            .collect();
        let phase = |p: Phase| phases.iter().filter(|s| **s == Some(p)).count();
        let running = phase(Phase::Running);
        let with_status = phases.iter().filter(|s| s.is_some()).count();
        sim_fds_peak = sim_fds_peak.max(descriptors(sim.pid()));
        if running == n {
            break;
        }
        // Progress: more workspaces running, or more with a status at all.
        let moved = running + with_status;
        if moved > best {
            (best, progressed) = (moved, Instant::now());
        }
        let progress = || {
            let without_status = n - with_status;
            format!(
                "{:.0} s: {running}/{n} running, {} in Error, {without_status} without a status; the sim holds {} open files (peak {sim_fds_peak}) and {:.0} MiB",
                started.elapsed().as_secs_f64(),
                phase(Phase::Error),
                descriptors(sim.pid()),
                sim.usage().0
            )
        };
        if said.elapsed() >= Duration::from_secs(10) {
            eprintln!("{}", progress());
            said = Instant::now();
        }
        // A panic, not an exit: unwinding stops the sim and the operator (`Process`'s drop).
        assert!(
            progressed.elapsed() < Duration::from_secs(60),
            "no progress for a minute; stopped at {}",
            progress()
        );
        // The sim holds an agent server per pod: stop before it takes the machine's memory.
        let (sim_rss, _) = sim.usage();
        if sim_rss > sim_limit_mib {
            let usage: Vec<String> = operators
                .iter()
                .zip(&cpu_before)
                .map(|(o, before)| {
                    let (rss, cpu) = o.process.usage();
                    format!("{rss:.0} MiB peak RSS, {:.1} s CPU", cpu - before)
                })
                .collect();
            println!(
                "stopped after {:.0} s: the sim reached {sim_rss:.0} MiB (BERTH_BENCH_SIM_MAX_MIB) with {running}/{n} workspaces running; the operators then: {}",
                started.elapsed().as_secs_f64(),
                usage.join("; ")
            );
            return Ok(());
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "{running}/{n} running after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let to_running = started.elapsed();
    if let Some(path) = std::env::var_os("BERTH_BENCH_MILESTONES") {
        write_milestones(&milestones, started, started_wall, Path::new(&path));
    }
    // Let the last status writes and events land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_start: Vec<(f64, f64)> = operators.iter().map(|o| o.process.usage()).collect();
    let mut reconciles_during = -reconciles_before;
    for operator in &operators {
        reconciles_during += reconciles(operator.metrics).await;
    }
    let start_counts = since(&operator_requests(&admin).await, &before);
    let counted_over = started.elapsed();

    // Idle: nothing changes, nothing should be written.
    let idle_before = operator_requests(&admin).await;
    let sim_cpu_before_idle = sim.usage().1;
    tokio::time::sleep(idle).await;
    let idle_counts = since(&operator_requests(&admin).await, &idle_before);
    // The sim's own steady cost (kubelets probing, heartbeats, Lease renewals answered).
    let sim_idle_cpu = (sim.usage().1 - sim_cpu_before_idle) / idle.as_secs_f64();
    let rss_idle: Vec<f64> = operators.iter().map(|o| o.process.usage().0).collect();
    let resident_idle = operators[0].process.resident();

    let per = |v: u64| v as f64 / n as f64;
    // Each operator's workspaces: one shard's.
    let shard_of: BTreeMap<&str, u32> = plan
        .iter()
        .map(|(_, name, shard)| (name.as_str(), *shard))
        .collect();
    let in_shard = |shard: u32| {
        let seen = milestones.lock().unwrap();
        let only: BTreeMap<String, Seen> = seen
            .iter()
            .filter(|(name, _)| shard_of.get(name.as_str()) == Some(&shard))
            .map(|(name, s)| (name.clone(), *s))
            .collect();
        std::sync::Arc::new(std::sync::Mutex::new(only))
    };
    let per_shard = n as f64 / f64::from(shards);
    let shard_figures: Vec<ShardFigures> = (0..shards as usize)
        .map(|i| ShardFigures {
            ready_p99: percentiles(&in_shard(i as u32), |s| s.pod_ready, |s| s.running).1,
            rss: after_start[i].0,
            rss_idle: rss_idle[i],
            cpu_per_start: (after_start[i].1 - cpu_before[i]) * 1000.0 / per_shard,
        })
        .collect();
    let worst = |f: fn(&ShardFigures) -> f64| shard_figures.iter().map(f).fold(f64::NAN, f64::max);

    // After the start and idling: a restart of the one operator; sharded, a replica's crash
    // and its shard's handoff.
    let (restart, handoff) = if shards == 1 {
        (
            Some(restart_operator(&admin, &operator_kubeconfig, operators.remove(0), &ready).await),
            None,
        )
    } else {
        (
            None,
            Some(hand_off(&admin, &mut operators, &plan, &spec, shards).await),
        )
    };
    let (sim_rss, sim_cpu) = sim.usage();

    println!(
        "| figure | {n} workspaces{} |",
        if shards > 1 {
            format!(", {shards} shards of {per_shard:.0}")
        } else {
            String::new()
        }
    );
    println!("|---|---|");
    println!(
        "| created -> all Running | {:.1} s |",
        to_running.as_secs_f64()
    );
    let (created_p50, created_p99) = percentiles(&milestones, |s| s.created, |s| s.first_status);
    println!("| created -> first status (p50 / p99) | {created_p50:.0} ms / {created_p99:.0} ms |");
    let (ready_p50, ready_p99) = percentiles(&milestones, |s| s.pod_ready, |s| s.running);
    println!(
        "| pod Ready -> workspace Running, agent check included (p50 / p99) | {ready_p50:.0} ms / {ready_p99:.0} ms |"
    );
    let cpu_total: f64 = after_start
        .iter()
        .zip(&cpu_before)
        .map(|((_, cpu), before)| cpu - before)
        .sum();
    if let Some(restart) = &restart {
        println!(
            "| operator peak RSS (after start / after {}s idle / restarted) | {:.0} MiB / {:.0} MiB / {:.0} MiB |",
            idle.as_secs(),
            after_start[0].0,
            rss_idle[0],
            restart.rss
        );
        println!(
            "| - resident after the idle: anonymous (heap, stacks, allocator) / the binary's pages | {:.0} MiB / {:.0} MiB |",
            resident_idle.0, resident_idle.1
        );
        println!(
            "| operator CPU for the start, per workspace | {cpu_total:.1} s, {:.2} ms |",
            cpu_total * 1000.0 / n as f64
        );
    } else {
        for (i, shard) in shard_figures.iter().enumerate() {
            println!(
                "| shard {i}: operator peak RSS (after start / after {}s idle); CPU per start; pod Ready -> Running p99 | {:.0} MiB / {:.0} MiB; {:.2} ms; {:.0} ms |",
                idle.as_secs(),
                shard.rss,
                shard.rss_idle,
                shard.cpu_per_start,
                shard.ready_p99
            );
        }
    }
    println!(
        "| reconciles per start | {:.2} |",
        reconciles_during / n as f64
    );
    println!(
        "| successful API writes per start | {:.2} |",
        per(writes(&start_counts))
    );
    for ((verb, resource, code), count) in &start_counts {
        if WRITES.contains(&verb.as_str()) {
            println!(
                "| - {verb} {resource} ({code}) per start | {:.3} |",
                per(*count)
            );
        }
    }
    if of_a_kind {
        let kind_writes: u64 = start_counts
            .iter()
            .filter(|((v, r, _), _)| v == "patch" && r == "workspacekinds/status")
            .map(|(_, n)| n)
            .sum();
        println!(
            "| the kind's status writes over the start ({:.1} s) / per second | {kind_writes} / {:.2} |",
            counted_over.as_secs_f64(),
            kind_writes as f64 / counted_over.as_secs_f64()
        );
    }
    println!(
        "| refused (409) writes per start | {:.3} |",
        per(start_counts
            .iter()
            .filter(|((v, _, c), _)| WRITES.contains(&v.as_str()) && *c == 409)
            .map(|(_, n)| n)
            .sum())
    );
    println!(
        "| writes over {}s idle | {} |",
        idle.as_secs(),
        writes(&idle_counts)
    );
    for ((verb, resource, code), count) in &idle_counts {
        if WRITES.contains(&verb.as_str()) {
            println!("| - idle: {verb} {resource} ({code}) | {count} |");
        }
    }
    if let Some(restart) = &restart {
        println!(
            "| restart: ready after / writes in the 10 s after | {:.2} s / {} |",
            restart.ready_after.as_secs_f64(),
            writes(&restart.counts)
        );
        println!(
            "| - listing every workspace and pod in pages of 500, just before | {:.2} s |",
            restart.list_floor.as_secs_f64()
        );
        for ((verb, resource, code), count) in &restart.counts {
            if WRITES.contains(&verb.as_str()) {
                println!("| - after the restart: {verb} {resource} ({code}) | {count} |");
            }
        }
    }
    if let Some(handoff) = &handoff {
        println!(
            "| handoff: shard 1's replica killed -> its Lease taken by {} / a new workspace of it Running | {:.1} s / {:.1} s |",
            handoff.taker,
            handoff.taken_after.as_secs_f64(),
            handoff.running_after.as_secs_f64()
        );
        println!(
            "| - the taker's peak RSS holding two shards / writes in the 10 s after the takeover (the new workspace's included) | {:.0} MiB / {} |",
            handoff.taker_rss,
            writes(&handoff.counts)
        );
        for ((verb, resource, code), count) in &handoff.counts {
            if WRITES.contains(&verb.as_str()) {
                println!("| - after the takeover: {verb} {resource} ({code}) | {count} |");
            }
        }
    }
    println!(
        "| sim process: peak RSS / CPU (kubelets, in-process agents, API server) | {sim_rss:.0} MiB / {sim_cpu:.0} s |"
    );
    println!(
        "| sim process: CPU while idle (s per s, {} workspaces Running) | {sim_idle_cpu:.2} |",
        n
    );
    println!(
        "| sim process: open files, peak while starting / all running and idle | {sim_fds_peak} / {} |",
        descriptors(sim.pid())
    );

    let mut run_figures = vec![("created -> all Running (s)", to_running.as_secs_f64())];
    match &restart {
        Some(restart) => run_figures.extend([
            ("pod Ready -> Running p99 (ms)", ready_p99),
            ("operator RSS after the start (MiB)", after_start[0].0),
            ("operator RSS after idling (MiB)", rss_idle[0]),
            ("operator RSS restarted (MiB)", restart.rss),
            ("operator CPU per start (ms)", cpu_total * 1000.0 / n as f64),
        ]),
        // Sharded: the worst shard's.
        None => run_figures.extend([
            ("pod Ready -> Running p99 (ms)", worst(|s| s.ready_p99)),
            ("operator RSS after the start (MiB)", worst(|s| s.rss)),
            ("operator RSS after idling (MiB)", worst(|s| s.rss_idle)),
            ("operator CPU per start (ms)", worst(|s| s.cpu_per_start)),
        ]),
    }
    run_figures.push(("reconciles per start", reconciles_during / n as f64));
    guard(
        &format!(
            "{n}{}{}",
            if of_a_kind { "-kind" } else { "" },
            if shards > 1 {
                format!("-{shards}-shards")
            } else {
                String::new()
            }
        ),
        &Figures(run_figures),
    )
}

/// One shard's operator over the start.
struct ShardFigures {
    ready_p99: f64,
    rss: f64,
    rss_idle: f64,
    cpu_per_start: f64,
}

/// A restart of the one operator over the same workspaces.
struct Restart {
    /// Listing every workspace and pod in pages of 500 just before: what a restart waits for
    /// at least, from the sim as loaded as it is.
    list_floor: Duration,
    ready_after: Duration,
    /// Its writes in the 10 s after it was ready.
    counts: BTreeMap<(String, String, u16), u64>,
    rss: f64,
}

async fn restart_operator<F, Fut>(
    admin: &kube::Client,
    kubeconfig: &Path,
    mut operator: Operator,
    ready: &F,
) -> Restart
where
    F: Fn(u16) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let listed = Instant::now();
    list_all::<Workspace>(admin).await;
    list_all::<k8s_openapi::api::core::v1::Pod>(admin).await;
    let list_floor = listed.elapsed();
    let _ = Command::new("kill")
        .args(["-TERM", &operator.process.pid().to_string()])
        .status();
    let _ = operator.process.0.wait();
    let before = operator_requests(admin).await;
    let restarted = start_operator(kubeconfig, "restart", 0, 1);
    let ready_after = ready(restarted.health).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    Restart {
        list_floor,
        ready_after,
        counts: since(&operator_requests(admin).await, &before),
        rss: restarted.process.usage().0,
    }
}

/// Shard 1's replica killed (SIGKILL: its Lease is not released, as in a crash).
struct Handoff {
    /// Who took its shard.
    taker: String,
    /// From the kill until another replica held the shard's Lease.
    taken_after: Duration,
    /// From the kill until a workspace created in one of the shard's namespaces just after it
    /// was Running.
    running_after: Duration,
    /// The operators' writes in the 10 s after the takeover.
    counts: BTreeMap<(String, String, u16), u64>,
    /// The taker's peak RSS then.
    taker_rss: f64,
}

async fn hand_off(
    admin: &kube::Client,
    operators: &mut Vec<Operator>,
    plan: &[(String, String, u32)],
    spec: &Value,
    shards: u32,
) -> Handoff {
    let killed = operators.remove(1);
    let _ = Command::new("kill")
        .args(["-KILL", &killed.process.pid().to_string()])
        .status();
    let at = Instant::now();
    let namespace = &plan
        .iter()
        .find(|(_, _, s)| *s == 1)
        .expect("shard 1 has workspaces")
        .0;
    let workspaces: Api<Workspace> = Api::namespaced(admin.clone(), namespace);
    let body: Workspace = serde_json::from_value(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "after-handoff"},
        "spec": spec
    }))
    .unwrap();
    workspaces
        .create(&PostParams::default(), &body)
        .await
        .unwrap();
    let taker = loop {
        if let Some(holder) = shard_holder(admin, 1, shards)
            .await
            .filter(|h| !h.starts_with("berth-controller-1-"))
        {
            break holder;
        }
        assert!(
            at.elapsed() < Duration::from_secs(120),
            "nobody took shard 1 over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let taken_after = at.elapsed();
    let before = operator_requests(admin).await;
    let running_after = loop {
        let phase = workspaces
            .get("after-handoff")
            .await
            .ok()
            .and_then(|w| w.status?.phase);
        if phase == Some(Phase::Running) {
            break at.elapsed();
        }
        assert!(
            at.elapsed() < Duration::from_secs(300),
            "the new workspace of the handed-off shard never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let until = at + taken_after + Duration::from_secs(10);
    tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
    let counts = since(&operator_requests(admin).await, &before);
    let index: usize = taker
        .strip_prefix("berth-controller-")
        .and_then(|rest| rest.split('-').next())
        .and_then(|i| i.parse().ok())
        .expect("replicas are named berth-controller-<i>-<suffix>");
    // operators lost index 1: those after it moved down by one.
    let position = if index > 1 { index - 1 } else { index };
    drop(killed);
    Handoff {
        taker,
        taken_after,
        running_after,
        counts,
        taker_rss: operators[position].process.usage().0,
    }
}

/// A run's figures that must not grow, by name; lower is better for each.
struct Figures(Vec<(&'static str, f64)>);

/// Where the last recorded run's figures are kept, per size (`bench/scale-recorded.json`).
const RECORDED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../bench/scale-recorded.json"
);
/// How much worse than the recorded run a figure may be before the benchmark fails.
const TOLERANCE: f64 = 0.20;

/// The regression guard: each figure against the last recorded run of this size, failing the
/// benchmark (exit 1) when one is more than 20 % worse; `BERTH_BENCH_RECORD=1` records this
/// run instead (with `BERTH_BENCH_COMMIT`, the commit it measured).
fn guard(size: &str, figures: &Figures) -> Result<(), Regression> {
    let mut recorded: serde_json::Value = std::fs::read_to_string(RECORDED)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    if std::env::var("BERTH_BENCH_RECORD").as_deref() == Ok("1") {
        let mut entry = serde_json::Map::new();
        for (name, value) in &figures.0 {
            entry.insert(
                (*name).to_owned(),
                serde_json::json!((value * 100.0).round() / 100.0),
            );
        }
        if let Ok(commit) = std::env::var("BERTH_BENCH_COMMIT") {
            entry.insert("commit".to_owned(), serde_json::json!(commit));
        }
        recorded[size] = serde_json::Value::Object(entry);
        let text = serde_json::to_string_pretty(&recorded).unwrap_or_default();
        std::fs::write(RECORDED, text + "\n").expect("bench/scale-recorded.json is writable");
        println!("\nrecorded as the run of {size} to compare with (bench/scale-recorded.json)");
        return Ok(());
    }
    let Some(last) = recorded.get(size) else {
        println!(
            "\nno recorded run of {size} to compare with: BERTH_BENCH_RECORD=1 records this one"
        );
        return Ok(());
    };
    let worse: Vec<String> = figures
        .0
        .iter()
        .filter_map(|(name, value)| {
            let before = last[*name].as_f64()?;
            (before > 0.0 && *value > before * (1.0 + TOLERANCE)).then(|| {
                format!(
                    "{name}: {value:.2}, was {before:.2} (+{:.0} %)",
                    (value / before - 1.0) * 100.0
                )
            })
        })
        .collect();
    if worse.is_empty() {
        println!("\nno figure is more than 20 % worse than the recorded run of {size}");
        return Ok(());
    }
    Err(Regression(format!(
        "\nREGRESSION against the recorded run of {size} ({}):\n- {}",
        last["commit"].as_str().unwrap_or("commit not recorded"),
        worse.join("\n- ")
    )))
}

/// The guard's failure: what regressed, said once the processes are stopped.
struct Regression(String);
