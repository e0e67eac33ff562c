//! The scheduler, kubelets, container runtime and faults: each behaviour yields the pod status,
//! conditions and events (reason, message, count) a real cluster would.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use berth_sim::{
    ApiFault, BoxFuture, ContainerContext, ContainerRuntime, Frequency, NodeConfig, RequestMatch,
    RunningContainer, SimCluster, SimConfig,
};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, PersistentVolumeClaim, Pod, Secret};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{api_error, cluster_with, cluster_with_nodes, eventually};

const WAIT: Duration = Duration::from_secs(15);

fn pod_with(name: &str, spec: Value) -> Pod {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}});
    json_patch::merge(&mut pod["spec"], &spec);
    serde_json::from_value(pod).unwrap()
}

async fn phase_of(pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    eventually(WAIT, &format!("pod {name} to be {phase}"), || async {
        let pod = pods.get_opt(name).await.unwrap()?;
        (pod.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(pod)
    })
    .await
}

fn condition(pod: &Pod, type_: &str) -> Option<(String, Option<String>, Option<String>)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn events_for(client: &kube::Client, pod: &Pod) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let uid = pod.uid().unwrap();
    events
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
        .await
        .unwrap()
        .items
}

fn find<'a>(events: &'a [Event], reason: &str) -> Option<&'a Event> {
    events.iter().find(|e| e.reason.as_deref() == Some(reason))
}

fn waiting_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

