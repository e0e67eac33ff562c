//! Faults on demand, from Rust (`SimCluster::faults()`) and from outside through the
//! `ConfigMap` `kube-system/berth-sim-faults` (node faults are node annotations, read by the
//! kubelet and the node lifecycle controller). One seeded RNG makes fractions reproducible.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::error::ApiError;

/// The ConfigMap whose data sets cluster-wide faults.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP_NAME: &str = "berth-sim-faults";
/// Node annotation: `"N:Reason"` rejects the next N pods admitted on the node.
pub const REJECT_NEXT_ANNOTATION: &str = "sim.berth.dev/reject-next";
/// Node annotation: `"true"` makes the node stop heartbeating.
pub const UNREACHABLE_ANNOTATION: &str = "sim.berth.dev/unreachable";

/// Which requests an API fault applies to; `None` matches any.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestMatch {
    pub verb: Option<String>,
    pub resource: Option<String>,
    /// Only requests in this namespace (never a cluster-scoped one).
    pub namespace: Option<String>,
}

impl RequestMatch {
    pub fn new(verb: &str, resource: &str) -> Self {
        let any = |s: &str| (s != "*" && !s.is_empty()).then(|| s.to_owned());
        RequestMatch {
            verb: any(verb),
            resource: any(resource),
            namespace: None,
        }
    }

    /// The same, for requests in `namespace` only.
    pub fn in_namespace(self, namespace: &str) -> Self {
        RequestMatch {
            namespace: Some(namespace.to_owned()),
            ..self
        }
    }

    fn matches(&self, verb: &str, resource: &str, namespace: &str) -> bool {
        self.verb.as_deref().is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.namespace.as_deref().is_none_or(|n| n == namespace)
    }
}

/// How often an API fault fires.
#[derive(Clone, Debug, PartialEq)]
pub enum Frequency {
    /// The next N matching requests.
    Next(u32),
    /// A fraction of matching requests, drawn from the seeded RNG.
    Fraction(f64),
}

/// An injected API error.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiFault {
    pub matching: RequestMatch,
    /// 500, 503, 429 (with `Retry-After`) or 409.
    pub code: u16,
    pub frequency: Frequency,
}

#[derive(Default)]
struct Layer {
    api_errors: Vec<ApiFault>,
    /// Faults that let the write happen and lose its answer.
    lost_replies: Vec<ApiFault>,
    latency: Vec<(RequestMatch, Duration)>,
    reject_fraction: Option<(f64, String)>,
    token_review_unavailable: bool,
    subject_access_review_unavailable: bool,
    close_watches_every: Option<Duration>,
}

struct State {
    /// Set from Rust.
    rust: Layer,
    /// Set by the ConfigMap; replaced whenever it changes.
    config_map: Layer,
    reject_next: HashMap<String, VecDeque<String>>,
    label_races: HashMap<String, u32>,
    unreachable: HashSet<String>,
    rng: StdRng,
}

/// The cluster's faults.
pub struct Faults {
    state: Mutex<State>,
    /// Requests a latency fault holds right now.
    held: Arc<AtomicUsize>,
    /// The resources whose watches send nothing until released.
    held_watches: tokio::sync::watch::Sender<HashSet<String>>,
}

/// Counts a request as held by a latency fault until dropped.
pub struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A rejection the kubelet must apply at admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
}

