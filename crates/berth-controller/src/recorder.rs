//! Publishes the operator's events (events.k8s.io/v1), as client-go's event recorder does: a
//! new event the first time, and the same event again within six minutes becomes a series
//! (its count and last time patched) instead of a new object.
//!
//! kube-runtime has a recorder, but it scans every event it ever published on each publish (to
//! drop the old ones) and keeps each whole event: at 10 000 workspaces that is the operator's
//! largest cache and an O(n) step in every reconcile that reports something. Here the series
//! are kept by a hash of what makes two events the same, with their name and count only, and
//! expire oldest first in O(1) each.

use std::{
    collections::{HashMap, VecDeque, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
    sync::Mutex,
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

/// How long an event may be repeated as a series (client-go's and kube-runtime's six minutes).
pub const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// The most series remembered; the oldest goes first. client-go's event correlator keeps 4096
/// too: a series forgotten early only means its next repeat is a new Event object.
pub const MAX_SERIES: usize = 4096;

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

/// One event to publish about an object.
#[derive(Clone, Debug)]
pub struct Report<'a> {
    pub type_: EventType,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: &'a str,
}

/// Who publishes: `reportingController` and `reportingInstance`.
#[derive(Clone, Debug)]
pub struct Reporter {
    pub controller: String,
    pub instance: Option<String>,
}

/// An event already published, by the hash of what makes it the same.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Published {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// What to do to publish an event now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publish {
    /// A new event object.
    Create,
    /// The `count`th time of the event `name` in `namespace`.
    Repeat {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// The series published lately: pure bookkeeping, no I/O.
#[derive(Debug, Default)]
pub struct Series {
    by_key: HashMap<u64, Published>,
    /// Keys in the order they were last published (with stale duplicates), oldest first.
    order: VecDeque<(Timestamp, u64)>,
}

impl Series {
    fn expire(&mut self, now: Timestamp) {
        while let Some(&(at, key)) = self.order.front() {
            if at + SERIES_TTL > now && self.by_key.len() <= MAX_SERIES {
                break;
            }
            self.order.pop_front();
            // Only the key's latest publish removes it (earlier ones are stale duplicates).
            if self.by_key.get(&key).is_some_and(|p| p.last == at) {
                self.by_key.remove(&key);
            }
        }
    }

    /// What to do for the event with `key` at `now`.
    pub fn plan(&mut self, key: u64, now: Timestamp) -> Publish {
        self.expire(now);
        match self.by_key.get(&key) {
            Some(p) => Publish::Repeat {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                count: p.count + 1,
            },
            None => Publish::Create,
        }
    }

    /// Records that the event with `key` was published as `name` for the `count`th time.
    pub fn published(&mut self, key: u64, namespace: &str, name: &str, count: i32, now: Timestamp) {
        self.by_key.insert(
            key,
            Published {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                count,
                last: now,
            },
        );
        self.order.push_back((now, key));
        self.expire(now);
    }

    /// Forgets the event with `key` (it is gone from the API).
    pub fn forget(&mut self, key: u64) {
        self.by_key.remove(&key);
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// What makes two events the same (client-go's key): the object, who reports, type, reason,
/// action and note.
pub fn key(reporter: &Reporter, regarding: &ObjectReference, report: &Report) -> u64 {
    let mut hasher = DefaultHasher::new();
    (
        &reporter.controller,
        &reporter.instance,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
        &regarding.uid,
    )
        .hash(&mut hasher);
    (report.type_, report.reason, report.action, report.note).hash(&mut hasher);
    hasher.finish()
}

/// How a failed event write is tried again, as client-go's recorder does (it tries 12 times,
/// about 10 s apart): only a failure that may pass (a 429, a 5xx, no answer) is retried, with
/// a doubling wait; the event is dropped after `attempts` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub attempts: u32,
    pub first: std::time::Duration,
    pub max: std::time::Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 12,
            first: std::time::Duration::from_secs(1),
            max: std::time::Duration::from_secs(10),
        }
    }
}

impl Retry {
    /// The wait before attempt `attempt + 1` (after `attempt` failures).
    pub fn wait(&self, attempt: u32) -> std::time::Duration {
        self.first
            .saturating_mul(1 << attempt.saturating_sub(1).min(16))
            .min(self.max)
    }
}

/// Whether a failed write may succeed when tried again: a 429 or a 5xx, or no answer at all.
pub fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(answer) => answer.code == 429 || answer.code >= 500,
        _ => true,
    }
}

