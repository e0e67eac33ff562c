//! Events the sim's own components (scheduler, kubelets, node controller) publish, as
//! client-go's legacy recorder does: core/v1 Events, a repeat of the same reason and message
//! for the same object bumps `count`, `lastTimestamp` and `series` instead of adding an event.

use std::{collections::HashMap, sync::Mutex};

use serde_json::{Value, json};

use crate::{
    meta::now_rfc3339,
    resources::StorageKey,
    store::{Store, resource_version},
};

/// Who reports an event.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// `kubelet`, `default-scheduler`, `node-controller`.
    pub component: &'a str,
    /// The node, for kubelet events.
    pub host: &'a str,
}

/// One event about an object.
#[derive(Clone, Copy, Debug)]
pub struct Report<'a> {
    pub object: &'a Value,
    /// Names a container, e.g. `spec.containers{main}`.
    pub field_path: Option<&'a str>,
    /// `Normal` or `Warning`.
    pub type_: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
    pub source: Source<'a>,
}

/// What makes two events the same: (object uid, reason, message, component).
type EventKey = (String, String, String, String);

/// Remembers which event object, (namespace, name), carries each event key, for aggregation.
#[derive(Default)]
pub struct Recorder {
    seen: Mutex<HashMap<EventKey, (String, String)>>,
}

fn micro_time() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

impl Recorder {
    /// Publishes (or bumps) `report`. A repeat is bumped in `store` (whose events are kept in
    /// `events`); a new event goes to `create` (namespace, event), which says whether it was
    /// stored.
    pub fn publish(
        &self,
        store: &Store,
        events: &StorageKey,
        report: Report<'_>,
        create: impl FnOnce(&str, Value) -> bool,
    ) {
        let Report {
            object,
            field_path,
            type_,
            reason,
            message,
            source,
        } = report;
        let meta = &object["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or("default").to_owned();
        let uid = meta["uid"].as_str().unwrap_or_default().to_owned();
        let key = (
            uid.clone(),
            reason.to_owned(),
            message.to_owned(),
            source.component.to_owned(),
        );
        let now = now_rfc3339();
        let existing = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        if let Some((ns, name)) = existing {
            for _ in 0..8 {
                let Some(current) = store.get(events, &ns, &name) else {
                    break;
                };
                let mut bumped = (*current).clone();
                let count = current["count"].as_i64().unwrap_or(1) + 1;
                bumped["count"] = json!(count);
                bumped["lastTimestamp"] = json!(now);
                bumped["series"] = json!({"count": count, "lastObservedTime": micro_time()});
                match store.replace(
                    events,
                    bumped,
                    resource_version(&current).unwrap_or_default(),
                ) {
                    Ok(_) => return,
                    Err(crate::store::WriteError::Stale) => continue,
                    Err(_) => break,
                }
            }
        }
        let name = format!(
            "{}.{:x}",
            meta["name"].as_str().unwrap_or("object"),
            jiff::Timestamp::now().as_nanosecond()
        );
        let mut involved = json!({
            "kind": object["kind"],
            "namespace": namespace,
            "name": meta["name"],
            "uid": uid,
            "apiVersion": object["apiVersion"],
            "resourceVersion": meta["resourceVersion"],
        });
        if let Some(path) = field_path {
            involved["fieldPath"] = json!(path);
        }
        let mut event = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "source": {"component": source.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": type_,
            "eventTime": null,
            "reportingComponent": source.component,
            "reportingInstance": source.host,
        });
        if !source.host.is_empty() {
            event["source"]["host"] = json!(source.host);
        }
        if create(&namespace, event) {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (namespace, name));
        }
    }
}
