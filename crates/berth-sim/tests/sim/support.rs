//! Helpers shared by the sim's tests.

use std::time::Duration;

use berth_sim::{SimCluster, SimConfig};
use k8s_openapi::{
    api::core::v1::Pod,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{Api, api::PostParams};
use serde_json::json;

/// A fresh API server with no nodes (like envtest): pods stay Pending.
pub async fn cluster() -> SimCluster {
    cluster_with(SimConfig::api_only()).await
}

/// A fresh cluster with three nodes, kubelets and a scheduler, on millisecond timings.
pub async fn cluster_with_nodes() -> SimCluster {
    cluster_with(SimConfig::fast()).await
}

/// A fresh cluster with `config`, pod grace capped short so deletions finish fast.
pub async fn cluster_with(config: SimConfig) -> SimCluster {
    SimCluster::start(SimConfig {
        max_pod_grace: Duration::from_millis(200),
        ..config
    })
    .await
    .expect("the sim starts")
}

/// Polls `check` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The (code, reason, message) of an API error.
pub fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => {
            (status.code, status.reason.clone(), status.message.clone())
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The committed Workspace CRD, as `kubectl apply -f deploy/crds/` would send it.
pub fn workspace_crd() -> CustomResourceDefinition {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/crds/workspaces.berth.dev.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the committed CRD is readable");
    serde_saphyr::from_str(&text).expect("the committed CRD parses")
}

/// Installs the Workspace CRD.
pub async fn install_workspace_crd(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &workspace_crd())
        .await
        .expect("the CRD installs");
}

/// A one-container pod labelled `app=<app>`.
pub fn pod(name: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}
    }))
    .expect("a valid pod")
}

/// POSTs `body` as JSON to `path` (with its query), as a client that is not typed would: the
/// raw answer, for what typed clients cannot send (unknown fields, nulls, numbers, bad data).
pub async fn post_json(
    client: &kube::Client,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, kube::Error> {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    client.request(request).await
}

/// GETs `path` with `accept`, as a client that reads the raw answer: (status code, content
/// type, body).
pub async fn get_raw(client: &kube::Client, path: &str, accept: &str) -> (u16, String, Vec<u8>) {
    let request = http::Request::get(path)
        .header("accept", accept)
        .body(Vec::new())
        .unwrap();
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .unwrap();
    let code = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 64 << 20)
        .await
        .unwrap()
        .to_vec();
    (code, content_type, body)
}

/// Whether a Job's status says it is Complete.
pub fn job_complete(job: &k8s_openapi::api::batch::v1::Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
}
