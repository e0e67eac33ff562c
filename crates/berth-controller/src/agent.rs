//! The operator's side of the handshake with workspace agents (rules C14, C15): tokens for its
//! own service account from the TokenRequest API, one per namespace (audience
//! `berth-agent/<namespace>`), each cached until 80% of its lifetime, and WhoAmI calls to
//! agents, at most one per backoff step per pod, each in its own task so a silent agent never
//! holds a reconcile; and, for workspaces with an idle timeout, `GetActivity` calls to
//! verified agents when `idle.rs` says the next ask is due, the same way. Every decision
//! (what a result means, whether it stands or a call is due, how long to back off) is the
//! pure core's (`state.rs`, `idle.rs`); this module makes the calls and keeps their results.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::cached_pod::CachedPod;
use berth_agent::client::{
    AgentTokens, CallError, ClientTls, get_activity, get_content, token_rejected, who_am_i,
};
use berth_api::{Workspace, condition::Reason};
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use jiff::Timestamp;
use kube::{Client, ResourceExt, runtime::reflector::ObjectRef};
use tokio::sync::watch;
use tracing::{Instrument, info, warn};

use crate::{
    config::AgentConfig,
    content::{ContentCheck, ContentOutcome},
    idle::{self, ActivityCheck, ActivityOutcome},
    lanes::FifoPool,
    metrics::{Metrics, ResultLabel},
    state::{self, AgentCheck, AgentOutcome},
};

/// The condition reason of an agent's refusal: the gRPC code's name, as `AgentReady` says it
/// (`Unauthenticated`, `PermissionDenied`, `Unavailable`, `ResourceExhausted`, or the name
/// of a code an agent does not send, such as `Internal`).
pub fn refusal_reason(code: tonic::Code) -> Reason {
    match code {
        tonic::Code::Unauthenticated => Reason::Unauthenticated,
        tonic::Code::PermissionDenied => Reason::PermissionDenied,
        tonic::Code::Unavailable => Reason::Unavailable,
        tonic::Code::ResourceExhausted => Reason::ResourceExhausted,
        other => Reason::Other(format!("{other:?}")),
    }
}

/// How long a reconcile that started a WhoAmI waits for it before leaving it to finish in the
/// background (the workspace is reconciled in the agent lane when it ends): a slow or silent
/// agent never holds a reconcile worker.
const INLINE_WAIT: Duration = Duration::from_millis(250);

type Key = (String, String);

/// The state of a workspace's agent check.
enum Attempt {
    /// A call to the agent of `pod_uid` runs; `done` turns true when its result is stored.
    /// A retry keeps the failure before it, which still stands meanwhile.
    InFlight {
        pod_uid: String,
        done: watch::Receiver<bool>,
        previous: Option<AgentCheck>,
    },
    /// The last call's result; a failure is repeated until `next_at`.
    Done {
        check: AgentCheck,
        failures: u32,
        next_at: Timestamp,
        /// Handed to a reconcile already (its event was published then).
        delivered: bool,
    },
}

/// The state of a workspace's asks of one kind to its pod's agent (`GetActivity`,
/// `GetContent`).
enum Ask<C> {
    /// A call to the agent of `pod_uid` runs; the answer before it still stands.
    InFlight {
        pod_uid: String,
        previous: Option<C>,
    },
    /// The last answer, and the failures in a row before it.
    Done {
        check: C,
        failures: u32,
        delivered: bool,
    },
}

/// An answer of an agent that a reconcile reads, fresh the first time.
trait Answer: Clone {
    fn pod_uid(&self) -> &str;
    fn with_fresh(self, fresh: bool) -> Self;
}

impl Answer for ActivityCheck {
    fn pod_uid(&self) -> &str {
        &self.pod_uid
    }
    fn with_fresh(self, fresh: bool) -> Self {
        ActivityCheck { fresh, ..self }
    }
}

impl Answer for ContentCheck {
    fn pod_uid(&self) -> &str {
        &self.pod_uid
    }
    fn with_fresh(self, fresh: bool) -> Self {
        ContentCheck { fresh, ..self }
    }
}

/// What is stored of the asks about the pod `pod_uid`.
enum Stored<C> {
    /// One runs; the answer before it.
    Asking(Option<C>),
    /// The last answer (marked delivered), and the failures in a row before it.
    Answered(C, u32),
    Nothing,
}

