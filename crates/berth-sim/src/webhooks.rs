//! Validating admission webhooks. `ValidatingWebhookConfiguration`s are stored like any
//! object; a create or update of a resource that one of their webhooks matches (operations,
//! API groups, versions, resources) is posted as an `admission.k8s.io/v1` AdmissionReview to
//! the webhook's `clientConfig.url` over HTTPS, trusting only its `caBundle`, within its
//! `timeoutSeconds` (default 10). A denial refuses the request in the webhook's words; a
//! webhook that cannot be asked refuses it too with `failurePolicy: Fail` (the default) and is
//! skipped with `Ignore`. A `clientConfig.service` webhook is called at a ready pod behind
//! that service (its selector, the service port's `targetPort`), verified as
//! `<service>.<namespace>.svc`, as a cluster's service network would route it. Not served:
//! namespace and object selectors.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::{
    auth::Identity,
    error::{ApiError, ApiResult},
    resources::ResourceType,
    sim::Sim,
};

/// A request as the webhooks see it.
pub struct Admission<'a> {
    pub rt: &'a ResourceType,
    /// `CREATE`, `UPDATE` or (for admission policies) `DELETE`.
    pub operation: &'static str,
    /// The subresource written (`status`), `""` for the main resource; webhooks are asked
    /// about main resources only.
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub object: &'a Value,
    pub old: Option<&'a Value>,
    pub user: &'a Identity,
    pub dry_run: bool,
}

impl Admission<'_> {
    /// The name of the object: the one written, or, for a DELETE, the one deleted.
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"]
            .as_str()
            .or_else(|| self.old?["metadata"]["name"].as_str())
            .unwrap_or_default()
    }
}

/// Whether any webhook may be asked about a write on `rt` (its main resource) that is one of
/// `operations` (an update or patch may turn out to create): whether to preview the write.
pub fn watched(sim: &Sim, rt: &ResourceType, operations: &[&str]) -> bool {
    operations
        .iter()
        .any(|op| !matching(sim, rt, op).is_empty())
}

/// The webhooks that match a request on `rt` (its main resource) with `operation`.
fn matching(sim: &Sim, rt: &ResourceType, operation: &str) -> Vec<Value> {
    let Some(configurations) = sim.resource_type(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
    ) else {
        return vec![];
    };
    let listed = |v: &Value, wanted: &str| {
        v.as_array()
            .is_some_and(|list| list.iter().any(|x| x == "*" || x == wanted))
    };
    let (stored, _) = sim.store.list(&configurations.storage, None);
    stored
        .iter()
        .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default())
        .filter(|webhook| {
            webhook["rules"].as_array().is_some_and(|rules| {
                rules.iter().any(|rule| {
                    listed(&rule["operations"], operation)
                        && listed(&rule["apiGroups"], &rt.group)
                        && listed(&rule["apiVersions"], &rt.version)
                        && listed(&rule["resources"], &rt.resource)
                })
            })
        })
        .collect()
}

/// Asks every matching webhook whose match conditions hold; the first refusal wins.
pub async fn validate(sim: &Sim, request: Admission<'_>) -> ApiResult<()> {
    for webhook in matching(sim, request.rt, request.operation) {
        if conditions_hold(&webhook, &request) {
            ask(sim, &webhook, &request).await?;
        }
    }
    Ok(())
}

/// Whether every `matchConditions` expression is true for the request (one that cannot be
/// evaluated counts as true: the webhook is asked, as its failure policy would have it).
fn conditions_hold(webhook: &Value, request: &Admission<'_>) -> bool {
    let Some(conditions) = webhook["matchConditions"]
        .as_array()
        .filter(|c| !c.is_empty())
    else {
        return true;
    };
    let rt = request.rt;
    let cel_request = kube_cel::AdmissionRequest {
        operation: request.operation.to_owned(),
        username: request.user.username.clone(),
        uid: request.user.uid.clone(),
        groups: request.user.groups.clone(),
        name: request.object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        namespace: request.namespace.to_owned(),
        dry_run: request.dry_run,
        kind: kube_cel::GroupVersionKind {
            group: rt.group.clone(),
            version: rt.version.clone(),
            kind: rt.kind.clone(),
        },
        resource: kube_cel::GroupVersionResource {
            group: rt.group.clone(),
            version: rt.version.clone(),
            resource: rt.resource.clone(),
        },
    };
    let mut evaluator = kube_cel::VapEvaluator::builder()
        .object(request.object.clone())
        .request(cel_request);
    if let Some(old) = request.old {
        evaluator = evaluator.old_object(old.clone());
    }
    let evaluator = evaluator.build();
    let expressions: Vec<kube_cel::VapExpression> = conditions
        .iter()
        .map(|c| kube_cel::VapExpression {
            expression: c["expression"].as_str().unwrap_or("true").to_owned(),
            // What a false result says, to tell it from an error.
            message: Some(FALSE.to_owned()),
            message_expression: None,
        })
        .collect();
    const FALSE: &str = "false";
    evaluator
        .evaluate(&expressions)
        .iter()
        .all(|r| r.passed || r.message.as_deref() != Some(FALSE))
}

/// Where a webhook is called.
struct Target {
    /// The URL the API server's messages name.
    url: String,
    /// Where the request goes, and the name its certificate must carry.
    address: Result<(String, String), String>,
}

