//! A name is not ownership: objects that hold a name Berth derives for a workspace but are not
//! that workspace's own are never mounted, patched, adopted or deleted; the workspace says
//! whose they are, once, and proceeds by itself when they go.

use std::time::Duration;

use berth_api::Phase;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Service};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use serde_json::{Value, json};

use crate::support::*;

/// Long enough for a few doublings of the wait between creates that meet the object.
const HEAL: Duration = Duration::from_secs(60);

async fn create<K>(h: &Harness, object: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(h.client.clone(), "default");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap()
}

fn api<K>(h: &Harness) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(h.client.clone(), "default")
}

/// The Warning events about the workspace with `reason`, with their counts.
async fn warnings(h: &Harness, uid: &str, reason: &str) -> Vec<i32> {
    api::<Event>(h)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .map(|e| e.count.unwrap_or(1))
        .collect()
}

/// The operator's requests of `verb` on `resource` (and `subresource`).
fn requests(h: &Harness, verb: &str, resource: &str, subresource: &str) -> u64 {
    h.sim.count_requests(|k| {
        k.user == OPERATOR
            && k.verb == verb
            && k.resource == resource
            && k.subresource == subresource
    })
}

#[tokio::test]
async fn a_claim_of_the_home_name_that_is_not_the_workspaces_is_never_mounted() {
    let h = Harness::start().await;
    // Someone else's claim, with the name Berth derives for workspace `victim`'s home.
    let theirs: PersistentVolumeClaim = create(
        &h,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "victim-home"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    let home = json!({"image": "devbox:1", "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}});
    let ws = h.create("victim", home).await;

    // What a user sees: Error, reason NameTaken, the claim, whose it is and what to do.
    let seen = h.until_not_ready("victim", "NameTaken").await;
    assert_eq!(phase_of(&seen), Some(Phase::Error));
    assert_eq!(
        message_of(&seen),
        "Claim victim-home exists and is not owned by this workspace (owned by nobody); rename the workspace or delete the claim"
    );
    eventually(WAIT, "a NameTaken Warning", || async {
        (!warnings(&h, &ws.uid().unwrap(), "NameTaken")
            .await
            .is_empty())
        .then_some(())
    })
    .await;
    // No pod, so nothing mounts it; growing home.size does not touch it either.
    assert!(api::<Pod>(&h).get_opt("victim-ws").await.unwrap().is_none());
    let before = h.reconciles();
    h.patch_spec(
        "victim",
        json!({"podTemplate": {"volumes": {"home": {"size": "2Gi", "mountPath": "/home/dev"}}}}),
    )
    .await;
    h.until_reconciled(before, 1).await;
    let claim = api::<PersistentVolumeClaim>(&h)
        .get("victim-home")
        .await
        .unwrap();
    assert_eq!(claim.uid(), theirs.uid());
    assert!(claim.owner_references().is_empty());
    assert_eq!(
        claim.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
        "1Gi"
    );
    assert_eq!(requests(&h, "patch", "persistentvolumeclaims", ""), 0);
    assert!(api::<Pod>(&h).get_opt("victim-ws").await.unwrap().is_none());

    // Once the claim is gone, the workspace gets a claim of its own and runs.
    api::<PersistentVolumeClaim>(&h)
        .delete("victim-home", &DeleteParams::default())
        .await
        .unwrap();
    eventually(HEAL, "victim to run with its own claim", || async {
        let ws = h.workspaces().get("victim").await.unwrap();
        (phase_of(&ws) == Some(Phase::Running)).then_some(())
    })
    .await;
    let claim = api::<PersistentVolumeClaim>(&h)
        .get("victim-home")
        .await
        .unwrap();
    assert_ne!(claim.uid(), theirs.uid());
    assert_eq!(claim.owner_references()[0].uid, ws.uid().unwrap());
}

#[tokio::test]
async fn a_service_of_the_workspace_name_is_never_taken_over_or_deleted() {
    let h = Harness::start().await;
    let theirs: Service = create(
        &h,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "payments"},
        "spec": {"selector": {"app": "payments"}, "ports": [{"name": "web", "port": 80, "targetPort": 9090}]}}),
    )
    .await;
    h.create(
        "payments",
        json!({"image": "devbox:1", "ports": [{"name": "http", "port": 8080}]}),
    )
    .await;
    let seen = h.until_not_ready("payments", "NameTaken").await;
    assert_eq!(phase_of(&seen), Some(Phase::Error));
    assert_eq!(
        message_of(&seen),
        "Service payments exists and is not owned by this workspace (owned by nobody); rename the workspace or delete the service"
    );
    let unchanged = |s: &Service| {
        assert_eq!(s.uid(), theirs.uid());
        assert!(
            s.owner_references().is_empty(),
            "{:?}",
            s.owner_references()
        );
        assert_eq!(s.spec, theirs.spec);
        assert!(
            s.managed_fields()
                .iter()
                .all(|m| m.manager.as_deref() != Some("berth-controller"))
        );
    };
    unchanged(&api::<Service>(&h).get("payments").await.unwrap());

    // Deleting the workspace leaves the service as it was.
    h.workspaces()
        .delete("payments", &DeleteParams::default())
        .await
        .unwrap();
    // Its own pod went with it (the garbage collector ran over what it owned).
    eventually(WAIT, "the workspace and its pod to be gone", || async {
        let ws = h.workspaces().get_opt("payments").await.unwrap();
        let pod = api::<Pod>(&h).get_opt("payments-ws").await.unwrap();
        (ws.is_none() && pod.is_none()).then_some(())
    })
    .await;
    unchanged(&api::<Service>(&h).get("payments").await.unwrap());
}

