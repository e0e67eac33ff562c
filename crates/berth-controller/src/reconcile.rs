//! The reconcile loop: kube-runtime's `Controller` on Workspaces, woken by changes of the pods,
//! claims and services Berth owns and by Warning events of pods (rule C1). Each reconcile
//! observes from caches (rule C3), hands the decision to the pure core, acts, and writes the
//! status only when it changed (rule C16).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Instant,
};

use berth_api::{Workspace, WorkspaceKind, WorkspaceStatus, condition::event_reasons, labels};
use berth_core::shard::Shard;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    core::v1::{Event, PersistentVolumeClaim, Pod, Service},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action as Requeue,
        finalizer::{Event as Finalizer, finalizer},
        reflector::{self, ObjectRef, Store, reflector},
        watcher,
    },
};
use serde_json::json;
use tracing::{info, warn};

use crate::{
    Error, Result,
    agent::AgentChecker,
    cached_pod::CachedPod,
    caches::CachesReady,
    config::{Config, LeaderElection},
    event_index::EventIndex,
    metrics::{Metrics, ReasonLabel},
    ownership::{Derived, Foreign, Met},
    pod,
    recorder::{EventType, Recorder, Report, Reporter},
    refusal::Refusal,
    state::{self, Action, Decision, Observed},
    trim::WorkspaceWire,
};

/// Everything a reconcile needs: the client, the caches, the recorder, the metrics.
pub struct Context {
    pub client: Client,
    pub config: Config,
    pub pods: Store<CachedPod>,
    pub claims: Store<PersistentVolumeClaim>,
    pub services: Store<Service>,
    pub events: Store<Event>,
    /// The admission policies and their bindings (the one of `deploy/admission/` matters).
    pub admission_policies: Store<ValidatingAdmissionPolicy>,
    pub admission_bindings: Store<ValidatingAdmissionPolicyBinding>,
    /// The WorkspaceKinds (cluster-scoped): what a workspace of a kind is shaped by.
    pub kinds: Store<WorkspaceKind>,
    /// Opens once every cache above has its first list.
    pub caches: CachesReady,
    /// The events in `events` by the UID of their pod.
    pub event_index: Arc<EventIndex>,
    pub workspaces: Store<Workspace>,
    pub recorder: Arc<Recorder>,
    pub metrics: Arc<Metrics>,
    /// WhoAmI calls to the agents of ready pods (rules C14, C15).
    pub agents: AgentChecker,
    /// Consecutive failures per workspace, for per-object backoff (rule C19).
    failures: std::sync::Mutex<HashMap<ObjectRef<Workspace>, u32>>,
    /// The API server's last refusal of an action per workspace, until that action succeeds.
    refusals: std::sync::Mutex<HashMap<ObjectRef<Workspace>, Refusal>>,
    /// Objects of a derived name that a create met and that are not the workspace's own, per
    /// workspace, until a create of that name succeeds (the caches do not show them).
    taken: std::sync::Mutex<HashMap<ObjectRef<Workspace>, Vec<Foreign>>>,
    /// The workspace versions this operator's own status writes replaced.
    replaced: crate::caches::OwnWrites<Workspace>,
    /// Objects this operator just created or applied, which its caches may not show yet:
    /// (kind, namespace, name) -> when the API server accepted it. The core decides with it
    /// (`state::Expectations`).
    expectations: std::sync::Mutex<HashMap<(&'static str, String, String), Timestamp>>,
    /// When this operator last wrote the status of a workspace that is starting, to write
    /// its progress at most once per `progress_interval` (rule C16).
    progress_writes: std::sync::Mutex<HashMap<ObjectRef<Workspace>, Timestamp>>,
    /// Per namespace: whether admission enforced there at this operator's last look, and the
    /// resourceVersion at which it saw it begin to (`Observed::admission_since`).
    admission_seen: std::sync::Mutex<HashMap<String, (bool, Option<u64>)>>,
    /// Held by whoever reconciles a workspace: the controller's workers and the agent lane
    /// never reconcile one workspace at the same time.
    reconciling: crate::lanes::KeyedLocks<ObjectRef<Workspace>>,
    /// Tells the agent lane when the cache shows a newer copy of a workspace.
    arrivals: Arc<crate::lanes::Arrivals<ObjectRef<Workspace>>>,
}

impl Context {
    /// Notes whether admission enforces in `namespace` now (`Some` of the resourceVersion it
    /// stands on) and returns the version at which this operator saw it begin to, if it did.
    fn admission_since(&self, namespace: &str, enforcing: Option<u64>) -> Option<u64> {
        let mut seen = self
            .admission_seen
            .lock()
            .expect("the lock is never poisoned");
        let entry = seen
            .entry(namespace.to_owned())
            .or_insert((enforcing.is_some(), None));
        match enforcing {
            Some(version) if !entry.0 => *entry = (true, Some(version)),
            Some(_) => {}
            None => entry.0 = false,
        }
        entry.1
    }

    /// When `what` was created for (namespace, name), while the caches do not show it.
    fn expected(&self, what: &'static str, namespace: &str, name: &str) -> Option<Timestamp> {
        let expectations = self.expectations.lock().unwrap_or_else(|p| p.into_inner());
        // Only this key is looked at: a scan of every expectation would cost each create
        // O(workspaces starting).
        expectations
            .get(&(what, namespace.to_owned(), name.to_owned()))
            .copied()
    }

    fn expect(&self, what: &'static str, namespace: &str, name: &str) {
        self.expectations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (what, namespace.to_owned(), name.to_owned()),
                Timestamp::now(),
            );
    }

    /// The last refusal of an action for the workspace, as seen from a later reconcile.
    fn refusal(&self, workspace: &ObjectRef<Workspace>) -> Option<Refusal> {
        let refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        refusals.get(workspace).map(|r| Refusal {
            fresh: false,
            ..r.clone()
        })
    }

    fn set_refusal(&self, workspace: &ObjectRef<Workspace>, refusal: Option<Refusal>) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        match refusal {
            Some(r) => refusals.insert(workspace.clone(), r),
            None => refusals.remove(workspace),
        };
    }

    /// What creates of the workspace's derived names met that is someone else's.
    fn taken(&self, workspace: &ObjectRef<Workspace>) -> Vec<Foreign> {
        let taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        taken.get(workspace).cloned().unwrap_or_default()
    }

    /// Remembers what a create of `kind` met (`None`: the create succeeded, the name is free).
    fn set_taken(&self, workspace: &ObjectRef<Workspace>, kind: Derived, met: Option<Foreign>) {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let entry = taken.entry(workspace.clone()).or_default();
        entry.retain(|f| f.kind != kind);
        entry.extend(met);
        if entry.is_empty() {
            taken.remove(workspace);
        }
    }

    /// How long before `now` this operator wrote the status of the starting `workspace`, if
    /// it did.
    fn since_progress_write(
        &self,
        workspace: &ObjectRef<Workspace>,
        now: Timestamp,
    ) -> Option<std::time::Duration> {
        let writes = self
            .progress_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let at = *writes.get(workspace)?;
        std::time::Duration::try_from(now.duration_since(at)).ok()
    }

    /// Remembers a status write while the workspace starts; forgets it once it does not.
    fn wrote_status(&self, workspace: &ObjectRef<Workspace>, phase: Option<berth_api::Phase>) {
        let mut writes = self
            .progress_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match phase {
            Some(berth_api::Phase::Pending | berth_api::Phase::Starting) => {
                writes.insert(workspace.clone(), Timestamp::now())
            }
            _ => writes.remove(workspace),
        };
    }

    fn forget(&self, what: &'static str, namespace: &str, name: &str) {
        self.expectations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(what, namespace.to_owned(), name.to_owned()));
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The objects Berth made for the workspaces of `shard`.
fn owned(shard: Shard) -> watcher::Config {
    let managed = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    watcher::Config::default().labels(&match shard.selector() {
        Some(buckets) => format!("{managed},{buckets}"),
        None => managed,
    })
}

