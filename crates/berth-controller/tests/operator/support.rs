//! A simulated cluster with the Workspace CRD and the operator running in-process, as its own
//! service account so the request log tells its requests apart.

use std::time::Duration;

use berth_api::{Phase, Workspace};
use berth_controller::{Config, Policy, config::AgentConfig};
use berth_sim::{SimCluster, SimConfig};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

pub const OPERATOR: &str = "system:serviceaccount:berth-system:berth-controller";

/// The fast sim, with the Berth agent running in-process in workspace pods.
pub fn sim_config() -> SimConfig {
    SimConfig {
        runtime: std::sync::Arc::new(berth_agent::sim_runtime::AgentRuntime::default()),
        ..SimConfig::fast()
    }
}
pub const WAIT: Duration = Duration::from_secs(20);

pub struct Harness {
    pub sim: SimCluster,
    /// The superuser client the test acts with.
    pub client: Client,
    operator_client: Client,
    config: Config,
    operator: Option<tokio::task::JoinHandle<()>>,
    /// The operator's metrics, shared across restarts.
    pub metrics: std::sync::Arc<berth_controller::metrics::Metrics>,
    /// This test's logs (see [`LogBuffer::capture`]); a multi-threaded test's worker threads
    /// log elsewhere.
    pub logs: LogBuffer,
    _logging: tracing::subscriber::DefaultGuard,
}

/// Operator settings for tests: the safety-net requeues are an hour, so anything that happens
/// within a test happened because an event arrived, not because of polling.
pub fn test_config() -> Config {
    Config {
        policy: Policy {
            max_requeue: Duration::from_secs(3600),
            resync: Duration::from_secs(3600),
            deletion_grace: Duration::from_secs(2),
            ..Policy::default()
        },
        agent: AgentConfig {
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(2),
            ..AgentConfig::default()
        },
        event_retry: berth_controller::recorder::Retry {
            attempts: 6,
            first: Duration::from_millis(100),
            max: Duration::from_millis(800),
        },
        ..Config::default()
    }
}