#[tokio::test]
async fn a_pod_is_scheduled_started_and_ready_like_a_real_one() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(names, ["node-1", "node-2", "node-3"]);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod_with("web", json!({})))
        .await
        .unwrap();
    phase_of(&pods, "web", "Running").await;
    let pod = eventually(WAIT, "readiness", || async {
        let p = pods.get("web").await.unwrap();
        (condition(&p, "Ready").map(|c| c.0) == Some("True".into())).then_some(p)
    })
    .await;
    let status = pod.status.clone().unwrap();
    let ip = status.pod_ip.clone().unwrap();
    assert!(ip.starts_with("127.") && !ip.starts_with("127.0."), "{ip}");
    assert!(status.host_ip.unwrap().starts_with("127.0."));
    assert!(status.start_time.is_some());
    for type_ in [
        "PodScheduled",
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
    ] {
        assert_eq!(
            condition(&pod, type_).map(|c| c.0),
            Some("True".to_owned()),
            "{type_}"
        );
    }
    let container = &status.container_statuses.unwrap()[0];
    assert!(container.ready && container.started == Some(true));
    assert_eq!(container.restart_count, 0);
    assert!(container.state.as_ref().unwrap().running.is_some());

    let events = events_for(&client, &pod).await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let scheduled = find(&events, "Scheduled").expect("Scheduled");
    assert_eq!(
        scheduled.message.as_deref(),
        Some(format!("Successfully assigned default/web to {node}").as_str())
    );
    assert_eq!(
        scheduled.reporting_component.as_deref(),
        Some("default-scheduler")
    );
    assert_eq!(
        find(&events, "Pulling").unwrap().message.as_deref(),
        Some("Pulling image \"nginx:1.27\"")
    );
    assert!(
        find(&events, "Pulled")
            .unwrap()
            .message
            .as_deref()
            .unwrap()
            .starts_with("Successfully pulled image \"nginx:1.27\" in ")
    );
    assert_eq!(
        find(&events, "Created").unwrap().message.as_deref(),
        Some("Created container: main")
    );
    let started = find(&events, "Started").unwrap();
    assert_eq!(started.message.as_deref(), Some("Started container main"));
    assert_eq!(
        started.source.as_ref().unwrap().component.as_deref(),
        Some("kubelet")
    );
    assert_eq!(
        started.involved_object.field_path.as_deref(),
        Some("spec.containers{main}")
    );

    // Graceful deletion: Killing, then gone.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    let killing = eventually(WAIT, "the Killing event", || async {
        let events = events_for(&client, &pod).await;
        find(&events, "Killing").cloned()
    })
    .await;
    assert_eq!(killing.message.as_deref(), Some("Stopping container main"));
    eventually(WAIT, "the pod to be gone", || async {
        pods.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_missing_secret_fails_mounts_until_it_is_created() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let spec = json!({"volumes": [{"name": "secret-0", "secret": {"secretName": "workspace-secret"}}],
                      "containers": [{"name": "main", "image": "nginx:1.27", "volumeMounts": [{"name": "secret-0", "mountPath": "/s"}]}]});
    let created = pods
        .create(&PostParams::default(), &pod_with("p", spec))
        .await
        .unwrap();
    let failed = eventually(WAIT, "FailedMount to repeat", || async {
        let events = events_for(&client, &created).await;
        find(&events, "FailedMount")
            .filter(|e| e.count.unwrap_or(0) >= 3)
            .cloned()
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert_eq!(
        failed.message.as_deref(),
        Some(
            "MountVolume.SetUp failed for volume \"secret-0\" : secret \"workspace-secret\" not found"
        )
    );
    let pending = pods.get("p").await.unwrap();
    assert_eq!(
        pending.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(
        waiting_reason(&pending).as_deref(),
        Some("ContainerCreating")
    );

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "workspace-secret"}, "stringData": {"token": "x"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let running = phase_of(&pods, "p", "Running").await;
    assert_eq!(running.uid(), created.uid(), "the same pod heals");
}

#[tokio::test]
async fn an_unpullable_image_backs_off() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let image = "registry.invalid/devbox:1";
    let created = pods
        .create(
            &PostParams::default(),
            &pod_with(
                "p",
                json!({"containers": [{"name": "main", "image": image}]}),
            ),
        )
        .await
        .unwrap();
    let backing_off = eventually(WAIT, "ImagePullBackOff", || async {
        let p = pods.get("p").await.unwrap();
        (waiting_reason(&p).as_deref() == Some("ImagePullBackOff")).then_some(p)
    })
    .await;
    let state = backing_off.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap();
    assert_eq!(
        state.waiting.unwrap().message.as_deref(),
        Some(format!("Back-off pulling image \"{image}\"").as_str())
    );
    let events = events_for(&client, &created).await;
    let messages: Vec<&str> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Failed"))
        .filter_map(|e| e.message.as_deref())
        .collect();
    assert!(messages.contains(&"Error: ErrImagePull"), "{messages:?}");
    assert!(
        messages.contains(&"Error: ImagePullBackOff"),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.starts_with(&format!(
            "Failed to pull image \"{image}\": rpc error: code = NotFound"
        ))),
        "{messages:?}"
    );
    assert_eq!(
        find(&events, "BackOff").unwrap().message.as_deref(),
        Some(format!("Back-off pulling image \"{image}\"").as_str())
    );
}

#[tokio::test]
async fn unschedulable_pods_say_why_and_schedule_when_a_node_fits() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let big = json!({"containers": [{"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "8"}}}]});
    let created = pods
        .create(&PostParams::default(), &pod_with("big", big))
        .await
        .unwrap();
    let pending = eventually(WAIT, "PodScheduled=False", || async {
        let p = pods.get("big").await.unwrap();
        condition(&p, "PodScheduled")
            .filter(|c| c.0 == "False")
            .map(|c| (p, c))
    })
    .await;
    assert_eq!(pending.1.1.as_deref(), Some("Unschedulable"));
    assert_eq!(
        pending.1.2.as_deref(),
        Some("0/3 nodes are available: 3 Insufficient cpu.")
    );
    let events = events_for(&client, &created).await;
    let failed = find(&events, "FailedScheduling").unwrap();
    assert_eq!(
        (failed.type_.as_deref(), failed.message.as_deref()),
        (
            Some("Warning"),
            Some("0/3 nodes are available: 3 Insufficient cpu.")
        )
    );

    sim.add_node(NodeConfig::new("node-big").capacity("16", "64Gi", 110));
    let running = phase_of(&pods, "big", "Running").await;
    assert_eq!(running.spec.unwrap().node_name.as_deref(), Some("node-big"));

    pods.create(
        &PostParams::default(),
        &pod_with("picky", json!({"nodeSelector": {"disktype": "ssd"}})),
    )
    .await
    .unwrap();
    let message = eventually(WAIT, "the selector message", || async {
        condition(&pods.get("picky").await.unwrap(), "PodScheduled").and_then(|c| c.2)
    })
    .await;
    assert_eq!(
        message,
        "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
    );
}

#[tokio::test]
async fn taints_repel_pods_that_do_not_tolerate_them() {
    let config = SimConfig {
        nodes: vec![NodeConfig::new("gpu-1").taint("dedicated", "gpu", "NoSchedule")],
        ..SimConfig::fast()
    };
    let sim = cluster_with(config).await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    pods.create(&PostParams::default(), &pod_with("plain", json!({})))
        .await
        .unwrap();
    let message = eventually(WAIT, "the taint message", || async {
        condition(&pods.get("plain").await.unwrap(), "PodScheduled").and_then(|c| c.2)
    })
    .await;
    assert_eq!(
        message,
        "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}."
    );
    let tolerant = json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]});
    pods.create(&PostParams::default(), &pod_with("tolerant", tolerant))
        .await
        .unwrap();
    phase_of(&pods, "tolerant", "Running").await;
}

/// A pod waiting for room is bound as soon as a pod that held it is gone, not at the
/// scheduler's periodic retry (30 s, longer than `WAIT`); a running pod's status changes do
/// not count as room.
#[tokio::test]
async fn room_freed_by_a_deleted_pod_binds_a_waiting_one_at_once() {
    let config = SimConfig {
        nodes: vec![NodeConfig::new("only").capacity("4", "8Gi", 110)],
        ..SimConfig::fast()
    };
    let sim = cluster_with(config).await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    let three_cpus = json!({"containers": [{"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "3"}}}]});
    for name in ["first", "second"] {
        pods.create(&PostParams::default(), &pod_with(name, three_cpus.clone()))
            .await
            .unwrap();
    }
    phase_of(&pods, "first", "Running").await;
    let message = eventually(WAIT, "the second pod waiting for room", || async {
        condition(&pods.get("second").await.unwrap(), "PodScheduled").and_then(|c| c.2)
    })
    .await;
    assert_eq!(message, "0/1 nodes are available: 1 Insufficient cpu.");

    pods.delete("first", &DeleteParams::default())
        .await
        .unwrap();
    let second = phase_of(&pods, "second", "Running").await;
    assert_eq!(second.spec.unwrap().node_name.as_deref(), Some("only"));
}

/// A runtime for tests: containers named `crash` exit 1 at once; others serve TCP on the
/// pod IP at their first port, answering `hello from <pod>`.
struct TestRuntime;

/// Connections each pod's server accepted, by pod name.
static ACCEPTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn accepted(pod: &str) -> usize {
    ACCEPTED
        .lock()
        .unwrap()
        .iter()
        .filter(|p| *p == pod)
        .count()
}

impl ContainerRuntime for TestRuntime {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        Box::pin(async move {
            let (exit_tx, exited) = tokio::sync::oneshot::channel();
            let (stop, stop_rx) = tokio::sync::oneshot::channel::<std::time::Duration>();
            let name = context.container["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if name == "crash" || context.init {
                let _ = exit_tx.send(if context.init { 0 } else { 1 });
                return Ok(RunningContainer { exited, stop });
            }
            let port = context.container["ports"][0]["containerPort"]
                .as_u64()
                .unwrap_or(8080) as u16;
            let listener = tokio::net::TcpListener::bind(SocketAddr::from((context.pod_ip, port)))
                .await
                .map_err(|e| e.to_string())?;
            let greeting = format!("hello from {}\n", context.pod_name);
            let pod = context.pod_name.clone();
            tokio::spawn(async move {
                let serve = async {
                    loop {
                        let Ok((mut socket, _)) = listener.accept().await else {
                            return;
                        };
                        ACCEPTED.lock().unwrap().push(pod.clone());
                        let _ = socket.write_all(greeting.as_bytes()).await;
                    }
                };
                tokio::select! { _ = serve => {}, _ = stop_rx => {} }
                let _ = exit_tx.send(0);
            });
            Ok(RunningContainer { exited, stop })
        })
    }
}

/// A running pod's readiness probe runs every `periodSeconds`, as a real kubelet's does (not
/// on the sim's own clock).
#[tokio::test]
async fn readiness_probes_run_every_period() {
    let config = SimConfig {
        runtime: Arc::new(TestRuntime),
        ..SimConfig::fast()
    };
    let sim = cluster_with(config).await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    let probed = json!({"containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]});
    pods.create(&PostParams::default(), &pod_with("probed", probed))
        .await
        .unwrap();
    phase_of(&pods, "probed", "Running").await;
    let before = accepted("probed");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let probes = accepted("probed") - before;
    assert!(
        (2..=5).contains(&probes),
        "{probes} probes in 3 s with periodSeconds 1"
    );
}

#[tokio::test]
async fn containers_serve_on_the_pod_ip_and_crash_loops_back_off() {
    let config = SimConfig {
        runtime: Arc::new(TestRuntime),
        ..SimConfig::fast()
    };
    let sim = cluster_with(config).await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let serving = json!({"containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 8080}], "readinessProbe": {"tcpSocket": {"port": 8080}}}]});
    pods.create(&PostParams::default(), &pod_with("server", serving))
        .await
        .unwrap();
    let pod = phase_of(&pods, "server", "Running").await;
    let ip: std::net::Ipv4Addr = pod.status.unwrap().pod_ip.unwrap().parse().unwrap();
    let mut socket = tokio::net::TcpStream::connect((ip, 8080)).await.unwrap();
    let mut text = String::new();
    socket.read_to_string(&mut text).await.unwrap();
    assert_eq!(text, "hello from server\n");

    let crash = pods
        .create(
            &PostParams::default(),
            &pod_with(
                "crasher",
                json!({"containers": [{"name": "crash", "image": "busybox:1"}]}),
            ),
        )
        .await
        .unwrap();
    let looping = eventually(WAIT, "CrashLoopBackOff with restarts", || async {
        let p = pods.get("crasher").await.unwrap();
        let s = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        (s.restart_count >= 2 && waiting_reason(&p).as_deref() == Some("CrashLoopBackOff"))
            .then_some(s)
    })
    .await;
    let message = looping.state.unwrap().waiting.unwrap().message.unwrap();
    assert!(
        message.starts_with("back-off ")
            && message.contains("restarting failed container=crash pod=crasher_default("),
        "{message}"
    );
    assert_eq!(looping.last_state.unwrap().terminated.unwrap().exit_code, 1);
    let events = events_for(&client, &crash).await;
    let backoff = find(&events, "BackOff").unwrap();
    assert!(
        backoff
            .message
            .as_deref()
            .unwrap()
            .starts_with("Back-off restarting failed container crash in pod crasher_default(")
    );
    assert!(backoff.count.unwrap() >= 2, "the event's count grows");
}

#[tokio::test]
async fn the_kubelet_rejects_what_does_not_fit() {
    let sim = cluster_with_nodes().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    // Bound directly, bypassing the scheduler: the kubelet's own accounting rejects it.
    let spec = json!({"nodeName": "node-1", "containers": [{"name": "main", "image": "nginx:1.27", "resources": {"requests": {"cpu": "8"}}}]});
    pods.create(&PostParams::default(), &pod_with("greedy", spec))
        .await
        .unwrap();
    let failed = phase_of(&pods, "greedy", "Failed").await.status.unwrap();
    assert_eq!(failed.reason.as_deref(), Some("OutOfcpu"));
    assert_eq!(
        failed.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 8000, used: 0, capacity: 4000"
        )
    );
}

#[tokio::test]
async fn injected_rejections_from_rust() {
    let sim = cluster_with_nodes().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    sim.faults().reject_next("node-2", 1, "OutOfmemory");
    pods.create(
        &PostParams::default(),
        &pod_with("a", json!({"nodeName": "node-2"})),
    )
    .await
    .unwrap();
    let status = phase_of(&pods, "a", "Failed").await.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("OutOfmemory"));
    assert!(
        status
            .message
            .unwrap()
            .starts_with("Pod was rejected: Node didn't have enough resource: memory, requested: ")
    );
    pods.create(
        &PostParams::default(),
        &pod_with("b", json!({"nodeName": "node-2"})),
    )
    .await
    .unwrap();
    phase_of(&pods, "b", "Running").await;

    sim.faults().node_label_race("node-3");
    pods.create(
        &PostParams::default(),
        &pod_with("c", json!({"nodeName": "node-3"})),
    )
    .await
    .unwrap();
    let status = phase_of(&pods, "c", "Failed").await.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("NodeAffinity"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        )
    );
}

#[tokio::test]
async fn seeded_rejection_fractions_are_reproducible() {
    async fn outcomes(seed: u64) -> Vec<bool> {
        let sim = cluster_with(SimConfig {
            seed,
            ..SimConfig::fast()
        })
        .await;
        let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
        sim.faults().reject_fraction(0.5, "OutOfcpu");
        let mut rejected = vec![];
        for i in 0..12 {
            let name = format!("p{i}");
            pods.create(
                &PostParams::default(),
                &pod_with(&name, json!({"nodeName": "node-1"})),
            )
            .await
            .unwrap();
            let pod = eventually(WAIT, "admission", || async {
                let p = pods.get(&name).await.unwrap();
                matches!(
                    p.status.as_ref()?.phase.as_deref(),
                    Some("Running" | "Failed")
                )
                .then_some(p)
            })
            .await;
            rejected.push(pod.status.unwrap().phase.as_deref() == Some("Failed"));
        }
        rejected
    }
    let first = outcomes(42).await;
    assert_eq!(first, outcomes(42).await, "same seed, same rejections");
    assert!(
        first.iter().any(|r| *r) && first.iter().any(|r| !*r),
        "{first:?}"
    );
}

#[tokio::test]
async fn unreachable_nodes_lose_their_pods() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod_with("p", json!({"nodeName": "node-1"})),
    )
    .await
    .unwrap();
    phase_of(&pods, "p", "Running").await;
    sim.faults().set_unreachable("node-1", true);
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(WAIT, "the node to be Ready=Unknown", || async {
        let node = nodes.get("node-1").await.unwrap();
        let ready = node
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "Unknown").then_some(())
    })
    .await;
    let lost = phase_of(&pods, "p", "Unknown").await.status.unwrap();
    assert_eq!(lost.reason.as_deref(), Some("NodeLost"));
    assert_eq!(
        lost.message.as_deref(),
        Some("Node node-1 which was running pod p is unresponsive")
    );
    eventually(WAIT, "eviction", || async {
        pods.get("p")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    // Deleting the node garbage-collects its pods.
    sim.delete_node("node-1").unwrap();
    eventually(WAIT, "the pod to be gone with its node", || async {
        pods.get_opt("p").await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn api_errors_latency_and_review_outages() {
    let sim = cluster_with(SimConfig::api_only()).await;
    let client = sim.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    // kube's client retries 503 and 429 by itself; the request log shows what the server did.
    sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("create", "configmaps"),
        code: 503,
        frequency: Frequency::Next(2),
    });
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert_eq!(
        sim.count_requests(|k| k.verb == "create" && k.resource == "configmaps" && k.code == 503),
        2
    );
    assert_eq!(
        sim.count_requests(|k| k.verb == "create" && k.resource == "configmaps" && k.code == 201),
        1
    );
    sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("get", "configmaps"),
        code: 429,
        frequency: Frequency::Next(1),
    });
    cms.get("a").await.unwrap();
    assert_eq!(sim.count_requests(|k| k.verb == "get" && k.code == 429), 1);

    sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("delete", "configmaps"),
        code: 500,
        frequency: Frequency::Next(1),
    });
    let (code, reason, message) = api_error(cms.delete("a", &DeleteParams::default()).await);
    assert_eq!((code, reason.as_str()), (500, "InternalError"));
    assert_eq!(
        message,
        "Internal error occurred: injected fault (delete configmaps)"
    );
    sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("patch", "*"),
        code: 409,
        frequency: Frequency::Next(1),
    });
    let patched = cms
        .patch(
            "a",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"data": {"x": "y"}})),
        )
        .await;
    assert_eq!(api_error(patched).1, "Conflict");

    sim.faults().latency(
        RequestMatch::new("list", "configmaps"),
        Duration::from_millis(300),
    );
    let started = std::time::Instant::now();
    cms.list(&Default::default()).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "the injected latency was applied"
    );
    sim.faults().clear_api_faults();

    // A client that does not retry sees the 503 and the 429 with its Retry-After.
    let mut config = kube::Config::from_custom_kubeconfig(sim.kubeconfig(), &Default::default())
        .await
        .unwrap();
    config.default_retry = false;
    let plain = kube::Client::try_from(config).unwrap();
    sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("get", "configmaps"),
        code: 429,
        frequency: Frequency::Next(1),
    });
    let request = http::Request::get("/api/v1/namespaces/default/configmaps/a")
        .body(kube::client::Body::empty())
        .unwrap();
    let response = plain.send(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );

    sim.faults().token_review_unavailable(true);
    let reviews: Api<k8s_openapi::api::authentication::v1::TokenReview> = Api::all(plain.clone());
    let review = serde_json::from_value(json!({"spec": {"token": "x"}})).unwrap();
    let (code, reason, _) = api_error(reviews.create(&PostParams::default(), &review).await);
    assert_eq!((code, reason.as_str()), (503, "ServiceUnavailable"));
    sim.faults().token_review_unavailable(false);
    reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();

    sim.faults().subject_access_review_unavailable(true);
    let sars: Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> =
        Api::all(plain.clone());
    let sar = serde_json::from_value(
        json!({"spec": {"user": "u", "resourceAttributes": {"verb": "get", "resource": "pods"}}}),
    )
    .unwrap();
    assert_eq!(
        api_error(sars.create(&PostParams::default(), &sar).await).0,
        503
    );
    sim.faults().subject_access_review_unavailable(false);
    let answered = sars.create(&PostParams::default(), &sar).await.unwrap();
    assert!(!answered.status.unwrap().allowed);
}

