//! `berth controller`: the operator's flags (each with an environment variable) and its start.

use std::{net::SocketAddr, time::Duration};

use berth_api::{PodRecreationPolicy, parse_duration};
use berth_controller::{
    Config, Policy, WarningPolicy,
    config::{
        AgentConfig, AgentTls, DEFAULT_WARNING_REASONS, LeaderElection, ServiceAccountRef, Sharding,
    },
};

pub fn duration(text: &str) -> Result<Duration, String> {
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
    /// Progress within a start (the same phase, nothing wrong) is written to the status at most this often; a phase change or a problem is written at once.
    #[arg(long, env = "BERTH_STATUS_PROGRESS_INTERVAL", default_value = "1s", value_parser = duration)]
    pub status_progress_interval: Duration,
    /// How Warning events of a workspace's pod count: Reason=error|transient|ignore[:min-count],...
    #[arg(long, env = "BERTH_WARNING_REASONS", default_value = DEFAULT_WARNING_REASONS)]
    pub warning_reasons: WarningPolicy,
    /// Which kubelet reasons of a failed, never-started pod mean "rejected": exact names, or a
    /// prefix ending in *.
    #[arg(long, env = "BERTH_REJECTION_REASONS", default_value = berth_controller::rejection::DEFAULT_REJECTION_REASONS)]
    pub rejection_reasons: berth_controller::rejection::RejectionPolicy,
    #[command(flatten)]
    pub pod_policy: PodPolicyArgs,
    /// How long deleting a workspace waits for its pod before letting the workspace go anyway.
    #[arg(long, env = "BERTH_DELETION_GRACE", default_value = "60s", value_parser = duration)]
    pub deletion_grace: Duration,
    /// Where /metrics is served ("off" to disable).
    #[arg(long, env = "BERTH_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: String,
    /// Where /healthz and /readyz are served ("off" to disable).
    #[arg(long, env = "BERTH_HEALTH_ADDRESS", default_value = "0.0.0.0:8081")]
    pub health_address: String,
    /// Reconcile only while holding the leader Lease (for several replicas). Default: off,
    /// this replica reconciles alone.
    #[arg(long, env = "BERTH_LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,
    /// Split the workspaces among replicas by namespace into this many shards, each reconciled
    /// by whichever replica holds its Lease (`<lease-name>-shard-<i>-of-<N>`); implies leader
    /// election. A replica competes at once for the shard its pod name's ordinal (else a hash
    /// of the name) picks, for the others once their holders are gone. With more than one
    /// shard, each writes its count of a WorkspaceKind's workspaces into the kind's
    /// `status.shards`, and shard 0's holder their sum. Default: 1, no sharding.
    #[arg(long, env = "BERTH_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(berth_controller::shard::BUCKETS)))]
    pub shards: u32,
    /// The leader Lease's name.
    #[arg(long, env = "BERTH_LEASE_NAME", default_value = "berth-controller")]
    pub lease_name: String,
    /// The leader Lease's namespace (default: the pod's namespace, else `default`).
    #[arg(long, env = "BERTH_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// The service account the operator authenticates to workspace agents as, NAMESPACE/NAME
    /// (its tokens come from the TokenRequest API). Default: in a pod, the pod's own service
    /// account; elsewhere it is required.
    #[arg(long, env = "BERTH_SERVICE_ACCOUNT", value_parser = |s: &str| s.parse::<ServiceAccountRef>())]
    pub service_account: Option<ServiceAccountRef>,
    /// The image holding the `berth` binary, injected into workspace pods as the agent.
    /// Default: in a pod, the operator's own image (so an install that retags it needs
    /// nothing else); elsewhere `ghcr.io/berth-dev/berth:<version>`.
    #[arg(long, env = "BERTH_AGENT_IMAGE")]
    pub agent_image: Option<String>,
    /// Where `berth` is inside that image.
    #[arg(
        long,
        env = "BERTH_AGENT_BINARY",
        default_value = "/usr/local/bin/berth"
    )]
    pub agent_binary: String,
    /// The port agents serve gRPC on.
    #[arg(long, env = "BERTH_AGENT_PORT", default_value_t = berth_agent::DEFAULT_PORT)]
    pub agent_port: u16,
    /// The first wait after a failed agent check; it doubles up to --agent-backoff-max.
    #[arg(long, env = "BERTH_AGENT_BACKOFF_BASE", default_value = "5s", value_parser = duration)]
    pub agent_backoff_base: Duration,
    /// The longest wait between agent checks.
    #[arg(long, env = "BERTH_AGENT_BACKOFF_MAX", default_value = "5m", value_parser = duration)]
    pub agent_backoff_max: Duration,
    /// How many workspaces are reconciled at once, across the shards: with --shards N, each
    /// shard's holder reconciles at most this divided by N (at least 1), so N replicas put as
    /// many writes in flight on the API server as one operator does. Agent checks have their
    /// own bound, per replica (--agent-checks-in-flight).
    #[arg(long, env = "BERTH_RECONCILES_IN_FLIGHT", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=i64::from(u16::MAX)))]
    pub reconciles_in_flight: u32,
    /// How many agent checks run at once; the others wait in the order their pods turned
    /// ready (a silent agent holds its slot for the call's timeout, 5 s).
    #[arg(long, env = "BERTH_AGENT_CHECKS_IN_FLIGHT", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub agent_checks_in_flight: u16,
    /// Agents serve TLS with the certificate of this kubernetes.io/tls secret (in each
    /// workspace's namespace; the certificate must name `berth-agent`). Needs --agent-tls-ca.
    /// Default: none, agents serve plaintext gRPC.
    #[arg(long, env = "BERTH_AGENT_TLS_SECRET", requires = "agent_tls_ca")]
    pub agent_tls_secret: Option<String>,
    /// The CA bundle (PEM file) agents' certificates are verified against. Default: none.
    #[arg(long, env = "BERTH_AGENT_TLS_CA", requires = "agent_tls_secret")]
    pub agent_tls_ca: Option<std::path::PathBuf>,
    /// Let workspace containers run as root, for images that need it. Off, every container
    /// of a workspace pod runs as non-root with no capabilities, no privilege escalation and
    /// the runtime's seccomp profile (Pod Security "restricted"); on, the workspace container
    /// may run as root (Pod Security "baseline"); Berth's own containers never do. Default: off.
    #[arg(long, env = "BERTH_ALLOW_ROOT_IMAGES")]
    pub allow_root_images: bool,
}

