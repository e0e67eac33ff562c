//! The machine's `kubectl` against the sim through a written kubeconfig: the yardstick that
//! the sim behaves like a real API server. Fails saying what is missing when kubectl is absent,
//! unless `BERTH_REQUIRE_KUBECTL=0` (then it skips, saying so). The versioned kubectls
//! (`kubectl.1.27` ... beside `kubectl`) are required only with `BERTH_REQUIRE_KUBECTL=1`
//! (set by `.ci/run`).

use std::{path::PathBuf, process::Output, time::Duration};

use berth_sim::SimCluster;
use serde_json::Value;

use crate::support::cluster;

pub struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Kubectl {
    /// None (after printing why) when kubectl is not installed and not required.
    pub fn for_cluster(sim: &SimCluster) -> Option<Kubectl> {
        let present = std::process::Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output()
            .is_ok_and(|o| o.status.success());
        if !present {
            if std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() != Ok("0") {
                panic!(
                    "kubectl is needed for this test and is not on PATH: install it (any version from 1.27; README, \"What the tests need\"), or set BERTH_REQUIRE_KUBECTL=0 to skip what needs it"
                );
            }
            eprintln!("skipping: kubectl is not installed (BERTH_REQUIRE_KUBECTL=0)");
            return None;
        }
        Some(Kubectl::with_binary(sim, "kubectl".into()))
    }

    /// `kubectl.VERSION` beside the `kubectl` on PATH, skipped like kubectl itself.
    pub fn version(sim: &SimCluster, version: &str) -> Option<Kubectl> {
        match versioned_kubectl(version) {
            Some(binary) => Some(Kubectl::with_binary(sim, binary)),
            None if std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() == Ok("1") => panic!(
                "kubectl.{version} is required (BERTH_REQUIRE_KUBECTL=1) but not found beside kubectl"
            ),
            None => {
                eprintln!("skipping kubectl {version}: kubectl.{version} is not installed");
                None
            }
        }
    }

    /// This kubectl with a kubeconfig of its own (another user of the same cluster).
    pub fn with_kubeconfig(&self, kubeconfig: &str) -> Kubectl {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig).unwrap();
        Kubectl {
            binary: self.binary.clone(),
            kubeconfig: path,
            _dir: dir,
        }
    }

    fn with_binary(sim: &SimCluster, binary: PathBuf) -> Kubectl {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl {
            binary,
            kubeconfig,
            _dir: dir,
        }
    }

    /// A kubectl that runs until dropped (port-forward), its output piped.
    pub fn spawn(&self, args: &[&str]) -> tokio::process::Child {
        self.command(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .kill_on_drop(true);
        command.env_remove("KUBECONFIG");
        command
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .expect("kubectl finishes")
            .unwrap()
    }

    /// Runs kubectl and returns stdout; panics with stderr on failure.
    pub async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "kubectl {args:?} failed:\n{}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    pub async fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(!output.status.success(), "kubectl {args:?} should fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    pub async fn run_with_input(&self, args: &[&str], input: &str) -> Output {
        use tokio::io::AsyncWriteExt;
        let mut child = self
            .command(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap()
            .unwrap()
    }

    pub async fn apply_stdin(&self, args: &[&str], input: &str) -> String {
        let output = self.run_with_input(args, input).await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    /// Runs kubectl with `input` on its standard input; it must fail. Its standard error.
    pub async fn fails_with_input(&self, args: &[&str], input: &str) -> String {
        let output = self.run_with_input(args, input).await;
        assert!(!output.status.success(), "kubectl {args:?} should fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

/// `kubectl.VERSION` beside the `kubectl` on PATH.
pub fn versioned_kubectl(version: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let kubectl = std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())?;
    let real = std::fs::canonicalize(kubectl).ok()?;
    let versioned = real.parent()?.join(format!("kubectl.{version}"));
    versioned.is_file().then_some(versioned)
}

const CRD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/crds/workspaces.berth.dev.yaml"
);

const WORKSPACE: &str = "apiVersion: berth.dev/v1alpha1
kind: Workspace
metadata:
  name: alice-dev
spec:
  image: devbox:1
  ports: [{name: http, port: 8080}]
";

#[tokio::test]
async fn kubectl_workflow_against_the_sim() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };

    assert!(
        kubectl
            .ok(&["apply", "--server-side", "-f", CRD])
            .await
            .contains("serverside-applied")
    );
    assert!(
        kubectl
            .apply_stdin(&["create", "-f", "-"], WORKSPACE)
            .await
            .contains("workspace.berth.dev/alice-dev created")
    );

    // Table output with the CRD's printer columns (KIND, POD, NODE, RECREATIONS and
    // LAST-ACTIVE only with -o wide).
    let table = kubectl.ok(&["get", "ws"]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "READY", "MESSAGE", "UPDATE", "AGE"]
    );
    assert!(table.lines().nth(1).unwrap().starts_with("alice-dev"));
    let wide = kubectl.ok(&["get", "ws", "-o", "wide"]).await;
    assert!(wide.lines().next().unwrap().contains("LAST-ACTIVE"));
    let pods_header = kubectl.ok(&["get", "namespaces"]).await;
    kubectl
        .ok(&["run", "web", "--image=nginx:1.27", "--restart=Never"])
        .await;
    let pods = kubectl.ok(&["get", "pods"]).await;
    let pod_header: Vec<&str> = pods.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(pod_header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    let row: Vec<&str> = pods.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["web", "0/1", "Pending", "0"]);
    assert!(
        pods_header.starts_with("NAME")
            && pods_header.contains("STATUS")
            && pods_header.contains("Active"),
        "{pods_header}"
    );

    let yaml = kubectl.ok(&["get", "ws", "alice-dev", "-o", "yaml"]).await;
    assert!(
        yaml.contains("kind: Workspace")
            && yaml.contains("image: devbox:1")
            && yaml.contains("paused: false"),
        "{yaml}"
    );

    assert!(
        kubectl
            .ok(&[
                "patch",
                "ws",
                "alice-dev",
                "--type=merge",
                "-p",
                r#"{"spec":{"image":"devbox:2"}}"#
            ])
            .await
            .contains("patched")
    );
    assert!(
        kubectl
            .ok(&["label", "ws", "alice-dev", "team=a"])
            .await
            .contains("labeled")
    );
    assert!(
        kubectl
            .ok(&["annotate", "ws", "alice-dev", "note=hello"])
            .await
            .contains("annotated")
    );
    let json: Value =
        serde_json::from_str(&kubectl.ok(&["get", "ws", "alice-dev", "-o", "json"]).await).unwrap();
    assert_eq!(json["spec"]["image"], "devbox:2");
    assert_eq!(json["metadata"]["labels"]["team"], "a");
    assert_eq!(json["metadata"]["annotations"]["note"], "hello");
    assert_eq!(json["metadata"]["generation"], 2);

    // describe shows the object and its events (found by involvedObject fields).
    let client = sim.client().await.unwrap();
    let workspaces: kube::Api<berth_api::Workspace> =
        kube::Api::namespaced(client.clone(), "default");
    let workspace = workspaces.get("alice-dev").await.unwrap();
    let reporter = kube::runtime::events::Reporter {
        controller: "berth".into(),
        instance: None,
    };
    let recorder = kube::runtime::events::Recorder::new(client, reporter);
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Created".into(),
        note: Some("Created pod alice-dev-ws".into()),
        action: "Create".into(),
        secondary: None,
    };
    let reference = kube::Resource::object_ref(&workspace, &());
    recorder.publish(&event, &reference).await.unwrap();
    let described = kubectl.ok(&["describe", "ws", "alice-dev"]).await;
    assert!(
        described.contains("Name:")
            && described.contains("alice-dev")
            && described.contains("devbox:2"),
        "{described}"
    );
    let events = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("Normal") && events.contains("Created pod alice-dev-ws"),
        "{described}"
    );

    // Invalid specs are refused with the field named.
    let bad = "apiVersion: berth.dev/v1alpha1\nkind: Workspace\nmetadata: {name: bad}\nspec:\n  image: x\n  podTemplate: {volumes: {secrets: [{secretName: s, mountPath: rel}]}}\n";
    let mut child = kubectl
        .command(&["create", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(child.stdin.as_mut().unwrap(), bad.as_bytes())
        .await
        .unwrap();
    drop(child.stdin.take());
    let output = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("spec.podTemplate.volumes.secrets[0].mountPath")
            && stderr.contains("mountPath must be an absolute path"),
        "{stderr}"
    );

    // wait --for=condition: satisfied when the status says so.
    let waiter = kubectl
        .command(&[
            "wait",
            "--for=condition=Ready",
            "ws/alice-dev",
            "--timeout=30s",
        ])
        .output();
    let waiter = tokio::spawn(waiter);
    tokio::time::sleep(Duration::from_millis(500)).await;
    kubectl
        .ok(&["patch", "ws", "alice-dev", "--subresource=status", "--type=merge", "-p",
            r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","reason":"WorkspaceReady","message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#])
        .await;
    let waited = waiter.await.unwrap().unwrap();
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert!(String::from_utf8_lossy(&waited.stdout).contains("condition met"));
    let table = kubectl.ok(&["get", "ws", "alice-dev"]).await;
    assert!(
        table
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()[1..3]
            == ["Running", "True"],
        "{table}"
    );

    // delete --wait blocks on a finalizer and returns once it is removed.
    kubectl
        .ok(&[
            "patch",
            "ws",
            "alice-dev",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["berth.dev/cleanup"]}}"#,
        ])
        .await;
    let deleter = tokio::spawn(
        kubectl
            .command(&["delete", "ws", "alice-dev", "--wait", "--timeout=30s"])
            .output(),
    );
    crate::support::eventually(
        Duration::from_secs(10),
        "the deletion timestamp",
        || async {
            kubectl
                .ok(&[
                    "get",
                    "ws",
                    "alice-dev",
                    "-o",
                    "jsonpath={.metadata.deletionTimestamp}",
                ])
                .await
                .trim()
                .is_empty()
                .eq(&false)
                .then_some(())
        },
    )
    .await;
    assert!(
        !deleter.is_finished(),
        "delete --wait waits for the finalizer"
    );
    kubectl
        .ok(&[
            "patch",
            "ws",
            "alice-dev",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ])
        .await;
    let deleted = deleter.await.unwrap().unwrap();
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    assert!(
        kubectl
            .fails(&["get", "ws", "alice-dev"])
            .await
            .contains("NotFound")
    );
}