#[tokio::test]
async fn watches_are_cut_periodically_on_demand() {
    let sim = cluster_with(SimConfig::api_only()).await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    sim.faults()
        .close_watches_every(Some(Duration::from_millis(300)));
    let stream = cms
        .watch(
            &kube::api::WatchParams::default().disable_bookmarks(),
            &sim.revision().to_string(),
        )
        .await
        .unwrap();
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        futures::StreamExt::collect::<Vec<_>>(stream),
    )
    .await;
    assert!(ended.is_ok(), "the server closed the watch");
}

/// A held watch sends nothing, while a read answers the current state; once released it
/// sends every event it held, in order. Watches of other resources are not held.
#[tokio::test]
async fn held_watches_send_their_events_in_order_once_released() {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{Patch, PatchParams, WatchEvent, WatchParams};
    let sim = cluster_with(SimConfig::api_only()).await;
    let client = sim.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let params = WatchParams::default().disable_bookmarks();
    let from = sim.revision().to_string();
    let mut held = cms.watch(&params, &from).await.unwrap().boxed();
    let mut free = secrets.watch(&params, &from).await.unwrap().boxed();
    sim.faults().hold_watches("configmaps", true);
    let map = |v: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "m"}, "data": {"v": v}})).unwrap()
    };
    cms.create(&PostParams::default(), &map("1")).await.unwrap();
    for v in ["2", "3"] {
        cms.patch("m", &PatchParams::default(), &Patch::Merge(map(v)))
            .await
            .unwrap();
    }
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let added = tokio::time::timeout(WAIT, free.try_next()).await.unwrap();
    assert!(
        matches!(added, Ok(Some(WatchEvent::Added(_)))),
        "another resource's watch is not held: {added:?}"
    );
    assert_eq!(cms.get("m").await.unwrap().data.unwrap()["v"], "3");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), held.next())
            .await
            .is_err(),
        "the held watch sent nothing"
    );
    sim.faults().hold_watches("configmaps", false);
    let mut seen = vec![];
    while seen.len() < 3 {
        match tokio::time::timeout(WAIT, held.try_next()).await.unwrap() {
            Ok(Some(WatchEvent::Added(m) | WatchEvent::Modified(m))) => {
                seen.push(m.data.unwrap()["v"].clone())
            }
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(seen, ["1", "2", "3"]);
}

#[tokio::test]
async fn persistent_volume_claims_are_bound() {
    let sim = cluster_with_nodes().await;
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(sim.client().await.unwrap(), "default");
    let claim = json!({"metadata": {"name": "home"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}});
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(claim).unwrap(),
        )
        .await
        .unwrap();
    let bound = eventually(WAIT, "the claim to bind", || async {
        let c = claims.get("home").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert!(bound.spec.unwrap().volume_name.unwrap().starts_with("pvc-"));
}

pub(crate) async fn started_cluster_for_kubectl() -> SimCluster {
    cluster_with_nodes().await
}

/// A quantity written as a number (`cpu: 64` in YAML) is stored as the canonical string and
/// counted by the scheduler like any other.
#[tokio::test]
async fn numeric_quantities_are_stored_as_strings_and_scheduled_on() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "numeric"},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27",
            "resources": {"requests": {"cpu": 64, "memory": 0.5}, "limits": {"cpu": 64.0}}}]}});
    let created = crate::support::post_json(&client, "/api/v1/namespaces/default/pods", &body)
        .await
        .unwrap();
    let resources = &created["spec"]["containers"][0]["resources"];
    assert_eq!(
        resources["requests"],
        json!({"cpu": "64", "memory": "500m"})
    );
    assert_eq!(resources["limits"], json!({"cpu": "64"}));
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pending = eventually(WAIT, "PodScheduled=False", || async {
        let p = pods.get("numeric").await.unwrap();
        condition(&p, "PodScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(
        pending.2.as_deref(),
        Some("0/3 nodes are available: 3 Insufficient cpu.")
    );
}

/// Small things a real API server does that clients rely on: logs name the container or say
/// why not; an eviction's Status carries its code; `spec.unschedulable=false` selects nodes
/// that never set it; creation timestamps are truncated to the second, never in the future.
#[tokio::test]
async fn logs_evictions_node_selectors_and_timestamps_answer_as_a_real_server() {
    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let two = json!({"containers": [{"name": "a", "image": "nginx:1.27"}, {"name": "b", "image": "nginx:1.27"}]});
    pods.create(&PostParams::default(), &pod_with("two", two))
        .await
        .unwrap();
    phase_of(&pods, "two", "Running").await;
    let logs = |query: &'static str| {
        let client = client.clone();
        async move {
            let request =
                http::Request::get(format!("/api/v1/namespaces/default/pods/two/log{query}"))
                    .body(vec![])
                    .unwrap();
            client.request_text(request).await
        }
    };
    assert_eq!(
        api_error(logs("").await),
        (
            400,
            "BadRequest".into(),
            "a container name must be specified for pod two, choose one of: [a b]".into()
        )
    );
    assert_eq!(
        api_error(logs("?container=c").await),
        (
            400,
            "BadRequest".into(),
            "container c is not valid for pod two".into()
        )
    );
    logs("?container=a").await.unwrap();
    let stuck = json!({"containers": [{"name": "main", "image": "registry.invalid/nothing:1"}]});
    pods.create(&PostParams::default(), &pod_with("stuck", stuck))
        .await
        .unwrap();
    let request = http::Request::get("/api/v1/namespaces/default/pods/stuck/log")
        .body(vec![])
        .unwrap();
    let (code, _, message) = api_error(client.request_text(request).await);
    assert_eq!(code, 400);
    assert!(
        message.starts_with("container \"main\" in pod \"stuck\" is waiting to start: "),
        "{message}"
    );

    let status = crate::support::post_json(
        &client,
        "/api/v1/namespaces/default/pods/two/eviction",
        &json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "two"}}),
    )
    .await
    .unwrap();
    assert_eq!(
        (status["status"].as_str(), status["code"].as_u64()),
        (Some("Success"), Some(201))
    );

    let nodes: Api<Node> = Api::all(client.clone());
    let schedulable = nodes
        .list(&ListParams::default().fields("spec.unschedulable=false"))
        .await
        .unwrap();
    assert_eq!(schedulable.items.len(), 3);

    for i in 0..10 {
        let created = Api::<ConfigMap>::namespaced(client.clone(), "default")
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("t{i}")}})).unwrap(),
            )
            .await
            .unwrap();
        let at = created.metadata.creation_timestamp.unwrap().0;
        assert!(at <= jiff::Timestamp::now(), "{at} is in the future");
    }
}