/// Where a pod's service-account token is mounted.
pub const POD_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The service account a service-account token belongs to: its `sub` claim,
/// `system:serviceaccount:NAMESPACE:NAME`. The token is not verified; it only names the
/// operator's own account.
pub fn token_service_account(token: &str) -> Option<ServiceAccountRef> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims["sub"].as_str()?.parse().ok()
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
                progress_interval: self.status_progress_interval,
                warnings: self.warning_reasons.clone(),
                rejections: self.rejection_reasons.clone(),
                pod: self.pod_policy.policy(self.agent_port),
                deletion_grace: self.deletion_grace,
            },
            metrics_address: address(&self.metrics_address)?,
            health_address: address(&self.health_address)?,
            leader_election: (self.leader_election || self.shards > 1).then(|| LeaderElection {
                lease: self.lease_name.clone(),
                namespace: self
                    .lease_namespace
                    .clone()
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_else(|| "default".into()),
                identity: replica_identity(std::env::var("HOSTNAME").ok()),
                duration_seconds: 15,
                grace_seconds: 5,
            }),
            sharding: Sharding {
                count: self.shards,
                preferred: Sharding::preferred_by(
                    &std::env::var("HOSTNAME").unwrap_or_default(),
                    self.shards,
                ),
            },
            reconciles_in_flight: self.reconciles_in_flight,
            agent: AgentConfig {
                image: self
                    .agent_image
                    .clone()
                    .unwrap_or_else(|| berth_controller::config::DEFAULT_AGENT_IMAGE.to_owned()),
                binary: self.agent_binary.clone(),
                port: self.agent_port,
                service_account: self.service_account()?,
                backoff_base: self.agent_backoff_base,
                backoff_max: self.agent_backoff_max.max(self.agent_backoff_base),
                checks_in_flight: self.agent_checks_in_flight.into(),
                tls: self.agent_tls()?,
                root_images: self.allow_root_images,
                ..AgentConfig::default()
            },
            ..Config::default()
        })
    }

    fn agent_tls(&self) -> Result<Option<AgentTls>, String> {
        let (Some(secret), Some(ca)) = (&self.agent_tls_secret, &self.agent_tls_ca) else {
            return Ok(None);
        };
        let ca_pem = std::fs::read(ca)
            .map_err(|e| format!("cannot read the agent CA bundle {}: {e}", ca.display()))?;
        if !String::from_utf8_lossy(&ca_pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "{} holds no PEM certificate (--agent-tls-ca)",
                ca.display()
            ));
        }
        Ok(Some(AgentTls {
            secret: secret.clone(),
            ca_pem,
        }))
    }

    fn service_account(&self) -> Result<ServiceAccountRef, String> {
        if let Some(account) = &self.service_account {
            return Ok(account.clone());
        }
        std::fs::read_to_string(POD_TOKEN)
            .ok()
            .and_then(|token| token_service_account(token.trim()))
            .ok_or_else(|| {
                "cannot tell which service account the operator authenticates to agents as: pass --service-account NAMESPACE/NAME (or set BERTH_SERVICE_ACCOUNT); in a pod it is the pod's own".to_owned()
            })
    }
}

