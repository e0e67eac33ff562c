//! kube-rs client tests of the API semantics.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::support::cluster;

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn create_get_list_with_defaults_and_revisions() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces.list(&ListParams::default()).await.unwrap().iter().map(|n| n.name_any()).collect();
    assert_eq!(names, ["default", "kube-node-lease", "kube-public", "kube-system"]);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods.create(&PostParams::default(), &pod("web-1")).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(created.spec.as_ref().unwrap().restart_policy.as_deref(), Some("Always"));
    assert_eq!(created.spec.as_ref().unwrap().service_account_name.as_deref(), Some("default"));
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap()).await.unwrap();
    let rv2: u64 = cm.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1, "one global revision across resources");

    let fetched = pods.get("web-1").await.unwrap();
    assert_eq!(fetched.uid(), created.uid());
    let list = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.resource_version.unwrap().parse::<u64>().unwrap() >= rv2);

    let err = pods.create(&PostParams::default(), &pod("web-1")).await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("expected an API error") };
    assert_eq!((status.code, status.reason.as_str(), status.message.as_str()), (409, "AlreadyExists", "pods \"web-1\" already exists"));

    let err = pods.get("nope").await.unwrap_err();
    let kube::Error::Api(status) = err else { panic!("expected an API error") };
    assert_eq!((status.code, status.reason.as_str(), status.message.as_str()), (404, "NotFound", "pods \"nope\" not found"));

    let patched = pods.patch("web-1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}}))).await.unwrap();
    assert_eq!(patched.labels()["tier"], "front");
    pods.delete("web-1", &DeleteParams::default()).await.unwrap();
}