#[tokio::test]
async fn kubectl_get_watch_reads_events() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    kubectl
        .ok(&["create", "configmap", "first", "--from-literal=a=b"])
        .await;
    let watcher = tokio::spawn(
        kubectl
            .command(&["get", "configmaps", "-w", "--request-timeout=4s"])
            .output(),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kubectl
        .ok(&["create", "configmap", "second", "--from-literal=a=b"])
        .await;
    kubectl.ok(&["label", "configmap", "second", "x=y"]).await;
    let output = watcher.await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("NAME")).collect();
    assert!(rows.iter().any(|l| l.starts_with("first")), "{stdout}");
    assert!(
        rows.iter().filter(|l| l.starts_with("second")).count() >= 2,
        "the watch printed the create and the label:\n{stdout}"
    );
}

#[tokio::test]
async fn kubectl_auth_can_i_as_a_service_account() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    kubectl.ok(&["create", "serviceaccount", "dev"]).await;
    let sa = "--as=system:serviceaccount:default:dev";
    let output = kubectl.run(&["auth", "can-i", "list", "pods", sa]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "no");
    kubectl
        .ok(&[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=pods",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "rolebinding",
            "dev-reader",
            "--role=reader",
            "--serviceaccount=default:dev",
        ])
        .await;
    assert_eq!(
        kubectl
            .ok(&["auth", "can-i", "list", "pods", sa])
            .await
            .trim(),
        "yes"
    );
    let output = kubectl.run(&["auth", "can-i", "delete", "pods", sa]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "no");
    let output = kubectl
        .run(&[
            "auth",
            "can-i",
            "create",
            "tokenreviews.authentication.k8s.io",
            sa,
        ])
        .await;
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "no");
    kubectl
        .ok(&[
            "create",
            "clusterrolebinding",
            "dev-delegator",
            "--clusterrole=system:auth-delegator",
            "--serviceaccount=default:dev",
        ])
        .await;
    assert_eq!(
        kubectl
            .ok(&[
                "auth",
                "can-i",
                "create",
                "tokenreviews.authentication.k8s.io",
                sa
            ])
            .await
            .trim(),
        "yes"
    );

    // `--list`: a SelfSubjectRulesReview, with the Role's rules and the ClusterRole's.
    let list = kubectl.ok(&["auth", "can-i", "--list", sa]).await;
    let header: Vec<&str> = list.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "Resources",
            "Non-Resource",
            "URLs",
            "Resource",
            "Names",
            "Verbs"
        ]
    );
    let row = |resource: &str| {
        list.lines()
            .find(|l| l.split_whitespace().next() == Some(resource))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("no {resource} in:\n{list}"))
    };
    assert_eq!(row("pods"), "pods [] [] [get list]");
    assert_eq!(
        row("tokenreviews.authentication.k8s.io"),
        "tokenreviews.authentication.k8s.io [] [] [create]"
    );
    let elsewhere = kubectl
        .ok(&["auth", "can-i", "--list", sa, "-n", "kube-system"])
        .await;
    assert!(
        !elsewhere.lines().any(|l| l.starts_with("pods ")),
        "the Role is the default namespace's only:\n{elsewhere}"
    );
}

