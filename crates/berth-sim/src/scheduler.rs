//! The scheduler: binds pending pods to nodes that fit (nodeSelector, required node affinity,
//! taints and tolerations, cpu/memory/pod count against what bound pods request), or marks
//! them `PodScheduled=False/Unschedulable` with a Warning `FailedScheduling` worded like the
//! real one. Event-driven: it runs when pods or nodes change.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{meta::now_rfc3339, quantity, recorder::Source, sim::Sim};

/// What a pod asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    pub cpu_millis: i64,
    pub memory: i64,
}

fn container_requests(c: &Value) -> Requests {
    let requests = &c["resources"]["requests"];
    let limits = &c["resources"]["limits"];
    let pick = |key: &str| requests[key].as_str().or_else(|| limits[key].as_str());
    Requests {
        cpu_millis: pick("cpu").and_then(quantity::cpu_millis).unwrap_or(0),
        memory: pick("memory").and_then(quantity::units).unwrap_or(0),
    }
}

/// A pod's effective requests: the sum of its containers, or its largest init container.
pub fn requests(pod: &Value) -> Requests {
    let mut total = Requests::default();
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        let r = container_requests(c);
        total.cpu_millis += r.cpu_millis;
        total.memory += r.memory;
    }
    for c in pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let r = container_requests(c);
        total.cpu_millis = total.cpu_millis.max(r.cpu_millis);
        total.memory = total.memory.max(r.memory);
    }
    total
}

/// What a node can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: i64,
    pub memory: i64,
    pub pods: i64,
}

pub fn allocatable(node: &Value) -> Allocatable {
    let a = &node["status"]["allocatable"];
    Allocatable {
        cpu_millis: a["cpu"]
            .as_str()
            .and_then(quantity::cpu_millis)
            .unwrap_or(0),
        memory: a["memory"].as_str().and_then(quantity::units).unwrap_or(0),
        pods: a["pods"]
            .as_str()
            .and_then(|p| p.parse().ok())
            .unwrap_or(110),
    }
}