fn stored<C: Answer>(asks: &mut HashMap<Key, Ask<C>>, key: &Key, pod_uid: &str) -> Stored<C> {
    match asks.get_mut(key) {
        Some(Ask::InFlight {
            pod_uid: uid,
            previous,
        }) if uid == pod_uid => Stored::Asking(previous.clone()),
        Some(Ask::Done {
            check,
            failures,
            delivered,
        }) if check.pod_uid() == pod_uid => {
            let fresh = !*delivered;
            *delivered = true;
            Stored::Answered(check.clone().with_fresh(fresh), *failures)
        }
        _ => Stored::Nothing,
    }
}

/// Marks an ask of the agent of `pod_uid` running, the answer before it still standing.
fn asking<C: Answer>(
    asks: &mut HashMap<Key, Ask<C>>,
    key: &Key,
    pod_uid: &str,
    previous: Option<C>,
) {
    asks.insert(
        key.clone(),
        Ask::InFlight {
            pod_uid: pod_uid.to_owned(),
            previous: previous.map(|p| p.with_fresh(false)),
        },
    );
}

/// How long a check waited for a slot among the checks in flight, and how long its call took:
/// logged with its result, so a slow start says which of the two it was.
struct Took {
    waited: Duration,
    called: Duration,
}

/// What the background calls share with the reconcile loop.
struct Shared {
    config: AgentConfig,
    metrics: Arc<Metrics>,
    /// The operator's tokens for agents, one per namespace.
    tokens: AgentTokens,
    attempts: Mutex<HashMap<Key, Attempt>>,
    activity: Mutex<HashMap<Key, Ask<ActivityCheck>>>,
    content: Mutex<HashMap<Key, Ask<ContentCheck>>>,
    /// Wakes a workspace whose `GetActivity` or `GetContent` answer came in the background.
    wake: UnboundedSender<ObjectRef<Workspace>>,
    /// The WhoAmI calls: in the order they were asked for, `checks_in_flight` at once.
    checks: FifoPool,
    /// Hands a workspace whose WhoAmI ended to the agent lane (`lanes.rs`).
    checked: UnboundedSender<ObjectRef<Workspace>>,
}

/// Checks agents for the reconcile loop.
#[derive(Clone)]
pub struct AgentChecker {
    shared: Arc<Shared>,
}

/// Where the checker hands back the workspaces whose calls ended.
pub struct Woken {
    /// Those whose `GetActivity` or `GetContent` answer came: the controller's queue.
    pub answered: UnboundedReceiver<ObjectRef<Workspace>>,
    /// Those whose WhoAmI ended: the agent lane's.
    pub checked: UnboundedReceiver<ObjectRef<Workspace>>,
}

impl AgentChecker {
    /// The checker, and the streams of workspaces to reconcile when a background call ends.
    pub fn new(client: Client, config: AgentConfig, metrics: Arc<Metrics>) -> (Self, Woken) {
        let (wake, answered) = futures::channel::mpsc::unbounded();
        let (checked_tx, checked) = futures::channel::mpsc::unbounded();
        let tokens = AgentTokens::new(
            client.clone(),
            "the operator's",
            &config.service_account.namespace,
            &config.service_account.name,
            config.token_lifetime,
        );
        let config_in_flight = config.checks_in_flight;
        let shared = Shared {
            config,
            metrics,
            tokens,
            attempts: Default::default(),
            activity: Default::default(),
            content: Default::default(),
            wake,
            checks: FifoPool::new(config_in_flight),
            checked: checked_tx,
        };
        (
            AgentChecker {
                shared: Arc::new(shared),
            },
            Woken { answered, checked },
        )
    }

    /// Starts the first check of the agent of a pod the cache just showed ready, when one is
    /// due (`state::agent_to_check`) and none was made or asked for this pod: straight from
    /// the pod watch, so a check waits only behind checks of pods that turned ready before it,
    /// never behind the controller's queue. Its end reconciles the workspace in the agent lane.
    pub fn start_for_ready_pod(&self, workspace: &Workspace, pod: &CachedPod) {
        let shared = &self.shared;
        let Some(address) = state::agent_to_check(workspace, Some(pod), shared.config.port) else {
            return;
        };
        let key = (
            workspace.namespace().unwrap_or_default(),
            workspace.name_any(),
        );
        let pod_uid = pod.uid().unwrap_or_default();
        let tls = crate::pod::serves_agent_tls(pod);
        let mut attempts = shared.attempts();
        // A result for this pod stands until a reconcile reads it (a retry is the
        // controller's); one running is not started twice (`Shared::start`).
        if !matches!(attempts.get(&key), Some(Attempt::Done { check, .. }) if check.pod_uid == pod_uid)
        {
            Shared::start(shared, &mut attempts, key, pod_uid, address, tls, 0, None);
        }
    }

