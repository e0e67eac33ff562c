//! The operator's configuration: what the `berth controller` flags set. The parts the pure
//! core needs are in [`Policy`].

use std::{str::FromStr, time::Duration};

use berth_api::PodRecreationPolicy;

/// How a Warning event on a workspace's pod counts (rule C7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarningClass {
    /// Something is wrong (it may still heal): the workspace is `Error`.
    Error,
    /// Expected while things settle (e.g. `FailedScheduling` while a node is added): the
    /// message shows it, the phase stays `Starting`.
    Transient,
    /// Not worth showing.
    Ignore,
}

/// One classification rule: a Warning reason, its class, and the event count from which it
/// applies (`FailedMount` may appear once while a secret is being created).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarningRule {
    pub reason: String,
    pub class: WarningClass,
    pub min_count: u32,
}

/// The classification of Warning reasons; unknown reasons are `Transient`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarningPolicy {
    pub rules: Vec<WarningRule>,
}

/// The defaults, written as the `--warning-reasons` flag takes them.
pub const DEFAULT_WARNING_REASONS: &str = "FailedMount=error:2,FailedAttachVolume=error:2,FailedCreatePodSandBox=error,Failed=error,BackOff=error,FailedPostStartHook=error,FailedScheduling=transient,Unhealthy=transient:3,NetworkNotReady=transient,DNSConfigForming=ignore,FailedPreStopHook=ignore";

impl Default for WarningPolicy {
    fn default() -> Self {
        DEFAULT_WARNING_REASONS
            .parse()
            .expect("the default warning reasons parse")
    }
}

impl WarningPolicy {
    /// How a Warning with `reason` seen `count` times counts.
    pub fn classify(&self, reason: &str, count: u32) -> WarningClass {
        match self.rules.iter().find(|r| r.reason == reason) {
            Some(rule) if count >= rule.min_count => rule.class,
            Some(rule) if rule.class == WarningClass::Error => WarningClass::Transient,
            Some(rule) => rule.class,
            None => WarningClass::Transient,
        }
    }
}

impl FromStr for WarningPolicy {
    type Err = String;

    /// `Reason=class[:min_count],...` with class `error`, `transient` or `ignore`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut rules = vec![];
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (reason, rest) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected Reason=class[:count]"))?;
            let (class, count) = match rest.split_once(':') {
                Some((class, count)) => (
                    class,
                    count
                        .parse::<u32>()
                        .map_err(|_| format!("{item:?}: the count must be a number"))?,
                ),
                None => (rest, 1),
            };
            let class = match class {
                "error" => WarningClass::Error,
                "transient" => WarningClass::Transient,
                "ignore" => WarningClass::Ignore,
                other => {
                    return Err(format!(
                        "{item:?}: unknown class {other:?}; use error, transient or ignore"
                    ));
                }
            };
            rules.push(WarningRule {
                reason: reason.trim().to_owned(),
                class,
                min_count: count.max(1),
            });
        }
        Ok(WarningPolicy { rules })
    }
}

/// What the pure core needs to decide.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// A start with no progress for this long fails (rule C9), unless the spec says otherwise.
    pub start_timeout: Duration,
    /// Rejection recovery defaults (rule C11).
    pub recreation: PodRecreationPolicy,
    /// The longest wait between checks of a workspace that is not running yet (rule C6).
    pub max_requeue: Duration,
    /// The safety-net recheck of a running workspace.
    pub resync: Duration,
    /// Progress within a start (same phase, nothing wrong) is written at most this often
    /// (rule C16); a phase change or anything wrong is written at once.
    pub progress_interval: Duration,
    pub warnings: WarningPolicy,
    /// Which failed pods count as kubelet rejections (rule C10).
    pub rejections: crate::rejection::RejectionPolicy,
    /// What a workspace's pod may ask for beyond its containers (default: nothing).
    pub pod: crate::pod_policy::PodPolicy,
    /// How long deleting a workspace waits for its pod before deleting it at once and
    /// letting the workspace go (rule C18).
    pub deletion_grace: Duration,
}

/// The operator's side of the agent (rules C4, C14, C15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// The image holding the `berth` binary (the operator's own image): the init container
    /// copies it into the pod, and a workspace without a command runs it as a sidecar.
    pub image: String,
    /// Where `berth` is in that image.
    pub binary: String,
    /// The port the agent serves on in the pod.
    pub port: u16,
    /// The service account the operator authenticates to agents as (TokenRequest).
    pub service_account: ServiceAccountRef,
    /// How long a requested token lives; it is renewed at 80% of its lifetime.
    pub token_lifetime: Duration,
    /// The connect and call timeout of a WhoAmI.
    pub timeout: Duration,
    /// The first retry after a failed check; it doubles up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How many agent checks run at once; the others wait their turn in the order their pods
    /// turned ready.
    pub checks_in_flight: usize,
    /// Agents serve TLS with a certificate from this secret, verified against this CA.
    pub tls: Option<AgentTls>,
    /// Workspace containers may run as root (`--allow-root-images`): the admin's choice for
    /// images that need it, never a workspace author's. Their pods then meet Pod Security
    /// "baseline", not "restricted"; Berth's own containers never run as root.
    pub root_images: bool,
}

/// TLS between the operator and agents (agent.md, Transport).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentTls {
    /// A `kubernetes.io/tls` secret in each workspace's namespace; its certificate must name
    /// `berth-agent`.
    pub secret: String,
    /// The CA bundle (PEM) the operator verifies agents' certificates against.
    pub ca_pem: Vec<u8>,
}

/// `namespace/name` of a service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountRef {
    /// The user name Kubernetes gives its tokens.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl std::fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl FromStr for ServiceAccountRef {
    type Err = String;

    /// `namespace/name`; `system:serviceaccount:namespace:name` is taken too.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts = match text.strip_prefix("system:serviceaccount:") {
            Some(rest) => rest.split_once(':'),
            None => text.split_once('/'),
        };
        match parts {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains(['/', ':']) =>
            {
                Ok(ServiceAccountRef {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!(
                "{text:?} is not a service account: expected NAMESPACE/NAME"
            )),
        }
    }
}

/// The image `berth` is published as, at this version.
pub const DEFAULT_AGENT_IMAGE: &str =
    concat!("ghcr.io/berth-dev/berth:", env!("CARGO_PKG_VERSION"));

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            image: DEFAULT_AGENT_IMAGE.to_owned(),
            binary: "/usr/local/bin/berth".to_owned(),
            port: berth_api::agent::DEFAULT_PORT,
            service_account: ServiceAccountRef {
                namespace: "berth-system".to_owned(),
                name: "berth-controller".to_owned(),
            },
            token_lifetime: Duration::from_secs(3600),
            timeout: Duration::from_secs(5),
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            checks_in_flight: 64,
            tls: None,
            root_images: false,
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            start_timeout: Duration::from_secs(600),
            recreation: PodRecreationPolicy {
                max: 3,
                delay: Duration::from_secs(15),
            },
            max_requeue: Duration::from_secs(60),
            resync: Duration::from_secs(600),
            progress_interval: Duration::from_secs(1),
            warnings: WarningPolicy::default(),
            rejections: crate::rejection::RejectionPolicy::default(),
            pod: crate::pod_policy::PodPolicy::default(),
            deletion_grace: Duration::from_secs(60),
        }
    }
}