async fn jsonpath(kubectl: &Kubectl, args: &[&str], path: &str) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let expr = format!("jsonpath={path}");
    all.extend(["-o", expr.as_str()]);
    kubectl.ok(&all).await
}

#[tokio::test]
async fn kubectl_drives_faults() {
    let sim = crate::nodes::started_cluster_for_kubectl().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let nodes = kubectl.ok(&["get", "nodes"]).await;
    assert!(
        nodes
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{nodes}"
    );
    assert_eq!(
        nodes.lines().filter(|l| l.contains(" Ready ")).count(),
        3,
        "{nodes}"
    );

    // Rejection through a node annotation, used up as pods are admitted.
    kubectl
        .ok(&[
            "annotate",
            "node",
            "node-1",
            "sim.berth.dev/reject-next=1:OutOfcpu",
        ])
        .await;
    let pinned = |name: &str, node: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: {node}\n  containers: [{{name: main, image: nginx:1.27}}]\n"
        )
    };
    kubectl
        .apply_stdin(&["create", "-f", "-"], &pinned("rejected", "node-1"))
        .await;
    crate::support::eventually(Duration::from_secs(15), "the rejection", || async {
        (jsonpath(
            &kubectl,
            &["get", "pod", "rejected"],
            "{.status.phase}/{.status.reason}",
        )
        .await
            == "Failed/OutOfcpu")
            .then_some(())
    })
    .await;
    let annotations = jsonpath(
        &kubectl,
        &["get", "node", "node-1"],
        "{.metadata.annotations}",
    )
    .await;
    assert!(
        !annotations.contains("reject-next"),
        "the annotation was used up: {annotations}"
    );
    kubectl
        .apply_stdin(&["create", "-f", "-"], &pinned("admitted", "node-1"))
        .await;
    crate::support::eventually(Duration::from_secs(15), "the next pod to run", || async {
        (jsonpath(&kubectl, &["get", "pod", "admitted"], "{.status.phase}").await == "Running")
            .then_some(())
    })
    .await;

    // Node deletion takes its pods with it.
    kubectl
        .apply_stdin(&["create", "-f", "-"], &pinned("doomed", "node-2"))
        .await;
    crate::support::eventually(
        Duration::from_secs(15),
        "the pod on node-2 to run",
        || async {
            (jsonpath(&kubectl, &["get", "pod", "doomed"], "{.status.phase}").await == "Running")
                .then_some(())
        },
    )
    .await;
    kubectl.ok(&["delete", "node", "node-2"]).await;
    crate::support::eventually(
        Duration::from_secs(15),
        "the pod to go with its node",
        || async {
            kubectl
                .run(&["get", "pod", "doomed"])
                .await
                .status
                .success()
                .eq(&false)
                .then_some(())
        },
    )
    .await;

    // Cluster-wide faults through the ConfigMap.
    kubectl
        .ok(&[
            "create",
            "configmap",
            "berth-sim-faults",
            "-n",
            "kube-system",
            "--from-literal=api-errors=create secrets 503 next=1",
        ])
        .await;
    let refused =
        crate::support::eventually(Duration::from_secs(15), "the injected 503", || async {
            let output = kubectl
                .run(&["create", "secret", "generic", "s", "--from-literal=a=b"])
                .await;
            (!output.status.success()).then(|| String::from_utf8_lossy(&output.stderr).into_owned())
        })
        .await;
    assert!(
        refused.contains("the server is currently unable to handle the request"),
        "{refused}"
    );
    kubectl
        .ok(&["create", "secret", "generic", "s2", "--from-literal=a=b"])
        .await;
}

