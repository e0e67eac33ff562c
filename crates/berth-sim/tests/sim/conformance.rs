//! The same scenarios through every client a platform team uses: kube-rs, kubectl 1.27 (the
//! oldest supported: OpenAPI v2, legacy discovery, protobuf for typed creates) and kubectl
//! 1.33 (the newest). Each must see what a real API server shows it: the same objects, the
//! same refusals in the same words. kubectl runs are gated like the other kubectl tests;
//! with `BERTH_REQUIRE_KUBECTL=1` both versions must be present (beside `kubectl`, as
//! `kubectl.1.27` and `kubectl.1.33`).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use berth_sim::{SimCluster, SimConfig};
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::{
    kubectl::versioned_kubectl,
    support::{cluster_with, install_workspace_crd},
};

const VERSIONS: &[&str] = &["1.27", "1.33"];

/// A client the scenarios drive.
enum Client {
    Kube(kube::Client),
    Kubectl {
        binary: PathBuf,
        kubeconfig: PathBuf,
        _dir: tempfile::TempDir,
    },
}

fn required() -> bool {
    std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() == Ok("1")
}

/// Every client for `sim`: kube-rs, then each kubectl version that is present.
async fn clients(sim: &SimCluster) -> Vec<Client> {
    let mut clients = vec![Client::Kube(sim.client().await.unwrap())];
    let required = required();
    for version in VERSIONS {
        match versioned_kubectl(version) {
            Some(binary) => {
                let dir = tempfile::tempdir().unwrap();
                let kubeconfig = dir.path().join("kubeconfig");
                sim.write_kubeconfig(&kubeconfig).unwrap();
                clients.push(Client::Kubectl {
                    binary,
                    kubeconfig,
                    _dir: dir,
                });
            }
            None if required => panic!(
                "kubectl.{version} is required (BERTH_REQUIRE_KUBECTL=1) but not found beside kubectl"
            ),
            None => eprintln!("skipping kubectl {version}: kubectl.{version} is not installed"),
        }
    }
    clients
}

fn gvk(object: &Value) -> GroupVersionKind {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap())
}

fn message(error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message,
        other => other.to_string(),
    }
}

impl Client {
    fn name(&self) -> String {
        match self {
            Client::Kube(_) => "kube-rs".to_owned(),
            Client::Kubectl { binary, .. } => binary.file_name().unwrap().to_string_lossy().into(),
        }
    }

