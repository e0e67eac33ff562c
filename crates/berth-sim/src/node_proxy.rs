//! The `proxy` subresource of nodes: `/api/v1/nodes/NAME[:PORT]/proxy/PATH` reaches the node's
//! kubelet, whose read-only endpoints the sim answers from the store: `/healthz`, `/pods`,
//! `/configz` and `/metrics`; any other path is the kubelet's `404 page not found`.

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
