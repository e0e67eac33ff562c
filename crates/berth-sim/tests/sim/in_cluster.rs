//! What a pod gets to reach the API server from inside, as on a real cluster: the
//! `kube-api-access-*` volume of the ServiceAccount admission (a working token, the CA, the
//! namespace) at the path in-cluster clients read, the service variables and resolved env,
//! and HTTP readiness probes that really GET their path.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use berth_sim::{BoxFuture, ContainerContext, ContainerRuntime, RunningContainer, SimConfig};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::{Api, api::PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{cluster_with, eventually};

const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Remembers what each container was given, and serves HTTP on its first port: `/ready`
/// answers 200 once the pod is marked ready here, 503 before.
#[derive(Clone, Default)]
struct Recording {
    contexts: Arc<Mutex<HashMap<String, ContainerContext>>>,
    ready: Arc<Mutex<Vec<String>>>,
    /// Requests answered 503, by pod.
    refused: Arc<Mutex<HashMap<String, u32>>>,
}

impl ContainerRuntime for Recording {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        let this = self.clone();
        Box::pin(async move {
            let (exit_tx, exited) = tokio::sync::oneshot::channel();
            let (stop, stop_rx) = tokio::sync::oneshot::channel::<std::time::Duration>();
            context
                .log
                .write(format!("starting in {}\nlistening\n", context.pod_name).as_bytes());
            this.contexts
                .lock()
                .unwrap()
                .insert(context.pod_name.clone(), context.clone());
            if let Some(port) = context.container["ports"][0]["containerPort"].as_u64() {
                let listener =
                    tokio::net::TcpListener::bind(SocketAddr::from((context.pod_ip, port as u16)))
                        .await
                        .map_err(|e| e.to_string())?;
                let pod = context.pod_name.clone();
                let ready = this.ready.clone();
                let refused = this.refused.clone();
                tokio::spawn(async move {
                    loop {
                        let Ok((mut socket, _)) = listener.accept().await else {
                            return;
                        };
                        let mut request = vec![0u8; 1024];
                        let n = socket.read(&mut request).await.unwrap_or(0);
                        let request = String::from_utf8_lossy(&request[..n]).to_string();
                        let ok = request.starts_with("GET /ready ")
                            && ready.lock().unwrap().contains(&pod);
                        let status = if ok {
                            "200 OK"
                        } else {
                            *refused.lock().unwrap().entry(pod.clone()).or_default() += 1;
                            "503 Service Unavailable"
                        };
                        let _ = socket
                            .write_all(
                                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n")
                                    .as_bytes(),
                            )
                            .await;
                    }
                });
            }
            tokio::spawn(async move {
                let _ = stop_rx.await;
                let _ = exit_tx.send(0);
            });
            Ok(RunningContainer { exited, stop })
        })
    }
}

fn pod(name: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"tier": "web"}}, "spec": spec}))
        .unwrap()
}

#[tokio::test]
async fn a_pod_gets_its_service_account_token_ca_namespace_and_environment() {
    let runtime = Recording::default();
    let cluster = cluster_with(SimConfig {
        runtime: Arc::new(runtime.clone()),
        ..SimConfig::fast()
    })
    .await;
    let client = cluster.client().await.unwrap();
    let accounts: Api<ServiceAccount> = Api::default_namespaced(client.clone());
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "builder"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let created = pods
        .create(
            &PostParams::default(),
            &pod(
                "app",
                json!({"serviceAccountName": "builder", "containers": [{"name": "main", "image": "nginx:1.27",
                "env": [
                    {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "MY_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "TIER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
                    {"name": "MODE", "value": "first"}, {"name": "MODE", "value": "last"}
                ]}]}),
            ),
        )
        .await
        .unwrap();
    // The admission plugin's volume and mount, as `kubectl get pod -o yaml` shows them.
    let spec = created.spec.unwrap();
    let volume = &spec.volumes.as_ref().unwrap()[0];
    assert!(
        volume.name.starts_with("kube-api-access-"),
        "{}",
        volume.name
    );
    let sources = volume.projected.as_ref().unwrap().sources.as_ref().unwrap();
    assert_eq!(
        sources[0]
            .service_account_token
            .as_ref()
            .unwrap()
            .expiration_seconds,
        Some(3607)
    );
    assert_eq!(
        sources[1].config_map.as_ref().unwrap().name,
        "kube-root-ca.crt"
    );
    let mount = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (
            mount.name.as_str(),
            mount.mount_path.as_str(),
            mount.read_only
        ),
        (volume.name.as_str(), MOUNT, Some(true))
    );

    let context = eventually(WAIT, "the container started", || async {
        runtime.contexts.lock().unwrap().get("app").cloned()
    })
    .await;
    let file =
        |name: &str| String::from_utf8(context.files[&format!("{MOUNT}/{name}")].clone()).unwrap();
    assert_eq!(file("namespace"), "default");
    assert_eq!(file("ca.crt"), cluster.ca_pem());
    // Valid for a year, as the real server extends the admission's 3607 s request (the
    // kubelet here never refreshes the file).
    use base64::Engine;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(file("token").split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(lifetime >= 364 * 24 * 3600, "{claims}");
    // The token works, as the pod's own account.
    let as_pod = cluster.client_with_token(&file("token")).await.unwrap();
    let who: serde_json::Value = as_pod
        .request(
            http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})).unwrap())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:default:builder"
    );
    let env: HashMap<_, _> = context.env.iter().cloned().collect();
    assert_eq!(env["MY_POD"], "app");
    assert_eq!(env["MY_NAMESPACE"], "default");
    assert_eq!(env["TIER"], "web");
    assert_eq!(env["MODE"], "last", "a later duplicate wins");
    let url = cluster.url();
    let (host, port) = url.trim_start_matches("https://").rsplit_once(':').unwrap();
    assert_eq!(
        (
            env["KUBERNETES_SERVICE_HOST"].as_str(),
            env["KUBERNETES_SERVICE_PORT"].as_str()
        ),
        (host, port)
    );
}

