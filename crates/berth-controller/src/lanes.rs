//! The agent check's own lane beside the controller's queue (rule C14 at scale).
//!
//! Under a burst the controller's queue holds thousands of workspaces, each with status
//! writes to make; a workspace whose pod just turned ready waited behind all of them twice:
//! once to start its agent check, once more to write Running when the check ended (p99 50 to
//! 80 s at 10 000). So the check starts from the pod watch the moment the cache shows the
//! pod ready, in a [`FifoPool`] (first come first served, so in the order pods turned ready,
//! and a bounded number in flight, so 10 000 ready pods never mean 10 000 connections at
//! once); and when it ends, the workspace is reconciled in a second small pool of its own
//! ([`WaitThenRun`]: it first waits for the cache to show the operator's last write, holding
//! no slot), not behind the controller's queue. [`KeyedLocks`] keeps that reconcile and the
//! controller's from running for one workspace at the same time.

use std::{
    collections::HashMap,
    future::Future,
    hash::Hash,
    pin::Pin,
    sync::{Arc, Mutex},
};

use futures::{StreamExt, channel::mpsc};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, Semaphore, oneshot};

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs jobs in the order they were handed in, at most `limit` at once.
#[derive(Clone)]
pub struct FifoPool {
    jobs: mpsc::UnboundedSender<Job>,
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

impl FifoPool {
    /// The pool, and its dispatcher task (which ends when every handle is dropped).
    pub fn new(limit: usize) -> Self {
        let (jobs, mut queue) = mpsc::unbounded::<Job>();
        let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slots = Arc::new(Semaphore::new(limit.max(1)));
        let counted = waiting.clone();
        tokio::spawn(async move {
            // One dispatcher takes the jobs in order and starts each once a slot is free: the
            // order they start in is the order they came in.
            while let Some(job) = queue.next().await {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                counted.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(async move {
                    job.await;
                    drop(slot);
                });
            }
        });
        FifoPool { jobs, waiting }
    }

    /// Queues `job` behind those handed in before it.
    pub fn run(&self, job: impl Future<Output = ()> + Send + 'static) {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.jobs.unbounded_send(Box::pin(job)).is_err() {
            self.waiting
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// How many jobs wait for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A [`FifoPool`] whose jobs first wait for something that needs no slot (the cache to show
/// a write): the waits run side by side, and each job joins the pool's queue when its wait
/// ends with a value, so a slow wait never keeps a ready job out of a slot. Dropping it stops
/// the waits.
pub struct WaitThenRun {
    pool: FifoPool,
    waits: tokio::task::JoinSet<()>,
}

impl WaitThenRun {
    /// A lane whose pool runs `limit` jobs at once.
    pub fn new(limit: usize) -> Self {
        WaitThenRun {
            pool: FifoPool::new(limit),
            waits: tokio::task::JoinSet::new(),
        }
    }

    /// Waits for `wait`, then queues `job` with its value (nothing when it ends with none).
    pub fn run_after<T, W, J, F>(&mut self, wait: W, job: J)
    where
        T: Send + 'static,
        W: Future<Output = Option<T>> + Send + 'static,
        J: FnOnce(T) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        // The waits that ended are forgotten here, so they never pile up.
        while self.waits.try_join_next().is_some() {}
        let pool = self.pool.clone();
        self.waits.spawn(async move {
            if let Some(value) = wait.await {
                pool.run(job(value));
            }
        });
    }
}

/// One lock per key, held by whoever works on that key; a key nobody holds or waits for takes
/// no memory.
pub struct KeyedLocks<K>(Mutex<HashMap<K, Arc<AsyncMutex<()>>>>);

impl<K> Default for KeyedLocks<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

/// Holds a key's lock until dropped.
pub struct KeyGuard<'a, K: Hash + Eq + Clone> {
    locks: &'a KeyedLocks<K>,
    key: K,
    guard: Option<OwnedMutexGuard<()>>,
}

impl<K: Hash + Eq + Clone> KeyedLocks<K> {
    /// Waits until nobody else holds `key`, then holds it.
    pub async fn lock(&self, key: K) -> KeyGuard<'_, K> {
        let lock = self.map().entry(key.clone()).or_default().clone();
        let guard = lock.lock_owned().await;
        KeyGuard {
            locks: self,
            key,
            guard: Some(guard),
        }
    }

    /// How many keys are held or waited for.
    pub fn held(&self) -> usize {
        self.map().len()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, Arc<AsyncMutex<()>>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<K: Hash + Eq + Clone> Drop for KeyGuard<'_, K> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map();
        // Only the map holds it: nobody holds or waits for the key any more.
        if map
            .get(&self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            map.remove(&self.key);
        }
    }
}

