//! The sim's storage: one global, monotonically increasing revision (like etcd's), objects
//! by bucket and key, a bounded history of changes for watch resumption and consistent
//! paginated lists (kept as JSON text: the last five minutes, as etcd between compactions),
//! and broadcasts of the changes of each storage (or set of storages).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use crate::resources::StorageKey;

/// Namespace ("" for cluster-scoped) and name.
pub type ObjectKey = (String, String);

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One write, as watchers see it.
#[derive(Debug)]
pub struct Change {
    pub revision: u64,
    pub storage: StorageKey,
    pub kind: ChangeKind,
    /// The object after the change (for a deletion: as it was, with the deletion's revision).
    pub object: Arc<Value>,
    /// The object before the change, for Modified and Deleted.
    pub previous: Option<Arc<Value>>,
    /// `object` as JSON text, made by the first watch that sends it as stored and shared by
    /// every other (a pod's change goes to every kubelet's watch, the scheduler's, the
    /// operator's...).
    pub text: std::sync::OnceLock<Arc<str>>,
}

impl Change {
    /// `object` as JSON text (kind and apiVersion first), encoded once for all watches.
    pub fn object_text(&self) -> &Arc<str> {
        self.text
            .get_or_init(|| crate::json::to_string(&self.object).into())
    }
}

/// A change as the history keeps it: its objects as JSON text, which takes a tenth of the
/// memory of a `Value` (a small map costs a 600-byte B-tree node). Rebuilt into a [`Change`]
/// only when a watch resumes from the history or a list asks for an old revision, and then
/// outside the store's lock (the text is shared, so a copy of a `Kept` is cheap): parsing a
/// resuming watch's backlog of thousands of pods takes seconds, during which no write could
/// otherwise take the lock, and every watch fell behind in turn.
#[derive(Clone)]
pub struct Kept {
    revision: u64,
    storage: StorageKey,
    kind: ChangeKind,
    key: ObjectKey,
    object: Arc<[u8]>,
    previous: Option<Arc<[u8]>>,
    /// When it was made: the history keeps a window of time, as etcd keeps the revisions
    /// since its last compaction.
    at: std::time::Instant,
}

fn text(object: &Value) -> Arc<[u8]> {
    serde_json::to_vec(object)
        .expect("a Value always serializes")
        .into()
}

fn parsed(text: &[u8]) -> Arc<Value> {
    Arc::new(serde_json::from_slice(text).expect("the history holds JSON it wrote"))
}

impl Kept {
    fn new(change: &Change) -> Self {
        Kept {
            revision: change.revision,
            storage: change.storage.clone(),
            kind: change.kind,
            key: key_of(&change.object),
            object: text(&change.object),
            previous: change.previous.as_deref().map(text),
            at: std::time::Instant::now(),
        }
    }

    /// The change with its objects parsed (the costly part: not under the store's lock).
    pub fn change(&self) -> Arc<Change> {
        Arc::new(Change {
            revision: self.revision,
            storage: self.storage.clone(),
            kind: self.kind,
            object: parsed(&self.object),
            previous: self.previous.as_deref().map(parsed),
            text: Default::default(),
        })
    }
}

/// Why a conditional write failed.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The object exists already (create).
    Exists,
    /// The object does not exist (replace, remove).
    Missing,
    /// The object's resourceVersion is not the expected one.
    Stale,
}

/// How long the history keeps a change: kube-apiserver compacts etcd every five minutes
/// (`--etcd-compaction-interval`), and a watch from before that gets 410 Gone.
pub const HISTORY_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// A revision older than the retained history was asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Compacted {
    pub oldest_available: u64,
}

