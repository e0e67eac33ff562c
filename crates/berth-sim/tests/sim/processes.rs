//! Containers that really run (`ProcessRuntime`): their command as a process with its env,
//! working directory and volumes; claims that hold files across pods; exec and port-forward
//! through kube-rs and kubectl, authorized as the real server authorizes them.

use std::{sync::Arc, time::Duration};

use berth_sim::{ProcessRuntime, SimCluster, SimConfig};
use k8s_openapi::api::{
    core::v1::{ConfigMap, PersistentVolumeClaim, Pod},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api,
    api::{AttachParams, DeleteParams, LogParams, PostParams},
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{kubectl::Kubectl, support::*};

/// A cluster whose containers are processes, with the runtime and its data folder; None
/// (after saying why) where this machine allows no mount namespace.
async fn process_cluster() -> Option<(SimCluster, ProcessRuntime, tempfile::TempDir)> {
    let data = tempfile::tempdir().unwrap();
    let runtime = ProcessRuntime::new(data.path());
    if let Err(why) = runtime.check_isolation().await {
        if std::env::var("BERTH_REQUIRE_PROCESSES").as_deref() == Ok("1") {
            panic!("containers must run as processes here (BERTH_REQUIRE_PROCESSES=1): {why}");
        }
        eprintln!("skipped: {why}; set BERTH_REQUIRE_PROCESSES=1 to make this a failure");
        return None;
    }
    let sim = cluster_with(SimConfig {
        runtime: Arc::new(runtime.clone()),
        max_pod_grace: Duration::from_secs(2),
        ..SimConfig::fast()
    })
    .await;
    Some((sim, runtime, data))
}

async fn create<K>(client: &kube::Client, object: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::default_namespaced(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(object).unwrap(),
        )
        .await
        .unwrap()
}

/// A pod of one container `main` running `script` in sh.
fn shell_pod(name: &str, script: &str, extra: Value) -> Value {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}]
        }
    });
    if let (Some(container), Some(extra)) = (
        pod["spec"]["containers"][0].as_object_mut(),
        extra.as_object(),
    ) {
        container.extend(extra.clone());
    }
    pod
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(
        Duration::from_secs(20),
        &format!("{name} running"),
        || async {
            let pod = pods.get(name).await.ok()?;
            let started = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .all(|s| s.state.as_ref().is_some_and(|s| s.running.is_some()));
            started.then_some(pod)
        },
    )
    .await
}

async fn log_contains(pods: &Api<Pod>, name: &str, text: &str) -> String {
    eventually(
        Duration::from_secs(20),
        &format!("{name}'s log saying {text:?}"),
        || async {
            let log = pods.logs(name, &LogParams::default()).await.ok()?;
            log.contains(text).then_some(log)
        },
    )
    .await
}

/// Runs `command` in `pod` through kube-rs's exec: (stdout, stderr, status).
async fn exec(
    pods: &Api<Pod>,
    pod: &str,
    command: &[&str],
    input: Option<&str>,
) -> (
    String,
    String,
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Status,
) {
    let params = AttachParams::default()
        .stdin(input.is_some())
        .stdout(true)
        .stderr(true);
    let mut process = pods.exec(pod, command.to_vec(), &params).await.unwrap();
    if let Some(input) = input {
        let mut stdin = process.stdin().unwrap();
        stdin.write_all(input.as_bytes()).await.unwrap();
        // kube-rs tells the end of stdin (v5's close of channel 0) on shutdown, not on drop.
        stdin.shutdown().await.unwrap();
    }
    let (mut out, mut err) = (String::new(), String::new());
    let mut stdout = process.stdout().unwrap();
    let mut stderr = process.stderr().unwrap();
    let status = process.take_status().unwrap();
    let (_, _, status) = tokio::join!(
        stdout.read_to_string(&mut out),
        stderr.read_to_string(&mut err),
        status
    );
    process.join().await.unwrap();
    (out, err, status.expect("a status"))
}

