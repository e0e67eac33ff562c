//! The settings of a simulated cluster: the API server's (history, bookmarks, grace), its
//! nodes, and the timings of its scheduler, kubelets and node controller.

use std::{collections::BTreeMap, time::Duration};

/// How the sim finishes graceful pod deletions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodTermination {
    /// The API server itself removes a pod once its grace period (capped) has passed.
    AfterGracePeriod,
    /// Something else (a kubelet) completes the deletion.
    External,
}

/// Settings of a simulated cluster.
#[derive(Clone)]
pub struct SimConfig {
    /// How many changes the history keeps for watch resumption; older revisions get 410 Gone.
    pub history_limit: usize,
    /// How long the history keeps a change (etcd's compaction interval).
    pub history_window: Duration,
    /// How often watches that asked for bookmarks receive one.
    pub bookmark_interval: Duration,
    /// How graceful pod deletions finish.
    pub pod_termination: PodTermination,
    /// Caps a pod's grace period, so tests need not wait 30 s.
    pub max_pod_grace: Duration,
    /// Namespaces created at start besides default, kube-system, kube-public, kube-node-lease.
    pub namespaces: Vec<String>,
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// The nodes, each with a scheduler-visible capacity and a kubelet. None: an API server
    /// only (like envtest): pods stay Pending.
    pub nodes: Vec<NodeConfig>,
    /// Delays and backoffs of the scheduler, kubelets and node controller.
    pub timings: Timings,
    /// Seeds the one RNG behind every random fault, so a run can be reproduced.
    pub seed: u64,
    /// What running a container means.
    pub runtime: crate::runtime::SharedRuntime,
    /// Images matching any of these patterns (`*` is a wildcard) cannot be pulled.
    pub unpullable_images: Vec<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            history_limit: 250_000,
            history_window: crate::store::HISTORY_WINDOW,
            bookmark_interval: Duration::from_secs(10),
            pod_termination: PodTermination::AfterGracePeriod,
            max_pod_grace: Duration::from_secs(30),
            namespaces: vec![],
            port: 0,
            nodes: NodeConfig::several(3),
            timings: Timings::realistic(),
            seed: 1,
            runtime: std::sync::Arc::new(crate::runtime::IdleRuntime),
            unpullable_images: vec!["*.invalid/*".to_owned(), "*does-not-exist*".to_owned()],
        }
    }
}

impl SimConfig {
    /// Millisecond timings and short grace periods, for tests.
    pub fn fast() -> Self {
        SimConfig {
            timings: Timings::fast(),
            max_pod_grace: Duration::from_millis(200),
            ..SimConfig::default()
        }
    }

    /// An API server with no nodes: nothing schedules or runs.
    pub fn api_only() -> Self {
        SimConfig {
            nodes: vec![],
            max_pod_grace: Duration::from_millis(200),
            ..SimConfig::default()
        }
    }
}

/// One simulated node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Taints as `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    /// Allocatable cpu, e.g. `"4"`.
    pub cpu: String,
    /// Allocatable memory, e.g. `"16Gi"`.
    pub memory: String,
    pub pods: u32,
}

impl NodeConfig {
    /// A node with 4 cpu, 16Gi and room for 110 pods, labelled like a real one.
    pub fn new(name: &str) -> Self {
        let labels = [
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        NodeConfig {
            name: name.to_owned(),
            labels,
            taints: vec![],
            cpu: "4".into(),
            memory: "16Gi".into(),
            pods: 110,
        }
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints
            .push((key.to_owned(), value.to_owned(), effect.to_owned()));
        self
    }

    pub fn capacity(mut self, cpu: &str, memory: &str, pods: u32) -> Self {
        self.cpu = cpu.to_owned();
        self.memory = memory.to_owned();
        self.pods = pods;
        self
    }

    /// `count` nodes `node-1`...`node-N` spread over zones a, b, c.
    pub fn several(count: usize) -> Vec<NodeConfig> {
        (1..=count)
            .map(|i| {
                NodeConfig::new(&format!("node-{i}")).label(
                    "topology.kubernetes.io/zone",
                    &format!("zone-{}", ["a", "b", "c"][(i - 1) % 3]),
                )
            })
            .collect()
    }
}

/// Timing knobs of the scheduler, kubelets and node controller.
#[derive(Clone, Debug, PartialEq)]
pub struct Timings {
    pub sandbox: Duration,
    pub pull: Duration,
    pub container_start: Duration,
    /// From a container's start to its readiness (when it has no probe that decides).
    pub readiness: Duration,
    /// Time to stop containers on deletion (capped by the grace period).
    pub stop: Duration,
    pub mount_retry: Backoff,
    pub pull_backoff: Backoff,
    pub crash_backoff: Backoff,
    pub heartbeat: Duration,
    /// No heartbeat for this long: the node is `Ready=Unknown`.
    pub node_monitor_grace: Duration,
    /// Caps how long pods on an unreachable node tolerate it before eviction (300 s by default).
    pub eviction_cap: Duration,
}

/// An exponential backoff: `initial`, doubling up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn after(&self, attempt: u32) -> Duration {
        self.initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max)
    }
}

impl Timings {
    /// Close to a real cluster's, shortened where waiting teaches nothing (for demos).
    pub fn realistic() -> Self {
        Timings {
            sandbox: Duration::from_millis(300),
            pull: Duration::from_millis(1200),
            container_start: Duration::from_millis(200),
            readiness: Duration::from_millis(500),
            stop: Duration::from_millis(1000),
            mount_retry: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(16),
            },
            pull_backoff: Backoff {
                initial: Duration::from_secs(5),
                max: Duration::from_secs(60),
            },
            crash_backoff: Backoff {
                initial: Duration::from_secs(10),
                max: Duration::from_secs(300),
            },
            heartbeat: Duration::from_secs(10),
            node_monitor_grace: Duration::from_secs(40),
            eviction_cap: Duration::from_secs(300),
        }
    }

    /// Milliseconds everywhere, for tests.
    pub fn fast() -> Self {
        Timings {
            sandbox: Duration::from_millis(10),
            pull: Duration::from_millis(10),
            container_start: Duration::from_millis(10),
            readiness: Duration::from_millis(10),
            stop: Duration::from_millis(20),
            mount_retry: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(400),
            },
            pull_backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(400),
            },
            crash_backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(400),
            },
            heartbeat: Duration::from_millis(100),
            node_monitor_grace: Duration::from_millis(500),
            eviction_cap: Duration::from_millis(500),
        }
    }
}
