//! The `proxy` subresource of nodes: `/api/v1/nodes/NAME[:PORT]/proxy/PATH` reaches the node's
//! kubelet, whose read-only endpoints the sim answers from the store: `/healthz`, `/pods`,
//! `/configz`, `/metrics` and `/stats/summary` (what each running container's processes use,
//! measured by the runtime); any other path is the kubelet's `404 page not found`.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::Request,
    http::{StatusCode, header},
    response::Response,
};
use serde_json::{Value, json};

use crate::{
    auth::{self, Attributes, Identity},
    error::{ApiError, ApiResult},
    sim::Sim,
};

/// What a node proxy request names: the node and the kubelet's path, with its leading slash.
pub struct Target<'a> {
    pub node: &'a str,
    pub rest: String,
}

/// A path naming the proxy subresource of a node (`[scheme:]name[:port]` as for pods; the
/// port is the kubelet's, whichever is named).
pub fn target(path: &str) -> Option<Target<'_>> {
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let mut parts = rest.splitn(3, '/');
    let named = parts.next()?;
    if parts.next()? != "proxy" {
        return None;
    }
    let node = named
        .split(':')
        .find(|p| !matches!(*p, "http" | "https") && !p.is_empty())?;
    Some(Target {
        node,
        rest: format!("/{}", parts.next().unwrap_or_default()),
    })
}

fn answer(status: StatusCode, kind: &'static str, body: String) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, kind)
        .body(Body::from(body))
        .expect("a response of static headers")
}

/// Answers one request to a node's kubelet, after RBAC allows `<verb>` on `nodes/proxy`.
pub async fn serve(
    sim: Arc<Sim>,
    identity: Identity,
    target: Target<'_>,
    request: Request,
) -> ApiResult<Response> {
    let attrs = Attributes {
        verb: crate::proxy::verb(request.method()).to_owned(),
        resource: "nodes".into(),
        subresource: "proxy".into(),
        name: target.node.to_owned(),
        ..Default::default()
    };
    auth::require(&sim.store, &identity, &attrs)?;
    let node = sim
        .store
        .get("/nodes", "", target.node)
        .ok_or_else(|| ApiError::not_found("nodes", "", target.node))?;
    let (pods, _) = sim.store.list("/pods", None);
    let on_node: Vec<&Value> = pods
        .iter()
        .filter(|p| p["spec"]["nodeName"] == target.node)
        .map(|p| &**p)
        .collect();
    let json_type = "application/json";
    Ok(match target.rest.trim_end_matches('/') {
        "/healthz" => answer(StatusCode::OK, "text/plain; charset=utf-8", "ok".into()),
        "/pods" => answer(
            StatusCode::OK,
            json_type,
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": on_node})
                .to_string(),
        ),
        "/configz" => answer(
            StatusCode::OK,
            json_type,
            json!({"kubeletconfig": {
                "kind": "KubeletConfiguration",
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "port": 10250,
                "healthzPort": 10248,
                "maxPods": node["status"]["capacity"]["pods"]
                    .as_str()
                    .and_then(|p| p.parse::<u64>().ok())
                    .unwrap_or(110),
                "nodeStatusUpdateFrequency": "10s",
                "cgroupDriver": "systemd"
            }})
            .to_string(),
        ),
        "/stats/summary" => answer(
            StatusCode::OK,
            json_type,
            summary(&sim, &node, &on_node).to_string(),
        ),
        "/metrics" => answer(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics(&on_node),
        ),
        _ => answer(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n".into(),
        ),
    })
}