#[tokio::test]
async fn a_container_runs_its_command_with_its_env_working_dir_and_volumes() {
    let Some((sim, runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<ConfigMap>(
        &client,
        json!({"metadata": {"name": "settings"}, "data": {"greeting": "hello"}}),
    )
    .await;
    let claim: PersistentVolumeClaim = create(&client, json!({
        "metadata": {"name": "home"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .await;
    let mut writer = shell_pod(
        "writer",
        "echo \"$(cat /etc/app/greeting) from $(pwd) as $ME\" | tee /home/dev/note; echo scratch > /scratch/x; echo $(WHO) expanded; exec sleep 3600",
        json!({
            "workingDir": "/work",
            "env": [{"name": "WHO", "value": "dev"}, {"name": "ME", "value": "$(WHO)-1"}],
            "volumeMounts": [
                {"name": "home", "mountPath": "/home/dev"},
                {"name": "config", "mountPath": "/etc/app"},
                {"name": "scratch", "mountPath": "/scratch"}
            ]
        }),
    );
    writer["spec"]["volumes"] = json!([
        {"name": "home", "persistentVolumeClaim": {"claimName": "home"}},
        {"name": "config", "configMap": {"name": "settings"}},
        {"name": "scratch", "emptyDir": {}}
    ]);
    create::<Pod>(&client, writer).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "writer").await;
    log_contains(&pods, "writer", "hello from /work as dev-1").await;
    // `$(WHO)` in the command is the kubelet's to expand, before the shell sees it.
    log_contains(&pods, "writer", "dev expanded").await;

    // What a developer sees with exec: the files, the environment, the exit status.
    let (out, _, status) = exec(
        &pods,
        "writer",
        &["cat", "/home/dev/note", "/scratch/x"],
        None,
    )
    .await;
    assert_eq!(out, "hello from /work as dev-1\nscratch\n");
    assert_eq!(status.status.as_deref(), Some("Success"));
    let (out, _, _) = exec(
        &pods,
        "writer",
        &["sh", "-c", "echo $ME in $(pwd); cat"],
        Some("typed"),
    )
    .await;
    assert_eq!(out, "dev-1 in /work\ntyped");
    let (_, err, status) = exec(
        &pods,
        "writer",
        &["sh", "-c", "echo oops >&2; exit 3"],
        None,
    )
    .await;
    assert_eq!(err, "oops\n");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let cause = &status.details.unwrap().causes.unwrap()[0];
    assert_eq!(
        (cause.reason.as_deref(), cause.message.as_deref()),
        (Some("ExitCode"), Some("3"))
    );
    let (_, _, status) = exec(&pods, "writer", &["no-such-program"], None).await;
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("exec: \"no-such-program\": executable file not found in $PATH"),
        "{status:?}"
    );
    // A volume inside /etc leaves the rest of the host's /etc (which stands in for the
    // image's) in place.
    let (_, _, status) = exec(&pods, "writer", &["test", "-r", "/etc/passwd"], None).await;
    assert_eq!(status.status.as_deref(), Some("Success"));
    // A configured volume is read-only, as the kubelet mounts it.
    let (_, err, status) = exec(
        &pods,
        "writer",
        &["sh", "-c", "echo x > /etc/app/greeting"],
        None,
    )
    .await;
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"), "{err}");

    // The claim's files outlive the pod and reach a pod on any node.
    pods.delete("writer", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "writer gone", || async {
        pods.get_opt("writer")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let mut reader = shell_pod(
        "reader",
        "cat /home/dev/note; ls /scratch; exec sleep 3600",
        json!({"volumeMounts": [
            {"name": "home", "mountPath": "/home/dev"},
            {"name": "scratch", "mountPath": "/scratch"}
        ]}),
    );
    reader["spec"]["volumes"] = json!([
        {"name": "home", "persistentVolumeClaim": {"claimName": "home"}},
        {"name": "scratch", "emptyDir": {}}
    ]);
    create::<Pod>(&client, reader).await;
    let log = log_contains(&pods, "reader", "hello from /work as dev-1").await;
    assert!(!log.contains('x'), "an emptyDir is the pod's own: {log}");

    // Deleting the claim deletes its files.
    let folder = runtime.claim_dir(claim.metadata.uid.as_deref().unwrap());
    assert!(folder.join("note").exists());
    pods.delete("reader", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "reader gone", || async {
        pods.get_opt("reader")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    Api::<PersistentVolumeClaim>::default_namespaced(client.clone())
        .delete("home", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the claim's folder gone",
        || async { (!folder.exists()).then_some(()) },
    )
    .await;
}

/// The processes running `sleep <marker>`.
fn processes_with(marker: &str) -> usize {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted.as_bytes()))
        .count()
}

/// A container runs as its image's user (nobody) unless its security context names another,
/// never as the sim's own user: where the sim runs as root, a workspace cannot read the
/// machine's processes (berth dev's environment, its files through /proc) and has no
/// capabilities; a set-user-ID program never makes it root (no new privileges).
#[tokio::test]
async fn a_container_never_runs_as_the_sims_own_user() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<Pod>(&client, shell_pod("plain", "exec sleep 3600", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "plain").await;
    let (out, _, _) = exec(
        &pods,
        "plain",
        &["sh", "-c", "grep NoNewPrivs /proc/self/status"],
        None,
    )
    .await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["NoNewPrivs:", "1"]
    );
    // Every signal at its default and none blocked, whatever the sim inherited (a test run
    // under nohup ignores SIGHUP).
    // SAFETY: ignoring SIGHUP in this test process, as nohup does.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    create::<Pod>(
        &client,
        shell_pod(
            "signals",
            "grep -E '^Sig(Ign|Blk):' /proc/self/status; sleep 3600",
            json!({}),
        ),
    )
    .await;
    running(&pods, "signals").await;
    let said = log_contains(&pods, "signals", "SigIgn").await;
    let lines: Vec<Vec<&str>> = said
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(standard_signals(&lines[0]), ("SigBlk:", 0), "{said}");
    assert_eq!(standard_signals(&lines[1]), ("SigIgn:", 0), "{said}");
    let sim_is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !sim_is_root {
        return;
    }
    let (out, _, _) = exec(&pods, "plain", &["id", "-u"], None).await;
    assert_eq!(out.trim(), "65534", "the image's user");
    let (out, _, _) = exec(
        &pods,
        "plain",
        &["sh", "-c", "grep CapEff /proc/self/status"],
        None,
    )
    .await;
    // Nothing but binding low ports (a runtime's default NET_BIND_SERVICE).
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["CapEff:", "0000000000000400"]
    );
    // The sim's own process (this test's) is not readable: its environment, its files.
    let me = std::process::id().to_string();
    let (_, err, status) = exec(
        &pods,
        "plain",
        &[
            "sh",
            "-c",
            &format!("cat /proc/{me}/environ && ls /proc/{me}/root/"),
        ],
        None,
    )
    .await;
    assert_eq!(status.status.as_deref(), Some("Failure"), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    // A security context that names a user is honoured.
    create::<Pod>(
        &client,
        shell_pod(
            "named",
            "exec sleep 3600",
            json!({"securityContext": {"runAsUser": 1234}}),
        ),
    )
    .await;
    running(&pods, "named").await;
    let (out, _, _) = exec(&pods, "named", &["id", "-u"], None).await;
    assert_eq!(out.trim(), "1234");
}

#[tokio::test]
async fn no_process_outlives_its_pod_even_one_that_ignores_sigterm() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let marker = format!("{}.25", 4000 + std::process::id() % 1000);
    create::<Pod>(
        &client,
        shell_pod(
            "stubborn",
            &format!("trap '' TERM; sleep {marker} & sleep {marker} & wait; wait"),
            json!({}),
        ),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "stubborn").await;
    eventually(Duration::from_secs(10), "both sleeps running", || async {
        (processes_with(&marker) == 2).then_some(())
    })
    .await;
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "the pod gone", || async {
        pods.get_opt("stubborn")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(processes_with(&marker), 0, "a process outlived its pod");
}

/// Sets the terminal of `process` to 100 columns and 30 rows, as a client's resize does.
async fn set_size(process: &mut kube::api::AttachedProcess) {
    let mut size = process.terminal_size().unwrap();
    futures::SinkExt::send(
        &mut size,
        kube::api::TerminalSize {
            width: 100,
            height: 30,
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_terminal_has_a_size_the_client_sets() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<Pod>(&client, shell_pod("term", "exec sleep 3600", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "term").await;
    let params = AttachParams::interactive_tty();
    let mut process = pods
        .exec(
            "term",
            vec!["sh", "-c", "read go; tty; stty size; echo TERM=$TERM"],
            &params,
        )
        .await
        .unwrap();
    set_size(&mut process).await;
    let mut stdin = process.stdin().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stdin.write_all(b"go\n").await.unwrap();
    let mut out = String::new();
    process
        .stdout()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("30 100"), "{out}");
    // A terminal's process knows what it is, as a container runtime tells it.
    assert!(out.contains("TERM=xterm"), "{out}");
}

#[tokio::test]
async fn exec_needs_create_on_pods_exec_as_on_a_real_server() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let admin = sim.client().await.unwrap();
    create::<Pod>(&admin, shell_pod("p", "exec sleep 3600", json!({}))).await;
    running(&Api::default_namespaced(admin.clone()), "p").await;
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::default_namespaced(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev"}})).unwrap(),
        )
        .await
        .unwrap();
    let token = sim
        .issue_token("default", "dev", &[], Duration::from_secs(600))
        .unwrap();
    let as_dev: Api<Pod> = Api::default_namespaced(sim.client_with_token(&token).await.unwrap());
    let refused = |verb: &str| {
        format!(
            "pods \"p\" is forbidden: User \"system:serviceaccount:default:dev\" cannot {verb} resource \"pods/exec\" in API group \"\" in the namespace \"default\""
        )
    };
    let params = AttachParams::default();
    let attempt = || as_dev.exec("p", vec!["true"], &params);
    let message = |result: Result<kube::api::AttachedProcess, kube::Error>| match result {
        Err(kube::Error::UpgradeConnection(e)) => e.to_string(),
        Err(e) => e.to_string(),
        Ok(_) => panic!("exec allowed"),
    };
    let first = message(attempt().await);
    assert!(
        first.contains(&refused("get")) && first.contains("403"),
        "{first}"
    );
    // Read access to pods/exec is not enough: since 1.30 a WebSocket exec also needs create.
    create::<Role>(&admin, json!({"metadata": {"name": "exec-get"}, "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}]})).await;
    create::<RoleBinding>(&admin, json!({"metadata": {"name": "exec-get"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec-get"}, "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": "default"}]})).await;
    let second = eventually(Duration::from_secs(5), "the get rule in force", || async {
        let m = message(attempt().await);
        m.contains(&refused("create")).then_some(m)
    })
    .await;
    assert!(second.contains("403"), "{second}");
    create::<Role>(&admin, json!({"metadata": {"name": "exec"}, "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]})).await;
    create::<RoleBinding>(&admin, json!({"metadata": {"name": "exec"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec"}, "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": "default"}]})).await;
    eventually(Duration::from_secs(5), "exec allowed", || async {
        let mut process = attempt().await.ok()?;
        let status = process.take_status()?;
        process.join().await.ok()?;
        status
            .await
            .filter(|s| s.status.as_deref() == Some("Success"))
    })
    .await;
}

#[tokio::test]
async fn port_forward_reaches_the_pods_port_or_says_why_not() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<Pod>(&client, shell_pod("server", "exec sleep 3600", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod = running(&pods, "server").await;
    let ip = pod.status.unwrap().pod_ip.unwrap();
    // The pod's own server: on its IP, as a container binds it.
    let listener = tokio::net::TcpListener::bind((ip.as_str(), 8080))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4];
                if socket.read_exact(&mut buffer).await.is_ok() {
                    let _ = socket.write_all(b"pong").await;
                }
            });
        }
    });
    let mut forwarder = pods.portforward("server", &[8080, 8081]).await.unwrap();
    let mut stream = forwarder.take_stream(8080).unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"pong");
    let error = forwarder
        .take_error(8081)
        .unwrap()
        .await
        .expect("an error for the closed port");
    assert!(
        error.contains("error forwarding port 8081 to pod server") && error.contains("refused"),
        "{error}"
    );
}

/// A pod server on `ip:port` that answers each `ping` with `pong` (one connection, many).
async fn serve_pong(ip: &str, port: u16) {
    let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4];
                while socket.read_exact(&mut buffer).await.is_ok() {
                    if socket.write_all(b"pong").await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// The local ports `kubectl port-forward` says it listens on, in the order of its lines
/// `Forwarding from 127.0.0.1:LOCAL -> REMOTE`.
async fn forwarding(child: &mut tokio::process::Child, count: usize) -> Vec<u16> {
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut ports = vec![];
    while ports.len() < count {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("kubectl says where it forwards from")
            .unwrap()
            .expect("kubectl port-forward keeps running");
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            ports.push(rest.split(' ').next().unwrap().parse().unwrap());
        }
    }
    // Keep reading, so kubectl never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    ports
}

/// kubectl 1.33 tunnels port-forward's SPDY through WebSocket; kubectl 1.27 upgrades to
/// SPDY. Either way each local connection reaches the pod's port, and a closed port is
/// reported in the kubelet's words.
#[tokio::test]
async fn kubectl_port_forward_reaches_the_pod_tunnelled_or_over_spdy() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<Pod>(&client, shell_pod("server", "exec sleep 3600", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let ip = running(&pods, "server")
        .await
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    serve_pong(&ip, 8080).await;
    for version in ["1.33", "1.27"] {
        let Some(kubectl) = Kubectl::version(&sim, version) else {
            continue;
        };
        let mut child = kubectl.spawn(&["port-forward", "pod/server", ":8080", ":8081"]);
        let local = forwarding(&mut child, 2).await;
        for _ in 0..2 {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", local[0]))
                .await
                .unwrap();
            for _ in 0..3 {
                stream.write_all(b"ping").await.unwrap();
                let mut answer = [0u8; 4];
                tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut answer))
                    .await
                    .unwrap_or_else(|_| panic!("kubectl {version}: no answer through the forward"))
                    .unwrap();
                assert_eq!(&answer, b"pong", "kubectl {version}");
            }
        }
        // Nothing listens on 8081: kubectl says why, in the kubelet's words.
        let mut refused = tokio::net::TcpStream::connect(("127.0.0.1", local[1]))
            .await
            .unwrap();
        let mut rest = vec![];
        let _ = tokio::time::timeout(Duration::from_secs(10), refused.read_to_end(&mut rest)).await;
        child.start_kill().unwrap();
        let output = child.wait_with_output().await.unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("error forwarding port 8081 to pod server")
                && stderr.contains("connection refused"),
            "kubectl {version}: {stderr}"
        );
    }
}

/// kubectl exec as a person uses it, over the protocol each kubectl speaks (WebSocket for the
/// kubectl on PATH, SPDY for 1.27): output on both streams, input to its end, the exit code,
/// the API server's refusal and the kubelet's error in their words, cp both ways, and output
/// much larger than any buffer on the way.
#[tokio::test]
async fn kubectl_exec_carries_output_input_and_the_exit_code() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<Pod>(&client, shell_pod("box", "exec sleep 3600", json!({}))).await;
    running(&Api::default_namespaced(client.clone()), "box").await;
    let clients = [Kubectl::for_cluster(&sim), Kubectl::version(&sim, "1.27")];
    for kubectl in clients.iter().flatten() {
        exec_as_a_person_does(kubectl).await;
    }
}

async fn exec_as_a_person_does(kubectl: &Kubectl) {
    let output = kubectl
        .run_with_input(
            &[
                "exec",
                "box",
                "--",
                "sh",
                "-c",
                "echo hi; echo oops >&2; exit 3",
            ],
            "",
        )
        .await;
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hi\n");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("oops"),
        "{output:?}"
    );
    let output = kubectl
        .run_with_input(
            &["exec", "-i", "box", "--", "sh", "-c", "cat; echo done"],
            "typed\n",
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "typed\ndone\n",
        "{output:?}"
    );
    assert!(output.status.success());
    // A request the API server refuses says why, also after kubectl falls back from
    // WebSocket to SPDY.
    let output = kubectl
        .run_with_input(&["exec", "box", "-c", "nope", "--", "true"], "")
        .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("container nope is not valid for pod box"),
        "{stderr}"
    );
    let output = kubectl
        .run_with_input(&["exec", "box", "--", "no-such-program"], "")
        .await;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("error: Internal error occurred: error executing command in container")
            && stderr.contains("executable file not found in $PATH"),
        "{stderr}"
    );
    // cp is exec with tar, both ways.
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("hello.txt");
    std::fs::write(&local, "copied\n").unwrap();
    kubectl
        .ok(&["cp", local.to_str().unwrap(), "box:/tmp/hello.txt"])
        .await;
    let output = kubectl
        .run_with_input(&["exec", "box", "--", "cat", "/tmp/hello.txt"], "")
        .await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "copied\n");
    let back = dir.path().join("back.txt");
    kubectl
        .ok(&["cp", "box:/tmp/hello.txt", back.to_str().unwrap()])
        .await;
    assert_eq!(std::fs::read_to_string(back).unwrap(), "copied\n");
    // Output much larger than any buffer on the way arrives whole.
    let output = kubectl
        .run_with_input(
            &["exec", "box", "--", "head", "-c", "1000000", "/dev/zero"],
            "",
        )
        .await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout.len(), 1_000_000);
}

/// A pod's HTTP server on its IP: answers with the path it was asked for and whether the
/// request carried credentials.
async fn serve_http(ip: &str, port: u16) {
    let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && socket.read_exact(&mut byte).await.is_ok() {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_lowercase();
                let path = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let body = format!("{path} credentials={}", head.contains("authorization:"));
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
}

#[tokio::test]
async fn the_proxy_subresources_reach_a_pods_port_directly_and_through_its_service() {
    let sim = cluster_with(SimConfig::fast()).await;
    let client = sim.client().await.unwrap();
    let mut web = shell_pod(
        "web",
        "exec sleep 3600",
        json!({"ports": [{"name": "http", "containerPort": 8080}]}),
    );
    web["metadata"]["labels"] = json!({"app": "web"});
    create::<Pod>(&client, web).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let ip = eventually(Duration::from_secs(20), "web ready", || async {
        let pod = pods.get("web").await.ok()?;
        let status = pod.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(status.pod_ip?)
    })
    .await;
    serve_http(&ip, 8080).await;
    create::<k8s_openapi::api::core::v1::Service>(&client, json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "api", "port": 80, "targetPort": "http"}]}
    }))
    .await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    // The README's line for the operator's metrics, the same through the Service, and a
    // port by its name.
    for (path, answer) in [
        (
            "/api/v1/namespaces/default/pods/web:8080/proxy/metrics?x=1",
            "/metrics?x=1 credentials=false",
        ),
        (
            "/api/v1/namespaces/default/services/web:api/proxy/healthz",
            "/healthz credentials=false",
        ),
        (
            "/api/v1/namespaces/default/pods/web:http/proxy/",
            "/ credentials=false",
        ),
    ] {
        assert_eq!(kubectl.ok(&["get", "--raw", path]).await, answer, "{path}");
    }
    // The request log has them as what RBAC checked: `get` on pods/proxy, services/proxy.
    let proxied = |resource: &'static str| {
        sim.count_requests(move |k| {
            k.verb == "get" && k.resource == resource && k.subresource == "proxy" && k.code == 200
        })
    };
    assert_eq!((proxied("pods"), proxied("services")), (2, 1));
    // Nothing listens on 9090: the API server's 503, in its words (kube-rs would retry a 503).
    let refused = kubectl
        .fails(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/web:9090/proxy/",
        ])
        .await;
    assert!(
        refused.contains(&format!(
            "error trying to reach service: dial tcp {ip}:9090: "
        )),
        "{refused}"
    );
}