/// Whether a watch event is about an object in one of `shard`'s namespaces (what an API
/// server's selector cannot tell: Events carry no labels, and a label set by hand may be
/// wrong).
fn in_shard<K: ResourceExt>(shard: Shard, event: &watcher::Event<K>) -> bool {
    match event {
        watcher::Event::Apply(object)
        | watcher::Event::InitApply(object)
        | watcher::Event::Delete(object) => object.namespace().is_none_or(|ns| shard.owns(&ns)),
        watcher::Event::Init | watcher::Event::InitDone => true,
    }
}

/// How long in-flight reconciles may go on after a shutdown was asked for; then they are
/// abandoned (each reconcile is safe to cut short: the next leader derives everything again).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the operator, serving its metrics and health endpoints, until SIGTERM or Ctrl-C.
pub async fn run(client: Client, config: Config) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    if config.metrics_address.is_some() || config.health_address.is_some() {
        let (m, h, served) = (
            config.metrics_address,
            config.health_address,
            metrics.clone(),
        );
        tokio::spawn(crate::metrics::serve(served, m, h).await?);
    }
    run_until(client, config, metrics, termination()).await
}

/// [`run`] with metrics the caller keeps (tests read them), until SIGTERM or Ctrl-C.
pub async fn run_with_metrics(client: Client, config: Config, metrics: Arc<Metrics>) -> Result<()> {
    run_until(client, config, metrics, termination()).await
}

/// SIGTERM (what the kubelet sends to stop a pod) or Ctrl-C.
pub async fn termination() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// The operator until `shutdown` resolves. Then it takes no new work, lets in-flight
/// reconciles finish for at most [`SHUTDOWN_GRACE`], releases the Lease (so a standby takes
/// over at once instead of after the lease duration) and returns. With leader election,
/// reconciles run only while this replica holds the Lease and stop at once when it is lost.
pub async fn run_until(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // Not ready until this run says so (metrics may outlive an earlier run in one process).
    metrics
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let (stop_sender, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        info!("shutdown requested: taking no new work");
        let _ = stop_sender.send(true);
    });
    let Some(election) = config.leader_election.clone() else {
        return run_controller(client, config, metrics, stop, Shard::ALL).await;
    };
    let sharding = config.sharding;
    if sharding.count <= 1 {
        return lead(client, config, metrics, stop, election, Shard::ALL).await;
    }
    // One Lease per shard; the preferred one is competed for at once, the others only once
    // their holders are gone.
    let shards = (0..sharding.count).filter_map(|index| {
        let shard = Shard::new(index, sharding.count)?;
        let election = LeaderElection {
            lease: format!("{}-shard-{}", election.lease, shard.name()),
            ..election.clone()
        };
        let (client, config, metrics, mut stop) = (
            client.clone(),
            config.clone(),
            metrics.clone(),
            stop.clone(),
        );
        Some(async move {
            if index != sharding.preferred % sharding.count {
                let patience = std::time::Duration::from_secs(election.duration_seconds);
                tokio::select! {
                    () = tokio::time::sleep(patience) => {}
                    _ = stop.wait_for(|stopped| *stopped) => return Ok(()),
                }
            }
            lead(client, config, metrics, stop, election, shard).await
        })
    });
    let results = futures::future::join_all(shards).await;
    results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
}

/// Competes for `election`'s Lease and reconciles `shard` while holding it, until `stop`;
/// then releases it.
async fn lead(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Receiver<bool>,
    election: LeaderElection,
    shard: Shard,
) -> Result<()> {
    let waiting_metrics = metrics.clone();
    let waiting = move |why: Option<String>| waiting_metrics.wait_for(why);
    let mut held = crate::leader::hold(client.clone(), &election, &waiting).await?;
    // Standby replicas are ready too (they serve health and wait).
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut stopping = stop.clone();
    let result = loop {
        tokio::select! {
            () = crate::leader::until(&mut held.leading, true) => {}
            _ = stopping.wait_for(|stopped| *stopped) => break Ok(()),
        }
        info!(identity = %election.identity, lease = %election.lease, shard = %shard.name(), "leading: reconciling");
        let mut leading = held.leading.clone();
        tokio::select! {
            result = run_controller(client.clone(), config.clone(), metrics.clone(), stop.clone(), shard) => break result,
            () = crate::leader::until(&mut leading, false) => {
                metrics.forget_phases(shard.index());
                warn!(identity = %election.identity, lease = %election.lease, "lost the lease: reconciling stopped");
            }
        }
    };
    // Dropping the last receiver makes the lease task release the Lease.
    drop(held.leading);
    if tokio::time::timeout(std::time::Duration::from_secs(5), held.task)
        .await
        .is_err()
    {
        warn!(identity = %election.identity, "the lease was not released in time; it expires by itself");
    } else {
        info!(identity = %election.identity, lease = %election.lease, "released the lease");
    }
    result
}

