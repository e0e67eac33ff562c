//! Events the sim's own components (scheduler, kubelets, node controller) publish, as
//! client-go's legacy recorder does: core/v1 Events, a repeat of the same reason and message
//! for the same object bumps `count`, `lastTimestamp` and `series` instead of adding an event.

use std::{collections::HashMap, sync::Mutex};

use serde_json::{Value, json};

use crate::{
    sim::{Sim, now_rfc3339},
    store::resource_version,
};

/// Who reports an event.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// `kubelet`, `default-scheduler`, `node-controller`.
    pub component: &'a str,
    /// The node, for kubelet events.
    pub host: &'a str,
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
    /// Publishes (or bumps) an event about `object`. `field_path` names a container, e.g.
    /// `spec.containers{main}`.
    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &self,
        sim: &Sim,
        object: &Value,
        field_path: Option<&str>,
        type_: &str,
        reason: &str,
        message: &str,
        source: Source<'_>,
    ) {
        let Some(events) = sim.resource_type("", "v1", "events") else {
            return;
        };
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
                let Some(current) = sim.store.get(&events.storage, &ns, &name) else {
                    break;
                };
                let mut bumped = (*current).clone();
                let count = current["count"].as_i64().unwrap_or(1) + 1;
                bumped["count"] = json!(count);
                bumped["lastTimestamp"] = json!(now);
                bumped["series"] = json!({"count": count, "lastObservedTime": micro_time()});
                match sim.store.replace(
                    &events.storage,
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
        let ctx = crate::sim::WriteContext::system(source.component);
        if sim.create(&events, &namespace, event, &ctx).is_ok() {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (namespace, name));
        }
    }
}