/// kubectl validates strictly by default: a typo in a built-in object is an error naming the
/// field, from the server.
#[tokio::test]
async fn kubectl_create_refuses_an_unknown_field_of_a_pod() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: typo}\nspec:\n  containers: [{name: c, image: x:1, imagePullPolicy: Always, imagePullPolcy: Never}]\n",
    )
    .unwrap();
    let stderr = kubectl
        .fails(&["create", "-f", file.to_str().unwrap()])
        .await;
    assert!(
        stderr.contains("Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].imagePullPolcy\""),
        "{stderr}"
    );
}

/// `kubectl get` shows config maps, secrets and service accounts with the real server's
/// columns.
#[tokio::test]
async fn kubectl_get_shows_the_real_columns_of_config_maps_secrets_and_accounts() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    kubectl
        .ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=a=1",
            "--from-literal=b=2",
        ])
        .await;
    kubectl
        .ok(&["create", "secret", "generic", "token", "--from-literal=t=x"])
        .await;
    kubectl.ok(&["create", "serviceaccount", "builder"]).await;
    let maps = words(&kubectl.ok(&["get", "configmap", "settings"]).await);
    assert_eq!(maps[0], ["NAME", "DATA", "AGE"]);
    assert_eq!(maps[1][..2], ["settings", "2"]);
    let secrets = words(&kubectl.ok(&["get", "secret", "token"]).await);
    assert_eq!(secrets[0], ["NAME", "TYPE", "DATA", "AGE"]);
    assert_eq!(secrets[1][..3], ["token", "Opaque", "1"]);
    let accounts = words(&kubectl.ok(&["get", "serviceaccount", "builder"]).await);
    assert_eq!(accounts[0], ["NAME", "SECRETS", "AGE"]);
    assert_eq!(accounts[1][..2], ["builder", "0"]);
}

