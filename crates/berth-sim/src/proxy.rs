//! The `proxy` subresources of pods and services, as the API server serves them: a request to
//! `.../pods/NAME[:PORT]/proxy/PATH` or `.../services/NAME[:PORT]/proxy/PATH` goes on to that
//! port of the pod (or of a ready pod behind the service), streamed both ways, without the
//! caller's credentials.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, Uri},
    response::Response,
};
use serde_json::Value;

use crate::{
    auth::{self, Attributes, Identity},
    error::{ApiError, ApiResult},
    sim::Sim,
};

/// What a proxy request names.
#[derive(Debug, PartialEq)]
pub struct Target<'a> {
    pub namespace: &'a str,
    /// `pods` or `services`.
    pub resource: &'a str,
    pub name: &'a str,
    /// The port as given (a number or a port name), if any.
    pub port: Option<&'a str>,
    /// The path after `proxy`, with its leading slash.
    pub rest: String,
}

/// A path naming the proxy subresource of a pod or a service.
pub fn target(path: &str) -> Option<Target<'_>> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.splitn(5, '/');
    let namespace = parts.next()?;
    let resource = parts.next().filter(|r| *r == "pods" || *r == "services")?;
    let named = parts.next()?;
    if parts.next()? != "proxy" {
        return None;
    }
    // `[scheme:]name[:port]`; the sim speaks plain HTTP to pods, so a scheme is dropped.
    let pieces: Vec<&str> = named.split(':').collect();
    let (name, port) = match pieces.as_slice() {
        [name] => (*name, None),
        ["http" | "https", name, port] => (*name, Some(*port)),
        [name, port] => (*name, Some(*port)),
        _ => return None,
    };
    Some(Target {
        namespace,
        resource,
        name,
        port: port.filter(|p| !p.is_empty()),
        rest: format!("/{}", parts.next().unwrap_or_default()),
    })
}

/// The verb a proxied method is authorized as.
pub fn verb(method: &axum::http::Method) -> &'static str {
    match method.as_str() {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    }
}

/// A named port of a pod's containers, or a number.
fn pod_port(pod: &Value, port: &str) -> Option<u16> {
    port.parse().ok().or_else(|| {
        pod["spec"]["containers"]
            .as_array()?
            .iter()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .find(|p| p["name"] == port)?["containerPort"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
    })
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn unavailable(message: String) -> ApiError {
    ApiError::ServiceUnavailable { message }
}

/// Where a request goes: the pod's IP and port.
fn destination(sim: &Sim, target: &Target<'_>) -> ApiResult<(String, u16)> {
    let get = |storage: &str, resource: &str| {
        sim.store
            .get(storage, target.namespace, target.name)
            .ok_or_else(|| ApiError::not_found(resource, "", target.name))
    };
    if target.resource == "pods" {
        let pod = get("/pods", "pods")?;
        let port = match target.port {
            Some(port) => pod_port(&pod, port).ok_or_else(|| {
                ApiError::bad_request(format!("invalid port {port} for pod {}", target.name))
            })?,
            None => 80,
        };
        let ip = pod["status"]["podIP"]
            .as_str()
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                unavailable(format!(
                    "address not allowed: pod {} has no IP yet",
                    target.name
                ))
            })?;
        return Ok((ip.to_owned(), port));
    }
    let service = get("/services", "services")?;
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let port = match target.port {
        Some(wanted) => ports.iter().find(|p| {
            p["name"] == wanted
                || p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(wanted)
        }),
        None => ports.first(),
    }
    .ok_or_else(|| {
        unavailable(format!(
            "no endpoints available for service \"{}\"",
            target.name
        ))
    })?;
    let selector: std::collections::BTreeMap<String, String> =
        serde_json::from_value(service["spec"]["selector"].clone()).unwrap_or_default();
    let (pods, _) = sim.store.list("/pods", Some(target.namespace));
    let pod = pods
        .iter()
        .filter(|_| !selector.is_empty())
        .find(|pod| {
            let labels: std::collections::BTreeMap<String, String> =
                serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap_or_default();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
                && ready(pod)
                && pod["metadata"]["deletionTimestamp"].is_null()
        })
        .ok_or_else(|| {
            unavailable(format!(
                "no endpoints available for service \"{}\"",
                target.name
            ))
        })?;
    let target_port = &port["targetPort"];
    let number = match target_port {
        Value::String(name) => pod_port(pod, name),
        Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
        _ => port["port"].as_u64().and_then(|p| u16::try_from(p).ok()),
    }
    .ok_or_else(|| {
        unavailable(format!(
            "no endpoints available for service \"{}\"",
            target.name
        ))
    })?;
    let ip = pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((ip, number))
}

/// Proxies one request, after RBAC allows `<verb>` on `<resource>/proxy`.
pub async fn serve(
    sim: Arc<Sim>,
    identity: Identity,
    target: Target<'_>,
    request: Request,
) -> ApiResult<Response> {
    let attrs = Attributes {
        verb: verb(request.method()).to_owned(),
        resource: target.resource.to_owned(),
        subresource: "proxy".into(),
        namespace: target.namespace.to_owned(),
        name: target.name.to_owned(),
        ..Default::default()
    };
    auth::require(&sim.store, &identity, &attrs)?;
    let (ip, port) = destination(&sim, &target)?;
    let (mut parts, body) = request.into_parts();
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    parts.uri = format!("http://{ip}:{port}{}{query}", target.rest)
        .parse::<Uri>()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    // The caller's credentials are for the API server, not for the pod.
    for header in ["authorization", "impersonate-user", "impersonate-group"] {
        parts.headers.remove(header);
    }
    if let Ok(host) = HeaderValue::from_str(&format!("{ip}:{port}")) {
        parts.headers.insert("host", host);
    }
    parts.version = axum::http::Version::HTTP_11;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let answer = client
        .request(axum::http::Request::from_parts(parts, body))
        .await
        .map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            unavailable(format!(
                "error trying to reach service: dial tcp {ip}:{port}: {cause}"
            ))
        })?;
    let (parts, body) = answer.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_path_names_the_object_its_port_and_the_rest() {
        let t = target("/api/v1/namespaces/ns/pods/web:8080/proxy/metrics").unwrap();
        assert_eq!(
            (t.namespace, t.resource, t.name, t.port, t.rest.as_str()),
            ("ns", "pods", "web", Some("8080"), "/metrics")
        );
        let t = target("/api/v1/namespaces/ns/services/https:api:web/proxy/").unwrap();
        assert_eq!((t.name, t.port, t.rest.as_str()), ("api", Some("web"), "/"));
        let t = target("/api/v1/namespaces/ns/pods/web/proxy").unwrap();
        assert_eq!((t.port, t.rest.as_str()), (None, "/"));
        assert!(target("/api/v1/namespaces/ns/pods/web/log").is_none());
        assert!(target("/api/v1/namespaces/ns/configmaps/web/proxy/x").is_none());
    }
}