    /// The check of the workspace's pod's agent, when it needs one: the result of a call, made
    /// now when none was made for this pod or the backoff ran out; the last failure again while
    /// the backoff runs; None while a call is still running (the workspace is woken when it
    /// ends) or when nothing needs checking.
    pub async fn check(
        &self,
        workspace: &Workspace,
        pod: Option<&CachedPod>,
        now: Timestamp,
    ) -> Option<AgentCheck> {
        let shared = &self.shared;
        let key = (
            workspace.namespace().unwrap_or_default(),
            workspace.name_any(),
        );
        let Some(address) = state::agent_to_check(workspace, pod, shared.config.port) else {
            shared.attempts().remove(&key);
            return None;
        };
        let pod_uid = pod.and_then(|p| p.uid()).unwrap_or_default();
        let mut done = match shared.result(&key, &pod_uid, now) {
            Lookup::Result(check) => return Some(check),
            // Started elsewhere (the pod watch, an earlier reconcile): its end reconciles the
            // workspace in the agent lane; this reconcile does not wait for it.
            Lookup::Running(previous) => return previous,
            Lookup::Due { failures, previous } => {
                let tls = pod.is_some_and(crate::pod::serves_agent_tls);
                let (key, uid) = (key.clone(), pod_uid.clone());
                let mut attempts = shared.attempts();
                Shared::start(
                    shared,
                    &mut attempts,
                    key,
                    uid,
                    address,
                    tls,
                    failures,
                    previous,
                )
            }
        };
        let _ = tokio::time::timeout(INLINE_WAIT, done.wait_for(|d| *d)).await;
        match shared.result(&key, &pod_uid, now) {
            Lookup::Result(check) => Some(check),
            // A retry still running: the last failure stands (the status does not flap).
            Lookup::Running(previous) => previous,
            Lookup::Due { .. } => None,
        }
    }

    /// The last `GetActivity` answer from the agent of the workspace's pod, asking again now
    /// when `idle.rs` says it is due (in the background past a short wait, waking the
    /// workspace when it ends); None when the workspace has no idle timeout, its pod's agent
    /// is not verified, or nothing was asked yet.
    pub async fn activity(
        &self,
        workspace: &Workspace,
        pod: Option<&CachedPod>,
        now: Timestamp,
    ) -> Option<ActivityCheck> {
        let shared = &self.shared;
        let key = (
            workspace.namespace().unwrap_or_default(),
            workspace.name_any(),
        );
        let (Some(timeout), Some(pod)) = (idle::wanted(workspace, pod), pod) else {
            shared.activity().remove(&key);
            return None;
        };
        let pod_uid = pod.uid().unwrap_or_default();
        let address = workspace
            .status
            .as_ref()
            .and_then(|s| s.agent.as_ref())
            .and_then(|a| a.address.clone())?;
        let (last, failures) = match stored(&mut shared.activity(), &key, &pod_uid) {
            Stored::Asking(previous) => return previous,
            Stored::Answered(check, failures) => (Some(check), failures),
            Stored::Nothing => (None, 0),
        };
        let status = workspace.status.clone().unwrap_or_default();
        let since = idle::idle_since(&status, last.as_ref())?;
        if !idle::next_ask(timeout, since, last.as_ref(), now).is_zero() {
            return last;
        }
        let tls = crate::pod::serves_agent_tls(pod);
        let mut done = Shared::ask_activity(
            shared,
            key.clone(),
            pod_uid.clone(),
            address,
            tls,
            failures,
            last.clone(),
        );
        let _ = tokio::time::timeout(INLINE_WAIT, done.wait_for(|d| *d)).await;
        match stored(&mut shared.activity(), &key, &pod_uid) {
            Stored::Answered(check, _) => Some(check),
            // Still asking: the answer before stands (the workspace is woken when it comes).
            _ => last,
        }
    }