    async fn api(client: &kube::Client, object: &Value) -> Api<DynamicObject> {
        let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk(object))
            .await
            .unwrap();
        match capabilities.scope {
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
            kube::discovery::Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default"),
                &resource,
            ),
        }
    }

    /// kubectl with `args`, the object as its standard input; its JSON output or its error.
    async fn kubectl(
        binary: &Path,
        kubeconfig: &Path,
        args: &[&str],
        object: &Value,
    ) -> Result<Value, String> {
        let mut child = tokio::process::Command::new(binary)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(object.to_string().as_bytes())
            .await
            .unwrap();
        drop(stdin);
        let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kubectl finishes")
            .unwrap();
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let value: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        // Some versions print what `-f` named as a List of one.
        Ok(match value["items"].as_array() {
            Some(items) if value["kind"] == "List" && items.len() == 1 => items[0].clone(),
            _ => value,
        })
    }

    /// `kubectl create -f -`: the object as created, or the refusal.
    async fn create(&self, object: &Value) -> Result<Value, String> {
        match self {
            Client::Kube(client) => {
                // As kubectl does: unknown fields are an error, not a warning.
                let url = format!(
                    "{}?fieldValidation=Strict",
                    Self::api(client, object).await.resource_url()
                );
                let request = http::Request::post(url)
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(object).unwrap())
                    .unwrap();
                client.request::<Value>(request).await.map_err(message)
            }
            Client::Kubectl {
                binary, kubeconfig, ..
            } => {
                Self::kubectl(
                    binary,
                    kubeconfig,
                    &["create", "-f", "-", "-o", "json"],
                    object,
                )
                .await
            }
        }
    }

    /// A server-side apply by `manager`.
    async fn apply(&self, object: &Value, manager: &str) -> Result<Value, String> {
        match self {
            Client::Kube(client) => {
                let name = object["metadata"]["name"].as_str().unwrap();
                Self::api(client, object)
                    .await
                    .patch(name, &PatchParams::apply(manager), &Patch::Apply(object))
                    .await
                    .map(|o| serde_json::to_value(o).unwrap())
                    .map_err(message)
            }
            Client::Kubectl {
                binary, kubeconfig, ..
            } => {
                let manager = format!("--field-manager={manager}");
                let args = ["apply", "--server-side", &manager, "-f", "-", "-o", "json"];
                Self::kubectl(binary, kubeconfig, &args, object).await
            }
        }
    }

    /// `kubectl replace -f -`.
    async fn replace(&self, object: &Value) -> Result<Value, String> {
        match self {
            Client::Kube(client) => {
                let name = object["metadata"]["name"].as_str().unwrap();
                let typed: DynamicObject = serde_json::from_value(object.clone()).unwrap();
                Self::api(client, object)
                    .await
                    .replace(name, &PostParams::default(), &typed)
                    .await
                    .map(|o| serde_json::to_value(o).unwrap())
                    .map_err(message)
            }
            Client::Kubectl {
                binary, kubeconfig, ..
            } => {
                Self::kubectl(
                    binary,
                    kubeconfig,
                    &["replace", "-f", "-", "-o", "json"],
                    object,
                )
                .await
            }
        }
    }

    /// `kubectl get -f -`.
    async fn get(&self, object: &Value) -> Result<Value, String> {
        match self {
            Client::Kube(client) => {
                let name = object["metadata"]["name"].as_str().unwrap();
                Self::api(client, object)
                    .await
                    .get(name)
                    .await
                    .map(|o| serde_json::to_value(o).unwrap())
                    .map_err(message)
            }
            Client::Kubectl {
                binary, kubeconfig, ..
            } => {
                Self::kubectl(
                    binary,
                    kubeconfig,
                    &["get", "-f", "-", "-o", "json"],
                    object,
                )
                .await
            }
        }
    }

    /// `kubectl delete -f -`, waiting until it is gone.
    async fn delete(&self, object: &Value) -> Result<(), String> {
        match self {
            Client::Kube(client) => {
                let name = object["metadata"]["name"].as_str().unwrap();
                Self::api(client, object)
                    .await
                    .delete(name, &DeleteParams::default())
                    .await
                    .map(|_| ())
                    .map_err(message)
            }
            Client::Kubectl {
                binary, kubeconfig, ..
            } => Self::kubectl(binary, kubeconfig, &["delete", "-f", "-"], object)
                .await
                .map(|_| ()),
        }
    }

    /// `kubectl scale --replicas=N -f -`.
    async fn scale(&self, object: &Value, replicas: i64) -> Result<(), String> {
        match self {
            Client::Kube(client) => {
                let name = object["metadata"]["name"].as_str().unwrap();
                Self::api(client, object)
                    .await
                    .patch_scale(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                    )
                    .await
                    .map(|_| ())
                    .map_err(message)
            }
            Client::Kubectl {
                binary, kubeconfig, ..
            } => {
                let replicas = format!("--replicas={replicas}");
                Self::kubectl(binary, kubeconfig, &["scale", &replicas, "-f", "-"], object)
                    .await
                    .map(|_| ())
            }
        }
    }
}

/// Runs `scenario` for every client, each against a fresh cluster made by `config` (kept
/// running meanwhile), with a superuser client for setting things up.
async fn for_every_client<F, Fut>(config: fn() -> SimConfig, scenario: F)
where
    F: Fn(Client, kube::Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // kube-rs, then each kubectl that is present (`clients` says when one is missing).
    let count = 1 + VERSIONS
        .iter()
        .filter(|v| versioned_kubectl(v).is_some())
        .count();
    for i in 0..count {
        let sim = cluster_with(config()).await;
        let client = clients(&sim).await.swap_remove(i);
        eprintln!("scenario through {}", client.name());
        scenario(client, sim.client().await.unwrap()).await;
        drop(sim);
    }
}

fn config_map(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"a": value}})
}

