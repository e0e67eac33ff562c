//! The ResourceQuota admission plugin for pods: a pod is refused when it would take a
//! namespace's usage of `pods` (`count/pods`), cpu or memory requests or limits past a quota's
//! `spec.hard`, with the real API server's words.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{error::ApiError, quantity, store::Store};

/// Resources a quota may limit that this plugin counts for pods.
const COUNTED: &[&str] = &[
    "pods",
    "count/pods",
    "requests.cpu",
    "cpu",
    "requests.memory",
    "memory",
    "limits.cpu",
    "limits.memory",
];

/// The usage one pod adds, per counted resource, in thousandths (as [`quantity::parse_milli`]).
/// Containers add up; init containers run one at a time, so the largest counts when it is
/// larger than the sum (the pod's effective request). `None` per resource when a container
/// does not say it (a quota on that resource then refuses the pod).
fn pod_usage(pod: &Value) -> BTreeMap<&'static str, Option<i128>> {
    let spec = &pod["spec"];
    let amount = |container: &Value, kind: &str, resource: &str| -> Option<i128> {
        let value = &container["resources"][kind][resource];
        match value {
            Value::String(s) => quantity::parse_milli(s),
            Value::Number(n) => n.as_f64().map(|f| (f * 1000.0) as i128),
            _ => None,
        }
    };
    // A limit without a request defaults the request to the limit.
    let said = |container: &Value, kind: &str, resource: &str| {
        amount(container, kind, resource)
            .or_else(|| (kind == "requests").then(|| amount(container, "limits", resource))?)
    };
    let effective = |kind: &str, resource: &str| -> Option<i128> {
        let containers = spec["containers"].as_array().cloned().unwrap_or_default();
        let mut sum = 0;
        for c in &containers {
            sum += said(c, kind, resource)?;
        }
        let init_max = spec["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| said(c, kind, resource))
            .max()
            .unwrap_or(0);
        Some(sum.max(init_max))
    };
    let mut usage = BTreeMap::new();
    usage.insert("pods", Some(1000));
    usage.insert("count/pods", Some(1000));
    for (name, kind, resource) in [
        ("requests.cpu", "requests", "cpu"),
        ("cpu", "requests", "cpu"),
        ("requests.memory", "requests", "memory"),
        ("memory", "requests", "memory"),
        ("limits.cpu", "limits", "cpu"),
        ("limits.memory", "limits", "memory"),
    ] {
        usage.insert(name, effective(kind, resource));
    }
    usage
}

/// Pods that count against quota: those not in a terminal phase.
fn counts(pod: &Value) -> bool {
    !matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// `500m`, `2`, `1Gi`, `1500Mi`, `3`: a sum in thousandths printed as Kubernetes would.
fn show(resource: &str, milli: i128) -> String {
    if resource.ends_with("cpu") {
        return if milli % 1000 == 0 {
            (milli / 1000).to_string()
        } else {
            format!("{milli}m")
        };
    }
    let units = milli / 1000;
    if !resource.ends_with("memory") || units == 0 {
        return units.to_string();
    }
    for (suffix, size) in [("Gi", 1i128 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if units % size == 0 {
            return format!("{}{suffix}", units / size);
        }
    }
    units.to_string()
}

/// Refuses creating `pod` named `name` in `namespace` when a quota there would be exceeded.
pub fn admit_pod(store: &Store, namespace: &str, name: &str, pod: &Value) -> Result<(), ApiError> {
    let (quotas, _) = store.list("/resourcequotas", Some(namespace));
    if quotas.is_empty() || !counts(pod) {
        return Ok(());
    }
    let wanted = pod_usage(pod);
    let (pods, _) = store.list("/pods", Some(namespace));
    let mut used: BTreeMap<&str, i128> = BTreeMap::new();
    for existing in pods.iter().filter(|p| counts(p)) {
        for (resource, amount) in pod_usage(existing) {
            *used.entry(resource).or_default() += amount.unwrap_or(0);
        }
    }
    let forbidden = |message: String| ApiError::Forbidden {
        message: format!("pods \"{name}\" is forbidden: {message}"),
        kind: "pods".to_owned(),
        name: Some(name.to_owned()),
        group: String::new(),
    };
    let mut sorted: Vec<&std::sync::Arc<Value>> = quotas.iter().collect();
    sorted.sort_by_key(|q| {
        q["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    });
    for quota in sorted {
        let quota_name = quota["metadata"]["name"].as_str().unwrap_or_default();
        let Some(hard) = quota["spec"]["hard"].as_object() else {
            continue;
        };
        let mut limited: Vec<(&str, i128)> = COUNTED
            .iter()
            .filter_map(|r| {
                let value = hard.get(*r)?;
                let milli = match value {
                    Value::String(s) => quantity::parse_milli(s)?,
                    Value::Number(n) => (n.as_f64()? * 1000.0) as i128,
                    _ => return None,
                };
                Some((*r, milli))
            })
            .collect();
        // The real API server prints resources sorted by name.
        limited.sort();
        let unspecified: Vec<&str> = limited
            .iter()
            .filter(|(r, _)| wanted.get(r).copied().flatten().is_none())
            .map(|(r, _)| *r)
            .collect();
        if !unspecified.is_empty() {
            let containers: Vec<&str> = pod["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            return Err(forbidden(format!(
                "failed quota: {quota_name}: must specify {}",
                unspecified
                    .iter()
                    .map(|r| format!("{r} for: {}", containers.join(",")))
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
        let exceeded: Vec<(&str, i128, i128, i128)> = limited
            .iter()
            .filter_map(|(r, limit)| {
                let request = wanted.get(r).copied().flatten()?;
                let now = used.get(r).copied().unwrap_or(0);
                (now + request > *limit).then_some((*r, request, now, *limit))
            })
            .collect();
        if !exceeded.is_empty() {
            let part = |pick: fn(&(&str, i128, i128, i128)) -> i128| {
                exceeded
                    .iter()
                    .map(|e| format!("{}={}", e.0, show(e.0, pick(e))))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Err(forbidden(format!(
                "exceeded quota: {quota_name}, requested: {}, used: {}, limited: {}",
                part(|e| e.1),
                part(|e| e.2),
                part(|e| e.3)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_print_as_kubernetes_prints_them() {
        assert_eq!(show("pods", 2000), "2");
        assert_eq!(show("requests.cpu", 500), "500m");
        assert_eq!(show("requests.cpu", 2000), "2");
        assert_eq!(show("requests.memory", 1000 * (1 << 30)), "1Gi");
        assert_eq!(show("limits.memory", 1000 * 1536 * (1 << 20)), "1536Mi");
        assert_eq!(show("memory", 1000 * 1000), "1000");
    }

    #[test]
    fn a_pod_counts_its_containers_and_its_largest_init_container() {
        let pod = serde_json::json!({"spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
            ]
        }});
        let usage = pod_usage(&pod);
        assert_eq!(usage["requests.cpu"], Some(2000));
        assert_eq!(usage["requests.memory"], Some(2000 * (1 << 30)));
        assert_eq!(usage["limits.cpu"], None, "container a has no cpu limit");
        assert_eq!(usage["pods"], Some(1000));
    }
}
