//! What the operator keeps of the objects it caches: only the fields its decisions read, so
//! the caches of 10 000 workspaces fit in a small operator. Each watch stream is trimmed
//! before its reflector stores the object (a `modify` after the reflector trims only what the
//! controller is handed, not what the cache keeps).
//!
//! Kept, by kind:
//! - Workspace: everything but managedFields and kubectl's last-applied copy of the object.
//! - Pod: of the metadata, all but labels, managedFields and annotations other than Berth's
//!   spec hash (the selector is the API server's to apply); of the spec only the node and the agent's TLS
//!   volume's name (whether the agent serves TLS); of the status, the phase and its reason,
//!   the pod's IP, the conditions Berth reads (without their times), and each container's
//!   name, readiness, restarts and state (without images, IDs and times). A pod of 6.5 KiB in
//!   the cache is 2.2 KiB of fixed-size structs; the rest is what is dropped here.
//! - Claim, Service, Event: everything but managedFields (the service's spec is compared with
//!   the wanted one; claims and Warning events are small).

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus, Volume,
};
use kube::ResourceExt;

use berth_api::{Workspace, condition::pod_conditions};

/// The annotation `kubectl apply` keeps a whole copy of the object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no decision reads from a cached Workspace.
pub fn workspace(workspace: &mut Workspace) {
    workspace.managed_fields_mut().clear();
    workspace.annotations_mut().remove(LAST_APPLIED);
}

/// The pod conditions decisions read; the kubelet's others are dropped.
const POD_CONDITIONS: [&str; 3] = [
    pod_conditions::POD_SCHEDULED,
    pod_conditions::READY,
    pod_conditions::CONTAINERS_READY,
];

/// Drops what no decision reads from a cached Pod.
pub fn pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.metadata.labels = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|key, _| {
            key == berth_api::labels::SPEC_HASH || key == berth_api::labels::CONTENT_HASH
        });
    }
    let tls = crate::pod::serves_agent_tls(pod);
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        // A `Volume` is 1.5 KiB however little it says: of the volumes, only what
        // `serves_agent_tls` reads is kept, the TLS volume's name.
        volumes: tls.then(|| {
            vec![Volume {
                name: crate::pod::AGENT_TLS_VOLUME.to_owned(),
                ..Default::default()
            }]
        }),
        ..Default::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        reason: status.reason,
        message: status.message,
        pod_ip: status.pod_ip,
        conditions: status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .filter(|c| POD_CONDITIONS.contains(&c.type_.as_str()))
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    ..Default::default()
                })
                .collect()
        }),
        container_statuses: status.container_statuses.map(containers),
        init_container_statuses: status.init_container_statuses.map(containers),
        ..Default::default()
    });
}

/// Of each container's status: its name, readiness, restarts and state (reasons, messages,
/// exit codes), without images, IDs, times and resources.
fn containers(statuses: Vec<ContainerStatus>) -> Vec<ContainerStatus> {
    statuses
        .into_iter()
        .map(|c| ContainerStatus {
            name: c.name,
            ready: c.ready,
            started: c.started,
            restart_count: c.restart_count,
            state: c.state.map(|state| ContainerState {
                running: state.running.map(|_| Default::default()),
                waiting: state.waiting,
                terminated: state.terminated.map(|t| ContainerStateTerminated {
                    exit_code: t.exit_code,
                    reason: t.reason,
                    message: t.message,
                    ..Default::default()
                }),
            }),
            ..Default::default()
        })
        .collect()
}

/// Drops managedFields, for the kinds whose other fields are read.
pub fn managed_fields<K: kube::Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::pod as pods;

    fn full_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "alice-ws", "namespace": "team", "uid": "u1", "resourceVersion": "7",
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
                "containerStatuses": [{"name": "workspace", "ready": true, "restartCount": 0,
                    "image": "busybox", "imageID": "busybox@sha256:0",
                    "containerID": "containerd://2",
                    "state": {"running": {"startedAt": "2026-12-02T10:00:04Z"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_cached_pod_keeps_what_decisions_read_and_loses_the_rest() {
        let full = full_pod();
        let mut trimmed = full.clone();
        pod(&mut trimmed);
        assert!(
            trimmed
                .metadata
                .managed_fields
                .as_ref()
                .is_none_or(|m| m.is_empty())
        );
        assert_eq!(
            trimmed.metadata.labels, None,
            "the API server selects by label"
        );
        assert_eq!(
            trimmed
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["berth.dev/spec-hash"]
        );
        assert_eq!(
            trimmed.metadata.owner_references,
            full.metadata.owner_references
        );
        let status = trimmed.status.as_ref().unwrap();
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(status.host_ip, None);
        let types: Vec<_> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["PodScheduled", "Ready"],
            "the kubelet's others are not read"
        );
        assert!(
            status
                .conditions
                .iter()
                .flatten()
                .all(|c| c.last_transition_time.is_none())
        );
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            (container.name.as_str(), container.ready),
            ("workspace", true)
        );
        assert!(container.image.is_empty() && container.container_id.is_none());
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        let terminated = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (terminated.exit_code, terminated.reason.as_deref()),
            (0, Some("Completed"))
        );
        assert_eq!(terminated.finished_at, None);
        let spec = trimmed.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert!(spec.containers.is_empty(), "containers are not cached");
        assert!(
            pods::serves_agent_tls(&trimmed),
            "the TLS volume's name is kept"
        );
        assert_eq!(
            spec.volumes.as_ref().unwrap().len(),
            1,
            "no other volume is kept"
        );
        assert!(spec.volumes.as_ref().unwrap()[0].secret.is_none());
    }

    #[test]
    fn a_cached_workspace_loses_managed_fields_and_the_last_applied_copy_only() {
        let mut full: Workspace = serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "alice", "namespace": "team",
                "annotations": {LAST_APPLIED: "{\"spec\":{}}", "team": "a"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"image": "busybox"}
        }))
        .unwrap();
        let before = full.clone();
        workspace(&mut full);
        assert!(
            full.metadata
                .managed_fields
                .as_ref()
                .is_none_or(|m| m.is_empty())
        );
        assert_eq!(
            full.metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["team"]
        );
        assert_eq!(
            serde_json::to_value(&full.spec).unwrap(),
            serde_json::to_value(&before.spec).unwrap()
        );
    }
}
