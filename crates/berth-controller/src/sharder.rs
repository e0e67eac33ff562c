//! The sharder: writes each workspace's namespace bucket (`berth_core::shard`) as its
//! `berth.dev/shard` label, so the shard that owns it is shown it by the API server's selector.
//! The first shard's operator labels the workspaces no shard selects yet (one no operator has
//! reconciled gets Berth's finalizer in the same write, which its shard would otherwise make
//! on its own); any shard relabels one whose label is not its namespace's bucket (set by hand)
//! and drops it from its cache.

use std::{collections::HashSet, sync::Arc, time::Duration};

use berth_api::{Workspace, condition::event_reasons, labels};
use berth_core::shard;
use futures::{StreamExt, channel::mpsc};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod, Service};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tracing::{debug, warn};

use crate::recorder::{EventType, Recorder, Report};

/// A workspace to label.
#[derive(Clone, Debug)]
struct Unlabelled {
    namespace: String,
    name: String,
    uid: Option<String>,
    /// An operator has reconciled it (it has Berth's finalizer): it may have a pod, claim and
    /// service made before it had the label, which must carry it first.
    touched: bool,
    /// What it was queued with, when no operator has reconciled it and it is not being
    /// deleted: the label goes on with Berth's finalizer, which its shard would otherwise add
    /// in a write of its own.
    untouched: Option<Untouched>,
}

/// The version, labels and finalizers of a workspace no operator has reconciled.
#[derive(Clone, Debug)]
struct Untouched {
    version: String,
    labels: std::collections::BTreeMap<String, String>,
    finalizers: Vec<String>,
}

impl Unlabelled {
    fn of(meta: &kube::api::ObjectMeta) -> Option<Self> {
        let touched = meta
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == labels::FINALIZER);
        let untouched = meta
            .resource_version
            .clone()
            .filter(|_| !touched && meta.deletion_timestamp.is_none())
            .map(|version| Untouched {
                version,
                labels: meta.labels.clone().unwrap_or_default(),
                finalizers: meta.finalizers.clone().unwrap_or_default(),
            });
        Some(Unlabelled {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            uid: meta.uid.clone(),
            touched,
            untouched,
        })
    }
}

/// How many workspaces are labelled at once.
const AT_ONCE: usize = 16;
/// The wait before a failed labelling is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// The labelling queue of one shard's controller; its tasks end when it is dropped.
pub struct Sharder {
    queue: Queue,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Workspaces to label, each queued once until it is labelled (a workspace changes many
/// times while its label is on its way; a patch per change would be a flood of writes).
#[derive(Clone)]
struct Queue {
    sender: mpsc::UnboundedSender<Unlabelled>,
    queued: Arc<std::sync::Mutex<HashSet<(String, String)>>>,
}

impl Queue {
    fn push(&self, item: Unlabelled) {
        let key = (item.namespace.clone(), item.name.clone());
        if self
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key)
        {
            let _ = self.sender.unbounded_send(item);
        }
    }

    fn done(&self, item: &Unlabelled) {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(item.namespace.clone(), item.name.clone()));
    }
}

impl Drop for Sharder {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Sharder {
    /// Starts labelling what is queued; with `watch_unlabelled`, every workspace no shard
    /// selects (without the label, or with a value that is no bucket; in `namespace`, or all)
    /// is queued as the API server shows it.
    pub fn spawn(
        client: Client,
        namespace: Option<&str>,
        watch_unlabelled: bool,
        recorder: Arc<Recorder>,
    ) -> Sharder {
        let (sender, queued) = mpsc::unbounded();
        let queue = Queue {
            sender,
            queued: Arc::default(),
        };
        let mut tasks = vec![tokio::spawn(label_queued(
            client.clone(),
            queued,
            queue.clone(),
            recorder,
        ))];
        if watch_unlabelled {
            let api: Api<PartialObjectMeta<Workspace>> = match namespace {
                Some(ns) => Api::namespaced(client, ns),
                None => Api::all(client),
            };
            let config = watcher::Config::default().labels(&shard::unlabelled_selector());
            let queue = queue.clone();
            tasks.push(tokio::spawn(async move {
                let mut unlabelled =
                    std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
                while let Some(next) = unlabelled.next().await {
                    match next {
                        Ok(workspace) => {
                            if let Some(item) = Unlabelled::of(&workspace.metadata) {
                                queue.push(item);
                            }
                        }
                        Err(error) => debug!(%error, "watching unlabelled workspaces"),
                    }
                }
            }));
        }
        Sharder { queue, tasks }
    }