/// Whether a pod holds resources on its node.
pub fn is_active(pod: &Value) -> bool {
    !matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn labels(node: &Value) -> BTreeMap<String, String> {
    crate::meta::labels_of(node)
}

fn expression_matches(expr: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = expr["values"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match expr["operator"].as_str().unwrap_or_default() {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => value
            .and_then(|v| v.parse::<i64>().ok())
            .zip(values.first().and_then(|v| v.parse::<i64>().ok()))
            .is_some_and(|(a, b)| a > b),
        "Lt" => value
            .and_then(|v| v.parse::<i64>().ok())
            .zip(values.first().and_then(|v| v.parse::<i64>().ok()))
            .is_some_and(|(a, b)| a < b),
        _ => false,
    }
}

/// nodeSelector and required node affinity.
pub fn selector_matches(pod: &Value, node: &Value) -> bool {
    let node_labels = labels(node);
    let selector_ok = pod["spec"]["nodeSelector"].as_object().is_none_or(|s| {
        s.iter()
            .all(|(k, v)| node_labels.get(k).map(String::as_str) == v.as_str())
    });
    if !selector_ok {
        return false;
    }
    let terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].as_array();
    let Some(terms) = terms.filter(|t| !t.is_empty()) else {
        return true;
    };
    let node_name = node["metadata"]["name"].as_str();
    terms.iter().any(|term| {
        let expressions_ok = term["matchExpressions"].as_array().is_none_or(|exprs| {
            exprs.iter().all(|e| {
                expression_matches(
                    e,
                    e["key"]
                        .as_str()
                        .and_then(|k| node_labels.get(k))
                        .map(String::as_str),
                )
            })
        });
        let fields_ok = term["matchFields"].as_array().is_none_or(|exprs| {
            exprs
                .iter()
                .all(|e| e["key"] == "metadata.name" && expression_matches(e, node_name))
        });
        let empty = term["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty)
            && term["matchFields"].as_array().is_none_or(Vec::is_empty);
        !empty && expressions_ok && fields_ok
    })
}

fn tolerates(pod: &Value, taint: &Value) -> bool {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| {
            let key_ok = match t["key"].as_str() {
                None | Some("") => t["operator"] == "Exists",
                Some(k) => Some(k) == taint["key"].as_str(),
            };
            let value_ok = t["operator"] == "Exists"
                || t["value"].as_str().unwrap_or("") == taint["value"].as_str().unwrap_or("");
            let effect_ok = t["effect"]
                .as_str()
                .is_none_or(|e| e.is_empty() || Some(e) == taint["effect"].as_str());
            key_ok && value_ok && effect_ok
        })
}

/// The first taint (NoSchedule/NoExecute) the pod does not tolerate.
fn untolerated_taint(pod: &Value, node: &Value) -> Option<String> {
    node["spec"]["taints"].as_array()?.iter().find_map(|taint| {
        let blocking = matches!(taint["effect"].as_str(), Some("NoSchedule" | "NoExecute"));
        (blocking && !tolerates(pod, taint)).then(|| {
            format!(
                "{{{}: {}}}",
                taint["key"].as_str().unwrap_or_default(),
                taint["value"].as_str().unwrap_or_default()
            )
        })
    })
}

/// Why `pod` (asking for `wanted`) does not fit on `node` (with `room`), in the scheduler's
/// words; empty when it fits.
fn misfits_of(
    pod: &Value,
    wanted: Requests,
    node: &Value,
    room: Allocatable,
    used: Requests,
    pod_count: i64,
) -> Vec<String> {
    if node["spec"]["unschedulable"] == true {
        return vec!["node(s) were unschedulable".to_owned()];
    }
    if let Some(taint) = untolerated_taint(pod, node) {
        return vec![format!("node(s) had untolerated taint {taint}")];
    }
    if !selector_matches(pod, node) {
        return vec!["node(s) didn't match Pod's node affinity/selector".to_owned()];
    }
    let mut reasons = vec![];
    if pod_count + 1 > room.pods {
        reasons.push("Too many pods".to_owned());
    }
    if wanted.cpu_millis > 0 && used.cpu_millis + wanted.cpu_millis > room.cpu_millis {
        reasons.push("Insufficient cpu".to_owned());
    }
    if wanted.memory > 0 && used.memory + wanted.memory > room.memory {
        reasons.push("Insufficient memory".to_owned());
    }
    reasons
}

/// `0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector.`
pub fn unschedulable_message(total: usize, reasons: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = reasons
        .iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    if total == 0 {
        "no nodes available to schedule pods".to_owned()
    } else if parts.is_empty() {
        format!("0/{total} nodes are available.")
    } else {
        format!("0/{total} nodes are available: {}.", parts.join(", "))
    }
}

fn key(pod: &Value) -> (String, String) {
    (
        pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn wants_scheduling(pod: &Value) -> bool {
    pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
        && pod["metadata"]["deletionTimestamp"].is_null()
        && pod["spec"]["schedulerName"]
            .as_str()
            .is_none_or(|s| s == "default-scheduler")
}

/// What the bound pods hold on each node, kept from the changes of pods as the real
/// scheduler's cache keeps it (a pass that read every pod again, at every change of any pod,
/// was a sixth of the sim's CPU while thousands of pods started).
#[derive(Default)]
struct Usage {
    /// Each active bound pod, by uid: its node and requests.
    pods: HashMap<String, (String, Requests)>,
    /// Each node's sum of those, and how many pods.
    nodes: HashMap<String, (Requests, i64)>,
}

impl Usage {
    /// Counted from `pods`.
    fn of(pods: &[Arc<Value>]) -> Usage {
        let mut usage = Usage::default();
        for pod in pods {
            usage.update(pod);
        }
        usage
    }

    /// Takes `pod` as it is now; returns whether room was freed on a node (a pod gone,
    /// finished, moved or asking for less), so pending pods may fit where they did not.
    fn update(&mut self, pod: &Value) -> bool {
        let holds = pod["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty() && is_active(pod))
            .map(|node| (node.to_owned(), requests(pod)));
        self.set(pod, holds)
    }

    /// Forgets a deleted pod; returns whether it held room.
    fn remove(&mut self, pod: &Value) -> bool {
        self.set(pod, None)
    }

    /// Records that `pod` holds `holds` (its node and requests), or nothing.
    fn set(&mut self, pod: &Value, holds: Option<(String, Requests)>) -> bool {
        let Some(uid) = pod["metadata"]["uid"].as_str() else {
            return false;
        };
        let before = match &holds {
            Some(now) => self.pods.insert(uid.to_owned(), now.clone()),
            None => self.pods.remove(uid),
        };
        if before == holds {
            return false;
        }
        if let Some((node, r)) = &before {
            let entry = self.nodes.entry(node.clone()).or_default();
            entry.0.cpu_millis -= r.cpu_millis;
            entry.0.memory -= r.memory;
            entry.1 -= 1;
            if entry.1 == 0 {
                self.nodes.remove(node);
            }
        }
        if let Some((node, r)) = &holds {
            let entry = self.nodes.entry(node.clone()).or_default();
            entry.0.cpu_millis += r.cpu_millis;
            entry.0.memory += r.memory;
            entry.1 += 1;
        }
        match (&before, &holds) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some((was, r)), Some((node, now))) => {
                was != node || now.cpu_millis < r.cpu_millis || now.memory < r.memory
            }
        }
    }
}

/// One scheduling pass over `pending`; returns the pods still pending.
fn schedule(
    sim: &Sim,
    pending: &BTreeSet<(String, String)>,
    attempted: &mut HashMap<String, String>,
    usage: &Usage,
    retry_all: bool,
) -> BTreeSet<(String, String)> {
    let (nodes, _) = sim.store.list("/nodes", None);
    // This pass's binds are added to its own copy; the cache takes them from their changes.
    let mut used = usage.nodes.clone();
    let mut candidates: Vec<Arc<Value>> = pending
        .iter()
        .filter_map(|(ns, name)| sim.store.get("/pods", ns, name))
        .filter(|p| wants_scheduling(p))
        .collect();
    candidates.sort_by(|a, b| {
        (a["metadata"]["creationTimestamp"].as_str(), key(a))
            .cmp(&(b["metadata"]["creationTimestamp"].as_str(), key(b)))
    });
    let mut still = BTreeSet::new();
    // Each node's room, read once per pass.
    let rooms: Vec<(&Value, String, Allocatable)> = nodes
        .iter()
        .map(|node| {
            let name = node["metadata"]["name"].as_str().unwrap_or_default();
            (&**node, name.to_owned(), allocatable(node))
        })
        .collect();
    for pod in candidates {
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut best: Option<(f64, String)> = None;
        let wanted = requests(&pod);
        for (node, name, room) in &rooms {
            let (node_used, count) = used.get(name).copied().unwrap_or_default();
            let problems = misfits_of(&pod, wanted, node, *room, node_used, count);
            if problems.is_empty() {
                let name = name.clone();
                let load = (node_used.cpu_millis + wanted.cpu_millis) as f64
                    / room.cpu_millis.max(1) as f64
                    + (node_used.memory + wanted.memory) as f64 / room.memory.max(1) as f64
                    + count as f64 / room.pods.max(1) as f64;
                if best
                    .as_ref()
                    .is_none_or(|(l, n)| load < *l || (load == *l && name < *n))
                {
                    best = Some((load, name));
                }
            } else {
                for p in problems {
                    *reasons.entry(p).or_default() += 1;
                }
            }
        }
        let (ns, name) = key(&pod);
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match best {
            Some((_, node)) => {
                if sim.bind(&ns, &name, &node).is_ok() {
                    attempted.remove(&uid);
                    let r = requests(&pod);
                    let entry = used.entry(node.clone()).or_default();
                    entry.0.cpu_millis += r.cpu_millis;
                    entry.0.memory += r.memory;
                    entry.1 += 1;
                    sim.record(
                        &pod,
                        None,
                        "Normal",
                        "Scheduled",
                        &format!("Successfully assigned {ns}/{name} to {node}"),
                        Source {
                            component: "default-scheduler",
                            host: "",
                        },
                    );
                } else {
                    still.insert((ns, name));
                }
            }
            None => {
                let message = unschedulable_message(nodes.len(), &reasons);
                let repeat = attempted.get(&uid) == Some(&message);
                if !repeat || retry_all {
                    sim.store.modify("/pods", &ns, &name, |p| {
                        if p["metadata"]["uid"] != uid.as_str() {
                            return false;
                        }
                        let mut conditions = p["status"]["conditions"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default();
                        let existing = conditions.iter().position(|c| c["type"] == "PodScheduled");
                        let unchanged = existing.is_some_and(|i| {
                            conditions[i]["status"] == "False"
                                && conditions[i]["message"] == message.as_str()
                        });
                        if unchanged {
                            return false;
                        }
                        if let Some(i) = existing {
                            conditions.remove(i);
                        }
                        conditions.push(json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message, "lastProbeTime": null, "lastTransitionTime": now_rfc3339()}));
                        p["status"]["conditions"] = json!(conditions);
                        true
                    });
                    sim.record(
                        &pod,
                        None,
                        "Warning",
                        "FailedScheduling",
                        &message,
                        Source {
                            component: "default-scheduler",
                            host: "",
                        },
                    );
                    attempted.insert(uid, message);
                }
                still.insert((ns, name));
            }
        }
    }
    still
}

/// Runs the scheduler until aborted.
pub async fn run(sim: Arc<Sim>) {
    let mut changes = sim.store.subscribe_to_any(&["/pods", "/nodes"]);
    let mut pending: BTreeSet<(String, String)> = BTreeSet::new();
    let mut attempted: HashMap<String, String> = HashMap::new();
    let (pods, _) = sim.store.list("/pods", None);
    let mut usage = Usage::of(&pods);
    pending.extend(pods.iter().filter(|p| wants_scheduling(p)).map(|p| key(p)));
    let mut dirty = !pending.is_empty();
    let mut nodes_changed = false;
    loop {
        if dirty && !pending.is_empty() {
            pending = schedule(&sim, &pending, &mut attempted, &usage, nodes_changed);
            nodes_changed = false;
        }
        dirty = false;
        let first = tokio::time::timeout(Duration::from_secs(30), changes.recv()).await;
        let mut handle = |received: Result<Arc<crate::store::Change>, RecvError>| -> bool {
            match received {
                Ok(change) => {
                    match &*change.storage {
                        "/pods" => {
                            let deleted = change.kind == crate::store::ChangeKind::Deleted;
                            if !deleted && wants_scheduling(&change.object) {
                                pending.insert(key(&change.object));
                                dirty = true;
                            } else {
                                pending.remove(&key(&change.object));
                            }
                            // A pod that went away, finished or moved frees room; a status
                            // change of a running pod does not need a pass.
                            let freed = if deleted {
                                usage.remove(&change.object)
                            } else {
                                usage.update(&change.object)
                            };
                            dirty |= freed;
                        }
                        "/nodes" => {
                            let before = change.previous.as_ref().map(|p| {
                                (
                                    p["metadata"]["labels"].clone(),
                                    p["spec"].clone(),
                                    p["status"]["allocatable"].clone(),
                                )
                            });
                            let after = (
                                change.object["metadata"]["labels"].clone(),
                                change.object["spec"].clone(),
                                change.object["status"]["allocatable"].clone(),
                            );
                            if before.as_ref() != Some(&after)
                                || change.kind != crate::store::ChangeKind::Modified
                            {
                                dirty = true;
                                nodes_changed = true;
                            }
                        }
                        _ => {}
                    }
                    true
                }
                Err(RecvError::Lagged(_)) => {
                    let (pods, _) = sim.store.list("/pods", None);
                    usage = Usage::of(&pods);
                    pending.extend(pods.iter().filter(|p| wants_scheduling(p)).map(|p| key(p)));
                    dirty = true;
                    nodes_changed = true;
                    true
                }
                Err(RecvError::Closed) => false,
            }
        };
        match first {
            Ok(received) => {
                if !handle(received) {
                    return;
                }
            }
            Err(_) => {
                // The periodic retry of unschedulable pods, as the real scheduler does.
                dirty = true;
                nodes_changed = true;
                continue;
            }
        }
        while let Ok(received) = changes.try_recv().map_err(|e| match e {
            tokio::sync::broadcast::error::TryRecvError::Lagged(n) => RecvError::Lagged(n),
            _ => RecvError::Closed,
        }) {
            if !handle(Ok(received)) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn misfits(pod: &Value, node: &Value, used: Requests, pod_count: i64) -> Vec<String> {
        misfits_of(pod, requests(pod), node, allocatable(node), used, pod_count)
    }

    /// What bound pods hold follows their changes: binding adds to a node, a resize or a
    /// move is counted once, and a pod finished, deleted or moved away frees room (which
    /// alone makes the scheduler try pending pods again).
    #[test]
    fn usage_follows_the_changes_of_pods() {
        let pod = |node: &str, cpu: &str, phase: &str| json!({"metadata": {"uid": "u1"}, "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu}}}]}, "status": {"phase": phase}});
        let held = |usage: &Usage, node: &str| {
            usage
                .nodes
                .get(node)
                .map(|(r, count)| (r.cpu_millis, *count))
        };
        let mut usage = Usage::default();
        assert!(
            !usage.update(&pod("", "500m", "Pending")),
            "pending: holds nothing"
        );
        assert_eq!(held(&usage, "a"), None);
        assert!(
            !usage.update(&pod("a", "500m", "Pending")),
            "bound: takes room"
        );
        assert!(
            !usage.update(&pod("a", "500m", "Running")),
            "a status change"
        );
        assert_eq!(held(&usage, "a"), Some((500, 1)));
        assert!(!usage.update(&pod("a", "2", "Running")), "resized up");
        assert_eq!(held(&usage, "a"), Some((2000, 1)));
        assert!(
            usage.update(&pod("a", "1", "Running")),
            "resized down frees room"
        );
        assert!(usage.update(&pod("b", "1", "Running")), "moved");
        assert_eq!(
            (held(&usage, "a"), held(&usage, "b")),
            (None, Some((1000, 1)))
        );
        assert!(usage.update(&pod("b", "1", "Succeeded")), "finished");
        assert_eq!(held(&usage, "b"), None);
        assert!(!usage.remove(&pod("b", "1", "Succeeded")), "held nothing");
        usage.update(&pod("b", "1", "Running"));
        assert!(usage.remove(&pod("b", "1", "Running")), "deleted");
        assert!(usage.pods.is_empty() && usage.nodes.is_empty());
    }

    fn node(labels: Value, taints: Value, cpu: &str) -> Value {
        json!({"metadata": {"name": "n", "labels": labels}, "spec": {"taints": taints}, "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}})
    }

    #[test]
    fn fitting_rules() {
        let plain = json!({"spec": {"containers": [{"resources": {"requests": {"cpu": "500m"}}}]}});
        let n = node(json!({"zone": "a"}), json!([]), "1");
        assert!(misfits(&plain, &n, Requests::default(), 0).is_empty());
        assert_eq!(
            misfits(
                &plain,
                &n,
                Requests {
                    cpu_millis: 600,
                    memory: 0
                },
                0
            ),
            ["Insufficient cpu"]
        );

        let selecting = json!({"spec": {"nodeSelector": {"zone": "b"}, "containers": []}});
        assert_eq!(
            misfits(&selecting, &n, Requests::default(), 0),
            ["node(s) didn't match Pod's node affinity/selector"]
        );

        let affinity = json!({"spec": {"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
        ]}}}}});
        assert!(
            misfits(&affinity, &n, Requests::default(), 0).is_empty(),
            "terms are ORed"
        );

        let tainted = node(
            json!({}),
            json!([{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
            "4",
        );
        assert_eq!(
            misfits(&plain, &tainted, Requests::default(), 0),
            ["node(s) had untolerated taint {gpu: yes}"]
        );
        let tolerant = json!({"spec": {"containers": [], "tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]}});
        assert!(misfits(&tolerant, &tainted, Requests::default(), 0).is_empty());
        let everything =
            json!({"spec": {"containers": [], "tolerations": [{"operator": "Exists"}]}});
        assert!(misfits(&everything, &tainted, Requests::default(), 0).is_empty());
    }

    #[test]
    fn message_reads_like_the_scheduler() {
        let reasons: BTreeMap<String, usize> = [("Insufficient cpu".to_owned(), 3)].into();
        assert_eq!(
            unschedulable_message(3, &reasons),
            "0/3 nodes are available: 3 Insufficient cpu."
        );
        let mixed: BTreeMap<String, usize> = [
            ("Insufficient cpu".to_owned(), 1),
            (
                "node(s) didn't match Pod's node affinity/selector".to_owned(),
                2,
            ),
        ]
        .into();
        assert_eq!(
            unschedulable_message(3, &mixed),
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector."
        );
        assert_eq!(
            unschedulable_message(0, &BTreeMap::new()),
            "no nodes available to schedule pods"
        );
    }

    #[test]
    fn requests_sum_containers_and_take_the_largest_init() {
        let pod = json!({"spec": {
            "containers": [{"resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}}, {"resources": {"limits": {"cpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]
        }});
        assert_eq!(
            requests(&pod),
            Requests {
                cpu_millis: 2000,
                memory: 1 << 30
            }
        );
    }
}
