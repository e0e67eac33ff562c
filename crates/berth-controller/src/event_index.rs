//! Warning events by the UID of the pod they are about, kept beside the event cache, so a
//! reconcile finds its pod's events without scanning every event in the cluster.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use k8s_openapi::api::core::v1::Event;
use kube::runtime::{reflector::ObjectRef, watcher};

type Refs = HashMap<String, HashSet<ObjectRef<Event>>>;

/// The index; fed the same watcher events as the event cache.
#[derive(Default)]
pub struct EventIndex {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_pod: Refs,
    /// A relist being received (`Init` .. `InitDone`), swapped in at its end.
    relist: Option<Refs>,
}

fn key(event: &Event) -> Option<(String, ObjectRef<Event>)> {
    let uid = event.involved_object.uid.clone()?;
    Some((uid, ObjectRef::from_obj(event)))
}

impl EventIndex {
    /// Applies one watcher event, as the reflector does to the cache.
    pub fn apply(&self, change: &watcher::Event<Event>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match change {
            watcher::Event::Init => inner.relist = Some(Refs::new()),
            watcher::Event::InitApply(event) => {
                if let (Some(relist), Some((uid, reference))) = (inner.relist.as_mut(), key(event))
                {
                    relist.entry(uid).or_default().insert(reference);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relist) = inner.relist.take() {
                    inner.by_pod = relist;
                }
            }
            watcher::Event::Apply(event) => {
                if let Some((uid, reference)) = key(event) {
                    inner.by_pod.entry(uid).or_default().insert(reference);
                }
            }
            watcher::Event::Delete(event) => {
                if let Some((uid, reference)) = key(event)
                    && let Some(refs) = inner.by_pod.get_mut(&uid)
                {
                    refs.remove(&reference);
                    if refs.is_empty() {
                        inner.by_pod.remove(&uid);
                    }
                }
            }
        }
    }

    /// The events about the pod with `uid`.
    pub fn about(&self, uid: &str) -> Vec<ObjectRef<Event>> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .by_pod
            .get(uid)
            .map(|refs| refs.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(name: &str, pod_uid: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "w-ws", "uid": pod_uid}
        }))
        .unwrap()
    }

    fn names(index: &EventIndex, uid: &str) -> Vec<String> {
        let mut names: Vec<String> = index.about(uid).into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn events_are_found_by_their_pods_uid_through_changes_and_relists() {
        let index = EventIndex::default();
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(event("a", "pod-1")));
        index.apply(&watcher::Event::InitApply(event("b", "pod-2")));
        assert!(
            index.about("pod-1").is_empty(),
            "nothing until the list is done"
        );
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(&index, "pod-1"), ["a"]);
        index.apply(&watcher::Event::Apply(event("c", "pod-1")));
        index.apply(&watcher::Event::Apply(event("c", "pod-1")));
        assert_eq!(names(&index, "pod-1"), ["a", "c"]);
        index.apply(&watcher::Event::Delete(event("a", "pod-1")));
        assert_eq!(names(&index, "pod-1"), ["c"]);
        assert_eq!(names(&index, "pod-2"), ["b"]);
        // A relist replaces everything: what it does not hold is gone.
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(event("d", "pod-3")));
        assert_eq!(
            names(&index, "pod-2"),
            ["b"],
            "the old view until the relist ends"
        );
        index.apply(&watcher::Event::InitDone);
        assert!(index.about("pod-1").is_empty() && index.about("pod-2").is_empty());
        assert_eq!(names(&index, "pod-3"), ["d"]);
        // An event without an involved UID is not indexed.
        let mut anonymous = event("e", "x");
        anonymous.involved_object.uid = None;
        index.apply(&watcher::Event::Apply(anonymous));
        assert!(index.about("x").is_empty());
    }
}