/// A webhook's `clientConfig`: its URL, or a ready endpoint of its service.
fn target(sim: &Sim, webhook: &Value) -> Target {
    let config = &webhook["clientConfig"];
    if let Some(url) = config["url"].as_str() {
        let host = url
            .trim_start_matches("https://")
            .split(['/', ':'])
            .next()
            .unwrap_or_default()
            .to_owned();
        return Target {
            url: url.to_owned(),
            address: Ok((url.to_owned(), host)),
        };
    }
    let service = &config["service"];
    let (name, namespace) = (
        service["name"].as_str().unwrap_or_default(),
        service["namespace"].as_str().unwrap_or_default(),
    );
    let port = service["port"].as_u64().unwrap_or(443);
    let path = service["path"].as_str().unwrap_or_default();
    let host = format!("{name}.{namespace}.svc");
    let url = format!("https://{host}:{port}{path}");
    let address = match sim.store.get("/services", namespace, name) {
        None => Err(format!("service \"{name}\" not found")),
        Some(service) => endpoint(sim, &service, namespace, port)
            .map(|at| (format!("https://{at}{path}"), host))
            .ok_or_else(|| format!("no endpoints available for service \"{name}\"")),
    };
    Target { url, address }
}

/// A ready pod's address behind the service's `port`, as its endpoints would list it.
fn endpoint(sim: &Sim, service: &Value, namespace: &str, port: u64) -> Option<String> {
    let selector = service["spec"]["selector"].as_object()?;
    let service_port = service["spec"]["ports"]
        .as_array()?
        .iter()
        .find(|p| p["port"].as_u64() == Some(port))?;
    let target = &service_port["targetPort"];
    let (pods, _) = sim.store.list("/pods", Some(namespace));
    pods.iter()
        .filter(|pod| {
            pod["metadata"]["deletionTimestamp"].is_null()
                && selector
                    .iter()
                    .all(|(k, v)| pod["metadata"]["labels"][k] == *v)
                && pod["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .find_map(|pod| {
            let ip = pod["status"]["podIP"].as_str()?;
            let number = target.as_u64().or_else(|| {
                let named = target.as_str()?;
                pod["spec"]["containers"]
                    .as_array()?
                    .iter()
                    .flat_map(|c| c["ports"].as_array().into_iter().flatten())
                    .find(|p| p["name"] == named)?["containerPort"]
                    .as_u64()
            })?;
            Some(format!("{ip}:{number}"))
        })
}

async fn ask(sim: &Sim, webhook: &Value, request: &Admission<'_>) -> ApiResult<()> {
    let name = webhook["name"].as_str().unwrap_or_default();
    let timeout = Duration::from_secs(
        webhook["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let Target { url, address } = target(sim, webhook);
    let url = url.as_str();
    let rt = request.rt;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": crate::meta::new_uid(),
            "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "resource": {"group": rt.group, "version": rt.version, "resource": rt.resource},
            "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.resource},
            "name": request.object["metadata"]["name"],
            "namespace": request.namespace,
            "operation": request.operation,
            "userInfo": {
                "username": request.user.username,
                "uid": request.user.uid,
                "groups": request.user.groups,
            },
            "object": request.object,
            "oldObject": request.old.cloned().unwrap_or(Value::Null),
            "dryRun": request.dry_run,
        }
    });
    let (at, server_name) = match address {
        Ok(address) => address,
        Err(error) => return unreachable(webhook, name, url, timeout, &error),
    };
    let answer =
        match tokio::time::timeout(timeout, post(webhook, &at, &server_name, &review)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => return unreachable(webhook, name, url, timeout, &error),
            Err(_) => {
                return unreachable(webhook, name, url, timeout, "context deadline exceeded");
            }
        };
    let response = &answer["response"];
    if response["allowed"].as_bool() == Some(true) {
        return Ok(());
    }
    let status = &response["status"];
    let denied = format!("admission webhook \"{name}\" denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{denied}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{denied}: {r}"),
        _ => format!("{denied} without explanation"),
    };
    // As the real API server: a denial is never below 400.
    let code = status["code"].as_u64().filter(|c| *c >= 400).unwrap_or(400) as u16;
    Err(ApiError::Denied { code, message })
}

/// A webhook that could not be asked: its failure policy decides.
fn unreachable(
    webhook: &Value,
    name: &str,
    url: &str,
    timeout: Duration,
    error: &str,
) -> ApiResult<()> {
    if webhook["failurePolicy"].as_str() == Some("Ignore") {
        tracing::warn!(webhook = name, %error, "failed calling webhook, failing open");
        return Ok(());
    }
    Err(ApiError::Internal {
        message: format!(
            "Internal error occurred: failed calling webhook \"{name}\": failed to call webhook: Post \"{url}?timeout={}s\": {error}",
            timeout.as_secs()
        ),
    })
}

async fn post(
    webhook: &Value,
    url: &str,
    server_name: &str,
    review: &Value,
) -> Result<Value, String> {
    if !url.starts_with("https://") {
        return Err(format!("webhook URL {url:?} must use https"));
    }
    let bundle = webhook["clientConfig"]["caBundle"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default();
    let tls = crate::tls::go_client_config(&bundle)?;
    let server_name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| e.to_string())?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(server_name))
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, axum::body::Body>(connector);
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        message
    })?;
    let status = response.status();
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 4 << 20)
        .await
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("the webhook answered {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the webhook's answer is not JSON: {e}"))
}