async fn run_controller(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Receiver<bool>,
    shard: Shard,
) -> Result<()> {
    let namespace = config.namespace.clone();
    let ns = namespace.as_deref();

    let (pods, pods_writer) = reflector::store::<CachedPod>();
    let pod_stream = reflector(
        pods_writer,
        watcher(api::<CachedPod>(&client, ns), owned(shard)).default_backoff(),
    )
    .touched_objects();
    let (claims, claims_writer) = reflector::store::<PersistentVolumeClaim>();
    let claim_stream = reflector(
        claims_writer,
        watcher(api::<PersistentVolumeClaim>(&client, ns), owned(shard))
            .default_backoff()
            .modify(crate::trim::managed_fields),
    )
    .touched_objects();
    let (services, services_writer) = reflector::store::<Service>();
    let service_stream = reflector(
        services_writer,
        watcher(api::<Service>(&client, ns), owned(shard))
            .default_backoff()
            .modify(crate::trim::managed_fields),
    )
    .touched_objects();
    let (events, events_writer) = reflector::store::<Event>();
    let event_index = Arc::new(EventIndex::default());
    let indexed = event_index.clone();
    let warning_events = watcher::Config::default().fields("involvedObject.kind=Pod,type=Warning");
    let event_stream = reflector(
        events_writer,
        watcher(api::<Event>(&client, ns), warning_events)
            .default_backoff()
            .try_filter(move |event| std::future::ready(in_shard(shard, event)))
            .modify(crate::trim::managed_fields),
    )
    .inspect_ok(move |change| indexed.apply(change))
    .touched_objects();

    // The admission policy: a change (installed, removed) wakes every workspace that names
    // another object, since whether it may get a pod depends on it.
    let (admission_policies, policies_writer) = reflector::store::<ValidatingAdmissionPolicy>();
    let policy_stream = reflector(
        policies_writer,
        watcher(
            Api::<ValidatingAdmissionPolicy>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .modify(crate::trim::managed_fields),
    )
    .touched_objects();
    let (admission_bindings, bindings_writer) =
        reflector::store::<ValidatingAdmissionPolicyBinding>();
    let binding_stream = reflector(
        bindings_writer,
        watcher(
            Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .modify(crate::trim::managed_fields),
    )
    .touched_objects();
    // The kinds: a change wakes every workspace of the kind (its update notice, or its start).
    let (kinds, kinds_writer) = reflector::store::<WorkspaceKind>();
    let kind_stream = reflector(
        kinds_writer,
        watcher(
            Api::<WorkspaceKind>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .modify(crate::trim::managed_fields),
    )
    .touched_objects();
    let (workspace_store, workspaces_writer) = reflector::store::<Workspace>();
    let (workspaces_listed, mut listed) = tokio::sync::watch::channel(false);
    let arrivals = Arc::new(crate::lanes::Arrivals::default());
    let reporter = Reporter {
        controller: config.manager.clone(),
        instance: std::env::var("HOSTNAME").ok(),
    };
    let recorder = Arc::new(Recorder::new(client.clone(), reporter));
    let sharder = crate::sharder::Sharder::spawn(
        client.clone(),
        ns,
        shard.labels_the_unlabelled(),
        recorder.clone(),
    );
    let shard_workspaces = match shard.selector() {
        Some(buckets) => watcher::Config::default().labels(&buckets),
        None => watcher::Config::default(),
    };
    // The kind records of the cached workspaces, one copy of each.
    let mut records = crate::trim::Records::default();
    // Told of each change the workspace cache takes (each kind's use is counted again only
    // after one).
    let (workspace_changes, changed) = tokio::sync::watch::channel(());
    let workspace_stream = reflector(
        workspaces_writer,
        watcher(api::<WorkspaceWire>(&client, ns), shard_workspaces)
            .default_backoff()
            .map_ok(move |event| records.workspaces(event))
            // A label that is not the namespace's bucket (set by hand) is put right; the
            // workspace is reconciled by the shard its namespace is in. (One without the
            // label is the sharder's own watch's.)
            .inspect_ok(move |event| {
                if let watcher::Event::Apply(w) | watcher::Event::InitApply(w) = event
                    && let Some(namespace) = w.namespace()
                    && w.labels().contains_key(labels::SHARD)
                    && !berth_core::shard::labelled(&namespace, w.labels())
                {
                    sharder.relabel(w);
                }
            })
            .try_filter(move |event| std::future::ready(in_shard(shard, event))),
    )
    // Once the reflector applied it: the first list done (the Controller waits on this
    // store's own readiness, and a kube Store wakes one waiter only), or a workspace's newer
    // copy in the cache, which the agent lane may wait for; and the cache changed, for the
    // kinds' use.
    .inspect_ok({
        let arrivals = arrivals.clone();
        move |event| {
            if !matches!(event, watcher::Event::Init) {
                workspace_changes.send_replace(());
            }
            match event {
                watcher::Event::InitDone => {
                    let _ = workspaces_listed.send(true);
                }
                watcher::Event::Apply(workspace) | watcher::Event::InitApply(workspace) => {
                    arrivals.arrived(&ObjectRef::from_obj(workspace));
                }
                watcher::Event::Delete(_) | watcher::Event::Init => {}
            }
        }
    })
    .applied_objects();
    let controller = Controller::for_stream(workspace_stream, workspace_store.clone())
        .trigger_backoff(EachWatchBacksOff)
        .with_config(
            kube::runtime::controller::Config::default().concurrency(config.reconciles_per_shard()),
        );
    let (agents, woken) = AgentChecker::new(client.clone(), config.agent.clone(), metrics.clone());
    // A pod the cache shows ready gets its agent checked at once, in the order pods turn
    // ready (`lanes.rs`), not when the controller's queue gets to its workspace.
    let pod_stream = {
        let (agents, workspaces, kinds) = (agents.clone(), workspace_store.clone(), kinds.clone());
        pod_stream.inspect_ok(move |pod| {
            check_when_ready(pod, &workspaces, &kinds, &agents);
        })
    };
    let caches = {
        let (pods, claims, services, events) = (
            pods.clone(),
            claims.clone(),
            services.clone(),
            events.clone(),
        );
        let (policies, bindings) = (admission_policies.clone(), admission_bindings.clone());
        let kinds = kinds.clone();
        // A store whose writer is gone counts as ready: the controller is stopping. The
        // Workspaces too: a kind's count of them is written from their cache (a restarted
        // operator counted 0 from its empty cache while its list of workspaces came in).
        CachesReady::spawn(async move {
            let _ = pods.wait_until_ready().await;
            let _ = claims.wait_until_ready().await;
            let _ = services.wait_until_ready().await;
            let _ = events.wait_until_ready().await;
            let _ = policies.wait_until_ready().await;
            let _ = bindings.wait_until_ready().await;
            let _ = kinds.wait_until_ready().await;
            let _ = listed.wait_for(|listed| *listed).await;
        })
    };
    metrics.count_phases_with(shard.index(), phase_counter(workspace_store.clone()));
    let context = Arc::new(Context {
        client: client.clone(),
        recorder,
        agents,
        config,
        pods: pods.clone(),
        claims,
        services,
        events,
        admission_policies,
        admission_bindings,
        kinds: kinds.clone(),
        caches,
        event_index,
        workspaces: workspace_store.clone(),
        metrics: metrics.clone(),
        failures: Default::default(),
        refusals: Default::default(),
        taken: Default::default(),
        replaced: Default::default(),
        expectations: Default::default(),
        progress_writes: Default::default(),
        admission_seen: Default::default(),
        reconciling: Default::default(),
        arrivals,
    });
    let lane = tokio::spawn(agent_lane(woken.checked, context.clone()));

    // Warning events map to the workspace of the pod they are about (named in full by the
    // pod's controller ownerReference in the cache, else by the pod name's suffix).
    let pods_for_events = pods.clone();
    let event_to_workspace = move |event: Event| -> Option<ObjectRef<Workspace>> {
        let involved = &event.involved_object;
        let namespace = involved.namespace.clone()?;
        let pod_name = involved.name.clone()?;
        let workspace = pods_for_events
            .get(&ObjectRef::new(&pod_name).within(&namespace))
            .and_then(|p| owning_workspace(&p).map(str::to_owned))
            .or_else(|| pod_name.strip_suffix("-ws").map(str::to_owned))?;
        Some(ObjectRef::new(&workspace).within(&namespace))
    };

    let ready_metrics = metrics.clone();
    let caches_filled = context.caches.wait();
    let served: Api<Workspace> = api(&client, ns);
    tokio::spawn(async move {
        // Ready once the caches have their first lists and Workspaces can be listed (the CRD
        // is served). The Controller's own Workspace store does not signal readiness when its
        // first list failed, so the API is asked directly, once a second until it answers.
        // Under leader election a replica is ready before it leads (standbys serve health):
        // its /readyz has nothing to wait for here.
        let already_ready = ready_metrics
            .ready
            .load(std::sync::atomic::Ordering::Relaxed);
        let waiting = |why: Option<String>| {
            if !already_ready {
                ready_metrics.wait_for(why);
            }
        };
        waiting(Some(
            "the first lists of workspaces, pods, claims, services, events, admission policies and kinds"
                .into(),
        ));
        caches_filled.await;
        while let Err(error) = served
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await
        {
            waiting(Some(format!("listing Workspaces failed: {error}")));
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        waiting(None);
        ready_metrics
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
    });

    // Each kind's use, in its status, at most once a second however many workspaces change;
    // sharded, each shard's own count and shard 0's sum of them (`kinds::usage_patch`).
    let usage = tokio::spawn(write_kind_usage(
        client.clone(),
        context.clone(),
        shard,
        changed,
    ));
    let kinds_for_triggers = kinds;
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
    };
    let running = controller
        .owns_stream(pod_stream)
        .owns_stream(claim_stream)
        .owns_stream(service_stream)
        .watches_stream(event_stream, event_to_workspace)
        .watches_stream(policy_stream, naming_others(workspace_store.clone()))
        .watches_stream(binding_stream, naming_others(workspace_store.clone()))
        .watches_stream(
            kind_stream,
            of_the_kind(workspace_store, kinds_for_triggers),
        )
        .reconcile_on(woken.answered)
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile failed");
            }
        });
    let overdue = async {
        stopped(stop).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
        warn!(
            grace_seconds = SHUTDOWN_GRACE.as_secs(),
            "in-flight reconciles did not finish in time; abandoning them"
        );
    };
    tokio::select! {
        () = running => {}
        () = overdue => {}
    }
    usage.abort();
    lane.abort();
    Ok(())
}