/// [`test_config`] with leader election on the Lease `berth-system/berth-controller`, as
/// `berth-controller-0`, with a 2 s Lease renewed each second.
pub fn leading_config() -> Config {
    Config {
        leader_election: Some(berth_controller::config::LeaderElection {
            lease: "berth-controller".into(),
            namespace: "berth-system".into(),
            identity: "berth-controller-0".into(),
            duration_seconds: 2,
            grace_seconds: 1,
        }),
        ..test_config()
    }
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_with(sim_config(), test_config()).await
    }

    pub async fn start_with(sim_config: SimConfig, config: Config) -> Harness {
        let logs = LogBuffer::default();
        let logging = logs.capture();
        let sim = SimCluster::start(sim_config).await.expect("the sim starts");
        let client = sim.client().await.unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in berth_api::crd::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        // The RBAC the README documents: the operator runs with exactly this.
        for manifest in [
            berth_controller::rbac::OPERATOR,
            berth_controller::rbac::ADMISSION_POLICY,
            berth_controller::rbac::WORKSPACE_SERVICE_ACCOUNT,
        ] {
            berth_sim::manifests::create_all(&client, manifest, "default")
                .await
                .unwrap();
        }
        let token = sim
            .issue_token(
                "berth-system",
                "berth-controller",
                &[],
                Duration::from_secs(3600),
            )
            .unwrap();
        let operator_client = sim.client_with_token(&token).await.unwrap();
        let mut harness = Harness {
            sim,
            client,
            operator_client,
            config,
            operator: None,
            metrics: Default::default(),
            logs,
            _logging: logging,
        };
        harness.start_operator();
        harness
    }

    pub fn start_operator(&mut self) {
        let (client, config, metrics) = (
            self.operator_client.clone(),
            self.config.clone(),
            self.metrics.clone(),
        );
        self.operator = Some(tokio::spawn(async move {
            let _ = berth_controller::run_with_metrics(client, config, metrics).await;
        }));
    }

    /// Changes the operator's settings from its next start on.
    pub fn configure(&mut self, change: impl FnOnce(&mut Config)) {
        change(&mut self.config);
    }

    pub async fn stop_operator(&mut self) {
        if let Some(task) = self.operator.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Unbinds the admission policy of `deploy/admission/`, as a cluster where an admin removed
    /// it: the API server checks nothing of a workspace's spec, only the operator does.
    pub async fn without_admission_policy(&self) {
        let resource = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
        ));
        let bindings: Api<kube::api::DynamicObject> = Api::all_with(self.client.clone(), &resource);
        bindings
            .delete("workspaces.berth.dev", &Default::default())
            .await
            .unwrap();
    }

    pub fn workspaces(&self) -> Api<Workspace> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub async fn create(&self, name: &str, spec: Value) -> Workspace {
        let body = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name}, "spec": spec});
        self.workspaces()
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap()
    }

    /// Creates a workspace asking for 12 CPUs, more than any node of the sim has, and waits
    /// until it says its pod is unschedulable; [`Harness::add_big_node`] lets it start.
    pub async fn create_unschedulable(&self, name: &str) -> Workspace {
        self.create(
            name,
            json!({"image": "devbox:1", "resources": {"requests": {"cpu": "12"}}}),
        )
        .await;
        self.until(name, "Unschedulable", |ws| {
            condition(ws, "PodScheduled").is_some_and(|c| c.reason == "Unschedulable")
        })
        .await
    }

    /// Adds `node-big`, a node where a workspace of [`Harness::create_unschedulable`] fits.
    pub fn add_big_node(&self) {
        self.sim
            .add_node(berth_sim::NodeConfig::new("node-big").capacity("16", "64Gi", 110));
    }

    pub async fn patch_spec(&self, name: &str, spec: Value) {
        self.workspaces()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await
            .unwrap();
    }

    /// Waits until `check` holds for the workspace, returning it; on timeout the panic shows
    /// the last status seen.
    pub async fn until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Workspace) -> bool,
    ) -> Workspace {
        let api = self.workspaces();
        let last = std::sync::Mutex::new(None);
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(Some(ws)) = api.get_opt(name).await {
                    if check(&ws) {
                        return ws;
                    }
                    *last.lock().unwrap() = ws.status.clone();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        match found {
            Ok(ws) => ws,
            Err(_) => panic!(
                "timed out after {WAIT:?} waiting for {what}; last status: {:#?}",
                last.lock().unwrap()
            ),
        }
    }

    /// Waits until the workspace's `Ready` condition is False with `reason`.
    pub async fn until_not_ready(&self, name: &str, reason: &str) -> Workspace {
        self.until(name, &format!("Ready=False ({reason})"), |ws| {
            condition(ws, "Ready").is_some_and(|c| c.status == "False" && c.reason == reason)
        })
        .await
    }

    pub async fn until_phase(&self, name: &str, phase: Phase) -> Workspace {
        self.until(name, &format!("{name} to be {phase}"), |ws| {
            phase_of(ws) == Some(phase)
        })
        .await
    }

    /// Binds `system:auth-delegator` to a workspace service account, as the README says to
    /// (the kubectl line the agent's error message points at).
    pub async fn grant_auth_delegator(&self, namespace: &str, account: &str) {
        let binding = format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: berth-agent-{namespace}-{account}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: {account}
    namespace: {namespace}
"
        );
        berth_sim::manifests::create_all(&self.client, &binding, "default")
            .await
            .unwrap();
    }

    /// How many reconciles the operator has finished (all runs of it), from its metrics.
    pub fn reconciles(&self) -> u64 {
        self.metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("berth_reconcile_duration_seconds_count"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Waits until the operator has finished `more` reconciles beyond `from`.
    pub async fn until_reconciled(&self, from: u64, more: u64) {
        eventually(WAIT, &format!("{more} more reconciles"), || async {
            (self.reconciles() >= from + more).then_some(())
        })
        .await
    }

    /// Wakes workspace `name` without changing its spec (a label), and waits for the operator
    /// to have reconciled once more: what a check that something does NOT happen waits for.
    pub async fn poke(&self, name: &str) {
        let before = self.reconciles();
        let label = before.to_string();
        self.workspaces()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"poked": label}}})),
            )
            .await
            .unwrap();
        self.until_reconciled(before, 1).await;
    }

    /// The value of the metric line `series` (name and labels, as rendered), 0 when absent.
    pub fn metric(&self, series: &str) -> u64 {
        let needle = format!("{series} ");
        self.metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(needle.as_str()))
            .map(|n| n.trim().parse().unwrap())
            .unwrap_or(0)
    }

    /// Requests the operator made with one of `verbs`.
    pub fn operator_requests(&self, verbs: &[&str]) -> u64 {
        self.sim
            .count_requests(|k| k.user == OPERATOR && verbs.contains(&k.verb.as_str()))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(task) = self.operator.take() {
            task.abort();
        }
    }
}

