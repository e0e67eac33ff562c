//! Verbs, optimistic concurrency, subresources, patches, selectors and pagination.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::support::{api_error, cluster, pod};

#[tokio::test]
async fn create_get_list_with_defaults_and_one_global_revision() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("web-1", "web"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
        )
        .await
        .unwrap();
    let rv2: u64 = cm.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1, "one global revision across resources");

    assert_eq!(pods.get("web-1").await.unwrap().uid(), created.uid());
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(
        list.metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= rv2
    );

    assert_eq!(
        api_error(
            pods.create(&PostParams::default(), &pod("web-1", "web"))
                .await
        ),
        (
            409,
            "AlreadyExists".into(),
            "pods \"web-1\" already exists".into()
        )
    );
    assert_eq!(
        api_error(pods.get("nope").await),
        (404, "NotFound".into(), "pods \"nope\" not found".into())
    );
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "missing-ns");
    assert_eq!(
        api_error(
            elsewhere
                .create(&PostParams::default(), &pod("p", "web"))
                .await
        ),
        (
            404,
            "NotFound".into(),
            "namespaces \"missing-ns\" not found".into()
        )
    );
}

#[tokio::test]
async fn generate_name_and_name_validation() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let generated = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"generateName": "cfg-"}})).unwrap(),
        )
        .await
        .unwrap();
    let name = generated.name_any();
    assert!(name.starts_with("cfg-") && name.len() == 9, "{name}");
    let (code, reason, message) = api_error(
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "Bad_Name"}})).unwrap(),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(message.starts_with("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{message}");
    let (code, _, message) = api_error(
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {}})).unwrap(),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.name: Required value: name or generateName is required"),
        "{message}"
    );
}

#[tokio::test]
async fn stale_writes_conflict_and_no_op_writes_keep_the_revision() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let original = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}}))
                .unwrap(),
        )
        .await
        .unwrap();

    let mut first = original.clone();
    first.data = Some([("a".to_owned(), "2".to_owned())].into());
    let updated = cms
        .replace("c", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), original.resource_version());

    let mut stale = original.clone();
    stale.data = Some([("a".to_owned(), "3".to_owned())].into());
    assert_eq!(
        api_error(cms.replace("c", &PostParams::default(), &stale).await),
        (409, "Conflict".into(), "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again".into())
    );

    // Writing what is already stored changes nothing, not even the revision.
    let revision_before = sim.revision();
    let again = cms
        .replace("c", &PostParams::default(), &updated)
        .await
        .unwrap();
    assert_eq!(again.resource_version(), updated.resource_version());
    let patched = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.resource_version(), updated.resource_version());
    assert_eq!(sim.revision(), revision_before);

    // A patch naming a stale resourceVersion conflicts too.
    let guarded =
        json!({"metadata": {"resourceVersion": original.resource_version()}, "data": {"a": "9"}});
    assert_eq!(
        api_error(
            cms.patch("c", &PatchParams::default(), &Patch::Merge(guarded))
                .await
        )
        .0,
        409
    );
}

#[tokio::test]
async fn patch_types_merge_json_strategic() {
    let sim = cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    let mut two = pod("p", "web");
    two.spec
        .as_mut()
        .unwrap()
        .containers
        .push(serde_json::from_value(json!({"name": "side", "image": "busybox:1"})).unwrap());
    pods.create(&PostParams::default(), &two).await.unwrap();

    // Strategic merge: containers merge by name, so only one image changes.
    let patched = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "side", "image": "busybox:2"}]}}),
            ),
        )
        .await
        .unwrap();
    let images: Vec<String> = patched
        .spec
        .unwrap()
        .containers
        .iter()
        .map(|c| c.image.clone().unwrap())
        .collect();
    assert_eq!(images, ["nginx:1.27", "busybox:2"]);

    // JSON patch with a passing and a failing `test`.
    let ok = json!([{"op": "test", "path": "/metadata/labels/app", "value": "web"}, {"op": "add", "path": "/metadata/labels/tier", "value": "front"}]);
    let patched = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(ok).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(patched.labels()["tier"], "front");
    let failing = json!([{"op": "test", "path": "/metadata/labels/app", "value": "db"}, {"op": "remove", "path": "/metadata/labels/tier"}]);
    let (code, reason, _) = api_error(
        pods.patch(
            "p",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(failing).unwrap()),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        pods.get("p").await.unwrap().labels()["tier"],
        "front",
        "a failed test changes nothing"
    );

    // Merge patch: null deletes.
    let patched = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": null}}})),
        )
        .await
        .unwrap();
    assert!(!patched.labels().contains_key("tier"));

    // A pod's spec is mostly immutable.
    let (code, _, message) = api_error(
        pods.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"restartPolicy": "Never"}})),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("pod updates may not change fields other than"),
        "{message}"
    );
}

