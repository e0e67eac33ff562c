//! One signal for "every cache has its first list", safe for any number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` keeps a single waker: when several tasks wait on
//! the same store, only the last one to poll is woken, and the others wait forever. A
//! restarted operator has up to `concurrency` reconciles waiting at once, so some workspaces
//! were never reconciled again. Here a single task waits on each store, then opens a
//! `watch` channel that wakes every waiter.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
};

use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;

/// Whether the caches are filled; cheap to clone, any number of tasks may wait on it.
#[derive(Clone, Debug)]
pub struct CachesReady(watch::Receiver<bool>);

impl CachesReady {
    /// Starts one task that runs `filled` (which awaits each store's readiness, one at a
    /// time: the only waiter on each), then signals all waiters.
    pub fn spawn(filled: impl Future<Output = ()> + Send + 'static) -> Self {
        let (ready, waiting) = watch::channel(false);
        tokio::spawn(async move {
            filled.await;
            let _ = ready.send(true);
        });
        Self(waiting)
    }

    /// Resolves once every cache has had its first list.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut waiting = self.0.clone();
        async move {
            let _ = waiting.wait_for(|ready| *ready).await;
        }
    }
}

/// This operator's own writes to each object that its cache may not show yet: the
/// resourceVersions they replaced, and the object as the last one left it. A cache that still
/// shows a replaced version is older than our last write; a decision on it could undo that
/// write (say, replace a rejected pod at once, uncounted), so it is taken on the object as
/// our write left it instead, or, when that is not known whole, not at all until the cache
/// moves. resourceVersions are only compared for equality, never ordered (the API server keeps
/// them opaque); a cache moves only forward, so any other version includes our writes.
pub struct OwnWrites<K: kube::Resource>(Mutex<HashMap<ObjectRef<K>, Writes<K>>>);

/// Our writes to one object the cache may not show yet.
struct Writes<K> {
    replaced: Vec<String>,
    /// The object as our last write left it, when that write said all of it; None after one
    /// that did not (its result is known only once the cache shows it).
    left: Option<Arc<K>>,
}

