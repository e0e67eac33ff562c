//! What the operator keeps of a pod: the fields its decisions read, decoded straight from the
//! API server's JSON, so neither a cached pod nor a page of a list (500 pods, when a restarted
//! operator fills its cache) is ever a whole `Pod` in memory. A `k8s_openapi` `Pod` is 2.2 KiB
//! of fixed-size structs however empty, and its managedFields, volumes and container specs
//! many times that; a `CachedPod` of a running workspace is about a tenth of it.
//!
//! The shape is the `Pod`'s, with only the read fields, under the same names, so the code
//! that reads a cached pod reads it as it would a `Pod` (but for the two hash annotations,
//! below). Kept:
//! - metadata: all but labels (the API server selects by them), managedFields and
//!   annotations; Berth's spec and content hash annotations are fields of their own
//!   (`spec_hash`, `content_hash`): a map of one or two entries is a 540-byte tree node, 5 MiB
//!   over 10 000 pods;
//! - spec: the node, and the volumes' names (whether the agent's TLS volume is mounted);
//! - status: the phase, its reason and message, the pod's IP, the conditions Berth reads
//!   (without their times), and each container's name, readiness, restarts and state
//!   (reasons, messages, exit codes; without images, IDs and times).
//!
//! A test that builds a `Pod` gets its cached form with [`CachedPod::from`], which goes
//! through the same decoding as a watch.

use std::borrow::Cow;

use k8s_openapi::{
    api::core::v1::{ContainerStateWaiting, Pod},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Deserialize, Deserializer};

use berth_api::{condition::pod_conditions, labels};

/// A pod as the operator's cache keeps it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "PodWire")]
pub struct CachedPod {
    /// Without annotations: the two Berth reads are the fields below.
    pub metadata: ObjectMeta,
    /// The annotation [`labels::SPEC_HASH`].
    pub spec_hash: Option<String>,
    /// The annotation [`labels::CONTENT_HASH`].
    pub content_hash: Option<String>,
    pub spec: Option<CachedPodSpec>,
    pub status: Option<CachedPodStatus>,
}

/// A pod as it is decoded, its annotations still in its metadata.
#[derive(Deserialize)]
struct PodWire {
    #[serde(default, deserialize_with = "metadata")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<CachedPodSpec>,
    #[serde(default)]
    status: Option<CachedPodStatus>,
}

impl From<PodWire> for CachedPod {
    fn from(mut wire: PodWire) -> Self {
        let mut annotations = wire.metadata.annotations.take().unwrap_or_default();
        CachedPod {
            metadata: wire.metadata,
            spec_hash: annotations.remove(labels::SPEC_HASH),
            content_hash: annotations.remove(labels::CONTENT_HASH),
            spec: wire.spec,
            status: wire.status,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub volumes: Option<Vec<VolumeName>>,
}

/// Of a volume, its name.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct VolumeName {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(default, deserialize_with = "read_conditions")]
    pub conditions: Option<Vec<CachedPodCondition>>,
    #[serde(default)]
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
    #[serde(default)]
    pub init_container_statuses: Option<Vec<CachedContainerStatus>>,
}

/// A pod condition, without its times.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct CachedPodCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainerStatus {
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub started: Option<bool>,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default)]
    pub state: Option<CachedContainerState>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct CachedContainerState {
    /// Running (since when is not kept).
    #[serde(default)]
    pub running: Option<Running>,
    #[serde(default)]
    pub waiting: Option<ContainerStateWaiting>,
    #[serde(default)]
    pub terminated: Option<CachedTerminated>,
}

/// A running container's state: that it runs.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Running {}

/// A terminated container's exit code, reason and message.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedTerminated {
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

impl berth_api::condition::HasStatus for CachedPodCondition {
    fn status_text(&self) -> &str {
        &self.status
    }
}

/// The pod conditions decisions read; the kubelet's others are dropped.
const READ_CONDITIONS: [&str; 3] = [
    pod_conditions::POD_SCHEDULED,
    pod_conditions::READY,
    pod_conditions::CONTAINERS_READY,
];

/// The annotations decisions read.
const READ_ANNOTATIONS: [&str; 2] = [labels::SPEC_HASH, labels::CONTENT_HASH];

fn read_conditions<'de, D: Deserializer<'de>>(
    from: D,
) -> Result<Option<Vec<CachedPodCondition>>, D::Error> {
    let conditions = Option::<Vec<CachedPodCondition>>::deserialize(from)?;
    Ok(conditions.map(|mut conditions| {
        conditions.retain(|c| READ_CONDITIONS.contains(&c.type_.as_str()));
        conditions
    }))
}

/// Of the metadata, all but labels (the API server selects by them), managedFields and
/// others' annotations.
fn metadata<'de, D: Deserializer<'de>>(from: D) -> Result<ObjectMeta, D::Error> {
    crate::trim::read_metadata(from, false, |key| READ_ANNOTATIONS.contains(&key))
}

impl From<&Pod> for CachedPod {
    /// The cached form of `pod`, decoded from its JSON as a watch decodes it.
    fn from(pod: &Pod) -> Self {
        serde_json::to_value(pod)
            .and_then(serde_json::from_value)
            .expect("a Pod's JSON decodes as a cached pod")
    }
}