/// How many workspaces the agent lane reconciles at once.
const AGENT_LANE_WORKERS: usize = 16;

/// The agent lane: each workspace whose WhoAmI ended is reconciled here, in the order its
/// cache caught up, so the status says Running (or why not) without waiting behind the
/// controller's queue and the status writes of the workspaces in it. The wait for the cache
/// holds no worker: when the API server's watch ran a second or two behind, 16 workers each
/// waiting out their workspace's arrival made the lane the queue (sharded start, 3 000:
/// p50 1.1 s for a worker). The controller looks at the workspace afterwards (woken by the
/// status write's watch event, or here when nothing was written): when to look again (a failed
/// agent's retry), and an error's backoff and report, are its own.
async fn agent_lane(
    mut checked: futures::channel::mpsc::UnboundedReceiver<ObjectRef<Workspace>>,
    ctx: Arc<Context>,
) {
    let mut lane = crate::lanes::WaitThenRun::new(AGENT_LANE_WORKERS);
    while let Some(reference) = checked.next().await {
        let queued = std::time::Instant::now();
        let (waiting, awaited) = (ctx.clone(), reference.clone());
        let ctx = ctx.clone();
        lane.run_after(
            async move { caught_up(&waiting, &awaited).await.map(|_| queued.elapsed()) },
            move |cache| async move {
                let began = std::time::Instant::now();
                // Usually at once: the cache caught up a moment ago.
                let Some(workspace) = caught_up(&ctx, &reference).await else {
                    return;
                };
                if let Err(error) = reconcile(workspace, ctx.clone()).await {
                    tracing::debug!(%error, "the agent lane's reconcile failed; the controller retries it");
                }
                tracing::debug!(
                    workspace = %reference.name,
                    cache_seconds = cache.as_secs_f64(),
                    waited_seconds = (began - queued).saturating_sub(cache).as_secs_f64(),
                    reconcile_seconds = began.elapsed().as_secs_f64(),
                    "the agent lane reconciled"
                );
                // A status write wakes the controller when its watch event comes; without one,
                // the controller is woken here.
                if !ctx.replaced.unseen(&reference) {
                    ctx.agents.wake(reference);
                }
            },
        );
    }
}

/// The workspace as the cache shows it once a decision can rest on it: at once when the cache
/// holds this operator's own last write to it, or that write's result is known whole (a
/// status write: the reconcile decides on it, `OwnWrites::decide_on`); else when the cache
/// shows the write, since a reconcile on the older copy would only wait. After two seconds,
/// whatever the cache shows.
async fn caught_up(ctx: &Context, reference: &ObjectRef<Workspace>) -> Option<Arc<Workspace>> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let workspace = ctx.workspaces.get(reference)?;
        let version = workspace.resource_version();
        if ctx
            .replaced
            .decide_on(reference, workspace.clone())
            .is_some()
        {
            return Some(workspace);
        }
        let arrival = ctx.arrivals.next(reference.clone());
        // It may have arrived in between.
        if ctx.workspaces.get(reference).map(|w| w.resource_version()) != Some(version) {
            continue;
        }
        if tokio::time::timeout_at(deadline, arrival).await.is_err() {
            return Some(workspace);
        }
    }
}

/// The name of the Workspace a pod's controller ownerReference names.
fn owning_workspace(pod: &CachedPod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Workspace")
        .map(|o| o.name.as_str())
}

/// Starts the agent check of a pod the cache shows ready, when its workspace (as its kind
/// shapes it) wants one (`AgentChecker::start_for_ready_pod`).
fn check_when_ready(
    pod: &CachedPod,
    workspaces: &Store<Workspace>,
    kinds: &Store<WorkspaceKind>,
    agents: &AgentChecker,
) {
    // Cheap tests first: most pod changes are not a pod turning ready.
    if !state::pod_is_ready(pod) || pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    let Some(owner) = owning_workspace(pod) else {
        return;
    };
    let Some(workspace) =
        workspaces.get(&ObjectRef::new(owner).within(&pod.namespace().unwrap_or_default()))
    else {
        return;
    };
    let verified = workspace
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.verified_pod_uid.as_deref());
    if verified == pod.metadata.uid.as_deref() {
        return;
    }
    let kind = (workspace.spec.kind.as_deref()).and_then(|k| kinds.get(&ObjectRef::new(k)));
    let own_pod = pod::is_owned_by(&pod.metadata, &workspace);
    let shaped = crate::kinds::shape(&workspace, kind.as_deref(), own_pod);
    agents.start_for_ready_pod(&shaped.workspace, pod);
}