/// The (reason, message) of every event about the object with `uid`.
pub async fn events_about(h: &Harness, uid: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(h.client.clone(), "default");
    events
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

pub fn phase_of(ws: &Workspace) -> Option<Phase> {
    ws.status.as_ref().and_then(|s| s.phase)
}

pub fn message_of(ws: &Workspace) -> String {
    ws.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}

pub fn condition<'a>(
    ws: &'a Workspace,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    ws.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// One test's log lines (its operator, its sim and the sim's in-process agents): tests assert
/// what is, and is not, in them.
#[derive(Clone, Default)]
pub struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    /// Makes this buffer the log of everything that runs on the calling thread until the guard
    /// drops: in a current-thread test, the test and every task it spawned (the operator, the
    /// sim, the agents), and nothing of the tests running beside it.
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,berth_controller=debug,berth_agent=debug,kube=debug",
            ))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
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

/// What a workspace's status went through, recorded by a watch started before the test acts.
pub struct Recording<T> {
    stop_at: tokio::sync::watch::Sender<Option<String>>,
    task: tokio::task::JoinHandle<Vec<T>>,
}

/// Records `view` of every version of workspace `name` (consecutive repeats once), from
/// before it exists until [`Recording::through`].
pub fn record<T>(
    h: &Harness,
    name: &str,
    view: impl Fn(&Workspace) -> T + Send + 'static,
) -> Recording<T>
where
    T: PartialEq + Send + 'static,
{
    use futures::StreamExt;
    use kube::{
        ResourceExt,
        runtime::{WatchStreamExt, watcher},
    };

    let stream = watcher(
        h.workspaces(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .applied_objects();
    let (stop_at, mut target) = tokio::sync::watch::channel(None::<String>);
    let task = tokio::spawn(async move {
        let mut seen: Vec<T> = vec![];
        let mut versions = std::collections::HashSet::new();
        let cap = tokio::time::sleep(WAIT);
        futures::pin_mut!(stream, cap);
        loop {
            let reached = |versions: &std::collections::HashSet<String>,
                           target: &Option<String>| {
                target.as_ref().is_some_and(|rv| versions.contains(rv))
            };
            tokio::select! {
                next = stream.next() => match next {
                    Some(Ok(ws)) => {
                        let entry = view(&ws);
                        if seen.last() != Some(&entry) {
                            seen.push(entry);
                        }
                        versions.extend(ws.resource_version());
                    }
                    Some(Err(_)) => continue,
                    None => break,
                },
                changed = target.changed() => if changed.is_err() { break },
                _ = &mut cap => break,
            }
            if reached(&versions, &target.borrow()) {
                break;
            }
        }
        seen
    });
    Recording { stop_at, task }
}

impl<T> Recording<T> {
    /// Everything recorded up to and including `last`, a version the test read (the watch
    /// catches up to it; it gives up after [`WAIT`]).
    pub async fn through(self, last: &Workspace) -> Vec<T> {
        let _ = self.stop_at.send(Some(
            kube::ResourceExt::resource_version(last).unwrap_or_default(),
        ));
        self.task.await.expect("the recording task")
    }
}