#[tokio::test]
async fn kubectl_logs_shows_the_previous_container_with_timestamps_tail_and_limits() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let client = sim.client().await.unwrap();
    // Each start says which it is; the first exits, and the kubelet restarts it.
    let mut counter = shell_pod(
        "counter",
        "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo start $n; echo second line; [ $n -gt 1 ] && exec sleep 3600; exit 1",
        json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
    );
    counter["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    create::<Pod>(&client, counter).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    eventually(Duration::from_secs(30), "a restart", || async {
        let pod = pods.get("counter").await.ok()?;
        let status = &pod.status?.container_statuses?[0];
        (status.restart_count >= 1).then_some(())
    })
    .await;
    running(&pods, "counter").await;
    let previous = kubectl.ok(&["logs", "counter", "--previous"]).await;
    assert_eq!(previous, "start 1\nsecond line\n");
    let current = log_contains(&pods, "counter", "start 2").await;
    assert_eq!(current, "start 2\nsecond line\n");
    let tail = kubectl
        .ok(&["logs", "counter", "--previous", "--tail=1"])
        .await;
    assert_eq!(tail, "second line\n");
    let stamped = kubectl
        .ok(&["logs", "counter", "--previous", "--timestamps", "--tail=1"])
        .await;
    let (stamp, line) = stamped.split_once(' ').unwrap();
    assert!(stamp.parse::<jiff::Timestamp>().is_ok(), "{stamped}");
    assert_eq!(line, "second line\n");
    let limited = kubectl
        .ok(&["logs", "counter", "--previous", "--limit-bytes=5"])
        .await;
    assert_eq!(limited, "start");
    let recent = kubectl
        .ok(&["logs", "counter", "--previous", "--since=1h"])
        .await;
    assert_eq!(recent, previous);
    let stderr = kubectl
        .fails(&["logs", "counter", "--previous", "-c", "nope"])
        .await;
    assert!(
        stderr.contains("container nope is not valid for pod counter"),
        "{stderr}"
    );
    create::<Pod>(&client, shell_pod("fresh", "exec sleep 3600", json!({}))).await;
    running(&pods, "fresh").await;
    let stderr = kubectl.fails(&["logs", "fresh", "--previous"]).await;
    assert!(
        stderr.contains("previous terminated container \"main\" in pod \"fresh\" not found"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_failing_init_container_backs_off_with_its_exit_in_last_state() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let client = sim.client().await.unwrap();
    let mut pod = shell_pod("setup", "exec sleep 3600", json!({}));
    pod["spec"]["initContainers"] = json!([
        {"name": "fetch", "image": "busybox:1.36", "command": ["sh", "-c", "echo cannot fetch; exit 3"]}
    ]);
    create::<Pod>(&client, pod).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    // What `kubectl get pod` says while the kubelet backs off (`Init:Error` in between is
    // brief: the table test in table.rs shows it).
    eventually(Duration::from_secs(30), "Init:CrashLoopBackOff", || async {
        let table = kubectl.ok(&["get", "pod", "setup", "--no-headers"]).await;
        let status = table
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_owned();
        (status == "Init:CrashLoopBackOff").then_some(())
    })
    .await;
    let pod = pods.get("setup").await.unwrap();
    let init = &pod.status.unwrap().init_container_statuses.unwrap()[0];
    assert!(init.restart_count >= 1);
    let last = init
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
    // The run that failed, whatever the kubelet does meanwhile: the current instance may be a
    // new attempt that has not written yet (its log empty), as on a real node.
    let log = kubectl
        .ok(&["logs", "setup", "-c", "fetch", "--previous"])
        .await;
    assert_eq!(log, "cannot fetch\n");
}

#[tokio::test]
async fn a_containers_end_says_its_termination_message_or_its_logs_end() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let mut pod = shell_pod(
        "done",
        "echo 'finished: 3 files' > /dev/termination-log; exit 0",
        json!({}),
    );
    pod["spec"]["restartPolicy"] = json!("Never");
    let containers = pod["spec"]["containers"].as_array_mut().unwrap();
    containers.push(json!({
        "name": "failing", "image": "busybox:1.36",
        "command": ["sh", "-c", "echo first; echo 'cannot reach the database'; exit 2"],
        "terminationMessagePolicy": "FallbackToLogsOnError"
    }));
    containers.push(json!({
        "name": "custom", "image": "busybox:1.36",
        "command": ["sh", "-c", "echo custom > /tmp/why; exit 1"],
        "terminationMessagePath": "/tmp/why"
    }));
    create::<Pod>(&client, pod).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let statuses = eventually(Duration::from_secs(20), "all three ended", || async {
        let statuses = pods.get("done").await.ok()?.status?.container_statuses?;
        statuses
            .iter()
            .all(|s| s.state.as_ref().is_some_and(|s| s.terminated.is_some()))
            .then_some(statuses)
    })
    .await;
    let message = |name: &str| {
        let status = statuses.iter().find(|s| s.name == name).unwrap();
        status
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .message
            .clone()
    };
    assert_eq!(message("main").as_deref(), Some("finished: 3 files\n"));
    assert_eq!(
        message("failing").as_deref(),
        Some("first\ncannot reach the database")
    );
    assert_eq!(message("custom").as_deref(), Some("custom\n"));
}

