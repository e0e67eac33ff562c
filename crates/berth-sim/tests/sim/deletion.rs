//! Deletion: finalizers and deletionTimestamp, graceful pod deletion, preconditions, garbage
//! collection by ownerReferences (Background, Foreground, Orphan) and namespace termination.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::{Value, json};

use crate::support::{api_error, cluster, eventually, pod};

async fn config_map(api: &Api<ConfigMap>, name: &str, extra: Value) -> ConfigMap {
    let mut body = json!({"metadata": {"name": name}});
    json_patch::merge(&mut body, &extra);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .unwrap()
}

fn owned_by(owner: &ConfigMap, block: bool) -> Value {
    json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(), "uid": owner.uid().unwrap(), "blockOwnerDeletion": block}]}})
}

#[tokio::test]
async fn finalizers_hold_an_object_until_removed() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    config_map(
        &cms,
        "c",
        json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    )
    .await;
    let response = cms.delete("c", &DeleteParams::default()).await.unwrap();
    let held = response
        .left()
        .expect("the object is returned while it waits for finalizers");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(
        cms.get("c").await.unwrap().finalizers(),
        ["example.com/hold"]
    );

    let (code, _, message) = api_error(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "new"]}})),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("no new finalizers can be added if the object is being deleted"),
        "{message}"
    );

    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(cms.get("c").await).0, 404);
}

#[tokio::test]
async fn delete_preconditions() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let c = config_map(&cms, "c", json!({})).await;
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-it".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let (code, reason, message) = api_error(cms.delete("c", &wrong).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        format!(
            "Operation cannot be fulfilled on configmaps \"c\": Precondition failed: UID in precondition: not-it, UID in object meta: {}",
            c.uid().unwrap()
        )
    );
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: c.uid(),
            resource_version: c.resource_version(),
        }),
        ..Default::default()
    };
    let status = cms
        .delete("c", &right)
        .await
        .unwrap()
        .right()
        .expect("a Status once gone");
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
}

#[tokio::test]
async fn bound_pods_are_deleted_gracefully() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", "web"))
        .await
        .unwrap();
    // What the scheduler does: bind through the binding subresource.
    let binding = http::Request::post("/api/v1/namespaces/default/pods/p/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-1"}})).unwrap())
        .unwrap();
    client.request::<Value>(binding).await.unwrap();
    let bound = pods.get("p").await.unwrap();
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );
    let rebinding = http::Request::post("/api/v1/namespaces/default/pods/p/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"target": {"kind": "Node", "name": "node-2"}})).unwrap())
        .unwrap();
    let (code, _, message) = api_error(client.request::<Value>(rebinding).await);
    assert_eq!(code, 409);
    assert!(
        message.contains("pod p is already assigned to node \"node-1\""),
        "{message}"
    );

    let terminating = pods
        .delete("p", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("a graceful deletion returns the pod");
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    assert!(
        pods.get("p").await.is_ok(),
        "the pod stays while its containers stop"
    );
    eventually(
        Duration::from_secs(5),
        "the pod to be gone after its grace period",
        || async { pods.get_opt("p").await.unwrap().is_none().then_some(()) },
    )
    .await;

    // An unbound pod goes at once.
    pods.create(&PostParams::default(), &pod("q", "web"))
        .await
        .unwrap();
    pods.delete("q", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("q").await.unwrap().is_none());
}

#[tokio::test]
async fn garbage_collection_background_orphan_and_foreground() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");

    // Background: the owner goes now, dependents after.
    let owner = config_map(&cms, "owner-bg", json!({})).await;
    config_map(&cms, "dep-bg", owned_by(&owner, false)).await;
    cms.delete("owner-bg", &DeleteParams::background())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "the background dependent to be collected",
        || async { cms.get_opt("dep-bg").await.unwrap().is_none().then_some(()) },
    )
    .await;

    // Orphan: dependents stay, without the reference.
    let owner = config_map(&cms, "owner-or", json!({})).await;
    config_map(&cms, "dep-or", owned_by(&owner, false)).await;
    cms.delete("owner-or", &DeleteParams::orphan())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "the orphaning owner to be gone",
        || async {
            cms.get_opt("owner-or")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let orphan = cms.get("dep-or").await.unwrap();
    assert!(orphan.owner_references().is_empty());

    // Foreground: the owner waits, with its finalizer, until blocking dependents are gone.
    let owner = config_map(&cms, "owner-fg", json!({})).await;
    config_map(&cms, "dep-fg", {
        let mut v = owned_by(&owner, true);
        v["metadata"]["finalizers"] = json!(["example.com/slow"]);
        v
    })
    .await;
    cms.delete("owner-fg", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = eventually(
        Duration::from_secs(5),
        "the dependent to be deleting",
        || async {
            let dep = cms.get("dep-fg").await.unwrap();
            dep.metadata.deletion_timestamp.is_some().then_some(dep)
        },
    )
    .await;
    assert!(waiting.metadata.deletion_timestamp.is_some());
    let owner_now = cms.get("owner-fg").await.unwrap();
    assert!(
        owner_now
            .finalizers()
            .contains(&"foregroundDeletion".to_owned())
    );
    cms.patch(
        "dep-fg",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually(
        Duration::from_secs(5),
        "the foreground owner to be gone",
        || async {
            cms.get_opt("owner-fg")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;

    // A dependent whose owner never existed is collected.
    let fake = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "00000000-0000-4000-8000-000000000000"}]}});
    config_map(&cms, "dangling", fake).await;
    eventually(
        Duration::from_secs(5),
        "the dangling dependent to be collected",
        || async {
            cms.get_opt("dangling")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_deleted_namespace_empties_then_goes() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap(),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team-a");
    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), "team-a");
    assert!(
        sa.get_opt("default").await.unwrap().is_some(),
        "a namespace gets its default service account"
    );
    config_map(
        &cms,
        "c",
        json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    )
    .await;

    let terminating = namespaces
        .delete("team-a", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let (code, reason, message) = api_error(
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "new"}})).unwrap(),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "configmaps is forbidden: unable to create new content in namespace team-a because it is being terminated"
    );

    eventually(
        Duration::from_secs(5),
        "the config map to be marked for deletion",
        || async {
            cms.get("c")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
                .then_some(())
        },
    )
    .await;
    assert!(
        namespaces.get_opt("team-a").await.unwrap().is_some(),
        "held by the config map's finalizer"
    );
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually(
        Duration::from_secs(5),
        "the namespace to be gone",
        || async {
            namespaces
                .get_opt("team-a")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
}