/// Publishes events, repeating them as series.
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            series: Mutex::default(),
        }
    }

    fn series(&self) -> std::sync::MutexGuard<'_, Series> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `report` about the object `regarding` (in its namespace).
    pub async fn publish(
        &self,
        report: &Report<'_>,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = key(&self.reporter, regarding, report);
        let now = Timestamp::now();
        let plan = self.series().plan(key, now);
        if let Publish::Repeat {
            namespace,
            name,
            count,
        } = plan
        {
            let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let series = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => {
                    self.series().published(key, &namespace, &name, count, now);
                    return Ok(());
                }
                // Deleted meanwhile (the event's own TTL, or by hand): a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => self.series().forget(key),
                Err(e) => return Err(e),
            }
        }
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let event = self.event(report, regarding, &namespace, now);
        let name = event.metadata.name.clone().unwrap_or_default();
        match crate::written::create(&self.client, &namespace, &PostParams::default(), &event).await
        {
            // Its name is its own (object and time): a 409 is this very event, created by an
            // attempt whose answer was lost.
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
        self.series().published(key, &namespace, &name, 1, now);
        Ok(())
    }

    /// Publishes `report`, trying again after a failure that may pass, as `retry` says.
    /// Returns the last failure when it gave up.
    pub async fn publish_retried(
        &self,
        report: &Report<'_>,
        regarding: &ObjectReference,
        retry: Retry,
    ) -> Result<(), kube::Error> {
        let mut failures = 0;
        loop {
            match self.publish(report, regarding).await {
                Ok(()) => return Ok(()),
                Err(error) => {
                    failures += 1;
                    if !transient(&error) || failures >= retry.attempts {
                        return Err(error);
                    }
                    tokio::time::sleep(retry.wait(failures)).await;
                }
            }
        }
    }

    fn event(
        &self,
        report: &Report,
        regarding: &ObjectReference,
        namespace: &str,
        now: Timestamp,
    ) -> Event {
        Event {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(format!(
                    "{}.{:x}",
                    regarding
                        .name
                        .as_deref()
                        .unwrap_or(&self.reporter.controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            action: Some(report.action.to_owned()),
            reason: Some(report.reason.to_owned()),
            note: Some(report.note.to_owned()),
            type_: Some(
                match report.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_failed_event_is_retried_after_a_doubling_wait_only_when_it_may_pass() {
        let retry = Retry {
            attempts: 5,
            first: std::time::Duration::from_millis(100),
            max: std::time::Duration::from_millis(300),
        };
        let waits: Vec<u128> = (1..5).map(|a| retry.wait(a).as_millis()).collect();
        assert_eq!(waits, [100, 200, 300, 300]);
        let answer = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert!(transient(&answer(500)) && transient(&answer(503)) && transient(&answer(429)));
        assert!(!transient(&answer(403)) && !transient(&answer(422)) && !transient(&answer(404)));
    }

    #[test]
    fn the_same_event_within_six_minutes_is_a_series_after_that_a_new_event() {
        let mut series = Series::default();
        assert_eq!(series.plan(1, at(0)), Publish::Create);
        series.published(1, "team", "alice.1", 1, at(0));
        assert_eq!(
            series.plan(1, at(60)),
            Publish::Repeat {
                namespace: "team".into(),
                name: "alice.1".into(),
                count: 2
            }
        );
        series.published(1, "team", "alice.1", 2, at(60));
        // Six minutes after the last time, not the first.
        assert!(matches!(
            series.plan(1, at(60 + 359)),
            Publish::Repeat { count: 3, .. }
        ));
        assert_eq!(series.plan(1, at(60 + 360)), Publish::Create);
        assert!(series.is_empty(), "expired series are forgotten");
    }

    #[test]
    fn expiry_costs_only_what_expired() {
        let tenths = |n: i64| at(0) + SignedDuration::from_millis(100 * n);
        let mut series = Series::default();
        // A thousand events over 100 s: none expires meanwhile.
        for key in 0..1000 {
            series.published(key, "team", &format!("e{key}"), 1, tenths(key as i64));
        }
        assert_eq!(series.len(), 1000);
        // Republished late, key 0 stays when its first publish expires.
        series.published(0, "team", "e0", 2, tenths(1000));
        series.expire(tenths(500) + SERIES_TTL);
        assert_eq!(
            series.len(),
            1000 - 501 + 1,
            "the first 501 expired but key 0"
        );
        assert!(matches!(
            series.plan(0, tenths(500) + SERIES_TTL),
            Publish::Repeat { count: 3, .. }
        ));
        series.expire(tenths(1000) + SERIES_TTL);
        assert!(series.is_empty());
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let mut series = Series::default();
        for key in 0..(MAX_SERIES as u64 + 10) {
            series.published(key, "team", "e", 1, at(0));
        }
        assert_eq!(series.len(), MAX_SERIES);
        assert_eq!(
            series.plan(0, at(1)),
            Publish::Create,
            "the oldest went first"
        );
    }

    #[test]
    fn events_differing_in_object_reason_or_note_are_different_series() {
        let reporter = Reporter {
            controller: "berth".into(),
            instance: None,
        };
        let object = |name: &str| ObjectReference {
            kind: Some("Workspace".into()),
            namespace: Some("team".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        };
        let report = |reason, note| Report {
            type_: EventType::Warning,
            reason,
            action: reason,
            note,
        };
        let base = key(&reporter, &object("a"), &report("Failed", "x"));
        assert_eq!(base, key(&reporter, &object("a"), &report("Failed", "x")));
        assert_ne!(base, key(&reporter, &object("b"), &report("Failed", "x")));
        assert_ne!(base, key(&reporter, &object("a"), &report("Other", "x")));
        assert_ne!(base, key(&reporter, &object("a"), &report("Failed", "y")));
    }
}
