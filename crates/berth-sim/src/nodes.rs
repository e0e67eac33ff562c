//! Nodes: their configuration and objects, heartbeats (Leases), the node lifecycle controller
//! (an unreachable node goes `Ready=Unknown`, its pods `Unknown`, then are evicted), pod
//! garbage collection for deleted nodes, and a volume binder that binds new claims.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use serde_json::{Value, json};

use crate::{
    faults::UNREACHABLE_ANNOTATION,
    recorder::Source,
    sim::{DeleteOptions, Sim, WriteContext, now_rfc3339},
    store::{ChangeKind, resource_version},
};

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

    /// The Node object a kubelet registers.
    pub fn object(&self, index: usize) -> Value {
        let taints: Vec<Value> = self
            .taints
            .iter()
            .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
            .collect();
        let mut node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": {},
        });
        if !taints.is_empty() {
            node["spec"]["taints"] = json!(taints);
        }
        node["status"] = node_status(&self.cpu, &self.memory, self.pods, &node_ip(index));
        node
    }
}

/// The IP a node reports, on loopback like pod IPs.
pub fn node_ip(index: usize) -> String {
    format!("127.0.{}.{}", 100 + index / 250, index % 250 + 1)
}

fn node_status(cpu: &str, memory: &str, pods: u32, ip: &str) -> Value {
    let now = now_rfc3339();
    let resources = json!({"cpu": cpu, "memory": memory, "pods": pods.to_string(), "ephemeral-storage": "100Gi"});
    let condition = |type_: &str, status: &str, reason: &str, message: &str| json!({"type": type_, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now, "lastTransitionTime": now});
    json!({
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": ip}],
        "nodeInfo": {
            "kubeletVersion": "v1.33.0-berth-sim",
            "kubeProxyVersion": "v1.33.0-berth-sim",
            "containerRuntimeVersion": "berth-sim://0.1.0",
            "osImage": "berth-sim",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "kernelVersion": std::env::consts::OS,
            "machineID": "", "systemUUID": "", "bootID": ""
        },
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
    })
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

/// Registers the configured nodes.
pub fn register(sim: &Sim, nodes: &[NodeConfig]) {
    let Some(rt) = sim.resource_type("", "v1", "nodes") else {
        return;
    };
    let ctx = WriteContext::system("kubelet");
    for (index, node) in nodes.iter().enumerate() {
        let _ = sim.create(&rt, "", node.object(index), &ctx);
    }
}

fn is_ready(node: &Value) -> Option<&str> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()
}

/// Replaces an object's state through `change`, retrying on concurrent writes.
pub fn modify(
    sim: &Sim,
    storage: &str,
    namespace: &str,
    name: &str,
    change: impl Fn(&mut Value) -> bool,
) -> Option<Arc<Value>> {
    let storage: crate::resources::StorageKey = storage.into();
    for _ in 0..16 {
        let current = sim.store.get(&storage, namespace, name)?;
        let mut next = (*current).clone();
        if !change(&mut next) {
            return Some(current);
        }
        match sim.store.replace(
            &storage,
            next,
            resource_version(&current).unwrap_or_default(),
        ) {
            Ok(stored) => return Some(stored),
            Err(crate::store::WriteError::Stale) => continue,
            Err(_) => return None,
        }
    }
    None
}

fn set_ready(node: &mut Value, reachable: bool) -> bool {
    let now = now_rfc3339();
    let (status, reason, message) = if reachable {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "Unknown",
            "NodeStatusUnknown",
            "Kubelet stopped posting node status.",
        )
    };
    let mut changed = false;
    if let Some(conditions) = node["status"]["conditions"].as_array_mut() {
        for condition in conditions {
            let wanted = if condition["type"] == "Ready" {
                status
            } else if reachable {
                "False"
            } else {
                "Unknown"
            };
            if condition["status"] != wanted {
                condition["status"] = json!(wanted);
                condition["lastTransitionTime"] = json!(now);
                condition["reason"] = json!(if condition["type"] == "Ready" || !reachable {
                    reason
                } else {
                    "KubeletHasSufficientResources"
                });
                condition["message"] = json!(if condition["type"] == "Ready" || !reachable {
                    message
                } else {
                    "kubelet has sufficient resources"
                });
                changed = true;
            }
        }
    }
    let mut taints: Vec<Value> = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let key = "node.kubernetes.io/unreachable";
    let has = taints.iter().any(|t| t["key"] == key);
    if reachable && has {
        taints.retain(|t| t["key"] != key);
        changed = true;
    } else if !reachable && !has {
        // As the node lifecycle controller does: no new pods, and existing ones are evicted.
        taints.push(json!({"key": key, "effect": "NoSchedule", "timeAdded": now}));
        taints.push(json!({"key": key, "effect": "NoExecute", "timeAdded": now}));
        changed = true;
    }
    if changed {
        node["spec"]["taints"] = if taints.is_empty() {
            Value::Null
        } else {
            json!(taints)
        };
        if let Some(spec) = node["spec"].as_object_mut() {
            spec.retain(|_, v| !v.is_null());
        }
    }
    changed
}