fn managers(object: &Value) -> Vec<(String, String)> {
    let mut managers: Vec<(String, String)> = object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["manager"].as_str().unwrap_or_default().to_owned(),
                m["operation"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    managers.sort();
    managers
}

#[tokio::test]
async fn an_object_lives_through_create_apply_replace_and_delete() {
    for_every_client(SimConfig::api_only, |client, admin| async move {
        let who = client.name();
        // An apply that creates, then one that changes.
        let created = client
            .apply(&config_map("settings", "1"), "first")
            .await
            .unwrap();
        assert_eq!(created["data"]["a"], "1", "{who}");
        let applied = client
            .apply(&config_map("settings", "2"), "first")
            .await
            .unwrap();
        assert_eq!(applied["data"]["a"], "2", "{who}");
        // A create by another writer owns what it wrote: applying another value conflicts.
        client.create(&config_map("created", "1")).await.unwrap();
        let taken = client
            .apply(&config_map("created", "2"), "first")
            .await
            .unwrap_err();
        assert!(
            taken.contains("Apply failed with 1 conflict: conflict with \"")
                && taken.contains(".data.a"),
            "{who}: {taken}"
        );
        // The same values applied by a second manager: it becomes a co-owner of them.
        client
            .apply(&config_map("settings", "2"), "second")
            .await
            .unwrap();
        // (kubectl leaves managedFields out of what it prints.)
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::default_namespaced(admin);
        let shared = serde_json::to_value(maps.get("settings").await.unwrap()).unwrap();
        let owners: Vec<(String, String)> = managers(&shared)
            .into_iter()
            .filter(|(_, operation)| operation == "Apply")
            .collect();
        assert_eq!(
            owners,
            [
                ("first".to_owned(), "Apply".to_owned()),
                ("second".to_owned(), "Apply".to_owned())
            ],
            "{who}"
        );
        // A different value from the first manager conflicts with the co-owner.
        let conflict = client
            .apply(&config_map("settings", "3"), "first")
            .await
            .unwrap_err();
        assert!(
            conflict.contains("conflict with \"second\"") && conflict.contains(".data.a"),
            "{who}: {conflict}"
        );
        let mut replaced = client.get(&config_map("settings", "")).await.unwrap();
        replaced["data"]["a"] = json!("4");
        let replaced = client.replace(&replaced).await.unwrap();
        assert_eq!(replaced["data"]["a"], "4", "{who}");
        client.delete(&config_map("settings", "")).await.unwrap();
        let gone = client.get(&config_map("settings", "")).await.unwrap_err();
        assert!(
            gone.contains("configmaps \"settings\" not found"),
            "{who}: {gone}"
        );
    })
    .await;
}

#[tokio::test]
async fn unknown_fields_and_unsupported_values_are_refused_in_the_real_words() {
    for_every_client(SimConfig::api_only, |client, _sim| async move {
        let who = client.name();
        let pod = |name: &str, spec: Value| {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}});
            json_patch::merge(&mut pod["spec"], &spec);
            pod
        };
        let unknown = client
            .create(&pod("typo", json!({"bogus": true})))
            .await
            .unwrap_err();
        assert!(
            unknown.contains("strict decoding error: unknown field \"spec.bogus\""),
            "{who}: {unknown}"
        );
        let unsupported = client
            .create(&pod("sometimes", json!({"restartPolicy": "Sometimes"})))
            .await
            .unwrap_err();
        assert!(
            unsupported.contains("\"sometimes\" is invalid: spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"Never\", \"OnFailure\""),
            "{who}: {unsupported}"
        );
        let immutable = json!({"apiVersion": "v1", "kind": "ConfigMap", "immutable": true,
            "metadata": {"name": "fixed", "namespace": "default"}, "data": {"a": "1"}});
        client.create(&immutable).await.unwrap();
        let mut changed = client.get(&immutable).await.unwrap();
        changed["data"]["a"] = json!("2");
        let refused = client.replace(&changed).await.unwrap_err();
        assert!(
            refused.contains("data: Forbidden: field is immutable when `immutable` is set"),
            "{who}: {refused}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_custom_resource_is_validated_by_its_schema_for_every_client() {
    for_every_client(SimConfig::api_only, |client, admin| async move {
        let who = client.name();
        install_workspace_crd(&admin).await;
        let workspace = |name: &str, spec: Value| {
            json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
                "metadata": {"name": name, "namespace": "default"}, "spec": spec})
        };
        // Discovery of a new CRD can take kubectl a moment: retry while it is unknown.
        let mut created = Err(String::new());
        for _ in 0..50 {
            created = client
                .create(&workspace("fine", json!({"image": "devbox:1"})))
                .await;
            if created.as_ref().is_err_and(|e| {
                e.contains("no matches for kind") || e.contains("resource mapping not found")
            }) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            break;
        }
        assert_eq!(created.unwrap()["spec"]["image"], "devbox:1", "{who}");
        let refused = client
            .create(&workspace("empty", json!({"command": ["sh"]})))
            .await
            .unwrap_err();
        assert!(
            refused.contains("\"empty\" is invalid: spec.image: Required value"),
            "{who}: {refused}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_deployment_rolls_out_and_scales_for_every_client() {
    for_every_client(SimConfig::fast, |client, _sim| async move {
        let who = client.name();
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}}}});
        client.create(&deployment).await.unwrap();
        let available = |want: i64| {
            let client = &client;
            let deployment = &deployment;
            async move {
                for _ in 0..200 {
                    let current = client.get(deployment).await.unwrap();
                    if current["status"]["availableReplicas"] == want
                        && current["status"]["updatedReplicas"] == want
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                panic!("{} never had {want} available", client.name());
            }
        };
        available(1).await;
        client.scale(&deployment, 3).await.unwrap();
        available(3).await;
        let current = client.get(&deployment).await.unwrap();
        assert_eq!(current["spec"]["replicas"], 3, "{who}");
    })
    .await;
}