#[tokio::test]
async fn kubectl_get_shows_the_real_columns_of_workloads_and_an_external_name() {
    let sim = crate::support::cluster_with_nodes().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    kubectl
        .ok(&[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.27",
            "--replicas=2",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "service",
            "externalname",
            "docs",
            "--external-name=docs.example.com",
        ])
        .await;
    kubectl
        .ok(&["rollout", "status", "deployment/web", "--timeout=30s"])
        .await;
    let deployments = words(&kubectl.ok(&["get", "deployment", "web"]).await);
    assert_eq!(
        deployments[0],
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    assert_eq!(deployments[1][..4], ["web", "2/2", "2", "2"]);
    let sets = words(&kubectl.ok(&["get", "replicasets"]).await);
    assert_eq!(sets[0], ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    assert_eq!(sets[1][1..4], ["2", "2", "2"]);
    let services = words(&kubectl.ok(&["get", "service", "docs"]).await);
    assert_eq!(
        services[1][..4],
        ["docs", "ExternalName", "<none>", "docs.example.com"]
    );
}

/// NetworkPolicies are served and validated (not enforced): the per-namespace policy of
/// `deploy/workspace-namespace/` applies with `kubectl apply -k`, and a bad one is refused in
/// the real server's words.
#[tokio::test]
async fn kubectl_applies_the_workspace_namespace_network_policy() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/workspace-namespace"
    );
    kubectl.ok(&["create", "namespace", "team-a"]).await;
    kubectl.ok(&["apply", "-n", "team-a", "-k", dir]).await;
    let ports = jsonpath(
        &kubectl,
        &["-n", "team-a", "get", "networkpolicy", "berth-agent"],
        "{.spec.ingress[0].ports[0].port}",
    )
    .await;
    assert_eq!(ports, "50051");
    // The stricter choice replaces it: every port only from the gateway (and the operator).
    let strict = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/workspace-namespace-gateway-only"
    );
    kubectl.ok(&["apply", "-n", "team-a", "-k", strict]).await;
    let sources = jsonpath(
        &kubectl,
        &["-n", "team-a", "get", "networkpolicy", "berth-agent"],
        "{range .spec.ingress[*]}{.from[0].podSelector.matchLabels.app\\.kubernetes\\.io/name}:{.ports[0].port};{end}",
    )
    .await;
    assert_eq!(sources, "berth-controller:50051;berth-gateway:;");
    let stderr = kubectl
        .fails_with_input(
            &["-n", "team-a", "create", "-f", "-"],
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad}\nspec:\n  podSelector: {}\n  ingress: [{ports: [{port: 80, endPort: 10}]}]\n",
        )
        .await;
    assert!(
        stderr.contains("spec.ingress[0].ports[0].endPort: Invalid value: 10: must be greater than or equal to `port`"),
        "{stderr}"
    );
}

