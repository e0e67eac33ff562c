//! Watch streams: initial state or resumption from a revision, live changes filtered by
//! namespace and selectors (an object leaving a selector is a DELETED, entering it an ADDED),
//! bookmarks, timeouts, and `410 Gone` for revisions older than the history.

use std::{borrow::Cow, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{
    error::ApiError,
    resources::ResourceType,
    selector::{FieldSelector, LabelSelector},
    sim::Sim,
    store::{Change, ChangeKind},
    table::{self, IncludeObject},
};

/// How objects in events are rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Render {
    Object,
    Table(IncludeObject),
    Metadata,
}

/// A parsed watch request.
#[derive(Clone, Debug)]
pub struct WatchRequest {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub resource_version: Option<String>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
    pub render: Render,
}

/// An object as the client asked to see it: whole, as metadata, or as a one-row Table.
pub fn render(rt: &ResourceType, object: &Value, how: Render) -> Value {
    match how {
        Render::Object => object.clone(),
        Render::Metadata => {
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
        }
        Render::Table(include) => table::table(
            rt,
            std::slice::from_ref(object),
            json!({"resourceVersion": object["metadata"]["resourceVersion"]}),
            include,
        ),
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = crate::json::watch_event(kind, object);
    text.push('\n');
    Bytes::from(text)
}

fn bookmark(rt: &ResourceType, revision: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}),
    )
}

/// The event line of `change`'s object as stored, from its text encoded once for all watches.
fn shared_line(kind: &str, change: &Change) -> Bytes {
    let object = change.object_text();
    let mut text = String::with_capacity(object.len() + 32);
    text.push_str("{\"type\":\"");
    text.push_str(kind);
    text.push_str("\",\"object\":");
    text.push_str(object);
    text.push_str("}\n");
    Bytes::from(text)
}

/// Turns one stored change into the event this watch sends, if any. Every watch of every
/// resource sees every change: the object is neither copied to be matched against this
/// watch's selectors nor encoded again when another watch already did.
fn event_for(
    sim: &Sim,
    rt: &ResourceType,
    request: &WatchRequest,
    change: &Change,
) -> Option<Bytes> {
    if change.storage != rt.storage {
        return None;
    }
    let matches = |view: &Value| {
        Sim::matches(
            rt,
            view,
            request.namespace.as_deref(),
            &request.labels,
            &request.fields,
        )
    };
    let now = sim.view_of(rt, &change.object);
    let before = || {
        change
            .previous
            .as_deref()
            .is_some_and(|p| matches(&sim.view_of(rt, p)))
    };
    let kind = match change.kind {
        ChangeKind::Added => matches(&now).then_some("ADDED")?,
        ChangeKind::Modified => match (before(), matches(&now)) {
            (true, true) => "MODIFIED",
            (false, true) => "ADDED",
            (true, false) => "DELETED",
            (false, false) => return None,
        },
        ChangeKind::Deleted => before().then_some("DELETED")?,
    };
    Some(match (request.render, &now) {
        (Render::Object, Cow::Borrowed(_)) => shared_line(kind, change),
        (Render::Object, Cow::Owned(view)) => line(kind, view),
        (how, view) => line(kind, &render(rt, view, how)),
    })
}

