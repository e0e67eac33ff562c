//! What the operator keeps of the objects it caches: only the fields its decisions read, so
//! the caches of 10 000 workspaces fit in a small operator. Pods and workspaces are trimmed
//! while they are decoded (what is dropped is skipped in the JSON, never built: a page of a
//! list, 500 objects when a restarted operator fills its caches, is never whole in memory);
//! the other kinds, few and small, are trimmed before their reflector stores them (a `modify`
//! after the reflector trims only what the controller is handed, not what the cache keeps).
//!
//! Kept, by kind:
//! - Workspace: everything but managedFields and kubectl's last-applied copy of the object
//!   ([`WorkspaceWire`], turned into a `Workspace` as it arrives); its kind record
//!   (`status.resolved`, about 1.4 KiB) is shared with the cached workspaces whose record is
//!   equal ([`Records`]), so 10 000 workspaces of a kind keep one copy of it, not 10 000.
//! - Pod: its own trimmed type (`cached_pod.rs`).
//! - Claim, Service, Event, admission policies, kinds: everything but managedFields (the
//!   service's spec is compared with the wanted one; the others are small).

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    sync::{Arc, Weak},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::{Resource, ResourceExt, runtime::watcher::Event};
use serde::{Deserialize, Deserializer};

use berth_api::{KindResolution, Workspace, WorkspaceSpec, WorkspaceStatus};

/// The annotation `kubectl apply` keeps a whole copy of the object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops managedFields, for the kinds whose other fields are read.
pub fn managed_fields<K: kube::Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
}

/// A Workspace as it is decoded from a watch or a list: without managedFields and kubectl's
/// last-applied copy, which are skipped in the JSON. [`workspaces`] turns a watch of these into
/// one of `Workspace`s.
#[derive(Clone, Debug, Deserialize)]
pub struct WorkspaceWire {
    #[serde(default, deserialize_with = "workspace_metadata")]
    metadata: ObjectMeta,
    spec: WorkspaceSpec,
    #[serde(default)]
    status: Option<WorkspaceStatus>,
}

impl From<WorkspaceWire> for Workspace {
    fn from(wire: WorkspaceWire) -> Self {
        Workspace {
            metadata: wire.metadata,
            spec: wire.spec,
            status: wire.status,
        }
    }
}

impl Resource for WorkspaceWire {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Workspace::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Workspace::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Workspace::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Workspace::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The kind records of the workspaces a watch decoded, by kind name, so that equal records
/// are one shared copy. Held weakly: a record no cached workspace holds any more is gone.
#[derive(Default)]
pub struct Records(HashMap<String, Vec<Weak<KindResolution>>>);

/// The distinct records of one kind that are shared; one beyond it (a kind with more options
/// in use at once, or many versions of it) is kept as decoded, unshared.
const RECORDS_PER_KIND: usize = 64;

impl Records {
    /// A watch event of decoded workspaces as one of `Workspace`s (each moved, not copied),
    /// with each kind record shared.
    pub fn workspaces(&mut self, event: Event<WorkspaceWire>) -> Event<Workspace> {
        let mut cached = |wire: WorkspaceWire| {
            let mut workspace = Workspace::from(wire);
            self.share(&mut workspace);
            workspace
        };
        match event {
            Event::Apply(w) => Event::Apply(cached(w)),
            Event::Delete(w) => Event::Delete(cached(w)),
            Event::InitApply(w) => Event::InitApply(cached(w)),
            Event::Init => Event::Init,
            Event::InitDone => Event::InitDone,
        }
    }