/// How often a kind's status may be written, at most.
const KIND_USAGE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes each kind's use (`kinds::usage`, as `kinds::usage_patch` says for `shard`) into its
/// status when it changed, once every [`KIND_USAGE_INTERVAL`] at most, from the caches: 10 000
/// workspaces of one kind changing at once make one write a second. The admission policy of
/// `deploy/admission/` reads these counts to refuse deleting a kind, or removing an option, in
/// use. The workspaces are counted again only when `changed` says the workspace cache took a
/// change since they were last counted: counting goes over every cached workspace.
async fn write_kind_usage(
    client: Client,
    ctx: Arc<Context>,
    shard: Shard,
    mut changed: tokio::sync::watch::Receiver<()>,
) {
    caches_ready(&ctx).await;
    let mut tick = tokio::time::interval(KIND_USAGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let api: Api<WorkspaceKind> = Api::all(client);
    let params = PatchParams {
        field_manager: Some(ctx.config.manager.clone()),
        ..PatchParams::default()
    };
    // The last refusal said of each kind, so a lasting one is said once, not each second.
    let mut refused: HashMap<String, String> = HashMap::new();
    let mut usage = BTreeMap::new();
    // Counted at least once, whatever `changed` says.
    changed.mark_changed();
    loop {
        tick.tick().await;
        if changed.has_changed().unwrap_or(false) {
            changed.mark_unchanged();
            let workspaces = ctx.workspaces.state();
            usage = crate::kinds::usage(workspaces.iter().map(|w| &**w));
        }
        for kind in ctx.kinds.state() {
            let name = kind.name_any();
            let counted = usage.get(&name).cloned().unwrap_or_default();
            let Some(patch) = crate::kinds::usage_patch(kind.status.as_ref(), counted, shard)
            else {
                continue;
            };
            let body = json!({ "status": patch });
            match api.patch_status(&name, &params, &Patch::Merge(&body)).await {
                Ok(_) => {
                    ctx.metrics.kind_status_writes.inc();
                    refused.remove(&name);
                }
                // Gone meanwhile, or refused: the next tick tries again; a refusal is said.
                Err(error) => {
                    let note = format!(
                        "cannot write how many workspaces use the kind into its status, so the admission policy may count too few; retrying in 1s: {error}"
                    );
                    warn!(kind = %name, %error, "cannot write the WorkspaceKind's status");
                    if refused.get(&name) != Some(&note) {
                        let report = Report {
                            type_: EventType::Warning,
                            reason: event_reasons::FAILED_UPDATE,
                            action: "UpdateStatus",
                            note: &note,
                        };
                        let reference = kube::Resource::object_ref(&*kind, &());
                        if let Err(error) = ctx.recorder.publish(&report, &reference).await {
                            warn!(%error, "cannot publish the event");
                        }
                        refused.insert(name, note);
                    }
                }
            }
        }
    }
}

/// No backoff of the controller's own over its merged trigger streams: each watch backs off
/// by itself (`default_backoff`: 0.8 s doubling to 30 s, as client-go's reflectors). kube's
/// default backs off the merged streams too, so every failed list of any watch froze all of
/// them, up to 30 s per error: a replica whose first lists failed while the API server
/// restarted stayed unready for minutes, and its workspaces' events waited as long.
struct EachWatchBacksOff;

impl Iterator for EachWatchBacksOff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        Some(std::time::Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for EachWatchBacksOff {
    fn reset(&mut self) {}
}

async fn reconcile(workspace: Arc<Workspace>, ctx: Arc<Context>) -> Result<Requeue> {
    let _held = ctx.reconciling.lock(ObjectRef::from_obj(&*workspace)).await;
    static RECONCILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = RECONCILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let span = tracing::info_span!("reconcile", workspace = %workspace.name_any(), namespace = %workspace.namespace().unwrap_or_default(), reconcile_id = id);
    tracing::Instrument::instrument(reconcile_in_span(workspace, ctx.clone()), span).await
}

async fn reconcile_in_span(workspace: Arc<Workspace>, ctx: Arc<Context>) -> Result<Requeue> {
    // At debug, each reconcile is said; within kube's span, which names why it runs (the
    // workspace changed, an object it owns or names changed, a requeue), outside it, the
    // agent lane's.
    tracing::debug!("reconciling");
    let started = Instant::now();
    let namespace = workspace.namespace().unwrap_or_default();
    let api: Api<Workspace> = Api::namespaced(ctx.client.clone(), &namespace);
    let reference = ObjectRef::from_obj(&*workspace);
    let deleting = workspace.metadata.deletion_timestamp.is_some()
        && workspace
            .finalizers()
            .iter()
            .any(|f| f == labels::FINALIZER);
    let waiting = match deleting {
        true => cleanup(&workspace, &ctx).await,
        false => Ok(None),
    };
    let result = match waiting {
        Ok(Some(requeue)) => Ok(requeue),
        Err(error) => Err(error),
        // The finalizer helper adds the finalizer, and removes it once cleanup is done.
        Ok(None) => finalizer(&api, labels::FINALIZER, workspace, |event| async {
            match event {
                Finalizer::Apply(ws) => apply(ws, ctx.clone()).await,
                Finalizer::Cleanup(_) => Ok(Requeue::await_change()),
            }
        })
        .await
        .map_err(|e| match e {
            kube::runtime::finalizer::Error::ApplyFailed(inner)
            | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner,
            other => Error::Finalizer(Box::new(other)),
        }),
    };
    ctx.metrics.observe_reconcile(
        if result.is_ok() { "ok" } else { "error" },
        started.elapsed(),
    );
    if result.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&reference);
    }
    result
}

fn error_policy(workspace: Arc<Workspace>, error: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ReasonLabel {
            reason: error.reason().to_owned(),
        })
        .inc();
    if error.is_conflict() {
        // The cache was behind; the watch brings the newer object at once.
        return Requeue::requeue(std::time::Duration::from_millis(100));
    }
    let mut failures = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
    let attempt = failures
        .entry(ObjectRef::from_obj(&*workspace))
        .or_default();
    *attempt += 1;
    let attempt = *attempt;
    drop(failures);
    let delay = state::retry_after_error(attempt, ctx.config.policy.max_requeue);
    warn!(workspace = %workspace.name_any(), reason = error.reason(), %error, ?delay, "reconcile failed; retrying");
    // Never only a log line: the workspace says it too, at the 1st, 2nd, 4th, 8th ... failure
    // in a row (its status may be what cannot be written).
    if attempt.is_power_of_two() {
        let note = format!(
            "Cannot reconcile the workspace ({}); {error}. Retrying in {}.",
            error.reason(),
            state::human(delay)
        );
        tokio::spawn(async move {
            let reference = kube::Resource::object_ref(&*workspace, &());
            let report = Report {
                type_: EventType::Warning,
                reason: event_reasons::RECONCILE_FAILED,
                action: event_reasons::RECONCILE_FAILED,
                note: &note,
            };
            let retry = ctx.config.event_retry;
            if let Err(error) = ctx
                .recorder
                .publish_retried(&report, &reference, retry)
                .await
            {
                dropped(&ctx.metrics, event_reasons::RECONCILE_FAILED, &error);
            }
        });
    }
    Requeue::requeue(delay)
}

/// Maps any change to the workspaces that name other objects or a kind (what the admission
/// policies decide about).
fn naming_others<K>(store: Store<Workspace>) -> impl Fn(K) -> Vec<ObjectRef<Workspace>> {
    move |_| {
        store
            .state()
            .iter()
            .filter(|w| w.spec.kind.is_some() || !w.spec.references().is_empty())
            .map(|w| ObjectRef::from_obj(&**w))
            .collect()
    }
}

/// Maps a change of a WorkspaceKind's spec (a new generation, a new kind of the name, its
/// deletion) to the workspaces of that kind. Its status changes (`write_kind_usage`, once a
/// second) wake nobody: 10 000 workspaces of one kind would be reconciled every second.
fn of_the_kind(
    store: Store<Workspace>,
    kinds: Store<WorkspaceKind>,
) -> impl Fn(WorkspaceKind) -> Vec<ObjectRef<Workspace>> {
    // By kind name: the UID and generation last seen.
    type Seen = HashMap<String, (Option<String>, Option<i64>)>;
    let seen: std::sync::Mutex<Seen> = Default::default();
    move |kind| {
        let name = kind.name_any();
        let version = (kind.uid(), kind.metadata.generation);
        // The reflector has applied the event: a deleted kind is no longer in the store.
        let exists = kinds.get(&ObjectRef::new(&name)).is_some();
        {
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            if !exists {
                seen.remove(&name);
            } else if seen.insert(name.clone(), version.clone()) == Some(version) {
                return vec![];
            }
        }
        store
            .state()
            .iter()
            .filter(|w| w.spec.kind.as_deref() == Some(name.as_str()))
            .map(|w| ObjectRef::from_obj(&**w))
            .collect()
    }
}

/// Counts the workspaces of `store` by phase, for the gauge at each scrape.
fn phase_counter(store: Store<Workspace>) -> crate::metrics::PhaseCounter {
    Box::new(move || {
        let mut counts: HashMap<String, i64> = HashMap::new();
        for ws in store.state() {
            let phase = ws.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
            *counts.entry(phase.to_string()).or_default() += 1;
        }
        counts
    })
}

/// Waits until every cache has its initial list, so a decision never rests on a cache that
/// has not been filled yet (which would make, say, a restarted operator recreate things).
async fn caches_ready(ctx: &Context) {
    ctx.caches.wait().await;
}