/// A claim is as big as it says: writing past its capacity fails with ENOSPC, in the pod
/// and for the pod's command (where the sim runs as root; elsewhere claims are unbounded).
#[tokio::test]
async fn a_claim_fills_up_at_its_capacity() {
    let Some((sim, runtime, _data)) = process_cluster().await else {
        return;
    };
    if !runtime.bounds_claims() {
        eprintln!("skipped: claims are bounded only where the sim runs as root");
        return;
    }
    let client = sim.client().await.unwrap();
    create::<PersistentVolumeClaim>(&client, json!({
        "metadata": {"name": "small"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}
    }))
    .await;
    let mut filler = shell_pod(
        "filler",
        "head -c 500000 /dev/zero > /data/half && echo half written; head -c 2000000 /dev/zero > /data/big || echo big refused; exec sleep 3600",
        json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
    );
    filler["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "small"}}]);
    create::<Pod>(&client, filler).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "filler").await;
    let log = log_contains(&pods, "filler", "big refused").await;
    assert!(log.contains("half written"), "{log}");
    assert!(log.contains("No space left on device"), "{log}");
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_oom_killed() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    // `tail` keeps the last line in memory: 100 MB without a newline (and no end to the
    // input) outgrow the 32Mi limit and stay.
    let mut pod = shell_pod(
        "hungry",
        "(head -c 100000000 /dev/zero; sleep 3600) | tail; echo survived",
        json!({"resources": {"limits": {"memory": "32Mi"}}}),
    );
    pod["spec"]["restartPolicy"] = json!("Never");
    create::<Pod>(&client, pod).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let terminated = eventually(Duration::from_secs(30), "hungry killed", || async {
        let status = pods.get("hungry").await.ok()?.status?.container_statuses?;
        status[0].state.as_ref()?.terminated.clone()
    })
    .await;
    assert_eq!(
        (terminated.reason.as_deref(), terminated.exit_code),
        (Some("OOMKilled"), 137)
    );
}