    /// Hands the workspace to the controller's queue.
    pub fn wake(&self, workspace: ObjectRef<Workspace>) {
        let _ = self.shared.wake.unbounded_send(workspace);
    }

    /// Forgets a workspace that is going away (a call still running then stores nothing).
    pub fn forget(&self, workspace: &Workspace) {
        let key = (
            workspace.namespace().unwrap_or_default(),
            workspace.name_any(),
        );
        self.shared.attempts().remove(&key);
        self.shared.activity().remove(&key);
        self.shared.contents().remove(&key);
    }

    /// The last `GetContent` answer from the agent of the workspace's pod while its content is
    /// not in place, asking again when `interval` has passed since the last ask (in the
    /// background past a short wait, waking the workspace when it ends).
    pub async fn content(
        &self,
        workspace: &Workspace,
        pod: Option<&CachedPod>,
        now: Timestamp,
        interval: Duration,
    ) -> Option<ContentCheck> {
        let shared = &self.shared;
        let key = (
            workspace.namespace().unwrap_or_default(),
            workspace.name_any(),
        );
        let pod = pod.filter(|p| crate::content::wanted(workspace, Some(p)));
        let Some(pod) = pod else {
            shared.contents().remove(&key);
            return None;
        };
        let pod_uid = pod.uid().unwrap_or_default();
        let ip = pod.status.as_ref()?.pod_ip.clone()?;
        let address = state::agent_address(&ip, shared.config.port);
        let last = match stored(&mut shared.contents(), &key, &pod_uid) {
            Stored::Asking(previous) => return previous,
            Stored::Answered(check, _) => Some(check),
            Stored::Nothing => None,
        };
        if !crate::content::ask_due(last.as_ref(), &pod_uid, now, interval) {
            return last;
        }
        let tls = crate::pod::serves_agent_tls(pod);
        let mut done = Shared::ask_content(
            shared,
            key.clone(),
            pod_uid.clone(),
            address,
            tls,
            last.clone(),
        );
        let _ = tokio::time::timeout(INLINE_WAIT, done.wait_for(|d| *d)).await;
        match stored(&mut shared.contents(), &key, &pod_uid) {
            Stored::Answered(check, _) => Some(check),
            // Still asking: the answer before stands (the workspace is woken when it comes).
            _ => last,
        }
    }
}

/// What [`Shared::result`] found.
enum Lookup {
    Result(AgentCheck),
    /// A call runs; the failure before it, if any, still stands.
    Running(Option<AgentCheck>),
    /// A call is due; `failures` so far for this pod, and the last of them.
    Due {
        failures: u32,
        previous: Option<AgentCheck>,
    },
}