/// `kubectl explain` reads the schemas: v2 for 1.27, v3 for 1.33.
#[tokio::test]
async fn kubectl_explain_reads_built_in_and_custom_schemas() {
    let sim = cluster_with(SimConfig::api_only()).await;
    install_workspace_crd(&sim.client().await.unwrap()).await;
    for client in clients(&sim).await {
        let Client::Kubectl {
            binary, kubeconfig, ..
        } = &client
        else {
            continue;
        };
        for (field, expected) in [
            (
                "pod.spec.restartPolicy",
                "Restart policy for all containers within the pod.",
            ),
            ("deployment.spec.strategy.type", "Type of deployment."),
            (
                "workspaces.spec.image",
                "The container image of the workspace",
            ),
        ] {
            let output = tokio::process::Command::new(binary)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args(["explain", field])
                .env_remove("KUBECONFIG")
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            assert!(
                output.status.success() && text.contains(expected),
                "{} explain {field}: {text}{}",
                client.name(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// kubectl's typed `create` commands, which send protobuf from 1.32 on (JSON before): each
/// creates what it names, as on a real server.
#[tokio::test]
async fn kubectls_typed_create_commands_create_what_they_name() {
    let sim = cluster_with(SimConfig::fast()).await;
    for client in clients(&sim).await {
        let Client::Kubectl {
            binary, kubeconfig, ..
        } = &client
        else {
            continue;
        };
        let who = client.name();
        let namespace = who.replace('.', "-");
        let run = |args: Vec<String>| {
            let (binary, kubeconfig) = (binary.clone(), kubeconfig.clone());
            async move {
                let output = tokio::process::Command::new(binary)
                    .arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(&args)
                    .env_remove("KUBECONFIG")
                    .output()
                    .await
                    .unwrap();
                (
                    output.status.success(),
                    String::from_utf8_lossy(&output.stdout).into_owned()
                        + &String::from_utf8_lossy(&output.stderr),
                )
            }
        };
        let ns = |rest: &str| -> Vec<String> {
            let mut args: Vec<String> = vec!["-n".into(), namespace.clone()];
            args.extend(rest.split_whitespace().map(str::to_owned));
            args
        };
        let (ok, text) = run(vec!["create".into(), "namespace".into(), namespace.clone()]).await;
        assert!(ok, "{who}: {text}");
        for command in [
            "create service clusterip web --tcp=80:8080",
            "create service nodeport edge --tcp=80:8080",
            "create deployment web --image=nginx:1.27 --replicas=2 --port=80",
            "create poddisruptionbudget web --selector=app=web --min-available=50%",
            "create quota compute --hard=pods=20,requests.cpu=10",
            "create secret generic token --from-literal=a=b",
            "create configmap settings --from-literal=a=b",
            "create serviceaccount builder",
            "create role reader --verb=get --resource=pods",
            "create rolebinding reader --role=reader --serviceaccount=NS:builder",
        ] {
            let command = command.replace("NS", &namespace);
            let (ok, text) = run(ns(&command)).await;
            assert!(ok && text.contains("created"), "{who} {command}: {text}");
        }
        let (ok, text) = run(ns(
            "get service web -o jsonpath={.spec.ports[0].targetPort}",
        ))
        .await;
        assert!(ok && text == "8080", "{who}: {text}");
        let (ok, text) = run(ns("get pdb web -o jsonpath={.spec.minAvailable}")).await;
        assert!(ok && text == "50%", "{who}: {text}");
        let (ok, text) = run(ns("rollout status deployment/web --timeout=60s")).await;
        assert!(
            ok && text.contains("successfully rolled out"),
            "{who}: {text}"
        );
        let can = format!("auth can-i get pods --as=system:serviceaccount:{namespace}:builder");
        let (ok, text) = run(ns(&can)).await;
        assert!(ok && text.trim() == "yes", "{who}: {text}");
        let (ok, text) = run(ns("create token builder")).await;
        assert!(ok && text.starts_with("eyJ"), "{who}: {text}");
    }
}