impl Faults {
    pub fn new(seed: u64) -> Self {
        Faults {
            state: Mutex::new(State {
                rust: Layer::default(),
                config_map: Layer::default(),
                reject_next: HashMap::new(),
                label_races: HashMap::new(),
                unreachable: HashSet::new(),
                rng: StdRng::seed_from_u64(seed),
            }),
            held: Arc::default(),
            held_watches: tokio::sync::watch::Sender::new(HashSet::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rejects the next `count` pods admitted on `node` with `reason` (e.g. `OutOfcpu`).
    pub fn reject_next(&self, node: &str, count: u32, reason: &str) {
        let mut state = self.lock();
        let queue = state.reject_next.entry(node.to_owned()).or_default();
        queue.extend((0..count).map(|_| reason.to_owned()));
    }

    /// Rejects a seeded fraction of all admissions with `reason`; 0 turns it off.
    pub fn reject_fraction(&self, fraction: f64, reason: &str) {
        self.lock().rust.reject_fraction = (fraction > 0.0).then(|| (fraction, reason.to_owned()));
    }

    /// The node's labels change between binding and admission of the next pod on it, so
    /// the kubelet rejects that pod with `NodeAffinity`.
    pub fn node_label_race(&self, node: &str) {
        *self.lock().label_races.entry(node.to_owned()).or_default() += 1;
    }

    /// A node stops (or resumes) heartbeating.
    pub fn set_unreachable(&self, node: &str, unreachable: bool) {
        let mut state = self.lock();
        if unreachable {
            state.unreachable.insert(node.to_owned());
        } else {
            state.unreachable.remove(node);
        }
    }

    pub fn is_unreachable(&self, node: &str) -> bool {
        self.lock().unreachable.contains(node)
    }

    /// Injects API errors.
    pub fn api_error(&self, fault: ApiFault) {
        self.lock().rust.api_errors.push(fault);
    }

    /// Loses the answers of matching requests: the request is carried out (a write is
    /// stored), and the client gets the fault's error instead of the result, as when a
    /// timeout or a proxy's 5xx comes after the API server committed.
    pub fn lost_reply(&self, fault: ApiFault) {
        self.lock().rust.lost_replies.push(fault);
    }

    /// Delays matching requests.
    pub fn latency(&self, matching: RequestMatch, delay: Duration) {
        self.lock().rust.latency.push((matching, delay));
    }

    /// Counts a request as held by a latency fault while the result lives.
    pub fn hold(&self) -> Held {
        self.held.fetch_add(1, Ordering::SeqCst);
        Held(self.held.clone())
    }

    /// How many requests latency faults hold right now (a test waits for its clients to be
    /// stuck in them).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Holds (or releases) the events of every watch of `resource` (e.g. `workspaces`), as a
    /// watch cache that fell behind under load: each watch sends its events in order once
    /// released; requests other than watches answer as ever, from the current state.
    pub fn hold_watches(&self, resource: &str, held: bool) {
        self.held_watches.send_modify(|holds| {
            match held {
                true => holds.insert(resource.to_owned()),
                false => holds.remove(resource),
            };
        });
    }

    /// Resolves once the watches of `resource` are not held (at once when they are not).
    pub async fn watch_released(&self, resource: &str) {
        if !self.held_watches.borrow().contains(resource) {
            return;
        }
        let mut holds = self.held_watches.subscribe();
        let _ = holds.wait_for(|held| !held.contains(resource)).await;
    }

    /// Removes every API error and latency fault set from Rust.
    pub fn clear_api_faults(&self) {
        let mut state = self.lock();
        state.rust.api_errors.clear();
        state.rust.lost_replies.clear();
        state.rust.latency.clear();
    }

    /// TokenReview answers 503 while set.
    pub fn token_review_unavailable(&self, unavailable: bool) {
        self.lock().rust.token_review_unavailable = unavailable;
    }

    /// SubjectAccessReview answers 503 while set.
    pub fn subject_access_review_unavailable(&self, unavailable: bool) {
        self.lock().rust.subject_access_review_unavailable = unavailable;
    }

    /// Closes every watch stream every `period` (None stops it).
    pub fn close_watches_every(&self, period: Option<Duration>) {
        self.lock().rust.close_watches_every = period;
    }

    pub fn watch_close_period(&self) -> Option<Duration> {
        let state = self.lock();
        state
            .rust
            .close_watches_every
            .or(state.config_map.close_watches_every)
    }

    /// Whether the kubelet must reject a pod being admitted on `node`, from Rust faults.
    pub fn admission(&self, node: &str) -> Option<Rejection> {
        let mut state = self.lock();
        if let Some(reason) = state
            .reject_next
            .get_mut(node)
            .and_then(VecDeque::pop_front)
        {
            return Some(Rejection { reason });
        }
        if let Some(count) = state.label_races.get_mut(node).filter(|c| **c > 0) {
            *count -= 1;
            return Some(Rejection {
                reason: "NodeAffinity".to_owned(),
            });
        }
        let fraction = state
            .rust
            .reject_fraction
            .clone()
            .or_else(|| state.config_map.reject_fraction.clone());
        if let Some((fraction, reason)) = fraction
            && state.rng.random_bool(fraction.clamp(0.0, 1.0))
        {
            return Some(Rejection { reason });
        }
        None
    }

    /// The injected error for a request, if one fires (before the request is carried out).
    pub fn request_error(&self, verb: &str, resource: &str, namespace: &str) -> Option<ApiError> {
        self.fire((verb, resource, namespace), |layer| &mut layer.api_errors)
    }

    /// The error that replaces a request's answer after it was carried out, if one fires.
    pub fn lost_reply_error(
        &self,
        verb: &str,
        resource: &str,
        namespace: &str,
    ) -> Option<ApiError> {
        self.fire((verb, resource, namespace), |layer| &mut layer.lost_replies)
    }

    fn fire(
        &self,
        (verb, resource, namespace): (&str, &str, &str),
        faults: impl Fn(&mut Layer) -> &mut Vec<ApiFault>,
    ) -> Option<ApiError> {
        let mut state = self.lock();
        let State {
            rust,
            config_map,
            rng,
            ..
        } = &mut *state;
        for layer in [rust, config_map] {
            let list = faults(layer);
            for fault in list
                .iter_mut()
                .filter(|f| f.matching.matches(verb, resource, namespace))
            {
                let fires = match &mut fault.frequency {
                    Frequency::Next(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    Frequency::Next(_) => false,
                    Frequency::Fraction(f) => rng.random_bool(f.clamp(0.0, 1.0)),
                };
                if fires {
                    return Some(injected(fault.code, verb, resource));
                }
            }
            list.retain(|f| f.frequency != Frequency::Next(0));
        }
        None
    }

    /// The injected delay for a request (`namespace` empty for a cluster-scoped one).
    pub fn request_latency(&self, verb: &str, resource: &str, namespace: &str) -> Option<Duration> {
        let state = self.lock();
        state
            .rust
            .latency
            .iter()
            .chain(&state.config_map.latency)
            .filter(|(m, _)| m.matches(verb, resource, namespace))
            .map(|(_, d)| *d)
            .max()
    }

    /// 503 for TokenReview or SubjectAccessReview while they are made unavailable.
    pub fn review_outage(&self, resource: &str) -> Option<ApiError> {
        let state = self.lock();
        let down = match resource {
            "tokenreviews" => {
                state.rust.token_review_unavailable || state.config_map.token_review_unavailable
            }
            "subjectaccessreviews" | "localsubjectaccessreviews" | "selfsubjectaccessreviews" => {
                state.rust.subject_access_review_unavailable
                    || state.config_map.subject_access_review_unavailable
            }
            _ => false,
        };
        down.then(|| ApiError::ServiceUnavailable {
            message: format!(
                "the server is currently unable to handle the request (post {resource})"
            ),
        })
    }

    /// Follows the faults ConfigMap in `store` (applying each version of it) until the store
    /// closes.
    pub async fn follow_config_map(&self, store: &crate::store::Store) {
        use crate::store::ChangeKind;
        use tokio::sync::broadcast::error::RecvError;
        let mut changes = store.subscribe_to("/configmaps");
        loop {
            let change = match changes.recv().await {
                Ok(change) => change,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            };
            let meta = &change.object["metadata"];
            if &*change.storage != "/configmaps"
                || meta["namespace"] != CONFIG_MAP_NAMESPACE
                || meta["name"] != CONFIG_MAP_NAME
            {
                continue;
            }
            let data = match change.kind {
                ChangeKind::Deleted => None,
                _ => change.object["data"].as_object(),
            };
            for problem in self.apply_config_map(data) {
                tracing::warn!(%problem, "berth-sim-faults");
            }
            // `compact: now`: forget the history now, so a list or watch from an older
            // resourceVersion gets 410 Gone (what kubectl and other clients' tests cannot ask
            // for through `compact()`).
            if data
                .and_then(|d| d.get("compact"))
                .and_then(serde_json::Value::as_str)
                .is_some_and(|v| !v.trim().is_empty())
            {
                store.compact();
            }
        }
    }

    /// Replaces the ConfigMap layer from the ConfigMap's data (None: it was deleted).
    /// Returns the lines that could not be read, for a warning.
    pub fn apply_config_map(
        &self,
        data: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Vec<String> {
        let mut problems = vec![];
        let mut layer = Layer::default();
        let text = |key: &str| {
            data.and_then(|d| d.get(key))
                .and_then(|v| v.as_str())
                .map(str::trim)
                .filter(|s| !s.is_empty())
        };
        if let Some(seed) = text("seed") {
            match seed.parse::<u64>() {
                Ok(seed) => self.lock().rng = StdRng::seed_from_u64(seed),
                Err(_) => problems.push(format!("seed: {seed:?} is not a number")),
            }
        }
        if let Some(fraction) = text("reject-fraction") {
            match fraction.parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => {
                    layer.reject_fraction = (f > 0.0)
                        .then(|| (f, text("reject-reason").unwrap_or("OutOfcpu").to_owned()));
                }
                _ => problems.push(format!(
                    "reject-fraction: {fraction:?} is not a number from 0 to 1"
                )),
            }
        }
        for line in text("api-errors")
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            match parse_api_error(line) {
                Some(fault) => layer.api_errors.push(fault),
                None => problems.push(format!("api-errors: cannot read {line:?}; write \"VERB RESOURCE CODE next=N\" or \"... fraction=F\"")),
            }
        }
        for line in text("lost-replies")
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            match parse_api_error(line) {
                Some(fault) => layer.lost_replies.push(fault),
                None => problems.push(format!("lost-replies: cannot read {line:?}; write \"VERB RESOURCE CODE next=N\" or \"... fraction=F\"")),
            }
        }
        for line in text("latency")
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                [verb, resource, delay] => match parse_duration(delay) {
                    Some(d) => layer.latency.push((RequestMatch::new(verb, resource), d)),
                    None => problems.push(format!("latency: {delay:?} is not a duration")),
                },
                _ => problems.push(format!(
                    "latency: cannot read {line:?}; write \"VERB RESOURCE DURATION\""
                )),
            }
        }
        if let Some(period) = text("close-watches-every") {
            match parse_duration(period) {
                Some(d) if !d.is_zero() => layer.close_watches_every = Some(d),
                _ => problems.push(format!("close-watches-every: {period:?} is not a duration")),
            }
        }
        layer.token_review_unavailable = text("token-review") == Some("unavailable");
        layer.subject_access_review_unavailable =
            text("subject-access-review") == Some("unavailable");
        self.lock().config_map = layer;
        problems
    }
}