#[tokio::test]
async fn server_side_apply_tracks_managers_and_conflicts() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"owner": "alpha"}}, "data": {"a": "1", "b": "2"}});
    let created = cms
        .patch("c", &PatchParams::apply("alpha"), &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(created.data.as_ref().unwrap()["a"], "1");
    let managers: Vec<(String, String)> = created
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.manager.clone().unwrap(), m.operation.clone().unwrap()))
        .collect();
    assert_eq!(managers, [("alpha".to_owned(), "Apply".to_owned())]);

    let rival = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "changed"}});
    let (code, reason, message) = api_error(
        cms.patch("c", &PatchParams::apply("beta"), &Patch::Apply(&rival))
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        "Apply failed with 1 conflict: conflict with \"alpha\": .data.a"
    );

    let forced = cms
        .patch(
            "c",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(&rival),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["a"], "changed");

    // alpha stops applying `b`: it is removed, since nobody else owns it.
    let narrower = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"owner": "alpha"}}, "data": {}});
    let after = cms
        .patch("c", &PatchParams::apply("alpha"), &Patch::Apply(&narrower))
        .await
        .unwrap();
    let data = after.data.unwrap();
    assert_eq!(data.get("b"), None);
    assert_eq!(data["a"], "changed", "beta still owns a");

    let (code, _, message) = api_error(
        cms.patch("c", &PatchParams::default(), &Patch::Apply(&narrower))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("fieldManager: Required value"),
        "{message}"
    );
}

#[tokio::test]
async fn label_and_field_selectors() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        pods.create(&PostParams::default(), &pod(name, app))
            .await
            .unwrap();
    }
    let names = |list: kube::core::ObjectList<Pod>| {
        list.items.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
        ),
        ["a", "b"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app in (db),app!=web"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("!app"))
                .await
                .unwrap()
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=b"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("status.phase=Pending,metadata.name!=a"))
                .await
                .unwrap()
        ),
        ["b", "c"]
    );
    assert_eq!(
        api_error(
            pods.list(&ListParams::default().fields("spec.bogus=x"))
                .await
        ),
        (
            400,
            "BadRequest".into(),
            "field label not supported: spec.bogus".into()
        )
    );
    let all: Api<Pod> = Api::all(client);
    assert_eq!(
        all.list(&ListParams::default().fields("metadata.namespace=default"))
            .await
            .unwrap()
            .items
            .len(),
        3
    );
}

#[tokio::test]
async fn pagination_is_a_consistent_snapshot() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "pages"}})).unwrap(),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "pages");
    cms.delete("kube-root-ca.crt", &Default::default())
        .await
        .unwrap();
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(
        first.items.iter().map(|c| c.name_any()).collect::<Vec<_>>(),
        ["c0", "c1"]
    );
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().expect("a continue token");
    // Changes after the first page do not show up in later pages.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c9"}})).unwrap(),
    )
    .await
    .unwrap();
    cms.delete("c3", &Default::default()).await.unwrap();
    let second = cms
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        second
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        ["c2", "c3", "c4"]
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    assert!(
        second
            .metadata
            .continue_
            .as_deref()
            .unwrap_or("")
            .is_empty()
    );

    sim.compact();
    let (code, reason, _) = api_error(
        cms.list(&ListParams::default().limit(10).continue_token(&token))
            .await,
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() {
    let sim = cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    pods.create(&PostParams::default(), &pod("p", "web"))
        .await
        .unwrap();
    // Status through the main resource is ignored...
    let ignored = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().phase.as_deref(), Some("Pending"));
    // ...and written through /status, where spec and metadata changes are ignored.
    let written = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(written.status.unwrap().phase.as_deref(), Some("Running"));
    assert!(
        !written
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("x")
    );
}

