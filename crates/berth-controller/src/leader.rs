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
use tracing::{debug, warn};

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

/// Starts competing for the Lease.
pub async fn hold(client: Client, election: &LeaderElection) -> Result<Held> {
    let mut manager = manager(&client, election).await?;
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
        loop {
            tokio::select! {
                biased;
                () = sender.closed() => {
                    match manager.release().await {
                        Ok(()) => debug!(%identity, "released the lease"),
                        Err(error) => warn!(%identity, %error, "cannot release the lease; it expires by itself"),
                    }
                    return;
                }
                changed = manager.changed() => match changed {
                    Ok(holding) => {
                        let _ = sender.send(holding);
                    }
                    Err(error) => {
                        warn!(%identity, %error, "leader election failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
                Some(lease) = changes.next() => {
                    let free = lease.spec.as_ref().is_none_or(|s| s.holder_identity.is_none());
                    if free && !*sender.borrow() {
                        // Released: a fresh manager reads the Lease now and takes it.
                        debug!(%identity, "the lease was released; trying to take it");
                        match self::manager(&client, &election).await {
                            Ok(fresh) => manager = fresh,
                            Err(error) => warn!(%identity, %error, "leader election failed; retrying"),
                        }
                    }
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