impl<K: kube::Resource> Default for OwnWrites<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K> OwnWrites<K>
where
    K: kube::Resource<DynamicType = ()>,
{
    /// Remembers a write that found `before` and left `after`, with the object as it left it
    /// (`left`: the object we wrote on with what we wrote; its resourceVersion is set to
    /// `after` here) when the write said all of it. Chained writes (each conditional on the
    /// version the one before left) are all ours, so the last one's object stands for them.
    /// A write that changed nothing (the API server kept `before`) replaced nothing: the
    /// cache showing `before` is current, and waiting for it to move would wait forever.
    pub fn wrote(
        &self,
        object: ObjectRef<K>,
        before: Option<String>,
        after: Option<&str>,
        left: Option<K>,
    ) {
        let Some(before) = before.filter(|b| Some(b.as_str()) != after) else {
            return;
        };
        let left = after.zip(left).map(|(after, mut left)| {
            left.meta_mut().resource_version = Some(after.to_owned());
            Arc::new(left)
        });
        let mut writes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = writes.entry(object).or_insert_with(|| Writes {
            replaced: vec![],
            left: None,
        });
        entry.replaced.push(before);
        entry.left = left;
    }

    /// What a decision on `object` rests on when the cache shows `cached`: the cached copy
    /// when it holds our last write; else the object as our last write left it; None when
    /// that is not known (wait for the cache).
    pub fn decide_on(&self, object: &ObjectRef<K>, cached: Arc<K>) -> Option<Arc<K>> {
        let mut writes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let version = cached.meta().resource_version.as_deref();
        match writes.get(object) {
            Some(w) if w.replaced.iter().any(|v| Some(v.as_str()) == version) => w.left.clone(),
            // The cache shows our last write (or a later one): nothing to remember.
            Some(_) => {
                writes.remove(object);
                Some(cached)
            }
            None => Some(cached),
        }
    }

    /// Whether a write of ours to `object` has not reached the cache yet (its watch event,
    /// which wakes the object's controller, is still to come).
    pub fn unseen(&self, object: &ObjectRef<K>) -> bool {
        (self.0.lock().unwrap_or_else(|p| p.into_inner())).contains_key(object)
    }

    /// Forgets the object (it is gone).
    pub fn forget(&self, object: &ObjectRef<K>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(object);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::{reflector::store::Writer, watcher::Event};

    use super::*;

    /// What a restarted operator does: sixteen reconciles wait for the caches at once. Every
    /// one of them must go on once the first list arrives (awaiting the store directly from
    /// each task leaves all but one of them waiting forever).
    #[tokio::test]
    async fn every_waiter_goes_on_once_the_first_list_arrives() {
        let mut writer: Writer<Pod> = Writer::default();
        let store = writer.as_reader();
        let ready = CachesReady::spawn(async move {
            let _ = store.wait_until_ready().await;
        });
        let waiters: Vec<_> = (0..16).map(|_| tokio::spawn(ready.wait())).collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "nobody goes on before the list"
        );
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("every waiter goes on")
                .unwrap();
        }
    }

    fn pod(version: &str, phase: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.resource_version = Some(version.into());
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        pod
    }

    fn phase(pod: &Pod) -> Option<&str> {
        pod.status.as_ref()?.phase.as_deref()
    }

    /// The version and the phase of what a decision rests on.
    fn seen(pod: &Pod) -> (Option<&str>, Option<&str>) {
        (pod.metadata.resource_version.as_deref(), phase(pod))
    }

    /// A cache showing a version our write replaced is behind until it shows another: the
    /// decision rests on the object as our last write left it (chained writes: the last
    /// one's), or waits when that is not known whole. A write the API server took without a
    /// change (same resourceVersion) never holds the object back (it did: the workspace was
    /// then never decided on again).
    #[test]
    fn a_cache_behind_our_own_write_is_decided_on_as_the_write_left_it() {
        let writes = OwnWrites::<Pod>::default();
        let at = ObjectRef::new("p").within("ns");
        let decide = |cached: Pod| writes.decide_on(&at, Arc::new(cached));

        writes.wrote(
            at.clone(),
            Some("5".into()),
            Some("6"),
            Some(pod("5", "Pending")),
        );
        assert!(writes.unseen(&at));
        let decided = decide(pod("5", "Unknown")).expect("known whole");
        assert_eq!(
            seen(&decided),
            (Some("6"), Some("Pending")),
            "the object as our write left it, at the version it left"
        );
        // A second write on what the first left.
        writes.wrote(
            at.clone(),
            Some("6".into()),
            Some("7"),
            Some(pod("6", "Running")),
        );
        for cached in ["5", "6"] {
            let decided = decide(pod(cached, "Unknown")).unwrap();
            assert_eq!(
                seen(&decided),
                (Some("7"), Some("Running")),
                "the cache at {cached} is behind both writes"
            );
        }
        let current = decide(pod("7", "Running")).unwrap();
        assert_eq!(current.metadata.resource_version.as_deref(), Some("7"));
        assert!(!writes.unseen(&at), "forgotten once the cache shows it");
        assert_eq!(
            decide(pod("6", "Unknown")).map(|p| phase(&p).map(str::to_owned)),
            Some(Some("Unknown".into())),
            "forgotten: nothing is laid over the cache any more"
        );

        writes.wrote(
            at.clone(),
            Some("8".into()),
            Some("8"),
            Some(pod("8", "Running")),
        );
        assert!(!writes.unseen(&at), "a write that changed nothing");

        // A write whose result is not known whole (no answer's version, or no object).
        writes.wrote(
            at.clone(),
            Some("8".into()),
            None,
            Some(pod("8", "Running")),
        );
        assert!(decide(pod("8", "Running")).is_none(), "wait for the cache");
        assert!(decide(pod("9", "Running")).is_some());
        writes.wrote(at.clone(), Some("9".into()), Some("10"), None);
        assert!(decide(pod("9", "Running")).is_none(), "wait for the cache");
        writes.forget(&at);
        assert!(decide(pod("9", "Running")).is_some());
    }
}
