//! Workspace pods in a namespace that enforces Pod Security "restricted": they run, whether
//! the agent wraps the command or runs beside the image's entrypoint; a pod the namespace
//! refuses (a root image the admin allowed) is explained in the API server's words.

use berth_api::Phase;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::support::*;

async fn enforce_restricted(h: &Harness) {
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    namespaces
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn workspaces_run_where_pod_security_restricted_is_enforced() {
    let h = Harness::start().await;
    enforce_restricted(&h).await;
    h.create(
        "wrapped",
        json!({"image": "devbox:1", "command": ["sleep", "infinity"]}),
    )
    .await;
    h.create(
        "sidecar",
        json!({"image": "devbox:1", "ports": [{"name": "http", "port": 8080}],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}}),
    )
    .await;
    h.until_phase("wrapped", Phase::Running).await;
    h.until_phase("sidecar", Phase::Running).await;
}

#[tokio::test]
async fn a_pod_the_namespace_refuses_is_explained_in_its_words() {
    let mut config = test_config();
    config.agent.root_images = true;
    let h = Harness::start_with(sim_config(), config).await;
    enforce_restricted(&h).await;
    h.create("rooted", json!({"image": "devbox:1"})).await;
    // What a user sees: Error, AdmissionDenied, the API server's own message.
    let ws = h.until_not_ready("rooted", "AdmissionDenied").await;
    assert_eq!(phase_of(&ws), Some(Phase::Error));
    assert_eq!(
        message_of(&ws),
        "Cannot create pod rooted-ws (AdmissionDenied); the API server said: pods \"rooted-ws\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true (pod or container \"workspace\" must set securityContext.runAsNonRoot=true)"
    );
}