impl kube::Resource for CachedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use kube::{Resource, ResourceExt};
    use serde_json::json;

    use super::*;
    use crate::pod as pods;

    fn full_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "alice-ws", "namespace": "team", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-12-02T10:00:00Z",
                "labels": {"app.kubernetes.io/managed-by": "berth"},
                "annotations": {"berth.dev/spec-hash": "abc", "team": "a"},
                "ownerReferences": [{"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
                    "name": "alice", "uid": "w1", "controller": true}],
                "managedFields": [{"manager": "berth", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {
                "nodeName": "node-1",
                "containers": [{"name": "workspace", "image": "busybox",
                    "command": ["sleep", "infinity"], "env": [{"name": "A", "value": "b"}]}],
                "volumes": [{"name": pods::AGENT_TLS_VOLUME, "secret": {"secretName": "tls"}},
                    {"name": "kube-api-access-x", "projected": {"sources": []}}]
            },
            "status": {"phase": "Running", "podIP": "10.0.0.5", "hostIP": "10.1.0.1",
                "conditions": [
                    {"type": "PodReadyToStartContainers", "status": "True"},
                    {"type": "PodScheduled", "status": "True",
                        "lastTransitionTime": "2026-12-02T10:00:00Z"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "True",
                        "lastTransitionTime": "2026-12-02T10:00:05Z"}],
                "initContainerStatuses": [{"name": "berth-install", "ready": true,
                    "restartCount": 0, "image": "berth", "imageID": "berth@sha256:0",
                    "containerID": "containerd://1", "state": {"terminated": {"exitCode": 0,
                        "reason": "Completed", "finishedAt": "2026-12-02T10:00:03Z"}}}],
                "containerStatuses": [{"name": "workspace", "ready": true, "restartCount": 2,
                    "image": "busybox", "imageID": "busybox@sha256:0",
                    "containerID": "containerd://2",
                    "lastState": {"terminated": {"exitCode": 1}},
                    "state": {"running": {"startedAt": "2026-12-02T10:00:04Z"}}}]}
        })
    }

    #[test]
    fn a_cached_pod_keeps_what_decisions_read_and_loses_the_rest() {
        let cached: CachedPod = serde_json::from_value(full_pod()).unwrap();
        assert_eq!(
            (
                cached.name_any(),
                cached.namespace().as_deref(),
                cached.uid().as_deref()
            ),
            ("alice-ws".to_owned(), Some("team"), Some("u1"))
        );
        assert_eq!(cached.resource_version().as_deref(), Some("7"));
        assert!(cached.creation_timestamp().is_some());
        assert_eq!(cached.metadata.managed_fields, None);
        assert_eq!(
            cached.metadata.labels, None,
            "the API server selects by label"
        );
        assert_eq!(cached.spec_hash.as_deref(), Some("abc"));
        assert_eq!(cached.content_hash, None);
        assert_eq!(
            cached.metadata.annotations, None,
            "Berth's own are fields of their own; others' are not read"
        );
        let owner = &cached.owner_references()[0];
        assert_eq!(
            (owner.name.as_str(), owner.controller),
            ("alice", Some(true))
        );
        let status = cached.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.5"));
        let types: Vec<_> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [("PodScheduled", "True"), ("Ready", "True")],
            "the kubelet's others are not read"
        );
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            (
                container.name.as_str(),
                container.ready,
                container.restart_count
            ),
            ("workspace", true, 2)
        );
        assert!(container.state.as_ref().unwrap().running.is_some());
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        let terminated = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (terminated.exit_code, terminated.reason.as_deref()),
            (0, Some("Completed"))
        );
        let spec = cached.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert!(
            pods::serves_agent_tls(&cached),
            "the TLS volume's name is kept"
        );
        assert_eq!(CachedPod::kind(&()), "Pod");
        assert_eq!(
            CachedPod::url_path(&(), Some("team")),
            "/api/v1/namespaces/team/pods"
        );
    }

    /// A `Pod` built in a test decodes to what a watch of the same pod gives.
    #[test]
    fn a_pod_built_in_a_test_caches_as_a_watched_one() {
        let pod: Pod = serde_json::from_value(full_pod()).unwrap();
        assert_eq!(
            CachedPod::from(&pod),
            serde_json::from_value::<CachedPod>(full_pod()).unwrap()
        );
        assert_eq!(CachedPod::from(&Pod::default()), CachedPod::default());
    }

    /// What the API server may send: nulls and missing fields, a bare pod.
    #[test]
    fn sparse_and_null_fields_decode() {
        let cached: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": null, "labels": null},
            "spec": {"containers": [], "volumes": null},
            "status": {"conditions": null, "containerStatuses": [{"name": "c",
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}
        }))
        .unwrap();
        assert_eq!(cached.metadata.annotations, None);
        let waiting = cached.status.unwrap().container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
        assert_eq!(
            serde_json::from_value::<CachedPod>(json!({})).unwrap(),
            CachedPod::default()
        );
    }
}
