//! Nodes: their objects, heartbeats (Leases), the node lifecycle controller (an unreachable
//! node goes `Ready=Unknown`, its pods `Unknown`, then are evicted), and pod garbage
//! collection for deleted nodes.

use std::{collections::HashMap, sync::Arc, time::Duration};

use serde_json::{Value, json};

use crate::{
    config::NodeConfig,
    faults::UNREACHABLE_ANNOTATION,
    meta::now_rfc3339,
    recorder::Source,
    sim::{DeleteOptions, Sim, WriteContext},
    store::ChangeKind,
};

impl NodeConfig {
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

/// The node lifecycle controller, heartbeats and pod GC; runs until aborted.
pub async fn run(sim: Arc<Sim>) {
    let timings = sim.config.timings.clone();
    let mut last_heartbeat: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut lost_since: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut tick = tokio::time::interval(timings.heartbeat.min(Duration::from_millis(500)));
    let mut changes = sim.store.subscribe_to("/nodes");
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
                            for pod in sim.store.pods_on(&name) {
                                let options = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
                                let (ns, pod_name) = (pod["metadata"]["namespace"].as_str().unwrap_or_default(), pod["metadata"]["name"].as_str().unwrap_or_default());
                                let _ = sim.delete(&pods, ns, pod_name, &options, &ctx);
                            }
                        }
                        last_heartbeat.remove(&name);
                        lost_since.remove(&name);
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
                    sim.store
                        .modify("/nodes", "", &name, |n| set_ready(n, true));
                }
                lost_since.remove(&name);
                continue;
            }
            let last = *last_heartbeat.entry(name.clone()).or_insert(now);
            if now.duration_since(last) < timings.node_monitor_grace {
                continue;
            }
            if is_ready(&node) != Some("Unknown") {
                sim.store
                    .modify("/nodes", "", &name, |n| set_ready(n, false));
                sim.record(
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
                for pod in sim.store.pods_on(&name) {
                    mark_pod_lost(&sim, &pod, &name);
                }
            }
            let since = *lost_since.entry(name.clone()).or_insert(now);
            for pod in sim.store.pods_on(&name) {
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
                        sim.record(
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
    sim.store.modify("/pods", ns, name, |p| {
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
    let renewed = sim.store.modify(
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