/// Pods bound to `node`.
pub fn pods_on(sim: &Sim, node: &str) -> Vec<Arc<Value>> {
    let (pods, _) = sim.store.list("/pods", None);
    pods.into_iter()
        .filter(|p| p["spec"]["nodeName"] == node)
        .collect()
}

/// The node lifecycle controller, heartbeats and pod GC; runs until aborted.
pub async fn run(sim: Arc<Sim>) {
    let timings = sim.config.timings.clone();
    let mut last_heartbeat: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut lost_since: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut tick = tokio::time::interval(timings.heartbeat.min(Duration::from_millis(500)));
    let mut changes = sim.store.subscribe();
    let ctx = WriteContext::system("node-controller");
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            received = changes.recv() => {
                match received {
                    Ok(change) if &*change.storage == "/nodes" && change.kind == ChangeKind::Deleted => {
                        // Pod GC: pods bound to a node that no longer exists are force-deleted.
                        let name = change.object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                        if let Some(pods) = sim.resource_type("", "v1", "pods") {
                            for pod in pods_on(&sim, &name) {
                                let options = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
                                let (ns, pod_name) = (pod["metadata"]["namespace"].as_str().unwrap_or_default(), pod["metadata"]["name"].as_str().unwrap_or_default());
                                let _ = sim.delete(&pods, ns, pod_name, &options, &ctx);
                            }
                        }
                        last_heartbeat.remove(&name);
                        lost_since.remove(&name);
                        continue;
                    }
                    Ok(change) if &*change.storage == "/persistentvolumeclaims" && change.kind == ChangeKind::Added => {
                        bind_claim(&sim, &change.object);
                        continue;
                    }
                    Ok(change) if &*change.storage == "/persistentvolumeclaims" && change.kind == ChangeKind::Modified => {
                        expand_claim(&sim, &change.object);
                        continue;
                    }
                    Ok(change) if &*change.storage == "/configmaps" && change.object["metadata"]["namespace"] == crate::faults::CONFIG_MAP_NAMESPACE && change.object["metadata"]["name"] == crate::faults::CONFIG_MAP_NAME => {
                        let data = if change.kind == ChangeKind::Deleted { None } else { change.object["data"].as_object() };
                        for problem in sim.faults.apply_config_map(data) {
                            tracing::warn!(%problem, "berth-sim-faults");
                        }
                        // `compact: now`: forget the history now, so a list or watch from an
                        // older resourceVersion gets 410 Gone (what kubectl and other
                        // clients' tests cannot ask for through `compact()`).
                        if data.and_then(|d| d.get("compact")).and_then(serde_json::Value::as_str).is_some_and(|v| !v.trim().is_empty()) {
                            sim.store.compact();
                        }
                        continue;
                    }
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
        let now = tokio::time::Instant::now();
        let (nodes, _) = sim.store.list("/nodes", None);
        for node in nodes {
            let name = node["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let unreachable = sim.faults.is_unreachable(&name)
                || node["metadata"]["annotations"][UNREACHABLE_ANNOTATION] == "true";
            if !unreachable {
                let due = last_heartbeat
                    .get(&name)
                    .is_none_or(|t| now.duration_since(*t) >= timings.heartbeat);
                if due {
                    last_heartbeat.insert(name.clone(), now);
                    renew_lease(&sim, &name);
                }
                if is_ready(&node) != Some("True") {
                    modify(&sim, "/nodes", "", &name, |n| set_ready(n, true));
                }
                lost_since.remove(&name);
                continue;
            }
            let last = *last_heartbeat.entry(name.clone()).or_insert(now);
            if now.duration_since(last) < timings.node_monitor_grace {
                continue;
            }
            if is_ready(&node) != Some("Unknown") {
                modify(&sim, "/nodes", "", &name, |n| set_ready(n, false));
                sim.recorder.publish(
                    &sim,
                    &node,
                    None,
                    "Normal",
                    "NodeNotReady",
                    &format!("Node {name} status is now: NodeNotReady"),
                    Source {
                        component: "node-controller",
                        host: "",
                    },
                );
                for pod in pods_on(&sim, &name) {
                    mark_pod_lost(&sim, &pod, &name);
                }
            }
            let since = *lost_since.entry(name.clone()).or_insert(now);
            for pod in pods_on(&sim, &name) {
                if pod["metadata"]["deletionTimestamp"].is_string() {
                    continue;
                }
                let tolerated = pod["spec"]["tolerations"]
                    .as_array()
                    .and_then(|t| {
                        t.iter()
                            .find(|t| t["key"] == "node.kubernetes.io/unreachable")
                    })
                    .and_then(|t| t["tolerationSeconds"].as_u64())
                    .map(Duration::from_secs)
                    .unwrap_or(Duration::ZERO)
                    .min(timings.eviction_cap);
                if now.duration_since(since) >= tolerated {
                    mark_pod_lost(&sim, &pod, &name);
                    if let Some(pods) = sim.resource_type("", "v1", "pods") {
                        let (ns, pod_name) = (
                            pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                            pod["metadata"]["name"].as_str().unwrap_or_default(),
                        );
                        sim.recorder.publish(
                            &sim,
                            &pod,
                            None,
                            "Normal",
                            "TaintManagerEviction",
                            &format!("Marking for deletion Pod {ns}/{pod_name}"),
                            Source {
                                component: "taint-eviction-controller",
                                host: "",
                            },
                        );
                        let _ = sim.delete(&pods, ns, pod_name, &DeleteOptions::default(), &ctx);
                    }
                }
            }
        }
    }
}

fn mark_pod_lost(sim: &Sim, pod: &Value, node: &str) {
    let (ns, name) = (
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let now = now_rfc3339();
    let message = format!("Node {node} which was running pod {name} is unresponsive");
    modify(sim, "/pods", ns, name, |p| {
        if matches!(
            p["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed" | "Unknown")
        ) {
            return false;
        }
        p["status"]["phase"] = json!("Unknown");
        p["status"]["reason"] = json!("NodeLost");
        p["status"]["message"] = json!(message);
        if let Some(conditions) = p["status"]["conditions"].as_array_mut() {
            for c in conditions
                .iter_mut()
                .filter(|c| c["type"] == "Ready" || c["type"] == "ContainersReady")
            {
                c["status"] = json!("False");
                c["reason"] = json!("NodeNotReady");
                c["lastTransitionTime"] = json!(now);
            }
        }
        true
    });
}

fn renew_lease(sim: &Sim, node: &str) {
    let Some(leases) = sim.resource_type("coordination.k8s.io", "v1", "leases") else {
        return;
    };
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string();
    let renewed = modify(
        sim,
        "coordination.k8s.io/leases",
        "kube-node-lease",
        node,
        |lease| {
            lease["spec"]["renewTime"] = json!(now);
            true
        },
    );
    if renewed.is_none() {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}
        });
        let _ = sim.create(
            &leases,
            "kube-node-lease",
            lease,
            &WriteContext::system("kubelet"),
        );
    }
}