/// Who this replica is in the Lease: the pod name plus a random suffix, so two replicas that
/// share a host name (or a pod name reused after a restart) never both believe they lead.
fn replica_identity(host: Option<String>) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let suffix = hasher.finish() & 0xffff_ffff;
    format!("{}-{suffix:08x}", host.unwrap_or_else(|| "berth".into()))
}

/// Where a pod finds its own namespace.
const POD_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The image of this pod's first container (the operator's own), read from the API: what
/// workspaces copy the agent from, whatever tag or registry the install gave it.
async fn own_image(client: &kube::Client) -> Result<String, String> {
    let name = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map_err(|_| "neither POD_NAME nor HOSTNAME names this pod".to_owned())?;
    let namespace = std::fs::read_to_string(POD_NAMESPACE)
        .map_err(|e| format!("cannot read {POD_NAMESPACE}: {e}"))?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), namespace.trim());
    let pod = pods
        .get(&name)
        .await
        .map_err(|e| format!("cannot read pod {name}: {e}"))?;
    pod.spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .ok_or_else(|| format!("pod {name} names no image"))
}

/// Runs the operator against the current kubeconfig or the in-cluster config.
pub async fn run(args: ControllerArgs) -> Result<(), String> {
    let mut config = args.config()?;
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot reach Kubernetes: {e}"))?;
    if args.agent_image.is_none() && std::path::Path::new(POD_NAMESPACE).exists() {
        match own_image(&client).await {
            Ok(image) => config.agent.image = image,
            Err(e) => {
                tracing::warn!(error = %e, image = %config.agent.image, "cannot read the operator's own image; workspaces get the default agent image")
            }
        }
    }
    tracing::info!(agent_image = %config.agent.image, "agents are copied from this image");
    tracing::info!(namespace = config.namespace.as_deref().unwrap_or("(all)"), service_account = %config.agent.service_account, "berth controller starting");
    berth_controller::run(client, config)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconciles_in_flight_reach_the_operator_split_by_the_shards() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            args: ControllerArgs,
        }
        let config = |flags: &[&str]| {
            let account = [
                "berth",
                "--service-account",
                "berth-system/berth-controller",
            ];
            let args = account.iter().chain(flags);
            clap::Parser::try_parse_from(args)
                .map(|f: Flags| f.args.config().unwrap())
                .unwrap()
        };
        assert_eq!(config(&[]).reconciles_per_shard(), 16);
        let set = config(&["--reconciles-in-flight", "9", "--shards", "2"]);
        assert_eq!(set.reconciles_in_flight, 9);
        assert_eq!(set.reconciles_per_shard(), 4);
    }

    #[test]
    fn replicas_with_one_host_name_have_distinct_identities() {
        let a = replica_identity(Some("berth-controller-0".into()));
        let b = replica_identity(Some("berth-controller-0".into()));
        assert!(a.starts_with("berth-controller-0-"), "{a}");
        assert_ne!(a, b);
        assert!(replica_identity(None).starts_with("berth-"));
    }

    #[test]
    fn a_pod_token_names_its_service_account() {
        use base64::Engine;
        let encode = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let token = format!(
            "{}.{}.signature",
            encode(serde_json::json!({"alg": "RS256"})),
            encode(
                serde_json::json!({"sub": "system:serviceaccount:berth-system:berth-controller"})
            )
        );
        assert_eq!(
            token_service_account(&token),
            Some(ServiceAccountRef {
                namespace: "berth-system".into(),
                name: "berth-controller".into()
            })
        );
        assert_eq!(token_service_account("not-a-jwt"), None);
        let user = format!("x.{}.y", encode(serde_json::json!({"sub": "alice"})));
        assert_eq!(token_service_account(&user), None);
    }
}

