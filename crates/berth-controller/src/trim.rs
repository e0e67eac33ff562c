//! What the operator keeps of the objects it caches: only the fields its decisions read, so
//! the caches of 10 000 workspaces fit in a small operator. Each watch stream is trimmed
//! before its reflector stores the object (a `modify` after the reflector trims only what the
//! controller is handed, not what the cache keeps).
//!
//! Kept, by kind:
//! - Workspace: everything but managedFields and kubectl's last-applied copy of the object.
//! - Pod: metadata (labels, annotations, owners, deletion), the status in full, and of the
//!   spec only the node and the agent's TLS volume's name (whether the agent serves TLS).
//! - Claim, Service, Event: everything but managedFields (the service's spec is compared with
//!   the wanted one; claims and Warning events are small).

use k8s_openapi::api::core::v1::{Pod, PodSpec, Volume};
use kube::ResourceExt;

use berth_api::Workspace;

/// The annotation `kubectl apply` keeps a whole copy of the object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no decision reads from a cached Workspace.
pub fn workspace(workspace: &mut Workspace) {
    workspace.managed_fields_mut().clear();
    workspace.annotations_mut().remove(LAST_APPLIED);
}

/// Drops what no decision reads from a cached Pod.
pub fn pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
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
                "annotations": {"berth.dev/spec-hash": "abc"},
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
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                "containerStatuses": [{"name": "workspace", "ready": true, "restartCount": 0,
                    "image": "busybox", "imageID": "", "state": {"running": {}}}]}
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
        assert_eq!(trimmed.metadata.labels, full.metadata.labels);
        assert_eq!(trimmed.metadata.annotations, full.metadata.annotations);
        assert_eq!(
            trimmed.metadata.owner_references,
            full.metadata.owner_references
        );
        assert_eq!(trimmed.status, full.status, "the status is read in full");
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