#[tokio::test]
async fn request_log_counts_by_user_verb_resource_and_code() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    sim.reset_requests();
    pods.create(&PostParams::default(), &pod("p", "web"))
        .await
        .unwrap();
    let _ = pods.get("p").await;
    let _ = pods.get("missing").await;
    let _ = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await;
    assert_eq!(
        sim.count_requests(|k| k.verb == "create" && k.resource == "pods" && k.code == 201),
        1
    );
    assert_eq!(
        sim.count_requests(|k| k.verb == "get" && k.resource == "pods" && k.code == 200),
        1
    );
    assert_eq!(sim.count_requests(|k| k.verb == "get" && k.code == 404), 1);
    assert_eq!(
        sim.count_requests(|k| k.verb == "patch"
            && k.subresource == "status"
            && k.user == "kubernetes-admin"),
        1
    );

    let request = http::Request::get("/sim/v1/requests")
        .body(Vec::new())
        .unwrap();
    let text = client.request_text(request).await.unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert!(
        rows.iter().any(|r| r["verb"] == "create"
            && r["resource"] == "pods"
            && r["code"] == 201
            && r["count"] == 1),
        "{text}"
    );
}

#[tokio::test]
async fn discovery_serves_built_ins_and_crds() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    crate::support::install_workspace_crd(&client).await;
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let (resource, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(r, _)| r.kind == "Workspace")
        .expect("Workspace is discovered");
    assert_eq!(
        (
            resource.group.as_str(),
            resource.version.as_str(),
            resource.plural.as_str()
        ),
        ("berth.dev", "v1alpha1", "workspaces")
    );
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        caps.subresources.iter().any(|(r, _)| r.plural == "status"),
        "status subresource"
    );
    for kind in [
        "Pod",
        "Event",
        "Lease",
        "ClusterRole",
        "TokenReview",
        "SubjectAccessReview",
        "CustomResourceDefinition",
    ] {
        assert!(
            discovery
                .groups()
                .flat_map(|g| g.recommended_resources())
                .any(|(r, _)| r.kind == kind),
            "{kind}"
        );
    }
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
}

#[tokio::test]
async fn delete_collection_by_label() {
    let sim = cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        pods.create(&PostParams::default(), &pod(name, app))
            .await
            .unwrap();
    }
    pods.delete_collection(
        &Default::default(),
        &ListParams::default().labels("app=web"),
    )
    .await
    .unwrap();
    let left: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(left, ["c"]);
}

/// A server-side apply that creates an object is one write: a watcher sees ADDED and nothing
/// else, and the applier owns the fields as `Apply`.
#[tokio::test]
async fn an_apply_that_creates_is_one_write() {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};

    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let revision = maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = Box::pin(
        maps.watch(&WatchParams::default().timeout(5), &revision)
            .await
            .unwrap(),
    );
    let applied = maps
        .patch(
            "applied",
            &PatchParams::apply("applier"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}})),
        )
        .await
        .unwrap();
    let managed = applied.metadata.managed_fields.clone().unwrap();
    assert_eq!(managed.len(), 1);
    assert_eq!(
        (
            managed[0].manager.as_deref(),
            managed[0].operation.as_deref()
        ),
        (Some("applier"), Some("Apply"))
    );
    // A marker write after it: everything the apply caused arrives before the marker.
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "marker"}})).unwrap(),
    )
    .await
    .unwrap();
    let mut seen = vec![];
    while let Some(Ok(event)) = events.next().await {
        let (kind, name) = match &event {
            WatchEvent::Added(o) => ("ADDED", o.name_any()),
            WatchEvent::Modified(o) => ("MODIFIED", o.name_any()),
            WatchEvent::Deleted(o) => ("DELETED", o.name_any()),
            _ => continue,
        };
        if name == "marker" {
            break;
        }
        seen.push((kind, name));
    }
    assert_eq!(seen, [("ADDED", "applied".to_owned())]);
}

/// Aggregated discovery: a client asking `/api` and `/apis` for `apidiscovery.k8s.io/v2`
/// (kube's `Discovery::run_aggregated`, kubectl 1.30+) finds every group, version, resource and
/// subresource, custom resources included.
#[tokio::test]
async fn aggregated_discovery_finds_what_the_legacy_documents_list() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    crate::support::install_workspace_crd(&client).await;
    let discovery = kube::Discovery::new(client.clone())
        .run_aggregated()
        .await
        .unwrap();
    let legacy = kube::Discovery::new(client).run().await.unwrap();
    let names = |d: &kube::Discovery| -> Vec<String> {
        let mut all: Vec<String> = d
            .groups()
            .flat_map(|g| {
                g.resources_by_stability()
                    .into_iter()
                    .map(|(r, caps)| {
                        format!(
                            "{}/{} {:?} {}",
                            r.group,
                            r.plural,
                            caps.scope,
                            caps.subresources.len()
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort();
        all
    };
    let found = names(&discovery);
    assert!(
        found.iter().any(|n| n.starts_with("/pods Namespaced")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|n| n.starts_with("berth.dev/workspaces Namespaced")),
        "{found:?}"
    );
    assert_eq!(found, names(&legacy));
}

fn service(
    name: &str,
    type_: &str,
    ports: serde_json::Value,
) -> k8s_openapi::api::core::v1::Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"type": type_, "selector": {"app": name}, "ports": ports}})).unwrap()
}