impl Shared {
    fn attempts(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Attempt>> {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Ask<ActivityCheck>>> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn contents(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Ask<ContentCheck>>> {
        self.content.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the answer of an ask, unless the workspace went or moved to another pod
    /// meanwhile, and wakes the workspace.
    fn answered<C: Answer>(
        &self,
        asks: &Mutex<HashMap<Key, Ask<C>>>,
        key: &Key,
        check: C,
        failures: u32,
        done: &watch::Sender<bool>,
    ) {
        let mut asks = asks.lock().unwrap_or_else(|p| p.into_inner());
        let still_wanted = matches!(asks.get(key), Some(Ask::InFlight { pod_uid, .. }) if pod_uid == check.pod_uid());
        if !still_wanted {
            return;
        }
        asks.insert(
            key.clone(),
            Ask::Done {
                check,
                failures,
                delivered: false,
            },
        );
        drop(asks);
        let _ = done.send(true);
        let (namespace, name) = key;
        let _ = self
            .wake
            .unbounded_send(ObjectRef::new(name).within(namespace));
    }

    /// Starts a `GetContent` in the background; returns what turns true when its answer is
    /// stored (and the workspace woken).
    fn ask_content(
        shared: &Arc<Shared>,
        key: Key,
        pod_uid: String,
        address: String,
        tls: bool,
        previous: Option<ContentCheck>,
    ) -> watch::Receiver<bool> {
        let (done_tx, done) = watch::channel(false);
        asking(&mut shared.contents(), &key, &pod_uid, previous);
        let shared = shared.clone();
        tokio::spawn(
            async move {
                let asked_at = jiff::Timestamp::now();
                let outcome = shared.call_content(&address, tls, &key.0).await;
                let check = ContentCheck {
                    pod_uid,
                    asked_at,
                    outcome,
                    fresh: true,
                };
                shared.answered(&shared.content, &key, check, 0, &done_tx);
            }
            .in_current_span(),
        );
        done
    }

    /// One `GetContent`, with the operator's token for the namespace.
    async fn call_content(&self, address: &str, tls: bool, namespace: &str) -> ContentOutcome {
        let unasked = |reason: Reason, message: String| ContentOutcome::Unasked { reason, message };
        let timeout = self.config.timeout;
        let answer = match self
            .with_token(namespace, tls, |token, client_tls| async move {
                get_content(address, &token, timeout, client_tls.as_ref()).await
            })
            .await
        {
            Ok(answer) => answer,
            Err(message) => return unasked(Reason::Unknown, message),
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(e @ CallError::Unreachable { .. }) => {
                return unasked(Reason::AgentUnreachable, e.to_string());
            }
            Err(CallError::Refused(status)) => {
                return unasked(refusal_reason(status.code()), status.message().to_owned());
            }
        };
        let reference = (!answer.r#ref.is_empty()).then(|| answer.r#ref.clone());
        match answer.state.as_str() {
            "Cloning" => ContentOutcome::Cloning {
                progress: answer.message,
            },
            "Ready" => ContentOutcome::Ready {
                reason: Reason::parse(&answer.reason),
                url: answer.url,
                reference,
                commit: answer.commit,
                message: answer.message,
            },
            "Failed" => ContentOutcome::Failed {
                reason: Reason::parse(&answer.reason),
                message: answer.message,
                retry_in: (answer.retry_in_seconds > 0)
                    .then(|| Duration::from_secs(answer.retry_in_seconds.into())),
                failing_for: Duration::from_secs(answer.failing_for_seconds),
            },
            _ => ContentOutcome::Waiting,
        }
    }

    /// Starts a `GetActivity` in the background; returns what turns true when its answer is
    /// stored (and the workspace woken).
    fn ask_activity(
        shared: &Arc<Shared>,
        key: Key,
        pod_uid: String,
        address: String,
        tls: bool,
        failures: u32,
        previous: Option<ActivityCheck>,
    ) -> watch::Receiver<bool> {
        let (done_tx, done) = watch::channel(false);
        asking(&mut shared.activity(), &key, &pod_uid, previous);
        let shared = shared.clone();
        tokio::spawn(
            async move {
                let asked_at = jiff::Timestamp::now();
                let outcome = shared.call_activity(&address, tls, &key.0).await;
                let (result, failures) = match &outcome {
                    ActivityOutcome::Seen { .. } => ("ok".to_owned(), 0),
                    ActivityOutcome::Failed { reason, message } => {
                        let (namespace, name) = &key;
                        warn!(%namespace, workspace = %name, %address, %reason, detail = %message, "cannot ask the agent for activity; the workspace is not culled meanwhile");
                        (reason.to_string(), failures + 1)
                    }
                };
                shared
                    .metrics
                    .activity_checks
                    .get_or_create(&ResultLabel { result })
                    .inc();
                let retry_in = match failures {
                    0 => Duration::ZERO,
                    n => state::agent_backoff(n, shared.config.backoff_base, shared.config.backoff_max),
                };
                let check = ActivityCheck {
                    pod_uid,
                    asked_at,
                    outcome,
                    fresh: true,
                    retry_in,
                };
                shared.answered(&shared.activity, &key, check, failures, &done_tx);
            }
            .in_current_span(),
        );
        done
    }

    /// One `GetActivity`, with the operator's token for the namespace (renewed once if the
    /// agent rejected it).
    async fn call_activity(&self, address: &str, tls: bool, namespace: &str) -> ActivityOutcome {
        let failed = |reason: Reason, message: String| ActivityOutcome::Failed { reason, message };
        let timeout = self.config.timeout;
        let answer = match self
            .with_token(namespace, tls, |token, client_tls| async move {
                get_activity(address, &token, timeout, client_tls.as_ref()).await
            })
            .await
        {
            Ok(answer) => answer,
            Err(message) => return failed(Reason::Unknown, message),
        };
        match answer {
            Ok(answer) => match answer.last_activity.parse::<jiff::Timestamp>() {
                Ok(at) => ActivityOutcome::Seen {
                    at,
                    signal: answer.signal,
                    detail: answer.detail,
                },
                Err(e) => failed(
                    Reason::Unknown,
                    format!(
                        "the agent at {address} answered an unreadable time {:?}: {e}",
                        answer.last_activity
                    ),
                ),
            },
            Err(e @ CallError::Unreachable { .. }) => {
                failed(Reason::AgentUnreachable, e.to_string())
            }
            Err(CallError::Refused(status)) => {
                failed(refusal_reason(status.code()), status.message().to_owned())
            }
        }
    }

    /// The stored state of the check of `pod_uid`'s agent, read at `now`.
    fn result(&self, key: &Key, pod_uid: &str, now: Timestamp) -> Lookup {
        let mut attempts = self.attempts();
        match attempts.get_mut(key) {
            Some(Attempt::InFlight {
                pod_uid: uid,
                previous,
                ..
            }) if uid == pod_uid => Lookup::Running(previous.clone().map(|check| AgentCheck {
                fresh: false,
                // The wake comes when the call ends, within its timeout.
                retry_in: self.config.timeout,
                ..check
            })),
            Some(Attempt::Done {
                check,
                failures,
                next_at,
                delivered,
            }) if check.pod_uid == pod_uid => {
                match state::agent_reading(check, *next_at, *delivered, now) {
                    Some(reading) => {
                        *delivered = true;
                        Lookup::Result(reading)
                    }
                    None => Lookup::Due {
                        failures: *failures,
                        previous: Some(check.clone()),
                    },
                }
            }
            _ => Lookup::Due {
                failures: 0,
                previous: None,
            },
        }
    }

    /// Starts a WhoAmI in the background, behind those asked for before it, unless one for
    /// this pod runs already; returns what turns true when its result is stored. `attempts`
    /// is held locked throughout, so whether one runs and starting one are a single step.
    #[allow(clippy::too_many_arguments)]
    fn start(
        shared: &Arc<Shared>,
        attempts: &mut HashMap<Key, Attempt>,
        key: Key,
        pod_uid: String,
        address: String,
        tls: bool,
        failures: u32,
        previous: Option<AgentCheck>,
    ) -> watch::Receiver<bool> {
        // Started by someone else meanwhile (the pod watch and a reconcile at once): one call.
        if let Some(Attempt::InFlight {
            pod_uid: running,
            done,
            ..
        }) = attempts.get(&key)
            && *running == pod_uid
        {
            return done.clone();
        }
        let (done_tx, done) = watch::channel(false);
        attempts.insert(
            key.clone(),
            Attempt::InFlight {
                pod_uid: pod_uid.clone(),
                done: done.clone(),
                previous,
            },
        );
        let caller = shared.clone();
        let asked = std::time::Instant::now();
        shared.checks.run(
            async move {
                let shared = caller;
                let began = std::time::Instant::now();
                let outcome = shared.call(&address, tls, &key).await;
                let took = Took {
                    waited: began - asked,
                    called: began.elapsed(),
                };
                shared.finish(key, pod_uid, address, outcome, failures, took);
                let _ = done_tx.send(true);
            }
            .in_current_span(),
        );
        done
    }

    /// Stores a call's result (unless the workspace moved on meanwhile), counts and logs it,
    /// and wakes the workspace.
    fn finish(
        &self,
        key: Key,
        pod_uid: String,
        address: String,
        outcome: AgentOutcome,
        failures: u32,
        took: Took,
    ) {
        let (waited_seconds, call_seconds) = (took.waited.as_secs_f64(), took.called.as_secs_f64());
        let result = match &outcome {
            AgentOutcome::Verified { .. } => "ok".to_owned(),
            AgentOutcome::Failed { reason, .. } => reason.to_string(),
        };
        self.metrics
            .agent_checks
            .get_or_create(&ResultLabel { result })
            .inc();
        let (namespace, name) = &key;
        let (failures, retry_in) = match &outcome {
            AgentOutcome::Verified { identity } => {
                info!(%namespace, workspace = %name, %address, %identity, waited_seconds, call_seconds, "the agent authenticated the operator");
                (0, Duration::ZERO)
            }
            AgentOutcome::Failed { reason, message } => {
                let failures = failures + 1;
                let retry_in = state::agent_backoff(
                    failures,
                    self.config.backoff_base,
                    self.config.backoff_max,
                );
                warn!(%namespace, workspace = %name, %address, %reason, detail = %message, retry_in_seconds = retry_in.as_secs_f64(), waited_seconds, call_seconds, "the agent check failed; the pod is kept");
                (failures, retry_in)
            }
        };
        let mut attempts = self.attempts();
        let still_wanted = matches!(attempts.get(&key), Some(Attempt::InFlight { pod_uid: uid, .. }) if *uid == pod_uid);
        if still_wanted {
            attempts.insert(
                key.clone(),
                Attempt::Done {
                    check: AgentCheck {
                        pod_uid,
                        address,
                        outcome,
                        fresh: true,
                        retry_in,
                    },
                    failures,
                    next_at: Timestamp::now()
                        .checked_add(retry_in)
                        .unwrap_or(Timestamp::MAX),
                    delivered: false,
                },
            );
            drop(attempts);
            let _ = self
                .checked
                .unbounded_send(ObjectRef::new(name).within(namespace));
        }
    }

    /// One WhoAmI; an answer counts only from the agent of `workspace` (namespace, name): a pod
    /// IP reused by another workspace's pod must not vouch for this one.
    async fn call(&self, address: &str, tls: bool, workspace: &(String, String)) -> AgentOutcome {
        let unknown = |message: String| AgentOutcome::Failed {
            reason: Reason::Unknown,
            message,
        };
        let timeout = self.config.timeout;
        let answer = match self
            .with_token(&workspace.0, tls, |token, client_tls| async move {
                who_am_i(address, &token, timeout, client_tls.as_ref()).await
            })
            .await
        {
            Ok(answer) => answer,
            Err(message) => return unknown(message),
        };
        let operator = self.config.service_account.username();
        match answer {
            Ok(answer)
                if (&answer.workspace_namespace, &answer.workspace_name)
                    != (&workspace.0, &workspace.1) =>
            {
                unknown(format!(
                    "the agent at {address} serves workspace {}/{} (pod {}), not {}/{}",
                    answer.workspace_namespace,
                    answer.workspace_name,
                    answer.pod_name,
                    workspace.0,
                    workspace.1
                ))
            }
            // Whoever the agent says called must be the operator's own service account: an
            // agent that lets everyone in (or is not ours) says someone else.
            Ok(answer) if answer.caller_username != operator => AgentOutcome::Failed {
                reason: Reason::IdentityMismatch,
                message: format!(
                    "the agent at {address} authenticated the operator as {:?}, not as its service account {operator}",
                    answer.caller_username
                ),
            },
            Ok(answer) => AgentOutcome::Verified {
                identity: answer.caller_username,
            },
            Err(e @ CallError::Unreachable { .. }) => AgentOutcome::Failed {
                reason: Reason::AgentUnreachable,
                message: e.to_string(),
            },
            Err(CallError::Refused(status)) => AgentOutcome::Failed {
                reason: refusal_reason(status.code()),
                message: status.message().to_owned(),
            },
        }
    }

    /// Makes `call` with the operator's token for `namespace` (and the agent's TLS, when it
    /// serves TLS); a cached token the agent rejected (its service account was re-created, say)
    /// is renewed and the call made once more. Err: why no call could be made.
    async fn with_token<T, F, Fut>(
        &self,
        namespace: &str,
        tls: bool,
        call: F,
    ) -> Result<Result<T, CallError>, String>
    where
        F: Fn(String, Option<ClientTls>) -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        let client_tls = match (tls, &self.config.tls) {
            (false, _) => None,
            (true, Some(config)) => Some(ClientTls {
                ca_pem: config.ca_pem.clone(),
            }),
            (true, None) => {
                return Err("the agent serves TLS but the operator has no CA to verify it (--agent-tls-ca); the pod was made when TLS was on".to_owned());
            }
        };
        let (token, fresh) = self.tokens.token(namespace).await?;
        let answer = call(token.clone(), client_tls.clone()).await;
        if !fresh && matches!(&answer, Err(CallError::Refused(s)) if token_rejected(s)) {
            self.tokens.forget(namespace, &token).await;
            let (renewed, _) = self.tokens.token(namespace).await?;
            return Ok(call(renewed, client_tls).await);
        }
        Ok(answer)
    }
}