/// Who waits for the cache to show a newer copy of an object: the agent lane, whose workspace
/// was just written by the controller (the watch brings the write within moments).
pub struct Arrivals<K>(Mutex<HashMap<K, Vec<oneshot::Sender<()>>>>);

impl<K> Default for Arrivals<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K: Hash + Eq> Arrivals<K> {
    /// Resolves when [`Arrivals::arrived`] is next called for `key`.
    pub fn next(&self, key: K) -> oneshot::Receiver<()> {
        let (tell, told) = oneshot::channel();
        self.map().entry(key).or_default().push(tell);
        told
    }

    /// The cache shows a new copy of `key`: everyone waiting for one goes on.
    pub fn arrived(&self, key: &K) {
        let waiting = self.map().remove(key);
        for tell in waiting.into_iter().flatten() {
            let _ = tell.send(());
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, Vec<oneshot::Sender<()>>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::atomic::AtomicUsize, time::Duration};

    use super::*;

    /// Jobs start in the order they came in, never more than the limit at once, and the next
    /// starts as soon as one ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn jobs_start_in_order_and_no_more_than_the_limit_run() {
        let pool = FifoPool::new(3);
        let started = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut ends = Vec::new();
        for i in 0..20i32 {
            let (end, ended) = oneshot::channel::<()>();
            ends.push(end);
            let (started, running, most) = (started.clone(), running.clone(), most.clone());
            pool.run(async move {
                started.lock().unwrap().push(i);
                let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                let _ = ended.await;
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        let count = |n: usize| {
            let started = started.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    while started.lock().unwrap().len() < n {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .expect("jobs start");
            }
        };
        count(3).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut first: Vec<i32> = started.lock().unwrap().clone();
        first.sort();
        assert_eq!(first, [0, 1, 2], "three at once, the first three");
        assert_eq!(pool.waiting(), 17);
        // Each job that ends lets the next one in, in the order they came in.
        for (ended, end) in ends.into_iter().enumerate() {
            let _ = end.send(());
            let next = ended + 3;
            if next < 20 {
                count(next + 1).await;
                assert_eq!(started.lock().unwrap()[next], next as i32);
            }
        }
        assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= 3);
        assert_eq!(pool.waiting(), 0);
    }

    /// One slot, and a first job whose wait does not end: the second job, whose wait ends at
    /// once, runs anyway (a wait inside the job would hold the only slot); a wait that ends
    /// after the lane is dropped runs nothing.
    #[tokio::test]
    async fn a_wait_holds_no_slot_and_ends_with_its_lane() {
        let mut lane = WaitThenRun::new(1);
        let (_never, never) = oneshot::channel::<()>();
        let (first_ran, mut first) = oneshot::channel::<()>();
        lane.run_after(async move { never.await.ok() }, move |()| async move {
            let _ = first_ran.send(());
        });
        let (second_ran, second) = oneshot::channel::<i32>();
        lane.run_after(async { Some(2) }, move |value: i32| async move {
            let _ = second_ran.send(value);
        });
        let value = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the second job runs while the first one's wait goes on")
            .unwrap();
        assert_eq!(value, 2, "the job gets what its wait ended with");
        assert!(first.try_recv().is_err(), "the first job waits still");

        let (go, gate) = oneshot::channel::<()>();
        let (late_ran, late) = oneshot::channel::<()>();
        lane.run_after(async move { gate.await.ok() }, move |()| async move {
            let _ = late_ran.send(());
        });
        drop(lane);
        let _ = go.send(());
        assert!(
            late.await.is_err(),
            "the wait ended with its lane, so its job never ran"
        );
    }

    /// One key is held by one holder at a time, other keys go on meanwhile, and a key nobody
    /// holds is forgotten.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_is_held_by_one_at_a_time() {
        let locks = Arc::new(KeyedLocks::<&'static str>::default());
        let first = locks.lock("a").await;
        let waiting = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _second = locks.lock("a").await;
            }
        });
        let other = tokio::time::timeout(Duration::from_secs(5), locks.lock("b"))
            .await
            .expect("another key is not held up");
        drop(other);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the same key waits");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the key is free once dropped")
            .unwrap();
        assert_eq!(locks.held(), 0, "nothing kept for keys nobody holds");
    }

    /// Whoever waits for a key goes on when it arrives, not when another does; nothing is
    /// kept once it arrived.
    #[tokio::test]
    async fn a_waiter_goes_on_when_its_key_arrives() {
        let arrivals = Arrivals::<&'static str>::default();
        let mut a = arrivals.next("a");
        let b = arrivals.next("b");
        arrivals.arrived(&"b");
        assert!(a.try_recv().is_err(), "a did not arrive");
        b.await.expect("b arrived");
        arrivals.arrived(&"a");
        a.await.expect("a arrived");
        assert!(arrivals.map().is_empty());
    }
}