    /// Queues a workspace whose label is not its namespace's bucket.
    pub fn relabel(&self, workspace: &Workspace) {
        if let Some(item) = Unlabelled::of(&workspace.metadata) {
            self.queue.push(item);
        }
    }
}

async fn label_queued(
    client: Client,
    queued: mpsc::UnboundedReceiver<Unlabelled>,
    again: Queue,
    recorder: Arc<Recorder>,
) {
    queued
        .for_each_concurrent(AT_ONCE, |item| {
            let (client, again, recorder) = (client.clone(), again.clone(), recorder.clone());
            async move {
                let labelled = label(&client, &item).await;
                again.done(&item);
                match labelled {
                    Ok(()) => {}
                    // Gone meanwhile: nothing to label.
                    Err(kube::Error::Api(answer)) if answer.code == 404 => {}
                    Err(error) => {
                        warn!(namespace = %item.namespace, workspace = %item.name, %error, "cannot label the workspace with its shard; retrying");
                        let note = format!(
                            "cannot label the workspace with its shard ({}={}), so no operator shard reconciles it yet; retrying in {}s: {error}",
                            labels::SHARD,
                            shard::label_value(&item.namespace),
                            RETRY.as_secs()
                        );
                        let report = Report {
                            type_: EventType::Warning,
                            reason: event_reasons::SHARD_LABEL_FAILED,
                            action: "Label",
                            note: &note,
                        };
                        if let Err(error) = recorder.publish(&report, &regarding(&item)).await {
                            warn!(%error, "cannot publish the event");
                        }
                        tokio::spawn(async move {
                            tokio::time::sleep(RETRY).await;
                            again.push(item);
                        });
                    }
                }
            }
        })
        .await;
}

fn regarding(item: &Unlabelled) -> ObjectReference {
    ObjectReference {
        api_version: Some(Workspace::api_version(&()).into_owned()),
        kind: Some(Workspace::kind(&()).into_owned()),
        namespace: Some(item.namespace.clone()),
        name: Some(item.name.clone()),
        uid: item.uid.clone(),
        ..Default::default()
    }
}

/// Labels the workspace's pod, claim and service (when it was reconciled before), then the
/// workspace: its shard sees its objects no later than the workspace itself.
async fn label(client: &Client, item: &Unlabelled) -> Result<(), kube::Error> {
    let patch = Patch::Merge(json!({
        "metadata": {"labels": {labels::SHARD: shard::label_value(&item.namespace)}}
    }));
    if item.touched {
        let selector = format!(
            "{}={},{}={}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE,
            labels::WORKSPACE,
            labels::workspace_label_value(&item.name)
        );
        label_each::<Pod>(client, item, &selector, &patch).await?;
        label_each::<PersistentVolumeClaim>(client, item, &selector, &patch).await?;
        label_each::<Service>(client, item, &selector, &patch).await?;
    }
    let with_the_finalizer = match &item.untouched {
        Some(seen) => with_finalizer(client, item, seen).await?,
        None => false,
    };
    if !with_the_finalizer {
        crate::written::patch::<Workspace, _>(
            client,
            &item.namespace,
            &item.name,
            None,
            &PatchParams::default(),
            &patch,
        )
        .await?;
    }
    debug!(namespace = %item.namespace, workspace = %item.name, with_the_finalizer, "labelled with its shard");
    Ok(())
}

/// Labels a workspace no operator has reconciled yet and adds Berth's finalizer in the same
/// write, on the metadata it was queued with (a JSON patch whose `test` of the
/// resourceVersion makes it that or nothing). Returns false when the workspace changed
/// meanwhile (the caller labels it alone; its shard adds the finalizer).
async fn with_finalizer(
    client: &Client,
    item: &Unlabelled,
    seen: &Untouched,
) -> Result<bool, kube::Error> {
    let mut labelled = seen.labels.clone();
    labelled.insert(
        labels::SHARD.to_owned(),
        shard::label_value(&item.namespace),
    );
    let mut finalizers = seen.finalizers.clone();
    finalizers.push(labels::FINALIZER.to_owned());
    let operations: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": seen.version},
        {"op": "add", "path": "/metadata/labels", "value": labelled},
        {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
    ]))
    .map_err(kube::Error::SerdeError)?;
    let written = crate::written::patch::<Workspace, ()>(
        client,
        &item.namespace,
        &item.name,
        None,
        &PatchParams::default(),
        &Patch::Json(operations),
    )
    .await;
    match written {
        Ok(_) => Ok(true),
        // The test failed (changed since it was queued), or a conflict.
        Err(kube::Error::Api(answer)) if answer.code == 422 || answer.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

async fn label_each<K>(
    client: &Client,
    item: &Unlabelled,
    selector: &str,
    patch: &Patch<serde_json::Value>,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), &item.namespace);
    let found = api
        .list_metadata(&ListParams::default().labels(selector))
        .await?;
    for object in found {
        if !shard::labelled(&item.namespace, object.labels()) {
            api.patch(&object.name_any(), &PatchParams::default(), patch)
                .await?;
        }
    }
    Ok(())
}