/// `30s`, `200ms`, `1m` — read with jiff's friendly duration format.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let signed: jiff::SignedDuration = text.parse().ok()?;
    Duration::try_from(signed).ok()
}

fn parse_api_error(line: &str) -> Option<ApiFault> {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let [verb, resource, code, rest @ ..] = parts.as_slice() else {
        return None;
    };
    let code: u16 = code
        .parse()
        .ok()
        .filter(|c| matches!(c, 409 | 429 | 500 | 503))?;
    let frequency = match rest {
        [] => Frequency::Fraction(1.0),
        [one] => {
            let (key, value) = one.split_once('=')?;
            match key {
                "next" => Frequency::Next(value.parse().ok()?),
                "fraction" => Frequency::Fraction(
                    value
                        .parse()
                        .ok()
                        .filter(|f: &f64| (0.0..=1.0).contains(f))?,
                ),
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(ApiFault {
        matching: RequestMatch::new(verb, resource),
        code,
        frequency,
    })
}

fn injected(code: u16, verb: &str, resource: &str) -> ApiError {
    let what = format!("({verb} {resource})");
    match code {
        409 => ApiError::Conflict {
            message: format!("Operation cannot be fulfilled {what}: injected conflict"),
            kind: resource.to_owned(),
            name: String::new(),
            group: String::new(),
            causes: vec![],
        },
        429 => ApiError::TooManyRequests {
            message: format!("Too many requests, please try again later. {what}"),
            retry_after_seconds: 1,
        },
        503 => ApiError::ServiceUnavailable {
            message: format!("the server is currently unable to handle the request {what}"),
        },
        _ => ApiError::internal(format!("Internal error occurred: injected fault {what}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_n_then_stops() {
        let faults = Faults::new(1);
        faults.api_error(ApiFault {
            matching: RequestMatch::new("create", "pods"),
            code: 503,
            frequency: Frequency::Next(2),
        });
        assert!(faults.request_error("get", "pods", "").is_none());
        assert_eq!(
            faults.request_error("create", "pods", "").unwrap().code(),
            503
        );
        assert_eq!(
            faults.request_error("create", "pods", "").unwrap().code(),
            503
        );
        assert!(faults.request_error("create", "pods", "").is_none());
    }

    #[test]
    fn a_fault_in_a_namespace_spares_the_others() {
        let faults = Faults::new(1);
        let slow = Duration::from_secs(60);
        faults.latency(
            RequestMatch::new("patch", "workspaces").in_namespace("busy"),
            slow,
        );
        assert_eq!(
            faults.request_latency("patch", "workspaces", "busy"),
            Some(slow)
        );
        assert_eq!(faults.request_latency("patch", "workspaces", "team"), None);
        assert_eq!(faults.request_latency("patch", "workspacekinds", ""), None);
        assert_eq!(faults.request_latency("create", "workspaces", "busy"), None);
    }
    #[test]
    fn seeded_fractions_repeat() {
        let draws = |seed| {
            let faults = Faults::new(seed);
            faults.reject_fraction(0.3, "OutOfcpu");
            (0..200)
                .map(|_| faults.admission("n").is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        let hits = draws(7).iter().filter(|h| **h).count();
        assert!((30..90).contains(&hits), "{hits}");
    }

    #[test]
    fn config_map_keys() {
        let faults = Faults::new(1);
        let data = serde_json::json!({
            "api-errors": "create pods 429 next=1\npatch * 500 fraction=1",
            "latency": "list pods 200ms",
            "token-review": "unavailable",
            "close-watches-every": "30s",
            "reject-fraction": "bogus"
        });
        let problems = faults.apply_config_map(data.as_object());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            faults.request_error("create", "pods", "").unwrap().code(),
            429
        );
        assert!(faults.request_error("create", "pods", "").is_none());
        assert_eq!(
            faults
                .request_error("patch", "workspaces", "")
                .unwrap()
                .code(),
            500
        );
        assert_eq!(
            faults.request_latency("list", "pods", ""),
            Some(Duration::from_millis(200))
        );
        assert_eq!(faults.review_outage("tokenreviews").unwrap().code(), 503);
        assert_eq!(faults.watch_close_period(), Some(Duration::from_secs(30)));
        faults.apply_config_map(None);
        assert!(faults.review_outage("tokenreviews").is_none());
    }
}
