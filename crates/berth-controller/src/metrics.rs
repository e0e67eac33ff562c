//! Prometheus metrics (OpenMetrics) and the `/metrics`, `/healthz`, `/readyz` endpoints.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::{Registry, Unit},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: String,
}

/// The process's own CPU, memory and open files, read from `/proc/self` at each scrape, under
/// the names every Prometheus client uses (`process_cpu_seconds_total`, ...).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(me) = procfs::process::Process::myself() else {
            return Ok(());
        };
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second().max(1) as f64;
            let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / ticks);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu",
                "User and system CPU time spent",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?)?;
            let rss = ConstGauge::new(stat.rss.saturating_mul(procfs::page_size()) as i64);
            rss.encode(encoder.encode_descriptor(
                "process_resident_memory",
                "Resident memory size",
                Some(&Unit::Bytes),
                rss.metric_type(),
            )?)?;
        }
        if let Ok(fds) = me.fd_count() {
            let open = ConstGauge::new(fds as i64);
            open.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Open file descriptors",
                None,
                open.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecreationLabels {
    pub reason: String,
    pub attempt: String,
}

/// The operator's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub reconcile_duration: Family<ResultLabel, Histogram>,
    pub reconcile_errors: Family<ReasonLabel, Counter>,
    pub workspaces: Family<PhaseLabel, Gauge>,
    pub start_seconds: Histogram,
    pub status_writes: Counter,
    /// WorkspaceKind status writes (each kind's at most once per second).
    pub kind_status_writes: Counter,
    pub pod_recreations: Family<RecreationLabels, Counter>,
    /// WhoAmI calls to agents, by result (`ok` or the failure's reason).
    pub agent_checks: Family<ResultLabel, Counter>,
    /// GetActivity calls to agents, by result (`ok` or the failure's reason).
    pub activity_checks: Family<ResultLabel, Counter>,
    /// Workspaces paused because nobody used them for their idle timeout.
    pub culled: Counter,
    /// Events given up on after every attempt to publish them failed, by the event's reason.
    pub events_dropped: Family<ReasonLabel, Counter>,
    /// Caches synced and the CRD served: `/readyz` answers 200.
    pub ready: AtomicBool,
    /// Why the operator is not ready yet, when it knows better than "caches not synced" (a
    /// startup request it keeps retrying): `/readyz` says it.
    waiting_for: Mutex<Option<String>>,
    /// Counts workspaces by phase from the running operator's cache, at each scrape: a
    /// reconcile never scans every workspace (that made each one cost O(n)). One counter per
    /// shard this replica reconciles, summed.
    phases: Mutex<std::collections::BTreeMap<u32, PhaseCounter>>,
}