#[tokio::test]
async fn workspaces_whose_names_map_alike_get_services_of_their_own() {
    let h = Harness::start().await;
    let ports = json!({"image": "devbox:1", "ports": [{"name": "http", "port": 8080}]});
    let first = h.create("2a.b", ports.clone()).await;
    let second = h.create("ws-2a-b", ports).await;
    h.until_phase("2a.b", Phase::Running).await;
    h.until_phase("ws-2a-b", Phase::Running).await;
    let services = api::<Service>(&h)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let owner = |uid: &str| {
        services
            .iter()
            .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
            .map(|s| s.name_any())
            .collect::<Vec<_>>()
    };
    let (a, b) = (owner(&first.uid().unwrap()), owner(&second.uid().unwrap()));
    assert_eq!((a.len(), b.len()), (1, 1), "{services:?}");
    assert_ne!(a, b);
    assert_eq!(b, ["ws-2a-b"]);
}

#[tokio::test]
async fn a_pod_of_the_workspace_name_is_said_once_and_the_workspace_heals_when_it_goes() {
    let h = Harness::start().await;
    let foreign: Pod = create(
        &h,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ivy-ws"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}),
    )
    .await;
    let ws = h.create("ivy", json!({"image": "devbox:1"})).await;
    let seen = h.until_not_ready("ivy", "NameTaken").await;
    assert_eq!(phase_of(&seen), Some(Phase::Error));
    assert_eq!(
        message_of(&seen),
        "Pod ivy-ws exists and is not owned by this workspace (owned by nobody); rename the workspace or delete the pod"
    );
    // Three creates that met it (1 s, then 2 s apart): the status was written at most twice
    // (Pending, then Error) and the Warning told once, however often it was looked at.
    eventually(HEAL, "three creates of ivy-ws", || async {
        (requests(&h, "create", "pods", "") >= 3).then_some(())
    })
    .await;
    let status_writes = requests(&h, "patch", "workspaces", "status");
    assert!(status_writes <= 2, "{status_writes} status writes");
    assert_eq!(warnings(&h, &ws.uid().unwrap(), "NameTaken").await, [1]);
    let still = api::<Pod>(&h).get("ivy-ws").await.unwrap();
    assert_eq!(still.uid(), foreign.uid());
    assert!(still.owner_references().is_empty());
    assert_eq!(requests(&h, "delete", "pods", ""), 0);

    // Its owner deletes it: the workspace proceeds by itself.
    api::<Pod>(&h)
        .delete("ivy-ws", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(HEAL, "ivy to run in a pod of its own", || async {
        let ws = h.workspaces().get("ivy").await.unwrap();
        (phase_of(&ws) == Some(Phase::Running)).then_some(())
    })
    .await;
    let own = api::<Pod>(&h).get("ivy-ws").await.unwrap();
    assert_eq!(own.owner_references()[0].uid, ws.uid().unwrap());
}

/// A user would see: `Error`, NameTaken, naming the Service; once its owner deletes it, the
/// workspace creates a Service of its own and is Running, by itself.
#[tokio::test]
async fn a_workspace_heals_when_the_service_holding_its_name_goes() {
    let h = Harness::start().await;
    create::<Service>(
        &h,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "shop"},
        "spec": {"ports": [{"name": "web", "port": 80}]}}),
    )
    .await;
    let ws = h
        .create(
            "shop",
            json!({"image": "devbox:1", "ports": [{"name": "http", "port": 8080}]}),
        )
        .await;
    h.until_not_ready("shop", "NameTaken").await;
    api::<Service>(&h)
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    eventually(HEAL, "shop to run with a service of its own", || async {
        let ws = h.workspaces().get("shop").await.unwrap();
        (phase_of(&ws) == Some(Phase::Running)).then_some(())
    })
    .await;
    let own = api::<Service>(&h).get("shop").await.unwrap();
    assert_eq!(own.owner_references()[0].uid, ws.uid().unwrap());
}