struct Inner {
    revision: u64,
    buckets: HashMap<StorageKey, BTreeMap<ObjectKey, Arc<Value>>>,
    history: VecDeque<Kept>,
    history_limit: usize,
    /// Changes older than this leave the history (kube-apiserver compacts etcd every 5 min).
    history_window: std::time::Duration,
    /// Revisions at or below this are no longer in the history.
    compacted: u64,
    /// The pods bound to each node (`spec.nodeName`), as kube-apiserver's watch cache indexes
    /// them for the kubelets: a kubelet admitting a pod sums its node's pods, not every pod
    /// of the cluster (at 10 000 pods that scan was a sixth of the sim's CPU).
    bound: HashMap<String, BTreeSet<ObjectKey>>,
    /// Receivers of every change that never lag ([`Store::follow`]).
    followers: Vec<mpsc::UnboundedSender<Arc<Change>>>,
    /// The changes of some storages only (one: a watch's resource), for
    /// [`Store::subscribe_to_any`]; made when the first receiver subscribes, dropped at a
    /// change once none is left.
    by_storage: HashMap<Box<[StorageKey]>, broadcast::Sender<Arc<Change>>>,
}

/// Where pods are kept.
const PODS: &str = "/pods";

fn node_of(pod: &Value) -> Option<&str> {
    pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())
}

/// The store. Every write takes the lock, gets the next revision, records the change and
/// broadcasts it before releasing, so watchers see changes in revision order.
pub struct Store {
    inner: Mutex<Inner>,
    /// How many changes a receiver may fall behind before it lags.
    capacity: usize,
}

/// A watch's starting point: the changes after the requested revision that are already in the
/// history (unparsed: [`Kept::change`] parses one), and a receiver for everything after them.
pub struct Subscription {
    pub backlog: Vec<Kept>,
    pub receiver: broadcast::Receiver<Arc<Change>>,
    /// The revision the backlog ends at; live changes at or below it are duplicates.
    pub revision: u64,
}

/// The current objects of a bucket with a receiver for what follows.
pub struct Snapshot {
    pub objects: Vec<Arc<Value>>,
    pub receiver: broadcast::Receiver<Arc<Change>>,
    pub revision: u64,
}

fn key_of(object: &Value) -> ObjectKey {
    let meta = &object["metadata"];
    (
        meta["namespace"].as_str().unwrap_or_default().to_owned(),
        meta["name"].as_str().unwrap_or_default().to_owned(),
    )
}

pub fn resource_version(object: &Value) -> Option<u64> {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
}

