//! Leader election on a `coordination.k8s.io/v1` Lease: which replica reconciles, a takeover
//! within about a second when the leader releases the Lease on shutdown, and the release itself.

use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{debug, info, warn};

use crate::{Error, Result, config::LeaderElection};

/// The Lease held in the background: `leading` says whether this replica holds it. Dropping
/// every receiver of `leading` releases the Lease (when held) and ends the task.
pub struct Held {
    pub leading: watch::Receiver<bool>,
    pub task: JoinHandle<()>,
}

async fn manager(
    client: &Client,
    election: &LeaderElection,
) -> Result<kube_lease_manager::LeaseManager> {
    kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &election.lease)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(election.duration_seconds)
        .with_grace(election.grace_seconds)
        .build()
        .await
        .map_err(|e| Error::LeaderElection(e.to_string()))
}

/// Whether a failed startup request is worth trying again: anything but an answer that says
/// the request itself cannot work (a missing permission, a bad request), which will not change
/// by waiting.
pub fn transient(error: &kube_lease_manager::LeaseManagerError) -> bool {
    use kube_lease_manager::LeaseManagerError as E;
    match error {
        E::KubeError(kube::Error::Api(answer)) => {
            !matches!(answer.code, 400 | 401 | 403 | 405 | 415 | 422)
        }
        _ => true,
    }
}

/// The wait before the `attempt`th retry of a startup request: 500 ms doubling to 30 s, each
/// with up to a quarter more at random (so replicas that failed together do not retry
/// together).
pub fn startup_backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(500)
        .saturating_mul(1 << attempt.min(6))
        .min(Duration::from_secs(30));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    base + base.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

/// The Lease manager, its first read of the Lease retried with backoff while it fails for a
/// reason that may pass (a 5xx, a 429, a connection refused); `waiting` is told why meanwhile.
/// A refusal that will not pass (a missing permission) ends it, in the API server's words.
async fn first_manager(
    client: &Client,
    election: &LeaderElection,
    waiting: &(dyn Fn(Option<String>) + Send + Sync),
) -> Result<kube_lease_manager::LeaseManager> {
    let mut attempt = 0;
    loop {
        let built = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &election.lease)
            .with_namespace(&election.namespace)
            .with_identity(&election.identity)
            .with_duration(election.duration_seconds)
            .with_grace(election.grace_seconds)
            .build()
            .await;
        match built {
            Ok(manager) => {
                waiting(None);
                return Ok(manager);
            }
            Err(error) if transient(&error) => {
                let wait = startup_backoff(attempt);
                attempt += 1;
                let why = format!(
                    "reading the Lease {}/{} failed ({error}); retrying in {}",
                    election.namespace,
                    election.lease,
                    crate::state::human(wait)
                );
                warn!(lease = %election.lease, %error, attempt, "cannot read the lease; retrying");
                waiting(Some(why));
                tokio::time::sleep(wait).await;
            }
            Err(error) => {
                return Err(Error::LeaderElection(format!(
                    "cannot read the Lease {}/{}: {error}",
                    election.namespace, election.lease
                )));
            }
        }
    }
}

/// Starts competing for the Lease; `waiting` is told why it is not competing yet.
pub async fn hold(
    client: Client,
    election: &LeaderElection,
    waiting: &(dyn Fn(Option<String>) + Send + Sync),
) -> Result<Held> {
    let mut manager = first_manager(&client, election, waiting).await?;
    // A standby would otherwise sleep until the Lease expires (the manager only reads it again
    // then); watching it lets a released Lease be taken at once.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &election.namespace);
    let selector = format!("metadata.name={}", election.lease);
    let mut changes = watcher(leases, watcher::Config::default().fields(&selector))
        .default_backoff()
        .touched_objects()
        .filter_map(|lease| async move { lease.ok() })
        .chain(stream::pending())
        .boxed();
    let (sender, leading) = watch::channel(false);
    let election = election.clone();
    let task = tokio::spawn(async move {
        let identity = election.identity.clone();
        let mut holder_seen: Option<String> = None;
        loop {
            // `changed()` is not safe to cancel: dropped between its renewal's patch and its
            // read of the Lease after it, it keeps the old expiry, and the next call renews at
            // once. Dropped by every watch event (its own renewal's among them), a holder
            // renewed about fifteen times in a row every 10 s. So one call runs to its end,
            // and is dropped only to take a released Lease with a fresh manager, or to stop.
            let mut released = false;
            {
                // Boxed so that it can be dropped (with any lock it holds on the manager's
                // state) before the release below.
                let mut changed = Box::pin(manager.changed());
                loop {
                    tokio::select! {
                        biased;
                        () = sender.closed() => {
                            drop(changed);
                            match manager.release().await {
                                Ok(()) => debug!(%identity, "released the lease"),
                                Err(error) => warn!(%identity, %error, "cannot release the lease; it expires by itself"),
                            }
                            return;
                        }
                        result = &mut changed => {
                            match result {
                                Ok(holding) => {
                                    let _ = sender.send(holding);
                                }
                                Err(error) => {
                                    warn!(%identity, %error, "leader election failed; retrying");
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                }
                            }
                            break;
                        }
                        Some(lease) = changes.next() => {
                            let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                            // A standby says that it stands by, and for whom, once per holder:
                            // its log is otherwise empty, and a person reading it would not know.
                            if let Some(holder) = holder.as_ref().filter(|h| **h != identity)
                                && holder_seen.as_ref() != Some(holder)
                            {
                                info!(%identity, %holder, lease = %election.lease, "standing by: {holder} holds the lease; this replica takes over when it is released or expires");
                                holder_seen = Some(holder.clone());
                            }
                            if holder.is_none() && !*sender.borrow() {
                                released = true;
                                break;
                            }
                        }
                    }
                }
            }
            if released {
                // Released: a fresh manager reads the Lease now and takes it.
                debug!(%identity, "the lease was released; trying to take it");
                match self::manager(&client, &election).await {
                    Ok(fresh) => manager = fresh,
                    Err(error) => warn!(%identity, %error, "leader election failed; retrying"),
                }
            }
        }
    });
    Ok(Held { leading, task })
}

/// Resolves once `leading` has the value `wanted` (or its sender is gone).
pub async fn until(leading: &mut watch::Receiver<bool>, wanted: bool) {
    let _ = leading.wait_for(|now| *now == wanted).await;
}