/// What a workspace's pod may ask for beyond its containers (the operator refuses a workspace
/// that asks for more in its status; the admission policy's ConfigMap berth-system/berth-admission
/// should say the same, to refuse it at the API).
#[derive(clap::Args, Debug, Clone)]
pub struct PodPolicyArgs {
    /// Toleration keys a workspace may use (comma-separated; `*` allows any, including a
    /// toleration of every taint). Default: none.
    #[arg(long, env = "BERTH_ALLOWED_TOLERATIONS", value_delimiter = ',')]
    pub allowed_tolerations: Vec<String>,
    /// Node label keys a workspace may select nodes by (node selector, affinity). Default: none.
    #[arg(long, env = "BERTH_ALLOWED_NODE_LABELS", value_delimiter = ',')]
    pub allowed_node_labels: Vec<String>,
    /// Namespaces (other than its own) whose pods a workspace's pod affinity terms may select
    /// (`namespaces`); `*` allows any, and a `namespaceSelector`. Default: none.
    #[arg(long, env = "BERTH_ALLOWED_AFFINITY_NAMESPACES", value_delimiter = ',')]
    pub allowed_affinity_namespaces: Vec<String>,
    /// Prefixes of pod labels and annotations a workspace may set (e.g. `example.com`); keys
    /// without a prefix are always allowed, reserved ones (app, berth.dev/*,
    /// app.kubernetes.io/*, *kubernetes.io/*, *k8s.io/*) never. Default: none.
    #[arg(long, env = "BERTH_ALLOWED_METADATA_PREFIXES", value_delimiter = ',')]
    pub allowed_metadata_prefixes: Vec<String>,
    /// URL schemes `spec.content.git.url` may use (comma-separated), e.g. add `file` for
    /// repositories on the nodes' disks or `http` for a plain-text server.
    #[arg(
        long,
        env = "BERTH_ALLOWED_CONTENT_SCHEMES",
        value_delimiter = ',',
        default_value = "https,ssh,git"
    )]
    pub allowed_content_schemes: Vec<String>,
}

impl PodPolicyArgs {
    /// The allow-lists, and the agent's port (`--agent-port`), which no workspace may declare.
    pub fn policy(&self, agent_port: u16) -> berth_controller::pod_policy::PodPolicy {
        berth_controller::pod_policy::PodPolicy {
            tolerations: self.allowed_tolerations.clone(),
            node_labels: self.allowed_node_labels.clone(),
            affinity_namespaces: self.allowed_affinity_namespaces.clone(),
            metadata_prefixes: self.allowed_metadata_prefixes.clone(),
            agent_port,
            content_schemes: self.allowed_content_schemes.clone(),
        }
    }
}