impl Store {
    /// A store whose history keeps at most `history_limit` changes of the last `window`.
    pub fn new(
        history_limit: usize,
        window: std::time::Duration,
        broadcast_capacity: usize,
    ) -> Self {
        let capacity = broadcast_capacity.max(16);
        Store {
            inner: Mutex::new(Inner {
                revision: 1,
                buckets: HashMap::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                history_window: window,
                compacted: 1,
                bound: HashMap::new(),
                followers: Vec::new(),
                by_storage: HashMap::new(),
            }),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    pub fn get(&self, storage: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let inner = self.lock();
        inner
            .buckets
            .get(storage)?
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The current objects of a bucket (one namespace, or all) and the revision they are at.
    pub fn list(&self, storage: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        (Self::collect(&inner, storage, namespace), inner.revision)
    }

    fn collect(inner: &Inner, storage: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let Some(bucket) = inner.buckets.get(storage) else {
            return vec![];
        };
        match namespace {
            Some(ns) => bucket
                .range((ns.to_owned(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => bucket.values().cloned().collect(),
        }
    }

    /// The objects of a bucket as they were at `revision`, rebuilt from the history.
    pub fn list_at(
        &self,
        storage: &str,
        namespace: Option<&str>,
        revision: u64,
    ) -> Result<Vec<Arc<Value>>, Compacted> {
        let (current, undone) = {
            let inner = self.lock();
            if revision < inner.compacted {
                return Err(Compacted {
                    oldest_available: inner.compacted,
                });
            }
            let undone: Vec<Kept> = inner
                .history
                .iter()
                .rev()
                .take_while(|change| change.revision > revision)
                .filter(|change| &*change.storage == storage)
                .filter(|change| namespace.is_none_or(|ns| ns == change.key.0))
                .cloned()
                .collect();
            (Self::collect(&inner, storage, namespace), undone)
        };
        // Parsed without the lock, as a resuming watch's backlog is.
        let mut objects: BTreeMap<ObjectKey, Arc<Value>> =
            current.into_iter().map(|o| (key_of(&o), o)).collect();
        for change in undone {
            match (&change.kind, &change.previous) {
                (ChangeKind::Added, _) => {
                    objects.remove(&change.key);
                }
                (_, Some(previous)) => {
                    objects.insert(change.key.clone(), parsed(previous));
                }
                (_, None) => {}
            }
        }
        Ok(objects.into_values().collect())
    }

    /// Current objects plus a receiver, atomically.
    pub fn snapshot(&self, storage: &str, namespace: Option<&str>) -> Snapshot {
        let mut inner = self.lock();
        Snapshot {
            objects: Self::collect(&inner, storage, namespace),
            receiver: self.storage_receiver(&mut inner, storage),
            revision: inner.revision,
        }
    }

    /// Changes after `revision` (of one namespace, or all) plus a receiver, atomically;
    /// `Compacted` if that revision is older than the retained history.
    pub fn subscribe_from(
        &self,
        storage: &str,
        namespace: Option<&str>,
        revision: u64,
    ) -> Result<Subscription, Compacted> {
        let mut inner = self.lock();
        if revision < inner.compacted {
            return Err(Compacted {
                oldest_available: inner.compacted,
            });
        }
        let start = inner.history.partition_point(|c| c.revision <= revision);
        let backlog = inner
            .history
            .range(start..)
            .filter(|c| &*c.storage == storage)
            .filter(|c| namespace.is_none_or(|ns| ns == c.key.0))
            .cloned()
            .collect();
        Ok(Subscription {
            backlog,
            receiver: self.storage_receiver(&mut inner, storage),
            revision: inner.revision,
        })
    }

    /// A receiver for every future change of `storage` only: a watch, or a controller inside
    /// the sim that follows one storage, is not woken for every other change (in a sharded
    /// start, a few dozen watches each woken for every change of every resource ran seconds
    /// behind).
    pub fn subscribe_to(&self, storage: &str) -> broadcast::Receiver<Arc<Change>> {
        self.subscribe_to_any(&[storage])
    }

    /// A receiver for every future change of any of `storages`, in revision order (a
    /// controller inside the sim that follows a few).
    pub fn subscribe_to_any(&self, storages: &[&str]) -> broadcast::Receiver<Arc<Change>> {
        let mut inner = self.lock();
        self.receiver_of(&mut inner, storages)
    }

    fn storage_receiver(
        &self,
        inner: &mut Inner,
        storage: &str,
    ) -> broadcast::Receiver<Arc<Change>> {
        self.receiver_of(inner, &[storage])
    }

    fn receiver_of(
        &self,
        inner: &mut Inner,
        storages: &[&str],
    ) -> broadcast::Receiver<Arc<Change>> {
        let mut set: Vec<StorageKey> = storages.iter().map(|s| StorageKey::from(*s)).collect();
        set.sort();
        set.dedup();
        let set = set.into_boxed_slice();
        if let Some(sender) = inner.by_storage.get(&set) {
            return sender.subscribe();
        }
        let (sender, receiver) = broadcast::channel(self.capacity);
        inner.by_storage.insert(set, sender);
        receiver
    }

    /// A receiver for every future change that never lags, for a controller whose handling
    /// of a change is cheap but whose recovery from a lag is not (the garbage collector
    /// rebuilds its graph from every object): a burst waits in its queue instead.
    pub fn follow(&self) -> mpsc::UnboundedReceiver<Arc<Change>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.lock().followers.push(sender);
        receiver
    }

    /// Forgets the history up to the current revision, so any watch from an older revision
    /// gets `410 Gone`.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.revision;
    }

    fn record(
        &self,
        inner: &mut Inner,
        storage: &StorageKey,
        kind: ChangeKind,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) {
        if &**storage == PODS {
            let was = previous.as_deref().and_then(node_of);
            let is = (kind != ChangeKind::Deleted)
                .then(|| node_of(&object))
                .flatten();
            if was != is {
                let key = key_of(&object);
                if let Some(node) = was
                    && let Some(pods) = inner.bound.get_mut(node)
                {
                    pods.remove(&key);
                    if pods.is_empty() {
                        inner.bound.remove(node);
                    }
                }
                if let Some(node) = is {
                    inner.bound.entry(node.to_owned()).or_default().insert(key);
                }
            }
        }
        let change = Arc::new(Change {
            revision: inner.revision,
            storage: storage.clone(),
            kind,
            object,
            previous,
            text: Default::default(),
        });
        let kept = Kept::new(&change);
        let now = kept.at;
        inner.history.push_back(kept);
        let window = inner.history_window;
        while inner.history.len() > inner.history_limit
            || inner
                .history
                .front()
                .is_some_and(|oldest| now.duration_since(oldest.at) > window)
        {
            if let Some(dropped) = inner.history.pop_front() {
                inner.compacted = dropped.revision;
            }
        }
        inner
            .followers
            .retain(|follower| follower.send(change.clone()).is_ok());
        // A channel nobody follows any more is dropped.
        inner.by_storage.retain(|storages, sender| {
            !storages.contains(&change.storage) || sender.send(change.clone()).is_ok()
        });
    }

    fn stamp(inner: &mut Inner, object: &mut Value) {
        inner.revision += 1;
        object["metadata"]["resourceVersion"] = Value::String(inner.revision.to_string());
    }

    /// Stores a new object; fails if the key is taken.
    pub fn create(
        &self,
        storage: &StorageKey,
        mut object: Value,
    ) -> Result<Arc<Value>, WriteError> {
        let mut inner = self.lock();
        let key = key_of(&object);
        if inner
            .buckets
            .get(storage)
            .is_some_and(|b| b.contains_key(&key))
        {
            return Err(WriteError::Exists);
        }
        Self::stamp(&mut inner, &mut object);
        let object = Arc::new(object);
        inner
            .buckets
            .entry(storage.clone())
            .or_default()
            .insert(key, object.clone());
        self.record(&mut inner, storage, ChangeKind::Added, object.clone(), None);
        Ok(object)
    }

    /// Replaces an object's state through `change` (which says whether it changed anything),
    /// retrying on concurrent writes; the object as stored after, None if it is gone.
    pub fn modify(
        &self,
        storage: &str,
        namespace: &str,
        name: &str,
        change: impl Fn(&mut Value) -> bool,
    ) -> Option<Arc<Value>> {
        let storage: StorageKey = storage.into();
        for _ in 0..16 {
            let current = self.get(&storage, namespace, name)?;
            let mut next = (*current).clone();
            if !change(&mut next) {
                return Some(current);
            }
            match self.replace(
                &storage,
                next,
                resource_version(&current).unwrap_or_default(),
            ) {
                Ok(stored) => return Some(stored),
                Err(WriteError::Stale) => continue,
                Err(_) => return None,
            }
        }
        None
    }

    /// Replaces an object if its stored resourceVersion is `expected`.
    pub fn replace(
        &self,
        storage: &StorageKey,
        mut object: Value,
        expected: u64,
    ) -> Result<Arc<Value>, WriteError> {
        let mut inner = self.lock();
        let key = key_of(&object);
        let previous = inner
            .buckets
            .get(storage)
            .and_then(|b| b.get(&key))
            .cloned()
            .ok_or(WriteError::Missing)?;
        if resource_version(&previous) != Some(expected) {
            return Err(WriteError::Stale);
        }
        Self::stamp(&mut inner, &mut object);
        let object = Arc::new(object);
        inner
            .buckets
            .entry(storage.clone())
            .or_default()
            .insert(key, object.clone());
        self.record(
            &mut inner,
            storage,
            ChangeKind::Modified,
            object.clone(),
            Some(previous),
        );
        Ok(object)
    }

    /// Removes an object if its stored resourceVersion is `expected`.
    pub fn remove(
        &self,
        storage: &StorageKey,
        namespace: &str,
        name: &str,
        expected: u64,
    ) -> Result<Arc<Value>, WriteError> {
        let mut inner = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let previous = inner
            .buckets
            .get(storage)
            .and_then(|b| b.get(&key))
            .cloned()
            .ok_or(WriteError::Missing)?;
        if resource_version(&previous) != Some(expected) {
            return Err(WriteError::Stale);
        }
        if let Some(bucket) = inner.buckets.get_mut(storage) {
            bucket.remove(&key);
        }
        let mut gone = (*previous).clone();
        Self::stamp(&mut inner, &mut gone);
        let gone = Arc::new(gone);
        self.record(
            &mut inner,
            storage,
            ChangeKind::Deleted,
            gone.clone(),
            Some(previous),
        );
        Ok(gone)
    }

    /// The pods bound to `node`, by namespace and name.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Value>> {
        let inner = self.lock();
        let (Some(keys), Some(pods)) = (inner.bound.get(node), inner.buckets.get(PODS)) else {
            return vec![];
        };
        keys.iter().filter_map(|k| pods.get(k).cloned()).collect()
    }

    /// Every bucket's name, for the garbage collector.
    pub fn buckets(&self) -> Vec<StorageKey> {
        self.lock().buckets.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str) -> Value {
        json!({"metadata": {"namespace": "default", "name": name}})
    }

    #[test]
    fn revisions_grow_across_buckets_and_history_rebuilds_old_lists() {
        let store = Store::new(100, HISTORY_WINDOW, 16);
        let pods: StorageKey = "/pods".into();
        let cms: StorageKey = "/configmaps".into();
        let a = store.create(&pods, pod("a")).unwrap();
        let at_a = resource_version(&a).unwrap();
        store.create(&cms, pod("c")).unwrap();
        let mut changed = (*a).clone();
        changed["spec"] = json!({"x": 1});
        let a2 = store.replace(&pods, changed, at_a).unwrap();
        assert!(resource_version(&a2).unwrap() > at_a + 1);
        store.create(&pods, pod("b")).unwrap();

        let then = store.list_at("/pods", None, at_a).unwrap();
        assert_eq!(then.len(), 1);
        assert_eq!(then[0]["spec"], Value::Null);
        let (now, _) = store.list("/pods", Some("default"));
        assert_eq!(now.len(), 2);
    }

    /// A burst larger than the broadcast's capacity: a broadcast receiver that did not keep
    /// up hears it lagged; a follower hears every change, in revision order; a follower
    /// dropped is forgotten at the next change.
    #[test]
    fn a_follower_hears_every_change_of_a_burst_a_broadcast_drops() {
        let store = Store::new(1000, HISTORY_WINDOW, 16);
        let pods: StorageKey = "/pods".into();
        let mut broadcast = store.subscribe_to("/pods");
        let mut follower = store.follow();
        let gone = store.follow();
        drop(gone);
        for i in 0..100 {
            store.create(&pods, pod(&format!("p{i}"))).unwrap();
        }
        assert!(matches!(
            broadcast.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(84))
        ));
        let mut heard = vec![];
        while let Ok(change) = follower.try_recv() {
            heard.push(
                change.object["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        let written: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
        assert_eq!(heard, written);
        assert_eq!(store.lock().followers.len(), 1);
    }

    /// A storage's receiver (a watch's) hears that storage's changes only, in revision order,
    /// so a burst of another resource neither wakes nor lags it; a storage nobody follows any
    /// more keeps no channel after its next change.
    #[test]
    fn a_storage_receiver_hears_only_its_storage() {
        let store = Store::new(1000, HISTORY_WINDOW, 16);
        let (pods, cms): (StorageKey, StorageKey) = ("/pods".into(), "/configmaps".into());
        let mut of_pods = store.subscribe_to("/pods");
        let of_maps = store.snapshot("/configmaps", None).receiver;
        store.create(&pods, pod("a")).unwrap();
        for i in 0..100 {
            store.create(&cms, pod(&format!("c{i}"))).unwrap();
        }
        store.create(&pods, pod("b")).unwrap();
        let mut heard = vec![];
        while let Ok(change) = of_pods.try_recv() {
            assert_eq!(&*change.storage, "/pods");
            heard.push(
                change.object["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        assert_eq!(
            heard,
            ["a", "b"],
            "nothing lagged, nothing of another storage"
        );
        drop(of_maps);
        store.create(&cms, pod("last")).unwrap();
        let kept: Vec<Vec<String>> = (store.lock().by_storage.keys())
            .map(|k| k.iter().map(|s| s.to_string()).collect())
            .collect();
        assert_eq!(kept, [["/pods"]]);
    }

    /// The pods of a node are the ones bound to it now: binding adds, deletion removes, a
    /// pod of another bucket with a node name is no pod.
    #[test]
    fn the_pods_of_a_node_follow_binding_and_deletion() {
        let store = Store::new(100, HISTORY_WINDOW, 16);
        let pods: StorageKey = "/pods".into();
        let names = |node: &str| -> Vec<String> {
            store
                .pods_on(node)
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let a = store.create(&pods, pod("a")).unwrap();
        let mut bound = pod("b");
        bound["spec"] = json!({"nodeName": "n1"});
        store.create(&pods, bound).unwrap();
        let mut other = pod("x");
        other["spec"] = json!({"nodeName": "n1"});
        store.create(&"/replicasets".into(), other).unwrap();
        assert_eq!(names("n1"), ["b"]);
        let mut a_bound = (*a).clone();
        a_bound["spec"] = json!({"nodeName": "n1"});
        let a = store
            .replace(&pods, a_bound, resource_version(&a).unwrap())
            .unwrap();
        assert_eq!(names("n1"), ["a", "b"]);
        let mut a_moved = (*a).clone();
        a_moved["spec"] = json!({"nodeName": "n2"});
        let a = store
            .replace(&pods, a_moved, resource_version(&a).unwrap())
            .unwrap();
        assert_eq!(names("n1"), ["b"]);
        assert_eq!(names("n2"), ["a"]);
        store
            .remove(&pods, "default", "a", resource_version(&a).unwrap())
            .unwrap();
        assert!(names("n2").is_empty());
        assert!(names("n3").is_empty());
    }

    #[test]
    fn stale_writes_are_refused() {
        let store = Store::new(100, HISTORY_WINDOW, 16);
        let pods: StorageKey = "/pods".into();
        let a = store.create(&pods, pod("a")).unwrap();
        assert_eq!(
            store.create(&pods, pod("a")).unwrap_err(),
            WriteError::Exists
        );
        let rv = resource_version(&a).unwrap();
        store.replace(&pods, pod("a"), rv).unwrap();
        assert_eq!(
            store.replace(&pods, pod("a"), rv).unwrap_err(),
            WriteError::Stale
        );
        assert_eq!(
            store.remove(&pods, "default", "a", rv).unwrap_err(),
            WriteError::Stale
        );
    }

    #[test]
    fn history_is_bounded_and_old_revisions_are_compacted() {
        let store = Store::new(3, HISTORY_WINDOW, 16);
        let pods: StorageKey = "/pods".into();
        let first = store.create(&pods, pod("p0")).unwrap();
        for i in 1..10 {
            store.create(&pods, pod(&format!("p{i}"))).unwrap();
        }
        assert!(
            store
                .subscribe_from("/pods", None, resource_version(&first).unwrap())
                .is_err()
        );
        let recent = store.revision() - 2;
        let sub = store.subscribe_from("/pods", None, recent).unwrap();
        assert_eq!(sub.backlog.len(), 2);
        // Of one namespace: only its changes (all of them are in "default").
        let here = store
            .subscribe_from("/pods", Some("default"), recent)
            .unwrap();
        assert_eq!(here.backlog.len(), 2);
        let elsewhere = store
            .subscribe_from("/pods", Some("other"), recent)
            .unwrap();
        assert_eq!(elsewhere.backlog.len(), 0);
    }

    #[test]
    fn the_history_keeps_a_window_of_time() {
        let window = std::time::Duration::from_millis(200);
        let store = Store::new(1000, window, 16);
        let pods: StorageKey = "/pods".into();
        let old = store.create(&pods, pod("old")).unwrap();
        std::thread::sleep(window + std::time::Duration::from_millis(50));
        let recent = store.create(&pods, pod("recent")).unwrap();
        assert_eq!(
            store
                .subscribe_from("/pods", None, resource_version(&old).unwrap() - 1)
                .err(),
            Some(Compacted {
                oldest_available: resource_version(&old).unwrap()
            }),
            "a change older than the window is compacted, though far below the count"
        );
        let sub = store
            .subscribe_from("/pods", None, resource_version(&old).unwrap())
            .unwrap();
        assert_eq!(sub.backlog.len(), 1);
        assert_eq!(sub.backlog[0].change().object, recent);
    }
}
