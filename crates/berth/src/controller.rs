//! `berth controller`: the operator's flags (each with an environment variable) and its start.

use std::{net::SocketAddr, time::Duration};

use berth_api::{PodRecreationPolicy, parse_duration};
use berth_controller::{
    Config, Policy, WarningPolicy,
    config::{DEFAULT_WARNING_REASONS, LeaderElection},
};

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

/// Options of `berth controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Watch only this namespace (default: all).
    #[arg(long, env = "BERTH_NAMESPACE")]
    pub namespace: Option<String>,
    /// A start with no progress for this long fails (StartTimeout), unless the workspace says otherwise.
    #[arg(long, env = "BERTH_START_TIMEOUT", default_value = "10m", value_parser = duration)]
    pub start_timeout: Duration,
    /// How many rejected pods are replaced per start, unless the workspace says otherwise.
    #[arg(long, env = "BERTH_POD_RECREATION_LIMIT", default_value_t = 3)]
    pub pod_recreation_limit: u32,
    /// Wait between a rejected pod being gone and its replacement, unless the workspace says otherwise.
    #[arg(long, env = "BERTH_POD_RECREATION_DELAY", default_value = "15s", value_parser = duration)]
    pub pod_recreation_delay: Duration,
    /// The longest wait between checks of a workspace that is not running yet (the safety net;
    /// news arrives through watches).
    #[arg(long, env = "BERTH_MAX_REQUEUE", default_value = "60s", value_parser = duration)]
    pub max_requeue: Duration,
    /// The safety-net recheck of running workspaces.
    #[arg(long, env = "BERTH_RESYNC", default_value = "10m", value_parser = duration)]
    pub resync: Duration,
    /// How Warning events of a workspace's pod count: Reason=error|transient|ignore[:min-count],...
    #[arg(long, env = "BERTH_WARNING_REASONS", default_value = DEFAULT_WARNING_REASONS)]
    pub warning_reasons: WarningPolicy,
    /// Which kubelet reasons of a failed, never-started pod mean "rejected": exact names, or a
    /// prefix ending in *.
    #[arg(long, env = "BERTH_REJECTION_REASONS", default_value = berth_controller::rejection::DEFAULT_REJECTION_REASONS)]
    pub rejection_reasons: berth_controller::rejection::RejectionPolicy,
    /// How long deleting a workspace waits for its pod before letting the workspace go anyway.
    #[arg(long, env = "BERTH_DELETION_GRACE", default_value = "60s", value_parser = duration)]
    pub deletion_grace: Duration,
    /// Where /metrics is served ("off" to disable).
    #[arg(long, env = "BERTH_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: String,
    /// Where /healthz and /readyz are served ("off" to disable).
    #[arg(long, env = "BERTH_HEALTH_ADDRESS", default_value = "0.0.0.0:8081")]
    pub health_address: String,
    /// Reconcile only while holding the leader Lease (for several replicas).
    #[arg(long, env = "BERTH_LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,
    /// The leader Lease's name.
    #[arg(long, env = "BERTH_LEASE_NAME", default_value = "berth-controller")]
    pub lease_name: String,
    /// The leader Lease's namespace (default: the pod's namespace, else `default`).
    #[arg(long, env = "BERTH_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
}

fn address(text: &str) -> Result<Option<SocketAddr>, String> {
    if text == "off" {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|e| format!("{text:?} is not an address: {e}"))
}

impl ControllerArgs {
    /// The operator configuration these flags describe.
    pub fn config(&self) -> Result<Config, String> {
        Ok(Config {
            namespace: self.namespace.clone(),
            policy: Policy {
                start_timeout: self.start_timeout,
                recreation: PodRecreationPolicy {
                    max: self.pod_recreation_limit,
                    delay: self.pod_recreation_delay,
                },
                max_requeue: self.max_requeue,
                resync: self.resync,
                warnings: self.warning_reasons.clone(),
                rejections: self.rejection_reasons.clone(),
            },
            deletion_grace: self.deletion_grace,
            metrics_address: address(&self.metrics_address)?,
            health_address: address(&self.health_address)?,
            leader_election: self.leader_election.then(|| LeaderElection {
                lease: self.lease_name.clone(),
                namespace: self
                    .lease_namespace
                    .clone()
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_else(|| "default".into()),
                identity: std::env::var("HOSTNAME")
                    .unwrap_or_else(|_| format!("berth-{}", std::process::id())),
                duration_seconds: 15,
                grace_seconds: 5,
            }),
            ..Config::default()
        })
    }
}

/// Runs the operator against the current kubeconfig or the in-cluster config.
pub async fn run(args: ControllerArgs) -> Result<(), String> {
    let config = args.config()?;
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot reach Kubernetes: {e}"))?;
    tracing::info!(namespace = ?config.namespace, "berth controller starting");
    berth_controller::run(client, config)
        .await
        .map_err(|e| e.to_string())
}