/// `kubectl debug` of a pod that is not there: the 404 carries details as the real server's
/// (kubectl 1.27 to 1.33 read `details.name` of it and panicked without), so kubectl says
/// what it means instead of crashing.
#[tokio::test]
async fn kubectl_debug_says_what_is_missing_instead_of_panicking() {
    let sim = crate::support::cluster_with_nodes().await;
    for version in ["1.27", "1.33"] {
        let Some(kubectl) = Kubectl::version(&sim, version) else {
            return;
        };
        let stderr = kubectl
            .fails(&["debug", "nowhere", "--image=busybox:1.36"])
            .await;
        assert!(!stderr.contains("panic"), "kubectl {version}: {stderr}");
        assert!(
            stderr.contains("pods \"nowhere\" not found"),
            "kubectl {version}: {stderr}"
        );
    }
}

/// `kubectl get` shows leases, claims, disruption budgets and role bindings with the real
/// server's columns (wide ones with `-o wide`).
#[tokio::test]
async fn kubectl_get_shows_the_real_columns_of_leases_claims_budgets_and_bindings() {
    let sim = crate::support::cluster_with_nodes().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let manifest = "apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: leader}
spec: {holderIdentity: replica-a}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: home}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects:
  - {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
  - {kind: Group, name: devs, apiGroup: rbac.authorization.k8s.io}
  - {kind: ServiceAccount, name: builder, namespace: default}
";
    kubectl
        .run_with_input(&["apply", "-f", "-"], manifest)
        .await;
    let leases = words(&kubectl.ok(&["get", "lease", "leader"]).await);
    assert_eq!(leases[0], ["NAME", "HOLDER", "AGE"]);
    assert_eq!(leases[1][..2], ["leader", "replica-a"]);
    let budgets = words(&kubectl.ok(&["get", "pdb", "web"]).await);
    assert_eq!(
        budgets[0],
        [
            "NAME",
            "MIN",
            "AVAILABLE",
            "MAX",
            "UNAVAILABLE",
            "ALLOWED",
            "DISRUPTIONS",
            "AGE"
        ]
    );
    assert_eq!(budgets[1][..3], ["web", "1", "N/A"]);
    let bindings = words(
        &kubectl
            .ok(&["get", "rolebinding", "readers", "-o", "wide"])
            .await,
    );
    assert_eq!(
        bindings[0],
        ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"]
    );
    assert_eq!(bindings[1][..2], ["readers", "ClusterRole/view"]);
    assert_eq!(bindings[1][3..], ["alice", "devs", "default/builder"]);
    let claim = crate::support::eventually(Duration::from_secs(20), "the claim bound", || async {
        let row = words(&kubectl.ok(&["get", "pvc", "home"]).await);
        (row[1][1] == "Bound").then_some(row)
    })
    .await;
    assert_eq!(
        claim[0],
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ]
    );
    assert_eq!(claim[1][3..5], ["1Gi", "RWO"]);
    assert_eq!(claim[1][6], "<unset>");
}

/// A table kubectl printed, as its rows' words.
fn words(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// `kubectl get componentstatuses` (deprecated, still served): the control plane's components,
/// healthy, with the real columns and the server's deprecation warning; they can only be read.
#[tokio::test]
async fn component_statuses_are_read_only_and_say_they_are_deprecated() {
    let sim = crate::support::cluster_with_nodes().await;
    for version in ["1.27", "1.33"] {
        let Some(kubectl) = Kubectl::version(&sim, version) else {
            return;
        };
        let shown = kubectl.run(&["get", "componentstatuses"]).await;
        assert!(shown.status.success(), "kubectl {version}: {shown:?}");
        let table = String::from_utf8_lossy(&shown.stdout);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0], ["NAME", "STATUS", "MESSAGE", "ERROR"], "{table}");
        assert!(
            rows.contains(&vec!["scheduler", "Healthy", "ok"]),
            "{table}"
        );
        assert!(rows.contains(&vec!["etcd-0", "Healthy", "ok"]), "{table}");
        assert!(
            String::from_utf8_lossy(&shown.stderr)
                .contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
            "kubectl {version}: {shown:?}"
        );
        let refused = kubectl.fails(&["delete", "cs", "scheduler"]).await;
        assert!(
            refused.contains("the server does not allow this method on the requested resource"),
            "kubectl {version}: {refused}"
        );
    }
}