/// `kubectl attach -i` reaches the container's own stdin (`stdin: true`): with `stdinOnce`,
/// the end of the client's input is the end of the container's, over WebSocket (kubectl 1.33)
/// and SPDY (kubectl 1.27) alike; a container with a terminal takes the client's size.
#[tokio::test]
async fn attach_with_stdin_feeds_the_containers_own_input() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for version in ["1.33", "1.27"] {
        let Some(kubectl) = Kubectl::version(&sim, version) else {
            continue;
        };
        let name = format!("reader-{}", version.replace('.', "-"));
        let mut pod = shell_pod(
            &name,
            "while read line; do echo got $line; done; echo input ended",
            json!({"stdin": true, "stdinOnce": true}),
        );
        pod["spec"]["restartPolicy"] = json!("Never");
        create::<Pod>(&client, pod).await;
        running(&pods, &name).await;
        let output = kubectl
            .run_with_input(&["attach", "-i", &name], "one\ntwo\n")
            .await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("got one\ngot two\n"),
            "kubectl {version}: {output:?}"
        );
        log_contains(&pods, &name, "input ended").await;
    }
    // A terminal: the container reads the size the client sets.
    create::<Pod>(
        &client,
        shell_pod(
            "terminal",
            "while read line; do stty size; done",
            json!({"stdin": true, "tty": true}),
        ),
    )
    .await;
    running(&pods, "terminal").await;
    let mut attached = pods
        .attach("terminal", &AttachParams::interactive_tty().stderr(false))
        .await
        .unwrap();
    set_size(&mut attached).await;
    // Each line asks for the size again, until the client's has arrived.
    let mut stdin = attached.stdin().unwrap();
    let start = std::time::Instant::now();
    loop {
        stdin.write_all(b"go\n").await.unwrap();
        let log = pods.logs("terminal", &LogParams::default()).await.unwrap();
        if log.contains("30 100") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the size set: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn attach_streams_what_the_container_writes_from_then_on() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<Pod>(
        &client,
        shell_pod(
            "talker",
            "i=0; while true; do i=$((i+1)); echo line $i; sleep 0.1; done",
            json!({}),
        ),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "talker").await;
    log_contains(&pods, "talker", "line 3").await;
    let mut attached = pods
        .attach(
            "talker",
            &AttachParams::default().stdout(true).stderr(false),
        )
        .await
        .unwrap();
    let mut stdout = attached.stdout().unwrap();
    let mut seen = String::new();
    let mut chunk = [0u8; 256];
    while seen.matches("line ").count() < 3 {
        let n = tokio::time::timeout(Duration::from_secs(10), stdout.read(&mut chunk))
            .await
            .expect("output while attached")
            .unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    assert!(
        !seen.starts_with("line 1\n"),
        "attach starts now, not at the log's start: {seen}"
    );
}

#[tokio::test]
async fn a_sub_path_that_a_pod_made_a_link_never_leads_out_of_the_volume() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    create::<PersistentVolumeClaim>(&client, json!({
        "metadata": {"name": "shared"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .await;
    let claim = |name: &str, script: &str, sub_path: Option<&str>| {
        let mut mount = json!({"name": "shared", "mountPath": "/data"});
        if let Some(sub) = sub_path {
            mount["subPath"] = json!(sub);
        }
        let mut pod = shell_pod(name, script, json!({"volumeMounts": [mount]}));
        pod["spec"]["volumes"] =
            json!([{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]);
        pod
    };
    create::<Pod>(
        &client,
        claim("planter", "ln -s /etc /data/escape; exec sleep 3600", None),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    running(&pods, "planter").await;
    eventually(Duration::from_secs(10), "the link planted", || async {
        let (out, _, _) = exec(&pods, "planter", &["ls", "/data"], None).await;
        out.contains("escape").then_some(())
    })
    .await;
    create::<Pod>(
        &client,
        claim("victim", "ls /data; exec sleep 3600", Some("escape")),
    )
    .await;
    let waiting = eventually(Duration::from_secs(20), "the mount refused", || async {
        let status = pods.get("victim").await.ok()?.status?.container_statuses?;
        status[0].state.as_ref()?.waiting.clone()?.message
    })
    .await;
    assert!(
        waiting.contains("subpath escape is a symbolic link"),
        "{waiting}"
    );
}

#[tokio::test]
async fn a_service_has_endpoints_and_a_slice_of_its_pods() {
    let sim = cluster_with(SimConfig::fast()).await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let client = sim.client().await.unwrap();
    let mut web = shell_pod(
        "web",
        "exec sleep 3600",
        json!({"ports": [{"name": "http", "containerPort": 8080}]}),
    );
    web["metadata"]["labels"] = json!({"app": "web"});
    create::<Pod>(&client, web).await;
    // A pod the Service does not select.
    let mut other = shell_pod("other", "exec sleep 3600", json!({}));
    other["metadata"]["labels"] = json!({"app": "other"});
    create::<Pod>(&client, other).await;
    create::<k8s_openapi::api::core::v1::Service>(&client, json!({
        "metadata": {"name": "web", "labels": {"tier": "front"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "api", "port": 80, "targetPort": "http"}]}
    }))
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let ip = eventually(Duration::from_secs(20), "web ready", || async {
        let status = pods.get("web").await.ok()?.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(status.pod_ip?)
    })
    .await;
    eventually(Duration::from_secs(20), "the other pod's IP", || async {
        pods.get("other").await.ok()?.status?.pod_ip
    })
    .await;
    let endpoints = eventually(
        Duration::from_secs(10),
        "the endpoints listing the pod",
        || async {
            let out = kubectl
                .ok(&["get", "endpoints", "web", "--no-headers"])
                .await;
            out.contains(&format!("{ip}:8080")).then_some(out)
        },
    )
    .await;
    assert!(endpoints.starts_with("web "), "{endpoints}");
    assert!(
        !endpoints.contains(','),
        "only the selected pod: {endpoints}"
    );
    let slices = kubectl
        .ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "json",
        ])
        .await;
    let slices: Value = serde_json::from_str(&slices).unwrap();
    let slice = &slices["items"][0];
    assert_eq!(slice["addressType"], "IPv4");
    assert_eq!(slice["endpoints"][0]["addresses"][0], ip.as_str());
    assert_eq!(
        slice["endpoints"].as_array().unwrap().len(),
        1,
        "only the selected pod: {slice}"
    );
    assert_eq!(slice["endpoints"][0]["conditions"]["ready"], true);
    assert_eq!(
        slice["ports"][0],
        json!({"name": "api", "port": 8080, "protocol": "TCP"})
    );
    assert_eq!(slice["metadata"]["ownerReferences"][0]["kind"], "Service");
    // The pod goes: so does its address; the Service goes: so do its endpoints.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(Duration::from_secs(20), "no address left", || async {
        let out = kubectl
            .ok(&["get", "endpoints", "web", "--no-headers"])
            .await;
        out.contains("<none>").then_some(())
    })
    .await;
    kubectl.ok(&["delete", "service", "web"]).await;
    eventually(
        Duration::from_secs(20),
        "the endpoints and slice gone",
        || async {
            let endpoints = kubectl.ok(&["get", "endpoints", "-o", "name"]).await;
            let slices = kubectl.ok(&["get", "endpointslices", "-o", "name"]).await;
            (endpoints.is_empty() && slices.is_empty()).then_some(())
        },
    )
    .await;
}

/// A `Sig...:` line of /proc/PID/status: its name and the standard signals (1 to 31) in its
/// mask (the C library keeps the real-time signals below SIGRTMIN for itself).
fn standard_signals<'a>(line: &[&'a str]) -> (&'a str, u64) {
    let mask = u64::from_str_radix(line[1], 16).unwrap();
    (line[0], mask & 0x7fff_ffff)
}