/// Starts a watch; the stream ends on timeout, when the sim closes watches, or when the
/// client fell too far behind (it then resumes from its last revision, like with a real
/// server).
pub fn watch(
    sim: Arc<Sim>,
    rt: Arc<ResourceType>,
    request: WatchRequest,
) -> Result<impl Stream<Item = Result<Bytes, std::convert::Infallible>>, ApiError> {
    Sim::check_fields(&rt, &request.fields)?;
    let revision: Option<u64> = match request.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
        ),
    };
    let mut initial: Vec<Bytes> = vec![];
    // A resumed watch's changes from the history, parsed one by one as the stream sends them.
    let mut backlog: Vec<crate::store::Kept> = vec![];
    let mut gone: Option<Bytes> = None;
    let (mut receiver, start) = match revision.filter(|_| !request.send_initial_events) {
        Some(rv) => {
            let forced = sim
                .expire_next_watch
                .swap(false, std::sync::atomic::Ordering::SeqCst);
            match sim
                .store
                .subscribe_from(&rt.storage, request.namespace.as_deref(), rv)
            {
                Ok(subscription) if !forced => {
                    backlog = subscription.backlog;
                    (subscription.receiver, subscription.revision)
                }
                result => {
                    let oldest = match result {
                        Err(compacted) => compacted.oldest_available,
                        Ok(_) => sim.store.revision(),
                    };
                    let status = ApiError::Gone {
                        message: format!("too old resource version: {rv} ({oldest})"),
                    }
                    .status();
                    gone = Some(line("ERROR", &status));
                    (sim.store.subscribe_to(&rt.storage), sim.store.revision())
                }
            }
        }
        None => {
            let snapshot = sim
                .store
                .snapshot(&rt.storage, request.namespace.as_deref());
            let mut objects: Vec<Value> = snapshot
                .objects
                .iter()
                .map(|o| sim.to_view(&rt, o))
                .filter(|o| {
                    Sim::matches(
                        &rt,
                        o,
                        request.namespace.as_deref(),
                        &request.labels,
                        &request.fields,
                    )
                })
                .collect();
            objects.sort_by(|a, b| {
                a["metadata"]["name"]
                    .as_str()
                    .cmp(&b["metadata"]["name"].as_str())
            });
            for object in objects {
                initial.push(line("ADDED", &render(&rt, &object, request.render)));
            }
            if request.send_initial_events && request.bookmarks {
                initial.push(bookmark(&rt, snapshot.revision, true));
            }
            (snapshot.receiver, snapshot.revision)
        }
    };
    let mut closer = sim.watch_closer.subscribe();
    let stream = async_stream_lines(move |tx| async move {
        if let Some(error) = gone {
            let _ = tx.send(error).await;
            return;
        }
        for item in initial {
            if tx.send(item).await.is_err() {
                return;
            }
        }
        for kept in backlog {
            if let Some(event) = event_for(&sim, &rt, &request, &kept.change())
                && tx.send(event).await.is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::sleep(request.timeout);
        tokio::pin!(deadline);
        let mut bookmarks = tokio::time::interval_at(
            tokio::time::Instant::now() + sim.config.bookmark_interval,
            sim.config.bookmark_interval,
        );
        // The revision this watch has passed on: every change up to it was sent (or is not
        // for this watch). A bookmark names it, never the store's newest revision: a client
        // that resumes from a bookmark must not skip the changes still queued for it.
        let mut delivered = start;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                // The sim closes every watch (a fault), or is shutting down.
                _ = closer.changed() => return,
                _ = bookmarks.tick(), if request.bookmarks => {
                    if tx.send(bookmark(&rt, delivered, false)).await.is_err() { return; }
                }
                received = receiver.recv() => match received {
                    Ok(change) => {
                        if change.revision <= start { continue; }
                        tokio::select! {
                            () = sim.faults.watch_released(&rt.resource) => {}
                            _ = tx.closed() => return,
                        }
                        if let Some(event) = event_for(&sim, &rt, &request, &change)
                            && tx.send(event).await.is_err() { return; }
                        delivered = change.revision;
                    }
                    // As kube-apiserver's "Forcing watcher close due to unresponsiveness".
                    Err(RecvError::Lagged(missed)) => {
                        tracing::info!(resource = %rt.resource, missed, "closing a watch that fell behind; its client resumes from its last revision");
                        return;
                    }
                    Err(RecvError::Closed) => return,
                },
            }
        }
    });
    Ok(stream)
}

/// A stream fed by a task through a bounded channel; the task stops when the client goes.
fn async_stream_lines<F, Fut>(
    producer: F,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(producer(tx));
    futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change's event is the same bytes whether encoded for this watch or taken from the
    /// text another watch encoded, and that text is made once.
    #[test]
    fn a_shared_event_line_is_the_one_a_watch_would_encode() {
        let object = json!({"metadata": {"name": "p", "labels": {"a": "b"}}, "apiVersion": "v1", "kind": "Pod", "status": {"phase": "Running"}});
        let change = Change {
            revision: 7,
            storage: "pods".into(),
            kind: ChangeKind::Modified,
            object: Arc::new(object.clone()),
            previous: None,
            text: Default::default(),
        };
        assert_eq!(shared_line("MODIFIED", &change), line("MODIFIED", &object));
        assert!(Arc::ptr_eq(change.object_text(), change.object_text()));
        let event: Value = serde_json::from_slice(&shared_line("DELETED", &change)).unwrap();
        assert_eq!(event, json!({"type": "DELETED", "object": object}));
    }
}