/// Observe, derive, act, report.
async fn apply(workspace: Arc<Workspace>, ctx: Arc<Context>) -> Result<Requeue> {
    caches_ready(&ctx).await;
    // A decision on a workspace older than our own last write could undo it (say, replace a
    // rejected pod at once, uncounted): it rests on the workspace as that write left it, or,
    // when that is not known whole, waits for the watch to bring the write, which wakes this
    // workspace again.
    let Some(workspace) = ctx
        .replaced
        .decide_on(&ObjectRef::from_obj(&*workspace), workspace)
    else {
        return Ok(Requeue::requeue(std::time::Duration::from_secs(1)));
    };
    let namespace = workspace.namespace().unwrap_or_default();
    let name = workspace.name_any();
    let pod_name = pod::pod_name(&name);
    let pod = ctx.pods.get(&ObjectRef::new(&pod_name).within(&namespace));
    let claim = ctx
        .claims
        .get(&ObjectRef::new(&pod::claim_name(&name)).within(&namespace));
    let service = ctx
        .services
        .get(&ObjectRef::new(&pod::service_name(&name)).within(&namespace));
    let pod_uid = pod.as_ref().and_then(|p| p.uid());
    let events: Vec<Arc<Event>> = match &pod_uid {
        Some(uid) => ctx
            .event_index
            .about(uid)
            .iter()
            .filter_map(|reference| ctx.events.get(reference))
            .collect(),
        None => vec![],
    };
    let warnings: Vec<&Event> = events.iter().map(|e| e.as_ref()).collect();
    // The workspace as its kind's record shapes it: every decision and every object built
    // below reads this one; the status it had is what a new one is compared with.
    let old = workspace.status.clone().unwrap_or_default();
    let kind = (workspace.spec.kind.as_deref()).and_then(|k| ctx.kinds.get(&ObjectRef::new(k)));
    let own_pod = pod
        .as_deref()
        .is_some_and(|p| pod::is_owned_by(&p.metadata, &workspace));
    let shaped = crate::kinds::shape(&workspace, kind.as_deref(), own_pod);
    let workspace = Arc::new(shaped.workspace);
    // One clock reading per observation: every decision on it is taken at the same time.
    let now = Timestamp::now();
    let agent = ctx.agents.check(&workspace, pod.as_deref(), now).await;
    let activity = ctx.agents.activity(&workspace, pod.as_deref(), now).await;
    let content = (ctx.agents)
        .content(
            &workspace,
            pod.as_deref(),
            now,
            ctx.config.policy.progress_interval,
        )
        .await;
    // What the caches show no longer needs an expectation.
    if pod.is_some() {
        ctx.forget("pod", &namespace, &name);
    }
    if claim.is_some() {
        ctx.forget("claim", &namespace, &name);
    }
    if service
        .as_ref()
        .is_some_and(|s| pod::service_ports_match(s, &workspace))
    {
        ctx.forget("service", &namespace, &name);
    }
    let reference = ObjectRef::from_obj(&*workspace);
    let refusal = ctx.refusal(&reference);
    let taken = ctx.taken(&reference);
    let (policies, bindings) = (
        ctx.admission_policies.state(),
        ctx.admission_bindings.state(),
    );
    let enforcement = |name: &str| {
        crate::admission::enforcement(
            name,
            policies.iter().map(|p| &**p),
            bindings.iter().map(|b| &**b),
            &namespace,
        )
    };
    // The workspace's records (what its kind gave it, whether admission checked it) must be
    // the operator's too.
    let admission = enforcement(crate::admission::POLICY).and_then(|policy| {
        enforcement(crate::admission::RECORD_POLICY).map(|records| policy.max(records))
    });
    let admission_since = ctx.admission_since(&namespace, admission.as_ref().ok().copied());
    let admission_missing = admission.err();
    let expectations = state::Expectations {
        pod: ctx.expected("pod", &namespace, &name),
        claim: ctx.expected("claim", &namespace, &name),
        service: ctx.expected("service", &namespace, &name),
    };
    let observed = Observed {
        workspace: &workspace,
        pod: pod.as_deref(),
        warnings: &warnings,
        claim: claim.as_deref(),
        service: service.as_deref(),
        taken: &taken,
        agent: agent.as_ref(),
        refusal: refusal.as_ref(),
        activity: activity.as_ref(),
        content: content.as_ref(),
        admission: admission_missing.as_deref(),
        admission_since,
        kind: &shaped.update,
        expectations,
    };
    let decision = state::derive(&observed, &ctx.config.policy, now);

    // The status is written before acting, conditionally on the cached resourceVersion: a
    // decision taken on a stale cache conflicts here and is retried on fresh data instead of
    // acting (which could, say, create a replacement pod without counting it).
    let mut version = workspace.resource_version();
    if decision.status != old {
        let since = ctx.since_progress_write(&reference, now);
        let interval = ctx.config.policy.progress_interval;
        if let Some(wait) = state::hold_back(&old, &decision, since, interval) {
            return Ok(Requeue::requeue(wait.min(decision.requeue)));
        }
        version = write_status(&workspace, &decision.status, version, &ctx).await?;
    }
    let mut met = None;
    let mut refused = None;
    for action in &decision.actions {
        match act(&workspace, action, &ctx, &taken).await {
            Ok(Some(foreign)) => {
                // Nothing more is done on this decision: the pod it would create could mount a
                // claim that is not the workspace's.
                ctx.set_taken(&reference, foreign.kind, Some(foreign.clone()));
                met = Some(foreign);
                break;
            }
            Ok(None) => {
                if refusal.as_ref().is_some_and(|r| r.action == *action) {
                    ctx.set_refusal(&reference, None);
                }
                if *action == Action::Cull {
                    ctx.metrics.culled.inc();
                    // Our own write, like a status write: no decision on a cache without it
                    // (it would cull again). The cull sets `paused`, so it always changes it.
                    ctx.replaced
                        .wrote(reference.clone(), version.clone(), None, None);
                }
            }
            Err(Error::Kube(ref e)) if let kube::Error::Api(answer) = &**e => {
                warn!(workspace = %name, action = %action.describe(&name), code = answer.code, message = %answer.message, "the API server refused an action");
                let now = Timestamp::now();
                let latest = Refusal::new(
                    action.clone(),
                    answer.code,
                    &answer.reason,
                    &answer.message,
                    workspace.metadata.generation,
                    refused.as_ref().or(refusal.as_ref()),
                    now,
                );
                ctx.set_refusal(&reference, Some(latest.clone()));
                refused = Some(latest);
            }
            Err(other) => return Err(other),
        }
    }
    // What acting found out (a refusal, a name someone else's object holds) is said at once:
    // derive again from the status just written, as the next reconcile would.
    let mut decisions = vec![decision];
    if met.is_some() || refused.is_some() {
        let mut written = (*workspace).clone();
        written.status = Some(decisions[0].status.clone());
        written.metadata.resource_version = version.clone();
        let taken = ctx.taken(&reference);
        let observed = Observed {
            workspace: &written,
            taken: &taken,
            refusal: refused.as_ref().or(refusal.as_ref()),
            ..observed
        };
        let again = state::derive(&observed, &ctx.config.policy, Timestamp::now());
        if again.status != decisions[0].status {
            write_status(&workspace, &again.status, version.clone(), &ctx).await?;
        }
        decisions.push(again);
    }
    let decision = decisions.last().expect("one decision at least").clone();
    if let Some(recreation) = &decision.recreation {
        let labels = crate::metrics::RecreationLabels {
            reason: recreation.reason.to_string(),
            attempt: recreation.attempt.to_string(),
        };
        ctx.metrics.pod_recreations.get_or_create(&labels).inc();
    }
    if let (Some(started), Some(ready)) = (&decision.status.started_at, &decision.status.ready_at)
        && old.ready_at.is_none()
    {
        let seconds = ready.0.duration_since(started.0).as_secs_f64();
        ctx.metrics.start_seconds.observe(seconds.max(0.0));
    }
    publish(&workspace, &decisions, &ctx).await;
    Ok(Requeue::requeue(decision.requeue))
}

