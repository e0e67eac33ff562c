//! The sim's controllers that a real control plane runs beside the API server: the garbage
//! collector (ownerReferences with Background, Foreground and Orphan propagation, dangling
//! owners), the namespace controller (a deleted namespace empties, then goes), the
//! apiextensions finalizer controller (a deleted CRD's instances go first), and the completion
//! of graceful pod deletions when no kubelet does it.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use serde_json::{Value, json};

use crate::{
    resources::{ResourceType, StorageKey},
    sim::{DeleteOptions, FOREGROUND, ORPHAN, Sim, WriteContext},
    store::{Change, ChangeKind, resource_version},
};

type ObjectRef = (StorageKey, String, String);

/// What the garbage collector knows: every object by UID, and dependents by owner UID.
#[derive(Default)]
struct Graph {
    objects: HashMap<String, ObjectRef>,
    dependents: HashMap<String, HashSet<ObjectRef>>,
}

fn uid(object: &Value) -> Option<String> {
    object["metadata"]["uid"].as_str().map(str::to_owned)
}

fn owner_uids(object: &Value) -> Vec<String> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn reference(storage: &StorageKey, object: &Value) -> ObjectRef {
    (
        storage.clone(),
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

impl Graph {
    fn add(&mut self, storage: &StorageKey, object: &Value) {
        let r = reference(storage, object);
        if let Some(u) = uid(object) {
            self.objects.insert(u, r.clone());
        }
        for owner in owner_uids(object) {
            self.dependents.entry(owner).or_default().insert(r.clone());
        }
    }

    fn remove(&mut self, storage: &StorageKey, object: &Value) {
        let r = reference(storage, object);
        if let Some(u) = uid(object) {
            self.objects.remove(&u);
        }
        for owner in owner_uids(object) {
            if let Some(set) = self.dependents.get_mut(&owner) {
                set.remove(&r);
                if set.is_empty() {
                    self.dependents.remove(&owner);
                }
            }
        }
    }

    fn rebuild(sim: &Sim) -> Self {
        let mut graph = Graph::default();
        for storage in sim.store.buckets() {
            let (objects, _) = sim.store.list(&storage, None);
            for object in objects {
                graph.add(&storage, &object);
            }
        }
        graph
    }
}

/// The type that serves a storage bucket natively.
fn type_of(sim: &Sim, storage: &str) -> Option<Arc<ResourceType>> {
    sim.registry()
        .all()
        .find(|t| &*t.storage == storage && t.view != crate::resources::View::EventsV1)
        .cloned()
}

fn ctx() -> WriteContext {
    WriteContext::system("generic-garbage-collector")
}

fn delete_ref(sim: &Sim, r: &ObjectRef, propagation: &str) {
    if let Some(rt) = type_of(sim, &r.0) {
        let options = DeleteOptions {
            propagation: Some(propagation.to_owned()),
            ..Default::default()
        };
        let _ = sim.delete(&rt, &r.1, &r.2, &options, &ctx());
    }
}

/// Removes `finalizer` from an object, retrying on conflicts.
fn remove_finalizer(sim: &Sim, r: &ObjectRef, finalizer: &str) {
    let Some(rt) = type_of(sim, &r.0) else { return };
    for _ in 0..8 {
        let Some(current) = sim.store.get(&r.0, &r.1, &r.2) else {
            return;
        };
        let list: Vec<Value> = current["metadata"]["finalizers"]
            .as_array()
            .map(|f| {
                f.iter()
                    .filter(|v| v.as_str() != Some(finalizer))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let patch = json!({"metadata": {"finalizers": list, "resourceVersion": current["metadata"]["resourceVersion"]}});
        match sim.patch(
            &rt,
            &r.1,
            &r.2,
            "",
            crate::patch::PatchType::Merge,
            &patch,
            &ctx(),
            false,
        ) {
            Err(crate::error::ApiError::Conflict { .. }) => continue,
            _ => return,
        }
    }
}

fn strip_owner(sim: &Sim, dependent: &ObjectRef, owner_uid: &str) {
    let Some(rt) = type_of(sim, &dependent.0) else {
        return;
    };
    for _ in 0..8 {
        let Some(current) = sim.store.get(&dependent.0, &dependent.1, &dependent.2) else {
            return;
        };
        let refs: Vec<Value> = current["metadata"]["ownerReferences"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter(|o| o["uid"].as_str() != Some(owner_uid))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let patch = json!({"metadata": {"ownerReferences": if refs.is_empty() { Value::Null } else { Value::Array(refs) }, "resourceVersion": current["metadata"]["resourceVersion"]}});
        match sim.patch(
            &rt,
            &dependent.1,
            &dependent.2,
            "",
            crate::patch::PatchType::Merge,
            &patch,
            &ctx(),
            false,
        ) {
            Err(crate::error::ApiError::Conflict { .. }) => continue,
            _ => return,
        }
    }
}

fn has_finalizer(object: &Value, finalizer: &str) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|v| v.as_str() == Some(finalizer)))
}

/// Handles one owner being deleted: orphaning, foreground or background cascade.
fn process_owner(sim: &Sim, graph: &Graph, storage: &StorageKey, object: &Value, removed: bool) {
    let Some(owner_uid) = uid(object) else { return };
    let dependents: Vec<ObjectRef> = graph
        .dependents
        .get(&owner_uid)
        .map(|d| d.iter().cloned().collect())
        .unwrap_or_default();
    let owner = reference(storage, object);
    if removed {
        for dependent in &dependents {
            // Only dependents whose every owner is gone are deleted; others lose the reference.
            let still_owned = sim
                .store
                .get(&dependent.0, &dependent.1, &dependent.2)
                .map(|d| {
                    owner_uids(&d)
                        .iter()
                        .any(|u| u != &owner_uid && graph.objects.contains_key(u))
                })
                .unwrap_or(false);
            if still_owned {
                strip_owner(sim, dependent, &owner_uid);
            } else {
                delete_ref(sim, dependent, "Background");
            }
        }
        return;
    }
    if object["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    if has_finalizer(object, ORPHAN) {
        for dependent in &dependents {
            strip_owner(sim, dependent, &owner_uid);
        }
        remove_finalizer(sim, &owner, ORPHAN);
    } else if has_finalizer(object, FOREGROUND) {
        let mut blocking = 0;
        for dependent in &dependents {
            if let Some(d) = sim.store.get(&dependent.0, &dependent.1, &dependent.2) {
                blocking += 1;
                if d["metadata"]["deletionTimestamp"].is_null() {
                    delete_ref(sim, dependent, "Foreground");
                }
            }
        }
        if blocking == 0 {
            remove_finalizer(sim, &owner, FOREGROUND);
        }
    }
}

/// A namespace being deleted: delete its contents, then let it go.
fn process_namespace(sim: &Sim, namespace: &Value) {
    if namespace["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let name = namespace["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut remaining = 0;
    let types: Vec<Arc<ResourceType>> = sim
        .registry()
        .all()
        .filter(|t| {
            t.namespaced
                && t.view != crate::resources::View::EventsV1
                && t.behaviour == crate::resources::Behaviour::Stored
        })
        .cloned()
        .collect();
    let mut seen_storage = HashSet::new();
    for rt in types {
        if !seen_storage.insert(rt.storage.clone()) {
            continue;
        }
        let (objects, _) = sim.store.list(&rt.storage, Some(&name));
        for object in objects {
            remaining += 1;
            if object["metadata"]["deletionTimestamp"].is_null() {
                let object_name = object["metadata"]["name"].as_str().unwrap_or_default();
                let _ = sim.delete(&rt, &name, object_name, &DeleteOptions::default(), &ctx());
            }
        }
    }
    if remaining == 0 {
        let _ = sim.store.remove(
            &"/namespaces".into(),
            "",
            &name,
            resource_version(namespace).unwrap_or_default(),
        );
    }
}

/// Sets the CRD's `Terminating` condition (kept in place when its status does not change).
fn set_terminating(sim: &Sim, crd: &Value, status: &str, reason: &str, message: &str) {
    let Some(rt) = type_of(sim, crate::crd::CRD_STORAGE) else {
        return;
    };
    let mut conditions: Vec<Value> = crd["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let since = conditions
        .iter()
        .find(|c| c["type"] == "Terminating" && c["status"] == status)
        .map(|c| c["lastTransitionTime"].clone())
        .unwrap_or_else(|| json!(now));
    conditions.retain(|c| c["type"] != "Terminating");
    conditions.push(json!({"type": "Terminating", "status": status, "reason": reason, "message": message, "lastTransitionTime": since}));
    if crd["status"]["conditions"].as_array() == Some(&conditions) {
        return;
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let _ = sim.patch(
        &rt,
        "",
        name,
        "status",
        crate::patch::PatchType::Merge,
        &json!({"status": {"conditions": conditions}}),
        &ctx(),
        false,
    );
}

/// The apiextensions finalizer controller: a deleted CRD's instances are deleted as any client
/// would delete them (their own finalizers are honoured, so they may take a while), the
/// `Terminating` condition says so, and once none is left the finalizer goes, and with it the
/// definition. Returns whether it is done.
fn process_definition(sim: &Sim, crd: &Value) -> bool {
    if crd["metadata"]["deletionTimestamp"].is_null()
        || !has_finalizer(crd, crate::crd::CRD_CLEANUP_FINALIZER)
    {
        return true;
    }
    let name = crd["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    set_terminating(
        sim,
        crd,
        "True",
        "InstanceDeletionInProgress",
        "CustomResource deletion is in progress",
    );
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    let storage: StorageKey = format!("{group}/{plural}").into();
    let (instances, _) = sim.store.list(&storage, None);
    if let Some(rt) = type_of(sim, &storage) {
        for instance in instances
            .iter()
            .filter(|i| i["metadata"]["deletionTimestamp"].is_null())
        {
            let _ = sim.delete(
                &rt,
                instance["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default(),
                instance["metadata"]["name"].as_str().unwrap_or_default(),
                &DeleteOptions::default(),
                &ctx(),
            );
        }
    }
    if !instances.is_empty() {
        return false;
    }
    if let Some(current) = sim.store.get(crate::crd::CRD_STORAGE, "", &name) {
        set_terminating(
            sim,
            &current,
            "False",
            "InstanceDeletionCompleted",
            "removed all instances",
        );
    }
    remove_finalizer(
        sim,
        &(crate::crd::CRD_STORAGE.into(), String::new(), name),
        crate::crd::CRD_CLEANUP_FINALIZER,
    );
    true
}

/// Tracks the objects a tick works on: namespaces and CRDs being deleted.
fn track(pending: &mut HashSet<String>, change: &Change) {
    let name = change.object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if change.object["metadata"]["deletionTimestamp"].is_string()
        && change.kind != ChangeKind::Deleted
    {
        pending.insert(name);
    } else {
        pending.remove(&name);
    }
}

fn handle(
    sim: &Sim,
    graph: &mut Graph,
    change: &Change,
    pending: &mut HashSet<String>,
    definitions: &mut HashSet<String>,
) {
    match change.kind {
        ChangeKind::Added => {
            graph.add(&change.storage, &change.object);
            let owners = owner_uids(&change.object);
            if !owners.is_empty() && owners.iter().all(|u| !graph.objects.contains_key(u)) {
                delete_ref(
                    sim,
                    &reference(&change.storage, &change.object),
                    "Background",
                );
            }
        }
        ChangeKind::Modified => {
            if let Some(previous) = &change.previous {
                graph.remove(&change.storage, previous);
            }
            graph.add(&change.storage, &change.object);
            process_owner(sim, graph, &change.storage, &change.object, false);
        }
        ChangeKind::Deleted => {
            graph.remove(&change.storage, &change.object);
            process_owner(sim, graph, &change.storage, &change.object, true);
            // An owner in foreground deletion may now be free to go.
            for owner in owner_uids(&change.object) {
                if let Some(r) = graph.objects.get(&owner).cloned()
                    && let Some(o) = sim.store.get(&r.0, &r.1, &r.2)
                {
                    process_owner(sim, graph, &r.0, &o, false);
                }
            }
        }
    }
    match &*change.storage {
        "/namespaces" => track(pending, change),
        crate::crd::CRD_STORAGE => track(definitions, change),
        _ => {}
    }
}

/// Runs the controllers until the task is aborted.
pub async fn run(
    sim: Arc<Sim>,
    mut terminations: tokio::sync::mpsc::UnboundedReceiver<(String, String, String, Duration)>,
) {
    // A follower, not a broadcast receiver: one that lags must rebuild the graph from every
    // object, which in a burst took long enough to lag again (half the sim's CPU during
    // 3 000 starts); handling one change is a few map updates, so a burst waits in the queue.
    let mut receiver = sim.store.follow();
    let mut graph = Graph::rebuild(&sim);
    let mut terminating_namespaces: HashSet<String> = HashSet::new();
    let mut terminating_definitions: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            received = receiver.recv() => match received {
                Some(change) => handle(&sim, &mut graph, &change, &mut terminating_namespaces, &mut terminating_definitions),
                None => return,
            },
            Some((namespace, name, pod_uid, wait)) = terminations.recv() => {
                let sim = sim.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    sim.finish_pod_termination(&namespace, &name, &pod_uid);
                });
            }
            _ = tick.tick(), if !terminating_namespaces.is_empty() || !terminating_definitions.is_empty() => {
                for name in terminating_namespaces.clone() {
                    match sim.store.get("/namespaces", "", &name) {
                        Some(ns) => process_namespace(&sim, &ns),
                        None => { terminating_namespaces.remove(&name); }
                    }
                }
                for name in terminating_definitions.clone() {
                    let done = sim
                        .store
                        .get(crate::crd::CRD_STORAGE, "", &name)
                        .is_none_or(|crd| process_definition(&sim, &crd));
                    if done {
                        terminating_definitions.remove(&name);
                    }
                }
            }
        }
    }
}