/// The kubelet's Summary API (`stats/v1alpha1`): the node and each running pod, with what
/// its containers' processes use now (memory as working set and RSS, CPU time), as the
/// runtime measures them. Containers the runtime runs nothing for report no usage, as a
/// kubelet reports none it could not read.
fn summary(sim: &Sim, node: &Value, pods: &[&Value]) -> Value {
    let now = crate::meta::now_rfc3339();
    let runtime = &sim.config.runtime;
    let mut node_memory = 0u64;
    let mut node_cpu = 0u64;
    let stats = |usage: crate::runtime::Usage| {
        (
            json!({"time": now, "usageCoreNanoSeconds": usage.cpu_nanoseconds}),
            json!({"time": now, "usageBytes": usage.memory_bytes, "workingSetBytes": usage.memory_bytes, "rssBytes": usage.memory_bytes, "pageFaults": 0, "majorPageFaults": 0}),
        )
    };
    let mut pod_stats = vec![];
    for pod in pods.iter().filter(|p| p["status"]["phase"] == "Running") {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let mut total = crate::runtime::Usage::default();
        let mut containers = vec![];
        for status in pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(started) = status["state"]["running"]["startedAt"].as_str() else {
                continue;
            };
            let name = status["name"].as_str().unwrap_or_default();
            let mut entry = json!({"name": name, "startTime": started});
            if let Some(usage) = runtime.usage(uid, name) {
                let (cpu, memory) = stats(usage);
                entry["cpu"] = cpu;
                entry["memory"] = memory;
                total.memory_bytes += usage.memory_bytes;
                total.cpu_nanoseconds += usage.cpu_nanoseconds;
                total.processes += usage.processes;
            }
            containers.push(entry);
        }
        node_memory += total.memory_bytes;
        node_cpu += total.cpu_nanoseconds;
        let (cpu, memory) = stats(total);
        pod_stats.push(json!({
            "podRef": {"name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"], "uid": uid},
            "startTime": pod["status"]["startTime"],
            "containers": containers,
            "cpu": cpu,
            "memory": memory,
            "process_stats": {"process_count": total.processes},
        }));
    }
    let capacity = node["status"]["capacity"]["memory"]
        .as_str()
        .and_then(crate::quantity::units)
        .and_then(|b| u64::try_from(b).ok())
        .unwrap_or(0);
    json!({
        "node": {
            "nodeName": node["metadata"]["name"],
            "startTime": node["metadata"]["creationTimestamp"],
            "cpu": {"time": now, "usageCoreNanoSeconds": node_cpu},
            "memory": {"time": now, "availableBytes": capacity.saturating_sub(node_memory), "usageBytes": node_memory, "workingSetBytes": node_memory, "rssBytes": node_memory},
        },
        "pods": pod_stats,
    })
}

/// The kubelet's gauges of what runs on it, in the Prometheus text format.
fn metrics(pods: &[&Value]) -> String {
    let running = |p: &&&Value| p["status"]["phase"] == "Running";
    let containers: usize = pods
        .iter()
        .map(|p| {
            p["status"]["containerStatuses"].as_array().map_or(0, |s| {
                s.iter()
                    .filter(|s| s["state"]["running"].is_object())
                    .count()
            })
        })
        .sum();
    format!(
        "# HELP kubelet_running_pods [ALPHA] Number of pods that have a running pod sandbox\n\
         # TYPE kubelet_running_pods gauge\n\
         kubelet_running_pods {}\n\
         # HELP kubelet_running_containers [ALPHA] Number of containers currently running\n\
         # TYPE kubelet_running_containers gauge\n\
         kubelet_running_containers{{container_state=\"running\"}} {containers}\n",
        pods.iter().filter(running).count()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_proxy_path_names_the_node_and_the_kubelets_path() {
        let t = target("/api/v1/nodes/node-1/proxy/pods").unwrap();
        assert_eq!((t.node, t.rest.as_str()), ("node-1", "/pods"));
        let t = target("/api/v1/nodes/https:node-2:10250/proxy/").unwrap();
        assert_eq!((t.node, t.rest.as_str()), ("node-2", "/"));
        assert!(target("/api/v1/nodes/node-1/status").is_none());
        assert!(target("/api/v1/namespaces/x/pods/p/proxy/").is_none());
    }
}