fn node_port(s: &k8s_openapi::api::core::v1::Service, i: usize) -> Option<i32> {
    s.spec.as_ref()?.ports.as_ref()?.get(i)?.node_port
}

/// A NodePort service gets a free node port from 30000-32767 per port, keeps it when an update
/// leaves it out, and may name one only in the range and only if no other service has it; a
/// ClusterIP service may not name one. The real server's words.
#[tokio::test]
async fn node_ports_are_allocated_checked_and_kept() {
    use k8s_openapi::api::core::v1::Service;
    let sim = cluster().await;
    let services: Api<Service> = Api::namespaced(sim.client().await.unwrap(), "default");
    let web = services
        .create(
            &PostParams::default(),
            &service(
                "web",
                "NodePort",
                json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
            ),
        )
        .await
        .unwrap();
    let (first, second) = (node_port(&web, 0).unwrap(), node_port(&web, 1).unwrap());
    assert!((30000..=32767).contains(&first) && (30000..=32767).contains(&second));
    assert_ne!(first, second);

    // An update without the node ports keeps them.
    let mut replaced = service(
        "web",
        "NodePort",
        json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
    );
    replaced.metadata.resource_version = web.resource_version();
    let kept = services
        .replace("web", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(
        (node_port(&kept, 0), node_port(&kept, 1)),
        (Some(first), Some(second))
    );

    let taken = services
        .create(
            &PostParams::default(),
            &service(
                "other",
                "NodePort",
                json!([{"port": 80, "nodePort": first}]),
            ),
        )
        .await;
    assert_eq!(
        api_error(taken),
        (
            422,
            "Invalid".to_owned(),
            format!(
                "Service \"other\" is invalid: spec.ports[0].nodePort: Invalid value: {first}: provided port is already allocated"
            )
        )
    );
    let outside = services
        .create(
            &PostParams::default(),
            &service("low", "NodePort", json!([{"port": 80, "nodePort": 80}])),
        )
        .await;
    assert_eq!(
        api_error(outside).2,
        "Service \"low\" is invalid: spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-32767"
    );
    let cluster_ip = services
        .create(
            &PostParams::default(),
            &service(
                "inner",
                "ClusterIP",
                json!([{"port": 80, "nodePort": 30500}]),
            ),
        )
        .await;
    assert_eq!(
        api_error(cluster_ip).2,
        "Service \"inner\" is invalid: spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
    );
    let named = services
        .create(
            &PostParams::default(),
            &service(
                "named",
                "NodePort",
                json!([{"port": 80, "nodePort": 30500}]),
            ),
        )
        .await
        .unwrap();
    assert_eq!(node_port(&named, 0), Some(30500));
    let plain = services
        .create(
            &PostParams::default(),
            &service("plain", "ClusterIP", json!([{"port": 80}])),
        )
        .await
        .unwrap();
    assert_eq!(node_port(&plain, 0), None);

    // `kubectl get svc` shows `80:30500/TCP`, from the server's table.
    let table: serde_json::Value = sim
        .client()
        .await
        .unwrap()
        .request(
            http::Request::get("/api/v1/namespaces/default/services/named")
                .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
                .body(vec![])
                .unwrap(),
        )
        .await
        .unwrap();
    let cells = &table["rows"][0]["cells"];
    assert!(
        cells
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "80:30500/TCP"),
        "{cells}"
    );
}

