//! One signal for "every cache has its first list", safe for any number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` keeps a single waker: when several tasks wait on
//! the same store, only the last one to poll is woken, and the others wait forever. A
//! restarted operator has up to `concurrency` reconciles waiting at once, so some workspaces
//! were never reconciled again. Here a single task waits on each store, then opens a
//! `watch` channel that wakes every waiter.

use std::future::Future;

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
}