/// kubectl's Job and CronJob workflow, as on a cluster: `create job` runs its command in a pod
/// to completion (`wait --for=condition=complete`, `logs job/NAME`, the table's STATUS and
/// COMPLETIONS); a Job whose pods keep failing is Failed once past its backoffLimit, in the
/// controller's words; a pod template that restarts Always is refused in the server's words;
/// `create cronjob` and `create job --from=cronjob/NAME` make a Job of its template, which
/// completes and shows in the CronJob's status.
/// With the newest kubectl and the oldest (1.27).
#[tokio::test]
async fn jobs_run_to_completion_and_cron_jobs_make_them() {
    for version in [None, Some("1.27")] {
        let Some((sim, _runtime, _data)) = process_cluster().await else {
            return;
        };
        let kubectl = match version {
            None => crate::kubectl::Kubectl::for_cluster(&sim),
            Some(version) => crate::kubectl::Kubectl::version(&sim, version),
        };
        if let Some(kubectl) = kubectl {
            job_workflow(&kubectl).await;
        }
    }
}

async fn job_workflow(kubectl: &crate::kubectl::Kubectl) {
    kubectl
        .ok(&[
            "create",
            "job",
            "hello",
            "--image=busybox",
            "--",
            "sh",
            "-c",
            "echo hello from the job",
        ])
        .await;
    kubectl
        .ok(&[
            "wait",
            "--for=condition=complete",
            "job/hello",
            "--timeout=60s",
        ])
        .await;
    assert_eq!(
        kubectl.ok(&["logs", "job/hello"]).await,
        "hello from the job\n"
    );
    let table = kubectl.ok(&["get", "jobs"]).await;
    let mut lines = table.lines();
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["hello", "Complete", "1/1"], "{table}");
    let conditions = kubectl
        .ok(&[
            "get",
            "job",
            "hello",
            "-o",
            "jsonpath={.status.conditions[*].type} {.status.succeeded}",
        ])
        .await;
    assert_eq!(conditions, "SuccessCriteriaMet Complete 1");

    let failing = r#"{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "broken"},
        "spec": {"backoffLimit": 1, "template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "exit 3"]}]}}}}"#;
    kubectl
        .run_with_input(&["create", "-f", "-"], failing)
        .await;
    kubectl
        .ok(&[
            "wait",
            "--for=condition=failed",
            "job/broken",
            "--timeout=60s",
        ])
        .await;
    let failed = kubectl
        .ok(&["get", "job", "broken", "-o", "jsonpath={.status.failed} {.status.conditions[?(@.type==\"Failed\")].reason}: {.status.conditions[?(@.type==\"Failed\")].message}"])
        .await;
    assert_eq!(
        failed,
        "2 BackoffLimitExceeded: Job has reached the specified backoff limit"
    );

    let always = failing
        .replace("broken", "always")
        .replace("\"Never\"", "\"Always\"");
    let refused = kubectl
        .fails_with_input(&["create", "-f", "-"], &always)
        .await;
    assert!(
        refused.contains(r#"spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never""#),
        "{refused}"
    );

    kubectl
        .ok(&[
            "create",
            "cronjob",
            "tick",
            "--image=busybox",
            "--schedule=*/5 * * * *",
            "--",
            "sh",
            "-c",
            "echo tick",
        ])
        .await;
    let header = kubectl.ok(&["get", "cronjobs"]).await;
    assert_eq!(
        header
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        [
            "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"
        ]
    );
    // SUSPEND is the printer's string, not a JSON boolean.
    let row: Vec<&str> = header.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["tick", "*/5", "*", "*"], "{header}");
    assert!(row.contains(&"False"), "{header}");
    kubectl
        .ok(&["create", "job", "tick-now", "--from=cronjob/tick"])
        .await;
    kubectl
        .ok(&[
            "wait",
            "--for=condition=complete",
            "job/tick-now",
            "--timeout=60s",
        ])
        .await;
    assert_eq!(kubectl.ok(&["logs", "job/tick-now"]).await, "tick\n");
}