/// Changing a running container's image restarts it in place, as a real kubelet does: the same
/// pod, `Killing` ("definition changed"), the new image pulled, `restartCount` 1, running again.
#[tokio::test]
async fn a_new_image_restarts_the_container_in_the_same_pod() {
    use kube::api::{Patch, PatchParams};

    let sim = cluster_with_nodes().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod_with("web", json!({})))
        .await
        .unwrap();
    let first = phase_of(&pods, "web", "Running").await;
    let first_id = first.status.unwrap().container_statuses.unwrap()[0]
        .container_id
        .clone();
    // Every version a watcher sees: the status names the new image only for the new
    // container, never for the one still running the old image.
    let watched = {
        use futures::{StreamExt, TryStreamExt};
        let stream = pods
            .watch(
                &kube::api::WatchParams::default().fields("metadata.name=web"),
                &sim.revision().to_string(),
            )
            .await
            .unwrap()
            .boxed();
        tokio::spawn(async move {
            let mut stream = stream;
            let mut claimed_early = vec![];
            // Until the new container runs (or the watch falls silent for a while).
            while let Ok(Ok(Some(event))) =
                tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await
            {
                let kube::api::WatchEvent::Modified(pod) = event else {
                    continue;
                };
                let Some(status) = pod.status.and_then(|s| s.container_statuses) else {
                    continue;
                };
                let running = status[0]
                    .state
                    .as_ref()
                    .is_some_and(|s| s.running.is_some());
                if status[0].image == "nginx:1.28" && running {
                    if status[0].container_id == first_id {
                        claimed_early.push(status[0].clone());
                    } else {
                        break;
                    }
                }
            }
            claimed_early
        })
    };
    let change: json_patch::Patch = serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:1.28"}]),
    )
    .unwrap();
    pods.patch("web", &PatchParams::default(), &Patch::Json::<()>(change))
        .await
        .unwrap();
    let restarted = eventually(WAIT, "the container to run the new image", || async {
        let pod = pods.get("web").await.unwrap();
        let status = pod
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        (status.image == "nginx:1.28"
            && status.restart_count == 1
            && status.state.as_ref()?.running.is_some())
        .then_some(pod)
    })
    .await;
    assert_eq!(restarted.metadata.uid, created.metadata.uid, "the same pod");
    let claimed_early = watched.await.unwrap();
    assert!(claimed_early.is_empty(), "{claimed_early:?}");
    let events = events_for(&client, &created).await;
    let killing = find(&events, "Killing").expect("a Killing event");
    assert_eq!(
        killing.message.as_deref(),
        Some("Container main definition changed, will be restarted")
    );
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("Pulling")
            && e.message
                .as_deref()
                .is_some_and(|m| m.contains("nginx:1.28"))),
        "the new image was pulled"
    );
}

