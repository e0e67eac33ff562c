//! What a workspace needs, built as a deterministic function of its spec (rule C4): the pod,
//! the home claim and the service, with Berth's labels and a controller ownerReference. The
//! pod carries a hash of the pod-affecting spec so a change can be noticed (rule C5).

use std::collections::BTreeMap;

use berth_api::{Workspace, WorkspaceSpec, labels};
use k8s_openapi::{
    api::core::v1::{
        Container, ContainerPort, PersistentVolumeClaim, PersistentVolumeClaimSpec,
        PersistentVolumeClaimVolumeSource, Pod, PodSpec, SecretVolumeSource, Service, ServicePort,
        ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

/// The name of the workspace container.
pub const CONTAINER: &str = "workspace";

fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// `name` with `suffix`, shortened (with a hash of the whole) to fit `limit`.
fn bounded(name: &str, suffix: &str, limit: usize) -> String {
    let full = format!("{name}{suffix}");
    if full.len() <= limit {
        return full;
    }
    let keep = limit - suffix.len() - 9;
    format!(
        "{}-{}{suffix}",
        name[..keep].trim_end_matches(['-', '.']),
        short_hash(name)
    )
}

/// The workspace's pod: `<workspace>-ws`, the same name for every pod it ever has.
pub fn pod_name(workspace: &str) -> String {
    bounded(workspace, "-ws", 253)
}

/// The workspace's home claim: `<workspace>-home`.
pub fn claim_name(workspace: &str) -> String {
    bounded(workspace, "-home", 253)
}

/// The workspace's service: a DNS-1035 label derived from the workspace name.
pub fn service_name(workspace: &str) -> String {
    let starts_with_letter = workspace.starts_with(|c: char| c.is_ascii_lowercase());
    let base = if starts_with_letter && !workspace.contains('.') {
        workspace.to_owned()
    } else {
        format!("ws-{}", workspace.replace('.', "-"))
    };
    bounded(&base, "", 63)
}

/// The ownerReference that makes the workspace the controller of what Berth creates.
pub fn owner_reference(workspace: &Workspace) -> OwnerReference {
    workspace
        .controller_owner_ref(&())
        .expect("a workspace read from the API has a name and uid")
}

/// Whether `object` is controlled by `workspace` (same UID).
pub fn is_owned_by(meta: &ObjectMeta, workspace: &Workspace) -> bool {
    let uid = workspace.metadata.uid.as_deref();
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

fn metadata(
    workspace: &Workspace,
    name: String,
    extra_labels: &BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> ObjectMeta {
    let mut all_labels = extra_labels.clone();
    all_labels.extend(labels::owned_labels(&workspace.name_any()));
    ObjectMeta {
        name: Some(name),
        namespace: workspace.namespace(),
        labels: Some(all_labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: Some(vec![owner_reference(workspace)]),
        ..Default::default()
    }
}

/// A stable hash of everything in the spec that shapes the pod (not `paused`, not
/// `lifecycle`): when it changes, the pod must be replaced.
pub fn spec_hash(spec: &WorkspaceSpec) -> String {
    let mut shaping = spec.clone();
    shaping.paused = false;
    shaping.lifecycle = None;
    let canonical = serde_json::to_value(&shaping)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The workspace's pod.
pub fn build_pod(workspace: &Workspace) -> Pod {
    let spec = &workspace.spec;
    let name = workspace.name_any();
    let template = spec.pod_template.clone().unwrap_or_default();
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut annotations = template_meta.annotations.clone();
    annotations.insert(labels::SPEC_HASH.to_owned(), spec_hash(spec));

    let mut volumes = vec![];
    let mut mounts = vec![];
    let workspace_volumes = template.volumes.clone().unwrap_or_default();
    if let Some(home) = &workspace_volumes.home {
        volumes.push(Volume {
            name: "home".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&name),
                read_only: None,
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "home".into(),
            mount_path: home.mount_path.as_str().to_owned(),
            ..Default::default()
        });
    }
    for (i, data) in workspace_volumes.data.iter().enumerate() {
        let volume = format!("data-{i}");
        volumes.push(Volume {
            name: volume.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: data.claim_name.clone(),
                read_only: data.read_only.then_some(true),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: data.mount_path.as_str().to_owned(),
            read_only: data.read_only.then_some(true),
            ..Default::default()
        });
    }
    for (i, secret) in workspace_volumes.secrets.iter().enumerate() {
        let volume = format!("secret-{i}");
        volumes.push(Volume {
            name: volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.secret_name.clone()),
                default_mode: Some(secret.default_mode.unwrap_or(0o644)),
                optional: secret.optional,
                items: None,
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: secret.mount_path.as_str().to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
    }

    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone()),
        command: spec.command.clone(),
        env: (!spec.env.is_empty()).then(|| spec.env.clone()),
        resources: spec.resources.clone(),
        ports: (!spec.ports.is_empty()).then(|| {
            spec.ports
                .iter()
                .map(|p| ContainerPort {
                    name: Some(p.name.clone()),
                    container_port: p.port,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect()
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    Pod {
        metadata: metadata(
            workspace,
            pod_name(&name),
            &template_meta.labels,
            annotations,
        ),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: (!volumes.is_empty()).then_some(volumes),
            service_account_name: spec.service_account_name.clone(),
            node_selector: (!template.node_selector.is_empty())
                .then(|| template.node_selector.clone()),
            tolerations: (!template.tolerations.is_empty()).then(|| template.tolerations.clone()),
            affinity: template.affinity.clone(),
            restart_policy: Some("Always".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The home claim, when the spec asks for one.
pub fn build_claim(workspace: &Workspace) -> Option<PersistentVolumeClaim> {
    let home = workspace
        .spec
        .pod_template
        .as_ref()?
        .volumes
        .as_ref()?
        .home
        .clone()?;
    Some(PersistentVolumeClaim {
        metadata: metadata(
            workspace,
            claim_name(&workspace.name_any()),
            &BTreeMap::new(),
            BTreeMap::new(),
        ),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_owned(), home.size.clone())].into()),
                limits: None,
            }),
            storage_class_name: home.storage_class_name.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

/// The ClusterIP service, when the spec has ports.
pub fn build_service(workspace: &Workspace) -> Option<Service> {
    if workspace.spec.ports.is_empty() {
        return None;
    }
    let name = workspace.name_any();
    Some(Service {
        metadata: metadata(
            workspace,
            service_name(&name),
            &BTreeMap::new(),
            BTreeMap::new(),
        ),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some([(labels::WORKSPACE.to_owned(), name)].into()),
            ports: Some(
                workspace
                    .spec
                    .ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(p.name.clone()),
                        port: p.port,
                        target_port: Some(IntOrString::Int(p.port)),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    })
}

/// Whether a service's ports are what the workspace asks for.
pub fn service_ports_match(service: &Service, workspace: &Workspace) -> bool {
    let have: Vec<(Option<String>, i32)> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.port))
        .collect();
    let want: Vec<(Option<String>, i32)> = workspace
        .spec
        .ports
        .iter()
        .map(|p| (Some(p.name.clone()), p.port))
        .collect();
    have == want
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A workspace as the API server would return it.
    pub fn workspace(name: &str, spec: serde_json::Value) -> Workspace {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"), "generation": 1},
            "spec": spec
        }))
        .expect("a valid workspace")
    }

    #[test]
    fn names_are_deterministic_and_bounded() {
        assert_eq!(pod_name("alice-dev"), "alice-dev-ws");
        assert_eq!(claim_name("alice-dev"), "alice-dev-home");
        assert_eq!(service_name("alice-dev"), "alice-dev");
        assert_eq!(service_name("1.dev"), "ws-1-dev");
        let long = "a".repeat(250);
        assert!(pod_name(&long).len() <= 253);
        assert_eq!(pod_name(&long), pod_name(&long));
        assert_ne!(pod_name(&long), pod_name(&format!("{}b", "a".repeat(249))));
        assert!(service_name(&"b".repeat(100)).len() <= 63);
    }

    #[test]
    fn the_pod_carries_volumes_labels_owner_and_hash() {
        let ws = workspace(
            "alice",
            json!({
                "image": "devbox:1",
                "command": ["sleep", "infinity"],
                "ports": [{"name": "http", "port": 8080}],
                "serviceAccountName": "dev",
                "podTemplate": {
                    "metadata": {"labels": {"team": "a", "berth.dev/workspace": "spoofed"}},
                    "nodeSelector": {"disk": "ssd"},
                    "volumes": {
                        "home": {"size": "10Gi", "mountPath": "/home/dev"},
                        "data": [{"claimName": "shared", "mountPath": "/data", "readOnly": true}],
                        "secrets": [{"secretName": "git", "mountPath": "/secrets/git", "defaultMode": 256, "optional": true}]
                    }
                }
            }),
        );
        let pod = build_pod(&ws);
        let value = serde_json::to_value(&pod).unwrap();
        assert_eq!(value["metadata"]["name"], "alice-ws");
        assert_eq!(
            value["metadata"]["labels"]["berth.dev/workspace"], "alice",
            "Berth's labels win"
        );
        assert_eq!(value["metadata"]["labels"]["team"], "a");
        assert_eq!(
            value["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "berth"
        );
        assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "uid-alice");
        assert_eq!(value["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            value["metadata"]["annotations"][labels::SPEC_HASH],
            spec_hash(&ws.spec)
        );
        let spec = &value["spec"];
        assert_eq!(
            spec["containers"][0]["command"],
            json!(["sleep", "infinity"])
        );
        assert_eq!(spec["serviceAccountName"], "dev");
        assert_eq!(spec["nodeSelector"], json!({"disk": "ssd"}));
        assert_eq!(
            spec["volumes"],
            json!([
                {"name": "home", "persistentVolumeClaim": {"claimName": "alice-home"}},
                {"name": "data-0", "persistentVolumeClaim": {"claimName": "shared", "readOnly": true}},
                {"name": "secret-0", "secret": {"secretName": "git", "defaultMode": 256, "optional": true}}
            ])
        );
        assert_eq!(
            spec["containers"][0]["volumeMounts"][2],
            json!({"name": "secret-0", "mountPath": "/secrets/git", "readOnly": true})
        );
        let claim = serde_json::to_value(build_claim(&ws).unwrap()).unwrap();
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
        let service = serde_json::to_value(build_service(&ws).unwrap()).unwrap();
        assert_eq!(
            service["spec"]["selector"],
            json!({"berth.dev/workspace": "alice"})
        );
        assert_eq!(service["spec"]["ports"][0]["targetPort"], 8080);
    }

    #[test]
    fn the_hash_follows_pod_shaping_fields_only() {
        let a = workspace("a", json!({"image": "x:1"}));
        let paused = workspace(
            "a",
            json!({"image": "x:1", "paused": true, "lifecycle": {"startTimeout": "5m"}}),
        );
        let other = workspace("a", json!({"image": "x:2"}));
        assert_eq!(spec_hash(&a.spec), spec_hash(&paused.spec));
        assert_ne!(spec_hash(&a.spec), spec_hash(&other.spec));
    }

    proptest::proptest! {
        #[test]
        fn building_twice_gives_the_same_pod(image in "[a-z]{1,10}:[0-9]{1,3}", port in 1i32..65535, mode in 0i32..512) {
            let ws = workspace("p", json!({"image": image, "ports": [{"name": "p", "port": port}],
                "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/s", "defaultMode": mode}]}}}));
            proptest::prop_assert_eq!(build_pod(&ws), build_pod(&ws));
            let pod = serde_json::to_value(build_pod(&ws)).unwrap();
            proptest::prop_assert_eq!(&pod["spec"]["volumes"][0]["secret"]["defaultMode"], &json!(mode));
        }
    }
}