/// A merge patch that is not an object: an array replaces the document and cannot be
/// decoded (422 on `patch`), anything else is `Invalid JSON Patch` (400); never a conflict.
#[tokio::test]
async fn a_merge_patch_that_is_not_an_object_is_refused_as_the_real_server_does() {
    let sim = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().await.unwrap(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})).unwrap(),
    )
    .await
    .unwrap();
    let array = cms
        .patch("c", &PatchParams::default(), &Patch::Merge(json!([1, 2])))
        .await;
    let (code, reason, message) = api_error(array);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.starts_with(" \"\" is invalid: patch: Invalid value: \"[1,2]\": couldn't get version/kind; json parse error: json: cannot unmarshal array"),
        "{message}"
    );
    for body in [json!("x"), json!(7), json!(null)] {
        let refused = cms
            .patch("c", &PatchParams::default(), &Patch::Merge(body))
            .await;
        assert_eq!(
            api_error(refused),
            (
                400,
                "BadRequest".to_owned(),
                "Invalid JSON Patch".to_owned()
            )
        );
    }
    assert_eq!(
        cms.get("c").await.unwrap().data.unwrap()["a"],
        "1",
        "nothing changed"
    );
}

/// As the real server writes JSON: `kind` then `apiVersion` lead objects, lists, their items,
/// watch events' objects and Status errors.
#[tokio::test]
async fn kind_comes_before_api_version_in_every_answer() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})).unwrap(),
    )
    .await
    .unwrap();
    let text = |path: &str| {
        let client = client.clone();
        let request = http::Request::get(path.to_owned())
            .body(Vec::new())
            .unwrap();
        async move { client.request_text(request).await }
    };
    let one = text("/api/v1/namespaces/default/configmaps/c")
        .await
        .unwrap();
    assert!(
        one.starts_with(r#"{"kind":"ConfigMap","apiVersion":"v1","#),
        "{one}"
    );
    let list = text("/api/v1/namespaces/default/configmaps").await.unwrap();
    assert!(
        list.starts_with(r#"{"kind":"ConfigMapList","apiVersion":"v1","#),
        "{list}"
    );
    assert!(
        list.contains(r#"[{"kind":"ConfigMap","apiVersion":"v1","#),
        "{list}"
    );
    let (_, _, body) = crate::support::get_raw(
        &client,
        "/api/v1/namespaces/default/configmaps/missing",
        "application/json",
    )
    .await;
    let status = String::from_utf8_lossy(&body);
    assert!(
        status.starts_with(r#"{"kind":"Status","apiVersion":"v1","#),
        "{status}"
    );
}

/// Services and service accounts answer a DELETE with the deleted object, as their real
/// registries do (the Python client reads it as the typed object); a config map with a Status.
#[tokio::test]
async fn deleting_a_service_or_a_service_account_answers_with_it() {
    use k8s_openapi::api::core::v1::{Service, ServiceAccount};
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let services: Api<Service> = Api::default_namespaced(client.clone());
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let deleted = services.delete("web", &Default::default()).await.unwrap();
    assert_eq!(deleted.left().map(|s| s.name_any()).as_deref(), Some("web"));
    let accounts: Api<ServiceAccount> = Api::default_namespaced(client.clone());
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev"}})).unwrap(),
        )
        .await
        .unwrap();
    let deleted = accounts.delete("dev", &Default::default()).await.unwrap();
    assert_eq!(deleted.left().map(|s| s.name_any()).as_deref(), Some("dev"));
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    assert!(
        maps.delete("c", &Default::default())
            .await
            .unwrap()
            .is_right()
    );
}

/// Times are decoded and stored as the real server does: a Lease's MicroTime needs exactly six
/// fractional digits (else 400) and comes back in UTC; a Time with an offset comes back in `Z`.
#[tokio::test]
async fn times_are_stored_in_utc_and_a_micro_time_has_six_digits() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let lease = |renew: &str| {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "a", "renewTime": renew}
        })
    };
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let refused = crate::support::post_json(&client, path, &lease("2026-12-03T10:00:00Z")).await;
    let (code, _, message) = api_error(refused);
    assert_eq!(code, 400);
    assert!(
        message.contains(
            "parsing time \"2026-12-03T10:00:00Z\" as \"2006-01-02T15:04:05.000000Z07:00\""
        ),
        "{message}"
    );
    let stored =
        crate::support::post_json(&client, path, &lease("2026-12-03T12:00:00.123456+02:00"))
            .await
            .unwrap();
    assert_eq!(stored["spec"]["renewTime"], "2026-12-03T10:00:00.123456Z");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    });
    crate::support::post_json(&client, "/api/v1/namespaces/default/pods", &pod)
        .await
        .unwrap();
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-03T12:00:00.5+02:00"}]}});
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let patched = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let raw = serde_json::to_value(&patched).unwrap();
    assert_eq!(
        raw["status"]["conditions"][0]["lastTransitionTime"],
        "2026-12-03T10:00:00Z"
    );
}
