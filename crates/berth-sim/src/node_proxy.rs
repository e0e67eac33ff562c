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
            summary(&sim, &node, &on_node).await.to_string(),
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

/// A request to node `node`'s own kubelet port (`SimCluster::serve_kubelet`): the streaming
/// endpoints of its pods (`/exec|attach/NS/POD/CONTAINER`, `/portForward/NS/POD`,
/// `/containerLogs/NS/POD/CONTAINER`) become the API server's pod subresources, anything else
/// the node proxy's path, after the caller is authenticated and allowed `nodes/proxy` (as a
/// kubelet asks the API server with a SubjectAccessReview). A pod of another node does not
/// exist here.
pub async fn kubelet(
    axum::extract::State((sim, node)): axum::extract::State<(Arc<Sim>, Arc<str>)>,
    mut request: Request,
) -> Response {
    use axum::response::IntoResponse;
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // `NS/POD[/UID]`: the pod, on this node (and with this UID, when named).
    let on_this_node = |namespace: &str, pod: &str, uid: Option<&str>| {
        sim.store.get("/pods", namespace, pod).is_some_and(|p| {
            p["spec"]["nodeName"] == *node && uid.is_none_or(|uid| p["metadata"]["uid"] == uid)
        })
    };
    // The kubelet's stream parameters (`input`, `output`, `error`, `tty`) in the API
    // server's words (`stdin=true`, ...), and the container.
    let with_container = |container: &str| {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            let renamed = match key.as_ref() {
                "input" => Some("stdin"),
                "output" => Some("stdout"),
                "error" => Some("stderr"),
                "tty" => Some("tty"),
                _ => None,
            };
            match renamed {
                Some(name) => out.append_pair(
                    name,
                    if matches!(value.as_ref(), "1" | "true") {
                        "true"
                    } else {
                        "false"
                    },
                ),
                None => out.append_pair(&key, &value),
            };
        }
        out.append_pair("container", container);
        out.finish()
    };
    let (verb, rest) = segments.split_first().unwrap_or((&"", &[]));
    let (namespace, pod, uid, container) = match rest {
        [namespace, pod] => (*namespace, *pod, None, None),
        [namespace, pod, container] => (*namespace, *pod, None, Some(*container)),
        [namespace, pod, uid, container] => (*namespace, *pod, Some(*uid), Some(*container)),
        _ => ("", "", None, None),
    };
    let rewritten = match (*verb, container) {
        ("exec" | "attach", Some(container)) => on_this_node(namespace, pod, uid).then(|| {
            format!(
                "/api/v1/namespaces/{namespace}/pods/{pod}/{verb}?{}",
                with_container(container)
            )
        }),
        ("portForward", None) if !pod.is_empty() => on_this_node(namespace, pod, uid)
            .then(|| format!("/api/v1/namespaces/{namespace}/pods/{pod}/portforward?{query}")),
        ("containerLogs", Some(container)) => on_this_node(namespace, pod, uid).then(|| {
            format!(
                "/api/v1/namespaces/{namespace}/pods/{pod}/log?{}",
                with_container(container)
            )
        }),
        _ => Some(format!(
            "/api/v1/nodes/{node}/proxy{path}{}{query}",
            if query.is_empty() { "" } else { "?" }
        )),
    };
    let Some(rewritten) = rewritten else {
        return answer(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "pod does not exist\n".into(),
        );
    };
    // The kubelet's own authorization first: `nodes/proxy` on this node.
    let client = request
        .extensions()
        .get::<crate::server::ClientCertificate>()
        .and_then(|c| c.0.clone());
    let identity = match crate::server::authenticate(&sim, request.headers(), client.as_ref()) {
        Ok(identity) => identity,
        Err(error) => return error.into_response(),
    };
    let attrs = Attributes {
        verb: crate::proxy::verb(request.method()).to_owned(),
        resource: "nodes".into(),
        subresource: "proxy".into(),
        name: node.to_string(),
        ..Default::default()
    };
    if let Err(error) = auth::require(&sim.store, &identity, &attrs) {
        return error.into_response();
    }
    match rewritten.parse() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => {
            return answer(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                "bad path\n".into(),
            );
        }
    }
    crate::server::handle(axum::extract::State(sim), request).await
}