/// Every version of a starting pod a watcher sees is consistent, as the kubelet writes its
/// status in one piece: the update that says the first container runs also says the pod is
/// `Running`, never a running container in a `Pending` pod (which a controller would read as
/// "not started yet").
#[tokio::test]
async fn a_pod_is_running_in_the_same_update_as_its_first_running_container() {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{WatchEvent, WatchParams};

    let sim = cluster_with_nodes().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    let from = sim.revision().to_string();
    pods.create(&PostParams::default(), &pod_with("web", json!({})))
        .await
        .unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().fields("metadata.name=web"), &from)
        .await
        .unwrap()
        .boxed();
    let mut seen = vec![];
    let first_running = tokio::time::timeout(WAIT, async {
        while let Some(event) = stream.try_next().await.unwrap() {
            let (WatchEvent::Added(pod) | WatchEvent::Modified(pod)) = event else {
                continue;
            };
            let status = pod.status.clone().unwrap_or_default();
            let running = status
                .container_statuses
                .iter()
                .flatten()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
            let phase = status.phase.clone().unwrap_or_default();
            seen.push((phase.clone(), running));
            if running || phase == "Running" {
                return (phase, running);
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the pod to start");
    assert_eq!(
        first_running,
        ("Running".to_owned(), true),
        "versions seen: {seen:?}"
    );
}

/// `log?follow=true` (kubectl logs -f) stays connected while the container runs and ends when
/// it stops, as with a real kubelet.
#[tokio::test]
async fn following_logs_stays_open_until_the_container_stops() {
    use futures::AsyncBufReadExt;
    let sim = cluster_with_nodes().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    pods.create(&PostParams::default(), &pod_with("tail", json!({})))
        .await
        .unwrap();
    phase_of(&pods, "tail", "Running").await;
    let params = kube::api::LogParams {
        follow: true,
        ..Default::default()
    };
    let mut lines = pods.log_stream("tail", &params).await.unwrap().lines();
    use futures::StreamExt;
    let early = tokio::time::timeout(Duration::from_millis(800), lines.next()).await;
    assert!(
        early.is_err(),
        "still open while the container runs: {early:?}"
    );
    pods.delete("tail", &DeleteParams::default()).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), lines.next()).await;
    assert!(
        matches!(ended, Ok(None)),
        "ends once the container stopped: {ended:?}"
    );
}

/// A lost reply: the write is carried out and stored, and the client hears an error, from
/// Rust and from the faults ConfigMap.
#[tokio::test]
async fn a_lost_reply_is_a_write_that_landed_with_an_error_for_an_answer() {
    let sim = cluster_with(SimConfig::api_only()).await;
    let client = sim.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    sim.faults().lost_reply(ApiFault {
        matching: RequestMatch::new("create", "configmaps"),
        code: 500,
        frequency: Frequency::Next(1),
    });
    let (code, _, message) = api_error(cms.create(&PostParams::default(), &cm("landed")).await);
    assert_eq!(code, 500);
    assert_eq!(
        message,
        "Internal error occurred: injected fault (create configmaps)"
    );
    assert!(
        cms.get_opt("landed").await.unwrap().is_some(),
        "the write landed"
    );
    // A retry meets what the lost write made, as against a real server.
    let (code, reason, _) = api_error(cms.create(&PostParams::default(), &cm("landed")).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    let faults: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    faults
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "berth-sim-faults"},
                "data": {"lost-replies": "delete configmaps 500 next=1"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the ConfigMap's lost reply",
        || async {
            let answer = cms.delete("landed", &DeleteParams::default()).await;
            matches!(answer, Err(kube::Error::Api(ref s)) if s.code == 500).then_some(())
        },
    )
    .await;
    assert!(
        cms.get_opt("landed").await.unwrap().is_none(),
        "the delete landed"
    );
}

/// `kubectl get --raw /api/v1/nodes/NODE/proxy/...` reaches the node's kubelet: its health,
/// the pods it runs, its configuration and its metrics; a path it does not serve is its 404;
/// a user without `get` on `nodes/proxy` gets the real 403.
#[tokio::test]
async fn the_node_proxy_reaches_the_kubelets_endpoints() {
    let sim = cluster_with_nodes().await;
    let Some(kubectl) = crate::kubectl::Kubectl::for_cluster(&sim) else {
        return;
    };
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(
        &PostParams::default(),
        &pod_with("pinned", json!({"nodeName": "node-2"})),
    )
    .await
    .unwrap();
    phase_of(&pods, "pinned", "Running").await;
    let raw = |path: &str| format!("/api/v1/nodes/{path}");
    assert_eq!(
        kubectl
            .ok(&["get", "--raw", &raw("node-2/proxy/healthz")])
            .await,
        "ok"
    );
    let list: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "--raw", &raw("node-2/proxy/pods")])
            .await,
    )
    .unwrap();
    assert_eq!(list["kind"], "PodList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["pinned"]);
    let other: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "--raw", &raw("node-1:10250/proxy/pods")])
            .await,
    )
    .unwrap();
    assert_eq!(other["items"], json!([]));
    let config: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "--raw", &raw("node-2/proxy/configz")])
            .await,
    )
    .unwrap();
    assert_eq!(config["kubeletconfig"]["kind"], "KubeletConfiguration");
    let metrics = kubectl
        .ok(&["get", "--raw", &raw("node-2/proxy/metrics")])
        .await;
    assert!(metrics.contains("kubelet_running_pods 1\n"), "{metrics}");
    let missing = kubectl
        .fails(&["get", "--raw", &raw("node-2/proxy/no-such-endpoint")])
        .await;
    // The kubelet's 404 is plain text, which kubectl reports as any 404 without a Status.
    assert!(
        missing.contains("(NotFound): the server could not find the requested resource"),
        "{missing}"
    );
    let missing = kubectl
        .fails(&["get", "--raw", &raw("node-9/proxy/healthz")])
        .await;
    assert!(missing.contains("nodes \"node-9\" not found"), "{missing}");
    let refused = kubectl
        .fails(&["get", "--raw", &raw("node-2/proxy/pods"), "--as=nobody"])
        .await;
    assert!(
        refused.contains(
            "nodes \"node-2\" is forbidden: User \"nobody\" cannot get resource \"nodes/proxy\" in API group \"\" at the cluster scope"
        ),
        "{refused}"
    );
}

