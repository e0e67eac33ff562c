//! One signal for "every cache has its first list", safe for any number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` keeps a single waker: when several tasks wait on
//! the same store, only the last one to poll is woken, and the others wait forever. A
//! restarted operator has up to `concurrency` reconciles waiting at once, so some workspaces
//! were never reconciled again. Here a single task waits on each store, then opens a
//! `watch` channel that wakes every waiter.

use std::{collections::HashMap, future::Future, sync::Mutex};

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

/// The resourceVersions this operator's own status writes replaced, per object, until the
/// cache shows another: a cache that still shows one of them is older than our last write, and
/// no decision is taken on it. resourceVersions are only compared for equality, never ordered
/// (the API server keeps them opaque); a cache moves only forward, so any other version
/// includes our write.
pub struct OwnWrites<K: kube::Resource>(Mutex<HashMap<ObjectRef<K>, Vec<String>>>);

impl<K: kube::Resource> Default for OwnWrites<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K> OwnWrites<K>
where
    K: kube::Resource<DynamicType = ()>,
{
    /// Remembers a write that found `before` and left `after`. A write that changed nothing
    /// (the API server kept `before`) replaced nothing: the cache showing `before` is current,
    /// and waiting for it to move would wait forever.
    pub fn wrote(&self, object: ObjectRef<K>, before: Option<String>, after: Option<&str>) {
        let Some(before) = before.filter(|b| Some(b.as_str()) != after) else {
            return;
        };
        let mut replaced = self.0.lock().unwrap_or_else(|p| p.into_inner());
        replaced.entry(object).or_default().push(before);
    }

    /// Whether the cache, showing `cached` of `object`, is older than our last write to it.
    pub fn behind(&self, object: &ObjectRef<K>, cached: Option<&str>) -> bool {
        let mut replaced = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let behind = replaced
            .get(object)
            .is_some_and(|versions| versions.iter().any(|v| Some(v.as_str()) == cached));
        if !behind {
            replaced.remove(object);
        }
        behind
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

    /// A cache showing a version our write replaced is behind until it shows another; a write
    /// the API server took without a change (same resourceVersion) never holds the object
    /// back (it did: the workspace was then never decided on again).
    #[test]
    fn only_a_version_a_write_replaced_is_behind() {
        let writes = OwnWrites::<Pod>::default();
        let pod = ObjectRef::new("p").within("ns");
        writes.wrote(pod.clone(), Some("5".into()), Some("6"));
        assert!(writes.unseen(&pod));
        assert!(writes.behind(&pod, Some("5")));
        assert!(!writes.behind(&pod, Some("6")));
        assert!(
            !writes.behind(&pod, Some("5")),
            "forgotten once the cache moved on"
        );
        assert!(!writes.unseen(&pod));
        writes.wrote(pod.clone(), Some("6".into()), Some("6"));
        assert!(
            !writes.behind(&pod, Some("6")),
            "a write that changed nothing"
        );
        writes.wrote(pod.clone(), Some("7".into()), Some("8"));
        writes.forget(&pod);
        assert!(!writes.behind(&pod, Some("7")));
    }
}