/// `kubectl debug POD` as on a cluster (the newest kubectl and 1.27): an ephemeral container
/// added through `pods/ephemeralcontainers` runs beside the pod's, its output in `kubectl
/// logs -c`, its state in `ephemeralContainerStatuses`; with `-i` the person's input reaches
/// it. Changing or removing one is refused in the server's words.
#[tokio::test]
async fn kubectl_debug_runs_an_ephemeral_container_in_the_pod() {
    for version in [None, Some("1.27")] {
        let Some((sim, _runtime, _data)) = process_cluster().await else {
            return;
        };
        let kubectl = match version {
            None => crate::kubectl::Kubectl::for_cluster(&sim),
            Some(version) => crate::kubectl::Kubectl::version(&sim, version),
        };
        let Some(kubectl) = kubectl else { continue };
        kubectl
            .ok(&["run", "app", "--image=busybox", "--", "sleep", "600"])
            .await;
        kubectl
            .ok(&["wait", "--for=condition=Ready", "pod/app", "--timeout=60s"])
            .await;
        kubectl
            .ok(&[
                "debug",
                "app",
                "--image=busybox",
                "--container=look",
                "--",
                "sh",
                "-c",
                "echo from the debugger; exit 3",
            ])
            .await;
        let state =
            "{.status.ephemeralContainerStatuses[?(@.name==\"look\")].state.terminated.exitCode}";
        let mut code = String::new();
        for _ in 0..100 {
            code = kubectl
                .ok(&["get", "pod", "app", "-o", &format!("jsonpath={state}")])
                .await;
            if !code.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(code, "3");
        assert_eq!(
            kubectl.ok(&["logs", "app", "-c", "look"]).await,
            "from the debugger\n"
        );
        let typed = kubectl
            .run_with_input(
                &[
                    "debug",
                    "-i",
                    "app",
                    "--image=busybox",
                    "--container=talk",
                    "--",
                    "sh",
                ],
                "echo typed $((6 * 7))\nexit\n",
            )
            .await;
        assert!(
            String::from_utf8_lossy(&typed.stdout).contains("typed 42"),
            "{typed:?}"
        );
        let pods: Api<Pod> = Api::default_namespaced(sim.client().await.unwrap());
        let refused = pods
            .patch_subresource(
                "ephemeralcontainers",
                "app",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Json::<()>(
                    serde_json::from_value(
                        json!([{"op": "remove", "path": "/spec/ephemeralContainers/0"}]),
                    )
                    .unwrap(),
                ),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("may not be removed"), "{refused}");

        // A copy of the pod with a debugger beside its container (1.33 sends it as protobuf,
        // with everything the server had added to the original's spec).
        kubectl
            .ok(&[
                "debug",
                "app",
                "--copy-to=app-copy",
                "--image=busybox",
                "--container=copy",
                "--",
                "sh",
                "-c",
                "echo in the copy; sleep 600",
            ])
            .await;
        let copy = running(&pods, "app-copy").await;
        let names: Vec<String> = copy
            .spec
            .unwrap()
            .containers
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["app", "copy"]);
        let said = eventually(
            Duration::from_secs(20),
            "the copy's debugger to speak",
            || async {
                let log = kubectl.ok(&["logs", "app-copy", "-c", "copy"]).await;
                log.contains("in the copy").then_some(log)
            },
        )
        .await;
        assert_eq!(said, "in the copy\n");
        // A node debugger: on the node, in its namespaces, tolerating everything.
        let created = kubectl
            .ok(&[
                "debug",
                "node/node-1",
                "--image=busybox",
                "--",
                "sh",
                "-c",
                "echo on the node; sleep 600",
            ])
            .await;
        let debugger = pods
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("node-debugger-node-1-"))
            })
            .unwrap_or_else(|| panic!("a node debugger pod: {created}"));
        let spec = debugger.spec.clone().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(spec.host_pid, Some(true));
        assert_eq!(spec.host_network, Some(true));
        let name = debugger.metadata.name.unwrap();
        running(&pods, &name).await;
        log_contains(&pods, &name, "on the node").await;
    }
}

/// The kubelet's Summary API through the node proxy (kube-rs's `request_raw` example asks for
/// it; `kubectl get --raw` too): each running pod with its containers, what their processes
/// use (measured, so more than nothing for a shell holding 16 MiB), and the node.
#[tokio::test]
async fn the_kubelet_summarizes_what_its_pods_use() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    create::<Pod>(
        &client,
        shell_pod(
            "busy",
            "x=$(head -c 16000000 /dev/zero | tr '\\0' a); echo filled; sleep 300",
            json!({}),
        ),
    )
    .await;
    let pod = running(&pods, "busy").await;
    log_contains(&pods, "busy", "filled").await;
    let node = pod.spec.unwrap().node_name.unwrap();
    let path = format!("/api/v1/nodes/{node}/proxy/stats/summary");
    let summary: Value = client
        .request(http::Request::get(&path).body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(summary["node"]["nodeName"], node.as_str());
    let busy = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "busy")
        .unwrap_or_else(|| panic!("the pod in {summary}"));
    assert_eq!(busy["podRef"]["namespace"], "default");
    let container = &busy["containers"][0];
    assert_eq!(container["name"], "main");
    let memory = container["memory"]["workingSetBytes"].as_u64().unwrap();
    assert!(
        memory > 16_000_000,
        "the shell's 16 MB are counted: {memory}"
    );
    assert!(busy["process_stats"]["process_count"].as_u64().unwrap() >= 1);
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap()
            >= memory
    );
    // A rate and a total of CPU, as kube-rs's `request_raw` reads them.
    assert!(
        summary["node"]["cpu"]["usageNanoCores"].is_u64(),
        "{summary}"
    );
    assert!(
        container["cpu"]["usageCoreNanoSeconds"].is_u64(),
        "{summary}"
    );
    if let Some(kubectl) = Kubectl::for_cluster(&sim) {
        let raw = kubectl.ok(&["get", "--raw", &path]).await;
        let read: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(read["node"]["nodeName"], node.as_str());
    }
}