/// Publishes the decisions' events on the workspace (rule C17). The status says an event was
/// told, so nobody would tell it again: a failure that may pass is tried again in the
/// background (`Config::event_retry`), and an event given up on is counted
/// (`berth_events_dropped_total{reason}`) and logged.
async fn publish(workspace: &Workspace, decisions: &[Decision], ctx: &Context) {
    let reference = kube::Resource::object_ref(workspace, &());
    for notice in decisions.iter().flat_map(|d| &d.notices) {
        let Err(error) = ctx.recorder.publish(&report_of(notice), &reference).await else {
            continue;
        };
        let retry = ctx.config.event_retry;
        if !crate::recorder::transient(&error) || retry.attempts <= 1 {
            dropped(&ctx.metrics, &notice.reason, &error);
            continue;
        }
        warn!(%error, reason = %notice.reason, "cannot publish event; retrying");
        let (recorder, metrics, reference, notice) = (
            ctx.recorder.clone(),
            ctx.metrics.clone(),
            reference.clone(),
            notice.clone(),
        );
        tokio::spawn(async move {
            tokio::time::sleep(retry.wait(1)).await;
            let rest = crate::recorder::Retry {
                attempts: retry.attempts - 1,
                ..retry
            };
            let report = report_of(&notice);
            if let Err(error) = recorder.publish_retried(&report, &reference, rest).await {
                dropped(&metrics, &notice.reason, &error);
            }
        });
    }
}

/// The event that tells `notice`.
fn report_of(notice: &state::Notice) -> Report<'_> {
    Report {
        type_: if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: &notice.reason,
        action: &notice.reason,
        note: &notice.note,
    }
}

/// An event given up on: counted and logged.
fn dropped(metrics: &Metrics, reason: &str, error: &kube::Error) {
    warn!(%error, reason, "cannot publish event; dropped it");
    metrics
        .events_dropped
        .get_or_create(&ReasonLabel {
            reason: reason.to_owned(),
        })
        .inc();
}

async fn write_status(
    workspace: &Workspace,
    status: &WorkspaceStatus,
    resource_version: Option<String>,
    ctx: &Context,
) -> Result<Option<String>> {
    let namespace = workspace.namespace().unwrap_or_default();
    // The resourceVersion makes the write conditional: a status derived from a stale cache
    // must not overwrite a newer one (a recreation count would be lost).
    let body = json!({
        "apiVersion": "berth.dev/v1alpha1",
        "kind": "Workspace",
        "metadata": {"resourceVersion": resource_version},
        "status": status
    });
    let after = crate::written::patch::<Workspace, _>(
        &ctx.client,
        &namespace,
        &workspace.name_any(),
        Some("status"),
        &PatchParams::apply(&ctx.config.manager).force(),
        &Patch::Apply(&body),
    )
    .await?;
    ctx.metrics.status_writes.inc();
    // What the write left: the workspace we wrote on with this status (a status apply with
    // force owns every field of the status this operator writes).
    let mut left = workspace.clone();
    left.status = Some(status.clone());
    ctx.replaced.wrote(
        ObjectRef::from_obj(workspace),
        resource_version,
        after.as_deref(),
        Some(left),
    );
    ctx.wrote_status(&ObjectRef::from_obj(workspace), status.phase);
    info!(
        workspace = %workspace.name_any(),
        phase = status.phase.map(|p| p.as_str()).unwrap_or_default(),
        message = status.message.as_deref().unwrap_or_default(),
        "status"
    );
    Ok(after)
}

fn ignore_conflicts(result: Result<(), kube::Error>) -> Result<()> {
    match result {
        // Already there (the cache lagged) or already gone: the decision holds.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// Carries out one action. Returns the object a create met when it is not the workspace's own
/// (`taken`: what earlier creates met, to count the attempts in a row).
async fn act(
    workspace: &Workspace,
    action: &Action,
    ctx: &Context,
    taken: &[Foreign],
) -> Result<Option<Foreign>> {
    let namespace = workspace.namespace().unwrap_or_default();
    let create = PostParams {
        field_manager: Some(ctx.config.manager.clone()),
        ..Default::default()
    };
    let name = workspace.name_any();
    let kind: &'static str = match action {
        Action::CreatePod | Action::DeletePod { .. } | Action::ForceDeletePod { .. } => "pod",
        Action::CreateClaim | Action::ResizeClaim { .. } => "claim",
        Action::CreateService | Action::UpdateService { .. } | Action::DeleteService { .. } => {
            "service"
        }
        Action::Cull => "workspace",
    };
    let creates = matches!(
        action,
        Action::CreatePod
            | Action::CreateClaim
            | Action::CreateService
            | Action::UpdateService { .. }
    );
    if !creates {
        ctx.forget(kind, &namespace, &name);
    }
    let done = perform(workspace, action, ctx, &namespace, create, taken).await;
    // Only what the API server accepted is expected to show up in the cache.
    if creates && matches!(done, Ok(None)) {
        ctx.expect(kind, &namespace, &name);
        if let Some(derived) = derived_by(action) {
            ctx.set_taken(&ObjectRef::from_obj(workspace), derived, None);
        }
    }
    done
}

/// The derived object an action creates.
fn derived_by(action: &Action) -> Option<Derived> {
    [Derived::Pod, Derived::Claim, Derived::Service]
        .into_iter()
        .find(|d| d.create() == *action)
}

/// Creates `object`, one of the workspace's derived objects. When the name is taken (409
/// AlreadyExists), returns the object of that name if it is not the workspace's own (the cache
/// only lagged behind our own create otherwise), counting the creates in a row that met it.
async fn create_or_meet<K>(
    client: &Client,
    namespace: &str,
    create: &PostParams,
    object: &K,
    kind: Derived,
    workspace: &Workspace,
    taken: &[Foreign],
) -> Result<Option<Foreign>>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    match crate::written::create(client, namespace, create, object).await {
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let api: Api<K> = Api::namespaced(client.clone(), namespace);
            let Some(existing) = api.get_metadata_opt(&object.name_any()).await? else {
                return Ok(None);
            };
            let attempts = taken
                .iter()
                .find(|f| f.kind == kind)
                .and_then(|f| f.met)
                .map_or(1, |m| m.attempts.saturating_add(1));
            let met = Met {
                at: Timestamp::now(),
                attempts,
            };
            Ok(Foreign::of(kind, &existing.metadata, workspace, Some(met)))
        }
        other => other.map(|_| None).map_err(Error::from),
    }
}