#[tokio::test]
async fn a_pod_or_account_that_opts_out_gets_no_token() {
    let cluster = cluster_with(SimConfig::api_only()).await;
    let client = cluster.client().await.unwrap();
    let accounts: Api<ServiceAccount> = Api::default_namespaced(client.clone());
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "quiet"}, "automountServiceAccountToken": false}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let container = json!([{"name": "main", "image": "nginx:1.27"}]);
    let by_pod = pods
        .create(
            &PostParams::default(),
            &pod(
                "by-pod",
                json!({"automountServiceAccountToken": false, "containers": container}),
            ),
        )
        .await
        .unwrap();
    let by_account = pods
        .create(
            &PostParams::default(),
            &pod(
                "by-account",
                json!({"serviceAccountName": "quiet", "containers": container}),
            ),
        )
        .await
        .unwrap();
    let overridden = pods
        .create(
            &PostParams::default(),
            &pod(
                "overridden",
                json!({"serviceAccountName": "quiet", "automountServiceAccountToken": true, "containers": container}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(by_pod.spec.unwrap().volumes, None);
    assert_eq!(by_account.spec.unwrap().volumes, None);
    assert_eq!(overridden.spec.unwrap().volumes.unwrap().len(), 1);
}

/// A readiness probe gets its path on the named port; the pod is ready while it answers 200,
/// and unready after `failureThreshold` failures in a row (3 by default), not at the first: a
/// pod whose threshold is 1000 stays ready through several 503s.
#[tokio::test]
async fn an_http_readiness_probe_gets_its_path_on_a_named_port() {
    let runtime = Recording::default();
    let cluster = cluster_with(SimConfig {
        runtime: Arc::new(runtime.clone()),
        ..SimConfig::fast()
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(cluster.client().await.unwrap());
    for (name, failure_threshold) in [("web", None), ("patient", Some(1000))] {
        let mut probe =
            json!({"httpGet": {"path": "/ready", "port": "health"}, "periodSeconds": 1});
        if let Some(threshold) = failure_threshold {
            probe["failureThreshold"] = json!(threshold);
        }
        pods.create(
            &PostParams::default(),
            &pod(
                name,
                json!({"containers": [{"name": "main", "image": "nginx:1.27",
                    "ports": [{"name": "health", "containerPort": 8081}],
                    "readinessProbe": probe}]}),
            ),
        )
        .await
        .unwrap();
    }
    let ready = |name: &'static str, want: bool| {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await.ok()?;
            let ready = pod
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == if want { "True" } else { "False" }).then_some(())
        }
    };
    // Running, answering 503: not ready.
    eventually(WAIT, "the pod running and answering 503", || async {
        runtime.contexts.lock().unwrap().get("web")?;
        ready("web", false).await
    })
    .await;
    runtime
        .ready
        .lock()
        .unwrap()
        .extend(["web".to_owned(), "patient".to_owned()]);
    eventually(WAIT, "the pods ready once /ready answers 200", || async {
        ready("web", true).await?;
        ready("patient", true).await
    })
    .await;
    // And unready again once it answers 503, after three failed probes.
    let refused_before = runtime.refused.lock().unwrap().get("patient").copied();
    runtime.ready.lock().unwrap().clear();
    eventually(WAIT, "the pod unready once /ready answers 503", || {
        ready("web", false)
    })
    .await;
    eventually(WAIT, "three probes of the patient pod refused", || async {
        let refused = runtime.refused.lock().unwrap().get("patient").copied();
        (refused.unwrap_or(0) >= refused_before.unwrap_or(0) + 3).then_some(())
    })
    .await;
    assert!(
        ready("patient", true).await.is_some(),
        "a pod stays ready until failureThreshold probes failed in a row"
    );
}

#[tokio::test]
async fn kubectl_logs_reads_what_a_container_wrote() {
    let runtime = Recording::default();
    let cluster = cluster_with(SimConfig {
        runtime: Arc::new(runtime.clone()),
        ..SimConfig::fast()
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(cluster.client().await.unwrap());
    pods.create(
        &PostParams::default(),
        &pod(
            "talker",
            json!({"containers": [{"name": "main", "image": "nginx:1.27"}]}),
        ),
    )
    .await
    .unwrap();
    let context = eventually(WAIT, "the container started", || async {
        runtime.contexts.lock().unwrap().get("talker").cloned()
    })
    .await;
    let logs = eventually(WAIT, "the container's status running", || async {
        pods.logs("talker", &Default::default()).await.ok()
    })
    .await;
    assert_eq!(logs, "starting in talker\nlistening\n");
    let tail = kube::api::LogParams {
        tail_lines: Some(1),
        ..Default::default()
    };
    assert_eq!(pods.logs("talker", &tail).await.unwrap(), "listening\n");
    // A follower gets what is there, then what comes.
    let follow = kube::api::LogParams {
        follow: true,
        ..Default::default()
    };
    let mut stream = pods.log_stream("talker", &follow).await.unwrap();
    use futures::AsyncBufReadExt;
    let mut line = String::new();
    stream.read_line(&mut line).await.unwrap();
    assert_eq!(line, "starting in talker\n");
    line.clear();
    stream.read_line(&mut line).await.unwrap();
    context.log.write(b"later\n");
    line.clear();
    stream.read_line(&mut line).await.unwrap();
    assert_eq!(line, "later\n");
}