    /// Points `workspace`'s kind record at an equal one already shared, or shares it.
    fn share(&mut self, workspace: &mut Workspace) {
        let Some(record) = workspace
            .status
            .as_mut()
            .and_then(|status| status.resolved.as_mut())
        else {
            return;
        };
        let shared = match self.0.get_mut(&record.kind) {
            Some(shared) => shared,
            None => self.0.entry(record.kind.clone()).or_default(),
        };
        if let Some(same) = shared
            .iter()
            .filter_map(Weak::upgrade)
            .find(|same| **same == **record)
        {
            *record = same;
            return;
        }
        shared.retain(|r| r.strong_count() > 0);
        if shared.len() < RECORDS_PER_KIND {
            shared.push(Arc::downgrade(record));
        }
    }
}

fn workspace_metadata<'de, D: Deserializer<'de>>(from: D) -> Result<ObjectMeta, D::Error> {
    read_metadata(from, true, |key| key != LAST_APPLIED)
}

/// An object's metadata as a cache keeps it: never its managedFields; its labels when
/// `labels`; the annotations `annotation` keeps.
pub(crate) fn read_metadata<'de, D: Deserializer<'de>>(
    from: D,
    labels: bool,
    annotation: impl Fn(&str) -> bool,
) -> Result<ObjectMeta, D::Error> {
    let meta = Option::<Metadata>::deserialize(from)?.unwrap_or_default();
    let annotations = meta.annotations.map(|mut annotations| {
        annotations.retain(|key, _| annotation(key));
        annotations
    });
    Ok(ObjectMeta {
        name: meta.name,
        generate_name: meta.generate_name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        owner_references: meta.owner_references,
        finalizers: meta.finalizers,
        labels: meta.labels.filter(|_| labels),
        annotations: annotations.filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    })
}

/// The metadata a cache may keep: all of it but managedFields (and `selfLink`, which no API
/// server sends any more), which are skipped while decoding.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Metadata {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_cached_workspace_loses_managed_fields_and_the_last_applied_copy_only() {
        let json = json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "alice", "namespace": "team", "uid": "w1",
                "resourceVersion": "9", "generation": 2, "finalizers": ["berth.dev/cleanup"],
                "creationTimestamp": "2026-12-02T10:00:00Z",
                "labels": {"team": "a"},
                "annotations": {LAST_APPLIED: "{\"spec\":{}}", "team": "a"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:image": {}}}}]},
            "spec": {"image": "busybox"},
            "status": {"phase": "Running"}
        });
        let full: Workspace = serde_json::from_value(json.clone()).unwrap();
        let wire: WorkspaceWire = serde_json::from_value(json).unwrap();
        assert_eq!(wire.name_any(), "alice");
        let cached = Workspace::from(wire);
        assert_eq!(cached.metadata.managed_fields, None);
        assert_eq!(
            cached.annotations().keys().collect::<Vec<_>>(),
            ["team"],
            "only the last-applied copy goes"
        );
        let mut trimmed = full.clone();
        trimmed.metadata.managed_fields = None;
        trimmed.annotations_mut().remove(LAST_APPLIED);
        assert_eq!(
            serde_json::to_value(&cached).unwrap(),
            serde_json::to_value(&trimmed).unwrap(),
            "all else is kept"
        );
        assert_eq!(
            WorkspaceWire::url_path(&(), Some("team")),
            Workspace::url_path(&(), Some("team"))
        );
    }

    #[test]
    fn a_watch_of_decoded_workspaces_is_one_of_workspaces() {
        let wire: WorkspaceWire = serde_json::from_value(json!({
            "metadata": {"name": "w", "annotations": {LAST_APPLIED: "{}"}},
            "spec": {"image": "x"}
        }))
        .unwrap();
        let mut records = Records::default();
        let Event::Apply(ws) = records.workspaces(Event::Apply(wire)) else {
            panic!("an Apply stays an Apply")
        };
        assert_eq!(ws.name_any(), "w");
        assert_eq!(ws.metadata.annotations, None);
        assert!(matches!(
            records.workspaces(Event::InitDone),
            Event::InitDone
        ));
    }

    fn of_kind(name: &str, option: &str) -> WorkspaceWire {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"kind": "python", "options": {"pod": option}},
            "status": {"resolved": {
                "kind": "python",
                "image": {"id": "3.12", "spec": {"image": "python:3.12"}},
                "pod": {"id": option, "requested": option, "spec": {"resources": {
                    "requests": {"cpu": "1", "memory": "2Gi"},
                    "limits": {"memory": "2Gi"}}}}
            }}
        }))
        .unwrap()
    }

    fn record(event: Event<Workspace>) -> Arc<KindResolution> {
        let (Event::Apply(ws) | Event::InitApply(ws)) = event else {
            panic!("an object stays an object")
        };
        ws.status.unwrap().resolved.unwrap()
    }

    #[test]
    fn workspaces_with_equal_kind_records_share_one_copy() {
        let mut records = Records::default();
        let a = record(records.workspaces(Event::InitApply(of_kind("a", "small"))));
        let b = record(records.workspaces(Event::Apply(of_kind("b", "small"))));
        assert!(Arc::ptr_eq(&a, &b), "equal records are one copy");
        let c = record(records.workspaces(Event::Apply(of_kind("c", "large"))));
        assert!(
            !Arc::ptr_eq(&a, &c) && *c != *a,
            "another option is its own"
        );
        assert_eq!(c.pod.id, "large");
        // Once no workspace holds a record, the next equal one is shared afresh, and what it
        // says is what was decoded.
        drop((a, b));
        let d = record(records.workspaces(Event::Apply(of_kind("d", "small"))));
        let e = record(records.workspaces(Event::Apply(of_kind("e", "small"))));
        assert!(Arc::ptr_eq(&d, &e));
        assert_eq!(d.pod.id, "small");
        assert_eq!(records.0["python"].len(), 2, "the dead record is dropped");
        // A workspace without a record is left as it is.
        let plain: WorkspaceWire = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "spec": {"image": "x"}
        }))
        .unwrap();
        let Event::Apply(p) = records.workspaces(Event::Apply(plain)) else {
            panic!()
        };
        assert!(p.status.is_none());
    }
}