/// Counts the cached workspaces by phase.
pub type PhaseCounter = Box<dyn Fn() -> HashMap<String, i64> + Send + Sync>;

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("berth");
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        registry.register(
            "build_info",
            "The running operator's version (always 1)",
            build_info,
        );
        let reconcile_duration = Family::<ResultLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
        });
        let reconcile_errors = Family::<ReasonLabel, Counter>::default();
        let workspaces = Family::<PhaseLabel, Gauge>::default();
        let start_seconds = Histogram::new([1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]);
        let status_writes = Counter::default();
        let kind_status_writes = Counter::default();
        let pod_recreations = Family::<RecreationLabels, Counter>::default();
        let agent_checks = Family::<ResultLabel, Counter>::default();
        let activity_checks = Family::<ResultLabel, Counter>::default();
        let culled = Counter::default();
        registry.register(
            "reconcile_duration_seconds",
            "Time to reconcile one workspace, by result",
            reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile errors, by reason",
            reconcile_errors.clone(),
        );
        registry.register("workspaces", "Workspaces, by phase", workspaces.clone());
        registry.register(
            "workspace_start_seconds",
            "From the start of a workspace (creation, resume, spec change) to Ready",
            start_seconds.clone(),
        );
        registry.register(
            "status_writes",
            "Workspace status writes",
            status_writes.clone(),
        );
        registry.register(
            "kind_status_writes",
            "WorkspaceKind status writes (the workspaces of each kind, at most once per second per kind)",
            kind_status_writes.clone(),
        );
        registry.register(
            "pod_recreations",
            "Pods replaced after a kubelet rejection or a lost node, by reason and attempt",
            pod_recreations.clone(),
        );
        registry.register(
            "agent_checks",
            "WhoAmI calls to workspace agents, by result (ok, or the failure's reason)",
            agent_checks.clone(),
        );
        registry.register(
            "agent_activity_checks",
            "GetActivity calls to workspace agents, by result (ok, or the failure's reason)",
            activity_checks.clone(),
        );
        let events_dropped = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "events_dropped",
            "Events given up on after every attempt to publish them failed, by the event's reason",
            events_dropped.clone(),
        );
        registry.register(
            "workspaces_culled",
            "Workspaces paused because nobody used them for their idle timeout",
            culled.clone(),
        );
        Metrics {
            registry: Mutex::new(root),
            reconcile_duration,
            reconcile_errors,
            workspaces,
            start_seconds,
            status_writes,
            kind_status_writes,
            pod_recreations,
            agent_checks,
            activity_checks,
            culled,
            events_dropped,
            ready: AtomicBool::new(false),
            waiting_for: Mutex::new(None),
            phases: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Where `berth_workspaces{phase}` is counted from, from now on.
    /// Counts shard `shard`'s workspaces by phase with `counter` (replacing an earlier one).
    pub fn count_phases_with(&self, shard: u32, counter: PhaseCounter) {
        (self.phases.lock().unwrap_or_else(|p| p.into_inner())).insert(shard, counter);
    }

    /// Stops counting shard `shard`'s workspaces (this replica no longer reconciles it).
    pub fn forget_phases(&self, shard: u32) {
        (self.phases.lock().unwrap_or_else(|p| p.into_inner())).remove(&shard);
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let counters = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        if !counters.is_empty() {
            let mut counts: HashMap<String, i64> = HashMap::new();
            for counter in counters.values() {
                for (phase, n) in counter() {
                    *counts.entry(phase).or_default() += n;
                }
            }
            for phase in berth_api::Phase::ALL {
                self.workspaces
                    .get_or_create(&PhaseLabel {
                        phase: phase.to_string(),
                    })
                    .set(counts.get(phase.as_str()).copied().unwrap_or(0));
            }
        }
        drop(counters);
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }

    /// Says why the operator is not ready (`None`: nothing it waits for); `/readyz` answers
    /// with it.
    pub fn wait_for(&self, why: Option<String>) {
        *self.waiting_for.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// What the operator says it waits for, if anything.
    pub fn waiting(&self) -> Option<String> {
        self.waiting_for
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn observe_reconcile(&self, result: &str, duration: Duration) {
        self.reconcile_duration
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .observe(duration.as_secs_f64());
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

async fn healthz() -> impl IntoResponse {
    "ok"
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Relaxed) {
        return (StatusCode::OK, "ok".to_owned());
    }
    let why = metrics
        .waiting()
        .unwrap_or_else(|| "caches not synced".to_owned());
    (StatusCode::SERVICE_UNAVAILABLE, why)
}

/// Binds `/metrics` on one address and the health endpoints on another (or the same), and
/// returns the future that serves them.
pub async fn serve(
    metrics: Arc<Metrics>,
    metrics_address: Option<SocketAddr>,
    health_address: Option<SocketAddr>,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, crate::Error> {
    let metrics_router = Router::new().route("/metrics", get(self::metrics));
    let health_router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    let plan: Vec<(SocketAddr, &str, Router<Arc<Metrics>>)> =
        match (metrics_address, health_address) {
            (Some(m), Some(h)) if m == h => {
                vec![(m, "metrics and health", metrics_router.merge(health_router))]
            }
            (m, h) => m
                .map(|a| (a, "metrics", metrics_router))
                .into_iter()
                .chain(h.map(|a| (a, "health", health_router)))
                .collect(),
        };
    // Every address is bound before anything is served: one in use fails the start, naming it.
    let mut bound = vec![];
    for (address, what, router) in plan {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| crate::Error::Serve(format!("cannot serve {what} on {address}: {e}")))?;
        let local = listener.local_addr().unwrap_or(address);
        tracing::info!(address = %local, "serving {what}");
        bound.push((listener, router.with_state(metrics.clone())));
    }
    Ok(async move {
        let mut servers = tokio::task::JoinSet::new();
        for (listener, app) in bound {
            servers.spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
        }
        while servers.join_next().await.is_some() {}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a person probing `/readyz` reads: the status and the body.
    async fn probe(metrics: &Arc<Metrics>) -> (StatusCode, String) {
        let answer = readyz(State(metrics.clone())).await.into_response();
        let status = answer.status();
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_says_why_the_operator_is_not_ready() {
        let metrics = Arc::new(Metrics::default());
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            probe(&metrics).await,
            (unavailable, "caches not synced".to_owned())
        );
        let why = "reading the Lease berth-system/berth-controller failed (500); retrying in 2s";
        metrics.wait_for(Some(why.to_owned()));
        assert_eq!(probe(&metrics).await, (unavailable, why.to_owned()));
        metrics.ready.store(true, Ordering::Relaxed);
        assert_eq!(probe(&metrics).await, (StatusCode::OK, "ok".to_owned()));
    }
}