/// A Job created suspended runs nothing and says so (`Suspended`, `JobSuspended`, an event);
/// resumed, it starts its pods, its time counts from then, and it completes; suspended again
/// while running, its pods are deleted, each said by `SuccessfulDelete`.
#[tokio::test]
async fn a_suspended_job_runs_nothing_until_it_is_resumed() {
    use k8s_openapi::api::{batch::v1::Job, core::v1::Event};
    use kube::api::{ListParams, Patch, PatchParams};
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let jobs: Api<Job> = Api::default_namespaced(client.clone());
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let job = |name: &str, script: &str| {
        json!({"metadata": {"name": name}, "spec": {"suspend": true, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}}}})
    };
    let reasons = |name: &'static str| {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                .collect::<Vec<_>>()
        }
    };
    let suspended_condition = |job: &Job| {
        job.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Suspended")
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
    };
    create::<Job>(&client, job("later", "echo done")).await;
    let held = eventually(
        Duration::from_secs(20),
        "the Job to say it is suspended",
        || async {
            let job = jobs.get("later").await.unwrap();
            (suspended_condition(&job)? == ("True".to_owned(), "JobSuspended".to_owned()))
                .then_some(job)
        },
    )
    .await;
    assert!(
        held.status.unwrap().start_time.is_none(),
        "no time runs while suspended"
    );
    assert!(
        reasons("later")
            .await
            .contains(&("Suspended".to_owned(), "Job suspended".to_owned()))
    );
    assert!(
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    let resume = Patch::Merge(json!({"spec": {"suspend": false}}));
    jobs.patch("later", &PatchParams::default(), &resume)
        .await
        .unwrap();
    let done = eventually(
        Duration::from_secs(30),
        "the resumed Job to complete",
        || async {
            let job = jobs.get("later").await.unwrap();
            (crate::support::job_complete(&job)).then_some(job)
        },
    )
    .await;
    assert_eq!(
        suspended_condition(&done),
        Some(("False".to_owned(), "JobResumed".to_owned()))
    );
    assert!(done.status.unwrap().start_time.is_some());
    assert!(
        reasons("later")
            .await
            .contains(&("Resumed".to_owned(), "Job resumed".to_owned()))
    );

    // Suspended while it runs: its pod goes.
    let mut running_job = job("long", "sleep 600");
    running_job["spec"]["suspend"] = json!(false);
    create::<Job>(&client, running_job).await;
    let pod = eventually(Duration::from_secs(20), "the Job's pod to run", || async {
        let list = pods
            .list(&ListParams::default().labels("job-name=long"))
            .await
            .unwrap();
        list.items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let suspend = Patch::Merge(json!({"spec": {"suspend": true}}));
    jobs.patch("long", &PatchParams::default(), &suspend)
        .await
        .unwrap();
    let pod_name = pod.metadata.name.unwrap();
    eventually(
        Duration::from_secs(20),
        "the suspended Job's pod to go",
        || async {
            pods.get_opt(&pod_name)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        reasons("long").await.contains(&(
            "SuccessfulDelete".to_owned(),
            format!("Deleted pod: {pod_name}")
        )),
        "{:?}",
        reasons("long").await
    );
}

/// A node's kubelet on a port of its own (`berth sim --kubelet-port`, as kube's own
/// `pod_can_exec_and_write_to_stdin_from_node_proxy` reaches a kubelet): exec into its pods
/// with kube-rs's `kubelet_node_exec`, `/pods`, and nothing of pods on other nodes; a caller
/// without `nodes/proxy` is refused as the kubelet's authorizer refuses.
#[tokio::test]
async fn a_nodes_kubelet_serves_exec_on_its_own_port() {
    use kube::core::kubelet_debug::KubeletDebugParams;
    let Some((mut sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    create::<Pod>(&client, shell_pod("here", "sleep 300", json!({}))).await;
    let pod = running(&pods, "here").await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let address = sim.serve_kubelet(&node, 0).await.unwrap();
    let reported = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&node)
        .await
        .unwrap();
    assert_eq!(
        reported
            .status
            .unwrap()
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(address.port())
    );

    let mut config = kube::Config::from_custom_kubeconfig(sim.kubeconfig(), &Default::default())
        .await
        .unwrap();
    config.cluster_url = format!("https://localhost:{}", address.port())
        .parse()
        .unwrap();
    let kubelet = kube::Client::try_from(config).unwrap();
    let params = KubeletDebugParams {
        name: "here",
        namespace: "default",
        pod_uid: None,
    };
    let mut attached = kubelet
        .kubelet_node_exec(
            &params,
            "main",
            vec!["sh", "-c", "echo from the kubelet"],
            &AttachParams::default().stdout(true).stderr(false),
        )
        .await
        .unwrap();
    let mut said = String::new();
    attached
        .stdout()
        .unwrap()
        .read_to_string(&mut said)
        .await
        .unwrap();
    assert_eq!(said, "from the kubelet\n");
    let listed: Value = kubelet
        .request(http::Request::get("/pods").body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == "here"),
        "{listed}"
    );
    // A pod that is not on this node is not here.
    let elsewhere = KubeletDebugParams {
        name: "nowhere",
        namespace: "default",
        pod_uid: None,
    };
    let missing = kubelet
        .kubelet_node_exec(&elsewhere, "main", vec!["true"], &AttachParams::default())
        .await;
    assert!(missing.is_err());
    // A service account without nodes/proxy: the kubelet refuses it.
    let token = sim
        .issue_token("default", "default", &[], Duration::from_secs(600))
        .unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        sim.kubeconfig_with_token("nobody", &token),
        &Default::default(),
    )
    .await
    .unwrap();
    config.cluster_url = format!("https://localhost:{}", address.port())
        .parse()
        .unwrap();
    let nobody = kube::Client::try_from(config).unwrap();
    let refused = nobody
        .request::<Value>(http::Request::get("/pods").body(Vec::new()).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("nodes/proxy") || refused.contains("forbidden"),
        "{refused}"
    );
}

/// A container's root is its writable layer: the image's user may write there (`kubectl cp`
/// into `/`), while the host's system folders it sees stay read-only.
#[tokio::test]
async fn a_container_may_write_in_its_own_root_but_not_in_the_hosts_folders() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    create::<Pod>(&client, shell_pod("layer", "sleep 300", json!({}))).await;
    running(&pods, "layer").await;
    let (out, _, status) = exec(
        &pods,
        "layer",
        &["sh", "-c", "tar xf - -C / && cat /copied.txt"],
        Some(&tar_of("copied.txt", "copied in\n")),
    )
    .await;
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    assert_eq!(out, "copied in\n");
    let (_, err, status) = exec(&pods, "layer", &["sh", "-c", "touch /usr/bin/x"], None).await;
    assert_ne!(status.status.as_deref(), Some("Success"));
    assert!(
        err.contains("Read-only") || err.contains("Permission denied"),
        "{err}"
    );
}

/// A tar archive of one file, as text (the archive's bytes are ASCII here).
fn tar_of(name: &str, content: &str) -> String {
    let mut header = vec![0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..107].copy_from_slice(b"0000644");
    header[108..115].copy_from_slice(b"0000000");
    header[116..123].copy_from_slice(b"0000000");
    let size = format!("{:011o}", content.len());
    header[124..135].copy_from_slice(size.as_bytes());
    header[136..147].copy_from_slice(b"00000000000");
    header[156] = b'0';
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut archive = header;
    archive.extend_from_slice(content.as_bytes());
    archive.resize(512 + content.len().div_ceil(512) * 512 + 1024, 0);
    String::from_utf8(archive).unwrap()
}

/// The image's user may bind a port below 1024 (a container runtime's default
/// `NET_BIND_SERVICE`: an nginx on 80), unless its container drops the capability, as the
/// restricted Pod Security level asks.
#[tokio::test]
async fn a_container_binds_port_80_unless_it_drops_the_capability() {
    let Some((sim, _runtime, _data)) = process_cluster().await else {
        return;
    };
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("python3 is needed for this test (a server on port 80)");
    }
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let server = |name: &str, security: Value| {
        json!({"metadata": {"name": name}, "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": "nginx", "securityContext": security,
            "command": ["sh", "-c", "cd /tmp && echo served > index.html && exec python3 -m http.server --bind $POD_IP 80"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]}})
    };
    create::<Pod>(&client, server("web", json!({}))).await;
    running(&pods, "web").await;
    let page = eventually(
        Duration::from_secs(20),
        "the server on port 80 to answer",
        || async {
            let (code, _, body) = get_raw(
                &client,
                "/api/v1/namespaces/default/pods/web:80/proxy/index.html",
                "*/*",
            )
            .await;
            (code == 200).then(|| String::from_utf8_lossy(&body).into_owned())
        },
    )
    .await;
    assert_eq!(page, "served\n");

    create::<Pod>(
        &client,
        server("dropped", json!({"capabilities": {"drop": ["ALL"]}})),
    )
    .await;
    log_contains(&pods, "dropped", "Permission denied").await;
}
