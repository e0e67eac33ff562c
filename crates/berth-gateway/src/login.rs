//! What browser sessions need of the API server: the signing key, kept in a Secret that every
//! replica reads (the first to start creates it), and the record of each used ticket, an
//! object per ticket whose creation fails for the second use on any replica.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Secret,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};

use crate::session::{Claims, Key};

/// The Secret that holds the key, in the gateway's namespace.
pub const KEY_SECRET: &str = "berth-gateway";
/// Its entry.
pub const KEY_ENTRY: &str = "session-key";
/// The label of used tickets' records (Leases in the gateway's namespace).
pub const USED_TICKET_LABEL: &str = "berth.dev/used-ticket";

/// The key in `namespace`'s Secret, made (random) when there is none. Two replicas starting
/// at once both end up with the one that was created first.
pub async fn load_key(client: &Client, namespace: &str) -> Result<Key, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let read = |secret: Secret| -> Result<Key, String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KEY_ENTRY))
            .map(|b| b.0.clone())
            .unwrap_or_default();
        Key::new(&bytes).map_err(|e| {
            format!("Secret {namespace}/{KEY_SECRET}, entry {KEY_ENTRY}: {e}; delete the Secret and the gateway makes a new one")
        })
    };
    let cannot = |e: kube::Error| {
        format!(
            "cannot read Secret {namespace}/{KEY_SECRET} (the key that signs browser sessions): {}",
            crate::api_words(&e)
        )
    };
    if let Some(secret) = secrets.get_opt(KEY_SECRET).await.map_err(cannot)? {
        return read(secret);
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(KEY_SECRET.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_owned(),
                "berth".to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            KEY_ENTRY.to_owned(),
            ByteString(Key::generate()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => read(created),
        // Another replica made it first: use theirs.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            read(secrets.get(KEY_SECRET).await.map_err(cannot)?)
        }
        Err(e) => Err(format!(
            "cannot create Secret {namespace}/{KEY_SECRET} (the key that signs browser sessions): {}",
            crate::api_words(&e)
        )),
    }
}

/// Why a ticket cannot be used.
#[derive(Debug)]
pub enum Unused {
    /// It was used before (on this replica or another).
    AlreadyUsed,
    /// The API server could not record it: its words.
    Unavailable(String),
}

/// Records `ticket` as used: an object named after its nonce, which can be created once.
/// Records whose ticket has expired are removed on the way.
pub async fn use_ticket(client: &Client, namespace: &str, ticket: &Claims) -> Result<(), Unused> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let expires = jiff::Timestamp::from_second(ticket.expires).unwrap_or_default();
    let record = Lease {
        metadata: ObjectMeta {
            name: Some(format!("berth-ticket-{}", ticket.nonce)),
            labels: Some(BTreeMap::from([
                (USED_TICKET_LABEL.to_owned(), "true".to_owned()),
                ("app.kubernetes.io/part-of".to_owned(), "berth".to_owned()),
            ])),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(ticket.user.username.clone()),
            // Until when the ticket could have been used: after that the record says nothing.
            renew_time: Some(MicroTime(expires)),
            ..Default::default()
        }),
    };
    match leases.create(&PostParams::default(), &record).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => return Err(Unused::AlreadyUsed),
        Err(e) => {
            return Err(Unused::Unavailable(format!(
                "cannot record the login link as used: {}",
                crate::api_words(&e)
            )));
        }
    }
    let client = client.clone();
    let namespace = namespace.to_owned();
    tokio::spawn(async move { sweep(&client, &namespace).await });
    Ok(())
}

/// Deletes the records of tickets that have expired (best effort: the next use sweeps again).
async fn sweep(client: &Client, namespace: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Ok(list) = leases
        .list(&ListParams::default().labels(USED_TICKET_LABEL))
        .await
    else {
        return;
    };
    let now = jiff::Timestamp::now();
    for lease in list {
        let expired = lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .is_none_or(|t| t.0 < now);
        if let (true, Some(name)) = (expired, lease.metadata.name.as_deref()) {
            let _ = leases.delete(name, &DeleteParams::default()).await;
        }
    }
}