async fn perform(
    workspace: &Workspace,
    action: &Action,
    ctx: &Context,
    namespace: &str,
    create: PostParams,
    taken: &[Foreign],
) -> Result<Option<Foreign>> {
    let client = ctx.client.clone();
    match action {
        Action::CreatePod => {
            let wanted = pod::build_pod(workspace, &ctx.config.agent);
            create_or_meet(
                &client,
                namespace,
                &create,
                &wanted,
                Derived::Pod,
                workspace,
                taken,
            )
            .await
        }
        Action::DeletePod { uid } | Action::ForceDeletePod { uid } => {
            let pods: Api<Pod> = Api::namespaced(client, namespace);
            let force = matches!(action, Action::ForceDeletePod { .. });
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                grace_period_seconds: force.then_some(0),
                ..Default::default()
            };
            ignore_conflicts(
                pods.delete(&pod::pod_name(&workspace.name_any()), &params)
                    .await
                    .map(|_| ()),
            )
            .map(|()| None)
        }
        Action::ResizeClaim { uid } => {
            // Conditional on the UID: only the workspace's own claim grows.
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, namespace);
            let size = pod::build_claim(workspace).and_then(|c| pod::claim_request(&c));
            if let Some(size) = size {
                let grow: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/uid", "value": uid},
                    {"op": "add", "path": "/spec/resources/requests/storage", "value": size}
                ]))?;
                claims
                    .patch(
                        &pod::claim_name(&workspace.name_any()),
                        &PatchParams::default(),
                        &Patch::Json::<()>(grow),
                    )
                    .await?;
            }
            Ok(None)
        }
        Action::CreateClaim => {
            let Some(claim) = pod::build_claim(workspace) else {
                return Ok(None);
            };
            create_or_meet(
                &client,
                namespace,
                &create,
                &claim,
                Derived::Claim,
                workspace,
                taken,
            )
            .await
        }
        Action::CreateService => {
            // A create, never an apply: an apply would take over a service of the same name.
            let Some(service) = pod::build_service(workspace) else {
                return Ok(None);
            };
            create_or_meet(
                &client,
                namespace,
                &create,
                &service,
                Derived::Service,
                workspace,
                taken,
            )
            .await
        }
        Action::UpdateService { uid } => {
            // The whole ports and selector, by a JSON patch conditional on the UID: the
            // workspace's own service only (an apply would leave the ports its create set),
            // and never one of the same name made since.
            let services: Api<Service> = Api::namespaced(client, namespace);
            let Some(service) = pod::build_service(workspace) else {
                return Ok(None);
            };
            let name = service.name_any();
            let spec = service.spec.unwrap_or_default();
            let update: json_patch::Patch = serde_json::from_value(json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "replace", "path": "/spec/ports", "value": spec.ports},
                {"op": "replace", "path": "/spec/selector", "value": spec.selector}
            ]))?;
            let params = PatchParams {
                field_manager: Some(ctx.config.manager.clone()),
                ..Default::default()
            };
            services
                .patch(&name, &params, &Patch::Json::<()>(update))
                .await?;
            Ok(None)
        }
        Action::Cull => {
            // Conditional on the generation decided on: a spec the user just changed is theirs.
            let workspaces: Api<Workspace> = Api::namespaced(client, namespace);
            let pause: json_patch::Patch = serde_json::from_value(json!([
                {"op": "test", "path": "/metadata/generation", "value": workspace.metadata.generation},
                {"op": "add", "path": "/spec/paused", "value": true}
            ]))?;
            let params = PatchParams {
                field_manager: Some(ctx.config.manager.clone()),
                ..Default::default()
            };
            workspaces
                .patch(&workspace.name_any(), &params, &Patch::Json::<()>(pause))
                .await?;
            Ok(None)
        }
        Action::DeleteService { uid } => {
            let services: Api<Service> = Api::namespaced(client, namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            ignore_conflicts(
                services
                    .delete(&pod::service_name(&workspace.name_any()), &params)
                    .await
                    .map(|_| ()),
            )
            .map(|()| None)
        }
    }
}

/// Deletion (rule C18): stop the pod, wait until it is gone or the grace period ran out, then
/// let the finalizer go; owned objects follow by garbage collection. `None` once the finalizer
/// may go; while the pod stops, when to look again (waiting is not an error).
async fn cleanup(workspace: &Workspace, ctx: &Context) -> Result<Option<Requeue>> {
    caches_ready(ctx).await;
    ctx.agents.forget(workspace);
    ctx.set_refusal(&ObjectRef::from_obj(workspace), None);
    ctx.wrote_status(&ObjectRef::from_obj(workspace), None);
    ctx.replaced.forget(&ObjectRef::from_obj(workspace));
    let namespace = workspace.namespace().unwrap_or_default();
    for kind in ["pod", "claim", "service"] {
        ctx.forget(kind, &namespace, &workspace.name_any());
    }
    ctx.taken
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&ObjectRef::from_obj(workspace));
    let pod_name = pod::pod_name(&workspace.name_any());
    let current = ctx.pods.get(&ObjectRef::new(&pod_name).within(&namespace));
    let observed = Observed {
        workspace,
        pod: current.as_deref(),
        warnings: &[],
        claim: None,
        service: None,
        taken: &[],
        agent: None,
        refusal: None,
        activity: None,
        content: None,
        admission: None,
        admission_since: None,
        kind: &crate::kinds::NO_KIND,
        expectations: Default::default(),
    };
    let decision = state::derive(&observed, &ctx.config.policy, Timestamp::now());
    for action in decision
        .actions
        .iter()
        .filter(|a| matches!(a, Action::DeletePod { .. } | Action::ForceDeletePod { .. }))
    {
        act(workspace, action, ctx, &[]).await?;
    }
    publish(workspace, std::slice::from_ref(&decision), ctx).await;
    if decision.release {
        return Ok(None);
    }
    if workspace.status.as_ref() != Some(&decision.status) {
        write_status(
            workspace,
            &decision.status,
            workspace.resource_version(),
            ctx,
        )
        .await?;
    }
    Ok(Some(Requeue::requeue(decision.requeue)))
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector::store, watcher::Event};
    use serde_json::json;

    use super::*;

    fn kind(generation: i64, workspaces: u32) -> WorkspaceKind {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
            "metadata": {"name": "k", "uid": "k-1", "generation": generation},
            "spec": {"spawner": {"displayName": "K"}, "options": {
                "image": {"default": "a", "values": [{"id": "a", "displayName": "A", "spec": {"image": "x:1"}}]},
                "pod": {"default": "p", "values": [{"id": "p", "displayName": "P", "spec": {}}]}}},
            "status": {"workspaces": workspaces}
        }))
        .unwrap()
    }

    fn workspace(name: &str, spec: serde_json::Value) -> Workspace {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
            "spec": spec
        }))
        .expect("a valid workspace")
    }

    /// The operator's own status writes to a kind (its use, once a second) wake none of its
    /// workspaces; a change of its spec, or its deletion, wakes each of them.
    #[test]
    fn only_a_kinds_spec_or_its_deletion_wakes_its_workspaces() {
        let (workspaces, mut workspaces_writer) = store::<Workspace>();
        for name in ["a", "b"] {
            let mut ws = workspace(name, json!({"kind": "k"}));
            ws.metadata.namespace = Some("n".into());
            workspaces_writer.apply_watcher_event(&Event::Apply(ws));
        }
        let plain = workspace("c", json!({"image": "x:1"}));
        workspaces_writer.apply_watcher_event(&Event::Apply(plain));
        let (kinds, mut kinds_writer) = store::<WorkspaceKind>();
        let woken = of_the_kind(workspaces, kinds);
        let mut apply = |k: WorkspaceKind| {
            kinds_writer.apply_watcher_event(&Event::Apply(k.clone()));
            woken(k).len()
        };
        assert_eq!(apply(kind(1, 0)), 2);
        assert_eq!(apply(kind(1, 2)), 0, "a status write wakes nobody");
        assert_eq!(apply(kind(2, 2)), 2);
        kinds_writer.apply_watcher_event(&Event::Delete(kind(2, 2)));
        assert_eq!(woken(kind(2, 2)).len(), 2, "a deletion wakes them");
    }
}