/// `pods/resize` (kube-rs's `get_resize`/`patch_resize`, as its `pod_resize` example, and
/// `kubectl patch --subresource resize`): only cpu and memory of containers change, in place,
/// in the same pod, and the status says what it runs with; what a resize may not do is
/// refused in the server's words.
#[tokio::test]
async fn a_pod_is_resized_in_place_through_its_resize_subresource() {
    use kube::api::{Patch, PatchParams};

    let sim = cluster_with_nodes().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    let resources = json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "200m", "memory": "256Mi"}});
    let created = pods
        .create(
            &PostParams::default(),
            &pod_with("resize-demo", json!({"containers": [{"name": "main", "image": "nginx:1.27", "resources": resources}]})),
        )
        .await
        .unwrap();
    let running = phase_of(&pods, "resize-demo", "Running").await;
    let status = running.status.unwrap().container_statuses.unwrap()[0].clone();
    assert_eq!(
        serde_json::to_value(status.resources).unwrap(),
        resources,
        "the status says what the container runs with"
    );
    let read = pods.get_resize("resize-demo").await.unwrap();
    assert_eq!(read.metadata.uid, created.metadata.uid);

    let bigger = json!({"requests": {"cpu": "150m", "memory": "256Mi"}, "limits": {"cpu": "300m", "memory": "512Mi"}});
    // An image in a resize is dropped, not applied: only resources change.
    let patch = json!({"spec": {"containers": [{"name": "main", "image": "nginx:1.28", "resources": bigger}]}});
    let resized = pods
        .patch_resize(
            "resize-demo",
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .unwrap();
    let container = &resized.spec.as_ref().unwrap().containers[0];
    assert_eq!(serde_json::to_value(&container.resources).unwrap(), bigger);
    assert_eq!(container.image.as_deref(), Some("nginx:1.27"));
    assert_eq!(resized.metadata.generation, Some(2));
    let applied = eventually(WAIT, "the kubelet to apply the resize", || async {
        let pod = pods.get("resize-demo").await.unwrap();
        let status = pod
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        (serde_json::to_value(&status.resources).ok()? == bigger).then_some(status)
    })
    .await;
    assert_eq!(applied.restart_count, 0, "resized in place");

    // Through the pod itself, resources stay immutable.
    let (code, _, message) = api_error(
        pods.patch(
            "resize-demo",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "main", "resources": resources}]}}),
            ),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("pod updates may not change fields other than"),
        "{message}"
    );
    // A smaller memory limit needs RestartContainer; the QoS class may not change.
    let smaller = json!({"spec": {"containers": [{"name": "main", "resources": resources}]}});
    let (code, _, message) = api_error(
        pods.patch_resize(
            "resize-demo",
            &PatchParams::default(),
            &Patch::Strategic(smaller),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.containers[0].resources.limits[memory]: Forbidden: memory limits cannot be decreased unless resizePolicy is RestartContainer"),
        "{message}"
    );
    let guaranteed = json!({"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "300m", "memory": "512Mi"}, "limits": {"cpu": "300m", "memory": "512Mi"}}}]}});
    let (code, _, message) = api_error(
        pods.patch_resize(
            "resize-demo",
            &PatchParams::default(),
            &Patch::Strategic(guaranteed),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec: Invalid value: \"Guaranteed\": Pod QOS Class may not change as a result of resizing"),
        "{message}"
    );

    // kubectl's own resize (1.33 speaks --subresource resize).
    if let Some(kubectl) = crate::kubectl::Kubectl::version(&sim, "1.33") {
        kubectl
            .ok(&[
                "patch", "pod", "resize-demo", "--subresource", "resize", "--patch",
                r#"{"spec":{"containers":[{"name":"main","resources":{"requests":{"cpu":"200m"}}}]}}"#,
            ])
            .await;
        let cpu = kubectl
            .ok(&[
                "get",
                "pod",
                "resize-demo",
                "-o",
                "jsonpath={.spec.containers[0].resources.requests.cpu}",
            ])
            .await;
        assert_eq!(cpu, "200m");
    }
}