/// How far apart the two readings are that a CPU rate (`usageNanoCores`) is taken from.
const CPU_SAMPLE: std::time::Duration = std::time::Duration::from_millis(100);

/// The kubelet's Summary API (`stats/v1alpha1`): the node and each running pod, with what
/// its containers' processes use now (memory as working set and RSS, CPU time and its rate
/// over two readings), as the runtime measures them. Containers the runtime runs nothing for
/// report no usage, as a kubelet reports none it could not read.
async fn summary(sim: &Sim, node: &Value, pods: &[&Value]) -> Value {
    let runtime = &sim.config.runtime;
    let running: Vec<&Value> = pods
        .iter()
        .copied()
        .filter(|p| p["status"]["phase"] == "Running")
        .collect();
    let containers_of = |pod: &Value| -> Vec<(String, String)> {
        pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let started = s["state"]["running"]["startedAt"].as_str()?;
                Some((s["name"].as_str()?.to_owned(), started.to_owned()))
            })
            .collect()
    };
    let read = || {
        running
            .iter()
            .map(|pod| {
                let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
                containers_of(pod)
                    .iter()
                    .map(|(name, _)| runtime.usage(uid, name))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let before = read();
    tokio::time::sleep(CPU_SAMPLE).await;
    let after = read();
    let now = crate::meta::now_rfc3339();
    let rate = |earlier: u64, later: u64| {
        (u128::from(later.saturating_sub(earlier)) * 1_000_000_000 / CPU_SAMPLE.as_nanos()) as u64
    };
    let stats = |usage: crate::runtime::Usage, cores: u64| {
        (
            json!({"time": now, "usageNanoCores": cores, "usageCoreNanoSeconds": usage.cpu_nanoseconds}),
            json!({"time": now, "usageBytes": usage.memory_bytes, "workingSetBytes": usage.memory_bytes, "rssBytes": usage.memory_bytes, "pageFaults": 0, "majorPageFaults": 0}),
        )
    };
    let mut node_total = crate::runtime::Usage::default();
    let mut node_cores = 0u64;
    let mut pod_stats = vec![];
    for (p, pod) in running.iter().enumerate() {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let mut total = crate::runtime::Usage::default();
        let mut cores = 0u64;
        let mut containers = vec![];
        for (c, (name, started)) in containers_of(pod).into_iter().enumerate() {
            let mut entry = json!({"name": name, "startTime": started});
            let earlier = before.get(p).and_then(|u| u.get(c)).copied().flatten();
            if let Some(usage) = after.get(p).and_then(|u| u.get(c)).copied().flatten() {
                let used = rate(
                    earlier.unwrap_or(usage).cpu_nanoseconds,
                    usage.cpu_nanoseconds,
                );
                let (cpu, memory) = stats(usage, used);
                entry["cpu"] = cpu;
                entry["memory"] = memory;
                total.memory_bytes += usage.memory_bytes;
                total.cpu_nanoseconds += usage.cpu_nanoseconds;
                total.processes += usage.processes;
                cores += used;
            }
            containers.push(entry);
        }
        node_total.memory_bytes += total.memory_bytes;
        node_total.cpu_nanoseconds += total.cpu_nanoseconds;
        node_cores += cores;
        let (cpu, memory) = stats(total, cores);
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
    let (cpu, mut memory) = stats(node_total, node_cores);
    memory["availableBytes"] = json!(capacity.saturating_sub(node_total.memory_bytes));
    json!({
        "node": {
            "nodeName": node["metadata"]["name"],
            "startTime": node["metadata"]["creationTimestamp"],
            "cpu": cpu,
            "memory": memory,
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