/// Volume expansion, as the external resizer and the kubelet do it: a bound claim whose
/// request grew past its capacity gets a `Resizing` condition at once, and the new capacity
/// (on the claim and its volume) a moment later.
fn expand_claim(sim: &Arc<Sim>, claim: &Value) {
    let storage = |v: &Value| v.as_str().and_then(crate::quantity::units);
    let requested = claim["spec"]["resources"]["requests"]["storage"].clone();
    let (Some(want), Some(have)) = (
        storage(&requested),
        storage(&claim["status"]["capacity"]["storage"]),
    ) else {
        return;
    };
    let resizing = claim["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Resizing"));
    if want <= have || resizing {
        return;
    }
    let (ns, name) = (
        claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        claim["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    );
    let volume = claim["spec"]["volumeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    modify(sim, "/persistentvolumeclaims", &ns, &name, |c| {
        c["status"]["conditions"] = json!([{
            "type": "Resizing", "status": "True",
            "lastTransitionTime": crate::sim::now_rfc3339(),
            "message": format!("External resizer is resizing volume {volume}")
        }]);
        true
    });
    let sim = sim.clone();
    // As long as a container takes to start: the resize is visible, and quick on fast timings.
    let delay = sim
        .config
        .timings
        .container_start
        .max(Duration::from_millis(100));
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        modify(&sim, "/persistentvolumes", "", &volume, |pv| {
            pv["spec"]["capacity"]["storage"] = requested.clone();
            true
        });
        modify(&sim, "/persistentvolumeclaims", &ns, &name, |c| {
            c["status"]["capacity"]["storage"] = requested.clone();
            if let Some(status) = c["status"].as_object_mut() {
                status.remove("conditions");
            }
            true
        });
    });
}

/// Dynamic provisioning: a new claim gets a volume and is Bound.
fn bind_claim(sim: &Sim, claim: &Value) {
    let (ns, name) = (
        claim["metadata"]["namespace"].as_str().unwrap_or_default(),
        claim["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
    let volume = format!("pvc-{uid}");
    let size = claim["spec"]["resources"]["requests"]["storage"].clone();
    let modes = claim["spec"]["accessModes"].clone();
    if let Some(pvs) = sim.resource_type("", "v1", "persistentvolumes") {
        let pv = json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": size}, "accessModes": modes,
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": claim["spec"]["storageClassName"].as_str().unwrap_or("standard"),
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid, "apiVersion": "v1"},
                "hostPath": {"path": format!("/var/lib/berth-sim/{volume}")}
            }
        });
        let _ = sim.create(
            &pvs,
            "",
            pv,
            &WriteContext::system("persistentvolume-binder-controller"),
        );
    }
    modify(sim, "/persistentvolumeclaims", ns, name, |c| {
        c["spec"]["volumeName"] = json!(volume);
        if c["spec"]["storageClassName"].is_null() {
            c["spec"]["storageClassName"] = json!("standard");
        }
        c["status"] =
            json!({"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}});
        true
    });
}
